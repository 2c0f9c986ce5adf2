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

// naive is attention written out plainly in float64 over explicit key and
// value rows: scores, softmax, weighted sum, over the keys whose position is
// at most qpos. It also returns the probabilities.
func naive(q []float64, keys, vals [][]float64, pos []int32, qpos int32, norm float64) (out, prob []float64) {
	return naiveScored(rawScores(q, keys), vals, pos, qpos, norm)
}

// rawScores is q·k for every key, each summed in order.
func rawScores(q []float64, keys [][]float64) []float64 {
	s := make([]float64, len(keys))
	for i, k := range keys {
		for j := range q {
			s[i] += q[j] * k[j]
		}
	}
	return s
}

// naiveScored is naive with the raw scores q·k given (attention over a
// codec that scores otherwise, or with a soft cap applied to them).
func naiveScored(scores []float64, vals [][]float64, pos []int32, qpos int32, norm float64) (out, prob []float64) {
	prob = make([]float64, len(scores))
	out = make([]float64, len(vals[0]))
	mx := math.Inf(-1)
	for i, d := range scores {
		if pos[i] > qpos {
			prob[i] = math.Inf(-1)
			continue
		}
		prob[i] = d / norm
		mx = math.Max(mx, prob[i])
	}
	if math.IsInf(mx, -1) {
		clear(prob)
		return out, prob
	}
	sum := 0.0
	for i := range prob {
		prob[i] = math.Exp(prob[i] - mx)
		sum += prob[i]
	}
	for i := range prob {
		prob[i] /= sum
		for j := range out {
			out[j] += prob[i] * vals[i][j]
		}
	}
	return out, prob
}

type fixture struct {
	heads, G, hd, tokens int
	seq                  *kvcache.Paged
	keys, vals           [][][]float64 // [head][token][hd], as stored (decoded)
	pos                  []int32
	segs                 func(h int) []kvcache.Segment // nil: the sequence's segments
}

// build fills a one-layer paged cache with random keys and values and reads
// back what the codecs stored, as the reference sees it.
func build(t testing.TB, rng *rand.Rand, heads, G, hd, tokens, B int, kc, vc codec.Codec) *fixture {
	t.Helper()
	pos := make([]int32, tokens)
	for i := range pos {
		pos[i] = int32(i)
	}
	return buildAt(t, rng, heads, G, hd, pos, B, kc, vc)
}

// buildAt is build with the slots' positions given, in slot order: they need
// not be in order (as a cache whose slots an eviction policy reordered).
func buildAt(t testing.TB, rng *rand.Rand, heads, G, hd int, positions []int32, B int, kc, vc codec.Codec) *fixture {
	t.Helper()
	tokens := len(positions)
	pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: kvcache.Layout{Layers: 1, KVHeads: heads, HeadDim: hd},
		BlockTokens: B, K: kc, V: vc, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{heads: heads, G: G, hd: hd, tokens: tokens, seq: pool.NewSequence()}
	w := heads * hd
	for lo := 0; lo < tokens; lo += 333 {
		n := min(333, tokens-lo)
		k, v := make([]float32, n*w), make([]float32, n*w)
		for i := range k {
			k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		pos := positions[lo : lo+n]
		if err := f.seq.Append(0, pos, k, v); err != nil {
			t.Fatal(err)
		}
	}
	f.keys, f.vals = make([][][]float64, heads), make([][][]float64, heads)
	row := make([]float32, hd)
	for h := 0; h < heads; h++ {
		for _, s := range f.seq.Segments(0, h) {
			for i := 0; i < s.N; i++ {
				s.KC.Get(s.K, s.Cap, hd, i, row)
				f.keys[h] = append(f.keys[h], f64(row))
				s.VC.Get(s.V, s.Cap, hd, i, row)
				f.vals[h] = append(f.vals[h], f64(row))
				if h == 0 {
					f.pos = append(f.pos, s.Pos[i])
				}
			}
		}
	}
	return f
}

func f64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// check runs a batch of queries at the given positions and compares outputs
// and (optionally) attention mass with the naive reference.
func (f *fixture) check(t *testing.T, rng *rand.Rand, qpos []int32, splitMin int, mass *MassRequest, tol float64) {
	t.Helper()
	f.checkMode(t, rng, qpos, splitMin, false, mass, tol)
	if len(qpos) > 1 && mass == nil {
		f.checkMode(t, rng, qpos, splitMin, true, nil, tol)
	}
}

func (f *fixture) checkMode(t *testing.T, rng *rand.Rand, qpos []int32, splitMin int, online bool, mass *MassRequest, tol float64) {
	t.Helper()
	n := len(qpos)
	stride := f.heads * f.G * f.hd
	q := make([]float32, n*stride)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	out := make([]float32, n*stride)
	segs := f.segs
	if segs == nil {
		segs = func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }
	}
	b := Batch{Heads: f.heads, G: f.G, HeadDim: f.hd, Norm: float32(math.Sqrt(float64(f.hd))), Q: q, Out: out, Pos: qpos,
		Segs: segs, SplitMin: splitMin, SplitChunk: 100, Mass: mass, Online: online}
	var sc Scratch
	b.Run(&sc)
	worst := 0.0
	wantMass := make([][]float64, f.heads)
	for h := range wantMass {
		wantMass[h] = make([]float64, len(f.pos))
	}
	for ti, p := range qpos {
		for h := 0; h < f.heads; h++ {
			agg := make([]float64, len(f.pos))
			for j := 0; j < f.G; j++ {
				off := ti*stride + (h*f.G+j)*f.hd
				want, prob := naive(f64(q[off:off+f.hd]), f.keys[h], f.vals[h], f.pos, p, math.Sqrt(float64(f.hd)))
				for c := range want {
					worst = math.Max(worst, math.Abs(want[c]-float64(out[off+c])))
				}
				for i, pr := range prob {
					if mass != nil && mass.Agg == AggMax {
						agg[i] = math.Max(agg[i], pr)
					} else {
						agg[i] += pr
					}
				}
			}
			if mass != nil && ti >= mass.From {
				w := 1.0
				if mass.Weights != nil {
					w = float64(mass.Weights[ti-mass.From])
				}
				for i := range agg {
					if mass.Agg == AggMean {
						agg[i] /= float64(f.G)
					}
					wantMass[h][i] += w * agg[i]
				}
			}
		}
	}
	if worst > tol {
		t.Errorf("online %v split %d: max |Δ| %.3g > %.3g", online, splitMin, worst, tol)
	}
	if mass != nil {
		mw := 0.0
		for h := range wantMass {
			for i, w := range wantMass[h] {
				mw = math.Max(mw, math.Abs(w-float64(mass.Out[h][i])))
			}
		}
		if mw > 1e-5 {
			t.Errorf("attention mass: max |Δ| %.3g", mw)
		}
	}
}

