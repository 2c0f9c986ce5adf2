package policy

import (
	"math"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/model"
)

// expected is Expected Attention (as NVIDIA kvpress's
// ExpectedAttentionPress): the attention that future queries are expected
// to give each key. From the prompt's queries before RoPE (its first
// Sinks tokens excluded), their mean μ and covariance Σ per query head;
// the RoPE rotation averaged over the next NFuture positions, R̄, applied
// to both (R̄μ, R̄ΣR̄ᵀ); the expected score of a key k of a KV head is
// softmax over its keys (sinks excluded) of k·μ/√d + kᵀΣk/(2d), averaged
// over the head's query heads, times the norm of its value.
//
// The queries reach it through the mass hook's Done, rotated; it undoes
// the rotation at each query's position. It asks for no attention mass
// (From past the step's queries).
//
// On a layer that several model layers read (CLA, YOCO), the query heads of
// all its readers are the group: each reader's queries have their own mean
// and covariance, and a key's expected score is averaged over the G query
// heads of each of the R readers.
type expected struct {
	scorerBase
	sum   [][][]float64 // [layer][reader][query head·d] Σ q
	outer [][][]float64 // [layer][reader][query head·d·d] Σ q qᵀ
	count [][]int       // [layer][reader] queries summed
	start []int         // [layer] history index of the current call's first query
	cur   []int         // [layer] the current call's reader
}

var pNFuture = &Param{Name: "n-future", Kind: IntParam, Doc: "future positions the RoPE rotation of the queries is averaged over", Default: "512",
	Lo: 1, Fill: 512}

func init() {
	Register(Method{Name: "expected", Order: 13, Doc: "Expected Attention: the attention future queries are expected to give, times ‖v‖",
		Params: []string{"budget", "ratio", "window", "sinks", "every", "positions", "n-future"}, Own: []*Param{pNFuture},
		Normalize: func(c Config) (Config, error) {
			if c.Sinks == 0 {
				c.Sinks = 4
			}
			return c, nil
		},
		NewScorer: func(st *State) Scorer {
			e := &expected{sum: make([][][]float64, st.L), outer: make([][][]float64, st.L), count: make([][]int, st.L),
				start: make([]int, st.L), cur: make([]int, st.L)}
			for l, r := range st.readers {
				e.sum[l], e.outer[l], e.count[l] = make([][]float64, r), make([][]float64, r), make([]int, r)
			}
			return e
		}})
}

// Mass asks for the queries of the prefill's steps only.
func (e *expected) Mass(st *State, layer, start, n int) *attention.MassRequest {
	if st.prefT == 0 {
		return nil
	}
	e.start[layer] = start
	e.cur[layer] = min(st.reader(layer), len(e.count[layer])-1)
	return &attention.MassRequest{From: n}
}

// Rows: the prompt's queries (their mean and covariance).
func (e *expected) Rows(st *State, _, n int) int {
	if st.prefT == 0 {
		return 0
	}
	return n
}

// Done adds the step's prompt queries, past the sinks, unrotated.
func (e *expected) Done(st *State, layer int, _ *attention.MassRequest, q []float32, pos []int32) {
	m := st.seq.Model()
	d := m.HeadDim
	qd := len(q) / len(pos)
	heads := qd / d
	r := e.cur[layer]
	if e.sum[layer][r] == nil {
		e.sum[layer][r] = make([]float64, qd)
		e.outer[layer][r] = make([]float64, qd*d)
	}
	rot := st.rotator()
	row := make([]float32, d)
	x := make([]float64, d)
	for t := range pos {
		idx := e.start[layer] + t
		if idx < st.prefAt+st.cfg.Sinks || idx >= st.prefAt+st.prefT {
			continue
		}
		for g := 0; g < heads; g++ {
			copy(row, q[t*qd+g*d:t*qd+(g+1)*d])
			rot.Rotate(row, layer, -int(pos[t]))
			for i, v := range row {
				x[i] = float64(v)
			}
			s := e.sum[layer][r][g*d : (g+1)*d]
			o := e.outer[layer][r][g*d*d : (g+1)*d*d]
			for i, xi := range x {
				s[i] += xi
				for j, xj := range x {
					o[i*d+j] += xi * xj
				}
			}
		}
		e.count[layer][r]++
	}
}

