package policy

import (
	"math"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/model"
)

// TestExpectedMatchesBruteForce compares Expected Attention's kept tokens
// of every (layer, KV head) on stories260K with a float64 reference: the
// recorded (rotated) queries of the prompt unrotated at their positions,
// the first sinks excluded; their mean and covariance per query head; the
// d×d RoPE matrix averaged over the next n-future positions applied as
// R̄μ and R̄ΣR̄ᵀ; softmax over the non-sink keys of k·μ/√d + kᵀΣk/(2d),
// averaged over the group, times ‖v‖.
func TestExpectedMatchesBruteForce(t *testing.T) {
	st := loadStories(t)
	m := st.m
	const T = 200
	d, G := m.HeadDim, m.GroupSize()
	for _, cfg := range []Config{
		{Method: "expected", Budget: 64},
		{Method: "expected", Ratio: 0.3, Sinks: 2, Window: 8, Opts: optsOf("n-future", 64)},
		{Method: "expected", Budget: 90, Sinks: 1, Opts: optsOf("n-future", 1)},
	} {
		t.Run(cfg.String(), func(t *testing.T) {
			seqn, err := m.NewStandaloneSequence(model.KVOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer seqn.Close()
			ps, err := New(cfg, seqn)
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{inner: ps, q: make([][][]float32, m.Config.Layers), pos: make([][]int32, m.Config.Layers)}
			seqn.Mass = rec
			ps.BeginPrefill(T)
			seqn.Chunk = 64 // statistics over several steps
			if _, err := seqn.Forward(st.ids[:T], false); err != nil {
				t.Fatal(err)
			}
			keys, vals := snapshotKeys(seqn), snapshotValues(seqn)
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
			c, b, got := ps.Config(), ps.budget(T), ps.Kept()
			nf := int(c.Opts.Get("n-future"))
			// The averaged RoPE matrix of positions T..T+nf−1.
			R := make([][]float64, d)
			for i := range R {
				R[i] = make([]float64, d)
			}
			freq := m.RopeFreqs()
			for j, f := range freq {
				x0, x1 := 2*j, 2*j+1
				if m.Rope == model.RopeNeoX {
					x0, x1 = j, j+len(freq)
				}
				for p := T; p < T+nf; p++ {
					a := float64(p) * float64(f)
					R[x0][x0] += math.Cos(a) / float64(nf)
					R[x0][x1] -= math.Sin(a) / float64(nf)
					R[x1][x0] += math.Sin(a) / float64(nf)
					R[x1][x1] += math.Cos(a) / float64(nf)
				}
			}
			for l := 0; l < m.Config.Layers; l++ {
				for h := 0; h < m.KVHeads; h++ {
					ks, vs := keys[l*m.KVHeads+h], vals[l*m.KVHeads+h]
					avg := make([]float64, T)
					for g := h * G; g < (h+1)*G; g++ {
						// Pre-RoPE queries of the prompt, sinks excluded.
						var qs [][]float64
						for i, q := range rec.q[l] {
							p := rec.pos[l][i]
							if int(p) < c.Sinks {
								continue
							}
							x := make([]float64, d)
							for j := range x {
								x[j] = float64(q[g*d+j])
							}
							for j, f := range freq { // rotate by −p
								x0, x1 := 2*j, 2*j+1
								if m.Rope == model.RopeNeoX {
									x0, x1 = j, j+len(freq)
								}
								a := -float64(p) * float64(f)
								v0, v1 := x[x0], x[x1]
								x[x0], x[x1] = v0*math.Cos(a)-v1*math.Sin(a), v0*math.Sin(a)+v1*math.Cos(a)
							}
							qs = append(qs, x)
						}
						mu := make([]float64, d)
						for _, x := range qs {
							for j := range mu {
								mu[j] += x[j] / float64(len(qs))
							}
						}
						cov := make([][]float64, d)
						for i := range cov {
							cov[i] = make([]float64, d)
							for j := range cov[i] {
								for _, x := range qs {
									cov[i][j] += (x[i] - mu[i]) * (x[j] - mu[j]) / float64(len(qs))
								}
							}
						}
						// μ' = Rμ, Σ' = RΣRᵀ.
						mu2 := make([]float64, d)
						cov2 := make([][]float64, d)
						for i := range cov2 {
							cov2[i] = make([]float64, d)
							for a := 0; a < d; a++ {
								mu2[i] += R[i][a] * mu[a]
							}
							for j := 0; j < d; j++ {
								for a := 0; a < d; a++ {
									for bb := 0; bb < d; bb++ {
										cov2[i][j] += R[i][a] * cov[a][bb] * R[j][bb]
									}
								}
							}
						}
						z := make([]float64, T)
						var sum float64
						for i := c.Sinks; i < T; i++ {
							k := ks[i]
							z[i] = dot64(k, mu2) / math.Sqrt(float64(d))
							for a := 0; a < d; a++ {
								for bb := 0; bb < d; bb++ {
									z[i] += k[a] * cov2[a][bb] * k[bb] / (2 * float64(d))
								}
							}
						}
						for i := c.Sinks; i < T; i++ {
							sum += math.Exp(z[i])
						}
						for i := c.Sinks; i < T; i++ {
							avg[i] += math.Exp(z[i]) / sum / float64(G)
						}
					}
					score := make([]float64, T)
					for i := c.Sinks; i < T; i++ {
						score[i] = avg[i] * math.Sqrt(dot64(vs[i], vs[i]))
					}
					checkKept(t, l, h, got, refKeep(T, b, c.Sinks, c.Window, score), score, c.Sinks, c.Window)
				}
			}
		})
	}
}

func optsOf(name string, v float64) Opts {
	var o Opts
	o.Set(name, v)
	return o
}

// snapshotValues decodes every stored value of every table.
func snapshotValues(seq *model.Sequence) [][][]float64 {
	c := seq.Cache()
	l := c.Layout()
	out := make([][][]float64, l.Layers*l.KVHeads)
	row := make([]float32, l.HeadDim)
	for t := range out {
		for _, s := range c.Segments(t/l.KVHeads, t%l.KVHeads) {
			for i := 0; i < s.N; i++ {
				s.VC.Get(s.V, s.Cap, l.HeadDim, i, row)
				v := make([]float64, l.HeadDim)
				for j, x := range row {
					v[j] = float64(x)
				}
				out[t] = append(out[t], v)
			}
		}
	}
	return out
}

// TestExpectedParams: n-future is a parameter like the others: its
// default, its bounds, its place in String, refused where unused.
func TestExpectedParams(t *testing.T) {
	n, err := Config{Method: "expected", Budget: 32}.Normalize()
	if err != nil || n.Opts.Get("n-future") != 512 || n.Sinks != 4 || n.String() != "expected budget=32 sinks=4 n-future=512" {
		t.Fatalf("defaults %+v %q: %v", n, n.String(), err)
	}
	if again, err := n.Normalize(); err != nil || again != n {
		t.Fatalf("normalized %+v normalizes to %+v, %v", n, again, err)
	}
	for _, c := range []struct {
		cfg   Config
		given []string
		want  string
	}{
		{Config{Method: "expected", Budget: 32, Opts: optsOf("n-future", -1)}, nil, "--kv-n-future must be positive"},
		{Config{Method: "expected", Budget: 32}, []string{"budget", "n-future"}, "--kv-n-future 0 is not a expected setting"},
		{Config{Method: "snapkv", Budget: 32, Opts: optsOf("n-future", 8)}, nil, "snapkv takes no --kv-n-future"},
		{Config{Method: "expected", Budget: 32, Pool: "max"}, nil, "expected takes no --kv-pool"},
	} {
		_, err := c.cfg.NormalizeGiven(c.given...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v %v: %v, want %q", c.cfg, c.given, err, c.want)
		}
	}
}

// TestExpectedInvariants runs expected through TestInvariants' checks
// (budget, sinks, window, order, blocks freed, no leak) with each codec.
func TestExpectedInvariants(t *testing.T) {
	st := loadStories(t)
	for _, cfg := range []Config{
		{Method: "expected", Budget: 50, Window: 8, Every: 4},
		{Method: "expected", Ratio: 0.4, Opts: optsOf("n-future", 32)},
	} {
		for _, cn := range [][2]string{{"f32", "f32"}, {"q8", "q4"}, {"kivi4", "kivi2"}} {
			t.Run(cfg.String()+"/"+cn[0]+"-"+cn[1], func(t *testing.T) { runInvariants(t, st, cfg, cn) })
		}
	}
}
