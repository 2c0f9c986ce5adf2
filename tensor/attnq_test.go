package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestHalfPairs: every 16-bit pattern, as a scale and as a minimum,
// decodes as F16ToF32 decodes it (NaNs as NaNs), at every kernel level.
func TestHalfPairs(t *testing.T) {
	forEachLevel(t, func(t *testing.T) {
		meta := make([]byte, 64)
		var sm [32]float32
		for h0 := 0; h0 < 1<<16; h0 += 16 {
			for j := range 16 {
				s, m := uint16(h0+j), uint16(0xFFFF-h0-j)
				binary.LittleEndian.PutUint32(meta[4*j:], uint32(s)|uint32(m)<<16)
			}
			HalfPairs(&sm, meta)
			for j := range 16 {
				s, m := uint16(h0+j), uint16(0xFFFF-h0-j)
				if !sameBits(sm[j], F16ToF32(s)) || !sameBits(sm[16+j], F16ToF32(m)) {
					t.Fatalf("pair %#04x, %#04x: %g, %g; want %g, %g", s, m, sm[j], sm[16+j], F16ToF32(s), F16ToF32(m))
				}
			}
		}
	})
}

// quantLevel is level c of lane j of a panel of bits 8 or 4 (ScalePanel's
// layout).
func quantLevel(u []byte, bits, c, j int) byte {
	if bits == 8 {
		return u[16*c+j]
	}
	return u[8*c+j/2] >> (4 * (j % 2)) & 15
}

// randQuant fills sm with scales and minimums as the codecs make them
// (positive scales, minimums of either sign, a −0 minimum at lane 3) and
// returns n random bytes of levels.
func randQuant(r *rand.Rand, sm *[32]float32, n int) []byte {
	for j := range 16 {
		sm[j], sm[16+j] = float32(r.Float64()/50), float32(-2*r.Float64()+0.5)
	}
	sm[16+3] = float32(math.Copysign(0, -1))
	u := make([]byte, n)
	for i := range u {
		u[i] = byte(r.IntN(256))
	}
	return u
}

