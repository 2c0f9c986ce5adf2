//go:build ignore

package main

import "fmt"

// One-token K-quant kernels over 16-row panels, AVX-512 VNNI:
//
//	q<typ>Vpanel(w, x, nb, out, panels)
//
// Panel p (rows 16p..16p+15) at w + p·16·nb·bb, its tile b (super-block b
// of the 16 rows) at +b·16·bb, row j's block (bb bytes, ggml's layout) at
// +j·bb: one forward stream of weights. out[16p + j] is exactly what
// qrowsGo(qkernGo(typ, 1, 1)) gives for row 16p + j (qdot.go: one 8-lane
// float accumulator per row over the super-blocks in order, then
// reduceLanes' tree).
//
// Per tile the activations' super-block (qx in four ZMM, bs, dx) is loaded
// once into registers, then the sixteen rows run two at a time: the
// integer sums of a row in one ZMM (two halves of eight dword lanes, each
// the lanes of some of the sub-blocks: exact, any order), VPMADDUBSW of
// the unsigned quants (≤ 15 or ≤ 63) by the int8 activations (pairs ≤
// 2·63·127: no int16 saturation), VPDPWSSD by the sub-blocks' int16
// scales; the two halves added, the pair's rows side by side ([row 2i |
// row 2i+1]) for the float steps of the twins, in ZMM accumulators Z0..Z7
// (row 2i in the low eight lanes of Z(i), row 2i+1 in the high eight).
//
// Q4_K: the 64 bytes of quants of sub-blocks (0,1,2,3) (and (4,5,6,7))
// in one load, low nibbles [sub 0 | sub 2], high nibbles [sub 1 | sub 3],
// against the activations rearranged once per tile as [x0 | x2], [x1 |
// x3], [x4 | x6], [x5 | x7] (32 bytes each). The scales and mins are
// unpacked for both rows of a pair at once (ggml's get_scale_min_k4 as
// dword shifts and masks, one 128-bit lane per row); the scale words by
// VPSHUFB of a row's unpacked bytes in every lane, the mins as word pairs
// (m_l, m_l) times the pairs of bs (VPMADDWD). Float: float32(I)·(d·dx) -
// float32(M)·(dmin·dx), added to the accumulator (no fused operation).
//
// Q6_K: the 64 bytes of low bits of a half (groups 4n..4n+3) in one load,
// low nibbles groups (4n, 4n+1), high nibbles (4n+2, 4n+3), the high bits
// (32 bytes in both halves) shifted into place per group pair and merged
// (VPTERNLOGD); the scale words by VPERMW of the sixteen sign-extended
// scales (128-bit lane k of chunk c: scale 4c+k); -32·M as the start of
// I: VPMADDWD of 32·sc by -bs. Float: float32(I - 32·M)·(d·dx) added.

const kvpSig = "(w unsafe.Pointer, x unsafe.Pointer, nb int, out *float32, panels int)"

func genKQuantV(e *emitter) {
	// VPSHUFB indices for Q4_K (per 128-bit lane of the unpacked bytes
	// U = sc0..sc7, m0..m7): kvs<k> makes the scale words of product k
	// (lanes 0,1: scale lo[k], lanes 2,3: scale hi[k]); kvmin the mins as
	// pairs (m_l, m_l) in dword l of row 0 (lanes 0,1) and row 1 (lanes
	// 2,3).
	lo := []int{0, 1, 4, 5}
	hi := []int{2, 3, 6, 7}
	for k := 0; k < 4; k++ {
		b := make([]byte, 64)
		for i := 0; i < 64; i += 2 {
			s := lo[k]
			if i >= 32 {
				s = hi[k]
			}
			b[i], b[i+1] = byte(s), 0x80
		}
		e.dataBytes(fmt.Sprintf("kvs%d", k), b)
	}
	b := make([]byte, 64)
	for i := 0; i < 64; i += 4 {
		l := (i % 32) / 4 // dword lane within the row's 256 bits
		b[i], b[i+1], b[i+2], b[i+3] = byte(8+l), 0x80, byte(8+l), 0x80
	}
	e.dataBytes("kvmin", b)
	// VPERMW indices for Q6_K: chunk c, 128-bit lane k: scale 4c+k.
	for c := 0; c < 4; c++ {
		b := make([]byte, 64)
		for w := 0; w < 32; w++ {
			b[2*w] = byte(4*c + w/8)
		}
		e.dataBytes(fmt.Sprintf("kv6s%d", c), b)
	}
	// Q6_K: the word shifts of the high bits of groups (4n, 4n+1): 4, 2.
	b = make([]byte, 64)
	for w := 0; w < 32; w++ {
		b[2*w] = 4
		if w >= 16 {
			b[2*w] = 2
		}
	}
	e.dataBytes("kv6sh", b)
	e.data("kv0F", 64, 0x0F)
	e.data("kv30", 64, 0x30)
	genKVPanel(e, "Q4_K")
	genKVPanel(e, "Q6_K")
}

