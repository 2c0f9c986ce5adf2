package tensor

import "unsafe"

// Q4_K and Q6_K kernels for several tokens (prefill, batched decode),
// sixteen weight rows per call. On amd64 with AVX-512 VNNI, at the
// AVX-512 level: the sixteen rows in the sixteen lanes of a vector
// (transposed in registers), VPDPBUSD integer dot products of four
// values; the kernels unpack each super-block in registers for up to 8
// tokens per call (kpKernels.direct); beyond 8 tokens Q6_K, costlier to
// unpack, runs in two steps: each tile of sixteen rows unpacked once
// (kpUnpackFunc) for all n tokens, which compute kernels (kpCompFunc)
// then multiply, up to 16 per call (kpTiles). On amd64 at the AVX2 level
// (and at the AVX-512 level without VNNI): AVX2 kernels, one row at a
// time with its values in the lanes (VPMADDUBSW, VPMADDWD by the scales,
// horizontal sums), up to 8 tokens per call, direct only
// (asmgen/kquanta.go). At the go level and elsewhere: the Go twins
// (kpTwin). matmulKP is the entry point, for MatMul and MatMulMany to
// call for n ≥ 2; its results are those of the Go twins at every level
// of every machine.
//
// Activations: act.go's Q8_K-style blocks (xbK bytes: qx[256], bs[16], d,
// quantActK), all n tokens in one group: block b of token t at
// (b·n + t)·xbK (quantizeActsK). Per row, token and super-block, with
// exact integer sums I and M, then float32 steps (fused where marked,
// fma32):
//
//	Q4_K (sub-block j of 32 values: 6-bit scale sc_j and min m_j, 4-bit q):
//	  I = Σ_j sc_j·Σ_{e<32} q[32j+e]·qx[32j+e]
//	  M = Σ_j m_j·(bs[2j] + bs[2j+1])
//	  acc = fma(float32(I), d·dx, acc);  acc = fma(-float32(M), dmin·dx, acc)
//	Q6_K (sixteen int8 scales sc_k of 16 values, q = ql | qh<<4 in 0..63):
//	  I = Σ_k sc_k·Σ_{e<16} q[16k+e]·qx[16k+e];  M = Σ_k sc_k·bs[k]
//	  acc = fma(float32(I - 32·M), d·dx, acc)
//
// (d·dx, dmin·dx: float32 products.) The kernels leave one float per row
// and token: acc[t·16 + i].

// kpFunc is the 16-row × T-token kernel: row i's super-block b at w +
// i·ldw + b·bs (row layout: ldw the row bytes, bs the block bytes; 16-row
// panels: ldw the block bytes, bs 16 of them), block b of token t at x +
// b·xs + t·xbK; acc[t·16+i] is loaded when load is not 0, else starts at
// 0.
type kpFunc func(w unsafe.Pointer, ldw int, x unsafe.Pointer, xs, nb int, acc *float32, load, bs int)

const (
	kpRows = 16 // weight rows per kernel call
	kpMaxT = 16 // tokens per kernel call at most
)

// kpKernels is one instruction set's K-quant kernels for one weight type:
// direct[T-1] for T tokens on the packed rows, and unpack and comp[T-1]
// (or nil) for more than len(direct) tokens.
type kpKernels struct {
	direct []kpFunc
	unpack kpUnpackFunc
	comp   []kpCompFunc
	// noStream: the direct kernels read every tile from memory with their
	// own prefetching, at every token count (kpStreamTokens).
	noStream bool
}

// kpUnpackFunc unpacks a tile of 16 rows (row i's super-block b at w +
// i·ldw + b·bs, nb super-blocks) into u, kuBytes per super-block (the layout is the
// kernels' own: asmgen/kquantp.go).
type kpUnpackFunc func(w unsafe.Pointer, ldw, nb int, u unsafe.Pointer, bs int)

// kpCompFunc is kpFunc on an unpacked tile u.
type kpCompFunc func(u, x unsafe.Pointer, xs, nb int, acc *float32, load int)

// kuBytes is the bytes of an unpacked super-block of 16 rows.
const kuBytes = 16*320 + 9*64

