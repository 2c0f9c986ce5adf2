package tensor

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// randRawMatrix fills a quantized matrix with random bytes (every quant
// value, scale and min possible, Q8_0's -128 included) and valid f16
// block scales.
func randRawMatrix(r *rand.Rand, typ DType, rows, cols int) *Matrix {
	rb, _ := typ.RowBytes(cols)
	data := make([]byte, rows*rb)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	bb := typ.BlockBytes()
	var dOffs []int
	switch typ {
	case Q8_0, Q4_0:
		dOffs = []int{0}
	case Q4_K:
		dOffs = []int{0, 2}
	case Q6_K:
		dOffs = []int{208}
	case Q5_0, IQ4_NL, IQ4_XS:
		dOffs = []int{0}
	case Q4_1, Q5_1, Q5_K:
		dOffs = []int{0, 2}
	case Q2_K:
		dOffs = []int{80, 82}
	case Q3_K:
		dOffs = []int{108}
	}
	for b := 0; b < len(data)/bb; b++ {
		for _, o := range dOffs {
			binary.LittleEndian.PutUint16(data[b*bb+o:], F32ToF16(float32(r.NormFloat64()*0.01)))
		}
	}
	m, err := NewMatrix(typ, rows, cols, data)
	if err != nil {
		panic(err)
	}
	return m
}

var quantTypes = []DType{Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS}

// TestQuantMatMulExact: every kernel set gives the plain Go twin's results
// bit for bit, for every tile shape and remainder.
func TestQuantMatMulExact(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, typ := range quantTypes {
		bs := typ.BlockSize()
		for _, rows := range []int{1, 3, 4, 5, 7, 8, 13} {
			for _, nb := range []int{1, 2, 3, 8} {
				cols := nb * bs
				m := randRawMatrix(r, typ, rows, cols)
				if r.IntN(2) == 0 {
					m = randMatrix(t, r, typ, rows, cols)
				}
				for _, n := range []int{1, 2, 3, 4, 5, 8, 9} {
					x := randF32(r, n*cols)
					if n == 3 {
						clear(x[:cols]) // an all-zero activation row
					}
					want := make([]float32, n*rows)
					level = levelGo
					m.MatMul(want, x, n)
					level = cpuLevel
					forEachLevel(t, func(t *testing.T) {
						got := make([]float32, n*rows)
						m.MatMul(got, x, n)
						for i := range got {
							if !sameBits(got[i], want[i]) {
								t.Fatalf("%s %d×%d n=%d: [%d] = %g, want %g", typ, rows, cols, n, i, got[i], want[i])
							}
						}
					})
				}
			}
		}
	}
}

