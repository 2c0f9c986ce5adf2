package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// encodeRows stores x [n][d] as type t, rows ld bytes apart.
func encodeRows(x []float32, t DType, n, d, ld int) []byte {
	b := make([]byte, n*ld)
	for i := range n {
		for c := range d {
			v := x[i*d+c]
			switch t {
			case F32:
				*(*float32)(unsafe.Pointer(&b[i*ld+4*c])) = v
			case F16:
				h := F32ToF16(v)
				b[i*ld+2*c], b[i*ld+2*c+1] = byte(h), byte(h>>8)
			default:
				h := F32ToBF16(v)
				b[i*ld+2*c], b[i*ld+2*c+1] = byte(h), byte(h>>8)
			}
		}
	}
	return b
}

// TestAttnKernelsExact: the attention kernels give the bits of their Go
// twins at every kernel level, for head sizes with and without 16-value
// tails, every row count of a tile and every key type; scores equal run.c's
// in-order sums (dotSeq), from packed panels and from panels of the keys'
// own type (AttnScoresOf).
func TestAttnKernelsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, typ := range []DType{F32, F16, BF16} {
		for _, d := range []int{8, 16, 48, 64, 80, 128, 200} {
			es := elemBytes(typ)
			ld := d*es + 4*r.IntN(3)
			kx := randF32(r, 16*d)
			kb := encodeRows(kx, typ, 16, d, ld)
			// what the codec stores, decoded
			kd := make([]float32, 16*d)
			for i := range 16 {
				for c := range d {
					kd[i*d+c] = elemAt(kb[i*ld:], typ, c)
				}
			}
			for _, rows := range []int{1, 3, 6, 7, 14, 15, 29} {
				q := randF32(r, rows*d)
				lds := 16 + 16*r.IntN(3)
				type result struct {
					s, o []float32
					mx   float32
				}
				var ref *result
				forEachLevel(t, func(t *testing.T) {
					for _, n := range []int{16, 11} {
						panel := make([]float32, d*16)
						PackKeys(panel, kb, typ, ld, n, d)
						for j := range n {
							for c := range d {
								if panel[c*16+j] != kd[j*d+c] {
									t.Fatalf("%s d=%d: panel[%d][%d] = %g, want %g", typ, d, c, j, panel[c*16+j], kd[j*d+c])
								}
							}
						}
					}
					panel := make([]float32, d*16)
					PackKeys(panel, kb, typ, ld, 16, d)
					qp := make([]float32, rows*d)
					PackQueries(qp, q, rows, d)
					s := make([]float32, rows*lds)
					AttnScores(s, lds, panel, qp, rows, d)
					for i := range rows {
						for j := range 16 {
							if w := dotSeq(q[i*d:(i+1)*d], kd[j*d:(j+1)*d]); !sameBits(s[i*lds+j], w) {
								t.Fatalf("%s d=%d rows=%d: score[%d][%d] = %g, want %g", typ, d, rows, i, j, s[i*lds+j], w)
							}
						}
					}
					// the same keys stored as a panel of their own type
					tp := make([]byte, 16*d*es)
					for j := range 16 {
						for c := range d {
							copy(tp[(c*16+j)*es:(c*16+j+1)*es], kb[j*ld+c*es:j*ld+(c+1)*es])
						}
					}
					s2 := make([]float32, rows*lds)
					AttnScoresOf(s2, lds, tp, typ, qp, rows, d)
					for i := range rows {
						for j := range 16 {
							if !sameBits(s2[i*lds+j], s[i*lds+j]) {
								t.Fatalf("%s d=%d rows=%d: typed panel score[%d][%d] = %g, packed %g", typ, d, rows, i, j, s2[i*lds+j], s[i*lds+j])
							}
						}
					}
					// softmax steps on the score rows, with some masked slots
					s[0] = float32(math.Inf(-1))
					mx := AttnMax(s)
					norm := float32(math.Sqrt(float64(d)))
					AttnExp(s, norm, mx/norm)
					AttnDiv(s, 3.5)
					o := randF32(rand.New(rand.NewPCG(1, uint64(rows))), rows*(d+3))
					AttnPV(o, d+3, s, lds, kb, typ, ld, 16, rows, d)
					got := &result{s: s, o: o, mx: mx}
					if ref == nil {
						ref = got
						return
					}
					if !sameBits(got.mx, ref.mx) {
						t.Fatalf("%s d=%d rows=%d: max %g, want %g", typ, d, rows, got.mx, ref.mx)
					}
					for i := range got.s {
						if !sameBits(got.s[i], ref.s[i]) {
							t.Fatalf("%s d=%d rows=%d: weight %d = %g, want %g", typ, d, rows, i, got.s[i], ref.s[i])
						}
					}
					for i := range got.o {
						if !sameBits(got.o[i], ref.o[i]) {
							t.Fatalf("%s d=%d rows=%d: out %d = %g, want %g", typ, d, rows, i, got.o[i], ref.o[i])
						}
					}
				})
			}
		}
	}
}