// kpTwin is the plain Go twin of the T-token kernel for weights of type
// typ (Q4_K or Q6_K).
func kpTwin(typ DType, T int) kpFunc {
	bb := typ.BlockBytes()
	return func(w unsafe.Pointer, ldw int, x unsafe.Pointer, xs, nb int, acc *float32, load, bs int) {
		a := unsafe.Slice(acc, T*kpRows)
		if load == 0 {
			clear(a)
		}
		for i := 0; i < kpRows; i++ {
			for t := 0; t < T; t++ {
				s := a[t*kpRows+i]
				for b := 0; b < nb; b++ {
					wb := unsafe.Slice((*byte)(unsafe.Add(w, i*ldw+b*bs)), bb)
					xb := unsafe.Slice((*byte)(unsafe.Add(x, b*xs+t*xbK)), xbK)
					if typ == Q4_K {
						s = kpQ4K(wb, xb, s)
					} else {
						s = kpQ6K(wb, xb, s)
					}
				}
				a[t*kpRows+i] = s
			}
		}
	}
}

// kpQ4K returns acc plus one Q4_K super-block w times the activation
// block x, in the kernels' steps.
func kpQ4K(w, x []byte, acc float32) float32 {
	scales := (*[12]byte)(w[4:16])
	var I, M int32
	for j := 0; j < 8; j++ {
		sc, m := scaleMinK4(j, scales)
		var p int32
		for e := 0; e < 32; e++ {
			q := w[16+32*(j/2)+e] >> (4 * (j % 2)) & 0x0f
			p += int32(q) * int32(int8(x[32*j+e]))
		}
		I += int32(sc) * p
		M += int32(m) * (int32(int16(le16(x[xbKBs+4*j:]))) + int32(int16(le16(x[xbKBs+4*j+2:]))))
	}
	dx := f32at(x[xbKD:])
	acc = fma32(float32(I), float32(F16ToF32(le16(w))*dx), acc)
	return fma32(-float32(M), float32(F16ToF32(le16(w[2:]))*dx), acc)
}

// kpQ6K returns acc plus one Q6_K super-block w times the activation
// block x, in the kernels' steps.
func kpQ6K(w, x []byte, acc float32) float32 {
	var I, M int32
	for k := 0; k < 16; k++ {
		sc := int32(int8(w[192+k]))
		var p int32
		for e := 16 * k; e < 16*k+16; e++ {
			n, i, l := e/128, e%128/32, e%32 // half, group of the half, position
			ql := w[64*n+32*(i%2)+l] >> (4 * (i / 2)) & 0x0f
			qh := w[128+32*n+l] >> (2 * i) & 3
			p += int32(ql|qh<<4) * int32(int8(x[e]))
		}
		I += sc * p
		M += sc * int32(int16(le16(x[xbKBs+2*k:])))
	}
	return fma32(float32(I-32*M), float32(F16ToF32(le16(w[208:]))*f32at(x[xbKD:])), acc)
}

// kpGo are the Go twins for 1..kpMaxT tokens.
var kpGo = map[DType]*kpKernels{Q4_K: {direct: kpTwins(Q4_K)}, Q6_K: {direct: kpTwins(Q6_K)}}

func kpTwins(t DType) []kpFunc {
	ks := make([]kpFunc, kpMaxT)
	for T := 1; T <= kpMaxT; T++ {
		ks[T-1] = kpTwin(t, T)
	}
	return ks
}

// kpApplies reports whether the K-quant kernels multiply m by n tokens:
// Q4_K or Q6_K, rows a multiple of 16, at least 2 tokens (decode keeps
// the rows kernels of quantmm.go). (Every level has them: kpKern.)
func (m *Matrix) kpApplies(n int) bool {
	return n >= 2 && (m.Type == Q4_K || m.Type == Q6_K) && m.Rows%kpRows == 0 && m.Cols != 0
}

// matmulKP runs MatMul with the K-quant kernels when they apply and
// reports whether it did.
func (m *Matrix) matmulKP(dst, x []float32, n int) bool {
	if !m.kpApplies(n) {
		return false
	}
	ab := getBytes(m.Cols / QK_K * n * xbK) // pooled: no garbage per call
	quantizeActsK(*ab, x, m.Cols, n)
	ks := kpKern(m.Type)
	Parallel(m.Rows/kpRows, 1, func(lo, hi int) {
		m.kpTiles(ks, dst, *ab, n, lo, hi)
	})
	byteBufs.Put(ab)
	return true
}

// quantizeActsK quantizes x [n][cols] into act as one group of n tokens
// (block b of token t at (b·n + t)·xbK), tokens over threads; rows with an
// Inf or a NaN are quantized in Go (quantActK), as quantizeActs does.
func quantizeActsK(act []byte, x []float32, cols, n int) {
	nb := cols / QK_K
	Parallel(n, max(1, 8192/max(cols, 1)), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			row := x[t*cols : (t+1)*cols]
			if nb > 0 && quantActRow(QK_K, row, act[t*xbK:], nb, n*xbK, 0) {
				continue
			}
			for b := 0; b < nb; b++ {
				quantActK(row[b*QK_K:], act[(b*n+t)*xbK:])
			}
		}
	})
}

