//go:build ignore

package main

import (
	"encoding/binary"
	"math"
)

// swiglu<isa>(dst, gate, up *float32, n int): dst[i] = silu(gate[i])·up[i]
// for n a multiple of 8, as package tensor's swigluGo (exp.go) does it,
// operation for operation: the exponential in float64 lanes (eight per ZMM,
// four per YMM), the rest in float32.
func genSwiGLU(e *emitter) {
	f64 := func(name string, v float64) {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
		e.dataBytes(name, b)
	}
	var c [14]float64
	c[0] = 1
	for n := 1; n < len(c); n++ {
		c[n] = c[n-1] / float64(n)
	}
	f64("expLo", -104)
	f64("expHi", 89)
	f64("expLog2e", 1.4426950408889634)
	f64("expMagic", 6755399441055744) // 1.5·2^52
	f64("expLn2Hi", math.Float64frombits(0x3FE62E42FEE00000))
	f64("expLn2Lo", math.Float64frombits(0x3DEA39EF35793C76))
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, 1023)
	e.dataBytes("exp1023", b)
	binary.LittleEndian.PutUint64(b, 1<<63)
	e.dataBytes("expSign", b)
	for n := range c {
		f64("expC"+string(rune('a'+n)), c[n])
	}
	binary.LittleEndian.PutUint32(b, math.Float32bits(1))
	binary.LittleEndian.PutUint32(b[4:], math.Float32bits(1))
	e.dataBytes("expOne32", b)

	for _, isa := range []string{"Z", "Y"} {
		e.text("swiglu"+isa, "(dst, gate, up *float32, n int)", 32)
		// f64 vector registers: V, and the float32 half: H
		V, H := "Z", "Y"
		step := 8
		if isa == "Y" {
			V, H = "Y", "X"
			step = 4
		}
		e.in("MOVQ dst+0(FP), DI")
		e.in("MOVQ gate+8(FP), SI")
		e.in("MOVQ up+16(FP), DX")
		e.in("MOVQ n+24(FP), CX")
		e.in("SHRQ $%d, CX", map[int]int{8: 3, 4: 2}[step])
		e.in("TESTQ CX, CX")
		e.in("JZ done")
		// constants: 8 lo, 9 hi, 10 log2e, 11 magic, 12 ln2hi, 13 ln2lo,
		// 14 1023, 15 sign; coefficients loaded from memory in Horner.
		for i, name := range []string{"expLo", "expHi", "expLog2e", "expMagic", "expLn2Hi", "expLn2Lo", "exp1023", "expSign"} {
			e.in("VBROADCASTSD %s<>(SB), %s%d", name, V, 8+i)
		}
		e.label("loop")
		e.in("VMOVUPS (SI), %s0", H)
		e.in("VCVTPS2PD %s0, %s1", H, V)
		e.in("VXORPD %s15, %s1, %s1", V, V, V)       // x = -g
		e.in("VMAXPD %s1, %s8, %s1", V, V, V)        // max(lo, x), NaN stays
		e.in("VMINPD %s1, %s9, %s1", V, V, V)        // min(hi, x), NaN stays
		e.in("VMULPD %s10, %s1, %s2", V, V, V)       // x·log2e
		e.in("VADDPD %s11, %s2, %s2", V, V, V)       // t = that + magic: round half even
		e.in("VSUBPD %s11, %s2, %s3", V, V, V)       // k
		e.in("VFNMADD231PD %s12, %s3, %s1", V, V, V) // r = x - k·ln2hi
		e.in("VFNMADD231PD %s13, %s3, %s1", V, V, V) // r -= k·ln2lo
		e.in("VBROADCASTSD expCn<>(SB), %s4", V)
		for n := 12; n >= 0; n-- {
			e.in("VBROADCASTSD expC%c<>(SB), %s5", 'a'+n, V)
			e.in("VFMADD213PD %s5, %s1, %s4", V, V, V) // p = p·r + c[n]
		}
		// 2^k: ((bits(t) + 1023) << 52)
		e.in("VPADDQ %s14, %s2, %s2", V, V, V)
		e.in("VPSLLQ $52, %s2, %s2", V, V)
		e.in("VMULPD %s2, %s4, %s4", V, V, V)
		if isa == "Y" {
			e.in("VCVTPD2PSY Y4, X4") // e, float32
		} else {
			e.in("VCVTPD2PS Z4, Y4") // e, float32
		}
		e.in("VBROADCASTSS expOne32<>(SB), %s5", H)
		e.in("VADDPS %s5, %s4, %s4", H, H, H) // 1 + e
		e.in("VDIVPS %s4, %s5, %s4", H, H, H) // 1/(1+e)
		e.in("VMULPS %s4, %s0, %s0", H, H, H) // g·that
		e.in("VMULPS (DX), %s0, %s0", H, H)   // ·up
		e.in("VMOVUPS %s0, (DI)", H)
		e.in("ADDQ $%d, SI", 4*step)
		e.in("ADDQ $%d, DX", 4*step)
		e.in("ADDQ $%d, DI", 4*step)
		e.in("DECQ CX")
		e.in("JNZ loop")
		e.label("done")
		e.in("VZEROUPPER")
		e.in("RET")
	}
}

