// Package attention computes scaled dot-product attention of queries against
// the keys and values a kvcache block table holds.
package attention

import (
	"math"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/tensor"
)

// Group is the attention of the G query heads that share one KV head.
type Group struct {
	G       int     // query heads in the group
	HeadDim int     // values per head
	Norm    float32 // scores q·k are divided by it: sqrt(HeadDim), as run.c
}

// Scratch holds the per-call buffers of Causal; reuse one per goroutine.
type Scratch struct {
	scores []float32 // [G][slots]
}

// Causal computes attention for n query tokens of one KV group against the
// stored tokens of blocks, each query seeing only slots whose position is at
// most its own (so a prompt chunk appended before the call is causal).
//
// q holds token t's G query heads at q[t*stride : t*stride+G*HeadDim]; out
// is laid out the same way. qpos is [n].
func (g Group) Causal(out, q []float32, stride int, qpos []int32, blocks []*kvcache.Block, s *Scratch) {
	hd := g.HeadDim
	slots := 0
	for _, b := range blocks {
		slots += b.N
	}
	if cap(s.scores) < g.G*slots {
		s.scores = make([]float32, g.G*slots)
	}
	scores := s.scores[:g.G*slots]
	for t, p := range qpos {
		qt := q[t*stride : t*stride+g.G*hd]
		ot := out[t*stride : t*stride+g.G*hd]
		// Pass 1: scores and their maximum per query head.
		n := 0
		for _, b := range blocks {
			for i := 0; i < b.N; i++ {
				if b.Pos[i] > p {
					continue
				}
				k := b.K[i*hd : (i+1)*hd]
				for j := 0; j < g.G; j++ {
					scores[j*slots+n] = tensor.Dot(qt[j*hd:(j+1)*hd], k) / g.Norm
				}
				n++
			}
		}
		// Pass 2: softmax and the weighted sum of values.
		for j := 0; j < g.G; j++ {
			row := scores[j*slots : j*slots+n]
			oj := ot[j*hd : (j+1)*hd]
			clear(oj)
			if n == 0 {
				continue
			}
			softmax(row)
			m := 0
			for _, b := range blocks {
				for i := 0; i < b.N; i++ {
					if b.Pos[i] > p {
						continue
					}
					tensor.Axpy(oj, row[m], b.V[i*hd:(i+1)*hd])
					m++
				}
			}
		}
	}
}

// softmax normalises x in place, subtracting the maximum first.
func softmax(x []float32) {
	mx := x[0]
	for _, v := range x[1:] {
		if v > mx {
			mx = v
		}
	}
	var sum float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - mx)))
		x[i] = e
		sum += e
	}
	for i := range x {
		x[i] /= sum
	}
}