// TestPagedMatchesNaive: paged attention over f32 blocks (keys in rows and
// in score panels) equals naive attention for block sizes 1, 16, 24, 64,
// GQA ratios 1-8 and contexts 1-8192, for prefill-like batches and single
// decode queries, split or not.
func TestPagedMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []struct{ heads, G, hd, tokens, B int }{
		{1, 1, 8, 1, 1},
		{2, 2, 8, 37, 16},
		{2, 4, 16, 100, 1},
		{1, 8, 64, 300, 64},
		{4, 1, 32, 1000, 16},
		{1, 2, 64, 2049, 16},
		{1, 4, 128, 8192, 64},
		{2, 8, 64, 203, 24},
	}
	for _, c := range cases {
		for _, kc := range []codec.Codec{codec.F32, codec.F32Keys} {
			t.Run(fmt.Sprintf("h%d_g%d_d%d_t%d_b%d_%T", c.heads, c.G, c.hd, c.tokens, c.B, kc), func(t *testing.T) {
				f := build(t, rng, c.heads, c.G, c.hd, c.tokens, c.B, kc, codec.F32)
				last := int32(c.tokens - 1)
				// Decode: one query at the end, split and unsplit.
				f.check(t, rng, []int32{last}, -1, nil, 1e-5)
				f.check(t, rng, []int32{last}, 1, nil, 1e-5)
				// Prefill: the last few tokens as a causal batch, and a query in the middle.
				var qpos []int32
				for p := max(0, c.tokens-20); p < c.tokens; p++ {
					qpos = append(qpos, int32(p))
				}
				f.check(t, rng, qpos, 0, nil, 1e-5)
				f.check(t, rng, []int32{int32(c.tokens / 2)}, 1, nil, 1e-5)
			})
		}
	}
}