// attnExp<isa>(s *float32, n int, norm, mx float32): s[i] =
// float32(e^(s[i]/norm − mx)) for n a multiple of 8, as package tensor's
// attnExpGo: the division and subtraction in float32, the exponential as
// exp64 in float64 lanes (the steps of swiglu<isa>; its constants). The
// AVX-512 kernel keeps the polynomial's coefficients in registers and runs
// two vectors of eight at a time (two dependency chains).
func genAttnExp(e *emitter) {
	genAttnExpZ(e)
	genAttnExpY(e)
}

func genAttnExpZ(e *emitter) {
	e.text("attnExpZ", "(s *float32, n int, norm, mx float32)", 24)
	e.in("MOVQ s+0(FP), SI")
	e.in("MOVQ n+8(FP), CX")
	e.in("SHRQ $3, CX")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	for i, name := range []string{"expLo", "expHi", "expLog2e", "expMagic", "expLn2Hi", "expLn2Lo", "exp1023"} {
		e.in("VBROADCASTSD %s<>(SB), Z%d", name, 8+i)
	}
	for n := 0; n <= 13; n++ {
		e.in("VBROADCASTSD expC%c<>(SB), Z%d", 'a'+n, 18+n)
	}
	e.in("VBROADCASTSS norm+16(FP), Y6")
	e.in("VBROADCASTSS mx+20(FP), Y7")
	// one chain: load 8 floats at off(SI) into Y<ld>, x in Z<x>, t, k, p.
	type chain struct{ ld, x, t, k, p int }
	a, b := chain{0, 1, 2, 3, 4}, chain{15, 15, 16, 17, 5}
	steps := func(cs []chain) {
		for i, c := range cs {
			e.in("VMOVUPS %d(SI), Y%d", 32*i, c.ld)
		}
		for _, c := range cs {
			e.in("VDIVPS Y6, Y%d, Y%d", c.ld, c.ld)
			e.in("VSUBPS Y7, Y%d, Y%d", c.ld, c.ld)
			e.in("VCVTPS2PD Y%d, Z%d", c.ld, c.x)
			e.in("VMAXPD Z%d, Z8, Z%d", c.x, c.x)
			e.in("VMINPD Z%d, Z9, Z%d", c.x, c.x)
			e.in("VMULPD Z10, Z%d, Z%d", c.x, c.t)
			e.in("VADDPD Z11, Z%d, Z%d", c.t, c.t)
			e.in("VSUBPD Z11, Z%d, Z%d", c.t, c.k)
			e.in("VFNMADD231PD Z12, Z%d, Z%d", c.k, c.x)
			e.in("VFNMADD231PD Z13, Z%d, Z%d", c.k, c.x)
			e.in("VMOVAPD Z31, Z%d", c.p)
		}
		for n := 12; n >= 0; n-- {
			for _, c := range cs {
				e.in("VFMADD213PD Z%d, Z%d, Z%d", 18+n, c.x, c.p)
			}
		}
		for i, c := range cs {
			e.in("VPADDQ Z14, Z%d, Z%d", c.t, c.t)
			e.in("VPSLLQ $52, Z%d, Z%d", c.t, c.t)
			e.in("VMULPD Z%d, Z%d, Z%d", c.t, c.p, c.p)
			e.in("VCVTPD2PS Z%d, Y%d", c.p, c.p)
			e.in("VMOVUPS Y%d, %d(SI)", c.p, 32*i)
		}
	}
	e.label("loop")
	e.in("CMPQ CX, $2")
	e.in("JLT one")
	steps([]chain{a, b})
	e.in("ADDQ $64, SI")
	e.in("SUBQ $2, CX")
	e.in("JMP loop")
	e.label("one")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	steps([]chain{a})
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}

func genAttnExpY(e *emitter) {
	e.text("attnExpY", "(s *float32, n int, norm, mx float32)", 24)
	e.in("MOVQ s+0(FP), SI")
	e.in("MOVQ n+8(FP), CX")
	e.in("SHRQ $2, CX")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	for i, name := range []string{"expLo", "expHi", "expLog2e", "expMagic", "expLn2Hi", "expLn2Lo", "exp1023"} {
		e.in("VBROADCASTSD %s<>(SB), Y%d", name, 8+i)
	}
	e.in("VBROADCASTSS norm+16(FP), X6")
	e.in("VBROADCASTSS mx+20(FP), X7")
	e.label("loop")
	e.in("VMOVUPS (SI), X0")
	e.in("VDIVPS X6, X0, X0")
	e.in("VSUBPS X7, X0, X0")
	e.in("VCVTPS2PD X0, Y1")
	e.in("VMAXPD Y1, Y8, Y1")
	e.in("VMINPD Y1, Y9, Y1")
	e.in("VMULPD Y10, Y1, Y2")
	e.in("VADDPD Y11, Y2, Y2")
	e.in("VSUBPD Y11, Y2, Y3")
	e.in("VFNMADD231PD Y12, Y3, Y1")
	e.in("VFNMADD231PD Y13, Y3, Y1")
	e.in("VBROADCASTSD expCn<>(SB), Y4")
	for n := 12; n >= 0; n-- {
		e.in("VBROADCASTSD expC%c<>(SB), Y5", 'a'+n)
		e.in("VFMADD213PD Y5, Y1, Y4")
	}
	e.in("VPADDQ Y14, Y2, Y2")
	e.in("VPSLLQ $52, Y2, Y2")
	e.in("VMULPD Y2, Y4, Y4")
	e.in("VCVTPD2PSY Y4, X4")
	e.in("VMOVUPS X4, (SI)")
	e.in("ADDQ $16, SI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}
