package attention

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tensor"
)

// oneStepCase is a prompt of T tokens run as one forward step (every query
// in one Batch, as PyramidInfer's prefill does) against a cache holding
// its slots in the given order.
type oneStepCase struct {
	name          string
	heads, G, hd  int
	T, B          int    // prompt tokens, cache block size
	kc, vc        string // codecs
	order         string // "ordered"; "shuffled": every slot, in random order; "evicted": 70% of them, in random order
	window        int32
	strict, dummy bool
}

func oneStepCases() []oneStepCase {
	var cs []oneStepCase
	for _, c := range []oneStepCase{
		{heads: 2, G: 2, hd: 8, T: 301, B: 16, kc: "f32", vc: "f32"},
		{heads: 1, G: 3, hd: 16, T: 77, B: 5, kc: "f32", vc: "f16"},
		{heads: 2, G: 1, hd: 24, T: 259, B: 24, kc: "f16", vc: "q8"},
		{heads: 1, G: 8, hd: 16, T: 530, B: 16, kc: "f32", vc: "f32"}, // 8 query tokens per tile
		{heads: 2, G: 2, hd: 8, T: 203, B: 16, kc: "f32", vc: "f32", strict: true, dummy: true},
	} {
		for _, order := range []string{"ordered", "shuffled", "evicted"} {
			for _, w := range []int32{0, 37} {
				c.order, c.window = order, w
				c.name = fmt.Sprintf("h%d_g%d_d%d_T%d_B%d_%s_%s_%s_w%d_lc%v", c.heads, c.G, c.hd, c.T, c.B, c.kc, c.vc, order, w, c.strict)
				cs = append(cs, c)
			}
		}
	}
	return cs
}

// oneStep is what running a oneStepCase gives: the fixture, the queries, and
// the outputs and attention mass (the last ⌊T/5⌋+1 queries, weighted) of
// the one-step batch.
type oneStep struct {
	f    *fixture
	q    []float32 // [T][heads·G·hd]
	pos  []int32   // [T] 0 … T−1
	out  []float32 // [T][heads·G·hd]
	mass *MassRequest
}

func (c oneStepCase) batch(f *fixture, q, out []float32, pos []int32, mass *MassRequest) Batch {
	return Batch{Heads: c.heads, G: c.G, HeadDim: c.hd, Norm: float32(math.Sqrt(float64(c.hd))), Q: q, Out: out, Pos: pos,
		Window: c.window, Strict: c.strict, Dummy: c.dummy, SplitMin: -1, Mass: mass,
		Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }}
}

func (c oneStepCase) run(t testing.TB, seed uint64) *oneStep {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 41))
	slots := make([]int32, c.T)
	for i := range slots {
		slots[i] = int32(i)
	}
	switch c.order {
	case "shuffled":
		rng.Shuffle(len(slots), func(i, j int) { slots[i], slots[j] = slots[j], slots[i] })
	case "evicted":
		rng.Shuffle(len(slots), func(i, j int) { slots[i], slots[j] = slots[j], slots[i] })
		slots = slots[:c.T*7/10]
	}
	kc, err := codec.Parse(c.kc, codec.Keys)
	if err != nil {
		t.Fatal(err)
	}
	vc, err := codec.Parse(c.vc, codec.Values)
	if err != nil {
		t.Fatal(err)
	}
	r := &oneStep{f: buildAt(t, rng, c.heads, c.G, c.hd, slots, c.B, kc, vc)}
	stride := c.heads * c.G * c.hd
	r.q = make([]float32, c.T*stride)
	for i := range r.q {
		r.q[i] = float32(rng.NormFloat64())
	}
	r.pos = make([]int32, c.T)
	for i := range r.pos {
		r.pos[i] = int32(i)
	}
	from := c.T - 1 - c.T/5
	r.mass = &MassRequest{From: from, Agg: AggMean, Weights: make([]float32, c.T-from), Out: make([][]float32, c.heads)}
	for i := range r.mass.Weights {
		r.mass.Weights[i] = float32(1 + i)
	}
	for h := range r.mass.Out {
		r.mass.Out[h] = make([]float32, len(slots))
	}
	r.out = make([]float32, c.T*stride)
	b := c.batch(r.f, r.q, r.out, r.pos, r.mass)
	var sc Scratch
	b.Run(&sc)
	return r
}

