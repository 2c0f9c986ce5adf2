package tensor

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkMatMul: TinyLlama-shaped matrices (ffn_up: 5632×2048) at decode
// (n=1), batched decode (n=16) and prefill (n=64) sizes, per kernel set.
// Bytes/s is weight bytes read per second.
func BenchmarkMatMul(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, typ := range []DType{F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS} {
		var m *Matrix // made on first use: quantizing K-quants takes seconds
		for _, n := range []int{1, 16, 64} {
			for l := levelGo; l <= cpuLevel; l++ {
				if n > 1 && l == levelGo && testing.Short() {
					continue
				}
				b.Run(fmt.Sprintf("%s/n=%d/%s", typ, n, l), func(b *testing.B) {
					if m == nil {
						m = randMatrix(b, r, typ, 5632, 2048)
					}
					x := randF32(r, n*m.Cols)
					dst := make([]float32, n*m.Rows)
					level = l
					defer func() { level = cpuLevel }()
					b.SetBytes(int64(len(m.Data)))
					for b.Loop() {
						m.MatMul(dst, x, n)
					}
					b.ReportMetric(float64(b.N)*float64(n)*float64(m.Rows)*float64(m.Cols)/b.Elapsed().Seconds()/1e9, "GMAC/s")
				})
			}
		}
	}
}

func BenchmarkQuantizeActs(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, typ := range []DType{Q8_0, Q4_K} {
		n, cols := 64, 2048
		x := randF32(r, n*cols)
		_, xb := actLayout(typ)
		act := make([]byte, n*cols/typ.BlockSize()*xb)
		g := actGroups(n, 4)
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(int64(4 * n * cols))
			for b.Loop() {
				quantizeActs(typ, act, x, cols, g)
			}
		})
	}
}
