package kvcache_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
)

// attnCase is one attention batch checked against naive attention:
// queries at qpos, FlashDecoding's split (SplitMin), the online softmax,
// the attention mass asked.
type attnCase struct {
	qpos     []int32
	splitMin int
	online   bool
	mass     bool
}

// checkAttention runs each case over segs (H KV heads, G query heads
// each, head dim d, T the most slots a head holds) with random queries
// and compares the outputs, and the mass where asked, with naive float64
// attention over the rows the segments hold: keys, vals and spos per head,
// in slot order.
func checkAttention(t *testing.T, rng *rand.Rand, H, G, d, T int, segs func(h int) []kvcache.Segment,
	keys, vals [][][]float64, spos [][]int32, cases []attnCase, what string) {
	t.Helper()
	for _, c := range cases {
		n := len(c.qpos)
		q := make([]float32, n*H*G*d)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		out := make([]float32, len(q))
		b := attention.Batch{Heads: H, G: G, HeadDim: d, Norm: float32(math.Sqrt(float64(d))), Q: q, Out: out, Pos: c.qpos,
			Segs: segs, SplitMin: c.splitMin, SplitChunk: 128, Online: c.online}
		if c.mass {
			b.Mass = &attention.MassRequest{Agg: attention.AggMean, Out: make([][]float32, H)}
			for h := range b.Mass.Out {
				b.Mass.Out[h] = make([]float32, T)
			}
		}
		var sc attention.Scratch
		b.Run(&sc)
		for h := 0; h < H; h++ {
			wantMass := make([]float64, T)
			for ti, qp := range c.qpos {
				for j := 0; j < G; j++ {
					off := (ti*H*G + h*G + j) * d
					want, prob := naive(q[off:off+d], keys[h], vals[h], spos[h], qp, math.Sqrt(float64(d)))
					for x := range want {
						if math.Abs(want[x]-float64(out[off+x])) > 1e-4 {
							t.Fatalf("%s %+v head %d query %d: out %v, naive %v", what, c, h, ti, out[off+x], want[x])
						}
					}
					for i, pr := range prob {
						wantMass[i] += pr / float64(G)
					}
				}
			}
			if c.mass {
				for i, m := range wantMass {
					if math.Abs(m-float64(b.Mass.Out[h][i])) > 1e-5 {
						t.Fatalf("%s head %d slot %d: mass %v, naive %v", what, h, i, b.Mass.Out[h][i], m)
					}
				}
			}
		}
	}
}
