//go:build ignore

package main

import "fmt"

// One-token kernels for Q8_0 and Q4_0 weights in 16-row panels (AVX-512
// VNNI):
//
//	q<typ>Vpanel(w unsafe.Pointer, x unsafe.Pointer, nb int, out *float32, panels int)
//
// The matrix is stored in panels of 16 rows: panel p at w + p·16·nb·bb,
// inside it tile b (block b of the 16 rows) at +b·16·bb, and inside the
// tile row j's block b (the ordinary bb-byte block) at +j·bb; so the
// kernel reads one forward stream. out[16p+j] is, bit for bit, what the
// rows kernel (genQ32Rows, Go twin qrows2Go) gives for that row: blocks
// alternately into two eight-lane accumulators (even blocks in the first,
// which takes a last unpaired block), added lane by lane, then
// reduceLanes' tree.
//
// Per pair of blocks (b, b+1) the activations are loaded once for all 16
// rows, block b in the low 256 bits of a ZMM register and block b+1 in the
// high (qx, the corrections, the eight lane scales). Each row keeps one
// ZMM accumulator whose low eight lanes are the even-block accumulator and
// high eight lanes the odd-block one; its weights of tile b go to the low
// half and of tile b+1 to the high half (dw likewise), then the steps of
// genQ32Rows: P = corr + VPDPBUSD(unsigned weights, qx), float32(P)·dx,
// and a fused multiply-add by dw into the accumulator. A last unpaired
// block runs on the low halves, its multiply-add masked to the low eight
// lanes. At the end of the panel each row's high half is added to its low
// half (e[l] + d[l]) and summed by sumTree (reduceLanes' tree). The
// weights are read strictly forward, with a software prefetch of the pair
// qpanelAhead pairs on (qpanelPrefetch).
//
// Registers: Z0..Z15 the rows' accumulators, Z16..Z18 qx, corr and dx of
// the pair, Z19 0x80 bytes (Q8_0) or the mask 0x0F (Q4_0), Z20 the nibble
// shifts (Q4_0), Z21..Z29 three sets of temporaries (weights, dw, P) used
// by rows in turn. K1 = 0xFF00 (the high half of sixteen words or dwords:
// merge the odd block's dw or nibbles), K2 = 0x00FF (the low eight float
// lanes: the unpaired block).
func genQuantPanel(e *emitter) {
	// qpanelShift: qword shift counts 0, 0, 4, 4 in each 256-bit half (the
	// nibbles of a block broadcast to both of its 128-bit lanes: the low
	// lane keeps values 0..15, the high lane shifts to values 16..31)
	var sh [64]byte
	for q := 0; q < 8; q++ {
		if q%4 >= 2 {
			sh[8*q] = 4
		}
	}
	e.dataBytes("qpanelShift", sh[:])
	genQPanel(e, "Q8_0")
	genQPanel(e, "Q4_0")
}

const qpanelSig = "(w unsafe.Pointer, x unsafe.Pointer, nb int, out *float32, panels int)"

