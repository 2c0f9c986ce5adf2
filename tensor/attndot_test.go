package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestAttnScoresDot: the dot-product scores of a panel of q8 or q4 keys
// equal, at every kernel level and bit for bit, the documented formula
// evaluated here from first principles (the query rounded to int8 in
// float64, the levels read one at a time, the integer sum in int64, the
// epilogue rounded in its order); and they stay within the rounded
// query's error bound of the exact scores of the decoded keys, computed in
// float64.
func TestAttnScoresDot(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	for _, bits := range []int{8, 4} {
		for _, d := range []int{4, 8, 16, 64, 72, 128} {
			var sm [32]float32
			u := randQuant(r, &sm, 16*d*bits/8)
			shift := randF32(r, d)
			for _, sh := range [][]float32{nil, shift} {
				for _, rows := range dotRows {
					q := randF32(r, rows*d)
					q[0] = 0 // a zero, and a row of zeros below
					if rows > 1 {
						clear(q[d : 2*d])
					}
					lds := 16 + 16*r.IntN(2)
					want, bound := dotReference(q, u, bits, &sm, sh, rows, d)
					name := fmt.Sprintf("q%d/d=%d/shift=%v/rows=%d", bits, d, sh != nil, rows)
					t.Run(name, func(t *testing.T) {
						forEachLevel(t, func(t *testing.T) {
							qd, cst := make([]byte, rows*d), make([]float32, 3*rows)
							PackQueriesDot(qd, cst, q, rows, d)
							DotShifts(cst, q, sh, rows, d)
							s := make([]float32, rows*lds)
							AttnScoresDot(s, lds, u, bits, &sm, qd, cst, rows, d)
							for i := range rows {
								for j := range 16 {
									got, w := s[i*lds+j], want[i*16+j]
									if !sameBits(got, w) {
										t.Fatalf("score[%d][%d] = %g, want %g", i, j, got, w)
									}
									exact := exactScore(q[i*d:(i+1)*d], u, bits, &sm, sh, j)
									if e := math.Abs(float64(got) - exact); e > bound[i*16+j] {
										t.Fatalf("score[%d][%d] = %g, %g from the decoded keys' %g (bound %g)", i, j, got, e, exact, bound[i*16+j])
									}
								}
							}
						})
					})
				}
			}
		}
	}
}

// dotRows: every kernel's row count (1 … DotMR), a group and one more,
// two groups and one more.
var dotRows = []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 25}

// dotReference computes AttnScoresDot's documented result for every row
// and lane, and a bound on its distance from the exact scores: the rounded
// query's error (a/2 a channel, times the key's magnitude) plus float32's
// rounding of the epilogue.
func dotReference(q []float32, u []byte, bits int, sm *[32]float32, shift []float32, rows, d int) (want []float32, bound []float64) {
	want, bound = make([]float32, rows*16), make([]float64, rows*16)
	for i := range rows {
		x := q[i*d : (i+1)*d]
		amax := 0.0
		for _, v := range x {
			amax = math.Max(amax, math.Abs(float64(v)))
		}
		a := float32(amax) / 127
		lv := make([]int64, d)
		var sum int64
		for c, v := range x {
			if amax > 0 {
				lv[c] = int64(math.Round(float64(v * (127 / float32(amax)))))
			}
			sum += lv[c]
		}
		b := a * float32(sum)
		var cs float32
		if shift != nil {
			for c := range d {
				cs += float32(x[c] * shift[c])
			}
		}
		for j := range 16 {
			var acc, mag int64
			for c := range d {
				l := int64(quantLevel(u, bits, c, j))
				acc += l * lv[c]
				mag += l
			}
			t := float32(float32(acc)*sm[j]) * a
			want[i*16+j] = float32(t+float32(sm[16+j]*b)) + cs
			// |k_c| ≤ s·u + |m| (+ |shift_c|); the query's error a/2 a channel.
			var kabs float64
			for c := range d {
				k := float64(sm[j])*float64(quantLevel(u, bits, c, j)) + math.Abs(float64(sm[16+j]))
				if shift != nil {
					k += math.Abs(float64(shift[c]))
				}
				kabs += k
			}
			bound[i*16+j] = float64(a)/2*kabs*(1+1e-6) + 1e-5*(1+math.Abs(float64(want[i*16+j]))+float64(a)*kabs)
		}
	}
	return want, bound
}

// exactScore is q·k_j in float64 over the decoded key j (plus its shift).
func exactScore(q []float32, u []byte, bits int, sm *[32]float32, shift []float32, j int) float64 {
	var s float64
	for c := range q {
		k := float64(float32(sm[j]*float32(quantLevel(u, bits, c, j))) + sm[16+j])
		if shift != nil {
			k += float64(shift[c])
		}
		s += float64(q[c]) * k
	}
	return s
}

