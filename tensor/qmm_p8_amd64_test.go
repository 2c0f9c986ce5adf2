//go:build amd64 && !purego

package tensor

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestQ8PKernels: the AVX-512 and AVX2 kernels against their Go twins,
// bit for bit, for every tile size (AVX2: 1..8, 16 and 32 tokens), block
// counts from 0, accumulating or not.
func TestQ8PKernels(t *testing.T) {
	sets := map[string]map[DType][]qp8Func{"avx2": qp8A}
	if cpuVNNI && cpuLevel >= levelAVX512 {
		sets["avx512"] = qp8V
	}
	if cpuLevel < levelAVX2 {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(11, 12))
	for name, set := range sets {
		testQ8PKernels(t, r, name, 8, set)
	}
	set16 := map[DType][]qp8Func{}
	for typ, k := range qp8A16 {
		set16[typ] = make([]qp8Func, 16)
		set16[typ][15] = k
	}
	testQ8PKernels(t, r, "avx2 16", 8, set16)
	set32 := map[DType][]qp8Func{}
	for typ, k := range qp8A32 {
		set32[typ] = make([]qp8Func, 32)
		set32[typ][31] = k
	}
	testQ8PKernels(t, r, "avx2 32", 8, set32)
	if cpuVNNI && cpuLevel >= levelAVX512 {
		set16 = map[DType][]qp8Func{}
		for typ, k := range qp8V16 {
			set16[typ] = make([]qp8Func, 16)
			set16[typ][15] = k
		}
		testQ8PKernels(t, r, "avx512 16", 8, set16)
		testQ8PKernels(t, r, "avx512 16-row", 16, qp16V)
		set16 = map[DType][]qp8Func{}
		for typ, k := range qp16V16 {
			set16[typ] = make([]qp8Func, 16)
			set16[typ][15] = k
		}
		testQ8PKernels(t, r, "avx512 16-row 16", 16, set16)
	}
}

func testQ8PKernels(t *testing.T, r *rand.Rand, name string, R int, set map[DType][]qp8Func) {
	for _, c := range []struct {
		typ DType
		nb  int
	}{{Q8_0, 0}, {Q8_0, 1}, {Q8_0, 2}, {Q8_0, 3}, {Q8_0, 7}, {Q8_0, 64}, {Q4_0, 0}, {Q4_0, 1}, {Q4_0, 2}, {Q4_0, 3}, {Q4_0, 5}, {Q4_0, 7}, {Q4_0, 64}} {
		typ, nb := c.typ, c.nb
		m := randMatrix(t, r, typ, 16, max(nb, 1)*32)
		bb := typ.BlockBytes()
		// the same rows in 16-row panels: the kernels step by 16 blocks
		p, err := newPanelMatrix(typ, 16, m.Cols, append([]byte(nil), m.Data...))
		if err != nil || p.panels != 1 {
			t.Fatalf("%s panel matrix: %d panels, %v", typ, p.panels, err)
		}
		for T := 1; T <= len(set[typ]); T++ {
			if set[typ][T-1] == nil {
				continue
			}
			n := T + r.IntN(3)
			x := randF32(r, n*m.Cols)
			x[r.IntN(len(x))] = 0
			act := make([]byte, max(nb, 1)*n*xbP)
			quantizeActsP(typ, act, x, m.Cols, n)
			for load := 0; load < 2; load++ {
				want := make([]float32, R*T)
				got := make([]float32, R*T)
				for i := range want {
					want[i] = float32(r.NormFloat64())
					got[i] = want[i]
				}
				start := append([]float32(nil), got...)
				ldw := m.Cols / 32 * bb
				qpTwin(typ, R, T)(unsafe.Pointer(&m.Data[0]), ldw, unsafe.Pointer(&act[0]), n*xbP, nb, &want[0], load, bb)
				for _, l := range []struct {
					name    string
					w       unsafe.Pointer
					ldw, bs int
				}{{"rows", unsafe.Pointer(&m.Data[0]), ldw, bb}, {"panel", p.rowAt(0), bb, 16 * bb}} {
					copy(got, start)
					set[typ][T-1](l.w, l.ldw, unsafe.Pointer(&act[0]), n*xbP, nb, &got[0], load, l.bs)
					for i := 0; i < R*T; i++ {
						if got[i] != want[i] {
							t.Fatalf("%s %s %s R %d nb %d T %d load %d: acc[%d] = %g, want %g", name, l.name, typ, R, nb, T, load, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

// BenchmarkQ8P: the 8-row kernels on a 5632×2048 Q8_0 matrix at n = 64
// (matMulQ8P, threads as MatMul) beside MatMul itself, and the tile
// kernels alone on a 64×2048 panel in L2, one thread (as
// BenchmarkQuantTile).
func BenchmarkQ8P(b *testing.B) {
	if !cpuVNNI || cpuLevel < levelAVX512 {
		b.Skip("no AVX-512 VNNI")
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, typ := range []DType{Q8_0, Q4_0} {
		benchQ8P(b, r, typ)
	}
}

func benchQ8P(b *testing.B, r *rand.Rand, typ DType) {
	m := randMatrix(b, r, typ, 5632, 2048)
	for _, n := range []int{1, 16, 64} {
		x := randF32(r, n*m.Cols)
		dst := make([]float32, n*m.Rows)
		gmac := func(b *testing.B) {
			b.ReportMetric(float64(b.N)*float64(n)*float64(m.Rows)*float64(m.Cols)/b.Elapsed().Seconds()/1e9, "GMAC/s")
		}
		for l := levelAVX2; l <= cpuLevel; l++ {
			b.Run(fmt.Sprintf("%s/MatMul/n=%d/%s", typ, n, l), func(b *testing.B) {
				level = l
				defer func() { level = cpuLevel }()
				for b.Loop() {
					m.MatMul(dst, x, n)
				}
				gmac(b)
			})
			b.Run(fmt.Sprintf("%s/P8/n=%d/%s", typ, n, l), func(b *testing.B) {
				level = l
				defer func() { level = cpuLevel }()
				for b.Loop() {
					matMulQ8P(m.p8Kernels(), m, dst, x, n)
				}
				gmac(b)
			})
		}
	}
	const rows, cols = 64, 2048
	nb := cols / 32
	bb := typ.BlockBytes()
	w := m.Data[:rows*nb*bb]
	x := randF32(r, 8*cols)
	act := make([]byte, nb*8*xbP)
	quantizeActsP(typ, act, x, cols, 8)
	var acc [64]float32
	b.Run(typ.String()+"/tile8x8", func(b *testing.B) {
		for b.Loop() {
			for i := 0; i < rows; i += 8 {
				qp8V[typ][7](unsafe.Pointer(&w[i*nb*bb]), nb*bb, unsafe.Pointer(&act[0]), 8*xbP, nb, &acc[0], 0, bb)
			}
		}
		b.ReportMetric(float64(b.N)*float64(8*rows*cols)/b.Elapsed().Seconds()/1e9, "GMAC/s")
	})
}
