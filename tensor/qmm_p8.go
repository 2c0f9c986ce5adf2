package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// Q8_0 and Q4_0 kernels for several tokens (prefill, batched decode):
// eight weight rows in the eight lanes of a vector (transposed block by
// block in registers) and one activation scale per block of 32 (as
// llama.cpp's Q8_0 activations), so that a block's eight integer dot
// products of four values (VPDPBUSD) add up in integers before one
// conversion, one scale multiply and one fused multiply-add per block,
// token and eight rows, instead of three float operations per block,
// token and row with the per-lane activation scales of act.go. Zen 4 runs
// VPDPBUSD, VMULPS and VFMADD on the same two pipes, which bounds both:
// 3 such operations per 32 products in the 4×4 tiles (they ran at ~95% of
// that), 10 per 256 here. matmulP8 is the entry point, for MatMul and
// MatMulMany to call first (n ≥ p8MinTokens); its results are those of
// the Go twins (qp8Twin) at every level. The AVX2 kernels (asmgen's
// genQ8PA, for 1..8, 16 and 32 tokens) get each block's exact integer
// sums from VPMADDUBSW and VPMADDWD instead, then take the same float
// steps.
//
// Activations (xbP bytes per block of 32 values): qx[32] int8, corr int32
// = -c·Σ qx (c = 128 for Q8_0, 8 for Q4_0: the kernels offset the weights
// to unsigned bytes), d float32, with d and qx as in act.go (actScale,
// actQuant) over the whole block. Block b of token t at x + b·xs + t·xbP.
//
// Per row i, token t and block b (exact integer P, then float32 steps):
//
//	P = Σ_{e<32} qw[i][e]·qx[t][e]       (Q4_0: qw = nibble - 8)
//	acc[t][i] = fma(float32(P)·dx[t], dw[i], acc[t][i])   (fused, fma32)
//
// The kernel leaves one float per row and token (no lanes to add up):
// acc[t·8 + i].
const (
	xbP     = 40
	xbPCorr = 32
	xbPD    = 36
)

// quantActP quantizes the 32 values of x into one xbP block, with the
// correction for weights offset by c.
func quantActP(x []float32, dst []byte, c int32) {
	x = x[:32]
	dst = dst[:xbP]
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d, id := actScale(amax)
	var s int32
	for j, v := range x {
		q := actQuant(v, id)
		dst[j] = byte(q)
		s += int32(q)
	}
	binary.LittleEndian.PutUint32(dst[xbPCorr:], uint32(-c*s))
	binary.LittleEndian.PutUint32(dst[xbPD:], math.Float32bits(d))
}

// quantizeActsP quantizes x [n][cols] into act in the kernels' layout
// (block b of token t at (b·n + t)·xbP) for weights of type typ, tokens
// over threads.
func quantizeActsP(typ DType, act []byte, x []float32, cols, n int) {
	nb := cols / 32
	c := int32(128)
	if typ == Q4_0 {
		c = 8
	}
	Parallel(n, max(1, 8192/max(cols, 1)), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			if nb > 0 && quantActRowP(x[t*cols:(t+1)*cols], act[t*xbP:], nb, n*xbP, c) {
				continue
			}
			for b := 0; b < nb; b++ {
				quantActP(x[t*cols+b*32:], act[(b*n+t)*xbP:], c)
			}
		}
	})
}

// qp8Func is the 8-row × T-token kernel: row i's block b at w + i·ldw +
// b·bs (row layout: ldw the row bytes, bs the block bytes; 16-row panels:
// ldw the block bytes, bs 16 of them), block b of token t at x + b·xs +
// t·xbP; acc[t·8+i] is loaded when load
// is not 0, else starts at 0.
type qp8Func func(w unsafe.Pointer, ldw int, x unsafe.Pointer, xs, nb int, acc *float32, load, bs int)

// qp8Twin is the plain Go twin of the 8-row T-token kernel for weights of
// type typ (Q8_0 or Q4_0).
func qp8Twin(typ DType, T int) qp8Func { return qpTwin(typ, 8, T) }

// qpTwin is the plain Go twin of the R-row T-token kernel (acc[t·R + i]):
// the 16-row kernels compute each row exactly as the 8-row ones.
func qpTwin(typ DType, R, T int) qp8Func {
	bb := typ.BlockBytes()
	return func(w unsafe.Pointer, ldw int, x unsafe.Pointer, xs, nb int, acc *float32, load, bs int) {
		a := unsafe.Slice(acc, T*R)
		if load == 0 {
			clear(a)
		}
		for i := 0; i < R; i++ {
			for t := 0; t < T; t++ {
				s := a[t*R+i]
				for b := 0; b < nb; b++ {
					wb := unsafe.Slice((*byte)(unsafe.Add(w, i*ldw+b*bs)), bb)
					xb := unsafe.Slice((*byte)(unsafe.Add(x, b*xs+t*xbP)), xbP)
					var p int32
					for e := 0; e < 32; e++ {
						var q int32
						if typ == Q4_0 {
							q = int32(wb[2+e%16]>>(4*(e/16))&0x0f) - 8
						} else {
							q = int32(int8(wb[2+e]))
						}
						p += q * int32(int8(xb[e]))
					}
					s = fma32(float32(p)*f32at(xb[xbPD:]), F16ToF32(le16(wb)), s)
				}
				a[t*R+i] = s
			}
		}
	}
}