// TestKeyPanelsMatchRows: keys stored in score panels (codec.F32Keys,
// F16Keys, BF16Keys, read in place; Q8Keys and Q4Keys, shifted or not,
// decoded straight into the panel) give, bit for bit, what the same keys
// stored in rows (packed into panels each step) give: decode split or not, prefill exact and
// online, with the attention mass, for blocks of whole panels and blocks
// with a partial last group (gathered, or packed from the group).
func TestKeyPanelsMatchRows(t *testing.T) {
	mu := make([]float32, 32)
	for i := range mu {
		mu[i] = float32(i%5) - 1.5
	}
	for _, c := range []struct {
		rows, pans codec.Codec
		B          int
	}{
		{codec.F32, codec.F32Keys, 8}, {codec.F32, codec.F32Keys, 16}, {codec.F32, codec.F32Keys, 24}, {codec.F32, codec.F32Keys, 64},
		{codec.F16, codec.F16Keys, 16}, {codec.F16, codec.F16Keys, 24}, {codec.BF16, codec.BF16Keys, 32},
		{codec.Q8, codec.Q8Keys, 16}, {codec.Q8, codec.Q8Keys, 24}, {codec.Shifted(codec.Q8, mu), codec.Shifted(codec.Q8Keys, mu), 16},
		{codec.Q4, codec.Q4Keys, 16}, {codec.Q4, codec.Q4Keys, 40}, {codec.Shifted(codec.Q4, mu), codec.Shifted(codec.Q4Keys, mu), 32},
	} {
		B := c.B
		t.Run(fmt.Sprintf("%s_%v_B%d", c.rows.Name(), codec.Shift(c.rows) != nil, B), func(t *testing.T) {
			const heads, G, hd, tokens = 2, 4, 32, 150
			rows := build(t, rand.New(rand.NewPCG(17, 18)), heads, G, hd, tokens, B, c.rows, codec.F32)
			pans := build(t, rand.New(rand.NewPCG(17, 18)), heads, G, hd, tokens, B, c.pans, codec.F32)
			rng := rand.New(rand.NewPCG(19, 20))
			stride := heads * G * hd
			for _, tc := range []struct {
				pos      []int32
				splitMin int
				online   bool
			}{
				{[]int32{tokens - 1}, -1, false},
				{[]int32{tokens - 1}, 1, false},
				{[]int32{70, 71, 72, 100, 149}, 0, false},
				{[]int32{70, 71, 72, 100, 149}, 0, true},
			} {
				q := make([]float32, len(tc.pos)*stride)
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				run := func(f *fixture) ([]float32, [][]float32) {
					out := make([]float32, len(q))
					mass := &MassRequest{Out: make([][]float32, heads)}
					for h := range mass.Out {
						mass.Out[h] = make([]float32, tokens)
					}
					if tc.online {
						mass = nil
					}
					b := Batch{Heads: heads, G: G, HeadDim: hd, Norm: float32(math.Sqrt(hd)), Q: q, Out: out, Pos: tc.pos,
						Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }, SplitMin: tc.splitMin, Online: tc.online, Mass: mass}
					var sc Scratch
					b.Run(&sc)
					if mass == nil {
						return out, nil
					}
					return out, mass.Out
				}
				wo, wm := run(rows)
				got, gm := run(pans)
				for k := range wo {
					if math.Float32bits(wo[k]) != math.Float32bits(got[k]) {
						t.Fatalf("%+v: output %d = %g in panels, %g in rows", tc, k, got[k], wo[k])
					}
				}
				for h := range wm {
					for k := range wm[h] {
						if math.Float32bits(wm[h][k]) != math.Float32bits(gm[h][k]) {
							t.Fatalf("%+v: head %d mass %d = %g in panels, %g in rows", tc, h, k, gm[h][k], wm[h][k])
						}
					}
				}
			}
		})
	}
}

// TestCodecsReadDirectly: attention over every codec equals the naive
// attention over the values the codec decodes to (dequantize-then-compute).
func TestCodecsReadDirectly(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	names := []string{"f32", "f16", "bf16", "q8", "q4", "kivi2", "kivi4"}
	for _, kn := range names {
		for _, vn := range []string{"f16", "q8", "q4", "kivi2"} {
			kc, err := codec.Parse(kn, codec.Keys)
			if err != nil {
				t.Fatal(err)
			}
			vc, err := codec.Parse(vn, codec.Values)
			if err != nil {
				t.Fatal(err)
			}
			t.Run(kn+"_"+vn, func(t *testing.T) {
				f := build(t, rng, 2, 2, 64, 300, 16, kc, vc)
				f.check(t, rng, []int32{299}, 1, nil, 2e-5)
				f.check(t, rng, []int32{290, 299}, 0, nil, 2e-5)
			})
		}
	}
}

// TestAttentionMass: the mass against the naive reference, for 20
// queries (two tiles a head: the separate mass pass), 12 and 1 (one exact
// tile a head: the mass added by the attention item itself).
func TestAttentionMass(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	f := build(t, rng, 2, 4, 16, 90, 16, codec.F32, codec.F32)
	for _, nq := range []int{20, 12, 1} {
		var qpos []int32
		for p := 90 - nq; p < 90; p++ {
			qpos = append(qpos, int32(p))
		}
		for _, agg := range []Agg{AggMean, AggMax, AggSum} {
			for _, from := range []int{0, nq / 2, nq - 1} {
				m := &MassRequest{From: from, Agg: agg, Out: [][]float32{make([]float32, 90), make([]float32, 90)}}
				t.Run(fmt.Sprintf("%dq/%s_from%d", nq, agg, from), func(t *testing.T) {
					f.check(t, rng, qpos, 0, m, 1e-5)
				})
			}
		}
	}
}

