//go:build amd64 && !purego

package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func hasQPanel() bool { return cpuLevel >= levelAVX512 && cpuVNNI }

// toQPanels rearranges rows (a multiple of 16) of nb blocks of bb bytes,
// row by row in data, into 16-row panels: panel p at p·16·nb·bb, its tile
// b at +b·16·bb, row j's block b at +j·bb.
func toQPanels(data []byte, rows, nb, bb int) []byte {
	out := make([]byte, len(data))
	for r := 0; r < rows; r++ {
		p, j := r/16, r%16
		for b := 0; b < nb; b++ {
			dst := p*16*nb*bb + b*16*bb + j*bb
			copy(out[dst:dst+bb], data[(r*nb+b)*bb:])
		}
	}
	return out
}

// qpanelActs quantizes one random token of nb blocks of 32 for weights of
// type typ, its blocks at magnitudes from tiny (subnormal scales) to huge,
// some zero.
func qpanelActs(r *rand.Rand, typ DType, nb int) []byte {
	x := randF32(r, nb*32)
	scales := []float32{1, 1, 1e-3, 1e3, 1e-38, 1e-30, 1e20, 1e30, 0}
	for b := 0; b < nb; b++ {
		s := scales[r.IntN(len(scales))]
		for i := 32 * b; i < 32*b+32; i++ {
			x[i] *= s
		}
		if r.IntN(8) == 0 { // one lane of four values at its own scale
			l := r.IntN(8)
			for i := 32*b + 4*l; i < 32*b+4*l+4; i++ {
				x[i] *= 1e6
			}
		}
	}
	act := make([]byte, nb*xb32)
	quantizeActs(typ, act, x, nb*32, [][2]int{{0, 1}})
	return act
}

// qpanelWeights makes rows random row-major blocks of type typ: random
// quants, scales mostly N(0, 0.01), some any finite half float (tiny,
// subnormal, large).
func qpanelWeights(r *rand.Rand, typ DType, rows, nb int) []byte {
	bb := typ.BlockBytes()
	data := make([]byte, rows*nb*bb)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	for b := 0; b < rows*nb; b++ {
		h := F32ToF16(float32(r.NormFloat64() * 0.01))
		if r.IntN(6) == 0 {
			h = uint16(r.Uint32())
			if h&0x7c00 == 0x7c00 {
				h &^= 0x4000 // finite
			}
		}
		binary.LittleEndian.PutUint16(data[b*bb:], h)
	}
	return data
}

// TestQPanelKernels: the panel kernels give the rows kernels' Go twin
// (qrows2Go over the row-major matrix) bit for bit.
func TestQPanelKernels(t *testing.T) {
	if !hasQPanel() {
		t.Skip("no AVX-512 VNNI")
	}
	r := rand.New(rand.NewPCG(21, 22))
	for _, typ := range []DType{Q8_0, Q4_0} {
		bb := typ.BlockBytes()
		for _, nb := range []int{1, 2, 3, 4, 7, 64, 65} {
			for _, panels := range []int{1, 3} {
				for rep := 0; rep < 3; rep++ {
					rows := 16 * panels
					data := qpanelWeights(r, typ, rows, nb)
					act := qpanelActs(r, typ, nb)
					if rep == 1 {
						for b := 0; b < nb-1; b++ { // the rest of row 3 adds +0
							blk := data[(3*nb+b)*bb : (3*nb+b+1)*bb]
							for i := range blk {
								blk[i] = 0
								if typ == Q4_0 && i >= 2 {
									blk[i] = 0x88
								}
							}
						}
						qpanelInfBlock(typ, data[(3*nb+nb-1)*bb:(3*nb+nb)*bb], act[(nb-1)*xb32:nb*xb32])
					}
					want := make([]float32, rows)
					qrows2Go(typ)(ptr(data), nb*bb, ptr(act), nb, &want[0], rows)
					if rep == 1 && !math.IsInf(float64(want[3]), 1) {
						t.Fatalf("%s nb=%d: row 3 = %g, want +Inf", typ, nb, want[3])
					}
					if rep == 0 { // the rows kernel agrees too
						got := make([]float32, rows)
						quantKernV[typ].rows(ptr(data), nb*bb, ptr(act), nb, &got[0], rows)
						checkQPanel(t, fmt.Sprintf("%s rows nb=%d", typ, nb), got, want)
					}
					pd := toQPanels(data, rows, nb, bb)
					kerns := []qpanelFunc{qpanelKern(typ)}
					if typ == Q4_0 && cpuGFNI { // the kernel for CPUs without GFNI too
						kerns = append(kerns, qQ4_0VpanelBW)
					}
					for i, k := range kerns {
						got := make([]float32, rows+1)
						got[rows] = 42 // must stay
						k(ptr(pd), ptr(act), nb, &got[0], panels)
						if got[rows] != 42 {
							t.Fatalf("%s nb=%d panels=%d: wrote past the end", typ, nb, panels)
						}
						checkQPanel(t, fmt.Sprintf("%s nb=%d panels=%d rep=%d kernel %d", typ, nb, panels, rep, i), got[:rows], want)
					}
				}
			}
		}
	}
}

