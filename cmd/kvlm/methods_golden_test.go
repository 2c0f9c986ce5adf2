package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
)

var updateMethodsGolden = flag.Bool("update-methods-golden", false, "rewrite testdata/methods_golden.json from this build")

// methodCases are the KV methods of policy's invariant table plus
// pyramidinfer and minicache, as a user asks for them on the command line.
var methodCases = []struct {
	name  string
	flags []string
}{
	{"full", nil},
	{"window", []string{"--kv-policy", "window", "--kv-window", "40"}},
	{"streaming", []string{"--kv-policy", "streaming", "--kv-window", "36", "--kv-sinks", "4"}},
	{"streaming-original-every1", []string{"--kv-policy", "streaming", "--kv-window", "36", "--kv-sinks", "4", "--kv-positions", "original", "--kv-every", "1"}},
	{"lminfinite", []string{"--kv-policy", "lminfinite", "--kv-window", "60", "--kv-sinks", "4"}},
	{"h2o", []string{"--kv-policy", "h2o", "--kv-budget", "48"}},
	{"h2o-ratio-every8", []string{"--kv-policy", "h2o", "--kv-ratio", "0.5", "--kv-every", "8"}},
	{"tova", []string{"--kv-policy", "tova", "--kv-budget", "40"}},
	{"snapkv", []string{"--kv-policy", "snapkv", "--kv-budget", "64", "--kv-window", "16"}},
	{"snapkv-ratio-every16", []string{"--kv-policy", "snapkv", "--kv-ratio", "0.25", "--kv-window", "16", "--kv-every", "16"}},
	{"adakv", []string{"--kv-policy", "adakv", "--kv-budget", "64", "--kv-window", "16"}},
	{"pyramidkv", []string{"--kv-policy", "pyramidkv", "--kv-budget", "64", "--kv-window", "16"}},
	{"knorm", []string{"--kv-policy", "knorm", "--kv-budget", "50", "--kv-sinks", "2", "--kv-window", "8", "--kv-every", "4"}},
	{"pyramidinfer", []string{"--kv-policy", "pyramidinfer"}},
	{"minicache", []string{"--kv-policy", "minicache"}},
}

var codecCases = [][2]string{{"f32", "f32"}, {"f16", "bf16"}, {"q8", "q4"}, {"kivi4", "kivi2"}}

// methodOutcome is what one method × codec pair produced: the greedy
// continuation and the cache after it, and the NLL of a compress-then-
// continue perplexity run, all of which must stay bit-identical across a
// refactoring. Err records a refusal (its first line), which must stay too.
type methodOutcome struct {
	Tokens       []int   `json:"tokens,omitempty"`
	KVBytes      int64   `json:"kv_bytes,omitempty"`
	KVBytesPeak  int64   `json:"kv_bytes_peak,omitempty"`
	KeptPerLayer []int   `json:"kept_per_layer,omitempty"`
	GenErr       string  `json:"generate_error,omitempty"`
	MeanNLL      float64 `json:"ppl_mean_nll,omitempty"`
	PPLKept      []int   `json:"ppl_kept_per_layer,omitempty"`
	PPLErr       string  `json:"ppl_error,omitempty"`
}

// TestMethodsGolden runs every method × codec pair on stories260K through
// the CLI (generate: a prompt of about 170 tokens, 40 greedy tokens; ppl: 300 tokens,
// compressed after 150) and compares everything with
// testdata/methods_golden.json, recorded by the commit that added this
// test (the engine as it stood before the redesign of issue 28) with
//
//	go test ./cmd/kvlm/ -run TestMethodsGolden -update-methods-golden
//
// Floats are compared exactly: a change of the order of a sum shows.
func TestMethodsGolden(t *testing.T) {
	s := storiesFiles(t)
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	raw, err := os.ReadFile(text)
	if err != nil {
		t.Fatal(err)
	}
	prompt := string(raw[:700]) // about 170 tokens
	got := map[string]methodOutcome{}
	for _, mc := range methodCases {
		for _, cc := range codecCases {
			key := fmt.Sprintf("%s/%s-%s", mc.name, cc[0], cc[1])
			var o methodOutcome
			kv := append([]string{"--kv-type-k", cc[0], "--kv-type-v", cc[1]}, mc.flags...)
			args := append([]string{"generate", "-m", s.bin, "--tokenizer", s.tok, "-p", prompt, "-n", "40", "--temp", "0", "--json"}, kv...)
			out, errOut, code := kvlm(t, args...)
			if code != 0 {
				o.GenErr = firstLine(errOut)
			} else {
				var r struct {
					Tokens       []int `json:"tokens"`
					KVBytes      int64 `json:"kv_bytes"`
					KVBytesPeak  int64 `json:"kv_bytes_peak"`
					KeptPerLayer []int `json:"kept_per_layer"`
				}
				if err := json.Unmarshal([]byte(out), &r); err != nil {
					t.Fatalf("%s: %v in %q", key, err, out)
				}
				o.Tokens, o.KVBytes, o.KVBytesPeak, o.KeptPerLayer = r.Tokens, r.KVBytes, r.KVBytesPeak, r.KeptPerLayer
			}
			if mc.flags != nil {
				args = append([]string{"ppl", "-m", s.bin, "--tokenizer", s.tok, "-f", text, "--ctx", "300", "--compress-after", "150", "--json"}, kv...)
				out, errOut, code = kvlm(t, args...)
				if code != 0 {
					o.PPLErr = firstLine(errOut)
				} else {
					var r struct {
						MeanNLL      float64 `json:"mean_nll"`
						KeptPerLayer []int   `json:"kept_per_layer"`
					}
					if err := json.Unmarshal([]byte(out), &r); err != nil {
						t.Fatalf("%s: %v in %q", key, err, out)
					}
					o.MeanNLL, o.PPLKept = r.MeanNLL, r.KeptPerLayer
				}
			}
			got[key] = o
		}
	}
	path := filepath.Join("testdata", "methods_golden.json")
	if *updateMethodsGolden {
		b, err := json.MarshalIndent(got, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d cases)", path, len(got))
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]methodOutcome
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(want) != len(got) {
		t.Errorf("%d cases recorded, %d run", len(want), len(got))
	}
	ran := 0
	for key, g := range got {
		w, ok := want[key]
		if !ok {
			t.Errorf("%s: not recorded", key)
			continue
		}
		if g.GenErr == "" {
			ran++
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s:\n got  %+v\n want %+v", key, g, w)
		}
	}
	if ran < len(got)*3/4 {
		t.Errorf("only %d of %d cases generated without an error", ran, len(got))
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
