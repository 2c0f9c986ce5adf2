package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// kpMatMulGo is MatMul through the K-quant kernels' Go twins (kpTiles
// with kpGo), whatever the level.
func kpMatMulGo(m *Matrix, dst, x []float32, n int) {
	act := make([]byte, m.Cols/QK_K*n*xbK)
	level = levelGo
	quantizeActsK(act, x, m.Cols, n)
	level = cpuLevel
	m.kpTiles(kpGo[m.Type], dst, act, n, 0, m.Rows/kpRows)
}

// TestKPAccuracy: the Go twins against the float product of the
// dequantized weights, within 1% relative RMS error as
// TestQuantMatMulAccuracy (the error is that of the 8-bit activations,
// one scale per 256 values, as the 4-row tiles'; their MatMul error is
// logged for comparison).
func TestKPAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, typ := range []DType{Q4_K, Q6_K} {
		checkAccuracy(t, r, typ, 48, kpMatMulGo, func(m *Matrix, dst, x []float32, n int) {
			m.matmulQuant(quantKern(m.Type), dst, x, n)
		}, "4-row tiles")
	}
}

// TestKPTokenCounts: MatMul of Q4_K and Q6_K matrices (rows multiples of
// 16) at token counts that split into groups of every size, with Inf,
// NaN, huge and zero activation rows at some, at every level, bit for bit
// against the Go twins' path.
func TestKPTokenCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, typ := range []DType{Q4_K, Q6_K} {
		for _, nb := range []int{1, 2, 9} {
			m := randMatrix(t, r, typ, 32, nb*QK_K)
			if nb == 2 {
				m = randRawMatrix(r, typ, 48, nb*QK_K)
			}
			for _, n := range []int{2, 3, 5, 7, 8, 9, 12, 16, 17, 23, 35} {
				x := randF32(r, n*m.Cols)
				if n%2 == 1 {
					c := m.Cols
					x[r.IntN(c)] = float32(math.Inf(-1))
					x[c+r.IntN(c)] = float32(math.NaN())
					x[2*c+r.IntN(c)] *= 1e30
				}
				if n == 12 {
					clear(x[m.Cols : 2*m.Cols])
				}
				want := make([]float32, n*m.Rows)
				kpMatMulGo(m, want, x, n)
				// where kpApplies is false, the 4-row tiles run (TestQuantMatMulExact)
				matMulEachLevel(t, fmt.Sprintf("%s nb %d", typ, nb), m, x, n, want, func() bool { return !m.kpApplies(n) })
			}
		}
	}
}

// TestKPMany: MatMulMany over Q4_K and Q6_K matrices of the K-quant
// kernels (one set of activations for both) beside the 4-row tiles'
// (rows not a multiple of 16) and the 8-row kernels', bit for bit
// against each matrix's MatMul, at every level and thread count.
func TestKPMany(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	const cols = 512
	ws := []*Matrix{randMatrix(t, r, Q4_K, 32, cols), randMatrix(t, r, Q6_K, 16, cols), randMatrix(t, r, Q4_K, 40, cols),
		randMatrix(t, r, Q8_0, 16, cols), randMatrix(t, r, Q6_K, 64, cols), randMatrix(t, r, F32, 5, cols)}
	forEachLevel(t, func(t *testing.T) {
		defer func(th int) { Threads = th }(Threads)
		for _, n := range []int{2, 3, 8, 9, 16, 21} {
			x := randF32(r, n*cols)
			for _, th := range []int{1, 3} {
				Threads = th
				checkManyVsMatMul(t, fmt.Sprintf("n=%d threads=%d", n, th), ws, x, n)
			}
		}
	})
}
