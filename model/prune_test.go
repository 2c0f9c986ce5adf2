package model

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/tensor"
)

// rulePruner keeps, after each layer, the rows whose position passes keep,
// and the step's last row.
type rulePruner struct {
	keep  func(layer int, pos int32) bool
	calls []int // layers it was called after
}

func (r *rulePruner) AfterLayer(layer int, pos []int32) []int {
	r.calls = append(r.calls, layer)
	var out []int
	for i, p := range pos {
		if r.keep(layer, p) || i == len(pos)-1 {
			out = append(out, i)
		}
	}
	return out
}

// matrixRows reads a weight matrix as float64 rows.
func matrixRows(m *tensor.Matrix) [][]float64 {
	out := make([][]float64, m.Rows)
	row := make([]float32, m.Cols)
	for i := range out {
		m.Row(i, row)
		out[i] = make([]float64, m.Cols)
		for j, v := range row {
			out[i][j] = float64(v)
		}
	}
	return out
}

func matVec(w [][]float64, x []float64) []float64 {
	y := make([]float64, len(w))
	for i, r := range w {
		for j, v := range r {
			y[i] += v * x[j]
		}
	}
	return y
}

func rmsNorm(x []float64, w []float32, eps float32) []float64 {
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+float64(eps))
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(w[i]) * v * inv
	}
	return y
}

// refPrunedForward is a plain float64 forward pass of a llama2.c model
// (interleaved RoPE, no biases) in which alive[l] are the tokens layer l
// computes: a token missing from alive[l] has no key, value, attention or
// FFN from layer l on. It returns the last token's logits.
func refPrunedForward(m *Model, tokens []int, alive [][]int) []float64 {
	c := m.Config
	hd, G := c.HeadDim, c.GroupSize()
	x := make([][]float64, len(tokens))
	emb := make([]float32, c.Dim)
	for t, id := range tokens {
		m.TokEmb.Row(id, emb)
		x[t] = make([]float64, c.Dim)
		for j, v := range emb {
			x[t][j] = float64(v)
		}
	}
	rope := func(v []float64, pos int) {
		for h := 0; h < len(v)/hd; h++ {
			for j := 0; j < hd/2; j++ {
				f := 1 / math.Pow(float64(m.RopeTheta), float64(2*j)/float64(hd))
				cs, sn := math.Cos(float64(pos)*f), math.Sin(float64(pos)*f)
				a, b := v[h*hd+2*j], v[h*hd+2*j+1]
				v[h*hd+2*j], v[h*hd+2*j+1] = a*cs-b*sn, a*sn+b*cs
			}
		}
	}
	for li := range m.Layers {
		L := &m.Layers[li]
		wq, wk, wv, wo := matrixRows(L.Wq), matrixRows(L.Wk), matrixRows(L.Wv), matrixRows(L.Wo)
		wg, wu, wd := matrixRows(L.WGate), matrixRows(L.WUp), matrixRows(L.WDown)
		q, k, v := map[int][]float64{}, map[int][]float64{}, map[int][]float64{}
		for _, t := range alive[li] {
			xb := rmsNorm(x[t], L.AttnNorm, c.NormEps)
			q[t], k[t], v[t] = matVec(wq, xb), matVec(wk, xb), matVec(wv, xb)
			rope(q[t], t)
			rope(k[t], t)
		}
		for _, t := range alive[li] {
			att := make([]float64, c.QDim())
			for h := 0; h < c.Heads; h++ {
				kv := h / G
				var ps []float64
				var ss []int
				mx := math.Inf(-1)
				for _, s := range alive[li] {
					if s > t {
						continue
					}
					d := 0.0
					for j := 0; j < hd; j++ {
						d += q[t][h*hd+j] * k[s][kv*hd+j]
					}
					d /= math.Sqrt(float64(hd))
					ps, ss = append(ps, d), append(ss, s)
					mx = math.Max(mx, d)
				}
				sum := 0.0
				for i := range ps {
					ps[i] = math.Exp(ps[i] - mx)
					sum += ps[i]
				}
				for i, s := range ss {
					for j := 0; j < hd; j++ {
						att[h*hd+j] += ps[i] / sum * v[s][kv*hd+j]
					}
				}
			}
			for i, o := range matVec(wo, att) {
				x[t][i] += o
			}
			xb := rmsNorm(x[t], L.FFNNorm, c.NormEps)
			g, u := matVec(wg, xb), matVec(wu, xb)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			for i, o := range matVec(wd, g) {
				x[t][i] += o
			}
		}
	}
	last := rmsNorm(x[len(tokens)-1], m.OutNorm, c.NormEps)
	return matVec(matrixRows(m.Output), last)
}

