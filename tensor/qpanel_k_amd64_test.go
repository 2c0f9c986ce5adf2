//go:build amd64 && !purego

package tensor

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestKPanelKernels: the one-token panel kernels give, row for row, the
// bits of the Go twin of the rows kernels (qrowsGo of the 1×1 kernel) on
// the same rows stored row-major, for several widths and panel counts,
// random raw and quantized blocks, extreme block scales, and activations
// of large and small magnitudes.
func TestKPanelKernels(t *testing.T) {
	if !(cpuLevel >= levelAVX512 && cpuVNNI) {
		t.Skip("no AVX-512 VNNI")
	}
	r := rand.New(rand.NewPCG(31, 32))
	// f16 scales: largest, smallest subnormal, zero, -0, infinity, a NaN,
	// and ordinary ones
	extreme := []uint16{0x7bff, 0xfbff, 0x0001, 0x8001, 0x0000, 0x8000, 0x7c00, 0x7e00, 0x3c00, 0x0400}
	for _, typ := range []DType{Q4_K, Q6_K} {
		bb := typ.BlockBytes()
		dOffs := []int{0, 2}
		if typ == Q6_K {
			dOffs = []int{208}
		}
		for _, nb := range []int{0, 1, 2, 3, 8, 22} {
			for _, panels := range []int{1, 3} {
				for variant := 0; variant < 4; variant++ {
					rows, cols := 16*panels, max(nb, 1)*QK_K
					var m *Matrix
					if variant%2 == 0 {
						m = randRawMatrix(r, typ, rows, cols)
					} else {
						m = randMatrix(t, r, typ, rows, cols)
					}
					if variant >= 2 {
						for b := 0; b < len(m.Data)/bb; b++ {
							if r.IntN(3) == 0 {
								for _, o := range dOffs {
									binary.LittleEndian.PutUint16(m.Data[b*bb+o:], extreme[r.IntN(len(extreme))])
								}
							}
						}
					}
					for _, mag := range []float64{1, 1e30, 1e-30, 1e-42} {
						x := randF32(r, cols)
						for i := range x {
							x[i] *= float32(mag)
						}
						x[r.IntN(cols)] = 0
						x[r.IntN(cols)] *= 1000
						act := make([]byte, max(nb, 1)*xbK)
						quantizeActs(typ, act, x, cols, [][2]int{{0, 1}})
						want := make([]float32, rows)
						qrowsGo(qkernGo(typ, 1, 1))(ptr(m.Data), m.rowBytes, ptr(act), nb, &want[0], rows)
						pan := toQPanels(m.Data, rows, nb, bb)
						got := make([]float32, rows+1)
						got[rows] = 42 // must stay
						qpanelV[typ](ptr(pan), ptr(act), nb, &got[0], panels)
						for i := 0; i < rows; i++ {
							if !sameBits(got[i], want[i]) {
								t.Fatalf("%s nb %d panels %d variant %d mag %g: row %d = %g (%#x), want %g (%#x)",
									typ, nb, panels, variant, mag, i, got[i], f32bits(got[i]), want[i], f32bits(want[i]))
							}
						}
						if got[rows] != 42 {
							t.Fatalf("%s nb %d panels %d: wrote past the end", typ, nb, panels)
						}
					}
				}
			}
		}
	}
}

func f32bits(f float32) uint32 { return *(*uint32)(unsafe.Pointer(&f)) }

// BenchmarkKPanelRows: the one-token K-quant kernels on one thread, the
// rows kernels (qQ4_KVrows, qQ6_KVrows) over row-major matrices against
// the panel kernels over the same bytes taken as panels (the arithmetic
// does not depend on the values), in GB/s of weights. "mem": matrices of
// ~200 MB in all, taken in turn (from memory); "cache": one 256×2048
// matrix (in L2). Alternate runs with -count: the host's memory bandwidth
// flips between states.
func BenchmarkKPanelRows(b *testing.B) {
	if !(cpuLevel >= levelAVX512 && cpuVNNI) {
		b.Skip("no AVX-512 VNNI")
	}
	rowsK := map[DType]qrowsFunc{Q4_K: qQ4_KVrows, Q6_K: qQ6_KVrows}
	r := rand.New(rand.NewPCG(5, 6))
	for _, typ := range []DType{Q4_K, Q6_K} {
		for _, sh := range []struct {
			name       string
			rows, cols int
			total      int
		}{{"mem/5632x2048", 5632, 2048, 200 << 20}, {"mem/2048x5632", 2048, 5632, 200 << 20}, {"cache/256x2048", 256, 2048, 0}} {
			nb := sh.cols / QK_K
			mb := sh.rows * nb * typ.BlockBytes()
			n := max(1, sh.total/mb)
			data := make([]byte, n*mb)
			for i := 0; i < len(data); i += 8 {
				binary.LittleEndian.PutUint64(data[i:], r.Uint64())
			}
			bb := typ.BlockBytes()
			for i := 0; i < len(data); i += bb { // finite scales
				if typ == Q6_K {
					binary.LittleEndian.PutUint16(data[i+208:], 0x2000)
				} else {
					binary.LittleEndian.PutUint16(data[i:], 0x2000)
					binary.LittleEndian.PutUint16(data[i+2:], 0x2000)
				}
			}
			x := randF32(r, sh.cols)
			act := make([]byte, nb*xbK)
			quantizeActs(typ, act, x, sh.cols, [][2]int{{0, 1}})
			out := make([]float32, sh.rows)
			for _, kind := range []string{"rows", "panel"} {
				b.Run(fmt.Sprintf("%s/%s/%s", typ, sh.name, kind), func(b *testing.B) {
					b.SetBytes(int64(mb))
					i := 0
					for b.Loop() {
						w := ptr(data[i*mb:])
						if kind == "rows" {
							rowsK[typ](w, nb*bb, ptr(act), nb, &out[0], sh.rows)
						} else {
							qpanelV[typ](w, ptr(act), nb, &out[0], sh.rows/16)
						}
						if i++; i == n {
							i = 0
						}
					}
				})
			}
		}
	}
}
