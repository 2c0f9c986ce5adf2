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
// reduceLanes' tree. Each lane of each row takes the steps of genQ32Rows:
// P = corr + VPDPBUSD(unsigned weights, qx), float32(P)·dx, and a fused
// multiply-add by dw into the accumulator. The weights are read strictly
// forward, with a software prefetch of the pair qpanelAhead pairs on
// (qpanelPrefetch). Q8_0 (genQPanel) and Q4_0 (genQ4Panel) place the lanes
// differently. Q4_0 has two kernels: qQ4_0Vpanel with GFNI, qQ4_0VpanelBW
// for the CPUs without it (qpanelV picks).
func genQuantPanel(e *emitter) {
	genQPanel(e)
	genQ4Panel(e, true)
	genQ4Panel(e, false)
}

const qpanelSig = "(w unsafe.Pointer, x unsafe.Pointer, nb int, out *float32, panels int)"

// genQPanel emits qQ8_0Vpanel. Per pair of blocks (b, b+1) the
// activations are loaded once for all 16 rows, block b in the low 256 bits
// of a ZMM register and block b+1 in the high (qx, the corrections, the
// eight lane scales). Each row keeps one ZMM accumulator whose low eight
// lanes are the even-block accumulator and high eight lanes the odd-block
// one; its weights of tile b go to the low half and of tile b+1 to the high
// half (dw likewise). A last unpaired block runs on the low halves, its
// multiply-add masked to the low eight lanes. At the end of the panel each
// row's high half is added to its low half (e[l] + d[l]) and summed by
// sumTree (reduceLanes' tree).
//
// Registers: Z0..Z15 the rows' accumulators, Z16..Z18 qx, corr and dx of
// the pair, Z19 0x80 bytes, Z21..Z29 three sets of temporaries (weights,
// dw, P) used by rows in turn. K1 = 0xFF00 (the high half of sixteen
// words: merge the odd block's dw), K2 = 0x00FF (the low eight float
// lanes: the unpaired block).
func genQPanel(e *emitter) {
	const typ, bb = "Q8_0", 34
	tile := 16 * bb
	e.text(fmt.Sprintf("q%sVpanel", typ), qpanelSig, 40)
	qpanelArgs(e)
	const xq, xc, xd, cst = 16, 17, 18, 19
	e.in("VBROADCASTI64X4 qconst80<>(SB), Z%d", cst)
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
		e.in("VMOVDQU32 %d(SI), Y%d", wo+2, q)
		if pair {
			e.in("VINSERTI64X4 $1, %d(SI), Z%d, Z%d", tile+wo+2, q, q)
		}
		e.in("VPXORD Z%d, Z%d, Z%d", cst, q, q) // unsigned: qw + 128
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
	qpanelHead(e)
	e.in("VMOVDQU32 (DI), Y%d", xq)
	e.in("VINSERTI64X4 $1, %d(DI), Z%d, Z%d", xb32, xq, xq)
	e.in("VMOVDQU32 %d(DI), Y%d", xb32Corr, xc)
	e.in("VINSERTI64X4 $1, %d(DI), Z%d, Z%d", xb32+xb32Corr, xc, xc)
	e.in("VMOVUPS %d(DI), Y%d", xb32D, xd)
	e.in("VINSERTF64X4 $1, %d(DI), Z%d, Z%d", xb32+xb32D, xd, xd)
	for j := 0; j < 16; j++ {
		row(j, true)
	}
	qpanelPairEnd(e, tile)
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
	qpanelEnd(e)
}