// kpTiles computes the row tiles [lo, hi) (rows 16·lo .. 16·hi-1) of
// dst [n][rows] from the activations act (quantizeActsK) with the kernels
// ks, the tokens in near-equal groups of at most the kernels' most, each
// tile's rows read from memory once. Up to len(ks.direct) tokens, or
// where there are no unpacking kernels, the direct kernels run on the
// packed rows, which come from memory (for the first group: the kernels
// prefetch the next tile) or, up to kpStreamTokens tokens and unless
// ks.noStream, from a streaming read of quantBlockBytes of tiles ahead
// (memRead). Otherwise the tiles, also read ahead, are unpacked kpChunk
// super-blocks at a time (in the L1 cache), each chunk multiplied by
// every group, the accumulators carried from chunk to chunk (the same
// operations in the same order as over the whole row). Several
// matrices' tiles can share a parallel region (MatMulMany).
func (m *Matrix) kpTiles(ks *kpKernels, dst []float32, act []byte, n, lo, hi int) {
	nb := m.Cols / QK_K
	tb := kpRows * m.rowBytes // a tile's bytes
	ldw, bs := m.blockStrides()
	step := max(1, quantBlockBytes/tb) // tiles per streaming read
	if ks.unpack == nil || n <= len(ks.direct) {
		var acc [kpMaxT * kpRows]float32
		for rt := lo; rt < hi; rt++ {
			if n <= kpStreamTokens && !ks.noStream && (rt-lo)%step == 0 {
				memRead(m.Data[rt*tb : min(rt+step, hi)*tb])
			}
			w := m.rowAt(rt * kpRows)
			for t0 := 0; t0 < n; {
				T := kpGroup(n-t0, len(ks.direct))
				ks.direct[T-1](w, ldw, unsafe.Pointer(&act[t0*xbK]), n*xbK, nb, &acc[0], 0, bs)
				for t := 0; t < T; t++ {
					copy(dst[(t0+t)*m.Rows+rt*kpRows:][:kpRows], acc[t*kpRows:(t+1)*kpRows])
				}
				t0 += T
			}
		}
		return
	}
	ub := getBytes(min(nb, kpChunk)*kuBytes + n*kpRows*4)
	defer byteBufs.Put(ub)
	u := unsafe.Pointer(&(*ub)[0])
	acc := unsafe.Slice((*float32)(unsafe.Add(u, min(nb, kpChunk)*kuBytes)), n*kpRows)
	for rt := lo; rt < hi; rt++ {
		if (rt-lo)%step == 0 {
			memRead(m.Data[rt*tb : min(rt+step, hi)*tb])
		}
		w := m.rowAt(rt * kpRows)
		for b0 := 0; b0 < nb; b0 += kpChunk {
			nc := min(kpChunk, nb-b0)
			ks.unpack(unsafe.Add(w, b0*bs), ldw, nc, u, bs)
			load := min(b0, 1)
			for t0 := 0; t0 < n; {
				T := kpGroup(n-t0, len(ks.comp))
				ks.comp[T-1](u, unsafe.Pointer(&act[(b0*n+t0)*xbK]), n*xbK, nc, &acc[t0*kpRows], load)
				t0 += T
			}
		}
		for t := 0; t < n; t++ {
			copy(dst[t*m.Rows+rt*kpRows:][:kpRows], acc[t*kpRows:(t+1)*kpRows])
		}
	}
}

// kpChunk is the super-blocks of a tile unpacked at a time.
const kpChunk = 4

// kpStreamTokens: up to this many tokens the direct kernels (but for
// noStream ones: the AVX2 kernels) read tiles that a streaming read
// brought to the cache, beyond it they prefetch for themselves.
// (BenchmarkMatMulBatch, weights from memory, AVX-512 kernels: streaming
// ran Q6_K 1.6× faster at 2 to 8 tokens, Q4_K 15% faster at 2, 7% slower
// at 32. The unpacking kernels always stream: 1.2–1.3× faster than
// prefetching the next tile from the compute kernels at 16 to 64 tokens.)
const kpStreamTokens = 8

// kpGroup is the tokens of the next group when left remain: near-equal
// groups of at most most.
func kpGroup(left, most int) int {
	groups := (left + most - 1) / most
	return (left + groups - 1) / groups
}