// TestOneStepPrefill: a whole prompt as one batch of T queries (T not a
// multiple of the 16-query tile nor of the 16-slot panel), each query's
// softmax limited to the panels it sees, against a cache in position order,
// one whose slots are shuffled, and one that lost 30% of them (shuffled),
// with and without a sliding window, strict-causal with the dummy key:
// outputs and the weighted attention mass match naiveLC (float64), and the
// outputs are, bit for bit, what each query gives alone and what chunks of
// 48 queries give (a row's bits do not depend on its tile), and what every
// kernel level (the Go twins, AVX2, AVX-512) gives.
func TestOneStepPrefill(t *testing.T) {
	defer tensor.SetKernels("auto")
	for i, c := range oneStepCases() {
		t.Run(c.name, func(t *testing.T) {
			r := c.run(t, uint64(i))
			defer r.f.seq.Free()
			for _, level := range []string{"go", "avx2", "avx512"} {
				if tensor.SetKernels(level) != nil {
					continue
				}
				o := c.run(t, uint64(i))
				o.f.seq.Free()
				for k, v := range o.out {
					if math.Float32bits(v) != math.Float32bits(r.out[k]) {
						t.Fatalf("kernels %s: query %d value %d: %g, default kernels %g", level, k/(c.heads*c.G*c.hd), k%(c.heads*c.G*c.hd), v, r.out[k])
					}
				}
				for h := range o.mass.Out {
					for k, v := range o.mass.Out[h] {
						if math.Float32bits(v) != math.Float32bits(r.mass.Out[h][k]) {
							t.Fatalf("kernels %s: head %d slot %d mass %g, default kernels %g", level, h, k, v, r.mass.Out[h][k])
						}
					}
				}
			}
			tensor.SetKernels("auto")
			f := r.f
			stride := c.heads * c.G * c.hd
			norm := math.Sqrt(float64(c.hd))
			worst, mworst := 0.0, 0.0
			for h := 0; h < c.heads; h++ {
				want := make([]float64, len(f.pos))
				for ti, p := range r.pos {
					agg := make([]float64, len(f.pos))
					for j := 0; j < c.G; j++ {
						off := ti*stride + (h*c.G+j)*c.hd
						o, prob := naiveLC(f64(r.q[off:off+c.hd]), f.keys[h], f.vals[h], f.pos, p, c.window, c.strict, c.dummy, norm)
						for k := range o {
							worst = math.Max(worst, math.Abs(o[k]-float64(r.out[off+k])))
						}
						for s, pr := range prob {
							agg[s] += pr
						}
					}
					if ti >= r.mass.From {
						w := float64(r.mass.Weights[ti-r.mass.From])
						for s := range agg {
							want[s] += w * agg[s] / float64(c.G)
						}
					}
				}
				for s, w := range want {
					mworst = math.Max(mworst, math.Abs(w-float64(r.mass.Out[h][s]))/math.Max(1, w))
				}
			}
			if worst > 1e-5 || mworst > 1e-5 {
				t.Fatalf("against naiveLC: max |Δ| output %.3g, mass (relative) %.3g", worst, mworst)
			}
			for _, step := range []int{1, 48} {
				out := make([]float32, len(r.out))
				var sc Scratch
				for t0 := 0; t0 < c.T; t0 += step {
					t1 := min(t0+step, c.T)
					b := c.batch(f, r.q[t0*stride:t1*stride], out[t0*stride:t1*stride], r.pos[t0:t1], nil)
					b.Run(&sc)
				}
				for k, v := range out {
					if math.Float32bits(v) != math.Float32bits(r.out[k]) {
						t.Fatalf("query %d value %d: in batches of %d %g, in one batch %g", k/stride, k%stride, step, v, r.out[k])
					}
				}
			}
		})
	}
}