// TestAttentionMassFused: the mass exact attention items add from their
// own weights (a decode step, a chunk of one tile, and a prompt of several
// tiles a head when the workers take whole heads) equals bit for bit the
// separate pass's, which the online softmax takes.
func TestAttentionMassFused(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 7))
	f := build(t, rng, 2, 4, 16, 90, 16, codec.F32, codec.F32)
	stride := f.heads * f.G * f.hd
	for _, nq := range []int{1, 5, 12, 20, 40} {
		qpos, q := lastQueries(rng, f, nq)
		w := make([]float32, nq)
		for i := range w {
			w[i] = 1 + 0.2*float32(i)
		}
		for _, agg := range []Agg{AggMean, AggMax, AggSum} {
			t.Run(fmt.Sprintf("%dq/%s", nq, agg), func(t *testing.T) {
				var got [2][][]float32
				for i, online := range []bool{false, true} {
					m := &MassRequest{Agg: agg, Weights: w, Out: [][]float32{make([]float32, 90), make([]float32, 90)}}
					b := Batch{Heads: f.heads, G: f.G, HeadDim: f.hd, Norm: float32(math.Sqrt(float64(f.hd))), Q: q, Out: make([]float32, nq*stride), Pos: qpos,
						Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }, SplitMin: -1, Mass: m, Online: online}
					var sc Scratch
					b.Run(&sc)
					fused := false
					for _, it := range sc.items {
						fused = fused || it.mass
					}
					want := !online && (nq <= queryTile(f.G, 90) || f.heads%tensor.Threads == 0)
					if fused != want {
						t.Fatalf("online %v: an item added the mass %v, want %v", online, fused, want)
					}
					got[i] = m.Out
				}
				for h := range got[0] {
					for j := range got[0][h] {
						if math.Float32bits(got[0][h][j]) != math.Float32bits(got[1][h][j]) {
							t.Fatalf("head %d slot %d: fused mass %v, separate pass %v", h, j, got[0][h][j], got[1][h][j])
						}
					}
				}
			})
		}
	}
}

// TestAddMassExact: addMass, which aggregates a panel's query heads lane by
// lane, gives bit for bit the sums of the slot-by-slot loop below (the
// form it replaced: per slot, the heads in order), with and without
// per-query weights, from a later query, for every aggregation.
func TestAddMassExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	f := build(t, rng, 2, 4, 16, 90, 16, codec.F32, codec.F32)
	stride := f.heads * f.G * f.hd
	for _, nq := range []int{1, 20} {
		qpos, q := lastQueries(rng, f, nq)
		for _, agg := range []Agg{AggMean, AggMax, AggSum} {
			for _, from := range []int{0, nq / 2} {
				for _, weighted := range []bool{false, true} {
					t.Run(fmt.Sprintf("%dq/%s_from%d_w%v", nq, agg, from, weighted), func(t *testing.T) {
						var w []float32
						if weighted {
							for i := from; i < nq; i++ {
								w = append(w, 1+0.3*float32(i))
							}
						}
						m := &MassRequest{From: from, Agg: agg, Weights: w, Out: [][]float32{make([]float32, 90), make([]float32, 90)}}
						b := Batch{Heads: f.heads, G: f.G, HeadDim: f.hd, Norm: float32(math.Sqrt(float64(f.hd))), Q: q, Out: make([]float32, nq*stride), Pos: qpos,
							Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }, SplitMin: -1, Mass: m}
						var sc Scratch
						b.Run(&sc)
						want := [][]float32{make([]float32, 90), make([]float32, 90)}
						tl := new(tile)
						for h := range f.heads {
							segs := b.Segs(h)
							slots := 0
							for _, s := range segs {
								slots += s.N
							}
							n := queryTile(f.G, slots)
							for q0 := max(from, 0); q0 < nq; q0 += n {
								it := item{head: h, q0: q0, q1: min(q0+n, nq), s0: 0, s1: len(segs), state: -1}
								tl.setup(&b, &it)
								tl.probs(&b)
								addMassSlotwise(&b, want[h], tl, q0)
							}
						}
						for h := range want {
							for j := range want[h] {
								if math.Float32bits(m.Out[h][j]) != math.Float32bits(want[h][j]) {
									t.Fatalf("head %d slot %d: addMass %v, slot by slot %v", h, j, m.Out[h][j], want[h][j])
								}
							}
						}
					})
				}
			}
		}
	}
}

// lastQueries is nq random query rows at the fixture's last nq positions.
func lastQueries(rng *rand.Rand, f *fixture, nq int) ([]int32, []float32) {
	qpos := make([]int32, nq)
	for i := range qpos {
		qpos[i] = int32(f.tokens - nq + i)
	}
	q := make([]float32, nq*f.heads*f.G*f.hd)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	return qpos, q
}

