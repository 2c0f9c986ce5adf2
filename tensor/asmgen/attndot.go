//go:build ignore

package main

import "fmt"

// Scores of a panel of q8 or q4 keys by integer dot products with a query
// rounded to int8 (package tensor's attndot.go has the Go twin and the
// query's packing): the panel's levels transposed so that each dword lane
// j holds four channels of slot j (VPERMB for 8 bits, VPERMI2B over the
// low and high nibbles for 4), then VPDPBUSD adds four level × query
// products a lane per row; the slots' scales and minimums are applied once
// per score at the end. AVX-512 with VNNI and VBMI.

func genAttnDot(e *emitter) {
	var p8, p4a, p4b [64]byte
	for j := range 16 {
		for c := range 4 {
			p8[4*j+c] = byte(16*c + j) // row c, lane j of 4 rows of 16 bytes
			// 4 bits: low[8c+i] is lane 2i of row c, high[8c+i] (index
			// 64 + 8c + i of the pair) lane 2i+1; rows 0-3, then 4-7.
			for h, p := range []*[64]byte{&p4a, &p4b} {
				r := 4*h + c
				if j%2 == 0 {
					p[4*j+c] = byte(8*r + j/2)
				} else {
					p[4*j+c] = byte(64 + 8*r + j/2)
				}
			}
		}
	}
	e.dataBytes("qdperm8", p8[:])
	e.dataBytes("qdperm4a", p4a[:])
	e.dataBytes("qdperm4b", p4b[:])
	e.dataBytes("pvfltmin", []byte{0, 0, 0x80, 0, 0, 0, 0, 0})  // FLT_MIN, 0x00800000
	e.dataBytes("pvc127", []byte{0, 0, 0xfe, 0x42, 0, 0, 0, 0}) // 127.0, 0x42fe0000
	for _, bits := range []int{8, 4} {
		for m := 1; m <= 12; m++ {
			genQKDZ(e, bits, m)
		}
	}
	var p4 [64]byte // 4 bits: lane c, byte s: slot s's channel c, from its low (c even) or high nibbles
	for c := range 16 {
		for sl := range 4 {
			p4[4*c+sl] = byte(32*(c%2) + 8*sl + c/2)
		}
	}
	e.dataBytes("pvperm4", p4[:])
	for _, bits := range []int{8, 4} {
		for m := 1; m <= 12; m++ {
			genPVDZ(e, bits, m)
		}
	}
}

const qkDSig = "(p *byte, xp *byte, k int, c *float32, ldc int, sm *float32, cst *float32)"

