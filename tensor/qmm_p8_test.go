package tensor

import (
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
		rows, cols, n := 40, 4*QK_K, 11
		m := randMatrix(t, r, typ, rows, cols)
		x := randF32(r, n*cols)
		want := make([]float32, n*rows)
		m.matmulRef(want, x, n)
		rms := func(got []float32) float64 {
			var e, s float64
			for i := range got {
				d := float64(got[i] - want[i])
				e += d * d
				s += float64(want[i]) * float64(want[i])
			}
			return math.Sqrt(e / s)
		}
		got := make([]float32, n*rows)
		matMulQ8P(qp8Go[typ], m, got, x, n)
		rel := rms(got)
		m.MatMul(got, x, n)
		t.Logf("%s: relative RMS error %.3g (MatMul %.3g)", typ, rel, rms(got))
		if rel > 0.01 {
			t.Errorf("%s: relative RMS error %.3g", typ, rel)
		}
	}
}