// TestQuantKernelsAccumulate: each kernel, called with load set, continues
// the twin's accumulators exactly.
func TestQuantKernelsAccumulate(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, typ := range quantTypes {
		bs, xb := actLayout(typ)
		for l := levelAVX2; l <= cpuLevel; l++ {
			level = l
			qk := quantKern(typ)
			level = cpuLevel
			gk := quantKernGo[typ]
			for _, c := range []struct {
				R, T  int
				k, gk qkernFunc
			}{{qk.rd, 1, qk.dec, qkernGo(typ, qk.rd, 1)}, {1, 1, qk.dec1, gk.dec1},
				{qk.rp, qk.tp, qk.pre, qkernGo(typ, qk.rp, qk.tp)}, {1, qk.tp, qk.pre1, qkernGo(typ, 1, qk.tp)}} {
				nb := 5
				m := randRawMatrix(r, typ, c.R, nb*bs)
				x := randF32(r, c.T*nb*bs)
				act := make([]byte, c.T*nb*xb)
				quantizeActs(typ, act, x, nb*bs, [][2]int{{0, c.T}})
				init := randF32(r, c.T*c.R*8)
				got, want := append([]float32(nil), init...), append([]float32(nil), init...)
				c.k(ptr(m.Data), m.rowBytes, ptr(act), nb, &got[0], 1)
				c.gk(ptr(m.Data), m.rowBytes, ptr(act), nb, &want[0], 1)
				for i := range got {
					if !sameBits(got[i], want[i]) {
						t.Fatalf("%s %s R=%d T=%d: lane %d = %g, want %g", typ, l, c.R, c.T, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// TestQuantMatMulAccuracy: with 8-bit activations the product stays within
// 1% (RMS, relative) of the float product of the dequantized weights.
func TestQuantMatMulAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, typ := range quantTypes {
		rows, cols, n := 37, 4*QK_K, 3
		m := randMatrix(t, r, typ, rows, cols)
		x := randF32(r, n*cols)
		want := make([]float32, n*rows)
		m.matmulRef(want, x, n)
		forEachLevel(t, func(t *testing.T) {
			got := make([]float32, n*rows)
			m.MatMul(got, x, n)
			var e, s float64
			for i := range got {
				d := float64(got[i] - want[i])
				e += d * d
				s += float64(want[i]) * float64(want[i])
			}
			if rel := math.Sqrt(e / s); rel > 0.01 {
				t.Errorf("%s: relative RMS error %.3g", typ, rel)
			}
		})
	}
}

// TestActQuant checks the activation blocks against their definition.
func TestActQuant(t *testing.T) {
	x := make([]float32, QK_K)
	for i := range x {
		x[i] = float32(i%37) - 18
	}
	x[5] = 127 * 0.5 // lane 1: max |x| = 63.5, d = 0.5
	b := make([]byte, xb32)
	quantAct32(x, b, 8)
	if d := f32at(b[xb32D+4:]); math.Abs(float64(d)-0.5) > 1e-7 {
		t.Fatalf("d[1] = %g", d)
	}
	for l := 0; l < 8; l++ {
		var amax float32
		for _, v := range x[4*l : 4*l+4] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		if got := f32at(b[xb32D+4*l:]); got != amax*(1.0/127) {
			t.Errorf("d[%d] = %g, want %g", l, got, amax/127)
		}
		var s int32
		for j := 4 * l; j < 4*l+4; j++ {
			if want := int8(math.RoundToEven(float64(x[j] * (127 / amax)))); int8(b[j]) != want {
				t.Errorf("q[%d] = %d, want %d", j, int8(b[j]), want)
			}
			s += int32(int8(b[j]))
		}
		if c := int32(binary.LittleEndian.Uint32(b[xb32Corr+4*l:])); c != -8*s {
			t.Errorf("corr[%d] = %d, want %d", l, c, -8*s)
		}
	}
	k := make([]byte, xbK)
	quantActK(x, k)
	for g := 0; g < 16; g++ {
		var s int16
		for j := 16 * g; j < 16*g+16; j++ {
			s += int16(int8(k[j]))
		}
		if got := int16(binary.LittleEndian.Uint16(k[xbKBs+2*g:])); got != s {
			t.Errorf("bs[%d] = %d, want %d", g, got, s)
		}
	}
}

// TestActQuantKernels: the AVX-512 quantization of activations writes the
// Go code's bytes, for finite rows and for rows with Inf or NaN.
func TestActQuantKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	for _, typ := range quantTypes {
		bs, xb := actLayout(typ)
		for _, nb := range []int{1, 2, 5} {
			for _, n := range []int{1, 3, 4, 9} {
				cols := nb * bs
				x := randF32(r, n*cols)
				for i := range x {
					x[i] *= float32(math.Pow(10, float64(r.IntN(7)-3)))
				}
				clear(x[:min(cols, 40)]) // zero scales
				if n > 2 {
					x[cols+7] = float32(math.Inf(1))
					x[2*cols+3] = float32(math.NaN())
				}
				g := actGroups(n, 4)
				want := make([]byte, n*nb*xb)
				level = levelGo
				quantizeActs(typ, want, x, cols, g)
				level = cpuLevel
				forEachLevel(t, func(t *testing.T) {
					got := make([]byte, n*nb*xb)
					quantizeActs(typ, got, x, cols, g)
					for i := range got {
						if got[i] != want[i] {
							t.Fatalf("%s nb=%d n=%d: byte %d (block offset %d) = %#x, want %#x", typ, nb, n, i, i%xb, got[i], want[i])
						}
					}
				})
			}
		}
	}
}

// TestQuantRowsKernels: the decode kernels over many rows give the twin's
// sums bit for bit.
func TestQuantRowsKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, typ := range quantTypes {
		bs, xb := actLayout(typ)
		for _, nb := range []int{0, 1, 3, 8} {
			rows := 1 + r.IntN(9)
			m := randRawMatrix(r, typ, rows, max(nb, 1)*bs)
			x := randF32(r, max(nb, 1)*bs)
			act := make([]byte, max(nb, 1)*xb)
			quantizeActs(typ, act, x, max(nb, 1)*bs, [][2]int{{0, 1}})
			want := make([]float32, rows)
			quantKernGo[typ].rows(ptr(m.Data), m.rowBytes, ptr(act), nb, &want[0], rows)
			forEachLevel(t, func(t *testing.T) {
				got := make([]float32, rows)
				quantKern(typ).rows(ptr(m.Data), m.rowBytes, ptr(act), nb, &got[0], rows)
				for i := range got {
					if !sameBits(got[i], want[i]) {
						t.Fatalf("%s nb=%d: row %d = %g, want %g", typ, nb, i, got[i], want[i])
					}
				}
			})
		}
	}
}