// genKVPanel: registers Z0..Z7 the accumulators, Z8..Z11 the tile's
// activations, Z12 bs (Q4_K: in both halves; Q6_K: -bs), Z13 dx in every
// lane, Z14 0x0F bytes, Z15 0x30 bytes, Z16..Z19 the scale shuffles,
// Z20 kvmin (Q4_K) or kv6sh (Q6_K), Z21..Z31 temporaries. SI the weights
// (forward), DI the tile's activations (R8 x), CX the tiles left, R9 nb,
// R10 the panels left, DX out.
func genKVPanel(e *emitter, typ string) {
	bb := 144
	if typ == "Q6_K" {
		bb = 210
	}
	e.text(fmt.Sprintf("q%sVpanel", typ), kvpSig, 40)
	e.in("MOVQ w+0(FP), SI")
	e.in("MOVQ x+8(FP), R8")
	e.in("MOVQ nb+16(FP), R9")
	e.in("MOVQ out+24(FP), DX")
	e.in("MOVQ panels+32(FP), R10")
	e.in("VMOVDQU64 kv0F<>(SB), Z14")
	e.in("VMOVDQU64 kv30<>(SB), Z15")
	if typ == "Q4_K" {
		for k := 0; k < 4; k++ {
			e.in("VMOVDQU64 kvs%d<>(SB), Z%d", k, 16+k)
		}
		e.in("VMOVDQU64 kvmin<>(SB), Z20")
		e.in("MOVL $0xAA, AX")
		e.in("KMOVB AX, K1") // dwords 1, 3 of each 128-bit lane
		e.in("MOVL $0x88, AX")
		e.in("KMOVB AX, K2") // dword 3 of each 128-bit lane
	} else {
		for c := 0; c < 4; c++ {
			e.in("VMOVDQU64 kv6s%d<>(SB), Z%d", c, 16+c)
		}
		e.in("VMOVDQU64 kv6sh<>(SB), Z20")
		e.in("MOVL $0xFFFF0000, AX")
		e.in("KMOVD AX, K1") // the high 16 words of a ZMM
		e.in("MOVL $0xFF00, AX")
		e.in("KMOVD AX, K2") // the high 8 words of a YMM
	}
	e.in("TESTQ R10, R10")
	e.in("JLE end")
	e.label("panel")
	for i := 0; i < 8; i++ {
		e.in("VPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	e.in("MOVQ R8, DI")
	e.in("MOVQ R9, CX")
	e.in("TESTQ CX, CX")
	e.in("JLE reduce")
	e.label("tile")
	e.in("VBROADCASTSS %d(DI), Z13", xbKD)
	if typ == "Q4_K" {
		// [x0 | x2], [x1 | x3], [x4 | x6], [x5 | x7]
		for k, s := range [][2]int{{0, 2}, {1, 3}, {4, 6}, {5, 7}} {
			e.in("VMOVDQU64 %d(DI), Y%d", 32*s[0], 8+k)
			e.in("VINSERTI64X4 $1, %d(DI), Z%d, Z%d", 32*s[1], 8+k, 8+k)
		}
		e.in("VBROADCASTI64X4 %d(DI), Z12", xbKBs)
		for p := 0; p < 8; p++ {
			kvQ4KPair(e, p)
			kvPrefetch(e, bb, p)
		}
	} else {
		for c := 0; c < 4; c++ {
			e.in("VMOVDQU64 %d(DI), Z%d", 64*c, 8+c)
		}
		e.in("VPXORD Y12, Y12, Y12")
		e.in("VPSUBW %d(DI), Y12, Y12", xbKBs) // -bs
		for p := 0; p < 8; p++ {
			kvQ6KPair(e, p)
			kvPrefetch(e, bb, p)
		}
	}
	e.in("ADDQ $%d, SI", 16*bb)
	e.in("ADDQ $%d, DI", xbK)
	e.in("DECQ CX")
	e.in("JNZ tile")
	e.label("reduce")
	// reduceLanes of each row: Z(i) = [row 2i | row 2i+1], 128-bit lanes
	// [a0..a3, a4..a7 | ...]
	for i := 0; i < 8; i++ {
		e.in("VSHUFF32X4 $0xB1, Z%d, Z%d, Z21", i, i)
		e.in("VADDPS Z21, Z%d, Z21", i) // v_l = a_l + a_(l+4) (lanes 0, 2)
		e.in("VPERMILPS $0x4E, Z21, Z22")
		e.in("VADDPS Z22, Z21, Z21") // v0+v2, v1+v3
		e.in("VMOVSHDUP Z21, Z22")
		e.in("VADDSS X22, X21, X23") // (v0+v2) + (v1+v3): row 2i
		e.in("VMOVSS X23, %d(DX)", 8*i)
		e.in("VEXTRACTF32X4 $2, Z21, X24")
		e.in("VEXTRACTF32X4 $2, Z22, X25")
		e.in("VADDSS X25, X24, X24") // row 2i+1
		e.in("VMOVSS X24, %d(DX)", 8*i+4)
	}
	e.in("ADDQ $64, DX")
	e.in("DECQ R10")
	e.in("JNZ panel")
	e.label("end")
	e.in("VZEROUPPER")
	e.in("RET")
}

// kvAhead is how many tiles ahead the one-token K-quant panel kernels
// prefetch.
const kvAhead = 2

// kvPrefetch emits, after pair p of a tile of 16 rows of bb bytes, its
// share of the prefetches (PREFETCHT0, one per 64-byte line) of the tile
// kvAhead tiles on: the weights are one forward stream, so that is the
// tile the kernel reads kvAhead tiles later (past the matrix's end a
// prefetch is wasted, never a fault). Without it the hardware prefetchers
// do not keep up (as for Q4_0's and Q8_0's panels, qpanelPrefetch).
func kvPrefetch(e *emitter, bb, p int) {
	prefetchShare(e, 16*bb, kvAhead, p, 8)
}

// kvRow is the address of byte off of row j of the tile at SI.
func kvRow(bb, j, off int) string { return fmt.Sprintf("%d(SI)", j*bb+off) }

// kvFold adds the halves of the integer sums of rows 2p (Z28) and 2p+1
// (Z29) into Z30 = [row 2p | row 2p+1].
func kvFold(e *emitter) {
	e.in("VSHUFI64X2 $0x44, Z29, Z28, Z30") // [lo 2p | lo 2p+1]
	e.in("VSHUFI64X2 $0xEE, Z29, Z28, Z31") // [hi 2p | hi 2p+1]
	e.in("VPADDD Z31, Z30, Z30")
}

// kvQ4KPair: rows 2p, 2p+1 of a Q4_K tile into Z(p).
func kvQ4KPair(e *emitter, p int) {
	const bb = 144
	r0, r1 := 2*p, 2*p+1
	// headers [d, dmin, scales] of both rows, one per 128-bit lane
	e.in("VMOVDQU32 %s, X21", kvRow(bb, r0, 0))
	e.in("VINSERTI32X4 $1, %s, Y21, Y21", kvRow(bb, r1, 0))
	// unpack: dwords [D, u0, u1, u2] → [sc0..3, sc4..7, m0..3, m4..7]
	e.in("VPSHUFD $0xED, Y21, Y22")         // [u0, u2, u1, u2]
	e.in("VPSRLD $4, Y22, K2, Y22")         // [u0, u2, u1, u2>>4]
	e.in("VPANDD Y14, Y22, Y22")            // low nibbles
	e.in("VPSHUFD $0xA5, Y21, Y23")         // [u0, u0, u1, u1]
	e.in("VPSRLD $2, Y23, K1, Y23")         // [u0, u0>>2, u1, u1>>2]
	e.in("VPTERNLOGD $0xF8, Y15, Y23, Y22") // |= that & 0x30
	// a = d·dx, bm = dmin·dx, [row 2p ×8 | row 2p+1 ×8]
	e.in("VPSHUFD $0, Y21, Y24")
	e.in("VCVTPH2PS Y24, Z24") // [d dmin ×4 | ...]
	e.in("VMULPS Z13, Z24, Z24")
	e.in("VMOVSLDUP Z24, Z25") // a
	e.in("VMOVSHDUP Z24, Z24") // bm
	// M = m_l·(bs[2l] + bs[2l+1])
	e.in("VSHUFI32X4 $0x50, Z22, Z22, Z26")
	e.in("VPSHUFB Z20, Z26, Z26")
	e.in("VPMADDWD Z12, Z26, Z26")
	for r := 0; r < 2; r++ {
		row := r0 + r
		iz := 28 + r
		e.in("VSHUFI32X4 $%#x, Z22, Z22, Z27", []int{0x00, 0x55}[r]) // U of the row in every lane
		for h := 0; h < 2; h++ {
			e.in("VMOVDQU64 %s, Z30", kvRow(bb, row, 16+64*h))
			e.in("VPANDD Z14, Z30, Z31")
			e.in("VPMADDUBSW Z%d, Z31, Z31", 8+2*h)
			e.in("VPSHUFB Z%d, Z27, Z21", 16+2*h)
			if h == 0 {
				e.in("VPMADDWD Z21, Z31, Z%d", iz)
			} else {
				e.in("VPDPWSSD Z21, Z31, Z%d", iz)
			}
			e.in("VPSRLW $4, Z30, Z30")
			e.in("VPANDD Z14, Z30, Z30")
			e.in("VPMADDUBSW Z%d, Z30, Z30", 9+2*h)
			e.in("VPSHUFB Z%d, Z27, Z21", 17+2*h)
			e.in("VPDPWSSD Z21, Z30, Z%d", iz)
		}
	}
	kvFold(e)
	e.in("VCVTDQ2PS Z30, Z30")
	e.in("VCVTDQ2PS Z26, Z26")
	e.in("VMULPS Z25, Z30, Z30") // float32(I)·a
	e.in("VMULPS Z24, Z26, Z26") // float32(M)·bm
	e.in("VSUBPS Z26, Z30, Z30")
	e.in("VADDPS Z30, Z%d, Z%d", p, p)
}

// kvQ6KPair: rows 2p, 2p+1 of a Q6_K tile into Z(p).
func kvQ6KPair(e *emitter, p int) {
	const bb = 210
	r0, r1 := 2*p, 2*p+1
	// s = d·dx, [row 2p ×8 | row 2p+1 ×8]
	e.in("VPBROADCASTW %s, Y21", kvRow(bb, r0, 208))
	e.in("VPBROADCASTW %s, K2, Y21", kvRow(bb, r1, 208))
	e.in("VCVTPH2PS Y21, Z21")
	e.in("VMULPS Z13, Z21, Z21")
	for r := 0; r < 2; r++ {
		row := r0 + r
		iz := 28 + r
		e.in("VPMOVSXBW %s, Y22", kvRow(bb, row, 192)) // sc as words
		e.in("VPSLLW $5, Y22, Y23")
		e.in("VPMADDWD Y12, Y23, Y%d", iz) // -32·M (high half 0)
		for n := 0; n < 2; n++ {
			e.in("VMOVDQU64 %s, Z24", kvRow(bb, row, 64*n))           // ql
			e.in("VBROADCASTI64X4 %s, Z25", kvRow(bb, row, 128+32*n)) // qh, both halves
			// groups 4n, 4n+1: qh bits 0,1 and 2,3 to bits 4,5
			e.in("VPSLLVW Z20, Z25, Z26")
			e.in("VPANDD Z15, Z26, Z26")
			e.in("VPTERNLOGD $0xF8, Z14, Z24, Z26") // |= ql & 0x0F
			e.in("VPMADDUBSW Z%d, Z26, Z26", 8+2*n)
			e.in("VPERMW Z22, Z%d, Z27", 16+2*n)
			e.in("VPDPWSSD Z27, Z26, Z%d", iz)
			// groups 4n+2, 4n+3: qh bits 4,5 and 6,7
			e.in("VPSRLW $2, Z25, K1, Z25")
			e.in("VPANDD Z15, Z25, Z25")
			e.in("VPSRLW $4, Z24, Z24")
			e.in("VPTERNLOGD $0xF8, Z14, Z24, Z25")
			e.in("VPMADDUBSW Z%d, Z25, Z25", 9+2*n)
			e.in("VPERMW Z22, Z%d, Z27", 17+2*n)
			e.in("VPDPWSSD Z27, Z25, Z%d", iz)
		}
	}
	kvFold(e)
	e.in("VCVTDQ2PS Z30, Z30")
	e.in("VMULPS Z21, Z30, Z30") // float32(I - 32·M)·s
	e.in("VADDPS Z30, Z%d, Z%d", p, p)
}
