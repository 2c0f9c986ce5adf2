package tensor

import (
	"sync"
	"unsafe"
)

// The float matrix product (F32, F16 and BF16 weights) runs on packed
// panels: 16 weight rows at a time are converted to float32 and transposed
// into P[k][16] (weight rows in SIMD lanes, panelK columns per panel), and a
// micro-kernel multiplies a panel by up to mr activation rows at once,
// packed as Xp[k][mr], accumulating C[t][16]. The panels of a half-float
// panel matrix (NewPanelMatrix) are stored that way already, as F16 or
// BF16 values: their kernels read them in place and convert as they load.
// Each lane adds its products one by one in k order: for F32 weights with
// a separate multiply and add (dotSeq: llama2.c's run.c), for half floats
// with a fused multiply-add (dotFMA), so the results are bit for bit those
// of the plain Go path.

const (
	panelRows = 16
	panelK    = 256 // columns per panel: 16 KiB of float32, L1-resident
)

type (
	kernFunc     func(p, xp *float32, k int, c *float32, load int)
	halfKernFunc func(p unsafe.Pointer, xp *float32, k int, c *float32, load int)
	packFunc     func(dst *float32, src unsafe.Pointer, ld int, ntiles int, tstride int)
)

type floatKernels struct {
	mr    int               // most activation rows per micro-kernel call
	kern  []kernFunc        // kern[m] handles m rows, 1 <= m <= mr: F32 weights
	kernF []kernFunc        // the same with FMA: half-float rows packed as float32
	half  [2][]halfKernFunc // the same with FMA over F16 and BF16 panels ([floatIndex-1])
	pack  [3]packFunc
}

func floatIndex(t DType) int {
	switch t {
	case F16:
		return 1
	case BF16:
		return 2
	}
	return 0
}

var floatBufs = sync.Pool{New: func() any { return new([]float32) }}

func getBuf(n int) *[]float32 {
	b := floatBufs.Get().(*[]float32)
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	*b = (*b)[:n]
	return b
}

// matmulFloat computes dst[t] = W·x[t] with the packed-panel kernels fk.
func (m *Matrix) matmulFloat(fk *floatKernels, dst, x []float32, n int) {
	xp, xbuf := packFor(fk, x, m.Cols, n)
	Parallel(m.blocks16(), floatGrain(m.Cols, n), func(lo, hi int) { m.floatRows(fk, dst, xp, n, lo, hi) })
	if xbuf != nil {
		floatBufs.Put(xbuf)
	}
}

// packFor returns x [n][cols] as the float kernels read it: x itself for
// one row, else packed (packActivations) into a pooled buffer, also
// returned for floatBufs.Put.
func packFor(fk *floatKernels, x []float32, cols, n int) ([]float32, *[]float32) {
	if n == 1 {
		return x[:cols], nil
	}
	xbuf := getBuf(n * cols)
	packActivations(*xbuf, x, n, cols, fk.mr)
	return *xbuf, xbuf
}

// blocks16 is the number of blocks of panelRows rows (the last may be
// shorter) that the float products and half-float decode split m into;
// floatGrain the blocks per parallel chunk, at least, for n rows of cols
// values.
func (m *Matrix) blocks16() int  { return (m.Rows + panelRows - 1) / panelRows }
func floatGrain(cols, n int) int { return max(1, 65536/(cols*n*panelRows)) }

// floatRows computes the blocks [lo, hi) of panelRows rows of dst[t] =
// W·x[t], from x packed by packFor.
func (m *Matrix) floatRows(fk *floatKernels, dst, xp []float32, n, lo, hi int) {
	cols, rows := m.Cols, m.Rows
	mr := fk.mr
	es, kern := 4, fk.kern
	if m.Type != F32 {
		es, kern = 2, fk.kernF // half floats: the fused kernels
	}
	pb := getBuf(panelK*panelRows + n*panelRows)
	panel, c := (*pb)[:panelK*panelRows], (*pb)[panelK*panelRows:]
	for b := lo; b < hi; b++ {
		r0 := b * panelRows
		nr := min(panelRows, rows-r0)
		inPanels := r0 < panelRows*m.panels
		for k0 := 0; k0 < cols; k0 += panelK {
			kk := min(panelK, cols-k0)
			if !inPanels {
				m.packPanel(fk, panel, r0, nr, k0, kk)
			}
			// Fetch the next panel's weights while this one computes.
			if nk := k0 + panelK; nk < cols {
				m.prefetchPanel(r0, nr, nk, min(panelK, cols-nk), es)
			} else if nr0 := r0 + panelRows; nr0 < rows && b+1 < hi {
				m.prefetchPanel(nr0, min(panelRows, rows-nr0), 0, min(panelK, cols), es)
			}
			load := 0
			if k0 > 0 {
				load = 1
			}
			for t0 := 0; t0 < n; t0 += mr {
				g := min(mr, n-t0)
				if inPanels {
					w := unsafe.Pointer(&m.Data[m.tileOffset(r0, k0)])
					fk.half[floatIndex(m.Type)-1][g](w, &xp[t0*cols+k0*g], kk, &c[t0*panelRows], load)
					continue
				}
				kern[g](&panel[0], &xp[t0*cols+k0*g], kk, &c[t0*panelRows], load)
			}
		}
		for t := 0; t < n; t++ {
			copy(dst[t*rows+r0:t*rows+r0+nr], c[t*panelRows:t*panelRows+nr])
		}
	}
	floatBufs.Put(pb)
}

