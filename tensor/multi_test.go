package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestMatMulMany: MatMulMany equals a MatMul per matrix bit for bit, for
// every weight type alone and in mixes (Q4_K_M mixes Q4_K and Q6_K; Q8_0
// and Q4_0 quantize differently; floats beside quantized), at every
// kernel level, batch sizes from decode to prefill tiles with tails, row
// counts with tails, one and several threads.
func TestMatMulMany(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const cols = 512
	all := []DType{F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K}
	mats := map[DType][]*Matrix{}
	for _, typ := range all {
		for _, rows := range []int{37, 8, 130, 48} { // 48: the 16-row K-quant kernels
			mats[typ] = append(mats[typ], randMatrix(t, r, typ, rows, cols))
		}
	}
	sets := map[string][]*Matrix{}
	for _, typ := range all {
		sets[typ.String()] = mats[typ]
	}
	sets["Q4_K_M"] = []*Matrix{mats[Q4_K][0], mats[Q4_K][1], mats[Q6_K][2]}
	sets["Q4_K_M 16-row"] = []*Matrix{mats[Q4_K][3], mats[Q6_K][3], mats[Q4_K][0], mats[Q6_K][1]}
	sets["Q6_K+Q4_K"] = []*Matrix{mats[Q6_K][0], mats[Q4_K][2]}
	sets["Q8_0+Q4_0"] = []*Matrix{mats[Q8_0][2], mats[Q4_0][0], mats[Q8_0][1]}
	sets["every type"] = []*Matrix{mats[Q4_0][0], mats[F16][1], mats[Q4_K][2], mats[Q8_0][0], mats[F32][1], mats[Q6_K][0], mats[BF16][2]}
	sets["F16+BF16"] = []*Matrix{mats[F16][0], mats[BF16][1], mats[F16][2]} // one vector: one region, two kernels
	sets["one"] = []*Matrix{mats[Q8_0][1]}
	forEachLevel(t, func(t *testing.T) {
		defer func(th int) { Threads = th }(Threads)
		for name, ws := range sets {
			for _, n := range []int{1, 2, 3, 4, 5, 8, 13, 17} {
				x := randF32(r, n*cols)
				x[r.IntN(len(x))] *= 1000 // one large value in a block
				for _, th := range []int{1, 2, 3} {
					Threads = th
					checkManyVsMatMul(t, fmt.Sprintf("%s n=%d threads=%d", name, n, th), ws, x, n)
				}
			}
		}
	})
}

func TestMatMulManyShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	a, b := randMatrix(t, r, Q8_0, 4, 64), randMatrix(t, r, Q8_0, 4, 96)
	x := randF32(r, 96)
	MatMulMany(nil, nil, x, 1) // nothing to do
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"count", func() { MatMulMany([][]float32{make([]float32, 4)}, []*Matrix{a, a}, x, 1) }},
		{"cols", func() { MatMulMany([][]float32{make([]float32, 4), make([]float32, 4)}, []*Matrix{a, b}, x, 1) }},
		{"dst", func() { MatMulMany([][]float32{make([]float32, 3)}, []*Matrix{a}, x, 1) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", c.name)
				}
			}()
			c.f()
		}()
	}
}

// BenchmarkMatMulMany: a TinyLlama layer's Wq, Wk, Wv (2048, 256, 256 ×
// 2048) and W_gate, W_up (5632 × 2048), as separate MatMuls and as two
// MatMulMany calls.
func BenchmarkMatMulMany(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, typ := range []DType{Q8_0, Q4_K, F16} {
		var ws []*Matrix
		for _, n := range []int{1, 16, 128} {
			for _, many := range []bool{false, true} {
				b.Run(fmt.Sprintf("%s/n=%d/many=%v", typ, n, many), func(b *testing.B) {
					if ws == nil {
						for _, rows := range []int{2048, 256, 256, 5632, 5632} {
							ws = append(ws, randMatrix(b, r, typ, rows, 2048))
						}
					}
					x := randF32(r, n*2048)
					dst := make([][]float32, len(ws))
					for i, w := range ws {
						dst[i] = make([]float32, n*w.Rows)
					}
					for b.Loop() {
						if many {
							MatMulMany(dst[:3], ws[:3], x, n)
							MatMulMany(dst[3:], ws[3:], x, n)
						} else {
							for i, w := range ws {
								w.MatMul(dst[i], x, n)
							}
						}
					}
				})
			}
		}
	}
}

// TestQuantRowsBlocks: matrices larger than quantBlockBytes per worker,
// multiplied block by block, give every row what the row's tile alone
// gives (the same kernels), for token counts with and without single
// tokens, at every level, one and two threads.
func TestQuantRowsBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, typ := range []DType{Q8_0, Q4_0, Q4_K, Q6_K} {
		m := randMatrix(t, r, typ, 301, 2048)
		if quantBlockBytes/m.rowBytes >= m.Rows/2 {
			t.Fatalf("%s: %d rows fit in one block", typ, m.Rows)
		}
		forEachLevel(t, func(t *testing.T) {
			defer func(th int) { Threads = th }(Threads)
			qk := quantKern(typ)
			for _, n := range []int{2, 3, 4, 5, 9, 16} {
				x := randF32(r, n*m.Cols)
				a := quantizeFor(typ, qk, x, m.Cols, n)
				want := make([]float32, n*m.Rows)
				for r0 := 0; r0 < m.Rows; r0 += quantRowTile {
					m.quantRows(qk, want, &a, r0, min(r0+quantRowTile, m.Rows))
				}
				a.release()
				for _, th := range []int{1, 2} {
					Threads = th
					got := make([]float32, n*m.Rows)
					m.MatMul(got, x, n)
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s n=%d threads=%d: [%d] = %v, tile alone %v", typ, n, th, i, got[i], want[i])
						}
					}
				}
			}
		})
	}
}
