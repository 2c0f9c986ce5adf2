package policy

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
)

// prefixRun compresses prompt under cfg in a sequence of pool that starts
// from the cached blocks of prompt[:len−tail+1] (none when tail is the
// whole prompt), computes the rest, then greedily decodes n tokens. It
// returns the kept original positions after the prompt, the tokens and
// how many prompt tokens came from the cache.
func prefixRun(t *testing.T, m *model.Model, pool *kvcache.Pool, cfg Config, prompt []int, tail, n int) (kept [][][]int32, toks []int, matched int) {
	t.Helper()
	c := pool.NewSequence()
	defer c.Free()
	matched = c.MatchPrefix(prompt[:len(prompt)-tail+1], 0)
	seq, err := m.NewSequence(c)
	if err != nil {
		t.Fatal(err)
	}
	st, err := New(cfg, seq)
	if err != nil {
		t.Fatal(err)
	}
	seq.SetPolicy(st)
	seq.Prompt(len(prompt) - matched)
	logits, err := seq.Forward(prompt[matched:], false)
	if err != nil {
		t.Fatal(err)
	}
	kept = st.Kept()
	for range n {
		tok := argmax(logits)
		toks = append(toks, tok)
		if logits, err = seq.Forward([]int{tok}, false); err != nil {
			t.Fatal(err)
		}
	}
	return kept, toks, matched
}

// TestComputedTail: a prompt whose first tokens come from the prefix cache
// (computed by an earlier, uncompressed sequence) and whose last
// ComputedTail tokens are computed is compressed to the same kept tokens,
// and decodes the same greedy tokens, as the whole prompt computed in
// one sequence, for every method, and the plain prefix is still cached
// whole afterwards; for the methods that read the queries
// of the whole prompt, reusing more than ComputedTail allows gives a
// different result (so the rule is needed, not just safe).
func TestComputedTail(t *testing.T) {
	st := loadStories(t)
	m := st.m
	prompt := st.ids[:200]
	const gen = 12
	pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: m.KVLayout(), BlockTokens: 16, Tokens: 4 * m.CtxLen})
	if err != nil {
		t.Fatal(err)
	}
	// The plain prefix, cached by a sequence without a policy.
	plain := pool.NewSequence()
	ps, err := m.NewSequence(plain)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Forward(prompt, false); err != nil {
		t.Fatal(err)
	}
	plain.RegisterPrefix(prompt, 0)
	plain.Free()
	for _, c := range []struct {
		cfg Config
		// differs: reusing all but the last token changes the result
		// (the method reads more than the last query).
		differs bool
	}{
		{Config{Method: "window", Window: 40}, false},
		{Config{Method: "streaming", Window: 36, Sinks: 4}, false},
		{Config{Method: "lminfinite", Window: 60, Sinks: 4}, false},
		{Config{Method: "knorm", Budget: 50, Sinks: 2, Window: 8}, false},
		{Config{Method: "keydiff", Ratio: 0.3}, false},
		{Config{Method: "tova", Budget: 40}, false},
		{Config{Method: "minicache"}, false},
		{Config{Method: "snapkv", Ratio: 0.25}, true},
		{Config{Method: "snapkv", Budget: 64, Window: 40}, true},
		{Config{Method: "adakv", Budget: 64, Window: 16}, true},
		{Config{Method: "pyramidkv", Budget: 64, Window: 16}, true},
		{Config{Method: "h2o", Budget: 48}, true},
		{Config{Method: "expected", Ratio: 0.3}, true},
		{Config{Method: "pyramidinfer"}, true},
	} {
		t.Run(c.cfg.String(), func(t *testing.T) {
			cfg, err := c.cfg.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			tail := cfg.ComputedTail(len(prompt))
			wantKept, wantToks, _ := prefixRun(t, m, pool, cfg, prompt, len(prompt), gen)
			kept, toks, matched := prefixRun(t, m, pool, cfg, prompt, tail, gen)
			// The plain prefix is still cached whole, as it was.
			if d := pool.NewSequence(); d.MatchPrefix(prompt, 0) != len(prompt)/16*16 {
				t.Fatalf("after compressing a sequence that shared it, the plain prefix is no longer a full hit: %+v", pool.Usage())
			} else {
				d.Free()
			}
			if want := (len(prompt) - tail) / 16 * 16; matched != want {
				t.Fatalf("tail %d: %d tokens from the cache, want %d", tail, matched, want)
			}
			if fmt.Sprint(kept) != fmt.Sprint(wantKept) || !slices.Equal(toks, wantToks) {
				t.Fatalf("from a cached prefix of %d tokens (tail %d): kept %v, tokens %v\nwhole prompt: kept %v, tokens %v", matched, tail, kept[0][0], toks, wantKept[0][0], wantToks)
			}
			if !c.differs {
				if tail != 1 {
					t.Fatalf("tail %d, want 1", tail)
				}
				return
			}
			kept1, toks1, matched1 := prefixRun(t, m, pool, cfg, prompt, 1, gen)
			if matched1 <= matched {
				t.Fatalf("reusing all but the last token matched %d, no more than %d", matched1, matched)
			}
			if fmt.Sprint(kept1) == fmt.Sprint(wantKept) && slices.Equal(toks1, wantToks) {
				t.Errorf("tail %d is not needed: reusing %d tokens gives the same result", tail, matched1)
			}
		})
	}
}