// packActivations lays x [n][cols] out in groups of mr rows (the last group
// may be smaller), each group g of size s stored k-major: xp[t0*cols+k*s+j]
// = x[t0+j][k].
func packActivations(xp, x []float32, n, cols, mr int) {
	for t0 := 0; t0 < n; t0 += mr {
		s := min(mr, n-t0)
		g := xp[t0*cols : (t0+s)*cols]
		for j := 0; j < s; j++ {
			row := x[(t0+j)*cols : (t0+j+1)*cols]
			for k, v := range row {
				g[k*s+j] = v
			}
		}
	}
}

// packPanel writes rows r0..r0+nr-1, columns k0..k0+kk-1 of W as float32 to
// panel[k][16] (rows past nr are zero); rows stored row by row.
func (m *Matrix) packPanel(fk *floatKernels, panel []float32, r0, nr, k0, kk int) {
	es := 4
	if m.Type != F32 {
		es = 2
	}
	full := 0
	if nr == panelRows {
		full = kk / 16
		if full > 0 {
			fk.pack[floatIndex(m.Type)](&panel[0], unsafe.Pointer(&m.Data[r0*m.rowBytes+k0*es]), m.rowBytes, full, 16*es)
		}
	}
	for k := 16 * full; k < kk; k++ {
		p := panel[k*panelRows : (k+1)*panelRows]
		for r := 0; r < panelRows; r++ {
			if r >= nr {
				p[r] = 0
				continue
			}
			off := (r0+r)*m.rowBytes + (k0+k)*es
			switch m.Type {
			case F32:
				p[r] = m.f32[(r0+r)*m.Cols+k0+k]
			case F16:
				p[r] = F16ToF32(le16(m.Data[off:]))
			default:
				p[r] = BF16ToF32(le16(m.Data[off:]))
			}
		}
	}
}

// prefetchPanel fetches the weights of rows r0..r0+nr-1, columns
// k0..k0+kk-1 (values of es bytes) while the current panel computes.
func (m *Matrix) prefetchPanel(r0, nr, k0, kk, es int) {
	if r0 < panelRows*m.panels {
		prefetch(unsafe.Pointer(&m.Data[m.tileOffset(r0, k0)]), 512, kk/16, 512)
		return
	}
	prefetch(unsafe.Pointer(&m.Data[r0*m.rowBytes+k0*es]), m.rowBytes, nr, kk*es)
}

// matvecHalf computes dst = W·x for F16 or BF16 weights in Dot's order per
// row: panels of a panel matrix with the panel kernel (at other levels than
// AVX-512, row by row through Dot), other rows one at a time with k (the
// first 16·⌊Cols/16⌋ values; the rest are added here one by one).
func (m *Matrix) matvecHalf(k matvecHFunc, dst, x []float32) {
	Parallel(m.blocks16(), halfGrain(m.Cols), func(lo, hi int) { m.matvecHalfBlocks(k, dst, x, lo, hi) })
}

// halfGrain is the blocks16 of cols values per parallel chunk of
// half-float decode, at least.
func halfGrain(cols int) int { return max(1, 2048/cols) }

// matvecHalfBlocks computes the rows of blocks [lo, hi) of matvecHalf.
func (m *Matrix) matvecHalfBlocks(k matvecHFunc, dst, x []float32, lo, hi int) {
	cols := m.Cols
	r0, r1 := lo*panelRows, min(hi*panelRows, m.Rows)
	if p := min(hi, m.panels); lo < p {
		if kp := matvecP(m.Type); kp != nil {
			for r := lo * panelRows; r < p*panelRows; r += panelRows {
				kp(unsafe.Pointer(&m.Data[m.tileOffset(r, 0)]), &x[0], cols/16, &dst[r])
			}
		} else {
			buf := getBuf(cols)
			for r := lo * panelRows; r < p*panelRows; r++ {
				m.Row(r, *buf)
				dst[r] = Dot(*buf, x[:cols])
			}
			floatBufs.Put(buf)
		}
		r0 = p * panelRows
	}
	if r0 >= r1 {
		return
	}
	n16 := cols &^ 15
	if n16 > 0 {
		k(unsafe.Pointer(&m.Data[r0*m.rowBytes]), m.rowBytes, &x[0], n16, r1-r0, &dst[r0])
	} else {
		clear(dst[r0:r1])
	}
	if n16 == cols {
		return
	}
	for r := r0; r < r1; r++ {
		s := dst[r]
		row := m.Data[r*m.rowBytes:]
		for i := n16; i < cols; i++ {
			s += float32(elemAt(row, m.Type, i) * x[i])
		}
		dst[r] = s
	}
}
