package tensor

import (
	"sync"
	"unsafe"
)

// quantKernels is one instruction set's integer kernels for one weight
// type: R×T tiles for decode (T = 1) and prefill (T = tp).
type quantKernels struct {
	rd, rp, tp int
	dec, dec1  qkernFunc // rd×1, 1×1
	pre, pre1  qkernFunc // rp×tp, 1×tp
	rows       qrowsFunc // 1×1 over many rows, lanes added up (decode; two accumulators for Q8_0, Q4_0)
}

// qrowsFunc sets out[i] = reduceLanes of the 1×1 kernel over row i, for
// rows rows ldw bytes apart.
type qrowsFunc func(w unsafe.Pointer, ldw int, x unsafe.Pointer, nb int, out *float32, rows int)

// qrows2Go is the Go twin of the Q8_0 and Q4_0 rows kernels: blocks
// alternately into two lane accumulators (even blocks in the first, the
// first taking a last unpaired block), added lane by lane, then
// reduceLanes.
func qrows2Go(t DType) qrowsFunc {
	k := qkernGo(t, 1, 1)
	_, xb := actLayout(t)
	bb := t.BlockBytes()
	return func(w unsafe.Pointer, ldw int, x unsafe.Pointer, nb int, out *float32, rows int) {
		o := unsafe.Slice(out, rows)
		for r := range o {
			var e, d [8]float32
			for b := 0; b < nb; b++ {
				acc := &e
				if b%2 == 1 {
					acc = &d
				}
				k(unsafe.Add(w, r*ldw+b*bb), ldw, unsafe.Add(x, b*xb), 1, &acc[0], 1)
			}
			for l := range e {
				e[l] += d[l]
			}
			o[r] = reduceLanes(&e)
		}
	}
}

// qrowsGo builds the Go twin of a rows kernel from a 1×1 kernel.
func qrowsGo(k qkernFunc) qrowsFunc {
	return func(w unsafe.Pointer, ldw int, x unsafe.Pointer, nb int, out *float32, rows int) {
		o := unsafe.Slice(out, rows)
		var acc [8]float32
		for r := range o {
			k(unsafe.Add(w, r*ldw), ldw, x, nb, &acc[0], 0)
			o[r] = reduceLanes(&acc)
		}
	}
}

// quantKernGo are the plain Go twins, tiled like the AVX-512 kernels.
var quantKernGo = func() map[DType]*quantKernels {
	k := map[DType]*quantKernels{}
	for _, t := range []DType{Q8_0, Q4_0, Q4_K, Q6_K} {
		k[t] = &quantKernels{rd: 1, rp: 4, tp: 4,
			dec: qkernGo(t, 1, 1), dec1: qkernGo(t, 1, 1), pre: qkernGo(t, 4, 4), pre1: qkernGo(t, 1, 4),
			rows: qrowsGo(qkernGo(t, 1, 1))}
		if t == Q8_0 || t == Q4_0 {
			k[t].rows = qrows2Go(t)
		}
	}
	return k
}()

var byteBufs sync.Pool

func getBytes(n int) *[]byte {
	b, _ := byteBufs.Get().(*[]byte)
	if b == nil {
		b = new([]byte)
	}
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	*b = (*b)[:n]
	return b
}

// matmulQuant computes dst[t] = W·x[t] for quantized weights: activations
// quantized to 8 bits (act.go), integer block products (qdot.go).
func (m *Matrix) matmulQuant(qk *quantKernels, dst, x []float32, n int) {
	cols, rows := m.Cols, m.Rows
	bs, xb := actLayout(m.Type)
	nb := cols / bs
	groups := actGroups(n, qk.tp)
	ab := getBytes(n * nb * xb)
	act := *ab
	if n >= 8 {
		Parallel(len(groups), 1, func(lo, hi int) {
			quantizeActs(m.Type, act, x, cols, groups[lo:hi])
		})
	} else {
		quantizeActs(m.Type, act, x, cols, groups)
	}
	const rowTile = 4
	tiles := (rows + rowTile - 1) / rowTile
	grain := max(1, 32768/(cols*n*rowTile))
	Parallel(tiles, grain, func(lo, hi int) {
		var acc [4 * rowTile * 8]float32
		r0, r1 := lo*rowTile, min(hi*rowTile, rows)
		multi := false
		// Single tokens (decode): one call over all the rows.
		for _, g := range groups {
			if t0, s := g[0], g[1]; s == 1 {
				qk.rows(unsafe.Pointer(&m.Data[r0*m.rowBytes]), m.rowBytes, unsafe.Pointer(&act[t0*nb*xb]), nb, &dst[t0*rows+r0], r1-r0)
			} else {
				multi = true
			}
		}
		if !multi {
			return
		}
		// Groups of tokens (prefill): tile by tile, every group per tile,
		// so that the tile's weights are read from memory once.
		for r := r0; r < r1; {
			w := unsafe.Pointer(&m.Data[r*m.rowBytes])
			rr, k := qk.rp, qk.pre
			if r+rr > r1 {
				rr, k = 1, qk.pre1
			}
			if next := r + rr; next < r1 {
				prefetch(unsafe.Add(w, rr*m.rowBytes), m.rowBytes, min(qk.rp, r1-next), m.rowBytes)
			}
			for _, g := range groups {
				t0, s := g[0], g[1]
				if s == 1 {
					continue
				}
				k(w, m.rowBytes, unsafe.Pointer(&act[t0*nb*xb]), nb, &acc[0], 0)
				for j := 0; j < s; j++ {
					for i := 0; i < rr; i++ {
						dst[(t0+j)*rows+r+i] = reduceLanes((*[8]float32)(acc[(j*rr+i)*8:]))
					}
				}
			}
			r += rr
		}
	})
	byteBufs.Put(ab)
}
