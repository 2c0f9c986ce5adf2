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
// reduceLanes (rowBlocks).
func qrows2Go(t DType) qrowsFunc {
	k := qkernGo(t, 1, 1)
	_, xb := actLayout(t)
	bb := t.BlockBytes()
	return func(w unsafe.Pointer, ldw int, x unsafe.Pointer, nb int, out *float32, rows int) {
		o := unsafe.Slice(out, rows)
		for r := range o {
			o[r] = rowBlocks(k, unsafe.Add(w, r*ldw), bb, x, xb, nb, true)
		}
	}
}

// rowBlocks is one row's value in the rows kernels' order from the 1×1
// kernel k called a block at a time: block b (at w + b·bs) times
// activation block b (at x + b·xb) into eight lane accumulators,
// alternately two when two is set (even blocks in the first, which takes
// a last unpaired block; then added lane by lane), then reduceLanes.
func rowBlocks(k qkernFunc, w unsafe.Pointer, bs int, x unsafe.Pointer, xb, nb int, two bool) float32 {
	var e, d [8]float32
	for b := 0; b < nb; b++ {
		acc := &e
		if two && b%2 == 1 {
			acc = &d
		}
		k(unsafe.Add(w, b*bs), 0, unsafe.Add(x, b*xb), 1, &acc[0], 1)
	}
	if two {
		for l := range e {
			e[l] += d[l]
		}
	}
	return reduceLanes(&e)
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

// qpanelFunc is a one-token kernel over 16-row panels (NewPanelMatrix):
// for panel p < panels (at w + p·16·nb·bb) and its row j, out[16p + j] =
// the rows kernel's value for that row (quantKernels.rows: the same
// lanes, the same order), from the activations x of one token.
type qpanelFunc func(w, x unsafe.Pointer, nb int, out *float32, panels int)

// qpanelVia builds a panel kernel of type t from the 1×1 kernel k of a
// level (its twin: qpanelVia(t, qkernGo(t, 1, 1))), one block per call:
// the rows kernels' sums (two lane accumulators for Q8_0 and Q4_0, as
// qrows2Go; one for Q4_K and Q6_K, as qrowsGo). Levels without a panel
// kernel run it (PanelMatrices keeps their matrices in rows, so only
// tests and a level lowered after loading get here).
func qpanelVia(t DType, k qkernFunc) qpanelFunc {
	bb := t.BlockBytes()
	_, xb := actLayout(t)
	two := t == Q8_0 || t == Q4_0
	return func(w, x unsafe.Pointer, nb int, out *float32, panels int) {
		o := unsafe.Slice(out, panels*panelRows)
		for r := range o {
			row := unsafe.Add(w, (r/panelRows*nb*panelRows+r%panelRows)*bb)
			o[r] = rowBlocks(k, row, panelRows*bb, x, xb, nb, two)
		}
	}
}

// quantKernGo are the plain Go twins, tiled like the AVX-512 kernels.
var quantKernGo = func() map[DType]*quantKernels {
	k := map[DType]*quantKernels{}
	for _, t := range []DType{Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS} {
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

// quantActs is x [n][cols] quantized for one activation format (act.go):
// what matrices of types that share it (Q4_K and Q6_K; Q8_0; Q4_0) and
// kernel tiles (tp) multiply.
type quantActs struct {
	buf    *[]byte
	act    []byte
	groups [][2]int
	nb, xb int
}

// quantizeFor quantizes x [n][cols] for weights of type t and kernels qk
// (in parallel from 8 tokens on). release returns the buffer.
func quantizeFor(t DType, qk *quantKernels, x []float32, cols, n int) quantActs {
	bs, xb := actLayout(t)
	nb := cols / bs
	groups := actGroups(n, qk.tp)
	ab := getBytes(n * nb * xb)
	act := *ab
	if n >= 8 {
		Parallel(len(groups), 1, func(lo, hi int) {
			quantizeActs(t, act, x, cols, groups[lo:hi])
		})
	} else {
		quantizeActs(t, act, x, cols, groups)
	}
	return quantActs{buf: ab, act: act, groups: groups, nb: nb, xb: xb}
}

func (a *quantActs) release() { byteBufs.Put(a.buf) }

// actKey names the activation format of weights of type t with kernels qk:
// matrices with equal keys can multiply the same quantized activations.
func actKey(t DType, qk *quantKernels) [2]int {
	if t == Q6_K || moreKType(t) {
		t = Q4_K // Q8_K-style activations for all
	}
	return [2]int{int(t), qk.tp}
}

// quantBlockBytes is the weight bytes quantRows multiplies by every token
// before it moves on, when there are several (in the L2 cache).
const quantBlockBytes = 128 << 10

// quantRowTile is the rows of a unit of work of the quantized products.
const quantRowTile = 4

// quantGrain is the units of work of unit rows (quantRowTile, or a
// panel: quantUnit) a worker takes at least, for cols inputs times n
// tokens.
func quantGrain(cols, n, unit int) int { return max(1, 32768/(cols*n*unit)) }

// quantUnit is the rows of matmulQuant's units of work: quantRowTile, or
// a panel (panels hold every row of a quantized matrix).
func (m *Matrix) quantUnit() int {
	if m.panels > 0 {
		return panelRows
	}
	return quantRowTile
}

// matmulQuant computes dst[t] = W·x[t] for quantized weights: activations
// quantized to 8 bits (act.go), integer block products (qdot.go).
func (m *Matrix) matmulQuant(qk *quantKernels, dst, x []float32, n int) {
	a := quantizeFor(m.Type, qk, x, m.Cols, n)
	u := m.quantUnit()
	Parallel((m.Rows+u-1)/u, quantGrain(m.Cols, n, u), func(lo, hi int) {
		m.quantRows(qk, dst, &a, lo*u, min(hi*u, m.Rows))
	})
	a.release()
}

// panelRows computes rows [r0, r1) (whole panels) of dst = W·x for the
// one token of a, with the level's panel kernel or qpanelVia.
func (m *Matrix) panelRows(qk *quantKernels, dst []float32, a *quantActs, r0, r1 int) {
	if len(a.groups) != 1 || a.groups[0][1] != 1 {
		// Several tokens take the row-tile kernels (p8Applies,
		// kpApplies hold for every panel matrix).
		panic("tensor: a quantized panel matrix given several tokens outside the row-tile kernels")
	}
	k := qpanelKern(m.Type)
	if k == nil {
		k = qpanelVia(m.Type, qk.dec1)
	}
	t0 := a.groups[0][0]
	k(m.rowAt(r0), unsafe.Pointer(&a.act[t0*a.nb*a.xb]), a.nb, &dst[t0*m.Rows+r0], (r1-r0)/panelRows)
}

// quantRows computes rows [r0, r1) of dst[t] = W·x[t] from the quantized
// activations a.
func (m *Matrix) quantRows(qk *quantKernels, dst []float32, a *quantActs, r0, r1 int) {
	if m.panels > 0 {
		m.panelRows(qk, dst, a, r0, r1)
		return
	}
	rows := m.Rows
	act, nb, xb := a.act, a.nb, a.xb
	var acc [4 * quantRowTile * 8]float32
	multi, singles := false, 0
	for _, g := range a.groups {
		if g[1] == 1 {
			singles++
		} else {
			multi = true
		}
	}
	if !multi && singles == 1 {
		// One token (decode): one call over all the rows.
		t0 := a.groups[0][0]
		qk.rows(unsafe.Pointer(&m.Data[r0*m.rowBytes]), m.rowBytes, unsafe.Pointer(&act[t0*nb*xb]), nb, &dst[t0*rows+r0], r1-r0)
		return
	}
	// Several tokens: block by block of rows (quantBlockBytes), each read
	// from memory once and then multiplied from the cache by every token:
	// by the single tokens first (a single stream per thread, which the
	// hardware prefetcher follows), or when there are none by a streaming
	// read of the block, before the tiles of the groups. (The tile kernels
	// read rp rows at once: straight from memory they run at half speed for
	// a few tokens, and 15–20% slower at 16.) The blocks are whole row
	// tiles, so every row meets the same kernels as without them.
	step := max(quantRowTile, quantBlockBytes/m.rowBytes/quantRowTile*quantRowTile)
	for b0 := r0; b0 < r1; b0 += step {
		b1 := min(b0+step, r1)
		if singles == 0 {
			memRead(m.Data[b0*m.rowBytes : b1*m.rowBytes])
		}
		for _, g := range a.groups {
			if t0, s := g[0], g[1]; s == 1 {
				qk.rows(unsafe.Pointer(&m.Data[b0*m.rowBytes]), m.rowBytes, unsafe.Pointer(&act[t0*nb*xb]), nb, &dst[t0*rows+b0], b1-b0)
			}
		}
		if !multi {
			continue
		}
		// Groups of tokens: tile by tile, every group per tile (the block
		// is in the cache: no software prefetch).
		for r := b0; r < b1; {
			w := unsafe.Pointer(&m.Data[r*m.rowBytes])
			rr, k := qk.rp, qk.pre
			if r+rr > b1 {
				rr, k = 1, qk.pre1
			}
			for _, g := range a.groups {
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
	}
}
