package model_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// TestReindexPerLayerRope: on gemma3's shape (five local layers with RoPE
// base 10000 and window 8, one global layer with base 1e6), the policies
// that move cached keys to new positions (streaming with re-indexed
// positions, LM-Infinite's distance cap on the sinks) give at every decode
// step the logits of a float64 reference that keeps each layer's keys
// before RoPE and rotates them at their new positions with that layer's
// own base. The positions the cache holds are checked against each
// method's rule first, so the reference does not just take them on trust.
// Over a cache that keeps every token the policy keeps, and (LM-Infinite)
// over the model's own, whose local layers free the blocks that slid out.
func TestReindexPerLayerRope(t *testing.T) {
	const prefill, total, sinks, window = 16, 48, 2, 10
	path, ref := model.TinyArch(t, "gemma3")
	m, _, err := model.LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r := rand.New(rand.NewPCG(3, 25))
	tokens := make([]int, total)
	for i := range tokens {
		tokens[i] = r.IntN(m.Vocab)
	}
	for _, c := range []struct {
		name  string
		cfg   policy.Config
		frees []bool // the cache's local layers free what slid out
		// rule checks one layer's cache before token t: the kept tokens
		// idx at positions pos, and token t at qpos.
		rule func(t int, idx, pos []int, qpos int) error
		// canon: the reference rotates at StreamingLLM's positions
		// 0..n-1 with the query at n, not at the ones the cache holds, and
		// the offset the cache's run starts at must have grown and been
		// rebased to 0 once at least.
		canon bool
	}{
		// Re-indexing needs every layer to hold the same tokens: over the
		// model's own cache it is refused (policy's own test).
		{"streaming reindex", policy.Config{Method: "streaming", Sinks: sinks, Window: window, Positions: policy.PosReindex}, []bool{false},
			// Consecutive from some offset, the next token right after:
			// the distances of slots 0..n-1 and a query at n.
			func(t int, idx, pos []int, qpos int) error {
				off := qpos - len(idx)
				if off < 0 || off > 2*len(idx)+1 {
					return fmt.Errorf("next position %d with %d slots: offset %d outside [0, 2n+1]", qpos, len(idx), off)
				}
				for r := range pos {
					if pos[r] != off+r {
						return fmt.Errorf("slot %d at position %d, want %d", r, pos[r], off+r)
					}
				}
				return nil
			}, true},
		// A window of 6 inside the local layers' 8: the sinks it moves are
		// seen there.
		{"lminfinite", policy.Config{Method: "lminfinite", Sinks: sinks, Window: 6}, []bool{false, true},
			func(t int, idx, pos []int, qpos int) error {
				for r := range pos {
					want := idx[r]
					if r < sinks {
						want = max(want, t-6)
					}
					if pos[r] != want {
						return fmt.Errorf("token %d at position %d, want %d", idx[r], pos[r], want)
					}
				}
				if qpos != t {
					return fmt.Errorf("next position %d, want %d", qpos, t)
				}
				return nil
			}, false},
	} {
		for _, free := range c.frees {
			t.Run(fmt.Sprintf("%s/window frees %v", c.name, free), func(t *testing.T) {
				l := m.KVLayout()
				if !free {
					l.Windows = nil
				}
				pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: l, BlockTokens: 4, Tokens: m.CtxLen})
				if err != nil {
					t.Fatal(err)
				}
				cache := pool.NewSequence()
				defer cache.Free()
				seq, err := m.NewSequence(cache)
				if err != nil {
					t.Fatal(err)
				}
				st, err := policy.New(c.cfg, seq)
				if err != nil {
					t.Fatal(err)
				}
				st.BeginPrefill(prefill)
				if _, err := seq.Forward(tokens[:prefill], false); err != nil {
					t.Fatal(err)
				}
				if err := st.Compress(); err != nil {
					t.Fatal(err)
				}
				type layerCache struct {
					idx, pos []int
					qpos     int
				}
				caches := map[int][]layerCache{} // token → per layer
				got := map[int][]float32{}
				moved, grew, rebased, lastOff := false, false, false, -1
				for tk := prefill; tk < total; tk++ {
					if err := st.Before(1); err != nil {
						t.Fatal(err)
					}
					kept := st.Kept()
					lc := make([]layerCache, m.Config.Layers)
					for li := range lc {
						pos := cache.Positions(li, 0)
						idx := kept[li][0]
						if len(idx) > len(pos) { // the tokens a local layer freed
							idx = idx[len(idx)-len(pos):]
						}
						for h := 1; h < m.KVHeads; h++ {
							if !slices.Equal(cache.Positions(li, h), pos) {
								t.Fatalf("token %d, layer %d: heads 0 and %d hold other positions", tk, li, h)
							}
						}
						lc[li] = layerCache{qpos: seq.Pos()}
						for r := range pos {
							lc[li].idx = append(lc[li].idx, int(idx[r]))
							lc[li].pos = append(lc[li].pos, int(pos[r]))
							moved = moved || int(pos[r]) != int(idx[r])
						}
						if err := c.rule(tk, lc[li].idx, lc[li].pos, lc[li].qpos); err != nil {
							t.Fatalf("token %d, layer %d: %v", tk, li, err)
						}
					}
					caches[tk] = lc
					off := lc[0].qpos - len(lc[0].idx)
					if lastOff >= 0 {
						grew = grew || off > lastOff
						rebased = rebased || off < lastOff
					}
					lastOff = off
					logits, err := seq.Forward([]int{tokens[tk]}, false)
					if err != nil {
						t.Fatal(err)
					}
					got[tk] = slices.Clone(logits)
				}
				if !moved {
					t.Fatal("no key moved: the test shows nothing")
				}
				if c.canon && !(grew && rebased) {
					t.Fatalf("the run's offset grew %v, was rebased %v: want both", grew, rebased)
				}
				want := ref(tokens, func(tk, li int) ([]int, []int, int) {
					if tk < prefill {
						idx := make([]int, tk)
						for u := range idx {
							idx[u] = u
						}
						return idx, idx, tk
					}
					lc := caches[tk][li]
					if c.canon {
						pos := make([]int, len(lc.idx))
						for r := range pos {
							pos[r] = r
						}
						return lc.idx, pos, len(lc.idx)
					}
					return lc.idx, lc.pos, lc.qpos
				})
				for tk := prefill; tk < total; tk++ {
					var worst float64
					for i, g := range got[tk] {
						worst = max(worst, math.Abs(float64(g)-want[tk][i]))
					}
					if !(worst <= 1e-4) {
						t.Fatalf("token %d: logits differ from the reference by %.3g", tk, worst)
					}
				}
			})
		}
	}
}
