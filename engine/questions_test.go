package engine

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// argmaxOf is the greedy token.
func argmaxOf(x []float32) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}

// questionRef is one sequence that compresses doc on its own under cfg,
// runs question on top uncompressed, and decodes n greedy tokens: what a
// request with PrefixTokens = len(doc) must give.
func questionRef(t *testing.T, m *model.Model, cfg policy.Config, doc, question []int, n int) []int {
	t.Helper()
	seq, err := m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	seq.Chunk = 64
	st, err := policy.New(cfg, seq)
	if err != nil {
		t.Fatal(err)
	}
	seq.SetPolicy(st)
	seq.Prompt(len(doc))
	if _, err := seq.Forward(doc, false); err != nil {
		t.Fatal(err)
	}
	logits, err := seq.Forward(question, false)
	if err != nil {
		t.Fatal(err)
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

// TestEngineDocumentQuestions: requests that ask different questions
// about one document with PrefixTokens set compress the document once,
// query-agnostic: the first computes its whole prompt, the others only
// their question, and each answers what one sequence compressing the
// document alone and then reading the question gives.
func TestEngineDocumentQuestions(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{PrefillChunk: 64})
	doc := longPrompt(t, tok, 300)
	questions := []string{"Who was in the story?", "What did Lily want?", "Where did they go?", "Why was she sad?"}
	const gen = 12
	for _, cfg := range []policy.Config{{Method: "snapkv", Ratio: 0.25}, {Method: "knorm", Ratio: 0.5}, {Method: "streaming", Window: 96, Sinks: 4}} {
		t.Run(cfg.String(), func(t *testing.T) {
			cfg, err := cfg.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			before := e.Stats()
			for i, qs := range questions {
				q := tok.Encode("\n"+qs, false, false)
				prompt := slices.Concat(doc, q)
				o := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: gen, Policy: cfg, PrefixTokens: len(doc)})))
				if o.finish[0] != FinishLength {
					t.Fatalf("question %d: %s %v", i, o.finish[0], o.errs[0])
				}
				u := o.usage
				wantComputed, wantComp := len(prompt), 0
				if i > 0 {
					wantComputed, wantComp = len(q), len(doc)
				}
				if u.ComputedTokens != wantComputed || u.CompressedTokens != wantComp {
					t.Errorf("question %d: computed %d, compressed %d; want %d, %d", i, u.ComputedTokens, u.CompressedTokens, wantComputed, wantComp)
				}
				if want := questionRef(t, m, cfg, doc, q, gen); !slices.Equal(o.tokens[0], want) {
					t.Errorf("question %d: %v, want %v", i, o.tokens[0], want)
				}
			}
			if st := e.Stats(); st.CompressedHits-before.CompressedHits != int64(len(questions)-1) {
				t.Errorf("%d hits, want %d", st.CompressedHits-before.CompressedHits, len(questions)-1)
			}
			// The document alone, compressed as a whole prompt, is the
			// same compressed prefix.
			if o := collect(t, must(e.Submit(GenRequest{Prompt: doc, MaxTokens: 4, Policy: cfg}))); o.usage.ComputedTokens != 0 {
				t.Errorf("the document alone: %d tokens computed, want 0", o.usage.ComputedTokens)
			}
		})
	}
	for _, r := range []GenRequest{
		{Prompt: doc, MaxTokens: 1, PrefixTokens: 10},
		{Prompt: doc, MaxTokens: 1, PrefixTokens: len(doc) + 1, Policy: policy.Config{Method: "snapkv", Ratio: 0.5}},
		{Prompt: doc, MaxTokens: 1, PrefixTokens: -1, Policy: policy.Config{Method: "snapkv", Ratio: 0.5}},
	} {
		var ie *InvalidError
		if _, err := e.Submit(r); !errors.As(err, &ie) {
			t.Errorf("PrefixTokens %d, policy %q: %v, want an InvalidError", r.PrefixTokens, r.Policy.Method, err)
		}
	}
	checkFree(t, e)
}