// matmulP8 runs MatMul with the 8-row (or 16-row) kernels when they
// apply: Q8_0 or Q4_0 weights, rows a multiple of 8, at least p8MinTokens
// tokens. It reports whether it did.
func (m *Matrix) matmulP8(dst, x []float32, n int) bool {
	if !m.p8Applies(n) {
		return false
	}
	matMulQ8P(m.p8Kernels(), m, dst, x, n)
	return true
}

// p8Set is the kernels of one tile height for one weight type.
type p8Set struct {
	rows int       // weight rows per tile: 8 or 16
	ks   []qp8Func // ks[T-1] takes T tokens (1..8)
	k16  qp8Func   // 16 tokens (nil: ks in turn)
	k32  qp8Func   // 32 tokens (nil: k16 or ks in turn; AVX2 only)
}

// p8Kernels returns the kernels that multiply m at the level in use: the
// 16-row ones (AVX-512 VNNI) when m's rows are a multiple of 16, else the
// 8-row ones. Both give every row the same value, bit for bit.
func (m *Matrix) p8Kernels() p8Set {
	if ks := qp16Kern(m.Type); ks != nil && m.Rows%16 == 0 {
		return p8Set{16, ks, qp16Kern16(m.Type), nil}
	}
	return p8Set{8, qp8Kern(m.Type), qp8Kern16(m.Type), qp8Kern32(m.Type)}
}

// p8Applies reports whether the 8-row kernels multiply m by n tokens.
func (m *Matrix) p8Applies(n int) bool {
	return n >= p8MinTokens && m.Rows%8 == 0 && m.Cols != 0 && m.Cols%32 == 0 && (m.Type == Q8_0 || m.Type == Q4_0)
}

// p8MinTokens: below it the 8-row kernels lose to the 4-row tiles
// (quantmm.go). Before the kernels prefetched the next tile, 2 tokens ran
// 15% slower, 4 even, 8 1.45× faster; with the prefetch, 2 tokens run
// 1.9× faster (81 vs 43 GMAC/s, BenchmarkMatMulBatch, TinyLlama Q8_0).
// One token (decode) streams rows (qrowsFunc): 27% faster than the 8-row
// kernel's eight streams.
const p8MinTokens = 2

// qp8Go are the Go twins for 1..8 tokens.
var qp8Go = map[DType][]qp8Func{Q8_0: qp8Twins(Q8_0), Q4_0: qp8Twins(Q4_0)}

func qp8Twins(t DType) []qp8Func {
	ks := make([]qp8Func, 8)
	for T := 1; T <= 8; T++ {
		ks[T-1] = qp8Twin(t, T)
	}
	return ks
}

// matMulQ8P multiplies the Q8_0 or Q4_0 matrix m (rows a multiple of
// ks.rows) by the n rows of x into dst [n][rows] with the kernels ks, the
// matrix in row tiles of ks.rows over threads.
func matMulQ8P(ks p8Set, m *Matrix, dst, x []float32, n int) {
	ab := getBytes(m.Cols / 32 * n * xbP) // pooled: no garbage per call
	act := *ab
	quantizeActsP(m.Type, act, x, m.Cols, n)
	Parallel(m.Rows/ks.rows, 1, func(lo, hi int) {
		m.p8Tiles(ks, dst, act, n, lo, hi)
	})
	byteBufs.Put(ab)
}

// p8Tiles computes the row tiles [lo, hi) (rows R·lo .. R·hi-1, R =
// ks.rows) of dst [n][rows] from the activations act (quantizeActsP, for
// m.Type), each tile's weights read once and kept in L1 for every token
// tile: 32 tokens at a time where there is a 32-token kernel, then 16,
// then up to 8. Several matrices' tiles can share a parallel region
// (MatMulMany). The kernels prefetch the next tile themselves; a
// streaming read ahead (memRead, as kpTiles) made the AVX2 ones 1.3–1.9×
// slower at 2 to 8 tokens.
func (m *Matrix) p8Tiles(ks p8Set, dst []float32, act []byte, n, lo, hi int) {
	nb := m.Cols / 32
	ldw, bs := m.blockStrides()
	R := ks.rows
	var acc [256]float32
	for rt := lo; rt < hi; rt++ {
		w := m.rowAt(rt * R)
		for t0 := 0; t0 < n; {
			T := min(len(ks.ks), n-t0)
			k := ks.ks[T-1]
			if ks.k32 != nil && n-t0 >= 32 {
				T, k = 32, ks.k32
			} else if ks.k16 != nil && n-t0 >= 16 {
				T, k = 16, ks.k16
			}
			if T*R > len(acc) { // the kernel writes T·R floats through a pointer
				panic(fmt.Sprintf("tensor: %d tokens × %d rows overflow p8Tiles' accumulators", T, R))
			}
			k(w, ldw, unsafe.Pointer(&act[t0*xbP]), n*xbP, nb, &acc[0], 0, bs)
			for t := 0; t < T; t++ {
				copy(dst[(t0+t)*m.Rows+rt*R:][:R], acc[t*R:t*R+R])
			}
			t0 += T
		}
	}
}