// qkD<bits>Zm<M>(p *byte, xp *byte, k int, c *float32, ldc int, sm *float32,
// cst *float32): the scores of M int8 query rows (xp: [k/4][M][4] bytes)
// against the panel of k rows of 16 levels at p (AttnScoresQ's layout; k a
// multiple of 4 for 8 bits, of 8 for 4), row t's score j
// ((float32(acc_tj)·sm[j])·cst[3t]) + sm[16+j]·cst[3t+1] + cst[3t+2], stored
// at c + t·ldc bytes. Registers: the integer accumulators Z0..Z<M−1>, the
// levels Z31 (8 bits; 4 bits: low nibbles Z31, high Z30, transposed into
// Z27 and Z26), the permutations Z28, Z29.
func genQKDZ(e *emitter, bits, m int) {
	qkHeadZ(e, fmt.Sprintf("qkD%dZm%d", bits, m), qkDSig, 56, m)
	if bits == 8 {
		e.in("VMOVDQU64 qdperm8<>(SB), Z28")
		e.label("loop")
		e.in("VMOVDQU64 (SI), Z31")
		e.in("VPERMB Z31, Z28, Z31")
		for t := range m {
			e.in("VPDPBUSD.BCST %d(DI), Z31, Z%d", 4*t, t)
		}
		e.in("ADDQ $64, SI")
		e.in("ADDQ $%d, DI", 4*m)
		e.in("SUBQ $4, CX")
	} else {
		e.in("VMOVDQU64 qdperm4a<>(SB), Z28")
		e.in("VMOVDQU64 qdperm4b<>(SB), Z29")
		e.label("loop")
		e.in("VMOVDQU64 (SI), Z31")
		nibbles(e, "Z", 31, 30, ".BCST qmask0F<>(SB)")
		e.in("VMOVDQA64 Z28, Z27")
		e.in("VPERMI2B Z30, Z31, Z27")
		e.in("VMOVDQA64 Z29, Z26")
		e.in("VPERMI2B Z30, Z31, Z26")
		for t := range m {
			e.in("VPDPBUSD.BCST %d(DI), Z27, Z%d", 4*t, t)
		}
		for t := range m {
			e.in("VPDPBUSD.BCST %d(DI), Z26, Z%d", 4*m+4*t, t)
		}
		e.in("ADDQ $64, SI")
		e.in("ADDQ $%d, DI", 8*m)
		e.in("SUBQ $8, CX")
	}
	e.in("JNZ loop")
	e.label("done")
	e.in("MOVQ sm+40(FP), AX")
	e.in("MOVQ cst+48(FP), R8")
	e.in("VMOVUPS (AX), Z30")
	e.in("VMOVUPS 64(AX), Z29")
	for t := range m {
		e.in("VCVTDQ2PS Z%d, Z%d", t, t)
		e.in("VMULPS Z30, Z%d, Z%d", t, t)
		e.in("VMULPS.BCST %d(R8), Z%d, Z%d", 12*t, t, t)
		e.in("VMULPS.BCST %d(R8), Z29, Z31", 12*t+4)
		e.in("VADDPS Z31, Z%d, Z%d", t, t)
		e.in("VADDPS.BCST %d(R8), Z%d, Z%d", 12*t+8, t, t)
		e.in("VMOVUPS Z%d, (DX)", t)
		if t < m-1 {
			e.in("ADDQ BX, DX")
		}
	}
	e.in("VZEROUPPER")
	e.in("RET")
}

const pvDSig = "(p *float32, ldp int, v *byte, ldv int, o *float32, ldo int, cols int, sm *float32, ws *byte)"