// qpanelInfBlock makes w, a weight block, give +∞ with the activation
// block x in every lane: dw = +∞ and each weight the sign of its value of
// x, x's scales made non-zero. A kernel must add the block to its own
// lanes only: 0·∞ in others would be NaN.
func qpanelInfBlock(typ DType, w, x []byte) {
	binary.LittleEndian.PutUint16(w, 0x7c00)
	for l := 0; l < 8; l++ {
		if f32at(x[xb32D+4*l:]) == 0 {
			binary.LittleEndian.PutUint32(x[xb32D+4*l:], math.Float32bits(0.5))
		}
		if x[4*l] == 0 && x[4*l+1] == 0 && x[4*l+2] == 0 && x[4*l+3] == 0 {
			x[4*l] = 1
		}
	}
	corr := int32(128)
	if typ == Q4_0 {
		corr = 8
	}
	for l := 0; l < 8; l++ {
		var s int32
		for e := 4 * l; e < 4*l+4; e++ {
			s += int32(int8(x[e]))
		}
		binary.LittleEndian.PutUint32(x[xb32Corr+4*l:], uint32(-corr*s))
	}
	for e := 0; e < 32; e++ {
		q := int8(0)
		switch v := int8(x[e]); {
		case v > 0:
			q = 1
		case v < 0:
			q = -1
		}
		if typ == Q8_0 {
			w[2+e] = byte(q)
			continue
		}
		n := byte(q + 8)
		if e < 16 {
			w[2+e] = w[2+e]&0xf0 | n
		} else {
			w[2+e-16] = w[2+e-16]&0x0f | n<<4
		}
	}
}

func checkQPanel(t *testing.T, name string, got, want []float32) {
	t.Helper()
	finite := 0
	for _, v := range want {
		if v != 0 && !math.IsInf(float64(v), 0) && v == v {
			finite++
		}
	}
	if 2*finite < len(want) { // the test data must mostly stay in range
		t.Fatalf("%s: only %d of %d results finite and not zero", name, finite, len(want))
	}
	for i := range want {
		if !sameBits(got[i], want[i]) {
			t.Fatalf("%s: out[%d] = %g (%#08x), want %g (%#08x)", name, i,
				got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// BenchmarkPanelRows: one token times a Q8_0 or Q4_0 matrix from memory:
// the rows kernel over row-major data against the panel kernel over the
// panel layout, single threaded, and the panel kernel on two threads (the
// panels split in two halves by Parallel) (b.SetBytes: weight bytes; MB/s
// is their rate). Enough matrices to pass ~200 MB, taken in turn, so that
// the weights come from memory, not the caches.
func BenchmarkPanelRows(b *testing.B) {
	if !hasQPanel() {
		b.Skip("no AVX-512 VNNI")
	}
	for _, typ := range []DType{Q8_0, Q4_0} {
		for _, shape := range [][2]int{{5632, 2048}, {2048, 5632}} {
			benchQPanel(b, typ, shape[0], shape[1], 200<<20, qpanelKern(typ), true)
		}
	}
}

// BenchmarkPanelCache: as BenchmarkPanelRows, single threaded, over one
// 256×2048 matrix (Q8_0: 272 KiB), which stays in the caches: the kernels'
// compute rate.
func BenchmarkPanelCache(b *testing.B) {
	if !hasQPanel() {
		b.Skip("no AVX-512 VNNI")
	}
	for _, typ := range []DType{Q8_0, Q4_0} {
		benchQPanel(b, typ, 256, 2048, 0, qpanelKern(typ), false)
	}
}

// benchQPanel runs the rows kernel and the panel kernel panelK over
// matrices of rows×cols of type typ, as many as pass total bytes (at least
// one), in turn; two adds the panel kernel on two threads.
func benchQPanel(b *testing.B, typ DType, rows, cols, total int, panelK qpanelFunc, two bool) {
	nb, bb := cols/32, typ.BlockBytes()
	size := rows * nb * bb
	count := max(1, total/size)
	r := rand.New(rand.NewPCG(1, 2))
	one := qpanelWeights(r, typ, rows, nb)
	rowMats := make([][]byte, count)
	panelMats := make([][]byte, count)
	pd := toQPanels(one, rows, nb, bb)
	for i := range rowMats {
		rowMats[i] = append([]byte(nil), one...)
		panelMats[i] = append([]byte(nil), pd...)
	}
	act := qpanelActs(r, typ, nb)
	out := make([]float32, rows)
	rowsK := quantKernV[typ].rows
	name := fmt.Sprintf("%s/%dx%d", typ, rows, cols)
	b.Run(name+"/rows", func(b *testing.B) {
		b.SetBytes(int64(size))
		for i := 0; i < b.N; i++ {
			rowsK(ptr(rowMats[i%count]), nb*bb, ptr(act), nb, &out[0], rows)
		}
	})
	b.Run(name+"/panel", func(b *testing.B) {
		b.SetBytes(int64(size))
		for i := 0; i < b.N; i++ {
			panelK(ptr(panelMats[i%count]), ptr(act), nb, &out[0], rows/16)
		}
	})
	if !two {
		return
	}
	b.Run(name+"/panel2t", func(b *testing.B) {
		panels := rows / 16
		b.SetBytes(int64(size))
		for i := 0; i < b.N; i++ {
			m := panelMats[i%count]
			Parallel(panels, (panels+1)/2, func(lo, hi int) {
				panelK(ptr(m[lo*16*nb*bb:]), ptr(act), nb, &out[16*lo], hi-lo)
			})
		}
	})
}