// addMassSlotwise is addMass as a loop over slots, each aggregating the
// query heads in order: the reference TestAddMassExact holds it to.
func addMassSlotwise(b *Batch, out []float32, w *tile, q0 int) {
	from := max(b.Mass.From, 0)
	for t := max(0, from-q0); t < w.nq; t++ {
		wt := float32(1)
		if b.Mass.Weights != nil {
			wt = b.Mass.Weights[q0+t-from]
		}
		for pi := w.r0[t]; pi < w.r1[t]; pi++ {
			if w.vis[t*len(w.panels)+pi] == visNone {
				continue
			}
			p := &w.panels[pi]
			c0 := (pi - w.p0) * tensor.AttnLanes
			for j := range p.n {
				var agg float32
				for g := 0; g < b.G; g++ {
					r := t*b.G + g
					if w.l[r] == 0 {
						continue
					}
					pj := w.s[r*w.ld+c0+j]
					if b.Mass.Agg == AggMax {
						agg = max(agg, pj)
					} else {
						agg += pj
					}
				}
				if b.Mass.Agg == AggMean {
					agg /= float32(b.G)
				}
				out[p.k0+j] += wt * agg
			}
		}
	}
}

// TestAttentionMassWeights: per-query weights scale each query's mass
// (PyramidInfer's linspace(1, 1.2) over the recent queries).
func TestAttentionMassWeights(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	f := build(t, rng, 2, 2, 16, 90, 16, codec.F32, codec.F32)
	var qpos []int32
	for p := 70; p < 90; p++ {
		qpos = append(qpos, int32(p))
	}
	for _, agg := range []Agg{AggMean, AggMax, AggSum} {
		for _, from := range []int{0, 12, 19} {
			w := make([]float32, len(qpos)-from)
			for i := range w {
				w[i] = 1 + 0.2*float32(i)/float32(max(1, len(w)-1))
			}
			if from == 12 {
				w[3] = 0 // a zero weight drops a query
			}
			m := &MassRequest{From: from, Agg: agg, Weights: w, Out: [][]float32{make([]float32, 90), make([]float32, 90)}}
			t.Run(fmt.Sprintf("%s_from%d", agg, from), func(t *testing.T) {
				f.check(t, rng, qpos, 0, m, 1e-5)
				f.check(t, rng, qpos[:1], -1, nil, 1e-5)
			})
		}
	}
}

// TestMagnitudes: segments whose slots carry key and value magnitudes
// (MiniCache's merged layers: unit directions times per-layer norms) give
// the naive attention over the restored vectors KMag[i]·k_i and VMag[i]·v_i,
// on every path (two-pass, online, split decode, attention mass), with
// segments with and without magnitudes mixed and for quantized codecs.
func TestMagnitudes(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, c := range []struct{ k, v string }{{"f32", "f32"}, {"q4", "q8"}, {"kivi4", "kivi2"}} {
		kc, err := codec.Parse(c.k, codec.Keys)
		if err != nil {
			t.Fatal(err)
		}
		vc, err := codec.Parse(c.v, codec.Values)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(c.k+"_"+c.v, func(t *testing.T) {
			const tokens = 1500
			f := build(t, rng, 2, 4, 16, tokens, 16, kc, vc)
			segs := make([][]kvcache.Segment, f.heads)
			for h := range segs {
				slot := 0
				for j, s := range f.seq.Segments(0, h) {
					if j%3 != 2 { // every third segment keeps the plain path
						s.KMag, s.VMag = make([]float32, s.N), make([]float32, s.N)
						for i := range s.N {
							s.KMag[i] = float32(0.25 + 2*rng.Float64())
							s.VMag[i] = float32(0.25 + 2*rng.Float64())
							for c := range f.keys[h][slot+i] {
								f.keys[h][slot+i][c] *= float64(s.KMag[i])
								f.vals[h][slot+i][c] *= float64(s.VMag[i])
							}
						}
					}
					segs[h] = append(segs[h], s)
					slot += s.N
				}
			}
			f.segs = func(h int) []kvcache.Segment { return segs[h] }
			last := int32(tokens - 1)
			f.check(t, rng, []int32{last}, -1, nil, 5e-5)
			f.check(t, rng, []int32{last}, 1, nil, 5e-5)
			var qpos []int32
			for p := tokens - 20; p < tokens; p++ {
				qpos = append(qpos, int32(p))
			}
			f.check(t, rng, qpos, 0, nil, 5e-5)
			m := &MassRequest{From: 5, Agg: AggMean, Out: [][]float32{make([]float32, tokens), make([]float32, tokens)}}
			f.check(t, rng, qpos, 0, m, 5e-5)
		})
	}
}