// TestRowPruner: a pruner that drops tokens between layers makes later
// layers compute and store only the survivors, at their original
// positions, and the last token's logits equal a plain float64 forward pass
// over the same ragged token sets, whether the prompt runs as one step or
// in chunks.
func TestRowPruner(t *testing.T) {
	m := loadStories(t)
	const T = 100
	tokens := make([]int, T)
	for i := range tokens {
		tokens[i] = (i*37 + 11) % m.Vocab
	}
	tokens[0] = 1
	rule := func(layer int, pos int32) bool { return pos%int32(layer+3) != 1 }
	for _, chunk := range []int{128, 32} {
		seq, err := m.NewStandaloneSequence(KVOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pr := &rulePruner{keep: rule}
		seq.Prune, seq.Chunk = pr, chunk
		logits, err := seq.Forward(tokens, false)
		if err != nil {
			t.Fatal(err)
		}
		// The same token sets, written out: a chunk's last token is kept.
		alive := make([][]int, m.Config.Layers)
		alive[0] = seqInts(0, T)
		rows := 0
		for l := range alive {
			if l > 0 {
				for _, p := range alive[l-1] {
					if rule(l-1, int32(p)) || (p+1)%chunk == 0 || p == T-1 {
						alive[l] = append(alive[l], p)
					}
				}
			}
			rows += len(alive[l])
			cache := seq.Cache().(*kvcache.Paged)
			for h := 0; h < m.KVHeads; h++ {
				got := cache.Positions(l, h)
				want := make([]int32, len(alive[l]))
				for i, p := range alive[l] {
					want[i] = int32(p)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("chunk %d layer %d head %d: positions %v, want %v", chunk, l, h, got, want)
				}
			}
		}
		if seq.RowLayers != rows || seq.Computed != T || seq.Pos() != T {
			t.Fatalf("chunk %d: RowLayers %d Computed %d Pos %d, want %d, %d, %d", chunk, seq.RowLayers, seq.Computed, seq.Pos(), rows, T, T)
		}
		want := refPrunedForward(m, tokens, alive)
		worst := 0.0
		for i, w := range want {
			worst = math.Max(worst, math.Abs(w-float64(logits[i])))
		}
		if worst > 1e-3 {
			t.Fatalf("chunk %d: logits differ from the reference by %.3g", chunk, worst)
		}
		t.Logf("chunk %d: %d of %d row-layers computed, logits within %.2g of float64", chunk, rows, T*m.Config.Layers, worst)
		// Decode after a pruned prompt: the new token attends to the survivors.
		if _, err := seq.Forward([]int{5}, false); err != nil {
			t.Fatal(err)
		}
		if seq.RowLayers != rows+m.Config.Layers {
			t.Fatalf("decode computed %d row-layers, want %d", seq.RowLayers-rows, m.Config.Layers)
		}
		seq.Close()
		if u := seq.Cache().(*kvcache.Paged).Pool().Usage(); u.Used != 0 {
			t.Fatalf("%d blocks still used after Close", u.Used)
		}
	}
}

// TestRowPrunerKeepAll: a pruner that keeps every row changes nothing, bit
// for bit; a pruner is not asked when every row's logits are wanted, nor
// after the last layer; dropping the last row is an error.
func TestRowPrunerKeepAll(t *testing.T) {
	m := loadStories(t)
	tokens := []int{1, 403, 407, 261, 378, 432, 383, 286, 261, 376}
	run := func(p RowPruner, all bool) ([]float32, *Sequence) {
		seq, err := m.NewStandaloneSequence(KVOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(seq.Close)
		seq.Prune = p
		out, err := seq.Forward(tokens, all)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), out...), seq
	}
	dense, ds := run(nil, false)
	if ds.RowLayers != len(tokens)*m.Config.Layers {
		t.Fatalf("RowLayers %d, want %d", ds.RowLayers, len(tokens)*m.Config.Layers)
	}
	all := &rulePruner{keep: func(int, int32) bool { return true }}
	same, _ := run(all, false)
	if !slices.Equal(dense, same) {
		t.Fatal("a keep-all pruner changed the logits")
	}
	if want := []int{0, 1, 2, 3}; !slices.Equal(all.calls, want) {
		t.Fatalf("pruner called after layers %v, want %v", all.calls, want)
	}
	none := &rulePruner{keep: func(int, int32) bool { return false }}
	denseAll, _ := run(nil, true)
	gotAll, _ := run(none, true)
	if !slices.Equal(denseAll, gotAll) || len(none.calls) != 0 {
		t.Fatal("the pruner was consulted although every row's logits were wanted")
	}
	seq, err := m.NewStandaloneSequence(KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	seq.Prune = dropLast{}
	if _, err := seq.Forward(tokens, false); err == nil || !strings.Contains(err.Error(), "last row") {
		t.Fatalf("dropping the last row: error %v", err)
	}
}

type dropLast struct{}

func (dropLast) AfterLayer(_ int, pos []int32) []int { return []int{0} }

func seqInts(a, b int) []int {
	out := make([]int, 0, b-a)
	for i := a; i < b; i++ {
		out = append(out, i)
	}
	return out
}
