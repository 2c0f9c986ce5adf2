package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
)

// TestPolicyFlagsRefused: a KV policy flag the method does not use, or a
// policy that could not run, is a one-line error naming the flag, not a
// silent no-op.
func TestPolicyFlagsRefused(t *testing.T) {
	s := storiesFiles(t)
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	gen := []string{"generate", "-m", s.gguf, "-p", "Once upon a time", "-n", "4", "--temp", "0"}
	ppl := []string{"ppl", "-m", s.gguf, "-f", text, "--ctx", "64"}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"full window", append(gen[:len(gen):len(gen)], "--kv-window", "8"), "full takes no --kv-window"},
		{"full window 0", append(gen[:len(gen):len(gen)], "--kv-window", "0"), "full takes no --kv-window"},
		{"full every", append(gen[:len(gen):len(gen)], "--kv-every", "0"), "full takes no --kv-every"},
		{"streaming kernel", append(gen[:len(gen):len(gen)], "--kv-policy", "streaming", "--kv-window", "8", "--kv-kernel", "3"), "streaming takes no --kv-kernel"},
		{"window pool", append(gen[:len(gen):len(gen)], "--kv-policy", "window", "--kv-window", "8", "--kv-pool", "max"), "window takes no --kv-pool"},
		{"h2o kernel", append(gen[:len(gen):len(gen)], "--kv-policy", "h2o", "--kv-budget", "8", "--kv-kernel", "3"), "h2o takes no --kv-kernel"},
		{"knorm agg", append(gen[:len(gen):len(gen)], "--kv-policy", "knorm", "--kv-budget", "8", "--kv-agg", "max"), "knorm takes no --kv-agg"},
		{"h2o budget 1", append(gen[:len(gen):len(gen)], "--kv-policy", "h2o", "--kv-budget", "1"), "leaves no room"},
		{"snapkv window 0", append(gen[:len(gen):len(gen)], "--kv-policy", "snapkv", "--kv-ratio", "0.5", "--kv-window", "0"), "--kv-window 0"},
		{"streaming sinks 0", append(gen[:len(gen):len(gen)], "--kv-policy", "streaming", "--kv-window", "8", "--kv-sinks", "0"), "--kv-sinks 0"},
		{"positions typo", append(gen[:len(gen):len(gen)], "--kv-policy", "streaming", "--kv-window", "8", "--kv-positions", "orignal"), "unknown positions"},
		{"compress-after without a policy", append(ppl[:len(ppl):len(ppl)], "--compress-after", "32"), "--compress-after"},
		{"report-every without streaming", append(ppl[:len(ppl):len(ppl)], "--report-every", "10"), "--report-every"},
		{"report-every with compress-after", append(ppl[:len(ppl):len(ppl)], "--kv-policy", "snapkv", "--kv-ratio", "0.5", "--compress-after", "32", "--report-every", "10"), "--report-every"},
		{"bench h2o kernel", []string{"bench", "-m", s.gguf, "--kv-policy", "h2o", "--kv-budget", "8", "--kv-kernel", "3"}, "h2o takes no --kv-kernel"},
		{"bench snapkv without a budget", []string{"bench", "-m", s.gguf, "--kv-policy", "snapkv"}, "snapkv"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, code := kvlm(t, c.args...)
			if code != 1 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
				t.Fatalf("exit %d, stderr %q; want one line mentioning %q", code, errOut, c.want)
			}
		})
	}
}

// TestPolicyFlagsHonoured: --kv-positions original with streaming keeps
// original positions, and --kv-every 0 compresses after the prompt only.
func TestPolicyFlagsHonoured(t *testing.T) {
	s := storiesFiles(t)
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	policyOf := func(args ...string) string {
		t.Helper()
		out, errOut, code := kvlm(t, append([]string{"ppl", "-m", s.gguf, "-f", text, "--ctx", "64", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		var r pplJSON
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r.Policy
	}
	if p := policyOf("--kv-policy", "streaming", "--kv-window", "16", "--kv-positions", "original"); !strings.Contains(p, "positions=original") {
		t.Errorf("--kv-positions original: policy %q", p)
	}
	if p := policyOf("--kv-policy", "streaming", "--kv-window", "16"); !strings.Contains(p, "positions=reindex") {
		t.Errorf("streaming's default: policy %q", p)
	}
	// A 40-token prompt compressed to 16 per table, then 20 tokens.
	kept := func(args ...string) []int {
		t.Helper()
		prompt := strings.Repeat("Once upon a time there was a cat. ", 6)
		out, errOut, code := kvlm(t, append([]string{"generate", "-m", s.gguf, "-p", prompt, "-n", "20", "--temp", "0", "--json",
			"--kv-policy", "h2o", "--kv-budget", "16"}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		var r generateJSON
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if len(r.PromptTokens) <= 16 || len(r.Tokens) != 20 {
			t.Fatalf("prompt %d tokens, %d generated", len(r.PromptTokens), len(r.Tokens))
		}
		return r.KeptPerLayer
	}
	never, always := kept("--kv-every", "0"), kept()
	heads := always[0] / 16
	if always[0] != 16*heads || never[0] != (16+19)*heads {
		t.Errorf("kept per layer: every step %v, --kv-every 0 %v; want %d and %d (%d heads)", always, never, 16*heads, 35*heads, heads)
	}
}