// pvD<bits>Zm<M>(p *float32, ldp int, v *byte, ldv int, o *float32, ldo
// int, cols int, sm *float32, ws *byte): the weighted sum of 16 rows of 8-
// or 4-bit value levels (row i at v + i·ldv; 4 bits: channel 2j in the low
// nibble of byte j) for the M weight rows at p (ldp bytes apart), added to
// the M output rows at o (ldo bytes apart), over cols
// columns (a multiple of 16); slot i decodes as sm[i]·u + sm[16+i]. Each
// weight row is first rounded to int8 against its slots' scales: w_i =
// p_i·sm[i], W = max(max_i w_i, FLT_MIN), the levels round(w_i·(127/W))
// to ws + 16r, a = W/127 and mm = Σ_i p_i·sm[16+i] (summed as a tree: i
// and i+8, then +4, +2, +1) to the floats at ws + 16M + 8r. Then 16
// columns at a time: the slots' levels four at a time transposed (VPERMB;
// 4 bits: their nibbles spread to bytes first) and summed against the
// weights by VPDPBUSD, and o[r][c] += float32(acc)·a + mm.
func genPVDZ(e *emitter, bits, m int) {
	e.text(fmt.Sprintf("pvD%dZm%d", bits, m), pvDSig, 72)
	e.in("MOVQ p+0(FP), SI")
	e.in("MOVQ ldp+8(FP), BX")
	e.in("MOVQ sm+56(FP), AX")
	e.in("MOVQ ws+64(FP), DI")
	e.in("VMOVUPS (AX), Z30")
	e.in("VMOVUPS 64(AX), Z29")
	e.in("VBROADCASTSS pvfltmin<>(SB), X28")
	e.in("VBROADCASTSS pvc127<>(SB), X27")
	// hmax / hsum: the tree over the 16 lanes of Z<src> into X<dst> lane 0.
	tree := func(op string, src, dst int) {
		e.in("VEXTRACTF32X8 $1, Z%d, Y%d", src, dst)
		e.in("%s Y%d, Y%d, Y%d", op, dst, src, dst)
		e.in("VEXTRACTF128 $1, Y%d, X4", dst)
		e.in("%s X4, X%d, X%d", op, dst, dst)
		e.in("VPERMILPS $0x4e, X%d, X4", dst)
		e.in("%s X4, X%d, X%d", op, dst, dst)
		e.in("VPERMILPS $0xb1, X%d, X4", dst)
		e.in("%s X4, X%d, X%d", op, dst, dst)
	}
	for r := range m {
		e.in("VMOVUPS (SI), Z0")
		e.in("VMULPS Z30, Z0, Z1")
		e.in("VMULPS Z29, Z0, Z2")
		tree("VMAXPS", 1, 3)
		e.in("VMAXSS X28, X3, X3")
		e.in("VDIVSS X3, X27, X5")
		e.in("VDIVSS X27, X3, X6")
		e.in("VBROADCASTSS X5, Z5")
		e.in("VMULPS Z5, Z1, Z1")
		e.in("VCVTPS2DQ Z1, Z1")
		e.in("VPMOVDB Z1, %d(DI)", 16*r)
		tree("VADDPS", 2, 3)
		e.in("VMOVSS X6, %d(DI)", 16*m+8*r)
		e.in("VMOVSS X3, %d(DI)", 16*m+8*r+4)
		if r < m-1 {
			e.in("ADDQ BX, SI")
		}
	}
	e.in("MOVQ v+16(FP), R13")
	e.in("MOVQ ldv+24(FP), R9")
	e.in("MOVQ o+32(FP), DX")
	e.in("MOVQ ldo+40(FP), R10")
	e.in("MOVQ cols+48(FP), R11")
	e.in("LEAQ (R9)(R9*2), R12")
	e.in("LEAQ (R9*4), R15")
	if bits == 8 {
		e.in("VMOVDQU64 qdperm8<>(SB), Z31")
	} else {
		e.in("VMOVDQU64 pvperm4<>(SB), Z31")
	}
	e.in("TESTQ R11, R11")
	e.in("JZ done")
	e.label("loop")
	for r := range m {
		e.in("VPXORD Z%d, Z%d, Z%d", r, r, r)
	}
	e.in("MOVQ R13, R14")
	for q := range 4 {
		if bits == 8 {
			e.in("VMOVDQU32 (R14), X24")
			e.in("VINSERTI32X4 $1, (R14)(R9*1), Z24, Z24")
			e.in("VINSERTI32X4 $2, (R14)(R9*2), Z24, Z24")
			e.in("VINSERTI32X4 $3, (R14)(R12*1), Z24, Z24")
		} else {
			// The 8 bytes of 16 channels of each of the 4 slots: low
			// nibbles in the low 32 bytes of Z24, high nibbles above.
			e.in("VMOVQ (R14), X24")
			e.in("VPINSRQ $1, (R14)(R9*1), X24, X24")
			e.in("VMOVQ (R14)(R9*2), X25")
			e.in("VPINSRQ $1, (R14)(R12*1), X25, X25")
			e.in("VINSERTI32X4 $1, X25, Y24, Y24")
			nibbles(e, "Y", 24, 25, ".BCST qmask0F<>(SB)")
			e.in("VINSERTI64X4 $1, Y25, Z24, Z24")
		}
		e.in("VPERMB Z24, Z31, Z24")
		for r := range m {
			e.in("VPDPBUSD.BCST %d(DI), Z24, Z%d", 16*r+4*q, r)
		}
		if q < 3 {
			e.in("ADDQ R15, R14")
		}
	}
	e.in("MOVQ DX, R8")
	for r := range m {
		e.in("VCVTDQ2PS Z%d, Z%d", r, r)
		e.in("VMULPS.BCST %d(DI), Z%d, Z%d", 16*m+8*r, r, r)
		e.in("VADDPS.BCST %d(DI), Z%d, Z%d", 16*m+8*r+4, r, r)
		e.in("VADDPS (R8), Z%d, Z%d", r, r)
		e.in("VMOVUPS Z%d, (R8)", r)
		if r < m-1 {
			e.in("ADDQ R10, R8")
		}
	}
	e.in("ADDQ $%d, R13", 2*bits)
	e.in("ADDQ $64, DX")
	e.in("SUBQ $16, R11")
	e.in("JNZ loop")
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}
