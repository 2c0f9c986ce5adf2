package engine

import (
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// streamRef feeds prompt to one sequence token by token under cfg, as
// kvlm ppl --stream does (eval.Stream: the policy installed, no prompt
// announced, every token a step of its decoding schedule), then decodes n
// greedy tokens.
func streamRef(t *testing.T, m *model.Model, cfg policy.Config, prompt []int, n int) []int {
	t.Helper()
	seq, err := m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	st, err := policy.New(cfg, seq)
	if err != nil {
		t.Fatal(err)
	}
	seq.SetPolicy(st)
	var logits []float32
	for _, tok := range prompt {
		if logits, err = seq.Forward([]int{tok}, false); err != nil {
			t.Fatal(err)
		}
	}
	var out []int
	for range n {
		tok := argmaxOf(logits)
		out = append(out, tok)
		if logits, err = seq.Forward([]int{tok}, false); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// storyTokens is the TinyStories validation text's first n tokens.
func storyTokens(t *testing.T, m *model.Model, n int) []int {
	t.Helper()
	_, tok, err := Load(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/stories260K/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(string(text), true, false)
	if len(ids) < n {
		t.Fatalf("%d tokens, want %d", len(ids), n)
	}
	return ids[:n]
}

// TestEngineStreamsPastTheContext: a 3,000-token prompt (the context is
// 512) under a window method is fed token by token with eviction before
// each, and generates what one sequence fed the same way gives (kvlm ppl
// --stream's path), holding no more than the method's bound; other
// policies are refused the prompt.
func TestEngineStreamsPastTheContext(t *testing.T) {
	m, _ := loadStories(t)
	e := newEngine(t, m, Config{KVMem: 1 << 20})
	T, gen := 3000, 24
	if raceEnabled {
		T = 800 // still past the context, at a tenth of the race detector's cost
	}
	prompt := storyTokens(t, m, T)
	for _, c := range []policy.Config{
		{Method: "streaming", Window: 60, Sinks: 4},
		{Method: "window", Window: 100},
	} {
		t.Run(c.String(), func(t *testing.T) {
			cfg, err := c.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			o := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: gen, Policy: cfg})))
			if o.finish[0] != FinishLength {
				t.Fatalf("%s: %v", o.finish[0], o.errs[0])
			}
			if want := streamRef(t, m, cfg, prompt, gen); !slices.Equal(o.tokens[0], want) {
				t.Errorf("tokens %v\nwant %v (fed token by token in one sequence)", o.tokens[0], want)
			}
			bound, _ := cfg.StreamBound()
			u := o.usage
			if u.ComputedTokens != T || u.EvictedTokens < T-bound || u.KVBytesPeak > int64(bound+16)*int64(e.tables)*int64(e.defPool.BlockBytes())/16 {
				t.Errorf("usage %+v (bound %d tokens)", u, bound)
			}
		})
	}
	for _, c := range []policy.Config{{Method: "full"}, {Method: "snapkv", Ratio: 0.25}, {Method: "streaming", Window: 60, Every: policy.EveryNever}} {
		var ie *InvalidError
		if _, err := e.Submit(GenRequest{Prompt: prompt, MaxTokens: 1, Policy: c}); !errors.As(err, &ie) {
			t.Errorf("%s: %v, want an InvalidError", c, err)
		}
	}
	var ie *InvalidError
	if _, err := e.Submit(GenRequest{Prompt: prompt, MaxTokens: 1, Policy: policy.Config{Method: "streaming", Window: 60}, PrefixTokens: 100}); !errors.As(err, &ie) {
		t.Errorf("a prefix to compress with a prompt past the context: %v, want an InvalidError", err)
	}
	checkFree(t, e)
}
