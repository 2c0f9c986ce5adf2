package model_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// TestSlidingWindowWithPolicies: a KV policy that keeps more than the
// model's sliding window (sinks, heavy hitters, a longer recent window) must
// not widen what attention sees: the tokens it keeps outside the model's
// window stay hidden, so every decode step's logits equal those of the full
// cache under the same model window. Checked with original and re-indexed
// positions (re-indexing keeps the recent tokens' distances, and moves the
// sinks no closer than the policy's window, which is ≥ the model's). The
// policy runs over a cache that keeps every token the policy keeps (its
// layout without Windows) and over the model's own cache, whose
// window-bounded layers also free the blocks that slid out: both give the
// full cache's logits.
func TestSlidingWindowWithPolicies(t *testing.T) {
	const W, prefill, total = 40, 60, 260
	m, err := model.LoadLlama2C(shared.Path(t, "models/stories260K/stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.SlidingWindow = W // stories260K has no window: give it one
	r := rand.New(rand.NewPCG(8, 9))
	tokens := make([]int, total)
	for i := range tokens {
		tokens[i] = r.IntN(m.Vocab)
	}
	// The reference: the whole history in the cache, the model window alone.
	run := func(t *testing.T, cfg *policy.Config, free bool) [][]float32 {
		t.Helper()
		l := m.KVLayout()
		if !free {
			l.Windows = nil // the cache frees nothing by itself
		}
		pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: l, BlockTokens: kvcache.DefaultBlockTokens, Tokens: m.CtxLen})
		if err != nil {
			t.Fatal(err)
		}
		cache := pool.NewSequence()
		defer cache.Free()
		seq, err := m.NewSequence(cache)
		if err != nil {
			t.Fatal(err)
		}
		var st *policy.State
		if cfg != nil {
			if st, err = policy.New(*cfg, seq); err != nil {
				t.Fatal(err)
			}
			st.BeginPrefill(prefill)
		}
		var out [][]float32
		logits, err := seq.Forward(tokens[:prefill], false)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append([]float32(nil), logits...))
		if st != nil {
			if err := st.Compress(); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range tokens[prefill:] {
			if st != nil {
				if err := st.Before(1); err != nil {
					t.Fatal(err)
				}
			}
			logits, err := seq.Forward([]int{id}, false)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, append([]float32(nil), logits...))
		}
		if st != nil && !free {
			if kept := cache.Slots(0, 0); kept >= total {
				t.Fatalf("the policy kept all %d tokens: the test shows nothing", kept)
			}
		}
		return out
	}
	want := run(t, nil, false)
	for _, c := range []struct {
		name string
		cfg  policy.Config
	}{
		{"window 64", policy.Config{Method: "window", Window: 64}},
		{"streaming 4+60", policy.Config{Method: "streaming", Sinks: 4, Window: 60}},
		{"streaming 4+60 reindex", policy.Config{Method: "streaming", Sinks: 4, Window: 60, Positions: policy.PosReindex}},
		// 48 tokens: fewer than a freeing window layer holds at times (up
		// to W + B − 1 = 55), so the window and the policy both act.
		{"streaming 4+44 reindex", policy.Config{Method: "streaming", Sinks: 4, Window: 44, Positions: policy.PosReindex}},
		{"streaming 4+44", policy.Config{Method: "streaming", Sinks: 4, Window: 44}},
		{"lminfinite 4+60", policy.Config{Method: "lminfinite", Sinks: 4, Window: 60}},
		{"h2o 100, recent 48", policy.Config{Method: "h2o", Budget: 100, Window: 48}},
	} {
		for _, free := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/window frees %v", c.name, free), func(t *testing.T) {
				got := run(t, &c.cfg, free)
				for step := range want {
					var worst float64
					for i := range want[step] {
						worst = max(worst, math.Abs(float64(got[step][i]-want[step][i])))
					}
					if !(worst <= 1e-4) {
						t.Fatalf("step %d (position %d): logits differ from the full cache's by %.3g", step, prefill-1+step, worst)
					}
				}
			})
		}
	}
}
