package attention

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// TestIntDotCodecs: attention over q8dot and q4dot keys (Codec.IntDot)
// equals the naive attention whose scores are those of each query rounded
// to int8 (one scale a row, as tensor.PackQueriesDot rounds it) against
// the decoded keys, plus the exact query's product with the key shift;
// for head sizes not a multiple of 4 the exact query's. Every panel is
// one full group (blocks of 16), so every score goes the integer way; and
// the outputs are seen to differ from the exact query's attention, so the
// test cannot pass by scoring the keys the float way. With a soft cap
// (not invariant to a score's constant part) the shift's part counts.
// q8dot and q4dot values are summed with weights rounded to int8 per
// panel: there
// the outputs must stay within that rounding's bound (a/2 per level, a =
// the panel's largest weight × value scale / 127) and differ from the
// exact sum.
func TestIntDotCodecs(t *testing.T) {
	rng := rand.New(rand.NewPCG(81, 82))
	const heads, G, tokens, B = 2, 4, 304, 16
	for _, kn := range []string{"q8dot", "q4dot"} {
		for _, vn := range []string{"f16", "q8", "q8dot", "q4dot"} {
			for _, hd := range []int{64, 8, 12, 6} {
				for _, shifted := range []bool{false, true} {
					softcap := float32(0)
					if shifted {
						softcap = 2
					}
					t.Run(fmt.Sprintf("%s_%s/hd=%d/shift=%v", kn, vn, hd, shifted), func(t *testing.T) {
						kc, _ := codec.Parse(kn, codec.Keys)
						vc, _ := codec.Parse(vn, codec.Values)
						if !kc.IntDot() {
							t.Fatalf("%s: IntDot false", kn)
						}
						var shift [][]float32
						if shifted {
							shift = [][]float32{randVec(rng, hd), randVec(rng, hd)}
						}
						pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: kvcache.Layout{Layers: 1, KVHeads: heads, HeadDim: hd},
							BlockTokens: B, K: kc, V: vc, Tokens: tokens, KeyShift: shift})
						if err != nil {
							t.Fatal(err)
						}
						seq := pool.NewSequence()
						pos := make([]int32, tokens)
						for i := range pos {
							pos[i] = int32(i)
						}
						k, v := randVec(rng, tokens*heads*hd), randVec(rng, tokens*heads*hd)
						if err := seq.Append(0, pos, k, v); err != nil {
							t.Fatal(err)
						}
						keys, vals := make([][][]float64, heads), make([][][]float64, heads)
						// q8dot values: each slot's scale and levels.
						vdot := vc.IntDot() && hd%16 == 0
						vscale, vlev := make([][]float64, heads), make([][][]float64, heads)
						row := make([]float32, hd)
						sm := make([]float32, 2*16*((hd+15)/16))
						for h := range heads {
							for _, s := range seq.Segments(0, h) {
								if s.N%B != 0 || s.Cap != B {
									t.Fatalf("segment of %d slots in a block of %d: not full groups", s.N, s.Cap)
								}
								for i := range s.N {
									s.KC.Get(s.K, s.Cap, hd, i, row)
									keys[h] = append(keys[h], f64(row))
									s.VC.Get(s.V, s.Cap, hd, i, row)
									vals[h] = append(vals[h], f64(row))
								}
								if vdot {
									lv, bits, ld, ok := s.VC.LevelRows(s.V, s.Cap, hd, 0, 16, sm)
									if !ok || bits != 8 && bits != 4 {
										t.Fatalf("%s values: no 8- or 4-bit level rows", vn)
									}
									for i := range 16 {
										vscale[h] = append(vscale[h], float64(sm[i]))
										u := make([]float64, hd)
										for c := range hd {
											if bits == 8 {
												u[c] = float64(lv[i*ld+c])
											} else {
												u[c] = float64(lv[i*ld+c/2] >> (4 * (c % 2)) & 15)
											}
										}
										vlev[h] = append(vlev[h], u)
									}
								}
							}
						}
						for _, qpos := range [][]int32{{303}, {290, 301, 303}} {
							for _, splitMin := range []int{-1, 100} {
								n := len(qpos)
								stride := heads * G * hd
								q := randVec(rng, n*stride)
								out := make([]float32, n*stride)
								b := Batch{Heads: heads, G: G, HeadDim: hd, Norm: float32(math.Sqrt(float64(hd))), Softcap: softcap, Q: q, Out: out, Pos: qpos,
									Segs: func(h int) []kvcache.Segment { return seq.Segments(0, h) }, SplitMin: splitMin, SplitChunk: 100}
								var sc Scratch
								b.Run(&sc)
								worst, moved, pvMoved := 0.0, 0.0, 0.0
								for ti, p := range qpos {
									for h := range heads {
										var mu []float32
										if shifted {
											mu = shift[h]
										}
										for j := range G {
											off := ti*stride + (h*G+j)*hd
											qr := q[off : off+hd]
											norm := math.Sqrt(float64(hd))
											want, prob := naiveScored(capped(dotScores(qr, keys[h], mu), norm, softcap), vals[h], pos, p, norm)
											tol := make([]float64, hd)
											if vdot {
												for p0 := 0; p0 < len(prob); p0 += 16 {
													a := 0.0
													for i := p0; i < p0+16; i++ {
														a = math.Max(a, prob[i]*vscale[h][i]/127)
													}
													for c := range hd {
														for i := p0; i < p0+16; i++ {
															tol[c] += a / 2 * vlev[h][i][c] * 1.01
														}
													}
												}
											}
											var exact []float64
											if hd%4 == 0 {
												exact, _ = naiveScored(capped(rawScores(f64(qr), keys[h]), norm, softcap), vals[h], pos, p, norm)
											}
											for c := range want {
												worst = math.Max(worst, math.Abs(want[c]-float64(out[off+c]))-tol[c])
												pvMoved = math.Max(pvMoved, math.Abs(want[c]-float64(out[off+c])))
												if exact != nil {
													moved = math.Max(moved, math.Abs(exact[c]-float64(out[off+c])))
												}
											}
										}
									}
								}
								if worst > 2e-5 {
									t.Errorf("queries %v split %d: max |Δ| %.3g from the rounded queries' attention", qpos, splitMin, worst)
								}
								if vdot && pvMoved < 1e-4 {
									t.Errorf("queries %v split %d: within %.3g of the exact weighted sum: the weights were not rounded", qpos, splitMin, pvMoved)
								}
								if hd%4 == 0 && moved < 1e-4 {
									t.Errorf("queries %v split %d: within %.3g of the exact queries' attention: the queries were not rounded", qpos, splitMin, moved)
								}
							}
						}
					})
				}
			}
		}
	}
}