// genQ4Panel emits qQ4_0Vpanel (gfni) or qQ4_0VpanelBW: two rows per
// register, their lanes interleaved. Rows 2k and 2k+1 share two
// accumulators: Z(2k) for the even blocks, lane 2l row 2k's lane l and lane
// 2l+1 row 2k+1's, Z(2k+1) the odd blocks likewise; so a pair of blocks
// (b, b+1) is one unit on tile b and one on tile b+1 per two rows, sixteen
// units in all.
//
// At the start of a pair: the activations of block b (qx, corr, dx) with
// each dword doubled (lanes 2l and 2l+1 = lane l: VPERMD) in Z16, Z18,
// Z20, block b+1's in Z17, Z19, Z21; the 16 dw of each tile gathered
// (VPERMT2W from the 9-word stride), converted to float32 and stored to
// the frame (tile b at 0(SP), b+1 at 64(SP)). A unit on rows 2k, 2k+1 of a
// tile then takes dw as VBROADCASTSD of the two floats (a pure load: dw of
// row 2k, 2k+1, …), its weights as one VPERMW from the 64 bytes at 36k of
// the tile (both rows' blocks; 36k-28 for k = 7, so as not to read past
// the tile: Z22 the index, qpanelQ4PermN7 for k = 7) that puts bytes
// 4(l mod 4)..+3 of row 2k's nibbles in dword 2l, row 2k+1's in 2l+1, then
// the nibbles: the low ones in qwords 0..3 (values 0..15), the high ones
// in 4..7 (values 16..31), by one VGF2P8AFFINEQB (Z23: per qword the bit
// matrix; GFNI) or VPSRLVQ by 0 or 4 (Z23) and VPANDD 0x0F (Z25, which
// holds the de-interleave index at the end of a panel); then the copy of
// corr, VPDPBUSD, VCVTDQ2PS, VMULPS and VFMADD231PS. A last unpaired
// block runs the eight units of tile b only. At the end of the panel
// Z(2k) + Z(2k+1) (e[l] + d[l], both rows) is de-interleaved by VPERMPS
// and each row's eight lanes summed by sumTree.
//
// Against one row per register with the halves for the two blocks (per
// row and pair: two word broadcasts, VCVTPH2PS, two nibble broadcasts, one
// masked, VPSRLVQ and VPANDD), alternated in one run, one thread (Zen 4):
// in the caches 19.7-20.2 GB/s against 15.6-16.7 (23.5-23.9 against
// 18.0-19.3 with no subnormal products), qQ4_0VpanelBW 18.0-18.3
// (21.1-21.5); from memory 15.5-16.9 against 14.4-15.1, qQ4_0VpanelBW
// 14.6-15.8 (BenchmarkPanelCache, BenchmarkPanelRows). A VPERMB (VBMI) in
// place of the VPERMW ran the same.
//
// Registers: Z0..Z15 the accumulators, Z16..Z21 the pair's activations,
// Z22 the weight index, Z23 the bit matrices or shifts, Z24 the dw gather
// index, Z25 the de-interleave index (and the mask), Z26..Z31 two sets of
// temporaries (weights, dw, P) used by units in turn (and at a pair's
// start by the gathers and the activations' indices).
func genQ4Panel(e *emitter, gfni bool) {
	const bb = 18
	const tile = 16 * bb
	name, v := "qQ4_0Vpanel", ""
	if !gfni {
		name, v = "qQ4_0VpanelBW", "BW"
	}
	var pn, pn7, nib, gidx, xa, xb, deint [64]byte
	for i := 0; i < 64; i += 2 {
		dw, h := i/4, i/2%2 // output dword, its word
		r, l := dw%2, dw/2  // row (of the two), lane
		pn[i] = byte(9*r + 1 + 2*(l%4) + h)
		pn7[i] = pn[i] + 14
	}
	for q := 4; q < 8; q++ {
		if !gfni {
			nib[8*q] = 4
		}
	}
	for q := 0; q < 8 && gfni; q++ {
		for b := 0; b < 4; b++ { // row 7-b of the matrix gives bit b
			if q >= 4 {
				nib[8*q+7-b] = 1 << (b + 4)
			} else {
				nib[8*q+7-b] = 1 << b
			}
		}
	}
	for i := 0; i < 32; i++ {
		gidx[2*i] = byte(9 * (i % 8)) // words 0..7: dw of rows 0..7 of 128 bytes
	}
	for i := 0; i < 16; i++ {
		xa[4*i] = byte(i / 2)
		xb[4*i] = byte(8 + i/2)
		deint[4*i] = byte(2*(i%8) + i/8)
	}
	c := "qpanelQ4" + v
	e.dataBytes(c+"PermN", pn[:])
	e.dataBytes(c+"PermN7", pn7[:])
	e.dataBytes(c+"Nibbles", nib[:])
	e.dataBytes(c+"Gather", gidx[:])
	e.dataBytes(c+"XA", xa[:])
	e.dataBytes(c+"XB", xb[:])
	e.dataBytes(c+"Deint", deint[:])
	e.frame = 128
	e.text(name, qpanelSig, 40)
	e.frame = 0
	qpanelArgs(e)
	const qxE, cE, dE, pidx, nibR, gidxR, deintR = 16, 18, 20, 22, 23, 24, 25
	e.in("VMOVDQU64 %sPermN<>(SB), Z%d", c, pidx)
	e.in("VMOVDQU64 %sNibbles<>(SB), Z%d", c, nibR)
	e.in("VMOVDQU64 %sGather<>(SB), Z%d", c, gidxR)
	// loadMask: Z25 the mask 0x0F (qQ4_0VpanelBW)
	loadMask := func() {
		if !gfni {
			e.in("VBROADCASTI64X4 qmask0F<>(SB), Z%d", deintR)
		}
	}
	loadMask()
	// gather: tile t's 16 dw as float32 to 64t(SP): rows 0..7 from its
	// bytes 0..127, rows 8..15 from 144..271
	gather := func(t int) {
		o := t * tile
		a, b := 26+2*t, 27+2*t
		e.in("VMOVDQU64 %d(SI), Z%d", o, a)
		e.in("VPERMT2W %d(SI), Z%d, Z%d", o+64, gidxR, a)
		e.in("VMOVDQU64 %d(SI), Z%d", o+144, b)
		e.in("VPERMT2W %d(SI), Z%d, Z%d", o+208, gidxR, b)
		e.in("VINSERTI32X4 $1, X%d, Y%d, Y%d", b, a, a)
		e.in("VCVTPH2PS Y%d, Z%d", a, a)
		e.in("VMOVUPS Z%d, %d(SP)", a, 64*t)
	}
	// loadX: the activations of n blocks, each dword doubled
	loadX := func(n int) {
		e.in("VMOVDQU64 %sXA<>(SB), Z30", c)
		e.in("VMOVDQU64 %sXB<>(SB), Z31", c)
		for h := 0; h < n; h++ {
			o := h * xb32
			e.in("VPERMD %d(DI), Z30, Z%d", o, qxE+h)         // qx
			e.in("VPERMD %d(DI), Z31, Z%d", o, cE+h)          // corr
			e.in("VPERMD %d(DI), Z31, Z%d", o+xb32Corr, dE+h) // dx
		}
	}
	// unit: rows 2k, 2k+1 on tile h of the pair
	unit := func(k, h int, pair bool) {
		s := 26 + 3*((2*k+h)%2)
		q, d, p := s, s+1, s+2
		o := h*tile + 36*k
		if pair && h == 0 {
			qpanelPrefetch(e, tile, 2*k)
			qpanelPrefetch(e, tile, 2*k+1)
		}
		e.in("VBROADCASTSD %d(SP), Z%d", 64*h+8*k, d)
		if k == 7 {
			e.in("VMOVDQU64 %sPermN7<>(SB), Z%d", c, q)
			e.in("VPERMW %d(SI), Z%d, Z%d", o-28, q, q)
		} else {
			e.in("VPERMW %d(SI), Z%d, Z%d", o, pidx, q)
		}
		if gfni {
			e.in("VGF2P8AFFINEQB $0, Z%d, Z%d, Z%d", nibR, q, q)
		} else {
			e.in("VPSRLVQ Z%d, Z%d, Z%d", nibR, q, q)
			e.in("VPANDD Z%d, Z%d, Z%d", deintR, q, q)
		}
		e.in("VMOVDQA32 Z%d, Z%d", cE+h, p)
		e.in("VPDPBUSD Z%d, Z%d, Z%d", qxE+h, q, p)
		e.in("VCVTDQ2PS Z%d, Z%d", p, p)
		e.in("VMULPS Z%d, Z%d, Z%d", dE+h, p, p)       // float32(P)·dx
		e.in("VFMADD231PS Z%d, Z%d, Z%d", d, p, 2*k+h) // acc += that·dw, fused
	}
	qpanelHead(e)
	gather(0)
	gather(1)
	loadX(2)
	for k := 0; k < 8; k++ {
		unit(k, 0, true)
		unit(k, 1, true)
	}
	qpanelPairEnd(e, tile)
	gather(0)
	loadX(1)
	for k := 0; k < 8; k++ {
		unit(k, 0, false)
	}
	e.in("ADDQ $%d, SI", tile)
	e.label("reduce")
	e.in("VMOVDQU64 %sDeint<>(SB), Z%d", c, deintR)
	for k := 0; k < 8; k++ {
		a, b := 2*k, 2*k+1
		e.in("VADDPS Z%d, Z%d, Z%d", b, a, a)       // e[l] + d[l], both rows
		e.in("VPERMPS Z%d, Z%d, Z%d", a, deintR, a) // row 2k's lanes, then 2k+1's
		e.in("VEXTRACTF32X8 $1, Z%d, Y%d", a, b)
		sumTree(e, true, a, qxE)
		e.in("VMOVSS X%d, %d(DX)", a, 4*a)
		sumTree(e, true, b, qxE)
		e.in("VMOVSS X%d, %d(DX)", b, 4*b)
	}
	loadMask()
	qpanelEnd(e)
}