// TestAttnExpMatchesMathExp: AttnExp rounds as float32(math.Exp) on the
// score range, and on every level gives the bits of its twin (NaN and ±Inf
// included).
func TestAttnExpMatchesMathExp(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	const n = 100003
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(-120 * r.Float64())
	}
	x[0], x[1], x[2], x[3] = float32(math.Inf(-1)), 0, float32(math.NaN()), float32(math.Inf(1))
	want := make([]float32, n)
	for i, v := range x {
		want[i] = float32(math.Exp(float64(v)))
	}
	forEachLevel(t, func(t *testing.T) {
		s := append([]float32(nil), x...)
		AttnExp(s, 1, 0)
		for i := range s {
			if s[i] != want[i] && !(math.IsNaN(float64(s[i])) && math.IsNaN(float64(want[i]))) {
				t.Fatalf("exp(%g) = %g, want %g", x[i], s[i], want[i])
			}
		}
	})
	for _, v := range x[:4] {
		forEachLevel(t, func(t *testing.T) {
			s := make([]float32, 40)
			for i := range s {
				s[i] = v
			}
			m := AttnMax(s)
			if math.IsNaN(float64(v)) && !math.IsInf(float64(m), -1) {
				t.Fatalf("max of NaNs = %g, want -Inf", m)
			}
		})
	}
}

// TestScaleBytes: the 8-bit decoding kernels give their twin's bits.
func TestScaleBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, n := range []int{0, 5, 16, 64, 77} {
		u := make([]byte, n)
		for i := range u {
			u[i] = byte(r.IntN(256))
		}
		s, m := float32(r.Float64()/100), float32(-r.Float64())
		want := make([]float32, n)
		scaleBytesGo(want, u, s, m)
		forEachLevel(t, func(t *testing.T) {
			got := make([]float32, n)
			ScaleBytes(got, u, s, m)
			for i := range got {
				if !sameBits(got[i], want[i]) {
					t.Fatalf("n=%d: [%d] = %g, want %g", n, i, got[i], want[i])
				}
			}
		})
	}
}

// TestScalePanel: the panel decoding kernels (8- and 4-bit levels) give
// their twin's bits, with and without a shift, and the twin decodes each
// lane as ScaleBytes decodes its slot's levels (plus the shift as a separate
// sum).
func TestScalePanel(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	for _, bits := range []int{8, 4} {
		decode := map[int]func([]float32, []byte, *[32]float32, []float32, int){8: ScalePanel, 4: ScalePanel4}[bits]
		for _, d := range []int{1, 8, 64, 72} {
			u := make([]byte, 16*d*bits/8)
			for i := range u {
				u[i] = byte(r.IntN(256))
			}
			level := func(c, j int) byte { // value c of slot j
				if bits == 8 {
					return u[c*16+j]
				}
				return u[8*c+j/2] >> (4 * (j % 2)) & 15
			}
			var sm [32]float32
			for j := range 16 {
				sm[j], sm[16+j] = float32(r.Float64()/100), float32(-r.Float64())
			}
			sm[16+3] = float32(math.Copysign(0, -1)) // a −0 minimum: x̂ = −0 at level 0
			if bits == 8 {                           // slot 3's level of value 0 is 0
				u[3] = 0
			} else {
				u[1] &^= 0xF0
			}
			if level(0, 3) != 0 {
				t.Fatal("slot 3's level not cleared")
			}
			shift := randF32(r, d)
			for _, sh := range [][]float32{nil, shift} {
				want := make([]float32, 16*d)
				scalePanelGo(want, u, &sm, sh, d, bits)
				for j := range 16 {
					col, lane := make([]byte, d), make([]float32, d)
					for c := range d {
						col[c] = level(c, j)
					}
					scaleBytesGo(lane, col, sm[j], sm[16+j])
					for c := range d {
						if sh != nil {
							lane[c] += sh[c]
						}
						if !sameBits(lane[c], want[c*16+j]) {
							t.Fatalf("%d bits d=%d lane %d value %d: twin %g, ScaleBytes %g", bits, d, j, c, want[c*16+j], lane[c])
						}
					}
				}
				forEachLevel(t, func(t *testing.T) {
					got := make([]float32, 16*d)
					decode(got, u, &sm, sh, d)
					for i := range got {
						if !sameBits(got[i], want[i]) {
							t.Fatalf("%d bits d=%d shift %v: [%d] = %g, want %g", bits, d, sh != nil, i, got[i], want[i])
						}
					}
				})
			}
		}
	}
}

