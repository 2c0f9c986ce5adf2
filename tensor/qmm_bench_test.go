//go:build amd64 && !purego

package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// BenchmarkQuantTile: the AVX-512 prefill tile kernels alone, one thread,
// on a 64-row × 2048-column weight panel and one token group that stay in
// L2 (the kernels' arithmetic, not the memory).
func BenchmarkQuantTile(b *testing.B) {
	if !cpuVNNI || cpuLevel < levelAVX512 {
		b.Skip("no AVX-512 VNNI")
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		t          DType
		rows, cols int
	}{{Q8_0, 64, 2048}, {Q8_0, 16, 512}, {Q4_0, 64, 2048}} {
		t, rows, cols := c.t, c.rows, c.cols
		k := quantKernV[t]
		nb := cols / 32
		bb := t.BlockBytes()
		w := make([]byte, rows*nb*bb)
		for i := range w {
			w[i] = byte(r.Uint32())
		}
		for i := 0; i < rows*nb; i++ {
			binary.LittleEndian.PutUint16(w[i*bb:], 0x2c00+uint16(r.IntN(256)))
		}
		x := make([]byte, nb*k.tp*xb32)
		for i := range x {
			x[i] = byte(r.Uint32())
		}
		for i := 0; i < nb*k.tp; i++ {
			for l := 0; l < 8; l++ {
				binary.LittleEndian.PutUint32(x[i*xb32+xb32Corr+4*l:], uint32(int32(r.IntN(1000)-500)))
				binary.LittleEndian.PutUint32(x[i*xb32+xb32D+4*l:], math.Float32bits(0.01+r.Float32()))
			}
		}
		acc := make([]float32, k.rp*k.tp*8)
		b.Run(fmt.Sprintf("%s/%dx%d", t, rows, cols), func(b *testing.B) {
			for b.Loop() {
				for i := 0; i < rows; i += k.rp {
					k.pre(unsafe.Pointer(&w[i*nb*bb]), nb*bb, unsafe.Pointer(&x[0]), nb, &acc[0], 0)
				}
			}
			b.ReportMetric(float64(b.N)*float64(k.tp*rows*cols)/b.Elapsed().Seconds()/1e9, "GMAC/s")
		})
	}
}

// BenchmarkQuantRows: the quantized types' integer kernels alone, one
// thread, on 64 rows × 2048 columns that stay in L2 (the kernels'
// arithmetic, not the memory): the decode rows kernel (one token) and the
// prefill tile (rp×tp), per kernel set (go: the twins). GMAC/s counts
// weights × tokens.
func BenchmarkQuantRows(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	const rows, cols = 64, 2048
	for _, t := range []DType{Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL} {
		m := randRawMatrix(r, t, rows, cols)
		nb := cols / t.BlockSize()
		for l := levelGo; l <= cpuLevel; l++ {
			level = l
			k := quantKern(t)
			level = cpuLevel
			_, xb := actLayout(t)
			act := make([]byte, k.tp*nb*xb)
			quantizeActs(t, act, randF32(r, k.tp*cols), cols, [][2]int{{0, k.tp}})
			out := make([]float32, rows)
			acc := make([]float32, k.rp*k.tp*8)
			b.Run(fmt.Sprintf("%s/rows/%s", t, l), func(b *testing.B) {
				for b.Loop() {
					k.rows(ptr(m.Data), m.rowBytes, ptr(act), nb, &out[0], rows)
				}
				b.ReportMetric(float64(b.N)*rows*cols/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
			b.Run(fmt.Sprintf("%s/tile/%s", t, l), func(b *testing.B) {
				for b.Loop() {
					for i := 0; i < rows; i += k.rp {
						k.pre(unsafe.Pointer(&m.Data[i*m.rowBytes]), m.rowBytes, ptr(act), nb, &acc[0], 0)
					}
				}
				b.ReportMetric(float64(b.N)*float64(k.tp*rows*cols)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}
