package attention

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
)

// naive is attention written out plainly in float64: scores, softmax,
// weighted sum, over the keys whose position is at most qpos.
func naive(q []float64, keys, vals [][]float64, pos []int32, qpos int32, scale float64) []float64 {
	var s []float64
	var idx []int
	for i, k := range keys {
		if pos[i] > qpos {
			continue
		}
		d := 0.0
		for j := range q {
			d += q[j] * k[j]
		}
		s = append(s, d*scale)
		idx = append(idx, i)
	}
	out := make([]float64, len(q))
	if len(s) == 0 {
		return out
	}
	mx := math.Inf(-1)
	for _, v := range s {
		mx = math.Max(mx, v)
	}
	sum := 0.0
	for i := range s {
		s[i] = math.Exp(s[i] - mx)
		sum += s[i]
	}
	for n, i := range idx {
		for j := range out {
			out[j] += s[n] / sum * vals[i][j]
		}
	}
	return out
}

func TestCausalMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []struct{ G, hd, tokens, blockSize, queries int }{
		{1, 8, 1, 1, 1},
		{2, 8, 37, 16, 5},
		{4, 16, 100, 7, 9},
		{8, 64, 300, 64, 3},
		{1, 128, 513, 16, 2},
	}
	for _, c := range cases {
		// Tokens 0..tokens-1 spread over blocks; queries are the last ones.
		var blocks []*kvcache.Block
		keys := make([][]float64, c.tokens)
		vals := make([][]float64, c.tokens)
		pos := make([]int32, c.tokens)
		for i := 0; i < c.tokens; i++ {
			if i%c.blockSize == 0 {
				blocks = append(blocks, kvcache.NewBlock(c.blockSize, c.hd))
			}
			b := blocks[len(blocks)-1]
			keys[i], vals[i] = make([]float64, c.hd), make([]float64, c.hd)
			for j := 0; j < c.hd; j++ {
				k, v := float32(rng.NormFloat64()), float32(rng.NormFloat64())
				b.K[b.N*c.hd+j], b.V[b.N*c.hd+j] = k, v
				keys[i][j], vals[i][j] = float64(k), float64(v)
			}
			b.Pos[b.N] = int32(i)
			pos[i] = int32(i)
			b.N++
		}
		stride := c.G * c.hd * 3 // queries sit inside a wider row, as in the model
		q := make([]float32, c.queries*stride)
		out := make([]float32, c.queries*stride)
		qpos := make([]int32, c.queries)
		for t := range qpos {
			qpos[t] = int32(c.tokens - c.queries + t)
			for j := 0; j < c.G*c.hd; j++ {
				q[t*stride+j] = float32(rng.NormFloat64())
			}
		}
		scale := math.Sqrt(float64(c.hd))
		g := Group{G: c.G, HeadDim: c.hd, Norm: float32(scale)}
		var s Scratch
		g.Causal(out, q, stride, qpos, blocks, &s)
		worst := 0.0
		for t := range qpos {
			for h := 0; h < c.G; h++ {
				qq := make([]float64, c.hd)
				for j := range qq {
					qq[j] = float64(q[t*stride+h*c.hd+j])
				}
				want := naive(qq, keys, vals, pos, qpos[t], 1/scale)
				for j := range want {
					worst = math.Max(worst, math.Abs(want[j]-float64(out[t*stride+h*c.hd+j])))
				}
			}
		}
		if worst > 1e-5 {
			t.Errorf("%+v: max |Δ| %.3g", c, worst)
		}
	}
}
