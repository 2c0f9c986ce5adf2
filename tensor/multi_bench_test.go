package tensor

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkMatMulBatch: decode-batch sizes over four 5632×2048 matrices
// used in turn (more than the L3 cache for quantized types too), the
// kernel set in use. (K-quants: random blocks, as quantizing takes
// seconds.)
func BenchmarkMatMulBatch(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, typ := range []DType{Q8_0, Q4_0, F16, Q4_K, Q6_K} {
		var ms []*Matrix
		for _, n := range []int{1, 2, 4, 8, 16, 32} {
			b.Run(fmt.Sprintf("%s/n=%d", typ, n), func(b *testing.B) {
				if ms == nil {
					for range 4 {
						if typ == Q4_K || typ == Q6_K {
							ms = append(ms, randRawMatrix(r, typ, 5632, 2048))
						} else {
							ms = append(ms, randMatrix(b, r, typ, 5632, 2048))
						}
					}
				}
				x := randF32(r, n*2048)
				dst := make([]float32, n*5632)
				i := 0
				for b.Loop() {
					ms[i%4].MatMul(dst, x, n)
					i++
				}
				b.ReportMetric(float64(b.N)*float64(n)*5632*2048/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}
