//go:build ignore

package main

import "fmt"

// Attention over quantized keys and values, decoded in registers (package
// tensor's attnq.go has their plain Go twins): the scores of a panel of q8
// or q4 keys (a scale and minimum per slot) or of KIVI's 4- or 2-bit keys
// (a scale and minimum per channel), and the weighted sum of 8-, 4- or
// 2-bit value rows, each level decoded as s·u + m (a product then a sum,
// each rounded: scalePanel's, scaleLevels's and scaleBytes's arithmetic)
// right before it is used, instead of a panel or rows decoded to float32
// in memory and read back. AVX-512 only; the AVX2 level runs the twins,
// which decode with the AVX2 kernels first.

func genAttnQ(e *emitter) {
	var sh2, sh4, perm4 [64]byte // dwords: 2j; 4·(j mod 8); j/8
	for j := range 16 {
		sh2[4*j], sh4[4*j], perm4[4*j] = byte(2*j), byte(4*(j%8)), byte(j/8)
	}
	e.dataBytes("lvshift2", sh2[:])
	e.dataBytes("lvshift4", sh4[:])
	e.dataBytes("lvperm4", perm4[:])
	e.dataBytes("lvdw", []byte{3, 0, 0, 0, 15, 0, 0, 0}) // the dwords 3 and 15
	genHalfPairs(e)
	genHalfPairsY(e)
	for _, bits := range []int{8, 4} {
		for _, shift := range []bool{false, true} {
			for m := 1; m <= 14; m++ {
				genQKQZ(e, bits, m, shift)
			}
		}
	}
	for _, bits := range []int{4, 2} {
		for m := 1; m <= 14; m++ {
			genQKCZ(e, bits, m)
		}
	}
	for _, bits := range []int{8, 4, 2} {
		for m := 1; m <= 6; m++ {
			genPVQZ(e, bits, m)
		}
	}
}

// spreadZ makes the 16 levels of 4 bits at off(base) (packed low nibble
// first) 16 bytes in order in X<r[0]>, with X<r[1]> overwritten; mask is
// the nibble mask's operand (a register holding 0x0F in every byte, or a
// memory operand to broadcast).
func spreadZ(e *emitter, base string, off int, r []int, mask string) {
	e.in("VMOVQ %d(%s), X%d", off, base, r[0])
	nibbles(e, "X", r[0], r[1], mask)
	e.in("VPUNPCKLBW X%d, X%d, X%d", r[1], r[0], r[0])
}

// nibbles splits the bytes of register <w><lo> (w: X, Y or Z) into their
// low nibbles, left in <w><lo>, and their high nibbles, into <w><hi>;
// mask is the nibble mask's operand (as spreadZ's).
func nibbles(e *emitter, w string, lo, hi int, mask string) {
	e.in("VPSRLW $4, %s%d, %s%d", w, lo, w, hi)
	e.in("VPANDD%s, %s%d, %s%d", mask, w, lo, w, lo)
	e.in("VPANDD%s, %s%d, %s%d", mask, w, hi, w, hi)
}

// levelsDW puts the 16 levels of bits 2 or 4 at off(base) (packed low bits
// first) in the 16 dword lanes of Z<dst>: 2 bits, the 4 bytes broadcast
// to every lane and lane j shifted right by 2j; 4 bits, the 8 bytes in
// X<tmp>, lane j taking dword j/8 (VPERMD, the indices lvperm4 in
// Z<perm>) shifted right by 4·(j mod 8); then masked to the level.
func levelsDW(e *emitter, bits int, base string, off, dst, tmp, perm int) {
	if bits == 2 {
		e.in("VPBROADCASTD %d(%s), Z%d", off, base, dst)
		e.in("VPSRLVD lvshift2<>(SB), Z%d, Z%d", dst, dst)
		e.in("VPANDD.BCST lvdw<>+0(SB), Z%d, Z%d", dst, dst)
		return
	}
	e.in("VMOVQ %d(%s), X%d", off, base, tmp)
	e.in("VPERMD Z%d, Z%d, Z%d", tmp, perm, dst)
	e.in("VPSRLVD lvshift4<>(SB), Z%d, Z%d", dst, dst)
	e.in("VPANDD.BCST lvdw<>+4(SB), Z%d, Z%d", dst, dst)
}