// TestSlidingWindow: with Window set, a query sees only the keys of its
// last Window positions (naive reference restricted to them).
func TestSlidingWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	f := build(t, rng, 2, 2, 16, 200, 16, codec.F32, codec.F32)
	const W = 37
	qpos := []int32{199, 150, 36, 0}
	for _, pos := range [][]int32{qpos[:1], qpos} {
		n := len(pos)
		stride := f.heads * f.G * f.hd
		q := make([]float32, n*stride)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		for _, split := range []int{-1, 1} {
			out := make([]float32, n*stride)
			b := Batch{Heads: f.heads, G: f.G, HeadDim: f.hd, Norm: float32(math.Sqrt(float64(f.hd))), Q: q, Out: out, Pos: pos, Window: W,
				Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }, SplitMin: split, SplitChunk: 50}
			var sc Scratch
			b.Run(&sc)
			for ti, p := range pos {
				for h := 0; h < f.heads; h++ {
					var keys, vals [][]float64
					var kp []int32
					for i, kpos := range f.pos {
						if kpos > p-W {
							keys, vals, kp = append(keys, f.keys[h][i]), append(vals, f.vals[h][i]), append(kp, kpos)
						}
					}
					for j := 0; j < f.G; j++ {
						off := ti*stride + (h*f.G+j)*f.hd
						want, _ := naive(f64(q[off:off+f.hd]), keys, vals, kp, p, math.Sqrt(float64(f.hd)))
						for c := range want {
							if d := math.Abs(want[c] - float64(out[off+c])); d > 1e-5 {
								t.Fatalf("split %d query %d: |Δ| %.3g", split, p, d)
							}
						}
					}
				}
			}
		}
	}
}

// TestPrefillEqualsDecode: a query's output does not depend on the tile it
// is computed in: a causal batch of queries gives, bit for bit, what each
// query gives alone (as decode computes it), for float and quantized
// codecs, block sizes that fill panels and that are gathered into them,
// GQA, a sliding window and magnitudes.
func TestPrefillEqualsDecode(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, c := range []struct {
		kc, vc string
		B, G   int
		hd     int
		window int32
	}{
		{"f32", "f32", 16, 4, 64, 0},
		{"f16", "f16", 16, 2, 48, 0},
		{"bf16", "q8", 64, 1, 32, 0},
		{"q8", "q4", 8, 3, 16, 0},
		{"f32", "f16", 1, 2, 8, 0},
		{"kivi4", "kivi2", 16, 2, 64, 0},
		{"f32", "f32", 16, 4, 64, 29},
		{"f16", "f32", 5, 2, 24, 11},
	} {
		kc, _ := codec.Parse(c.kc, codec.Keys)
		vc, _ := codec.Parse(c.vc, codec.Values)
		t.Run(fmt.Sprintf("%s_%s_B%d_G%d_d%d_w%d", c.kc, c.vc, c.B, c.G, c.hd, c.window), func(t *testing.T) {
			const heads, tokens = 2, 83
			f := build(t, rng, heads, c.G, c.hd, tokens, c.B, kc, vc)
			segs := make([][]kvcache.Segment, heads)
			for h := range segs {
				for j, s := range f.seq.Segments(0, h) {
					if j%4 == 1 {
						s.KMag, s.VMag = make([]float32, s.N), make([]float32, s.N)
						for i := range s.N {
							s.KMag[i], s.VMag[i] = float32(0.5+rng.Float64()), float32(0.5+rng.Float64())
						}
					}
					segs[h] = append(segs[h], s)
				}
			}
			stride := heads * c.G * c.hd
			var pos []int32
			for p := 40; p < tokens; p++ {
				pos = append(pos, int32(p))
			}
			q := make([]float32, len(pos)*stride)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			run := func(q []float32, pos []int32) []float32 {
				out := make([]float32, len(q))
				b := Batch{Heads: heads, G: c.G, HeadDim: c.hd, Norm: float32(math.Sqrt(float64(c.hd))), Q: q, Out: out, Pos: pos,
					Window: c.window, Segs: func(h int) []kvcache.Segment { return segs[h] }, SplitMin: -1}
				var sc Scratch
				b.Run(&sc)
				return out
			}
			all := run(q, pos)
			for i, p := range pos {
				one := run(q[i*stride:(i+1)*stride], []int32{p})
				for k, v := range one {
					if w := all[i*stride+k]; math.Float32bits(v) != math.Float32bits(w) {
						t.Fatalf("query %d value %d: alone %g, in the batch %g", p, k, v, w)
					}
				}
			}
		})
	}
}

