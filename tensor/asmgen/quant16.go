//go:build ignore

package main

import "fmt"

// genQ16P: the 16-row version of genQ8P (AVX-512 VNNI): sixteen weight
// rows in the sixteen lanes of a ZMM register, so that each VPDPBUSD does
// sixteen rows' four products at once (Zen 4 runs ~1.5× the products per
// second in ZMM as in YMM). Per row, token and block the operations are
// genQ8P's (and the twin's, qp8Twin): the block's integer sum, started at
// the token's correction, one conversion, one multiply by dx and one fused
// multiply-add by the row's dw.
//
// q<typ>Vp16t<T>(w, ldw, x, xs, nb, acc, load): rows at w + i·ldw (i <
// 16), block b of token t at x + b·xs + t·40, acc[t·16 + i]. T ≤ 8 keeps
// the accumulators in registers; T = 16 keeps them in acc (read and
// written back block by block).
//
// Transposition: register R_i (i < 8) holds two rows' 32 quant bytes, one
// per 256-bit half: rows i and i+4 for i < 4, rows i+4 and i+8 for i ≥ 4.
// genQ8P's unpacks (within 128-bit lanes) work on both halves at once,
// and the final VSHUFI32X4 (imm 0x88 and 0xDD) puts the sixteen rows'
// dword g in order into G(g).
//
// While it reads a tile's blocks it prefetches the next tile (the 16·nb·bb
// bytes after the tile's: rows 16..31 in the row layout, the next panel
// in panels) as one range, 16·bb bytes per block.
func genQ16P(e *emitter, typ string, T int) {
	e.text(fmt.Sprintf("q%sVp16t%d", typ, T), rowTileSig, 64)
	inMem := T > 8
	rowTileArgs(e)
	e.in("LEAQ (R9)(BX*4), R13")  // row 8
	e.in("LEAQ (R13)(BX*4), R14") // row 12
	// Z0..Z7 acc[t] (T ≤ 8), Z8..Z15 weight groups, Z16..Z23 integer sums
	// (and transposition temporaries; T = 16: Z16..Z23 then Z0..Z7), Z24
	// dw, Z25 0x80 bytes (Q8_0) or the mask 0x0F (Q4_0), Z26 a temporary.
	G := func(g int) int { return 8 + g }
	P := func(t int) int { return 16 + t }
	accPrologue(e, "Z", T, inMem, 64)
	if typ == "Q4_0" {
		e.in("VPBROADCASTD qmask0F<>(SB), Z25")
		// K1: the words of 128-bit lanes 1 and 3 (the high nibbles)
		e.in("MOVL $0xFF00FF00, AX")
		e.in("KMOVD AX, K1")
	} else {
		e.in("VPBROADCASTD qconst80<>(SB), Z25")
	}
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	// The next tile: its 16·nb·bb bytes (16 rows in the row layout, the
	// next panel in panels) prefetched as one range, 16·bb bytes per
	// block, from AX = w + 16·nb·bb. R11 = bs.
	bb := 34
	if typ == "Q4_0" {
		bb = 18
	}
	e.in("MOVQ bs+56(FP), R11")
	e.in("IMUL3Q $%d, CX, AX", 16*bb)
	e.in("ADDQ SI, AX")
	type base struct {
		row int
		reg string
	}
	bases := []base{{0, "SI"}, {4, "R9"}, {8, "R13"}, {12, "R14"}}
	idx := []struct {
		d  int
		ix string
	}{{1, "(BX*1)"}, {2, "(BX*2)"}, {3, "(R8*1)"}, {4, "(BX*4)"}, {6, "(R8*2)"}, {8, "(BX*8)"}, {12, "(R8*4)"}, {24, "(R8*8)"}}
	addr := func(r, off int) string {
		for _, b := range bases {
			if b.row == r {
				return fmt.Sprintf("%d(%s)", off, b.reg)
			}
		}
		for _, b := range bases {
			for _, x := range idx {
				if b.row+x.d == r {
					return fmt.Sprintf("%d(%s)%s", off, b.reg, x.ix)
				}
			}
		}
		panic(fmt.Sprintf("row %d has no address", r))
	}
	e.label("loop")
	for off := 0; off < 16*bb; off += 64 {
		e.in("%s %d(AX)", p8Prefetch, off)
	}
	e.in("%s %d(AX)", p8Prefetch, 16*bb-1)
	// the rows' scales: sixteen f16 into Y24 (rows 0..7 in X24, 8..15 in
	// X26), then float32
	for i := 0; i < 8; i++ {
		e.in("VPINSRW $%d, %s, X24, X24", i, addr(i, 0))
	}
	for i := 0; i < 8; i++ {
		e.in("VPINSRW $%d, %s, X26, X26", i, addr(8+i, 0))
	}
	e.in("VINSERTI32X4 $1, X26, Y24, Y24")
	e.in("VCVTPH2PS Y24, Z24")
	// R_i in Z(16+i): rows a | b as unsigned bytes, qw+128 (Q8_0) or the
	// nibbles, values 0..15 low and 16..31 high in each half (Q4_0)
	for i := 0; i < 8; i++ {
		a, b := i, i+4
		if i >= 4 {
			a, b = i+4, i+8
		}
		r := 16 + i
		if typ == "Q4_0" {
			e.in("VBROADCASTI32X4 %s, Y%d", addr(a, 2), r)
			e.in("VBROADCASTI32X4 %s, Y26", addr(b, 2))
			e.in("VINSERTI64X4 $1, Y26, Z%d, Z%d", r, r)
			e.in("VPSRLW $4, Z%d, K1, Z%d", r, r)
			e.in("VPANDD Z25, Z%d, Z%d", r, r)
		} else {
			e.in("VMOVDQU32 %s, Y%d", addr(a, 2), r)
			e.in("VINSERTI64X4 $1, %s, Z%d, Z%d", addr(b, 2), r, r)
			e.in("VPXORD Z25, Z%d, Z%d", r, r)
		}
	}
	// genQ8P's transpose in each 256-bit half
	for k := 0; k < 4; k++ {
		e.in("VPUNPCKLDQ Z%d, Z%d, Z%d", 16+2*k+1, 16+2*k, G(2*k))
		e.in("VPUNPCKHDQ Z%d, Z%d, Z%d", 16+2*k+1, 16+2*k, G(2*k+1))
	}
	for h := 0; h < 2; h++ {
		a, b, c, d := G(4*h), G(4*h+1), G(4*h+2), G(4*h+3)
		e.in("VPUNPCKLQDQ Z%d, Z%d, Z%d", c, a, P(4*h))
		e.in("VPUNPCKHQDQ Z%d, Z%d, Z%d", c, a, P(4*h+1))
		e.in("VPUNPCKLQDQ Z%d, Z%d, Z%d", d, b, P(4*h+2))
		e.in("VPUNPCKHQDQ Z%d, Z%d, Z%d", d, b, P(4*h+3))
	}
	// P(j) lanes: [rows a0..a3 dword j, a0..a3 j+4, b0..b3 j, b0..b3 j+4]
	// (a_i, b_i of R_0..R_3; P(4+j) those of R_4..R_7)
	for j := 0; j < 4; j++ {
		e.in("VSHUFI32X4 $0x88, Z%d, Z%d, Z%d", P(4+j), P(j), G(j))
		e.in("VSHUFI32X4 $0xDD, Z%d, Z%d, Z%d", P(4+j), P(j), G(4+j))
	}
	qpSums(e, "Z", T, inMem, 64)
	for _, r := range []string{"SI", "R9", "R13", "R14"} {
		e.in("ADDQ R11, %s", r)
	}
	e.in("ADDQ $%d, AX", 16*bb)
	e.in("ADDQ R10, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	if !inMem {
		for t := 0; t < T; t++ {
			e.in("VMOVUPS Z%d, %d(DX)", t, 64*t)
		}
	}
	e.in("VZEROUPPER")
	e.in("RET")
}