// TestAttnPVDot: the dot-product weighted sum of 16 rows of 8- or 4-bit
// value levels equals, at every kernel level and bit for bit, the documented
// formula evaluated here (the weights rounded against the slots' scales,
// the integer sums in int64, the minimums' part summed as the stated
// tree); and it stays within the rounded weights' bound (a/2 per level) of
// the decoded values' weighted sum in float64. Rows of weights with zeros
// (hidden slots), a row of zeros and tiny weights are among them.
func TestAttnPVDot(t *testing.T) {
	r := rand.New(rand.NewPCG(73, 74))
	for _, bits := range []int{8, 4} {
		for _, d := range []int{16, 64, 128} {
			for _, rows := range dotRows {
				ldv := d*bits/8 + 16*r.IntN(2)
				var sm [32]float32
				v := randQuant(r, &sm, 16*ldv)
				lv := func(j, c int) byte { // slot j's level of channel c
					if bits == 8 {
						return v[j*ldv+c]
					}
					return v[j*ldv+c/2] >> (4 * (c % 2)) & 15
				}
				ldp, ldo := 16+16*r.IntN(2), d+16*r.IntN(2)
				p := make([]float32, rows*ldp)
				for i := range rows {
					for j := range 16 {
						if r.IntN(4) > 0 {
							p[i*ldp+j] = float32(math.Exp(-8 * r.Float64()))
						}
					}
				}
				if rows > 1 {
					clear(p[ldp : 2*ldp]) // a row of zeros
				}
				if rows > 2 {
					for j := range 16 {
						p[2*ldp+j] = float32(1e-30 * r.Float64()) // tiny weights
					}
				}
				o0 := randF32(r, rows*ldo)
				want, bound := pvDotReference(o0, ldo, p, ldp, lv, &sm, rows, d)
				t.Run(fmt.Sprintf("%dbit/d=%d/rows=%d", bits, d, rows), func(t *testing.T) {
					forEachLevel(t, func(t *testing.T) {
						o := append([]float32(nil), o0...)
						AttnPVDot(o, ldo, p, ldp, v, bits, ldv, &sm, rows, d, make([]byte, DotScratch))
						for i := range rows {
							for c := range d {
								got := o[i*ldo+c]
								if w := want[i*ldo+c]; !sameBits(got, w) {
									t.Fatalf("o[%d][%d] = %g, want %g", i, c, got, w)
								}
								exact := float64(o0[i*ldo+c])
								for j := range 16 {
									exact += float64(p[i*ldp+j]) * float64(float32(sm[j]*float32(lv(j, c)))+sm[16+j])
								}
								if e := math.Abs(float64(got) - exact); e > bound[i*ldo+c] {
									t.Fatalf("o[%d][%d] = %g, %g from the decoded values' %g (bound %g)", i, c, got, e, exact, bound[i*ldo+c])
								}
							}
						}
					})
				})
			}
		}
	}
}

// pvDotReference evaluates AttnPVDot's formula and the bound on its
// distance from the decoded values' weighted sum: a/2 per level, plus
// float32's rounding of the products, the scale and the sums.
func pvDotReference(o0 []float32, ldo int, p []float32, ldp int, lv func(j, c int) byte, sm *[32]float32, rows, d int) (want []float32, bound []float64) {
	want, bound = append([]float32(nil), o0...), make([]float64, len(o0))
	for i := range rows {
		var w [16]float32
		wmax := float32(math.Float32frombits(0x00800000)) // FLT_MIN
		for j := range 16 {
			w[j] = p[i*ldp+j] * sm[j]
			if w[j] > wmax {
				wmax = w[j]
			}
		}
		var l [16]int64
		for j := range 16 {
			l[j] = int64(math.RoundToEven(float64(w[j] * (127 / wmax))))
		}
		a := wmax / 127
		pm := func(j int) float32 { return p[i*ldp+j] * sm[16+j] }
		var s8 [8]float32
		for j := range 8 {
			s8[j] = pm(j) + pm(j+8)
		}
		s4 := [4]float32{s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]}
		mm := (s4[0] + s4[2]) + (s4[1] + s4[3])
		for c := range d {
			var acc, us int64
			for j := range 16 {
				acc += int64(lv(j, c)) * l[j]
				us += int64(lv(j, c))
			}
			x := float32(acc) * a
			want[i*ldo+c] = o0[i*ldo+c] + (x + mm)
			var mabs float64
			for j := range 16 {
				mabs += math.Abs(float64(pm(j)))
			}
			bound[i*ldo+c] = float64(a)/2*float64(us)*(1+1e-5) + 1e-6*(math.Abs(float64(o0[i*ldo+c]))+math.Abs(float64(x))+mabs) + 1e-30
		}
	}
	return want, bound
}

// BenchmarkAttnDot: one panel of 16 keys and values (head size 64, 8
// query rows: a TinyLlama decode step's KV head), scored and summed the
// float way (AttnScoresQ, AttnPVQ: q8) and by integer dot products.
func BenchmarkAttnDot(b *testing.B) {
	const d, rows = 64, 8
	r := rand.New(rand.NewPCG(75, 76))
	var sm [32]float32
	u := randQuant(r, &sm, 16*d)
	q := randF32(r, rows*d)
	p := make([]float32, rows*16)
	for i := range p {
		p[i] = float32(r.Float64() / 16)
	}
	s, o := make([]float32, rows*16), make([]float32, rows*d)
	qp, tmp := make([]float32, rows*d), make([]float32, 16*d)
	PackQueries(qp, q, rows, d)
	qd, cst := make([]byte, rows*d), make([]float32, 3*rows)
	PackQueriesDot(qd, cst, q, rows, d)
	vsm := make([]float32, 2*16*d/16)
	for k := 0; k < d/16; k++ {
		copy(vsm[32*k:], sm[:])
	}
	ws := make([]byte, DotScratch)
	b.Run("scores/q8", func(b *testing.B) {
		for range b.N {
			AttnScoresQ(s, 16, u, 8, &sm, nil, qp, rows, d, tmp)
		}
	})
	b.Run("scores/dot", func(b *testing.B) {
		for range b.N {
			AttnScoresDot(s, 16, u, 8, &sm, qd, cst, rows, d)
		}
	})
	b.Run("pv/q8", func(b *testing.B) {
		for range b.N {
			AttnPVQ(o, d, p, 16, u, 8, d, vsm, 16, rows, d, tmp)
		}
	})
	b.Run("pv/dot", func(b *testing.B) {
		for range b.N {
			AttnPVDot(o, d, p, 16, u, 8, d, &sm, rows, d, ws)
		}
	})
}