const qkCSig = "(p *byte, xp *float32, k int, c *float32, ldc int, sc *float32, mn *float32)"

// qkC<bits>Zm<M>(p *byte, xp *float32, k int, c *float32, ldc int,
// sc *float32, mn *float32): qkZm<M> over the panel of k rows of 16 levels
// of bits 4 or 2 at p (row c: 2·bits bytes, lane j at bits j·bits … low
// bits first), row c decoded as u·sc[c] + mn[c] exactly as
// scaleLevels<bits>ZR decodes it — KIVI's keys, a scale and minimum per
// channel. Registers: accumulators Z0..Z<M−1>, products Z<M>..Z25, the
// key row Z31, the level mask X28, the levels X26, X27, X29, X30.
func genQKCZ(e *emitter, bits, m int) {
	qkHeadZ(e, fmt.Sprintf("qkC%dZm%d", bits, m), qkCSig, 56, m)
	e.in("MOVQ sc+40(FP), AX")
	e.in("MOVQ mn+48(FP), R8")
	if bits == 4 {
		e.in("VMOVDQU32 lvperm4<>(SB), Z28")
	}
	e.label("loop")
	levelsDW(e, bits, "SI", 0, 31, 27, 28)
	e.in("VCVTDQ2PS Z31, Z31")
	e.in("VMULPS.BCST (AX), Z31, Z31")
	e.in("VADDPS.BCST (R8), Z31, Z31")
	e.in("ADDQ $4, AX")
	e.in("ADDQ $4, R8")
	panelProductsZ(e, m, 26-m)
	panelStepZ(e, m, 2*bits)
	qkTailZ(e, m)
}

// halfPairsY: halfPairsZ for AVX2 (F16C), 8 pairs at a time: each
// 128-bit lane's 4 scales gathered into its low 8 bytes and 4 minimums
// into its high 8 (VPSHUFB), the lanes' halves put in order (VPERMQ), and
// each 8 converted.
func genHalfPairsY(e *emitter) {
	var shuf [32]byte
	for l := range 2 {
		for i := range 4 {
			shuf[16*l+2*i], shuf[16*l+2*i+1] = byte(4*i), byte(4*i+1)       // scale i
			shuf[16*l+8+2*i], shuf[16*l+8+2*i+1] = byte(4*i+2), byte(4*i+3) // minimum i
		}
	}
	e.dataBytes("halfpairs", shuf[:])
	e.text("halfPairsY", "(meta *byte, sm *float32)", 16)
	e.in("MOVQ meta+0(FP), SI")
	e.in("MOVQ sm+8(FP), DI")
	for h := range 2 {
		e.in("VMOVDQU %d(SI), Y0", 32*h)
		e.in("VPSHUFB halfpairs<>(SB), Y0, Y0")
		e.in("VPERMQ $0xd8, Y0, Y0")
		e.in("VCVTPH2PS X0, Y1")
		e.in("VEXTRACTI128 $1, Y0, X2")
		e.in("VCVTPH2PS X2, Y2")
		e.in("VMOVUPS Y1, %d(DI)", 32*h)
		e.in("VMOVUPS Y2, %d(DI)", 64+32*h)
	}
	e.in("VZEROUPPER")
	e.in("RET")
}

// halfPairsZ(meta *byte, sm *float32): the 16 {f16 scale, f16 minimum}
// pairs at meta (64 bytes, a pair a little-endian uint32, the scale in its
// low half) as float32, the scales to sm[0:16] and the minimums to
// sm[16:32]; VCVTPH2PS converts every finite and infinite half exactly.
func genHalfPairs(e *emitter) {
	e.text("halfPairsZ", "(meta *byte, sm *float32)", 16)
	e.in("MOVQ meta+0(FP), SI")
	e.in("MOVQ sm+8(FP), DI")
	e.in("VMOVDQU32 (SI), Z0")
	e.in("VPMOVDW Z0, Y1")
	e.in("VCVTPH2PS Y1, Z2")
	e.in("VMOVUPS Z2, (DI)")
	e.in("VPSRLD $16, Z0, Z0")
	e.in("VPMOVDW Z0, Y1")
	e.in("VCVTPH2PS Y1, Z2")
	e.in("VMOVUPS Z2, 64(DI)")
	e.in("VZEROUPPER")
	e.in("RET")
}

