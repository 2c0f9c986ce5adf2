package engine

import (
	"slices"
	"sync"
	"testing"

	"github.com/kvlm/kvlm/sample"
)

// TestEngineKVMaps: the continuous-batching engine runs models that share
// KV across layers (stories260K's weights under a CLA2 map, a YOCO-like map
// with a windowed self-decoder, a Layer-Condensed KV map): concurrent
// requests prefilled in chunks and decoded in batches, a repeated prompt
// from the prefix cache, two samples by fork, and a pool small enough to
// preempt, all give what one standalone sequence gives, and the pool is
// free afterwards.
func TestEngineKVMaps(t *testing.T) {
	for _, c := range []struct {
		name     string
		src, win []int
	}{
		{"cla2", []int{0, 0, 2, 2, 4}, nil},
		{"yoco", []int{0, 1, 2, 2, 2}, []int{8, 8, 0, 0, 0}},
		{"lckv", []int{0, 4, 4, 4, 4}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, tok := loadStories(t)
			m.KVSource, m.LayerWindows = c.src, c.win
			for i := range m.Layers {
				if !m.Owns(i) {
					m.Layers[i].Wk, m.Layers[i].Wv = nil, nil
				}
			}
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}
			ps := prompts(tok)
			want := make([][]int, len(ps))
			for i, p := range ps {
				want[i] = reference(t, m, p, 30, sample.Params{})
			}
			e := newEngine(t, m, Config{PrefillChunk: 7})
			got := make([]outcome, len(ps))
			var wg sync.WaitGroup
			for i, p := range ps {
				h := must(e.Submit(GenRequest{Prompt: p, MaxTokens: 30}))
				wg.Add(1)
				go func() { defer wg.Done(); got[i] = collect(t, h) }()
			}
			wg.Wait()
			for i := range ps {
				if !slices.Equal(got[i].tokens[0], want[i]) {
					t.Errorf("prompt %d: got %v\nwant %v", i, got[i].tokens[0], want[i])
				}
			}
			long := slices.Concat(ps[2], ps[5], ps[1])
			wantLong := reference(t, m, long, 20, sample.Params{})
			a := collect(t, must(e.Submit(GenRequest{Prompt: long, MaxTokens: 20})))
			b := collect(t, must(e.Submit(GenRequest{Prompt: long, MaxTokens: 20})))
			if b.usage.CachedTokens == 0 || !slices.Equal(a.tokens[0], wantLong) || !slices.Equal(b.tokens[0], wantLong) {
				t.Errorf("prefix cache: %d cached tokens, %v, %v, want %v", b.usage.CachedTokens, a.tokens[0], b.tokens[0], wantLong)
			}
			n2 := collect(t, must(e.Submit(GenRequest{Prompt: ps[0], MaxTokens: 30, N: 2})))
			for j := range 2 {
				if !slices.Equal(n2.tokens[j], want[0]) {
					t.Errorf("sample %d of 2: %v, want %v", j, n2.tokens[j], want[0])
				}
			}
			checkFree(t, e)
			// A pool of 10 blocks per table: preemption.
			l := m.KVLayout()
			small := newEngine(t, m, Config{KVMem: int64(10 * l.Layers * l.KVHeads * 16 * (2*4*l.HeadDim + 4)), MaxRunning: 8})
			hs := make([]*Handle, len(ps))
			for i, p := range ps {
				hs[i] = must(small.Submit(GenRequest{Prompt: p, MaxTokens: 30}))
			}
			pre := 0
			for i, h := range hs {
				o := collect(t, h)
				pre += o.usage.Preemptions
				if !slices.Equal(o.tokens[0], want[i]) {
					t.Errorf("small pool, prompt %d: got %v\nwant %v", i, o.tokens[0], want[i])
				}
			}
			t.Logf("%d preemptions", pre)
			checkFree(t, small)
		})
	}
}
