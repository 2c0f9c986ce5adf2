package tensor

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// BenchmarkMatMulBatch: decode-batch sizes over four 5632×2048 matrices
// used in turn (more than the L3 cache for quantized types too), the
// kernel set in use. (K-quants: random blocks, as quantizing takes
// seconds; F16p: F16 in 16-row panels, as NewPanelMatrix lays them out.)
func BenchmarkMatMulBatch(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	// A name ending in p: the same matrices in 16-row panels.
	for _, name := range []string{"Q8_0", "Q8_0p", "Q4_0", "Q4_0p", "F16", "F16p", "Q4_K", "Q4_Kp", "Q6_K", "Q6_Kp"} {
		base, panels := strings.CutSuffix(name, "p")
		typ, _ := ParseDType(base)
		var ms []*Matrix
		for _, n := range []int{1, 2, 4, 8, 16, 32} {
			b.Run(fmt.Sprintf("%s/n=%d", name, n), func(b *testing.B) {
				if ms == nil {
					for range 4 {
						var m *Matrix
						switch typ {
						case Q4_K, Q6_K:
							m = randRawMatrix(r, typ, 5632, 2048)
						default:
							m = randMatrix(b, r, typ, 5632, 2048)
						}
						if panels {
							p, err := newPanelMatrix(typ, 5632, 2048, m.Data)
							if err != nil || p.panels == 0 {
								b.Fatalf("%s: no panels (%v)", name, err)
							}
							m = p
						}
						ms = append(ms, m)
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