// TestKernelLevelsAgree: every tensor kernel set (the plain Go twins, AVX2,
// AVX-512, those this CPU and build have) gives the same bits, on the exact,
// online and split paths and for the attention mass.
func TestKernelLevelsAgree(t *testing.T) {
	defer tensor.SetKernels("auto")
	rng := rand.New(rand.NewPCG(15, 16))
	f16, _ := codec.Parse("f16", codec.Keys)
	q8, _ := codec.Parse("q8", codec.Values)
	for _, c := range []struct {
		kc, vc codec.Codec
		B      int
	}{{codec.F32, codec.F32, 16}, {codec.F32Keys, codec.F32, 24}, {f16, q8, 8}, {codec.BF16, codec.F16, 64}, {codec.F16, codec.BF16, 16}, {codec.F16Keys, codec.F32, 32}, {codec.BF16Keys, codec.F16, 16}, {codec.Q8Keys, codec.F32, 16}, {codec.Q4Keys, codec.Q8, 32}} {
		const heads, G, hd, tokens = 2, 3, 80, 300
		f := build(t, rng, heads, G, hd, tokens, c.B, c.kc, c.vc)
		stride := heads * G * hd
		var pos []int32
		for p := tokens - 37; p < tokens; p++ {
			pos = append(pos, int32(p))
		}
		q := make([]float32, len(pos)*stride)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		var ref [][]float32
		for _, level := range []string{"go", "avx2", "avx512"} {
			if tensor.SetKernels(level) != nil {
				continue
			}
			var got [][]float32
			for _, mode := range []struct {
				n        int
				online   bool
				splitMin int
				lc       bool // Strict and Dummy (Layer-Condensed KV)
			}{{len(pos), false, 0, false}, {len(pos), true, 0, false}, {1, false, 1, false},
				{len(pos), false, 0, true}, {len(pos), true, 0, true}, {1, false, 1, true}} {
				out := make([]float32, mode.n*stride)
				mass := &MassRequest{From: mode.n / 2, Agg: AggMean, Out: [][]float32{make([]float32, tokens), make([]float32, tokens)}}
				b := Batch{Heads: heads, G: G, HeadDim: hd, Norm: float32(math.Sqrt(hd)), Q: q[:mode.n*stride], Out: out, Pos: pos[len(pos)-mode.n:],
					Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }, Online: mode.online, SplitMin: mode.splitMin, SplitChunk: 100, Mass: mass, Strict: mode.lc, Dummy: mode.lc}
				var sc Scratch
				b.Run(&sc)
				got = append(got, out, mass.Out[0], mass.Out[1])
			}
			if ref == nil {
				ref = got
				continue
			}
			for i := range got {
				for k := range got[i] {
					if math.Float32bits(got[i][k]) != math.Float32bits(ref[i][k]) {
						t.Fatalf("%s/%s B=%d, kernels %s: result %d value %d = %g, plain Go %g", c.kc.Name(), c.vc.Name(), c.B, level, i, k, got[i][k], ref[i][k])
					}
				}
			}
		}
		f.seq.Free()
	}
}

// TestDefaultSplit: by default a long single query is split only when its
// KV heads do not share out evenly among the workers; an explicit SplitMin
// splits regardless.
func TestDefaultSplit(t *testing.T) {
	if tensor.Threads < 2 {
		t.Skip("one worker: nothing is ever split")
	}
	rng := rand.New(rand.NewPCG(21, 22))
	const G, hd, tokens = 2, 16, DefaultSplitMin + 100
	for _, c := range []struct {
		heads, splitMin int
		split           bool
	}{
		{tensor.Threads, 0, false},
		{2 * tensor.Threads, 0, false},
		{tensor.Threads + 1, 0, true},
		{1, 0, true},
		{tensor.Threads, DefaultSplitMin, true},
		{1, -1, false},
	} {
		f := build(t, rng, c.heads, G, hd, tokens, 16, codec.F32Keys, codec.F32)
		q := make([]float32, c.heads*G*hd)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		b := Batch{Heads: c.heads, G: G, HeadDim: hd, Norm: 4, Q: q, Out: make([]float32, len(q)), Pos: []int32{tokens - 1},
			Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }, SplitMin: c.splitMin}
		var sc Scratch
		b.Run(&sc)
		if got := len(sc.states) > 0; got != c.split {
			t.Errorf("%d heads on %d threads, SplitMin %d: split %v, want %v", c.heads, tensor.Threads, c.splitMin, got, c.split)
		}
		f.check(t, rng, []int32{tokens - 1}, c.splitMin, nil, 1e-5)
	}
}

