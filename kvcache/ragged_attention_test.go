package kvcache_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// TestAttentionOverRaggedTables: attention over tables that decode-time
// prunes left ragged (blocks part-filled in the middle of the table, a
// sinks' block drained) equals naive float64 attention over the rows the
// segments hold, for decode (split into chunks and not), a causal batch and
// the attention mass — the mass indexed by slot, so a slot read out of
// place shows.
func TestAttentionOverRaggedTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	const H, G, d, T = 2, 3, 16, 800
	for _, names := range [][2]string{{"f32", "f32"}, {"f16", "f16"}, {"q8", "q4"}} {
		kc, _ := codec.Parse(names[0], codec.Keys)
		vc, _ := codec.Parse(names[1], codec.Values)
		t.Run(names[0]+"_"+names[1], func(t *testing.T) {
			p, err := kvcache.NewPool(kvcache.PoolConfig{Layout: kvcache.Layout{Layers: 1, KVHeads: H, HeadDim: d}, BlockTokens: 16, K: kc, V: vc, Tokens: T + 64})
			if err != nil {
				t.Fatal(err)
			}
			s := p.NewSequence()
			defer s.Free()
			w := H * d
			k, v := make([]float32, T*w), make([]float32, T*w)
			for i := range k {
				k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
			}
			pos := make([]int32, T)
			for i := range pos {
				pos[i] = int32(i)
			}
			if err := s.Append(0, pos, k, v); err != nil {
				t.Fatal(err)
			}
			// Drops as decoding makes them: the oldest after 4 sinks, and
			// scattered single slots.
			for h := 0; h < H; h++ {
				for step := 0; step < 60; step++ {
					n := s.Slots(0, h)
					gone := 4
					if step%2 == 1 {
						gone = 4 + rng.IntN(n-4)
					}
					keep := make([]int, 0, n-1)
					for i := range n {
						if i != gone {
							keep = append(keep, i)
						}
					}
					if err := s.Keep(0, h, keep); err != nil {
						t.Fatal(err)
					}
				}
				cnt := kvcache.RaggedOf(s, 0, h)
				inner := 0
				for _, c := range cnt[:max(0, len(cnt)-1)] {
					if c < 16 {
						inner++
					}
				}
				if inner < 2 {
					t.Fatalf("head %d: counts %v: the prunes left too few part-filled blocks to test", h, cnt)
				}
			}
			keys, vals := make([][][]float64, H), make([][][]float64, H)
			spos := make([][]int32, H)
			row := make([]float32, d)
			for h := 0; h < H; h++ {
				for _, sg := range s.Segments(0, h) {
					for i := 0; i < sg.N; i++ {
						sg.KC.Get(sg.K, sg.Cap, d, i, row)
						kr := make([]float64, d)
						for c := range row {
							kr[c] = float64(row[c])
						}
						sg.VC.Get(sg.V, sg.Cap, d, i, row)
						vr := make([]float64, d)
						for c := range row {
							vr[c] = float64(row[c])
						}
						keys[h], vals[h] = append(keys[h], kr), append(vals[h], vr)
						spos[h] = append(spos[h], sg.Pos[i])
					}
				}
			}
			checkAttention(t, rng, H, G, d, T, func(h int) []kvcache.Segment { return s.Segments(0, h) }, keys, vals, spos, []attnCase{
				{qpos: []int32{T - 1}, splitMin: -1},
				{qpos: []int32{T - 1}, splitMin: 1, mass: true},
				{qpos: []int32{400}, splitMin: 1},
				{qpos: pos[T-24:], mass: true},
			}, "ragged")
		})
	}
}