// dotScores is the score of query q against every key as attention over
// an IntDot codec computes it: the query rounded to int8 with scale
// max|q|/127 against the key less the shift mu, plus q·mu exactly (for d
// not a multiple of 4, q·k exactly).
func dotScores(q []float32, keys [][]float64, mu []float32) []float64 {
	d := len(q)
	qr := f64(q)
	if d%4 == 0 {
		var amax float32
		for _, v := range q {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		a := amax / 127
		for c, v := range q {
			qr[c] = 0
			if amax > 0 {
				qr[c] = float64(a) * math.Round(float64(v*(127/amax)))
			}
		}
	}
	s := make([]float64, len(keys))
	for i, k := range keys {
		for c := range d {
			kc := k[c]
			if mu != nil {
				kc -= float64(mu[c])
			}
			s[i] += qr[c] * kc
			if mu != nil {
				s[i] += float64(q[c]) * float64(mu[c])
			}
		}
	}
	return s
}

// capped applies a soft cap to raw scores (Batch.Softcap; 0: none): s
// becomes norm·cap·tanh(s/norm/cap), so that s/norm is capped.
func capped(s []float64, norm float64, softcap float32) []float64 {
	if softcap > 0 {
		c := float64(softcap)
		for i := range s {
			s[i] = norm * c * math.Tanh(s[i]/norm/c)
		}
	}
	return s
}

func randVec(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}