// avgRotation is the RoPE rotation averaged over positions [from,
// from+n): for each rotated pair (x0, x1), the mean cosine and sine.
func avgRotation(m *model.Model, from, n int) (pairs [][2]int, cs, sn []float64) {
	freq := m.RopeFreqs()
	half := len(freq)
	for j, f := range freq {
		x0, x1 := 2*j, 2*j+1
		if m.Rope == model.RopeNeoX {
			x0, x1 = j, j+half
		}
		var c, s float64
		for p := from; p < from+n; p++ {
			a := float64(p) * float64(f)
			c += math.Cos(a)
			s += math.Sin(a)
		}
		pairs = append(pairs, [2]int{x0, x1})
		cs = append(cs, c/float64(n))
		sn = append(sn, s/float64(n))
	}
	return pairs, cs, sn
}

// rotate applies the averaged rotation to x (stride apart) in place.
func rotate(x []float64, stride int, pairs [][2]int, cs, sn []float64) {
	for j, p := range pairs {
		a, b := x[p[0]*stride], x[p[1]*stride]
		x[p[0]*stride] = a*cs[j] - b*sn[j]
		x[p[1]*stride] = a*sn[j] + b*cs[j]
	}
}

func (e *expected) Scores(st *State, l, _ int) [][]float32 {
	m := st.seq.Model()
	d := m.HeadDim
	G := m.Heads / m.KVHeads
	R := len(e.count[l])
	pairs, cs, sn := avgRotation(m, st.seq.Pos(), int(st.cfg.Opts.Get("n-future")))
	// μ' = R̄μ and Σ' = R̄ΣR̄ᵀ of each query head of each reader.
	heads := G * st.H
	mu := make([][]float64, R)
	cov := make([][]float64, R)
	for r := range mu {
		mu[r], cov[r] = e.moments(l, r, heads, d, pairs, cs, sn)
	}
	scores := make([][]float32, st.H)
	for h := range scores {
		var keys [][]float64
		st.keyRows(l, h, func(_ int, row []float32) {
			k := make([]float64, d)
			for j, v := range row {
				k[j] = float64(v)
			}
			keys = append(keys, k)
		})
		n := len(keys)
		sinks := min(st.cfg.Sinks, n)
		avg := make([]float64, n)
		z := make([]float64, n)
		for rd := range mu {
			for g := h * G; g < (h+1)*G; g++ {
				mg, cg := mu[rd][g*d:(g+1)*d], cov[rd][g*d*d:(g+1)*d*d]
				mx := math.Inf(-1)
				for i := sinks; i < n; i++ {
					k := keys[i]
					var a, b float64
					for r := 0; r < d; r++ {
						a += k[r] * mg[r]
						var row float64
						for c := 0; c < d; c++ {
							row += cg[r*d+c] * k[c]
						}
						b += k[r] * row
					}
					z[i] = a/math.Sqrt(float64(d)) + b/(2*float64(d))
					mx = math.Max(mx, z[i])
				}
				var sum float64
				for i := sinks; i < n; i++ {
					z[i] = math.Exp(z[i] - mx)
					sum += z[i]
				}
				for i := sinks; i < n; i++ {
					avg[i] += z[i] / sum / float64(G*R)
				}
			}
		}
		out := make([]float32, n)
		st.rows(l, h, false, func(i int, v []float32) {
			if i < sinks {
				out[i] = float32(math.Inf(1)) // kept anyway
				return
			}
			var vn float64
			for _, x := range v {
				vn += float64(x) * float64(x)
			}
			out[i] = float32(avg[i] * math.Sqrt(vn))
		})
		scores[h] = out
	}
	return scores
}

// moments is R̄μ and R̄ΣR̄ᵀ of each of the heads query heads of reader r
// of layer l ([heads·d], [heads·d·d]; zero when it summed no query).
func (e *expected) moments(l, r, heads, d int, pairs [][2]int, cs, sn []float64) (mu, cov []float64) {
	mu = make([]float64, heads*d)
	cov = make([]float64, heads*d*d)
	n := float64(e.count[l][r])
	if n == 0 {
		return mu, cov
	}
	sum, outer := e.sum[l][r], e.outer[l][r]
	for g := 0; g < heads; g++ {
		mg, cg := mu[g*d:(g+1)*d], cov[g*d*d:(g+1)*d*d]
		for i := range mg {
			mg[i] = sum[g*d+i] / n
		}
		for i := 0; i < d; i++ {
			for j := 0; j < d; j++ {
				cg[i*d+j] = outer[g*d*d+i*d+j]/n - mg[i]*mg[j]
			}
		}
		rotate(mg, 1, pairs, cs, sn)
		for j := 0; j < d; j++ { // R̄Σ: each column
			rotate(cg[j:], d, pairs, cs, sn)
		}
		for i := 0; i < d; i++ { // (R̄Σ)R̄ᵀ: each row
			rotate(cg[i*d:], 1, pairs, cs, sn)
		}
	}
	return mu, cov
}