// naiveLC is naive attention with Layer-Condensed KV's options written out:
// a query at qpos sees the keys at positions ≤ qpos (< qpos when strict)
// and, with window > 0, > qpos − window; with dummy, one more key and value
// of zeros joins the softmax. It returns the output and each key's
// probability.
func naiveLC(q []float64, keys, vals [][]float64, pos []int32, qpos, window int32, strict, dummy bool, norm float64) (out, prob []float64) {
	prob = make([]float64, len(keys))
	out = make([]float64, len(q))
	var logits []float64 // the visible keys', then the dummy's
	var idx []int
	for i, k := range keys {
		if pos[i] > qpos || (strict && pos[i] == qpos) || (window > 0 && pos[i] <= qpos-window) {
			continue
		}
		d := 0.0
		for j := range q {
			d += q[j] * k[j]
		}
		logits, idx = append(logits, d/norm), append(idx, i)
	}
	if dummy {
		logits = append(logits, 0)
	}
	if len(logits) == 0 {
		return out, prob
	}
	mx := math.Inf(-1)
	for _, l := range logits {
		mx = math.Max(mx, l)
	}
	sum := 0.0
	for _, l := range logits {
		sum += math.Exp(l - mx)
	}
	for j, i := range idx {
		prob[i] = math.Exp(logits[j]-mx) / sum
		for c := range out {
			out[c] += prob[i] * vals[i][c]
		}
	}
	return out, prob
}

// TestStrictDummy: the strict-causal mask and the dummy zero key/value
// (Layer-Condensed KV), alone and together, with and without a sliding
// window, match naiveLC on every path: the exact two-pass batch, the online
// batch, a decode query unsplit and split (FlashDecoding), and the
// attention mass; including queries that see no slot at all (position 0
// strict: only the dummy, output zeros).
func TestStrictDummy(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for _, c := range []struct {
		heads, G, hd, tokens, B int
		kc                      codec.Codec
	}{{2, 2, 16, 200, 16, codec.F32}, {1, 4, 32, 700, 24, codec.F32Keys}, {2, 1, 8, 40, 1, codec.Q8Keys}} {
		f := build(t, rng, c.heads, c.G, c.hd, c.tokens, c.B, c.kc, codec.F32)
		for _, o := range []struct {
			strict, dummy bool
			window        int32
		}{{true, false, 0}, {false, true, 0}, {true, true, 0}, {true, true, 23}, {false, true, 23}} {
			last := int32(c.tokens - 1)
			batches := [][]int32{{last}, {0}, {int32(c.tokens / 2)}}
			var prefill []int32
			for p := max(0, c.tokens-40); p < c.tokens; p++ {
				prefill = append(prefill, int32(p))
			}
			batches = append(batches, prefill, []int32{0, 1, 2, 3})
			for _, pos := range batches {
				for _, mode := range []struct {
					online   bool
					splitMin int
				}{{false, -1}, {true, -1}, {false, 1}} {
					if mode.splitMin > 0 && len(pos) > 1 {
						continue
					}
					name := fmt.Sprintf("%s_b%d_strict%v_dummy%v_w%d_n%d_online%v_split%d", c.kc.Name(), c.B, o.strict, o.dummy, o.window, len(pos), mode.online, mode.splitMin)
					t.Run(name, func(t *testing.T) {
						n := len(pos)
						stride := f.heads * f.G * f.hd
						q := make([]float32, n*stride)
						for i := range q {
							q[i] = float32(rng.NormFloat64())
						}
						out := make([]float32, n*stride)
						var mass *MassRequest
						if !mode.online {
							mass = &MassRequest{Agg: AggSum, Out: make([][]float32, f.heads)}
							for h := range mass.Out {
								mass.Out[h] = make([]float32, len(f.pos))
							}
						}
						b := Batch{Heads: f.heads, G: f.G, HeadDim: f.hd, Norm: float32(math.Sqrt(float64(f.hd))), Q: q, Out: out, Pos: pos,
							Window: o.window, Strict: o.strict, Dummy: o.dummy, Online: mode.online, SplitMin: mode.splitMin, SplitChunk: 50,
							Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }, Mass: mass}
						var sc Scratch
						b.Run(&sc)
						if mode.splitMin > 0 && c.tokens > 50 && len(sc.states) == 0 {
							t.Fatal("the decode query was not split")
						}
						worst, mworst := 0.0, 0.0
						for h := 0; h < f.heads; h++ {
							want := make([]float64, len(f.pos))
							for ti, p := range pos {
								for j := 0; j < f.G; j++ {
									off := ti*stride + (h*f.G+j)*f.hd
									o2, prob := naiveLC(f64(q[off:off+f.hd]), f.keys[h], f.vals[h], f.pos, p, o.window, o.strict, o.dummy, math.Sqrt(float64(f.hd)))
									for k := range o2 {
										worst = math.Max(worst, math.Abs(o2[k]-float64(out[off+k])))
									}
									for i, pr := range prob {
										want[i] += pr
									}
								}
							}
							if mass != nil {
								for i, w := range want {
									mworst = math.Max(mworst, math.Abs(w-float64(mass.Out[h][i])))
								}
							}
						}
						if worst > 1e-5 || mworst > 1e-5 {
							t.Errorf("max |Δ| output %.3g, mass %.3g", worst, mworst)
						}
					})
				}
			}
		}
		f.seq.Free()
	}
}
