//go:build ignore

package main

import "fmt"

// Float kernels: a 16-row panel P[k][16] (weight rows in lanes) times MR
// packed activations Xp[k][MR], accumulated into C[MR][16], every lane
// summing its products in k order as the scalar reference does: for F32
// weights with a separate multiply and add per step (run.c's rounding),
// for half floats with a fused multiply-add (kernF32F over half-float rows
// packed as float32; kernF16 and kernBF16 over the panels of a half-float
// panel matrix, read in place and converted exactly as they load: with
// FMA the conversion does not compete with the products for the FP pipes).

const (
	kernSig     = "(p, xp *float32, k int, c *float32, load int)"
	halfKernSig = "(p unsafe.Pointer, xp *float32, k int, c *float32, load int)"
	packSig     = "(dst *float32, src unsafe.Pointer, ld int, ntiles int, tstride int)"
)

// floatKinds are the panel kernels' kinds: the name's type part, the
// panel's type, whether they fuse, and their signature.
var floatKinds = []struct {
	name, src string
	fma       bool
	sig       string
}{
	{"F32", "F32", false, kernSig},
	{"F32F", "F32", true, kernSig},
	{"F16", "F16", true, halfKernSig},
	{"BF16", "BF16", true, halfKernSig},
}

func genFloatKernels(e *emitter) {
	for _, k := range floatKinds {
		for m := 1; m <= 16; m++ {
			genKernZ(e, "kern"+k.name+"Z", k.sig, k.src, k.fma, m)
		}
		for m := 1; m <= 6; m++ {
			genKernY(e, "kern"+k.name+"Y", k.sig, k.src, k.fma, m)
		}
	}
	for _, src := range []string{"F32", "F16", "BF16"} {
		genPackZ(e, src)
		genPackY(e, src)
	}
}

// <name>m<M>(p, xp, k int, c *float32, load int): a panel of k rows of
// type src at p times m activations.
func genKernZ(e *emitter, name, sig, src string, fma bool, m int) {
	e.text(fmt.Sprintf("%sm%d", name, m), sig, 40)
	e.in("MOVQ p+0(FP), SI")
	e.in("MOVQ xp+8(FP), DI")
	e.in("MOVQ k+16(FP), CX")
	e.in("MOVQ c+24(FP), DX")
	e.in("MOVQ load+32(FP), AX")
	e.in("TESTQ AX, AX")
	e.in("JZ zero")
	for t := 0; t < m; t++ {
		e.in("VMOVUPS %d(DX), Z%d", 64*t, t)
	}
	e.in("JMP start")
	e.label("zero")
	for t := 0; t < m; t++ {
		e.in("VXORPS Z%d, Z%d, Z%d", t, t, t)
	}
	e.label("start")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	if fma {
		panelLoopZFMA(e, m, src)
	} else {
		panelLoopZOf(e, m, src)
	}
	e.label("done")
	for t := 0; t < m; t++ {
		e.in("VMOVUPS Z%d, %d(DX)", t, 64*t)
	}
	e.in("VZEROUPPER")
	e.in("RET")
}

// <name>m<M> at the AVX2 level: 16 lanes as two YMM registers.
func genKernY(e *emitter, name, sig, src string, fma bool, m int) {
	e.text(fmt.Sprintf("%sm%d", name, m), sig, 40)
	e.in("MOVQ p+0(FP), SI")
	e.in("MOVQ xp+8(FP), DI")
	e.in("MOVQ k+16(FP), CX")
	e.in("MOVQ c+24(FP), DX")
	e.in("MOVQ load+32(FP), AX")
	e.in("TESTQ AX, AX")
	e.in("JZ zero")
	for t := 0; t < m; t++ {
		e.in("VMOVUPS %d(DX), Y%d", 64*t, 2*t)
		e.in("VMOVUPS %d(DX), Y%d", 64*t+32, 2*t+1)
	}
	e.in("JMP start")
	e.label("zero")
	for t := 0; t < 2*m; t++ {
		e.in("VXORPS Y%d, Y%d, Y%d", t, t, t)
	}
	e.label("start")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	if fma {
		panelLoopYFMA(e, m, src)
	} else {
		panelLoopYOf(e, m, src)
	}
	e.label("done")
	for t := 0; t < m; t++ {
		e.in("VMOVUPS Y%d, %d(DX)", 2*t, 64*t)
		e.in("VMOVUPS Y%d, %d(DX)", 2*t+1, 64*t+32)
	}
	e.in("VZEROUPPER")
	e.in("RET")
}

