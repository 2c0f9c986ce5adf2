package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
)

// TestPoliciesOnKVMapShapes: every compression policy runs through
// `kvlm generate` on gen-model's cla2, yoco, lckv and local-global files,
// or is refused with its one-line reason (docs/ARCHITECTURES.md, "Policies
// on shared layers"): pyramidinfer on a map where layers read another
// layer's KV or on window-bounded layers, re-indexed positions (streaming's
// default) where cache layers' windows differ, minicache on a pair with a
// window-bounded layer.
func TestPoliciesOnKVMapShapes(t *testing.T) {
	tok := shared.Path(t, "models/llama2-tokenizer/tokenizer.bin")
	dir := t.TempDir()
	prompt := strings.Repeat("Once upon a time there was a little girl who liked to play. ", 5)
	const (
		shared  = "cache layer 0 is read by 2 model layers"
		windows = "is read by sliding-window attention"
		reindex = "re-indexes positions"
	)
	policies := []struct {
		name string
		args []string
		want map[string]string // shape → the error's text; absent: it runs
	}{
		{"full", nil, nil},
		{"window", []string{"--kv-policy", "window", "--kv-window", "16"}, nil},
		{"streaming", []string{"--kv-policy", "streaming", "--kv-window", "12", "--kv-sinks", "4"},
			map[string]string{"yoco": reindex, "local-global": reindex}},
		{"streaming original", []string{"--kv-policy", "streaming", "--kv-window", "12", "--kv-sinks", "4", "--kv-positions", "original"}, nil},
		{"lminfinite", []string{"--kv-policy", "lminfinite", "--kv-window", "12", "--kv-sinks", "4"}, nil},
		{"h2o", []string{"--kv-policy", "h2o", "--kv-budget", "24"}, nil},
		{"h2o max", []string{"--kv-policy", "h2o", "--kv-budget", "24", "--kv-agg", "max"}, nil},
		{"tova", []string{"--kv-policy", "tova", "--kv-budget", "24"}, nil},
		{"snapkv", []string{"--kv-policy", "snapkv", "--kv-budget", "32", "--kv-window", "8"}, nil},
		{"adakv", []string{"--kv-policy", "adakv", "--kv-budget", "32", "--kv-window", "8"}, nil},
		{"pyramidkv", []string{"--kv-policy", "pyramidkv", "--kv-budget", "32", "--kv-window", "8"}, nil},
		{"knorm", []string{"--kv-policy", "knorm", "--kv-budget", "24"}, nil},
		{"keydiff", []string{"--kv-policy", "keydiff", "--kv-budget", "24"}, nil},
		{"expected", []string{"--kv-policy", "expected", "--kv-budget", "24"}, nil},
		{"minicache", []string{"--kv-policy", "minicache"},
			map[string]string{"yoco": "cache layer 2 is read by sliding-window attention (window 64) and frees the tokens that slide out, which merged tokens cannot; choose --kv-merge-from", "local-global": "cache layer 6 is read by sliding-window attention"}},
		{"pyramidinfer", []string{"--kv-policy", "pyramidinfer"},
			map[string]string{"cla2": shared, "yoco": "cache layer 4 is read by 4 model layers", "lckv": "cache layer 2 is read by 6 model layers", "local-global": windows}},
	}
	for _, shape := range []string{"cla2", "yoco", "lckv", "local-global"} {
		t.Run(shape, func(t *testing.T) {
			path := filepath.Join(dir, shape+".gguf")
			if o, e, code := kvlm(t, "gen-model", "--shape", shape, "--type", "Q8_0", "--ctx", "512", "--tokenizer", tok, "-o", path); code != 0 {
				t.Fatalf("gen-model: exit %d: %s %s", code, o, e)
			}
			for _, p := range policies {
				t.Run(p.name, func(t *testing.T) {
					args := append([]string{"generate", "-m", path, "-p", prompt, "-n", "8", "--temp", "0"}, p.args...)
					o, e, code := kvlm(t, args...)
					if want, refused := p.want[shape]; refused {
						if code == 0 || !strings.Contains(e, want) || strings.Count(strings.TrimSpace(e), "\n") > 0 || strings.Contains(e, "{{") {
							t.Fatalf("exit %d, stderr %q: want one line saying %q", code, e, want)
						}
						return
					}
					if code != 0 || o == "" {
						t.Fatalf("exit %d: %s %s", code, o, e)
					}
				})
			}
		})
	}
}