func genQPanel(e *emitter, typ string) {
	bb := 34
	if typ == "Q4_0" {
		bb = 18
	}
	tile := 16 * bb
	e.text(fmt.Sprintf("q%sVpanel", typ), qpanelSig, 40)
	e.in("MOVQ w+0(FP), SI")
	e.in("MOVQ nb+16(FP), R9")
	e.in("MOVQ out+24(FP), DX")
	e.in("MOVQ panels+32(FP), AX")
	e.in("TESTQ AX, AX")
	e.in("JLE end")
	const xq, xc, xd, cst, shift = 16, 17, 18, 19, 20
	if typ == "Q4_0" {
		e.in("VBROADCASTI64X4 qmask0F<>(SB), Z%d", cst)
		e.in("VMOVDQU64 qpanelShift<>(SB), Z%d", shift)
	} else {
		e.in("VBROADCASTI64X4 qconst80<>(SB), Z%d", cst)
	}
	e.in("MOVL $0xFF00, R10")
	e.in("KMOVW R10, K1")
	e.in("MOVL $0x00FF, R10")
	e.in("KMOVW R10, K2")
	tmp := func(j int) (q, d, p int) {
		s := 21 + 3*(j%3)
		return s, s + 1, s + 2
	}
	// row emits row j's steps for a pair of blocks (pair) or the unpaired
	// last block: wo is the offset of row j's block in the even tile.
	row := func(j int, pair bool) {
		q, d, p := tmp(j)
		wo := j * bb
		if pair {
			qpanelPrefetch(e, tile, j)
		}
		// dw: even block's in words 0..7, odd block's in 8..15
		e.in("VPBROADCASTW %d(SI), Y%d", wo, d)
		if pair {
			e.in("VPBROADCASTW %d(SI), K1, Y%d", tile+wo, d)
		}
		e.in("VCVTPH2PS Y%d, Z%d", d, d)
		if typ == "Q8_0" {
			e.in("VMOVDQU32 %d(SI), Y%d", wo+2, q)
			if pair {
				e.in("VINSERTI64X4 $1, %d(SI), Z%d, Z%d", tile+wo+2, q, q)
			}
			e.in("VPXORD Z%d, Z%d, Z%d", cst, q, q) // unsigned: qw + 128
		} else {
			// nibbles of each block into both 128-bit lanes of its half,
			// the high lane shifted by 4, then the low nibble
			e.in("VBROADCASTI32X4 %d(SI), Z%d", wo+2, q)
			if pair {
				e.in("VBROADCASTI32X4 %d(SI), K1, Z%d", tile+wo+2, q)
			}
			e.in("VPSRLVQ Z%d, Z%d, Z%d", shift, q, q)
			e.in("VPANDD Z%d, Z%d, Z%d", cst, q, q)
		}
		e.in("VMOVDQA32 Z%d, Z%d", xc, p)
		e.in("VPDPBUSD Z%d, Z%d, Z%d", xq, q, p)
		e.in("VCVTDQ2PS Z%d, Z%d", p, p)
		e.in("VMULPS Z%d, Z%d, Z%d", xd, p, p) // float32(P)·dx
		if pair {
			e.in("VFMADD231PS Z%d, Z%d, Z%d", d, p, j) // acc += that·dw, fused
		} else {
			e.in("VFMADD231PS Z%d, Z%d, K2, Z%d", d, p, j) // low lanes only
		}
	}
	e.label("panel")
	e.in("MOVQ x+8(FP), DI")
	for j := 0; j < 16; j++ {
		e.in("VPXORD Z%d, Z%d, Z%d", j, j, j)
	}
	e.in("MOVQ R9, CX")
	e.in("SHRQ $1, CX")
	e.in("JZ tail")
	e.label("pair")
	e.in("VMOVDQU32 (DI), Y%d", xq)
	e.in("VINSERTI64X4 $1, %d(DI), Z%d, Z%d", xb32, xq, xq)
	e.in("VMOVDQU32 %d(DI), Y%d", xb32Corr, xc)
	e.in("VINSERTI64X4 $1, %d(DI), Z%d, Z%d", xb32+xb32Corr, xc, xc)
	e.in("VMOVUPS %d(DI), Y%d", xb32D, xd)
	e.in("VINSERTF64X4 $1, %d(DI), Z%d, Z%d", xb32+xb32D, xd, xd)
	for j := 0; j < 16; j++ {
		row(j, true)
	}
	e.in("ADDQ $%d, SI", 2*tile)
	e.in("ADDQ $%d, DI", 2*xb32)
	e.in("DECQ CX")
	e.in("JNZ pair")
	e.label("tail")
	e.in("TESTQ $1, R9")
	e.in("JZ reduce")
	e.in("VMOVDQU32 (DI), Y%d", xq)
	e.in("VMOVDQU32 %d(DI), Y%d", xb32Corr, xc)
	e.in("VMOVUPS %d(DI), Y%d", xb32D, xd)
	for j := 0; j < 16; j++ {
		row(j, false)
	}
	e.in("ADDQ $%d, SI", tile)
	e.label("reduce")
	for j := 0; j < 16; j++ {
		e.in("VEXTRACTF32X8 $1, Z%d, Y%d", j, xq)
		e.in("VADDPS Y%d, Y%d, Y%d", xq, j, j) // e[l] + d[l]
		sumTree(e, true, j, xq)
		e.in("VMOVSS X%d, %d(DX)", j, 4*j)
	}
	e.in("ADDQ $64, DX")
	e.in("DECQ AX")
	e.in("JNZ panel")
	e.label("end")
	e.in("VZEROUPPER")
	e.in("RET")
}

// qpanelAhead is how many pairs of tiles ahead the panel kernels prefetch.
const qpanelAhead = 8

// qpanelPrefetch emits, at row j of a pair of tiles (tile bytes each), its
// share of the prefetches (PREFETCHT0) of the pair qpanelAhead pairs on:
// one per 64-byte line, spread over the 16 rows. Without it the hardware
// prefetchers do not keep up with Q8_0's two tiles read side by side
// (one thread, 5632×2048 from memory: 5.8–9 GB/s against ~20–25 with it
// and ~21 for the rows kernel, while plain reads ran ~20 GB/s); past the
// matrix's end it is wasted, never a fault.
func qpanelPrefetch(e *emitter, tile, j int) {
	n := 2 * tile / 64
	for i := 0; i < n; i++ {
		if i*16/n == j {
			e.in("PREFETCHT0 %d(SI)", qpanelAhead*2*tile+64*i)
		}
	}
}
