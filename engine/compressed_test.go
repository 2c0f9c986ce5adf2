package engine

import (
	"slices"
	"testing"

	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/sample"
)

// TestEngineCompressedPrefix: a second request with the same 400-token
// document and the same kv settings starts from the compressed prefix the
// first one left and computes none of it, with the same output; other
// settings miss; hits, misses and bytes are counted; the entry is
// evicted by the pool's LRU when the memory is needed, after which the
// document is computed again (from raw cached blocks if there are).
func TestEngineCompressedPrefix(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{PrefillChunk: 64, KVMem: 2 << 20})
	const T, gen = 400, 16
	doc := longPrompt(t, tok, T)
	snap := policy.Config{Method: "snapkv", Ratio: 0.25}
	run := func(r GenRequest) outcome {
		t.Helper()
		r.Prompt, r.MaxTokens = doc, gen
		o := collect(t, must(e.Submit(r)))
		for i, f := range o.finish {
			if f != FinishLength {
				t.Fatalf("sample %d: %s %v", i, f, o.errs[i])
			}
		}
		return o
	}
	first := run(GenRequest{Policy: snap})
	if u := first.usage; u.ComputedTokens != T || u.CompressedTokens != 0 {
		t.Fatalf("first request: %+v", u)
	}
	st := e.Stats()
	if st.CompressedPrefixes != 1 || st.CompressedBytes <= 0 || st.CompressedMisses != 1 || st.CompressedHits != 0 {
		t.Fatalf("after the first request: %+v", st)
	}
	second := run(GenRequest{Policy: snap})
	if u := second.usage; u.ComputedTokens != 0 || u.CachedTokens != T || u.CompressedTokens != T || u.EvictedTokens != first.usage.EvictedTokens {
		t.Errorf("second request: %+v, want none of %d computed", u, T)
	}
	if !slices.Equal(second.tokens[0], first.tokens[0]) {
		t.Errorf("second request: %v, want %v", second.tokens[0], first.tokens[0])
	}
	if st := e.Stats(); st.CompressedHits != 1 {
		t.Errorf("hits %d", st.CompressedHits)
	}
	// Sampled, n = 2: the samples fork from the restored prefix and draw
	// what they drew from the computed one.
	p := sample.Params{Temperature: 0.9, Seed: 5}
	a := run(GenRequest{Policy: policy.Config{Method: "h2o", Budget: 64}, Sampling: p, N: 2})
	b := run(GenRequest{Policy: policy.Config{Method: "h2o", Budget: 64}, Sampling: p, N: 2})
	if a.usage.ComputedTokens != T || b.usage.ComputedTokens != 0 {
		t.Errorf("h2o: %d then %d tokens computed, want %d then 0", a.usage.ComputedTokens, b.usage.ComputedTokens, T)
	}
	for i := range 2 {
		if !slices.Equal(a.tokens[i], b.tokens[i]) {
			t.Errorf("h2o sample %d: %v, then %v", i, a.tokens[i], b.tokens[i])
		}
	}
	// Another parameter, another codec pair, no cache: misses.
	for _, r := range []GenRequest{
		{Policy: policy.Config{Method: "snapkv", Ratio: 0.25, Kernel: 7}},
		{Policy: snap, K: "q8", V: "q8"},
		{Policy: snap, NoPrefixCache: true},
	} {
		if o := run(r); o.usage.ComputedTokens != T {
			t.Errorf("%+v: %d tokens computed, want %d", r.Policy, o.usage.ComputedTokens, T)
		}
	}
	// Plain requests of other prompts take the memory of the f32 pool:
	// its compressed prefixes go by the LRU (the q8/q8 pool's stays: no
	// pool needs its memory), and the document is computed again.
	if n := e.Stats().CompressedPrefixes; n != 4 {
		t.Fatalf("%d compressed prefixes, want 4 (snapkv, h2o, snapkv kernel 7, snapkv q8/q8)", n)
	}
	all := longPrompt(t, tok, 1200)
	for i := 0; e.Stats().CompressedPrefixes > 1; i++ {
		if i == 20 {
			t.Fatalf("compressed prefixes never evicted: %+v", e.Stats())
		}
		o := collect(t, must(e.Submit(GenRequest{Prompt: all[i*40 : i*40+450], MaxTokens: 40})))
		if o.finish[0] == FinishError {
			t.Fatal(o.errs[0])
		}
	}
	// (At least the observation window: the fillers left the document's
	// raw blocks in the cache, since the first starts with it.)
	if o := run(GenRequest{Policy: snap}); o.usage.CompressedTokens != 0 || o.usage.ComputedTokens < 32 || !slices.Equal(o.tokens[0], first.tokens[0]) {
		t.Errorf("after eviction: %+v, %v", o.usage, o.tokens[0])
	}
	checkFree(t, e)
}
