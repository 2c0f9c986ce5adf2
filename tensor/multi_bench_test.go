package tensor

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkMatMulBatch: decode-batch sizes over four 5632×2048 matrices
// used in turn (more than the L3 cache for quantized types too), the
// kernel set in use. (K-quants: random blocks, as quantizing takes
// seconds; F16p: F16 in 16-row panels, as NewPanelMatrix lays them out.)
func BenchmarkMatMulBatch(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, name := range []string{"Q8_0", "Q4_0", "F16", "F16p", "Q4_K", "Q6_K"} {
		typ, _ := ParseDType(name)
		var ms []*Matrix
		for _, n := range []int{1, 2, 4, 8, 16, 32} {
			b.Run(fmt.Sprintf("%s/n=%d", name, n), func(b *testing.B) {
				if ms == nil {
					for range 4 {
						switch name {
						case "Q4_K", "Q6_K":
							ms = append(ms, randRawMatrix(r, typ, 5632, 2048))
						case "F16p":
							m := randMatrix(b, r, F16, 5632, 2048)
							p, err := newPanelMatrix(F16, 5632, 2048, m.Data)
							if err != nil {
								b.Fatal(err)
							}
							ms = append(ms, p)
						default:
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
