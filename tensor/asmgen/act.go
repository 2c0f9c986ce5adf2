//go:build ignore

package main

import (
	"encoding/binary"
	"math"
)

// Activation quantization (package tensor's act.go), AVX-512, for finite
// inputs; the kernels return the largest |x| bit pattern seen so that the
// caller can redo a row holding an Inf or NaN with the Go code.
//
// actQ32Z(x *float32, dst *byte, nb, stride int, negCorr int32) uint32
// actQKZ(x *float32, dst *byte, nb, stride int) uint32
func genActQuant(e *emitter) {
	b := make([]byte, 64)
	f32s := func(name string, v float32) {
		for i := 0; i < 16; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		e.dataBytes(name, b)
	}
	u32s := func(name string, v uint32) {
		for i := 0; i < 16; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], v)
		}
		e.dataBytes(name, b)
	}
	u32s("actAbs", 0x7fffffff)
	f32s("actInv127", float32(1.0/127))
	f32s("act127", 127)
	f32s("actM127", -127)
	for i := 0; i < 16; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(4*(i%4))) // lane 0 of each group of four
	}
	e.dataBytes("actSel4", b)

	// quantize16 quantizes Z0 (16 values, four groups of four when group
	// is true, else one scale in Z7 / inverse in Z8 given) into int32 Z5;
	// keeps max |x| bits in Z31.
	const (
		zAbs, zInv127, z127, zM127, zSel, zZero = 20, 21, 22, 23, 24, 25
	)
	loadConsts := func() {
		e.in("VMOVDQU32 actAbs<>(SB), Z%d", zAbs)
		e.in("VMOVUPS actInv127<>(SB), Z%d", zInv127)
		e.in("VMOVUPS act127<>(SB), Z%d", z127)
		e.in("VMOVUPS actM127<>(SB), Z%d", zM127)
		e.in("VMOVDQU32 actSel4<>(SB), Z%d", zSel)
		e.in("VPXORD Z%d, Z%d, Z%d", zZero, zZero, zZero)
		e.in("VPXORD Z31, Z31, Z31")
	}
	ret := func() { maxAbsRet(e) }
	// q = cvt(clamp(x·id)), x in Z0, id in Z4 → Z5 (int32)
	quant := func() {
		e.in("VMULPS Z4, Z0, Z5")
		e.in("VMAXPS Z%d, Z5, Z5", zM127)
		e.in("VMINPS Z%d, Z5, Z5", z127)
		e.in("VCVTPS2DQ Z5, Z5")
	}

	// ---- blocks of 32, a scale per group of four
	e.retOff = 40
	e.text("actQ32Z", "(x *float32, dst *byte, nb, stride int, negCorr int32) uint32", 44)
	e.in("MOVQ x+0(FP), SI")
	e.in("MOVQ dst+8(FP), DI")
	e.in("MOVQ nb+16(FP), CX")
	e.in("MOVQ stride+24(FP), BX")
	e.in("MOVL negCorr+32(FP), AX")
	e.in("VPBROADCASTD AX, Z26")
	loadConsts()
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	e.label("loop")
	for h := 0; h < 2; h++ {
		e.in("VMOVUPS %d(SI), Z0", 64*h)
		e.in("VPANDD Z%d, Z0, Z1", zAbs)
		e.in("VPMAXUD Z1, Z31, Z31")
		e.in("VPERMILPS $0xB1, Z1, Z2")
		e.in("VMAXPS Z2, Z1, Z1")
		e.in("VPERMILPS $0x4E, Z1, Z2")
		e.in("VMAXPS Z2, Z1, Z1")              // amax of each group, in all its lanes
		e.in("VMULPS Z%d, Z1, Z3", zInv127)    // d
		e.in("VCMPPS $4, Z%d, Z1, K1", zZero)  // amax != 0
		e.in("VDIVPS.Z Z1, Z%d, K1, Z4", z127) // id = 127/amax, else 0
		quant()
		e.in("VPMOVDB Z5, %d(DI)", 16*h)
		// group sums → corr = negCorr·sum
		e.in("VPSHUFD $0xB1, Z5, Z6")
		e.in("VPADDD Z6, Z5, Z5")
		e.in("VPSHUFD $0x4E, Z5, Z6")
		e.in("VPADDD Z6, Z5, Z5")
		e.in("VPMULLD Z26, Z5, Z5")
		e.in("VPERMD Z5, Z%d, Z5", zSel)
		e.in("VMOVDQU32 X5, %d(DI)", 32+16*h)
		e.in("VPERMD Z3, Z%d, Z3", zSel)
		e.in("VMOVUPS X3, %d(DI)", 64+16*h)
	}
	e.in("ADDQ $128, SI")
	e.in("ADDQ BX, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	ret()

	// ---- blocks of 256, one scale, sums of sixteen
	e.retOff = 32
	e.text("actQKZ", "(x *float32, dst *byte, nb, stride int) uint32", 36)
	e.in("MOVQ x+0(FP), SI")
	e.in("MOVQ dst+8(FP), DI")
	e.in("MOVQ nb+16(FP), CX")
	e.in("MOVQ stride+24(FP), BX")
	loadConsts()
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	e.label("loop")
	// amax over the block
	e.in("VPXORD Z1, Z1, Z1")
	for i := 0; i < 16; i++ {
		e.in("VPANDD %d(SI), Z%d, Z2", 64*i, zAbs)
		e.in("VPMAXUD Z2, Z31, Z31")
		e.in("VMAXPS Z2, Z1, Z1")
	}
	// horizontal max, broadcast
	e.in("VSHUFF32X4 $0x4E, Z1, Z1, Z2")
	e.in("VMAXPS Z2, Z1, Z1")
	e.in("VSHUFF32X4 $0xB1, Z1, Z1, Z2")
	e.in("VMAXPS Z2, Z1, Z1")
	e.in("VPERMILPS $0x4E, Z1, Z2")
	e.in("VMAXPS Z2, Z1, Z1")
	e.in("VPERMILPS $0xB1, Z1, Z2")
	e.in("VMAXPS Z2, Z1, Z1")
	e.in("VMULPS Z%d, Z1, Z3", zInv127) // d (every lane)
	e.in("VMOVSS X3, 288(DI)")
	e.in("MOVL $0, 292(DI)")
	e.in("VCMPPS $4, Z%d, Z1, K1", zZero)
	e.in("VDIVPS.Z Z1, Z%d, K1, Z4", z127)
	for i := 0; i < 16; i++ {
		e.in("VMOVUPS %d(SI), Z0", 64*i)
		quant()
		e.in("VPMOVDB Z5, %d(DI)", 16*i)
		// sum of the sixteen → int16 bs[i]
		hsumZ5(e)
		e.in("VMOVD X5, AX")
		e.in("MOVW AX, %d(DI)", 256+2*i)
	}
	e.in("ADDQ $1024, SI")
	e.in("ADDQ BX, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	ret()
}

// maxAbsRet ends an activation quantizer: the horizontal maximum of Z31
// (unsigned bit patterns of |x|) returned as a uint32 at ret+e.retOff.
func maxAbsRet(e *emitter) {
	// horizontal max of Z31 (unsigned bit patterns of |x|)
	e.in("VEXTRACTI64X4 $1, Z31, Y1")
	e.in("VPMAXUD Y1, Y31, Y31")
	e.in("VEXTRACTI32X4 $1, Y31, X1")
	e.in("VPMAXUD X1, X31, X31")
	e.in("VPSHUFD $0x4E, X31, X1")
	e.in("VPMAXUD X1, X31, X31")
	e.in("VPSHUFD $0xB1, X31, X1")
	e.in("VPMAXUD X1, X31, X31")
	e.in("VMOVD X31, AX")
	e.in("MOVL AX, ret+%d(FP)", e.retOff)
	e.in("VZEROUPPER")
	e.in("RET")
}

// hsumZ5 adds up the sixteen int32 of Z5 into X5's first lane (Z6 a
// temporary).
func hsumZ5(e *emitter) {
	e.in("VEXTRACTI64X4 $1, Z5, Y6")
	e.in("VPADDD Y6, Y5, Y5")
	e.in("VEXTRACTI32X4 $1, Y5, X6")
	e.in("VPADDD X6, X5, X5")
	e.in("VPSHUFD $0x4E, X5, X6")
	e.in("VPADDD X6, X5, X5")
	e.in("VPSHUFD $0xB1, X5, X6")
	e.in("VPADDD X6, X5, X5")
}