// TestAttnScoresQ: scores of a panel of q8 or q4 keys, with and without a
// shift, equal at every kernel level run.c's in-order sums over the keys
// decoded one value at a time (s·u + m, then + shift), for head sizes
// with and without 16-value tails and every row count of a tile.
func TestAttnScoresQ(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, bits := range []int{8, 4} {
		for _, d := range []int{1, 8, 64, 72, 128} {
			var sm [32]float32
			u := randQuant(r, &sm, 16*d*bits/8)
			shift := randF32(r, d)
			for _, sh := range [][]float32{nil, shift} {
				keys := make([]float32, 16*d) // keys[j·d + c]
				for j := range 16 {
					for c := range d {
						k := float32(sm[j]*float32(quantLevel(u, bits, c, j))) + sm[16+j]
						if sh != nil {
							k += sh[c]
						}
						keys[j*d+c] = k
					}
				}
				for _, rows := range []int{1, 6, 13, 14, 15, 29} {
					q := randF32(r, rows*d)
					lds := 16 + 16*r.IntN(2)
					name := fmt.Sprintf("q%d/d=%d/shift=%v/rows=%d", bits, d, sh != nil, rows)
					t.Run(name, func(t *testing.T) {
						forEachLevel(t, func(t *testing.T) {
							qp := make([]float32, rows*d)
							PackQueries(qp, q, rows, d)
							s := make([]float32, rows*lds)
							AttnScoresQ(s, lds, u, bits, &sm, sh, qp, rows, d, make([]float32, 16*d))
							for i := range rows {
								for j := range 16 {
									if w := dotSeq(q[i*d:(i+1)*d], keys[j*d:(j+1)*d]); !sameBits(s[i*lds+j], w) {
										t.Fatalf("score[%d][%d] = %g, want %g", i, j, s[i*lds+j], w)
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

// TestAttnScoresQC: scores of a panel of keys quantized per channel (4 or
// 2 bits, KIVI's) equal at every kernel level run.c's in-order sums over
// the keys decoded one value at a time (sc[c]·u + mn[c]).
func TestAttnScoresQC(t *testing.T) {
	r := rand.New(rand.NewPCG(65, 66))
	for _, bits := range []int{4, 2} {
		for _, d := range []int{1, 8, 64, 72, 128} {
			u := make([]byte, 16*d*bits/8)
			for i := range u {
				u[i] = byte(r.IntN(256))
			}
			sc, mn := make([]float32, d), make([]float32, d)
			for c := range d {
				sc[c], mn[c] = float32(r.Float64()/5), float32(-2*r.Float64()+0.5)
			}
			mn[0] = float32(math.Copysign(0, -1))
			keys := make([]float32, 16*d) // keys[j·d + c]
			for j := range 16 {
				for c := range d {
					e := (16*c + j) * bits
					lv := u[e/8] >> (e % 8) & (1<<bits - 1)
					keys[j*d+c] = float32(sc[c]*float32(lv)) + mn[c]
				}
			}
			for _, rows := range []int{1, 6, 13, 14, 15, 29} {
				q := randF32(r, rows*d)
				lds := 16 + 16*r.IntN(2)
				t.Run(fmt.Sprintf("%dbit/d=%d/rows=%d", bits, d, rows), func(t *testing.T) {
					forEachLevel(t, func(t *testing.T) {
						qp := make([]float32, rows*d)
						PackQueries(qp, q, rows, d)
						s := make([]float32, rows*lds)
						AttnScoresQC(s, lds, u, bits, sc, mn, qp, rows, d, make([]float32, 16*d))
						for i := range rows {
							for j := range 16 {
								if w := dotSeq(q[i*d:(i+1)*d], keys[j*d:(j+1)*d]); !sameBits(s[i*lds+j], w) {
									t.Fatalf("score[%d][%d] = %g, want %g", i, j, s[i*lds+j], w)
								}
							}
						}
					})
				})
			}
		}
	}
}

// TestAttnPVQ: the weighted sum of q8, q4 or 2-bit value rows, with a
// scale and minimum per row and 16 columns, equals at every kernel level
// the sum in slot order, a product then a sum, over the rows decoded one
// value at a time (s·u + m), for head sizes with and without 16-value
// tails, padded rows, partial panels and every row count.
func TestAttnPVQ(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	for _, bits := range []int{8, 4, 2} {
		for _, d := range []int{8, 16, 64, 72, 128} {
			ldv := (d*bits+7)/8 + r.IntN(3)
			v := make([]byte, 16*ldv)
			for i := range v {
				v[i] = byte(r.IntN(256))
			}
			chunks := (d + 15) / 16
			sm := make([]float32, 32*chunks)
			for k := range chunks {
				for i := range 16 {
					sm[32*k+i], sm[32*k+16+i] = float32(r.Float64()/50), float32(-2*r.Float64()+0.5)
				}
			}
			sm[16+3] = float32(math.Copysign(0, -1))
			for _, n := range []int{1, 7, 16} {
				vals := make([]float32, n*d) // vals[i·d + c]
				for i := range n {
					for c := range d {
						k := c / 16
						vals[i*d+c] = float32(sm[32*k+i]*float32(rowLevel(v[i*ldv:], bits, c))) + sm[32*k+16+i]
					}
				}
				for _, rows := range []int{1, 6, 7, 13} {
					ldp, ldo := n+r.IntN(3), d+r.IntN(3)
					p := randF32(r, rows*ldp)
					o0 := randF32(r, rows*ldo)
					want := append([]float32(nil), o0...)
					for rr := range rows {
						for i := range n {
							for c := range d {
								want[rr*ldo+c] += float32(p[rr*ldp+i] * vals[i*d+c])
							}
						}
					}
					t.Run(fmt.Sprintf("%dbit/d=%d/n=%d/rows=%d", bits, d, n, rows), func(t *testing.T) {
						forEachLevel(t, func(t *testing.T) {
							o := append([]float32(nil), o0...)
							AttnPVQ(o, ldo, p, ldp, v, bits, ldv, sm, n, rows, d, make([]float32, n*d))
							for i := range o {
								if !sameBits(o[i], want[i]) {
									t.Fatalf("out %d = %g, want %g", i, o[i], want[i])
								}
							}
						})
					})
				}
			}
		}
	}
}

// rowLevel is level c of a row of bits 8, 4 or 2 (ScaleLevels's packing,
// low bits first).
func rowLevel(u []byte, bits, c int) byte {
	e := c * bits
	return u[e/8] >> (e % 8) & (1<<bits - 1)
}