// TestScaleLevels: 4- and 2-bit levels decoded with one scale and minimum
// (ScaleLevels) or one per row of 16 (ScaleLevelRows) give, at every kernel level and length (SIMD groups of
// 16 and the tail), the bits of the levels unpacked one by one and decoded
// as ScaleBytes decodes bytes; bits 8 is ScaleBytes.
func TestScaleLevels(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	for _, bits := range []int{8, 4, 2} {
		for _, n := range []int{0, 1, 5, 15, 16, 17, 32, 64, 100} {
			u := make([]byte, (n*bits+7)/8+1)
			for i := range u {
				u[i] = byte(r.IntN(256))
			}
			levels := make([]byte, n) // level j: bits bits from bit j·bits on
			for j := range levels {
				var v uint
				for b := range bits {
					bit := j*bits + b
					v |= uint(u[bit/8]>>(bit%8)&1) << b
				}
				levels[j] = byte(v)
			}
			s, m := randF32(r, n+1), randF32(r, n+1)
			for j := range s {
				s[j] /= 10
			}
			m[0] = float32(math.Copysign(0, -1)) // −0 at level 0 stays −0
			if n > 0 {
				u[0] &^= 1<<bits - 1
				levels[0] = 0
			}
			want, wantR := make([]float32, n), make([]float32, n)
			scaleBytesGo(want, levels, s[0], m[0])
			for j := range wantR {
				scaleBytesGo(wantR[j:j+1], levels[j:j+1], s[j/16], m[j/16])
			}
			forEachLevel(t, func(t *testing.T) {
				got := make([]float32, n)
				ScaleLevels(got, u, bits, s[0], m[0])
				for j := range got {
					if !sameBits(got[j], want[j]) {
						t.Fatalf("%d bits n=%d: [%d] = %g, want %g", bits, n, j, got[j], want[j])
					}
				}
				if bits == 8 {
					return
				}
				rows := n / 16
				ScaleLevelRows(got, u, bits, s[:rows], m[:rows])
				for j := range 16 * rows {
					if !sameBits(got[j], wantR[j]) {
						t.Fatalf("rows %d bits n=%d: [%d] = %g, want %g", bits, n, j, got[j], wantR[j])
					}
				}
			})
		}
	}
}

func BenchmarkAttnKernels(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const d, rows = 64, 128
	kb := encodeRows(randF32(r, 16*d), F32, 16, d, 4*d)
	q := randF32(r, rows*d)
	panel := make([]float32, d*16)
	qp := make([]float32, rows*d)
	PackQueries(qp, q, rows, d)
	s := make([]float32, rows*16)
	o := make([]float32, rows*d)
	b.Run("scores", func(b *testing.B) {
		for range b.N {
			PackKeys(panel, kb, F32, 4*d, 16, d)
			AttnScores(s, 16, panel, qp, rows, d)
		}
		b.ReportMetric(float64(b.N)*rows*16*d/b.Elapsed().Seconds()/1e9, "GMAC/s")
	})
	b.Run("pv", func(b *testing.B) {
		for range b.N {
			AttnPV(o, d, s, 16, kb, F32, 4*d, 16, rows, d)
		}
		b.ReportMetric(float64(b.N)*rows*16*d/b.Elapsed().Seconds()/1e9, "GMAC/s")
	})
	b.Run("exp", func(b *testing.B) {
		x := randF32(r, 4096)
		for range b.N {
			AttnExp(x, 8, 3)
		}
		b.ReportMetric(float64(b.N)*4096/b.Elapsed().Seconds()/1e9, "Gexp/s")
	})
}