// pack<src>Z(dst *float32, src unsafe.Pointer, ld int, ntiles int,
// tstride int): for each tile of 16 rows × 16 columns (row stride ld
// bytes, tiles tstride bytes apart), write its transpose as float32 to
// dst[16][16]; tiles follow each other along k.
func genPackZ(e *emitter, src string) {
	e.text("pack"+src+"Z", packSig, 40)
	e.in("MOVQ dst+0(FP), DI")
	e.in("MOVQ src+8(FP), SI")
	e.in("MOVQ ld+16(FP), BX")
	e.in("MOVQ ntiles+24(FP), CX")
	e.in("MOVQ tstride+32(FP), R9")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	e.label("loop")
	e.in("MOVQ SI, R8")
	for r := 0; r < 16; r++ {
		switch src {
		case "F32":
			e.in("VMOVUPS (R8), Z%d", r)
		case "F16":
			e.in("VCVTPH2PS (R8), Z%d", r)
		case "BF16":
			e.in("VPMOVZXWD (R8), Z%d", r)
			e.in("VPSLLD $16, Z%d, Z%d", r, r)
		}
		if r < 15 {
			e.in("ADDQ BX, R8")
		}
	}
	transpose16(e)
	for c := 0; c < 16; c++ {
		e.in("VMOVUPS Z%d, %d(DI)", c, 64*c)
	}
	e.in("ADDQ $1024, DI")
	e.in("ADDQ R9, SI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}

// transpose16 transposes Z0..Z15 (rows) in place into Z0..Z15 (columns),
// using Z16..Z31 as temporaries.
func transpose16(e *emitter) {
	// t[2i] = unpacklo(r[2i], r[2i+1]), t[2i+1] = unpackhi(...)
	for i := 0; i < 8; i++ {
		e.in("VUNPCKLPS Z%d, Z%d, Z%d", 2*i+1, 2*i, 16+2*i)
		e.in("VUNPCKHPS Z%d, Z%d, Z%d", 2*i+1, 2*i, 16+2*i+1)
	}
	// r[4g+0] = unpacklo_pd(t[4g], t[4g+2]); r[4g+1] = unpackhi_pd(t[4g], t[4g+2])
	// r[4g+2] = unpacklo_pd(t[4g+1], t[4g+3]); r[4g+3] = unpackhi_pd(t[4g+1], t[4g+3])
	for g := 0; g < 4; g++ {
		t := 16 + 4*g
		e.in("VUNPCKLPD Z%d, Z%d, Z%d", t+2, t, 4*g)
		e.in("VUNPCKHPD Z%d, Z%d, Z%d", t+2, t, 4*g+1)
		e.in("VUNPCKLPD Z%d, Z%d, Z%d", t+3, t+1, 4*g+2)
		e.in("VUNPCKHPD Z%d, Z%d, Z%d", t+3, t+1, 4*g+3)
	}
	// t[j] = shuf(r[j], r[j+4], 0x88), t[j+4] = shuf(r[j], r[j+4], 0xdd), j=0..3
	// t[8+j] = shuf(r[8+j], r[12+j], 0x88), t[12+j] = shuf(r[8+j], r[12+j], 0xdd)
	for j := 0; j < 4; j++ {
		e.in("VSHUFF32X4 $0x88, Z%d, Z%d, Z%d", j+4, j, 16+j)
		e.in("VSHUFF32X4 $0xdd, Z%d, Z%d, Z%d", j+4, j, 16+j+4)
		e.in("VSHUFF32X4 $0x88, Z%d, Z%d, Z%d", 12+j, 8+j, 16+8+j)
		e.in("VSHUFF32X4 $0xdd, Z%d, Z%d, Z%d", 12+j, 8+j, 16+12+j)
	}
	// col[j] = shuf(t[j], t[8+j], 0x88), col[8+j] = shuf(t[j], t[8+j], 0xdd), j=0..7
	for j := 0; j < 8; j++ {
		e.in("VSHUFF32X4 $0x88, Z%d, Z%d, Z%d", 16+8+j, 16+j, j)
		e.in("VSHUFF32X4 $0xdd, Z%d, Z%d, Z%d", 16+8+j, 16+j, 8+j)
	}
}

// pack<src>Y: the AVX2 twin of pack<src>Z (same output), as four 8×8
// transposes per tile.
func genPackY(e *emitter, src string) {
	e.text("pack"+src+"Y", packSig, 40)
	e.in("MOVQ dst+0(FP), DI")
	e.in("MOVQ src+8(FP), SI")
	e.in("MOVQ ld+16(FP), BX")
	e.in("MOVQ ntiles+24(FP), CX")
	e.in("MOVQ tstride+32(FP), R9")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	elem := 4
	if src != "F32" {
		elem = 2
	}
	e.label("loop")
	for rh := 0; rh < 2; rh++ { // rows 0-7, 8-15
		for ch := 0; ch < 2; ch++ { // cols 0-7, 8-15
			e.in("MOVQ SI, R8")
			if rh == 1 {
				e.in("LEAQ (R8)(BX*8), R8")
			}
			for r := 0; r < 8; r++ {
				off := ch * 8 * elem
				switch src {
				case "F32":
					e.in("VMOVUPS %d(R8), Y%d", off, r)
				case "F16":
					e.in("VCVTPH2PS %d(R8), Y%d", off, r)
				case "BF16":
					e.in("VPMOVZXWD %d(R8), Y%d", off, r)
					e.in("VPSLLD $16, Y%d, Y%d", r, r)
				}
				if r < 7 {
					e.in("ADDQ BX, R8")
				}
			}
			transpose8(e)
			// column c of this block goes to dst[(8ch+c)*16 + 8rh]
			for c := 0; c < 8; c++ {
				e.in("VMOVUPS Y%d, %d(DI)", 8+c, 4*((8*ch+c)*16+8*rh))
			}
		}
	}
	e.in("ADDQ $1024, DI")
	e.in("ADDQ R9, SI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}

// transpose8 transposes the rows Y0..Y7 into the columns Y8..Y15.
func transpose8(e *emitter) {
	for i := 0; i < 4; i++ {
		e.in("VUNPCKLPS Y%d, Y%d, Y%d", 2*i+1, 2*i, 8+2*i)
		e.in("VUNPCKHPS Y%d, Y%d, Y%d", 2*i+1, 2*i, 8+2*i+1)
	}
	// s0 = shufps(t0,t2,0x44) s1 = shufps(t0,t2,0xEE) s2 = (t1,t3,0x44) s3 = (t1,t3,0xEE); same for t4..t7
	for g := 0; g < 2; g++ {
		t := 8 + 4*g
		e.in("VSHUFPS $0x44, Y%d, Y%d, Y%d", t+2, t, 4*g)
		e.in("VSHUFPS $0xEE, Y%d, Y%d, Y%d", t+2, t, 4*g+1)
		e.in("VSHUFPS $0x44, Y%d, Y%d, Y%d", t+3, t+1, 4*g+2)
		e.in("VSHUFPS $0xEE, Y%d, Y%d, Y%d", t+3, t+1, 4*g+3)
	}
	// c[j] = perm2f128(s[j], s[j+4], 0x20), c[j+4] = perm2f128(s[j], s[j+4], 0x31)
	for j := 0; j < 4; j++ {
		e.in("VPERM2F128 $0x20, Y%d, Y%d, Y%d", j+4, j, 8+j)
		e.in("VPERM2F128 $0x31, Y%d, Y%d, Y%d", j+4, j, 12+j)
	}
}

// dotZ(a, b *float32, n int) float32: n a multiple of 16; sixteen lanes
// (lane l sums the products of the values i ≡ l mod 16 in order, a
// multiply then an add), then the fixed tree v8[l] = a[l]+a[l+8],
// v4[l] = v8[l]+v8[l+4], v2[l] = v4[l]+v4[l+2], r = v2[0]+v2[1].
func genDot(e *emitter) {
	for _, isa := range []string{"Z", "Y"} {
		e.text("dot"+isa, "(a, b *float32, n int) float32", 28)
		e.in("MOVQ a+0(FP), SI")
		e.in("MOVQ b+8(FP), DI")
		e.in("MOVQ n+16(FP), CX")
		e.in("SHRQ $4, CX")
		if isa == "Z" {
			e.in("VXORPS Z0, Z0, Z0")
		} else {
			e.in("VXORPS Y0, Y0, Y0")
			e.in("VXORPS Y1, Y1, Y1")
		}
		e.in("TESTQ CX, CX")
		e.in("JZ reduce")
		e.label("loop")
		if isa == "Z" {
			e.in("VMOVUPS (SI), Z2")
			e.in("VMULPS (DI), Z2, Z2")
			e.in("VADDPS Z2, Z0, Z0")
		} else {
			e.in("VMOVUPS (SI), Y2")
			e.in("VMOVUPS 32(SI), Y3")
			e.in("VMULPS (DI), Y2, Y2")
			e.in("VMULPS 32(DI), Y3, Y3")
			e.in("VADDPS Y2, Y0, Y0")
			e.in("VADDPS Y3, Y1, Y1")
		}
		e.in("ADDQ $64, SI")
		e.in("ADDQ $64, DI")
		e.in("DECQ CX")
		e.in("JNZ loop")
		e.label("reduce")
		if isa == "Z" {
			e.in("VEXTRACTF32X8 $1, Z0, Y1")
		}
		e.in("VADDPS Y1, Y0, Y0")
		sumTree(e, false, 0, 1)
		e.in("VMOVSS X0, ret+24(FP)")
		e.in("VZEROUPPER")
		e.in("RET")
	}
	// axpy<isa>(dst, x *float32, a float32, n int): dst[i] += a*x[i] for
	// n a multiple of 16 (a multiply then an add, as the Go loop).
	for _, isa := range []string{"Z", "Y"} {
		e.text("axpy"+isa, "(dst, x *float32, a float32, n int)", 32)
		e.in("MOVQ dst+0(FP), DI")
		e.in("MOVQ x+8(FP), SI")
		e.in("MOVQ n+24(FP), CX")
		e.in("SHRQ $4, CX")
		e.in("TESTQ CX, CX")
		e.in("JZ done")
		if isa == "Z" {
			e.in("VBROADCASTSS a+16(FP), Z1")
		} else {
			e.in("VBROADCASTSS a+16(FP), Y1")
		}
		e.label("loop")
		if isa == "Z" {
			e.in("VMULPS (SI), Z1, Z2")
			e.in("VADDPS (DI), Z2, Z2")
			e.in("VMOVUPS Z2, (DI)")
		} else {
			e.in("VMULPS (SI), Y1, Y2")
			e.in("VMULPS 32(SI), Y1, Y3")
			e.in("VADDPS (DI), Y2, Y2")
			e.in("VADDPS 32(DI), Y3, Y3")
			e.in("VMOVUPS Y2, (DI)")
			e.in("VMOVUPS Y3, 32(DI)")
		}
		e.in("ADDQ $64, SI")
		e.in("ADDQ $64, DI")
		e.in("DECQ CX")
		e.in("JNZ loop")
		e.label("done")
		e.in("VZEROUPPER")
		e.in("RET")
	}
}

// memReadZ(p *byte, n int) uint64: XORs every 64-byte line of p (n a
// multiple of 256) into four accumulators, to measure read bandwidth.
func genMemRead(e *emitter) {
	e.text("memReadZ", "(p *byte, n int) uint64", 24)
	e.in("MOVQ p+0(FP), SI")
	e.in("MOVQ n+8(FP), CX")
	e.in("SHRQ $8, CX")
	e.in("VPXORQ Z0, Z0, Z0")
	e.in("VPXORQ Z1, Z1, Z1")
	e.in("VPXORQ Z2, Z2, Z2")
	e.in("VPXORQ Z3, Z3, Z3")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	e.label("loop")
	e.in("VPXORQ (SI), Z0, Z0")
	e.in("VPXORQ 64(SI), Z1, Z1")
	e.in("VPXORQ 128(SI), Z2, Z2")
	e.in("VPXORQ 192(SI), Z3, Z3")
	e.in("ADDQ $256, SI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	e.in("VPXORQ Z1, Z0, Z0")
	e.in("VPXORQ Z3, Z2, Z2")
	e.in("VPXORQ Z2, Z0, Z0")
	e.in("VEXTRACTI64X4 $1, Z0, Y1")
	e.in("VPXOR Y1, Y0, Y0")
	e.in("VEXTRACTI128 $1, Y0, X1")
	e.in("VPXOR X1, X0, X0")
	e.in("VPEXTRQ $1, X0, AX")
	e.in("VMOVQ X0, BX")
	e.in("XORQ BX, AX")
	e.in("MOVQ AX, ret+16(FP)")
	e.in("VZEROUPPER")
	e.in("RET")
}

// matvecH<src><isa>(w unsafe.Pointer, ldw int, x *float32, n int, rows int,
// dst *float32): for each of rows rows (ldw bytes apart) of n values (a
// multiple of 16) of type src, dst[r] = the sixteen-lane sum of Dot
// (dotLanesGo's order) of the row, converted to float32, with x. One row at
// a time: a single stream from memory, for decode.
func genMatVecH(e *emitter) {
	for _, src := range []string{"F32", "F16", "BF16"} {
		for _, isa := range []string{"Z", "Y"} {
			e.text("matvecH"+src+isa, "(w unsafe.Pointer, ldw int, x *float32, n int, rows int, dst *float32)", 48)
			e.in("MOVQ w+0(FP), R8")
			e.in("MOVQ ldw+8(FP), BX")
			e.in("MOVQ n+24(FP), R9")
			e.in("SHRQ $4, R9")
			e.in("MOVQ rows+32(FP), R10")
			e.in("MOVQ dst+40(FP), DX")
			e.in("TESTQ R10, R10")
			e.in("JZ done")
			e.label("row")
			e.in("MOVQ R8, SI")
			e.in("MOVQ x+16(FP), DI")
			e.in("MOVQ R9, CX")
			if isa == "Z" {
				e.in("VXORPS Z0, Z0, Z0")
			} else {
				e.in("VXORPS Y0, Y0, Y0")
				e.in("VXORPS Y1, Y1, Y1")
			}
			e.in("TESTQ CX, CX")
			e.in("JZ reduce")
			e.label("loop")
			if isa == "Z" {
				switch src {
				case "F32":
					e.in("VMOVUPS (SI), Z2")
				case "F16":
					e.in("VCVTPH2PS (SI), Z2")
				case "BF16":
					e.in("VPMOVZXWD (SI), Z2")
					e.in("VPSLLD $16, Z2, Z2")
				}
				e.in("VMULPS (DI), Z2, Z2")
				e.in("VADDPS Z2, Z0, Z0")
			} else {
				switch src {
				case "F32":
					e.in("VMOVUPS (SI), Y2")
					e.in("VMOVUPS 32(SI), Y3")
				case "F16":
					e.in("VCVTPH2PS (SI), Y2")
					e.in("VCVTPH2PS 16(SI), Y3")
				case "BF16":
					e.in("VPMOVZXWD (SI), Y2")
					e.in("VPMOVZXWD 16(SI), Y3")
					e.in("VPSLLD $16, Y2, Y2")
					e.in("VPSLLD $16, Y3, Y3")
				}
				e.in("VMULPS (DI), Y2, Y2")
				e.in("VMULPS 32(DI), Y3, Y3")
				e.in("VADDPS Y2, Y0, Y0")
				e.in("VADDPS Y3, Y1, Y1")
			}
			if src == "F32" {
				e.in("ADDQ $64, SI")
			} else {
				e.in("ADDQ $32, SI")
			}
			e.in("ADDQ $64, DI")
			e.in("DECQ CX")
			e.in("JNZ loop")
			e.label("reduce")
			if isa == "Z" {
				e.in("VEXTRACTF32X8 $1, Z0, Y1")
			}
			e.in("VADDPS Y1, Y0, Y0")
			sumTree(e, false, 0, 1)
			e.in("VMOVSS X0, (DX)")
			e.in("ADDQ $4, DX")
			e.in("ADDQ BX, R8")
			e.in("DECQ R10")
			e.in("JNZ row")
			e.label("done")
			e.in("VZEROUPPER")
			e.in("RET")
		}
	}
}

// prefetchRows(p unsafe.Pointer, ld, rows, n int): PREFETCHT1 of the first
// n bytes (rounded up to 64) of rows rows ld bytes apart: the next panel
// or tile of weights, fetched into L2 while the current one is computed
// (into L1, PREFETCHT0, it evicted the panel and activations the kernel
// was reading: float products at 16 tokens 3–8% slower).
func genPrefetch(e *emitter) {
	e.text("prefetchRows", "(p unsafe.Pointer, ld, rows, n int)", 32)
	e.in("MOVQ p+0(FP), SI")
	e.in("MOVQ ld+8(FP), BX")
	e.in("MOVQ rows+16(FP), CX")
	e.in("MOVQ n+24(FP), DX")
	e.in("TESTQ CX, CX")
	e.in("JLE done")
	e.in("TESTQ DX, DX")
	e.in("JLE done")
	e.label("row")
	e.in("XORQ AX, AX")
	e.label("line")
	e.in("PREFETCHT1 (SI)(AX*1)")
	e.in("ADDQ $64, AX")
	e.in("CMPQ AX, DX")
	e.in("JLT line")
	e.in("ADDQ BX, SI")
	e.in("DECQ CX")
	e.in("JNZ row")
	e.label("done")
	e.in("RET")
}

// matvecP<src><isa>(w unsafe.Pointer, x *float32, nb int, dst *float32):
// the rows of one panel of a 16-row panel matrix (tensor.NewPanelMatrix:
// nb tiles of 16 rows × 16 values, each tile 512 bytes, row j's values at
// 32·j) times x, in Dot's order per row (one sixteen-lane accumulator, a
// product then a sum, then matvecH's tree). Z: the 16 rows of the panel
// into dst[0..15]; Y: 4 rows (w pointing at the panel's row 4p, dst at
// its output 4p). One stream from memory, x read once for all the rows.
func genMatVecP(e *emitter) {
	for _, src := range []string{"F16", "BF16"} {
		genMatVecPZ(e, src)
	}
}

// matvecP<src>Z(w unsafe.Pointer, x *float32, nb int, dst *float32): the 16
// rows of a panel of a half-float panel matrix times x, in Dot's order per
// row. A tile holds the 16 rows' values at 16 columns k0+l, column-major
// (row r's value at 32·l + 2·r bytes), so accumulator Z<l> holds, in lane
// r, row r's sum over the columns ≡ l (mod 16): lane l of Dot's sixteen.
// Dot's tree over its lanes (l+8 onto l, then l+4, l+2, l+1) then becomes
// fifteen adds of whole registers, and the 16 results one store.
func genMatVecPZ(e *emitter, src string) {
	e.text("matvecP"+src+"Z", "(w unsafe.Pointer, x *float32, nb int, dst *float32)", 32)
	e.in("MOVQ w+0(FP), SI")
	e.in("MOVQ x+8(FP), DI")
	e.in("MOVQ nb+16(FP), CX")
	e.in("MOVQ dst+24(FP), DX")
	for l := 0; l < 16; l++ {
		e.in("VXORPS Z%d, Z%d, Z%d", l, l, l)
	}
	e.in("TESTQ CX, CX")
	e.in("JZ reduce")
	e.label("loop")
	for l := 0; l < 16; l++ {
		t := fmt.Sprintf("Z%d", 16+l%8)
		loadAs(e, src, "SI", 16*l, t)
		e.in("VMULPS.BCST %d(DI), %s, %s", 4*l, t, t)
		e.in("VADDPS %s, Z%d, Z%d", t, l, l)
	}
	e.in("ADDQ $512, SI")
	e.in("ADDQ $64, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("reduce")
	for h := 8; h >= 1; h /= 2 {
		for l := 0; l < h; l++ {
			e.in("VADDPS Z%d, Z%d, Z%d", l+h, l, l)
		}
	}
	e.in("VMOVUPS Z0, (DX)")
	e.in("VZEROUPPER")
	e.in("RET")
}

// sumTree adds the 8 lanes of Y<a> into X<a>[0] by Dot's tree (upper
// half onto lower, then pairs 0+2 and 1+3, then the two), with X<t> as
// temporary; in EVEX encoding where the registers reach past 15 (the panel
// kernels' Z form), else VEX (runs on AVX2 machines too).
func sumTree(e *emitter, evex bool, a, t int) {
	if evex {
		e.in("VEXTRACTF32X4 $1, Y%d, X%d", a, t)
	} else {
		e.in("VEXTRACTF128 $1, Y%d, X%d", a, t)
	}
	e.in("VADDPS X%d, X%d, X%d", t, a, a)
	e.in("VMOVHLPS X%d, X%d, X%d", a, a, t)
	e.in("VADDPS X%d, X%d, X%d", t, a, a)
	e.in("VMOVSHDUP X%d, X%d", a, t)
	e.in("VADDSS X%d, X%d, X%d", t, a, a)
}

// Attention kernels (package tensor's attn.go has their plain Go twins).

// genAttn writes the score, weighted-sum, maximum and division kernels.
func genAttn(e *emitter) {
	for _, src := range []string{"F32", "F16", "BF16"} {
		for m := 1; m <= 14; m++ {
			genQKZ(e, src, m)
		}
		for m := 1; m <= 6; m++ {
			genQKY(e, src, m)
		}
	}
	for _, src := range []string{"F32", "F16", "BF16"} {
		for m := 1; m <= 6; m++ {
			genPVZ(e, src, m)
			genPVY(e, src, m)
		}
	}
	genVMax(e)
	genVDiv(e)
	genScaleBytes(e)
	genScaleLevels(e)
	genScalePanel(e)
}

const qkSig = "(p unsafe.Pointer, xp *float32, k int, c *float32, ldc int)"

// qkName is the score kernel over a panel of type src: qkZm<M> (F32),
// qkF16Zm<M>, qkBF16Zm<M>, and the same with Y at the AVX2 level.
func qkName(src, isa string, m int) string {
	if src == "F32" {
		src = ""
	}
	return fmt.Sprintf("qk%s%sm%d", src, isa, m)
}

// qk<src>Zm<M>(p unsafe.Pointer, xp *float32, k int, c *float32, ldc int):
// as kernF32Zm<M> from zero over a panel of type src, row t of the result
// stored at c + t·ldc bytes.
func genQKZ(e *emitter, src string, m int) {
	qkHeadZ(e, qkName(src, "Z", m), qkSig, 40, m)
	panelLoopZOf(e, m, src)
	qkTailZ(e, m)
}

// qkHeadZ starts a score kernel of M rows over a panel (name, Go signature
// sig with args bytes of arguments, the first five p, xp, k, c, ldc): the
// arguments in SI, DI, CX, DX, BX, the accumulators Z0..Z<M−1> zeroed, and
// a jump to done when k is 0.
func qkHeadZ(e *emitter, name, sig string, args, m int) {
	e.text(name, sig, args)
	e.in("MOVQ p+0(FP), SI")
	e.in("MOVQ xp+8(FP), DI")
	e.in("MOVQ k+16(FP), CX")
	e.in("MOVQ c+24(FP), DX")
	e.in("MOVQ ldc+32(FP), BX")
	for t := 0; t < m; t++ {
		e.in("VXORPS Z%d, Z%d, Z%d", t, t, t)
	}
	e.in("TESTQ CX, CX")
	e.in("JZ done")
}

// qkTailZ ends a score kernel of M rows: at done, row t of the result
// stored at c + t·ldc bytes.
func qkTailZ(e *emitter, m int) {
	e.label("done")
	for t := 0; t < m; t++ {
		e.in("VMOVUPS Z%d, (DX)", t)
		if t < m-1 {
			e.in("ADDQ BX, DX")
		}
	}
	e.in("VZEROUPPER")
	e.in("RET")
}

// qk<src>Ym<M>: the AVX2 twin of qk<src>Zm<M>.
func genQKY(e *emitter, src string, m int) {
	e.text(qkName(src, "Y", m), qkSig, 40)
	e.in("MOVQ p+0(FP), SI")
	e.in("MOVQ xp+8(FP), DI")
	e.in("MOVQ k+16(FP), CX")
	e.in("MOVQ c+24(FP), DX")
	e.in("MOVQ ldc+32(FP), BX")
	for t := 0; t < 2*m; t++ {
		e.in("VXORPS Y%d, Y%d, Y%d", t, t, t)
	}
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	panelLoopYOf(e, m, src)
	e.label("done")
	for t := 0; t < m; t++ {
		e.in("VMOVUPS Y%d, (DX)", 2*t)
		e.in("VMOVUPS Y%d, 32(DX)", 2*t+1)
		if t < m-1 {
			e.in("ADDQ BX, DX")
		}
	}
	e.in("VZEROUPPER")
	e.in("RET")
}

const pvSig = "(p *float32, ldp int, v unsafe.Pointer, ldv int, n int, o *float32, ldo int, cols int)"

// pvLoad loads 16 values of type src at off(DI) as float32 into reg.
func pvLoad(e *emitter, src string, off int, reg string) { loadAs(e, src, "DI", off, reg) }

// loadAs loads the values of type src at element off of (base) as float32
// into reg (a Z register: 16 values, a Y register: 8).
func loadAs(e *emitter, src, base string, off int, reg string) {
	switch src {
	case "F32":
		e.in("VMOVUPS %d(%s), %s", 4*off, base, reg)
	case "F16":
		e.in("VCVTPH2PS %d(%s), %s", 2*off, base, reg)
	case "BF16":
		e.in("VPMOVZXWD %d(%s), %s", 2*off, base, reg)
		e.in("VPSLLD $16, %s, %s", reg, reg)
	}
}

// pvRow is the address of row r's weight of the current slot: rows 0-2
// from SI, rows 3-5 from R8 (= SI + 3·ldp), BX = ldp.
func pvRow(r int) string {
	base, k := "SI", r
	if r >= 3 {
		base, k = "R8", r-3
	}
	if k == 0 {
		return "(" + base + ")"
	}
	return fmt.Sprintf("(%s)(BX*%d)", base, k)
}

// pv<src>Zm<M>(p *float32, ldp int, v unsafe.Pointer, ldv int, n int,
// o *float32, ldo int, cols int): for the M rows r (p and o rows ldp and
// ldo bytes apart) and the first cols columns c (a multiple of 16), o[r][c]
// += p[r][i]·v_i[c] for the slots i < n in order (v_i ldv bytes apart, of
// type src), a multiply then an add: 64 columns at a time, then 16.
func genPVZ(e *emitter, src string, m int) {
	es := map[string]int{"F32": 4, "F16": 2, "BF16": 2}[src]
	genPVZWith(e, m, pvHooks{name: fmt.Sprintf("pv%sZm%d", src, m), sig: pvSig, args: 64, colBytes: 16 * es,
		load: func(j int, z string) { pvLoad(e, src, 16*j, z) }})
}

// pvHooks makes pvF32Zm<M>'s loop read other value types: the kernel's
// name, Go signature and argument bytes (the first eight pvSig's), the
// bytes of 16 columns of a value row, and what it does before a column
// group's slots (start), to load columns 16j … 16j+15 of the current slot
// as float32 into register z (load), after each slot (next) and after a
// group of 16·w columns (end). Nil hooks do nothing.
type pvHooks struct {
	name, sig string
	args      int
	colBytes  int
	start     func()
	load      func(j int, z string)
	next      func()
	end       func(w int)
}

func genPVZWith(e *emitter, m int, h pvHooks) {
	call := func(f func()) {
		if f != nil {
			f()
		}
	}
	e.text(h.name, h.sig, h.args)
	e.in("MOVQ ldp+8(FP), BX")
	e.in("MOVQ v+16(FP), R13")
	e.in("MOVQ ldv+24(FP), R9")
	e.in("MOVQ n+32(FP), AX")
	e.in("MOVQ o+40(FP), DX")
	e.in("MOVQ ldo+48(FP), R10")
	e.in("MOVQ cols+56(FP), R11")
	for _, w := range []int{4, 1} {
		lbl := fmt.Sprintf("c%d", w)
		e.label(lbl)
		e.in("CMPQ R11, $%d", 16*w)
		if w == 4 {
			e.in("JLT c1")
		} else {
			e.in("JLT done")
		}
		acc := func(r, j int) int { return r*w + j }
		e.in("MOVQ DX, R12")
		for r := 0; r < m; r++ {
			for j := 0; j < w; j++ {
				e.in("VMOVUPS %d(R12), Z%d", 64*j, acc(r, j))
			}
			if r < m-1 {
				e.in("ADDQ R10, R12")
			}
		}
		e.in("MOVQ p+0(FP), SI")
		if m > 3 {
			e.in("LEAQ (SI)(BX*2), R8")
			e.in("ADDQ BX, R8")
		}
		call(h.start)
		e.in("MOVQ R13, DI")
		e.in("MOVQ AX, CX")
		e.in("TESTQ CX, CX")
		e.in("JZ s%d", w)
		e.label(fmt.Sprintf("l%d", w))
		for j := 0; j < w; j++ {
			h.load(j, fmt.Sprintf("Z%d", 24+j))
		}
		ti := 0
		for r := 0; r < m; r++ {
			e.in("VBROADCASTSS %s, Z28", pvRow(r))
			for j := 0; j < w; j++ {
				tr := 29 + ti%3
				ti++
				e.in("VMULPS Z%d, Z28, Z%d", 24+j, tr)
				e.in("VADDPS Z%d, Z%d, Z%d", tr, acc(r, j), acc(r, j))
			}
		}
		e.in("ADDQ $4, SI")
		if m > 3 {
			e.in("ADDQ $4, R8")
		}
		call(h.next)
		e.in("ADDQ R9, DI")
		e.in("DECQ CX")
		e.in("JNZ l%d", w)
		e.label(fmt.Sprintf("s%d", w))
		e.in("MOVQ DX, R12")
		for r := 0; r < m; r++ {
			for j := 0; j < w; j++ {
				e.in("VMOVUPS Z%d, %d(R12)", acc(r, j), 64*j)
			}
			if r < m-1 {
				e.in("ADDQ R10, R12")
			}
		}
		e.in("ADDQ $%d, DX", 64*w)
		e.in("ADDQ $%d, R13", w*h.colBytes)
		if h.end != nil {
			h.end(w)
		}
		e.in("SUBQ $%d, R11", 16*w)
		e.in("JMP %s", lbl)
	}
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}

// pv<src>Ym<M>: the AVX2 twin of pv<src>Zm<M>, 16 columns at a time.
func genPVY(e *emitter, src string, m int) {
	e.text(fmt.Sprintf("pv%sYm%d", src, m), pvSig, 64)
	es := map[string]int{"F32": 4, "F16": 2, "BF16": 2}[src]
	e.in("MOVQ ldp+8(FP), BX")
	e.in("MOVQ v+16(FP), R13")
	e.in("MOVQ ldv+24(FP), R9")
	e.in("MOVQ n+32(FP), AX")
	e.in("MOVQ o+40(FP), DX")
	e.in("MOVQ ldo+48(FP), R10")
	e.in("MOVQ cols+56(FP), R11")
	e.label("c1")
	e.in("CMPQ R11, $16")
	e.in("JLT done")
	e.in("MOVQ DX, R12")
	for r := 0; r < m; r++ {
		e.in("VMOVUPS (R12), Y%d", 2*r)
		e.in("VMOVUPS 32(R12), Y%d", 2*r+1)
		if r < m-1 {
			e.in("ADDQ R10, R12")
		}
	}
	e.in("MOVQ p+0(FP), SI")
	if m > 3 {
		e.in("LEAQ (SI)(BX*2), R8")
		e.in("ADDQ BX, R8")
	}
	e.in("MOVQ R13, DI")
	e.in("MOVQ AX, CX")
	e.in("TESTQ CX, CX")
	e.in("JZ s1")
	e.label("l1")
	switch src {
	case "F32":
		e.in("VMOVUPS (DI), Y12")
		e.in("VMOVUPS 32(DI), Y13")
	case "F16":
		e.in("VCVTPH2PS (DI), Y12")
		e.in("VCVTPH2PS 16(DI), Y13")
	case "BF16":
		e.in("VPMOVZXWD (DI), Y12")
		e.in("VPMOVZXWD 16(DI), Y13")
		e.in("VPSLLD $16, Y12, Y12")
		e.in("VPSLLD $16, Y13, Y13")
	}
	for r := 0; r < m; r++ {
		e.in("VBROADCASTSS %s, Y14", pvRow(r))
		for j := 0; j < 2; j++ {
			e.in("VMULPS Y%d, Y14, Y15", 12+j)
			e.in("VADDPS Y15, Y%d, Y%d", 2*r+j, 2*r+j)
		}
	}
	e.in("ADDQ $4, SI")
	if m > 3 {
		e.in("ADDQ $4, R8")
	}
	e.in("ADDQ R9, DI")
	e.in("DECQ CX")
	e.in("JNZ l1")
	e.label("s1")
	e.in("MOVQ DX, R12")
	for r := 0; r < m; r++ {
		e.in("VMOVUPS Y%d, (R12)", 2*r)
		e.in("VMOVUPS Y%d, 32(R12)", 2*r+1)
		if r < m-1 {
			e.in("ADDQ R10, R12")
		}
	}
	e.in("ADDQ $64, DX")
	e.in("ADDQ $%d, R13", 16*es)
	e.in("SUBQ $16, R11")
	e.in("JMP c1")
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}

// vmax<isa>(s *float32, n int) float32: n a positive multiple of 16;
// sixteen lanes from −Inf, l = max(s_i, l) with MAXPS's rule (the second
// operand when the first is not greater: NaN never enters), then the tree
// l[j] = max(l[j+8], l[j]), l[j+4], l[j+2], l[j+1].
func genVMax(e *emitter) {
	b := []byte{0, 0, 0x80, 0xff, 0, 0, 0x80, 0xff} // -Inf, twice
	e.dataBytes("attnNegInf", b)
	for _, isa := range []string{"Z", "Y"} {
		e.text("vmax"+isa, "(s *float32, n int) float32", 20)
		e.in("MOVQ s+0(FP), SI")
		e.in("MOVQ n+8(FP), CX")
		e.in("SHRQ $4, CX")
		if isa == "Z" {
			e.in("VBROADCASTSS attnNegInf<>(SB), Z0")
		} else {
			e.in("VBROADCASTSS attnNegInf<>(SB), Y0")
			e.in("VBROADCASTSS attnNegInf<>(SB), Y1")
		}
		e.label("loop")
		if isa == "Z" {
			e.in("VMOVUPS (SI), Z2")
			e.in("VMAXPS Z0, Z2, Z0")
		} else {
			e.in("VMOVUPS (SI), Y2")
			e.in("VMOVUPS 32(SI), Y3")
			e.in("VMAXPS Y0, Y2, Y0")
			e.in("VMAXPS Y1, Y3, Y1")
		}
		e.in("ADDQ $64, SI")
		e.in("DECQ CX")
		e.in("JNZ loop")
		if isa == "Z" {
			e.in("VEXTRACTF32X8 $1, Z0, Y1")
		}
		e.in("VMAXPS Y0, Y1, Y0")
		e.in("VEXTRACTF128 $1, Y0, X1")
		e.in("VMAXPS X0, X1, X0")
		e.in("VMOVHLPS X0, X0, X1")
		e.in("VMAXPS X0, X1, X0")
		e.in("VMOVSHDUP X0, X1")
		e.in("VMAXSS X0, X1, X0")
		e.in("VMOVSS X0, ret+16(FP)")
		e.in("VZEROUPPER")
		e.in("RET")
	}
}

// vdiv<isa>(s *float32, n int, d float32): s[i] /= d, n a multiple of 16.
func genVDiv(e *emitter) {
	for _, isa := range []string{"Z", "Y"} {
		e.text("vdiv"+isa, "(s *float32, n int, d float32)", 20)
		e.in("MOVQ s+0(FP), SI")
		e.in("MOVQ n+8(FP), CX")
		e.in("SHRQ $4, CX")
		e.in("TESTQ CX, CX")
		e.in("JZ done")
		if isa == "Z" {
			e.in("VBROADCASTSS d+16(FP), Z1")
		} else {
			e.in("VBROADCASTSS d+16(FP), Y1")
		}
		e.label("loop")
		if isa == "Z" {
			e.in("VMOVUPS (SI), Z2")
			e.in("VDIVPS Z1, Z2, Z2")
			e.in("VMOVUPS Z2, (SI)")
		} else {
			e.in("VMOVUPS (SI), Y2")
			e.in("VMOVUPS 32(SI), Y3")
			e.in("VDIVPS Y1, Y2, Y2")
			e.in("VDIVPS Y1, Y3, Y3")
			e.in("VMOVUPS Y2, (SI)")
			e.in("VMOVUPS Y3, 32(SI)")
		}
		e.in("ADDQ $64, SI")
		e.in("DECQ CX")
		e.in("JNZ loop")
		e.label("done")
		e.in("VZEROUPPER")
		e.in("RET")
	}
}

// genScalePanel: scalePanel<isa>[Shift](dst *float32, u *byte, sm *float32,
// mu *float32, d int): for c < d, the 16 lanes dst[c·16 + j] =
// float32(u[c·16 + j])·sm[j] + sm[16 + j] (a multiply, then an add), plus
// mu[c] (an add) in the Shift variant — a panel of 16 quantized slots
// decoded as scaleBytes decodes one, with the slots' scales and minimums in
// the lanes. scalePanel4<isa>[Shift] do the same over 4-bit levels: value
// c of slot j is nibble j of the 8 bytes at u + 8c (slot 2k in the low
// nibble of byte k, 2k+1 in the high one), spread to bytes first.
func genScalePanel(e *emitter) {
	for _, bits := range []int{8, 4} {
		for _, isa := range []string{"Z", "Y"} {
			for _, shift := range []bool{false, true} {
				genScalePanelOne(e, bits, isa, shift)
			}
		}
	}
}

func genScalePanelOne(e *emitter, bits int, isa string, shift bool) {
	name := "scalePanel"
	if bits == 4 {
		name += "4"
	}
	name += isa
	if shift {
		name += "Shift"
	}
	e.text(name, "(dst *float32, u *byte, sm *float32, mu *float32, d int)", 40)
	e.in("MOVQ dst+0(FP), DI")
	e.in("MOVQ u+8(FP), SI")
	e.in("MOVQ sm+16(FP), AX")
	e.in("MOVQ mu+24(FP), BX")
	e.in("MOVQ d+32(FP), CX")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	levelMask(e, bits)
	if isa == "Z" {
		e.in("VMOVUPS (AX), Z1")
		e.in("VMOVUPS 64(AX), Z2")
	} else {
		e.in("VMOVUPS (AX), Y1")
		e.in("VMOVUPS 32(AX), Y4")
		e.in("VMOVUPS 64(AX), Y2")
		e.in("VMOVUPS 96(AX), Y5")
	}
	e.label("loop")
	src := spreadLevels(e, bits)
	if isa == "Z" {
		e.in("VPMOVZXBD %s, Z0", src)
		e.in("VCVTDQ2PS Z0, Z0")
		e.in("VMULPS Z1, Z0, Z0")
		e.in("VADDPS Z2, Z0, Z0")
		if shift {
			e.in("VADDPS.BCST (BX), Z0, Z0")
		}
		e.in("VMOVUPS Z0, (DI)")
	} else {
		if bits == 4 {
			e.in("VPSRLDQ $8, X0, X3")
			e.in("VPMOVZXBD X0, Y0")
			e.in("VPMOVZXBD X3, Y3")
		} else {
			e.in("VPMOVZXBD (SI), Y0")
			e.in("VPMOVZXBD 8(SI), Y3")
		}
		e.in("VCVTDQ2PS Y0, Y0")
		e.in("VCVTDQ2PS Y3, Y3")
		e.in("VMULPS Y1, Y0, Y0")
		e.in("VMULPS Y4, Y3, Y3")
		e.in("VADDPS Y2, Y0, Y0")
		e.in("VADDPS Y5, Y3, Y3")
		if shift {
			e.in("VBROADCASTSS (BX), Y6")
			e.in("VADDPS Y6, Y0, Y0")
			e.in("VADDPS Y6, Y3, Y3")
		}
		e.in("VMOVUPS Y0, (DI)")
		e.in("VMOVUPS Y3, 32(DI)")
	}
	if shift {
		e.in("ADDQ $4, BX")
	}
	levelLoopEnd(e, bits)
}

// levelMask loads the mask of one level of bits 4 or 2 into each byte of
// X7, for spreadLevels.
func levelMask(e *emitter, bits int) {
	switch bits {
	case 4:
		e.in("VPBROADCASTD qmask0F<>(SB), X7")
	case 2:
		e.in("VPBROADCASTD qmask03<>(SB), X7")
	}
}

// spreadLevels makes the 16 levels of bits bits at SI (packed low bits
// first) 16 bytes in order, and returns where they are: in memory for 8
// bits, else in X0 (X7: levelMask; X3-X5 are overwritten).
func spreadLevels(e *emitter, bits int) string {
	switch bits {
	case 4:
		e.in("VMOVQ (SI), X0")
		e.in("VPSRLW $4, X0, X3")
		e.in("VPAND X7, X0, X0")
		e.in("VPAND X7, X3, X3")
		e.in("VPUNPCKLBW X3, X0, X0")
	case 2:
		e.in("VMOVD (SI), X0")
		e.in("VPSRLW $2, X0, X3")
		e.in("VPSRLW $4, X0, X4")
		e.in("VPSRLW $6, X0, X5")
		for _, r := range []int{0, 3, 4, 5} {
			e.in("VPAND X7, X%d, X%d", r, r)
		}
		e.in("VPUNPCKLBW X3, X0, X0") // byte k: levels 4k, 4k+1
		e.in("VPUNPCKLBW X5, X4, X4") // byte k: levels 4k+2, 4k+3
		e.in("VPUNPCKLWD X4, X0, X0")
	default:
		return "(SI)"
	}
	return "X0"
}

// levelLoopEnd ends the loops of the level decoding kernels: the next 16
// levels of bits bits and 16 outputs.
func levelLoopEnd(e *emitter, bits int) {
	e.in("ADDQ $%d, SI", 2*bits)
	e.in("ADDQ $64, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}

// genScaleLevels writes scaleLevels<bits><isa>[R](dst *float32, u *byte,
// n int, s, m *float32): dst[j] = s·u_j + m (a product then a sum, each
// rounded, as scaleBytes) for the n (a multiple of 16) levels of bits 4 or
// 2 packed in u, low bits first; s and m are one scale and minimum for
// all, or with R one per row of 16 values (s[j/16], m[j/16]).
func genScaleLevels(e *emitter) {
	for _, bits := range []int{4, 2} {
		for _, isa := range []string{"Z", "Y"} {
			for _, per := range []string{"", "R"} {
				genScaleLevelsOne(e, bits, isa, per)
			}
		}
	}
}

func genScaleLevelsOne(e *emitter, bits int, isa string, per string) {
	name := fmt.Sprintf("scaleLevels%d%s%s", bits, isa, per)
	e.text(name, "(dst *float32, u *byte, n int, s, m *float32)", 40)
	e.in("MOVQ dst+0(FP), DI")
	e.in("MOVQ u+8(FP), SI")
	e.in("MOVQ n+16(FP), CX")
	e.in("MOVQ s+24(FP), AX")
	e.in("MOVQ m+32(FP), BX")
	e.in("SHRQ $4, CX")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	levelMask(e, bits)
	bcast := func() {
		if isa == "Z" {
			e.in("VBROADCASTSS (AX), Z1")
			e.in("VBROADCASTSS (BX), Z2")
		} else {
			e.in("VBROADCASTSS (AX), Y1")
			e.in("VBROADCASTSS (BX), Y2")
		}
	}
	if per == "" {
		bcast()
	}
	e.label("loop")
	if per == "R" {
		bcast()
	}
	spreadLevels(e, bits) // into X0
	if isa == "Z" {
		e.in("VPMOVZXBD X0, Z0")
		e.in("VCVTDQ2PS Z0, Z0")
		e.in("VMULPS Z1, Z0, Z0")
		e.in("VADDPS Z2, Z0, Z0")
		e.in("VMOVUPS Z0, (DI)")
	} else {
		e.in("VPSRLDQ $8, X0, X3")
		e.in("VPMOVZXBD X0, Y0")
		e.in("VPMOVZXBD X3, Y3")
		e.in("VCVTDQ2PS Y0, Y0")
		e.in("VCVTDQ2PS Y3, Y3")
		e.in("VMULPS Y1, Y0, Y0")
		e.in("VMULPS Y1, Y3, Y3")
		e.in("VADDPS Y2, Y0, Y0")
		e.in("VADDPS Y2, Y3, Y3")
		e.in("VMOVUPS Y0, (DI)")
		e.in("VMOVUPS Y3, 32(DI)")
	}
	if per == "R" {
		e.in("ADDQ $4, AX")
		e.in("ADDQ $4, BX")
	}
	levelLoopEnd(e, bits)
}

// scaleBytes<isa>(dst *float32, u *byte, n int, s, m float32): dst[j] =
// s·float32(u[j]) + m (a multiply then an add) for n a multiple of 16.
func genScaleBytes(e *emitter) {
	for _, isa := range []string{"Z", "Y"} {
		e.text("scaleBytes"+isa, "(dst *float32, u *byte, n int, s, m float32)", 32)
		e.in("MOVQ dst+0(FP), DI")
		e.in("MOVQ u+8(FP), SI")
		e.in("MOVQ n+16(FP), CX")
		e.in("SHRQ $4, CX")
		e.in("TESTQ CX, CX")
		e.in("JZ done")
		if isa == "Z" {
			e.in("VBROADCASTSS s+24(FP), Z1")
			e.in("VBROADCASTSS m+28(FP), Z2")
		} else {
			e.in("VBROADCASTSS s+24(FP), Y1")
			e.in("VBROADCASTSS m+28(FP), Y2")
		}
		e.label("loop")
		if isa == "Z" {
			e.in("VPMOVZXBD (SI), Z0")
			e.in("VCVTDQ2PS Z0, Z0")
			e.in("VMULPS Z1, Z0, Z0")
			e.in("VADDPS Z2, Z0, Z0")
			e.in("VMOVUPS Z0, (DI)")
		} else {
			e.in("VPMOVZXBD (SI), Y0")
			e.in("VPMOVZXBD 8(SI), Y3")
			e.in("VCVTDQ2PS Y0, Y0")
			e.in("VCVTDQ2PS Y3, Y3")
			e.in("VMULPS Y1, Y0, Y0")
			e.in("VMULPS Y1, Y3, Y3")
			e.in("VADDPS Y2, Y0, Y0")
			e.in("VADDPS Y2, Y3, Y3")
			e.in("VMOVUPS Y0, (DI)")
			e.in("VMOVUPS Y3, 32(DI)")
		}
		e.in("ADDQ $16, SI")
		e.in("ADDQ $64, DI")
		e.in("DECQ CX")
		e.in("JNZ loop")
		e.label("done")
		e.in("VZEROUPPER")
		e.in("RET")
	}
}

// panelLoopZOf emits the k loop shared by the F32 panel kernels and the
// attention scores (AVX-512): per step, one 16-lane panel row of type src
// from SI (F32, F16 or BF16: 16 values, each converted exactly to float32
// as it is loaded) times m broadcast values at DI, each product added to
// its accumulator Z0..Zm-1 (multiply then add, in k order, as run.c).
func panelLoopZOf(e *emitter, m int, src string) {
	e.label("loop")
	loadAs(e, src, "SI", 0, "Z31")
	panelProductsZ(e, m, 31-m)
	panelStepZ(e, m, 16*map[string]int{"F32": 4, "F16": 2, "BF16": 2}[src])
}

// panelProductsZ adds the products of the panel row in Z31 with the M
// query values at DI (broadcast) to the accumulators Z0..Z<M−1>, a product
// (into one of ntmp temporaries from Z<M> on) then a sum.
func panelProductsZ(e *emitter, m, ntmp int) {
	for t := 0; t < m; t++ {
		tmp := m + t%ntmp
		e.in("VMULPS.BCST %d(DI), Z31, Z%d", 4*t, tmp)
		e.in("VADDPS Z%d, Z%d, Z%d", tmp, t, t)
	}
}

// panelStepZ ends a panel loop's step: SI on by rowBytes, DI by the M
// query values, and back to loop while CX counts down.
func panelStepZ(e *emitter, m, rowBytes int) {
	e.in("ADDQ $%d, SI", rowBytes)
	e.in("ADDQ $%d, DI", 4*m)
	e.in("DECQ CX")
	e.in("JNZ loop")
}

// panelLoopZFMA is panelLoopZOf with one fused multiply-add per product.
// Over half-float panels, read from memory in place, it prefetches 1 KiB
// (32 panel rows) ahead: 10-20% at 4-32 tokens (BenchmarkMatMulBatch
// F16p; 512 bytes or 2 KiB ahead no better).
func panelLoopZFMA(e *emitter, m int, src string) {
	e.label("loop")
	if src != "F32" {
		e.in("PREFETCHT0 1024(SI)")
	}
	loadAs(e, src, "SI", 0, "Z31")
	for t := 0; t < m; t++ {
		e.in("VFMADD231PS.BCST %d(DI), Z31, Z%d", 4*t, t)
	}
	e.in("ADDQ $%d, SI", 16*map[string]int{"F32": 4, "F16": 2, "BF16": 2}[src])
	e.in("ADDQ $%d, DI", 4*m)
	e.in("DECQ CX")
	e.in("JNZ loop")
}

// panelLoopYFMA is panelLoopYOf with one fused multiply-add per product.
func panelLoopYFMA(e *emitter, m int, src string) {
	e.label("loop")
	loadAs(e, src, "SI", 0, "Y14")
	loadAs(e, src, "SI", 8, "Y15")
	for t := 0; t < m; t++ {
		e.in("VBROADCASTSS %d(DI), Y12", 4*t)
		e.in("VFMADD231PS Y14, Y12, Y%d", 2*t)
		e.in("VFMADD231PS Y15, Y12, Y%d", 2*t+1)
	}
	e.in("ADDQ $%d, SI", 16*map[string]int{"F32": 4, "F16": 2, "BF16": 2}[src])
	e.in("ADDQ $%d, DI", 4*m)
	e.in("DECQ CX")
	e.in("JNZ loop")
}

// panelLoopYOf is panelLoopZOf for AVX2: accumulators Y0..Y2m-1, two
// 8-lane halves per row.
func panelLoopYOf(e *emitter, m int, src string) {
	e.label("loop")
	loadAs(e, src, "SI", 0, "Y14")
	loadAs(e, src, "SI", 8, "Y15")
	tmp := []int{12, 13}
	if m == 6 {
		tmp = []int{12}
	}
	b := 13 // broadcast register; with m == 6 the temp is 12 and b 13
	if m < 6 {
		b = 11
	}
	ti := 0
	for t := 0; t < m; t++ {
		e.in("VBROADCASTSS %d(DI), Y%d", 4*t, b)
		for h := 0; h < 2; h++ {
			tr := tmp[ti%len(tmp)]
			ti++
			e.in("VMULPS Y%d, Y%d, Y%d", 14+h, b, tr)
			e.in("VADDPS Y%d, Y%d, Y%d", tr, 2*t+h, 2*t+h)
		}
	}
	e.in("ADDQ $%d, SI", 16*map[string]int{"F32": 4, "F16": 2, "BF16": 2}[src])
	e.in("ADDQ $%d, DI", 4*m)
	e.in("DECQ CX")
	e.in("JNZ loop")
}
