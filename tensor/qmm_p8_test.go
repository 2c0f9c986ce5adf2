package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestQ8PAccuracy: the Go twins against the float product of the
// dequantized weights (relative RMS error, as TestQuantMatMulAccuracy;
// MatMul's for comparison in the log).
func TestQ8PAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, typ := range []DType{Q8_0, Q4_0} {
		checkAccuracy(t, r, typ, 40, func(m *Matrix, dst, x []float32, n int) {
			matMulQ8P(p8Set{8, qp8Go[m.Type], nil, nil}, m, dst, x, n)
		}, (*Matrix).MatMul, "MatMul")
	}
}

// TestQ8PTokenCounts: MatMul through the 8-row kernels at token counts
// that mix the 32- and 16-token kernels with the smaller ones, at every
// level, bit for bit against the Go twins.
func TestQ8PTokenCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, typ := range []DType{Q8_0, Q4_0} {
		for _, rows := range []int{24, 48} { // 8-row tiles; 16-row tiles (AVX-512 VNNI)
			m := randMatrix(t, r, typ, rows, 3*32)
			for _, n := range []int{2, 7, 15, 16, 17, 24, 35, 50} {
				x := randF32(r, n*m.Cols)
				want := make([]float32, n*m.Rows)
				level = levelGo
				m.MatMul(want, x, n)
				level = cpuLevel
				matMulEachLevel(t, fmt.Sprintf("%s rows=%d", typ, rows), m, x, n, want, nil)
			}
		}
	}
}

// TestQ8PMany: MatMulMany over several matrices of the 8-row kernels
// (activations shared by type) beside others, bit for bit against each
// matrix's MatMul, at every level.
func TestQ8PMany(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	const cols = 256
	ws := []*Matrix{randMatrix(t, r, Q8_0, 16, cols), randMatrix(t, r, Q4_0, 24, cols), randMatrix(t, r, Q8_0, 40, cols),
		randMatrix(t, r, Q8_0, 13, cols), randMatrix(t, r, Q4_K, 8, cols), randMatrix(t, r, Q4_0, 8, cols)}
	forEachLevel(t, func(t *testing.T) {
		for _, n := range []int{3, 4, 9, 16, 21} {
			x := randF32(r, n*cols)
			checkManyVsMatMul(t, fmt.Sprintf("n=%d", n), ws, x, n)
		}
	})
}

// TestQ8PActs: the activations of the 8-row kernels (quantizeActsP) at
// every level, bit for bit against the Go code, rows with zeros, an Inf,
// a NaN, large and tiny values included.
func TestQ8PActs(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	for _, typ := range []DType{Q8_0, Q4_0} {
		for _, nb := range []int{1, 2, 5, 64} {
			n := 7
			cols := nb * 32
			x := randF32(r, n*cols)
			clear(x[cols : 2*cols])
			x[2*cols+r.IntN(cols)] = float32(math.Inf(1))
			x[3*cols+r.IntN(cols)] = float32(math.NaN())
			x[4*cols+r.IntN(cols)] *= 1e30
			for i := 5 * cols; i < 6*cols; i++ {
				x[i] *= 1e-30
			}
			want := make([]byte, nb*n*xbP)
			level = levelGo
			quantizeActsP(typ, want, x, cols, n)
			level = cpuLevel
			forEachLevel(t, func(t *testing.T) {
				got := make([]byte, nb*n*xbP)
				quantizeActsP(typ, got, x, cols, n)
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("%s nb %d: byte %d (block %d, offset %d) = %#x, want %#x", typ, nb, i, i/xbP, i%xbP, got[i], want[i])
					}
				}
			})
		}
	}
}