// qkQName is the score kernel over a panel of levels: qkQ8Zm<M>,
// qkQ4Zm<M>, with S for the variant that adds a shift per channel.
func qkQName(bits, m int, shift bool) string {
	s := ""
	if shift {
		s = "S"
	}
	return fmt.Sprintf("qkQ%dZm%d%s", bits, m, s)
}

const qkQSig = "(p *byte, xp *float32, k int, c *float32, ldc int, sm *float32, mu *float32)"

// qkQ<bits>Zm<M>[S](p *byte, xp *float32, k int, c *float32, ldc int,
// sm *float32, mu *float32): qkZm<M> over the panel of k rows of 16 levels
// at p (8 bits: 16 bytes a row; 4 bits: 8 bytes, lane 2i in the low nibble
// of byte i, 2i+1 in the high one), lane j of row c decoded as
// u·sm[j] + sm[16+j] (+ mu[c] in the S variant) exactly as scalePanelZ
// decodes it. Registers: accumulators Z0..Z<M−1>, products Z<M>..Z25, the
// key row Z31, the scales Z30, the minimums Z29, the nibble mask X28 and
// the nibbles X26, X27.
func genQKQZ(e *emitter, bits, m int, shift bool) {
	qkHeadZ(e, qkQName(bits, m, shift), qkQSig, 56, m)
	e.in("MOVQ sm+40(FP), AX")
	e.in("MOVQ mu+48(FP), R8")
	e.in("VMOVUPS (AX), Z30")
	e.in("VMOVUPS 64(AX), Z29")
	if bits == 4 {
		e.in("VMOVDQU32 lvperm4<>(SB), Z28")
	}
	e.label("loop")
	if bits == 8 {
		e.in("VPMOVZXBD (SI), Z31")
	} else {
		levelsDW(e, 4, "SI", 0, 31, 27, 28)
	}
	e.in("VCVTDQ2PS Z31, Z31")
	e.in("VMULPS Z30, Z31, Z31")
	e.in("VADDPS Z29, Z31, Z31")
	if shift {
		e.in("VADDPS.BCST (R8), Z31, Z31")
		e.in("ADDQ $4, R8")
	}
	panelProductsZ(e, m, 26-m)
	panelStepZ(e, m, 2*bits)
	qkTailZ(e, m)
}

const pvQSig = "(p *float32, ldp int, v *byte, ldv int, n int, o *float32, ldo int, cols int, sm *float32)"

// pvQ<bits>Zm<M>(p *float32, ldp int, v *byte, ldv int, n int, o *float32,
// ldo int, cols int, sm *float32): pvF32Zm<M> over n ≤ 16 rows of levels
// of bits 8, 4 or 2 (row i at v + i·ldv, packed low bits first), value c
// of row i decoded as u·sm[32k + i] + sm[32k + 16 + i] with k = c/16 (a
// scale and minimum per row and 16 columns) exactly as scaleBytesZ and
// scaleLevels<bits>Z decode it. The same registers as pvF32Zm<M>; the
// levels spread in Z28-Z29 before the products use them. sm+64(FP) is
// moved on by 128 bytes a 16 columns done.
func genPVQZ(e *emitter, bits, m int) {
	genPVZWith(e, m, pvHooks{name: fmt.Sprintf("pvQ%dZm%d", bits, m), sig: pvQSig, args: 72, colBytes: 2 * bits,
		start: func() { e.in("MOVQ sm+64(FP), R14") },
		load: func(j int, z string) {
			switch bits {
			case 8:
				e.in("VPMOVZXBD %d(DI), %s", 16*j, z)
			case 2:
				levelsDW(e, 2, "DI", 4*j, 24+j, 0, 0)
			default:
				spreadZ(e, "DI", 8*j, []int{28, 29}, ".BCST qmask0F<>(SB)")
				e.in("VPMOVZXBD X28, %s", z)
			}
			e.in("VCVTDQ2PS %s, %s", z, z)
			e.in("VMULPS.BCST %d(R14), %s, %s", 128*j, z, z)
			e.in("VADDPS.BCST %d(R14), %s, %s", 128*j+64, z, z)
		},
		next: func() { e.in("ADDQ $4, R14") },
		end: func(w int) {
			e.in("MOVQ sm+64(FP), R14")
			e.in("ADDQ $%d, R14", 128*w)
			e.in("MOVQ R14, sm+64(FP)")
		}})
}