// qpanelArgs loads a panel kernel's arguments: SI w, R9 nb, DX out, AX
// panels (none: to end).
func qpanelArgs(e *emitter) {
	e.in("MOVQ w+0(FP), SI")
	e.in("MOVQ nb+16(FP), R9")
	e.in("MOVQ out+24(FP), DX")
	e.in("MOVQ panels+32(FP), AX")
	e.in("TESTQ AX, AX")
	e.in("JLE end")
}

// qpanelHead emits the start of a panel in the Q8_0 and Q4_0 kernels (SI
// the panel, R9 nb, AX the panels left): DI at x, the accumulators
// Z0..Z15 cleared, CX the pairs of blocks (none: to tail), the label pair.
func qpanelHead(e *emitter) {
	e.label("panel")
	e.in("MOVQ x+8(FP), DI")
	for j := 0; j < 16; j++ {
		e.in("VPXORD Z%d, Z%d, Z%d", j, j, j)
	}
	e.in("MOVQ R9, CX")
	e.in("SHRQ $1, CX")
	e.in("JZ tail")
	e.label("pair")
}

// qpanelPairEnd ends the pair loop (SI and DI past two tiles of tile
// bytes and two activation blocks) and starts the tail: the label tail,
// then on to reduce when nb is even.
func qpanelPairEnd(e *emitter, tile int) {
	e.in("ADDQ $%d, SI", 2*tile)
	e.in("ADDQ $%d, DI", 2*xb32)
	e.in("DECQ CX")
	e.in("JNZ pair")
	e.label("tail")
	e.in("TESTQ $1, R9")
	e.in("JZ reduce")
}

// qpanelEnd ends a panel (out on by 16 floats, the panel loop closed) and
// the kernel.
func qpanelEnd(e *emitter) {
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
	prefetchShare(e, 2*tile, qpanelAhead, j, 16)
}

// prefetchShare emits part (of parts) of the prefetches (PREFETCHT0, one
// per 64-byte line) of the span of span bytes ahead spans on from SI: a
// kernel that reads its weights as one forward stream, span bytes a loop,
// calls it once per part so that the lines are spread over the loop.
func prefetchShare(e *emitter, span, ahead, part, parts int) {
	n := (span + 63) / 64
	for i := 0; i < n; i++ {
		if i*parts/n == part {
			e.in("PREFETCHT0 %d(SI)", ahead*span+64*i)
		}
	}
}
