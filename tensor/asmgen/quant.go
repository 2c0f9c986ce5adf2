//go:build ignore

package main

import "fmt"

// Integer kernels: weight rows in a ggml block format times activations
// quantized to 8 bits (package tensor's act.go describes both layouts and
// the exact arithmetic, which qdot.go restates in plain Go). A kernel
// handles R rows × T tokens over nb blocks and accumulates, per row and
// token, eight float32 lanes: acc[(t*R+r)*8 + l].
//
// Two instruction sets: "A" (AVX2: VPMADDUBSW + VPMADDWD) and "V"
// (AVX-512 VL + VNNI: VPDPBUSD / VPDPWSSD, 32 vector registers).

const qkernSig = "(w unsafe.Pointer, ldw int, x unsafe.Pointer, nb int, acc *float32, load int)"

// Activation block layouts (must match act.go).
const (
	xb32     = 96 // qx[32] int8, corr[8] int32, d[8] float32
	xb32Corr = 32
	xb32D    = 64
	xbK      = 296 // qx[256] int8, bs[16] int16, d float32, pad
	xbKBs    = 256
	xbKD     = 288
)

type qshape struct{ r, t int }

// q32More are the 32-value types of genQ32More (one row; tiles 1×1, 1×4).
var q32More = []string{"Q4_1", "Q5_0", "Q5_1", "IQ4_NL"}

// Shapes per instruction set: decode (T=1) and prefill (T=4) tiles. The
// AVX2 K-quant kernels have registers for one row at T=4 only. Decode
// reads one row at a time: a single stream from memory runs about twice
// as fast as four interleaved ones (the hardware prefetcher follows it).
var (
	qshapesA  = []qshape{{1, 1}, {2, 4}, {1, 4}}
	qshapesAK = []qshape{{1, 1}, {1, 4}}
	qshapesV  = []qshape{{1, 1}, {4, 4}, {1, 4}}
)

func genQuantKernels(e *emitter) {
	e.data("qmask0F", 32, 0x0F)
	e.data("qconst80", 32, 0x80)
	e.data16("qones16", 16, 1)
	e.data("qmask03", 32, 0x03)
	e.data("qmask01", 32, 0x01)
	e.data("qmask04", 32, 0x04) // Q3_K's high bit
	e.data16("qw32", 16, 32)    // Q3_K's scale offset
	// kvalues_iq4nl in both 128-bit lanes (genIQ4XS's VPSHUFB table).
	kv := []int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
	var kvb [32]byte
	for i := range kvb {
		kvb[i] = byte(kv[i%16])
	}
	e.dataBytes("kvIQ4", kvb[:])
	genQ32MoreData(e)
	e.data("qmask0C", 32, 0x0C)
	e.data("qmask30", 32, 0x30)
	e.data("qmaskC0", 32, 0xC0)
	// Q6_K scale shuffles: for pair i (0..3), the low 128 bits repeat the
	// int16 at word 2i of a 128-bit lane, the high 128 bits word 2i+1.
	for i := 0; i < 4; i++ {
		var b [32]byte
		for j := 0; j < 16; j += 2 {
			b[j], b[j+1] = byte(4*i), byte(4*i+1)
			b[16+j], b[16+j+1] = byte(4*i+2), byte(4*i+3)
		}
		e.dataBytes(fmt.Sprintf("q6shuf%d", i), b[:])
	}
	rowsMode = true
	for _, isa := range []string{"A", "V"} {
		genQ32Rows(e, "Q8_0", isa)
		genQ32Rows(e, "Q4_0", isa)
		genQ4K(e, "Q4_K", isa, 1, 1)
		genQ4K(e, "Q5_K", isa, 1, 1)
		if isa == "A" {
			genIQ4XS(e, 1, 1)
		} else {
			genIQ4XSV(e, 1, 1)
		}
		genQ6K(e, isa, 1, 1)
		genQ3K(e, isa, 1, 1)
		genQ2K(e, isa, 1, 1)
		for _, typ := range q32More {
			genQ32More(e, typ, isa, 1, 1)
		}
	}
	rowsMode = false
	for _, isa := range []string{"A", "V"} {
		for _, typ := range q32More {
			genQ32More(e, typ, isa, 1, 1)
			genQ32More(e, typ, isa, 1, 4)
		}
	}
	for _, s := range qshapesA {
		genQ32(e, "Q8_0", "A", s.r, s.t)
		genQ32(e, "Q4_0", "A", s.r, s.t)
	}
	for _, s := range qshapesAK {
		genQ4K(e, "Q4_K", "A", s.r, s.t)
		genQ4K(e, "Q5_K", "A", s.r, s.t)
		genIQ4XS(e, s.r, s.t)
		genQ6K(e, "A", s.r, s.t)
		genQ3K(e, "A", s.r, s.t)
		genQ2K(e, "A", s.r, s.t)
	}
	genIQ4XSVData(e)
	genQ3KZData(e)
	genIQ4XSV(e, 1, 1)
	genIQ4XSV(e, 1, 4)
	for _, s := range qshapesV {
		genQ32(e, "Q8_0", "V", s.r, s.t)
		genQ32(e, "Q4_0", "V", s.r, s.t)
		genQ4K(e, "Q4_K", "V", s.r, s.t)
		genQ4K(e, "Q5_K", "V", s.r, s.t)
		genQ6K(e, "V", s.r, s.t)
		genQ3K(e, "V", s.r, s.t)
		genQ2K(e, "V", s.r, s.t)
	}
	for _, typ := range []string{"Q8_0", "Q4_0"} {
		for t := 1; t <= 8; t++ {
			genQ8P(e, typ, t, 1)
		}
		genQ8P(e, typ, 8, 2)
		for t := 1; t <= 8; t++ {
			genQ16P(e, typ, t)
		}
		genQ16P(e, typ, 16)
		for t := 1; t <= 8; t++ {
			genQ8PA(e, typ, t)
		}
		genQ8PA(e, typ, 16)
		genQ8PA(e, typ, 32)
	}
	genActQP(e)
}

// regs hands out vector registers.
type regs struct {
	next, max int
}

func (r *regs) get() int {
	if r.next >= r.max {
		panic("out of vector registers")
	}
	r.next++
	return r.next - 1
}

func qname(typ, isa string, r, t int) string {
	if rowsMode {
		return fmt.Sprintf("q%s%srows", typ, isa)
	}
	return fmt.Sprintf("q%s%sr%dt%d", typ, isa, r, t)
}

// rowAddr is the address of byte off of row r (row r at SI + r*BX; R8 = 3*BX).
func rowAddr(r, off int) string {
	switch r {
	case 0:
		return fmt.Sprintf("%d(SI)", off)
	case 1:
		return fmt.Sprintf("%d(SI)(BX*1)", off)
	case 2:
		return fmt.Sprintf("%d(SI)(BX*2)", off)
	case 3:
		return fmt.Sprintf("%d(SI)(R8*1)", off)
	}
	panic("row")
}

// mnemonics that differ between VEX (AVX2) and EVEX (AVX-512) encodings.
type isaOps struct {
	movdqu, pand, pxor, inserti128, broadcasti128, por string
}

func opsFor(isa string) isaOps {
	if isa == "V" {
		return isaOps{"VMOVDQU32", "VPANDD", "VPXORD", "VINSERTI32X4", "VBROADCASTI32X4", "VPORD"}
	}
	return isaOps{"VMOVDQU", "VPAND", "VPXOR", "VINSERTI128", "VBROADCASTI128", "VPOR"}
}

// qprologue loads the arguments and the accumulators A[t][r].
// rowsMode makes qprologue/qepilogue wrap a 1×1 kernel into a loop over
// rows that adds up each row's lanes (reduceLanes' tree) and stores the
// sum: q<type><isa>rows(w, ldw, x, nb, out, rows), for decode.
var rowsMode bool

const qrowsSig = "(w unsafe.Pointer, ldw int, x unsafe.Pointer, nb int, out *float32, rows int)"

func qprologue(e *emitter, name string, R, T int, rg *regs) [][]int {
	if rowsMode {
		e.text(name, qrowsSig, 48)
		e.in("MOVQ ldw+8(FP), BX")
		e.in("LEAQ (BX)(BX*2), R8")
		e.in("CMPQ rows+40(FP), $0")
		e.in("JLE end")
		A := [][]int{{rg.get()}}
		e.label("row")
		e.in("MOVQ w+0(FP), SI")
		e.in("MOVQ x+16(FP), DI")
		e.in("MOVQ nb+24(FP), CX")
		e.in("VXORPS Y%d, Y%d, Y%d", A[0][0], A[0][0], A[0][0])
		e.in("TESTQ CX, CX")
		e.in("JZ done")
		return A
	}
	e.text(name, qkernSig, 48)
	e.in("MOVQ w+0(FP), SI")
	e.in("MOVQ ldw+8(FP), BX")
	e.in("MOVQ x+16(FP), DI")
	e.in("MOVQ nb+24(FP), CX")
	e.in("MOVQ acc+32(FP), DX")
	e.in("MOVQ load+40(FP), AX")
	e.in("LEAQ (BX)(BX*2), R8")
	A := make([][]int, T)
	for t := range A {
		A[t] = make([]int, R)
		for r := range A[t] {
			A[t][r] = rg.get()
		}
	}
	e.in("TESTQ AX, AX")
	e.in("JZ zero")
	for t := 0; t < T; t++ {
		for r := 0; r < R; r++ {
			e.in("VMOVUPS %d(DX), Y%d", 32*(t*R+r), A[t][r])
		}
	}
	e.in("JMP start")
	e.label("zero")
	for t := 0; t < T; t++ {
		for r := 0; r < R; r++ {
			e.in("VXORPS Y%d, Y%d, Y%d", A[t][r], A[t][r], A[t][r])
		}
	}
	e.label("start")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	return A
}

func qepilogue(e *emitter, R, T int, A [][]int, wBytes, xBytes int) {
	e.in("ADDQ $%d, SI", wBytes)
	e.in("ADDQ $%d, DI", xBytes)
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	if rowsMode {
		rowsEpilogue(e, A[0][0])
		return
	}
	for t := 0; t < T; t++ {
		for r := 0; r < R; r++ {
			e.in("VMOVUPS Y%d, %d(DX)", A[t][r], 32*(t*R+r))
		}
	}
	e.in("VZEROUPPER")
	e.in("RET")
}

// genQ32: Q8_0 and Q4_0 weights (blocks of 32: f16 d, then quants) with
// Q8 activations (act.go). Per block b, lane l (elements 4l..4l+3):
// P = Σ qw·qx (exact, int32); acc[l] = fma(float32(P)·dx[l], dw, acc[l]).
func genQ32(e *emitter, typ, isa string, R, T int) {
	vr := 16
	if isa == "V" {
		vr = 32
	}
	rg := &regs{max: vr}
	op := opsFor(isa)
	A := qprologue(e, qname(typ, isa, R, T), R, T, rg)
	var cst int // ones16 (A) or 0x80 (V, Q8_0) or mask 0x0F (Q4_0)
	cst = rg.get()
	switch {
	case typ == "Q4_0":
		e.in("%s qmask0F<>(SB), Y%d", op.movdqu, cst)
	case isa == "V":
		e.in("%s qconst80<>(SB), Y%d", op.movdqu, cst)
	default:
		e.in("%s qones16<>(SB), Y%d", op.movdqu, cst)
	}
	ones := -1
	if isa == "A" && typ == "Q4_0" {
		ones = rg.get()
		e.in("VMOVDQU qones16<>(SB), Y%d", ones)
	} else if isa == "A" {
		ones = cst
	}
	bb := 34
	if typ == "Q4_0" {
		bb = 18
	}
	// weights: the scale (yd) and quants (yq) of one row
	weights := func(r, yd, yq, tmp int) {
		e.in("VPBROADCASTW %s, X%d", rowAddr(r, 0), yd)
		e.in("VCVTPH2PS X%d, Y%d", yd, yd)
		switch {
		case typ == "Q8_0" && isa == "A":
			e.in("VMOVDQU %s, Y%d", rowAddr(r, 2), yq)
			e.in("VPABSB Y%d, Y%d", yq, tmp)
		case typ == "Q8_0": // V: unsigned weights qw+128
			e.in("VPXORD %s, Y%d, Y%d", rowAddr(r, 2), cst, yq)
		default: // Q4_0: nibbles, elements 0..15 low, 16..31 high
			e.in("%s %s, X%d", op.movdqu, rowAddr(r, 2), yq)
			e.in("VPSRLW $4, X%d, X%d", yq, tmp)
			e.in("%s $1, X%d, Y%d, Y%d", op.inserti128, tmp, yq, yq)
			e.in("%s Y%d, Y%d, Y%d", op.pand, cst, yq, yq)
		}
	}
	// float part: acc += (float32(P)·dx)·dw, fused; dx from mem or a register
	float := func(yp, yd, acc int, dx string) {
		e.in("VCVTDQ2PS Y%d, Y%d", yp, yp)
		e.in("VMULPS %s, Y%d, Y%d", dx, yp, yp)        // float32(P)·dx
		e.in("VFMADD231PS Y%d, Y%d, Y%d", yd, yp, acc) // acc += that·dw, fused
	}
	if isa == "V" && R > 1 {
		// All rows' weights in registers, then each token's activation
		// block loaded once for all rows (the loads, not the arithmetic,
		// bound this loop).
		yd, yq := make([]int, R), make([]int, R)
		for r := range yd {
			yd[r], yq[r] = rg.get(), rg.get()
		}
		// Each token's four rows in steps (integer sums, conversions,
		// scalings, accumulations), so that no step waits on the one just
		// issued.
		xq, xc, xd := rg.get(), rg.get(), rg.get()
		yp := make([]int, R)
		for r := range yp {
			yp[r] = rg.get()
		}
		tmp := yp[0]
		e.label("loop")
		for r := 0; r < R; r++ {
			weights(r, yd[r], yq[r], tmp)
		}
		for t := 0; t < T; t++ {
			xo := t * xb32
			e.in("VMOVDQU32 %d(DI), Y%d", xo, xq)
			e.in("VMOVDQU32 %d(DI), Y%d", xo+xb32Corr, xc)
			e.in("VMOVUPS %d(DI), Y%d", xo+xb32D, xd)
			for r := 0; r < R; r++ {
				e.in("VMOVDQA32 Y%d, Y%d", xc, yp[r])
				e.in("VPDPBUSD Y%d, Y%d, Y%d", xq, yq[r], yp[r])
			}
			for r := 0; r < R; r++ {
				e.in("VCVTDQ2PS Y%d, Y%d", yp[r], yp[r])
			}
			for r := 0; r < R; r++ {
				e.in("VMULPS Y%d, Y%d, Y%d", xd, yp[r], yp[r]) // float32(P)·dx
			}
			for r := 0; r < R; r++ {
				e.in("VFMADD231PS Y%d, Y%d, Y%d", yd[r], yp[r], A[t][r]) // acc += that·dw, fused
			}
		}
		qepilogue(e, R, T, A, bb, T*xb32)
		return
	}
	yd, yq, yabs, yx, yp := rg.get(), rg.get(), rg.get(), rg.get(), rg.get()
	e.label("loop")
	for r := 0; r < R; r++ {
		weights(r, yd, yq, yabs)
		for t := 0; t < T; t++ {
			xo := t * xb32
			switch {
			case isa == "V":
				e.in("VMOVDQU32 %d(DI), Y%d", xo+xb32Corr, yp)
				e.in("VPDPBUSD %d(DI), Y%d, Y%d", xo, yq, yp)
			case typ == "Q8_0":
				e.in("VMOVDQU %d(DI), Y%d", xo, yx)
				e.in("VPSIGNB Y%d, Y%d, Y%d", yq, yx, yx)
				e.in("VPMADDUBSW Y%d, Y%d, Y%d", yx, yabs, yp)
				e.in("VPMADDWD Y%d, Y%d, Y%d", ones, yp, yp)
			default: // Q4_0, AVX2
				e.in("VPMADDUBSW %d(DI), Y%d, Y%d", xo, yq, yp)
				e.in("VPMADDWD Y%d, Y%d, Y%d", ones, yp, yp)
				e.in("VPADDD %d(DI), Y%d, Y%d", xo+xb32Corr, yp, yp)
			}
			float(yp, yd, A[t][r], fmt.Sprintf("%d(DI)", xo+xb32D))
		}
	}
	qepilogue(e, R, T, A, bb, T*xb32)
}

// genQ4K: Q4_K weights (144-byte super-blocks of 256) with Q8_K
// activations. Per super-block and lane l:
//
//	I = Σ_j sc_j Σ_{e=4l..4l+3} q[32j+e]·qx[32j+e]   (j = 0..7 sub-blocks)
//	M = m_l · (bs[2l] + bs[2l+1])
//	acc[l] += float32(I)*(d*dx) - float32(M)*(dmin*dx)
//
// typ "Q5_K": the same with 176-byte super-blocks (qh[32] at 16, qs at 48)
// and q in 0..31: bit j of qh[e] is the fifth bit of value 32j+e.
func genQ4K(e *emitter, typ, isa string, R, T int) {
	vr := 16
	if isa == "V" {
		vr = 32
	}
	rg := &regs{max: vr}
	op := opsFor(isa)
	name := qname(typ, isa, R, T)
	q5 := typ == "Q5_K"
	qsOff, bb, por := 16, 144, "VPOR"
	if q5 {
		qsOff, bb = 48, 176
	}
	if isa == "V" {
		por = "VPORD"
	}
	e.frame = 64 // scales as int16 [8] at 0(SP)
	A := qprologue(e, name, R, T, rg)
	mask := rg.get()
	e.in("%s qmask0F<>(SB), Y%d", op.movdqu, mask)
	ysc, ymin, yq, ylo, yhi, yp, yi, yd := rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get()
	ydm := rg.get()
	yqh := -1
	if q5 {
		yqh = rg.get()
	}
	ym := yq    // free once the integer sums are done
	var I []int // integer accumulators per token for the current row
	if isa == "V" && T > 1 && rg.max-rg.next >= T {
		for t := 0; t < T; t++ {
			I = append(I, rg.get())
		}
	}
	yi2 := -1
	if isa == "V" && T == 1 {
		yi2 = rg.get()
	}
	e.label("loop")
	for r := 0; r < R; r++ {
		// Unpack the 12 scale bytes (ggml's get_scale_min_k4, as the
		// kmask trick): scales to 0(SP) as int16, mins to ymin as
		// [m0 m0 m1 m1 ... m7 m7] int16.
		e.in("MOVL %s, R9", rowAddr(r, 4))   // utmp0
		e.in("MOVL %s, R10", rowAddr(r, 8))  // utmp1
		e.in("MOVL %s, R11", rowAddr(r, 12)) // utmp2
		// utmp3 = ((utmp2 >> 4) & 0x0f0f0f0f) | (((utmp1 >> 6) & 0x03030303) << 4)
		e.in("MOVL R11, R12")
		e.in("SHRL $4, R12")
		e.in("ANDL $0x0f0f0f0f, R12")
		e.in("MOVL R10, R13")
		e.in("SHRL $6, R13")
		e.in("ANDL $0x03030303, R13")
		e.in("SHLL $4, R13")
		e.in("ORL R13, R12") // R12 = utmp3 (mins 4..7)
		// uaux = utmp1 & 0x3f3f3f3f (mins 0..3)
		e.in("MOVL R10, R13")
		e.in("ANDL $0x3f3f3f3f, R13") // R13 = mins 0..3
		// utmp1 = (utmp2 & 0x0f0f0f0f) | (((utmp0 >> 6) & 0x03030303) << 4)  (scales 4..7)
		e.in("ANDL $0x0f0f0f0f, R11")
		e.in("MOVL R9, R10")
		e.in("SHRL $6, R10")
		e.in("ANDL $0x03030303, R10")
		e.in("SHLL $4, R10")
		e.in("ORL R10, R11")         // R11 = scales 4..7
		e.in("ANDL $0x3f3f3f3f, R9") // R9 = scales 0..3
		e.in("SHLQ $32, R11")
		e.in("ORQ R11, R9") // scales 0..7
		e.in("SHLQ $32, R12")
		e.in("ORQ R12, R13") // mins 0..7
		e.in("VMOVQ R9, X%d", ysc)
		e.in("VPMOVZXBW X%d, X%d", ysc, ysc)
		e.in("%s X%d, 0(SP)", op.movdqu, ysc)
		e.in("VMOVQ R13, X%d", ymin)
		e.in("VPMOVZXBW X%d, X%d", ymin, ymin)
		e.in("VPUNPCKHWD X%d, X%d, X%d", ymin, ymin, yp)
		e.in("VPUNPCKLWD X%d, X%d, X%d", ymin, ymin, ymin)
		e.in("%s $1, X%d, Y%d, Y%d", op.inserti128, yp, ymin, ymin)
		// d and dmin as float32 (scalars in the low lanes)
		e.in("VPBROADCASTW %s, X%d", rowAddr(r, 0), yd)
		e.in("VCVTPH2PS X%d, X%d", yd, yd)
		e.in("VPBROADCASTW %s, X%d", rowAddr(r, 2), ydm)
		e.in("VCVTPH2PS X%d, X%d", ydm, ydm)
		// integer sums, token by token (or all tokens at once with V)
		// accs2 (one token, V): a second set of integer sums for the odd
		// sub-blocks, added to the first at the end (integers: any split
		// gives the same sums), two VPDPWSSD chains instead of one.
		tokenSums := func(ts []int, accs, accs2 []int) {
			for _, ia := range append(append([]int{}, accs...), accs2...) {
				e.in("%s Y%d, Y%d, Y%d", op.pxor, ia, ia, ia)
			}
			if q5 {
				e.in("%s %s, Y%d", op.movdqu, rowAddr(r, 16), yqh)
			}
			for c := 0; c < 4; c++ {
				e.in("%s %s, Y%d", op.movdqu, rowAddr(r, qsOff+32*c), yq)
				e.in("%s Y%d, Y%d, Y%d", op.pand, mask, yq, ylo)
				e.in("VPSRLW $4, Y%d, Y%d", yq, yhi)
				e.in("%s Y%d, Y%d, Y%d", op.pand, mask, yhi, yhi)
				if q5 {
					// fifth bits: bit 2c (low nibbles) and 2c+1 (high) of qh
					for h, yn := range []int{ylo, yhi} {
						if k := 2*c + h; k > 0 {
							e.in("VPSRLW $%d, Y%d, Y%d", k, yqh, yp)
						} else {
							e.in("%s Y%d, Y%d", op.movdqu, yqh, yp)
						}
						e.in("%s qmask01<>(SB), Y%d, Y%d", op.pand, yp, yp)
						e.in("VPSLLW $4, Y%d, Y%d", yp, yp)
						e.in("%s Y%d, Y%d, Y%d", por, yp, yn, yn)
					}
				}
				for h, yn := range []int{ylo, yhi} {
					j := 2*c + h
					e.in("VPBROADCASTW %d(SP), Y%d", 2*j, ysc)
					for k, t := range ts {
						acc := accs[k]
						if accs2 != nil && j%2 == 1 {
							acc = accs2[k]
						}
						e.in("VPMADDUBSW %d(DI), Y%d, Y%d", t*xbK+32*j, yn, yp)
						if isa == "V" {
							e.in("VPDPWSSD Y%d, Y%d, Y%d", ysc, yp, acc)
						} else {
							e.in("VPMADDWD Y%d, Y%d, Y%d", ysc, yp, yp)
							e.in("VPADDD Y%d, Y%d, Y%d", yp, acc, acc)
						}
					}
				}
			}
			for k, t := range ts {
				ia := accs[k]
				if accs2 != nil {
					e.in("VPADDD Y%d, Y%d, Y%d", accs2[k], ia, ia)
				}
				// M lanes
				e.in("VPMADDWD %d(DI), Y%d, Y%d", t*xbK+xbKBs, ymin, ym)
				e.in("VCVTDQ2PS Y%d, Y%d", ia, ia)
				e.in("VCVTDQ2PS Y%d, Y%d", ym, ym)
				// a = d*dx, b = dmin*dx, broadcast
				e.in("VMULSS %d(DI), X%d, X%d", t*xbK+xbKD, yd, yp)
				e.in("VBROADCASTSS X%d, Y%d", yp, yp)
				e.in("VMULPS Y%d, Y%d, Y%d", yp, ia, ia)
				e.in("VMULSS %d(DI), X%d, X%d", t*xbK+xbKD, ydm, yp)
				e.in("VBROADCASTSS X%d, Y%d", yp, yp)
				e.in("VMULPS Y%d, Y%d, Y%d", yp, ym, ym)
				e.in("VSUBPS Y%d, Y%d, Y%d", ym, ia, ia)
				e.in("VADDPS Y%d, Y%d, Y%d", ia, A[t][r], A[t][r])
			}
		}
		kTokenSums(T, I, yi, yi2, tokenSums)
	}
	qepilogue(e, R, T, A, bb, T*xbK)
	e.frame = 0
}

// genQ6K: Q6_K weights (210-byte super-blocks) with Q8_K activations. Per
// super-block and lane l, with q in 0..63 and sixteen int8 scales:
//
//	I = Σ over the eight 32-value groups g of Σ_{k=2l,2l+1} s16[g][k]·(q·qx pair k)
//	    where the pair sums come from VPMADDUBSW and s16[g] holds the scale
//	    of the group's first 16 values in words 0..7, of its last 16 in 8..15
//	M = sc[2l]·bs[2l] + sc[2l+1]·bs[2l+1]
//	acc[l] += float32(I - 32·M) * (d*dx)
func genQ6K(e *emitter, isa string, R, T int) {
	vr := 16
	if isa == "V" {
		vr = 32
	}
	rg := &regs{max: vr}
	op := opsFor(isa)
	name := qname("Q6_K", isa, R, T)
	e.frame = 64 // scales as int16 [16] at 0(SP)
	A := qprologue(e, name, R, T, rg)
	mask := rg.get()
	e.in("%s qmask0F<>(SB), Y%d", op.movdqu, mask)
	ysc, yql, yqh, yq, yt, yp, yi, yd, ys16 := rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get()
	yv := rg.get()
	var I []int
	if isa == "V" && T > 1 && rg.max-rg.next >= T {
		for t := 0; t < T; t++ {
			I = append(I, rg.get())
		}
	}
	yi2 := -1
	if isa == "V" && T == 1 {
		yi2 = rg.get()
	}
	e.label("loop")
	for r := 0; r < R; r++ {
		e.in("VPMOVSXBW %s, Y%d", rowAddr(r, 192), ys16)
		e.in("%s Y%d, 0(SP)", op.movdqu, ys16)
		e.in("VPBROADCASTW %s, X%d", rowAddr(r, 208), yd)
		e.in("VCVTPH2PS X%d, X%d", yd, yd)
		// accs2 (one token, V): a second set of integer sums for the odd
		// groups, added at the end (exact), two VPDPWSSD chains.
		tokenSums := func(ts []int, accs, accs2 []int) {
			for _, ia := range append(append([]int{}, accs...), accs2...) {
				e.in("%s Y%d, Y%d, Y%d", op.pxor, ia, ia, ia)
			}
			for n := 0; n < 2; n++ {
				e.in("%s %d(SP), Y%d", op.broadcasti128, 16*n, yv)
				e.in("%s %s, Y%d", op.movdqu, rowAddr(r, 128+32*n), yqh)
				for i := 0; i < 4; i++ {
					// q_i: elements 32i..32i+31 of this half
					qlOff := 64*n + 32*(i%2)
					e.in("%s %s, Y%d", op.movdqu, rowAddr(r, qlOff), yql)
					if i >= 2 {
						e.in("VPSRLW $4, Y%d, Y%d", yql, yql)
					}
					e.in("%s Y%d, Y%d, Y%d", op.pand, mask, yql, yq)
					hm := []string{"qmask03", "qmask0C", "qmask30", "qmaskC0"}[i]
					e.in("%s %s<>(SB), Y%d, Y%d", op.pand, hm, yqh, yt)
					switch i {
					case 0:
						e.in("VPSLLW $4, Y%d, Y%d", yt, yt)
					case 1:
						e.in("VPSLLW $2, Y%d, Y%d", yt, yt)
					case 3:
						e.in("VPSRLW $2, Y%d, Y%d", yt, yt)
					}
					if isa == "V" {
						e.in("VPORD Y%d, Y%d, Y%d", yt, yq, yq)
					} else {
						e.in("VPOR Y%d, Y%d, Y%d", yt, yq, yq)
					}
					e.in("VPSHUFB q6shuf%d<>(SB), Y%d, Y%d", i, yv, ysc)
					for k, t := range ts {
						acc := accs[k]
						if accs2 != nil && i%2 == 1 {
							acc = accs2[k]
						}
						e.in("VPMADDUBSW %d(DI), Y%d, Y%d", t*xbK+128*n+32*i, yq, yp)
						if isa == "V" {
							e.in("VPDPWSSD Y%d, Y%d, Y%d", ysc, yp, acc)
						} else {
							e.in("VPMADDWD Y%d, Y%d, Y%d", ysc, yp, yp)
							e.in("VPADDD Y%d, Y%d, Y%d", yp, acc, acc)
						}
					}
				}
			}
			for k, t := range ts {
				ia := accs[k]
				if accs2 != nil {
					e.in("VPADDD Y%d, Y%d, Y%d", accs2[k], ia, ia)
				}
				e.in("VPMADDWD %d(DI), Y%d, Y%d", t*xbK+xbKBs, ys16, yp)
				e.in("VPSLLD $5, Y%d, Y%d", yp, yp)
				e.in("VPSUBD Y%d, Y%d, Y%d", yp, ia, ia)
				e.in("VCVTDQ2PS Y%d, Y%d", ia, ia)
				e.in("VMULSS %d(DI), X%d, X%d", t*xbK+xbKD, yd, yp)
				e.in("VBROADCASTSS X%d, Y%d", yp, yp)
				e.in("VMULPS Y%d, Y%d, Y%d", yp, ia, ia)
				e.in("VADDPS Y%d, Y%d, Y%d", ia, A[t][r], A[t][r])
			}
		}
		kTokenSums(T, I, yi, yi2, tokenSums)
	}
	qepilogue(e, R, T, A, 210, T*xbK)
	e.frame = 0
}

// genQ32Rows: the decode kernel of Q8_0 and Q4_0, q<typ><isa>rows(w, ldw,
// x, nb, out, rows): for each row, blocks alternately into two lane
// accumulators (even blocks in the first, odd in the second, the first
// taking a last unpaired block), added lane by lane, then reduceLanes'
// tree. Two chains of fused multiply-adds instead of one: one chain
// (4 cycles a block) could not keep up with memory. (Software prefetching
// made it slower: the hardware prefetcher follows the single stream.)
func genQ32Rows(e *emitter, typ, isa string) {
	vr := 16
	if isa == "V" {
		vr = 32
	}
	rg := &regs{max: vr}
	op := opsFor(isa)
	e.text(fmt.Sprintf("q%s%srows", typ, isa), qrowsSig, 48)
	e.in("MOVQ ldw+8(FP), BX")
	a0, a1 := rg.get(), rg.get()
	cst := rg.get()
	switch {
	case typ == "Q4_0":
		e.in("%s qmask0F<>(SB), Y%d", op.movdqu, cst)
	case isa == "V":
		e.in("%s qconst80<>(SB), Y%d", op.movdqu, cst)
	default:
		e.in("%s qones16<>(SB), Y%d", op.movdqu, cst)
	}
	ones := cst
	if isa == "A" && typ == "Q4_0" {
		ones = rg.get()
		e.in("VMOVDQU qones16<>(SB), Y%d", ones)
	}
	yd, yq, yabs, yx, yp := rg.get(), rg.get(), rg.get(), rg.get(), rg.get()
	bb := 34
	if typ == "Q4_0" {
		bb = 18
	}
	block := func(wo, xo, acc int) {
		e.in("VPBROADCASTW %d(SI), X%d", wo, yd)
		e.in("VCVTPH2PS X%d, Y%d", yd, yd)
		switch {
		case typ == "Q8_0" && isa == "A":
			e.in("VMOVDQU %d(SI), Y%d", wo+2, yq)
			e.in("VPABSB Y%d, Y%d", yq, yabs)
			e.in("VMOVDQU %d(DI), Y%d", xo, yx)
			e.in("VPSIGNB Y%d, Y%d, Y%d", yq, yx, yx)
			e.in("VPMADDUBSW Y%d, Y%d, Y%d", yx, yabs, yp)
			e.in("VPMADDWD Y%d, Y%d, Y%d", ones, yp, yp)
		case typ == "Q8_0": // V
			e.in("VPXORD %d(SI), Y%d, Y%d", wo+2, cst, yq)
			e.in("VMOVDQU32 %d(DI), Y%d", xo+xb32Corr, yp)
			e.in("VPDPBUSD %d(DI), Y%d, Y%d", xo, yq, yp)
		default: // Q4_0
			e.in("%s %d(SI), X%d", op.movdqu, wo+2, yq)
			e.in("VPSRLW $4, X%d, X%d", yq, yabs)
			e.in("%s $1, X%d, Y%d, Y%d", op.inserti128, yabs, yq, yq)
			e.in("%s Y%d, Y%d, Y%d", op.pand, cst, yq, yq)
			if isa == "V" {
				e.in("VMOVDQU32 %d(DI), Y%d", xo+xb32Corr, yp)
				e.in("VPDPBUSD %d(DI), Y%d, Y%d", xo, yq, yp)
			} else {
				e.in("VPMADDUBSW %d(DI), Y%d, Y%d", xo, yq, yp)
				e.in("VPMADDWD Y%d, Y%d, Y%d", ones, yp, yp)
				e.in("VPADDD %d(DI), Y%d, Y%d", xo+xb32Corr, yp, yp)
			}
		}
		e.in("VCVTDQ2PS Y%d, Y%d", yp, yp)
		e.in("VMULPS %d(DI), Y%d, Y%d", xo+xb32D, yp, yp)
		e.in("VFMADD231PS Y%d, Y%d, Y%d", yd, yp, acc)
	}
	e.in("CMPQ rows+40(FP), $0")
	e.in("JLE end")
	e.label("row")
	e.in("MOVQ w+0(FP), SI")
	e.in("MOVQ x+16(FP), DI")
	e.in("MOVQ nb+24(FP), R9")
	e.in("MOVQ R9, CX")
	e.in("SHRQ $1, CX")
	e.in("VXORPS Y%d, Y%d, Y%d", a0, a0, a0)
	e.in("VXORPS Y%d, Y%d, Y%d", a1, a1, a1)
	e.in("TESTQ CX, CX")
	e.in("JZ tail")
	e.label("loop")
	block(0, 0, a0)
	block(bb, xb32, a1)
	e.in("ADDQ $%d, SI", 2*bb)
	e.in("ADDQ $%d, DI", 2*xb32)
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("tail")
	e.in("TESTQ $1, R9")
	e.in("JZ reduce")
	block(0, 0, a0)
	e.label("reduce")
	e.in("VADDPS Y%d, Y%d, Y%d", a1, a0, a0)
	rowsEpilogue(e, a0)
}

// genQ8P: Q8_0 or Q4_0 weights, eight rows in the eight lanes (transposed block
// by block in registers), times T tokens of activations with one scale
// per block (qmm_p8.go): per block, the eight VPDPBUSD of four values add
// up in integers (started at the token's correction), then one
// conversion, one multiply by dx and one fused multiply-add by the rows'
// dw for eight rows at once.
//
// q<typ>Vp8t<T>(w, ldw, x, xs, nb, acc, load): rows at w + i·ldw, block b
// of token t at x + b·xs + t·40, acc[t·8 + i].
//
// While it reads a tile's blocks from the cache it prefetches the next
// tile's (the rows 8..15 from w: the tile after it in the matrix, which the
// caller multiplies next), so that the weights stream from memory under
// the arithmetic, not between (a prefetch never faults; past the end of
// the matrix it is wasted).
//
// With groups > 1 (q<typ>Vp8t<T·groups>, T·groups ≤ 16) the block's
// weights are transposed once for all T·groups tokens, and the
// accumulators stay in acc, read and written back block by block (the
// same operations on each, in the same order).
func genQ8P(e *emitter, typ string, T, groups int) {
	e.text(fmt.Sprintf("q%sVp8t%d", typ, T*groups), rowTileSig, 64)
	rowTileArgs(e)
	// Y0..Y7 acc[t], Y8..Y15 weight groups, Y16..Y23 integer sums (and
	// transposition temporaries), Y24 dw, Y25 0x80 bytes (Q8_0) or the
	// mask 0x0F (Q4_0), Y26 a temporary.
	acc := func(t int) int { return t }
	G := func(g int) int { return 8 + g }
	P := func(t int) int { return 16 + t }
	if groups > 1 {
		accPrologue(e, "Y", T*groups, true, 32) // acc stays in memory
	} else {
		accPrologue(e, "Y", T, false, 32)
	}
	if typ == "Q4_0" {
		e.in("VMOVDQU32 qmask0F<>(SB), Y25")
	} else {
		e.in("VMOVDQU32 qconst80<>(SB), Y25")
	}
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	p8LoopHead(e)
	row := func(i, off int) string { return p8RowAt("SI", "R9", i, off) }
	// the rows' scales: eight f16 into X24, then float32
	e.in("MOVWLZX %s, R11", row(0, 0))
	e.in("VMOVD R11, X24")
	for i := 1; i < 8; i++ {
		e.in("VPINSRW $%d, %s, X24, X24", i, row(i, 0))
	}
	e.in("VCVTPH2PS X24, Y24")
	// quants as unsigned bytes, row i in Y(16+i): qw+128 (Q8_0), or the
	// nibbles, values 0..15 low and 16..31 high (Q4_0)
	for i := 0; i < 8; i++ {
		if typ == "Q4_0" {
			e.in("VMOVDQU32 %s, X%d", row(i, 2), 16+i)
			e.in("VPSRLW $4, X%d, X26", 16+i)
			e.in("VINSERTI32X4 $1, X26, Y%d, Y%d", 16+i, 16+i)
			e.in("VPANDD Y25, Y%d, Y%d", 16+i, 16+i)
		} else {
			e.in("VPXORD %s, Y25, Y%d", row(i, 2), 16+i)
		}
	}
	// transpose the 8×8 dwords: G(g) lane i = row i's values 4g..4g+3
	for k := 0; k < 4; k++ { // rows 2k, 2k+1 → G(2k) (lo), G(2k+1) (hi)
		e.in("VPUNPCKLDQ Y%d, Y%d, Y%d", 16+2*k+1, 16+2*k, G(2*k))
		e.in("VPUNPCKHDQ Y%d, Y%d, Y%d", 16+2*k+1, 16+2*k, G(2*k+1))
	}
	// G0 = [r0d0 r1d0 r0d1 r1d1 | ·4 ·5], G1 = [·2 ·3 | ·6 ·7]; G2, G3 rows 2,3; ...
	for h := 0; h < 2; h++ { // rows 4h..4h+3: from G(4h..4h+3) into P(4h..4h+3)
		a, b, c, d := G(4*h), G(4*h+1), G(4*h+2), G(4*h+3)
		e.in("VPUNPCKLQDQ Y%d, Y%d, Y%d", c, a, P(4*h))   // d0 | d4
		e.in("VPUNPCKHQDQ Y%d, Y%d, Y%d", c, a, P(4*h+1)) // d1 | d5
		e.in("VPUNPCKLQDQ Y%d, Y%d, Y%d", d, b, P(4*h+2)) // d2 | d6
		e.in("VPUNPCKHQDQ Y%d, Y%d, Y%d", d, b, P(4*h+3)) // d3 | d7
	}
	for j := 0; j < 4; j++ { // P(j): rows 0..3 dword j | j+4; P(4+j): rows 4..7
		e.in("VSHUFI32X4 $0, Y%d, Y%d, Y%d", P(4+j), P(j), G(j))
		e.in("VSHUFI32X4 $3, Y%d, Y%d, Y%d", P(4+j), P(j), G(4+j))
	}
	if groups > 1 {
		qpSums(e, "Y", T*groups, true, 32)
	} else {
		qpSums(e, "Y", T, false, 32)
	}
	for _, r := range []string{"SI", "R9", "AX", "R12"} {
		e.in("ADDQ R14, %s", r)
	}
	e.in("ADDQ R10, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	if groups == 1 {
		for t := 0; t < T; t++ {
			e.in("VMOVUPS Y%d, %d(DX)", acc(t), 32*t)
		}
	}
	e.in("VZEROUPPER")
	e.in("RET")
}

// genActQP: the activations of the 8-row kernels (qmm_p8.go's quantActP),
// AVX-512: nb blocks of 32 values from x, one scale per block, written
// stride bytes apart from dst (qx[32], corr = negCorr·Σ qx, d); returns
// the largest |x| bit pattern (Inf or NaN: the caller redoes the row in
// Go). The steps are actQKZ's (act.go's actScale, actQuant).
func genActQP(e *emitter) {
	e.retOff = 40
	e.text("actQPZ", "(x *float32, dst *byte, nb, stride int, negCorr int32) uint32", 44)
	e.in("MOVQ x+0(FP), SI")
	e.in("MOVQ dst+8(FP), DI")
	e.in("MOVQ nb+16(FP), CX")
	e.in("MOVQ stride+24(FP), BX")
	e.in("MOVL negCorr+32(FP), AX")
	e.in("VMOVD AX, X26")
	e.in("VMOVDQU32 actAbs<>(SB), Z20")
	e.in("VMOVUPS actInv127<>(SB), Z21")
	e.in("VMOVUPS act127<>(SB), Z22")
	e.in("VMOVUPS actM127<>(SB), Z23")
	e.in("VPXORD Z25, Z25, Z25")
	e.in("VPXORD Z31, Z31, Z31")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	e.label("loop")
	e.in("VMOVUPS (SI), Z0")
	e.in("VMOVUPS 64(SI), Z1")
	e.in("VPANDD Z20, Z0, Z2")
	e.in("VPANDD Z20, Z1, Z3")
	e.in("VPMAXUD Z2, Z31, Z31")
	e.in("VPMAXUD Z3, Z31, Z31")
	e.in("VMAXPS Z3, Z2, Z2")
	// horizontal max, broadcast
	e.in("VSHUFF32X4 $0x4E, Z2, Z2, Z3")
	e.in("VMAXPS Z3, Z2, Z2")
	e.in("VSHUFF32X4 $0xB1, Z2, Z2, Z3")
	e.in("VMAXPS Z3, Z2, Z2")
	e.in("VPERMILPS $0x4E, Z2, Z3")
	e.in("VMAXPS Z3, Z2, Z2")
	e.in("VPERMILPS $0xB1, Z2, Z3")
	e.in("VMAXPS Z3, Z2, Z2")
	e.in("VMULPS Z21, Z2, Z3") // d
	e.in("VMOVSS X3, 36(DI)")
	e.in("VCMPPS $4, Z25, Z2, K1")   // amax != 0
	e.in("VDIVPS.Z Z2, Z22, K1, Z4") // id = 127/amax, else 0
	for h := 0; h < 2; h++ {
		e.in("VMULPS Z4, Z%d, Z%d", h, 5+h)
		e.in("VMAXPS Z23, Z%d, Z%d", 5+h, 5+h)
		e.in("VMINPS Z22, Z%d, Z%d", 5+h, 5+h)
		e.in("VCVTPS2DQ Z%d, Z%d", 5+h, 5+h)
		e.in("VPMOVDB Z%d, %d(DI)", 5+h, 16*h)
	}
	// corr = negCorr·Σ qx
	e.in("VPADDD Z6, Z5, Z5")
	hsumZ5(e)
	e.in("VPMULLD X26, X5, X5")
	e.in("VMOVD X5, 32(DI)")
	e.in("ADDQ $128, SI")
	e.in("ADDQ BX, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	maxAbsRet(e)
}

// p8Prefetch is the prefetch instruction of genQ8P.
const p8Prefetch = "PREFETCHT1"

// genQ8PA: the AVX2 version of genQ8P (16 registers; T = 1..8, 16 or 32
// tokens). The block's eight weight groups are transposed once through
// the stack (0(SP), group g at 32g) for all T tokens, which then run in
// passes (qp8APasses), each pass reading the groups back. T ≤ 8: passes
// of at most 4, the accumulators in Y0..Y7; T = 16, 32 (inMem, as
// genQ8P's groups > 1): passes of 8, the accumulators in acc, read and
// written back block by block (the same operations on each, in the same
// order). Q8_0 multiplies |qw| by qx·sign(qw) (VPSIGNB, VPMADDUBSW,
// VPMADDWD: pairs stay within int16). Q4_0 multiplies the nibbles
// (0..15) by qx: the eight groups' VPMADDUBSW pairs add up in int16
// (|sum| ≤ 8·2·15·128 = 30720: exact), then one VPMADDWD to int32 and
// the token's correction. Then the same float steps as genQ8P (P is
// exact, so the twin's bits). As genQ8P, it prefetches the next tile's
// rows (8..15 from w) block by block (p8Prefetch).
//
// Measured (BenchmarkMatMul-like, 5632×2048, level AVX2, 2 Zen 4 cores):
// the 8-token kernel ran Q8_0 1.2×, Q4_0 1.3× the 4-token one at 64
// tokens, 16 tokens 1.05×/1.25× the 8, 32 tokens 1.08×/1.12× the 16;
// the prefetch ran weights streamed from memory (BenchmarkMatMulBatch)
// 1.1× to 1.55× faster at 2 to 8 tokens; a streaming read ahead (memRead,
// as kpTiles) ran 1.3–1.9× slower at 2 to 8 tokens, so there is none.
func genQ8PA(e *emitter, typ string, T int) {
	e.frame = 384
	e.text(fmt.Sprintf("q%sAp8t%d", typ, T), rowTileSig, 64)
	e.frame = 0
	rowTileArgs(e)
	// Y0..Y7 acc[t] (T ≤ 8), Y8..Y11 a pass's integer sums, Y12 a weight
	// group (|qw| for Q8_0), Y13 dw, Y14 a temporary, Y15 int16 ones;
	// Y8..Y15 transpose. T > 8 (inMem): acc stays in memory, passes of 8
	// tokens with the sums in Y0..Y7 and the signed group (Q8_0) in Y11.
	inMem := T > 8
	A := func(t int) int { return t }
	accPrologue(e, "Y", T, inMem, 32)
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	p8LoopHead(e)
	row := func(i, off int) string { return p8RowAt("SI", "R9", i, off) }
	for h := 0; h < 2; h++ { // rows 4h..4h+3
		for k := 0; k < 4; k++ {
			y := 8 + k
			if typ == "Q4_0" {
				e.in("VMOVDQU %s, X%d", row(4*h+k, 2), y)
				e.in("VPSRLW $4, X%d, X12", y)
				e.in("VINSERTI128 $1, X12, Y%d, Y%d", y, y)
				e.in("VPAND qmask0F<>(SB), Y%d, Y%d", y, y)
			} else {
				e.in("VMOVDQU %s, Y%d", row(4*h+k, 2), y)
			}
		}
		e.in("VPUNPCKLDQ Y9, Y8, Y12")
		e.in("VPUNPCKHDQ Y9, Y8, Y13")
		e.in("VPUNPCKLDQ Y11, Y10, Y14")
		e.in("VPUNPCKHDQ Y11, Y10, Y15")
		e.in("VPUNPCKLQDQ Y14, Y12, Y8")  // d0 | d4
		e.in("VPUNPCKHQDQ Y14, Y12, Y9")  // d1 | d5
		e.in("VPUNPCKLQDQ Y15, Y13, Y10") // d2 | d6
		e.in("VPUNPCKHQDQ Y15, Y13, Y11") // d3 | d7
		// rows 0..3 to 256(SP) whole; with rows 4..7, groups j and j+4
		// (whole 32-byte stores, so that the loads below forward)
		for j := 0; j < 4; j++ {
			if h == 0 {
				e.in("VMOVDQU Y%d, %d(SP)", 8+j, 256+32*j)
				continue
			}
			e.in("VPERM2I128 $0x02, %d(SP), Y%d, Y12", 256+32*j, 8+j)
			e.in("VPERM2I128 $0x13, %d(SP), Y%d, Y13", 256+32*j, 8+j)
			e.in("VMOVDQU Y12, %d(SP)", 32*j)
			e.in("VMOVDQU Y13, %d(SP)", 32*(j+4))
		}
	}
	// the rows' scales: eight f16 into X13, then float32
	e.in("MOVWLZX %s, R11", row(0, 0))
	e.in("VMOVD R11, X13")
	for i := 1; i < 8; i++ {
		e.in("VPINSRW $%d, %s, X13, X13", i, row(i, 0))
	}
	e.in("VCVTPH2PS X13, Y13")
	e.in("VMOVDQU qones16<>(SB), Y15")
	t0 := 0
	I := func(j int) int { return 8 + j } // pass token j's integer sum
	if inMem {
		I = func(j int) int { return j }
	}
	for _, np := range qp8APasses(T) {
		for g := 0; g < 8; g++ {
			S := fmt.Sprintf("%d(SP)", 32*g) // the signed group (Q8_0)
			if typ == "Q4_0" {
				e.in("VMOVDQU %d(SP), Y12", 32*g)
			} else if inMem {
				e.in("VMOVDQU %d(SP), Y11", 32*g)
				e.in("VPABSB Y11, Y12")
				S = "Y11"
			} else {
				e.in("VPABSB %d(SP), Y12", 32*g)
			}
			for j := 0; j < np; j++ {
				x := 40*(t0+j) + 4*g
				e.in("VPBROADCASTD %d(DI), Y14", x)
				if typ != "Q4_0" {
					e.in("VPSIGNB %s, Y14, Y14", S)
				}
				switch {
				case g == 0:
					e.in("VPMADDUBSW Y14, Y12, Y%d", I(j))
				case typ == "Q4_0":
					e.in("VPMADDUBSW Y14, Y12, Y14")
					e.in("VPADDW Y14, Y%d, Y%d", I(j), I(j))
				default:
					e.in("VPMADDUBSW Y14, Y12, Y14")
					e.in("VPMADDWD Y15, Y14, Y14")
					e.in("VPADDD Y14, Y%d, Y%d", I(j), I(j))
				}
				if g == 0 && typ != "Q4_0" {
					e.in("VPMADDWD Y15, Y%d, Y%d", I(j), I(j))
				}
			}
		}
		for j := 0; j < np; j++ {
			if typ == "Q4_0" {
				e.in("VPMADDWD Y15, Y%d, Y%d", I(j), I(j))
				e.in("VPBROADCASTD %d(DI), Y14", 40*(t0+j)+32)
				e.in("VPADDD Y14, Y%d, Y%d", I(j), I(j))
			}
			e.in("VCVTDQ2PS Y%d, Y%d", I(j), I(j))
		}
		for j := 0; j < np; j++ {
			e.in("VBROADCASTSS %d(DI), Y14", 40*(t0+j)+36)
			e.in("VMULPS Y14, Y%d, Y%d", I(j), I(j)) // float32(P)·dx
			if inMem {
				// that·dw + acc, fused (the same single rounding)
				e.in("VFMADD213PS %d(DX), Y13, Y%d", 32*(t0+j), I(j))
				e.in("VMOVUPS Y%d, %d(DX)", I(j), 32*(t0+j))
			} else {
				e.in("VFMADD231PS Y13, Y%d, Y%d", I(j), A(t0+j))
			}
		}
		t0 += np
	}
	for _, r := range []string{"SI", "R9", "AX", "R12"} {
		e.in("ADDQ R14, %s", r)
	}
	e.in("ADDQ R10, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	if !inMem {
		for t := 0; t < T; t++ {
			e.in("VMOVUPS Y%d, %d(DX)", A(t), 32*t)
		}
	}
	e.in("VZEROUPPER")
	e.in("RET")
}

// qp8APasses splits genQ8PA's T tokens into passes: of 8 for T > 8 (a
// multiple of 8), else of at most 4, as even as can be (T = 7: 4 and 3).
func qp8APasses(T int) []int {
	if T > 8 {
		ps := make([]int, T/8)
		for i := range ps {
			ps[i] = 8
		}
		return ps
	}
	n := (T + 3) / 4
	var ps []int
	for i := 0; i < n; i++ {
		ps = append(ps, (T+n-1-i)/n)
	}
	return ps
}

// qpSums emits the per-block tail of genQ8P and genQ16P for T tokens, in
// registers of kind v ("Y": 8 rows, "Z": 16 rows): with the weight groups
// in v8..v15 and the rows' dw in v24, each token's integer sum P starts at
// its correction and takes the block's eight VPDPBUSD, then one
// conversion, one multiply by dx and one fused multiply-add by dw. With
// few tokens (not inMem) the sums run in C chains (registers P(t + T·c))
// added up at the end (exact), so that the VPDPBUSD latency is hidden,
// and the accumulators stay in v0..v(T-1). With inMem all T tokens run at
// once, one chain each (P(t) in v16..v23, then v0..v7, free of
// accumulators), and the accumulators stay in acc, accBytes apart:
// acc[t] = fma(float32(P)·dx, dw, acc[t]) by VFMADD213PS from memory (the
// same single rounding), stored back.
func qpSums(e *emitter, v string, T int, inMem bool, accBytes int) {
	P := func(t int) int { return 16 + t }
	G := func(g int) int { return 8 + g }
	if inMem {
		PW := func(t int) int {
			if t < 8 {
				return 16 + t
			}
			return t - 8
		}
		for t := 0; t < T; t++ {
			e.in("VPBROADCASTD %d(DI), %s%d", 40*t+32, v, PW(t))
		}
		for g := 0; g < 8; g++ {
			for t := 0; t < T; t++ {
				e.in("VPDPBUSD.BCST %d(DI), %s%d, %s%d", 40*t+4*g, v, G(g), v, PW(t))
			}
		}
		for t := 0; t < T; t++ {
			e.in("VCVTDQ2PS %s%d, %s%d", v, PW(t), v, PW(t))
		}
		for t := 0; t < T; t++ {
			e.in("VMULPS.BCST %d(DI), %s%d, %s%d", 40*t+36, v, PW(t), v, PW(t)) // float32(P)·dx
		}
		for t := 0; t < T; t++ {
			e.in("VFMADD213PS %d(DX), %s24, %s%d", accBytes*t, v, v, PW(t)) // that·dw + acc, fused
			e.in("VMOVUPS %s%d, %d(DX)", v, PW(t), accBytes*t)
		}
		return
	}
	C := 1
	switch {
	case T == 1:
		C = 4
	case T <= 3:
		C = 2
	}
	for t := 0; t < T; t++ {
		e.in("VPBROADCASTD %d(DI), %s%d", 40*t+32, v, P(t))
		for c := 1; c < C; c++ {
			e.in("VPXORD %s%d, %s%d, %s%d", v, P(t+T*c), v, P(t+T*c), v, P(t+T*c))
		}
	}
	for g := 0; g < 8; g++ {
		for t := 0; t < T; t++ {
			e.in("VPDPBUSD.BCST %d(DI), %s%d, %s%d", 40*t+4*g, v, G(g), v, P(t+T*(g%C)))
		}
	}
	for t := 0; t < T; t++ {
		switch C {
		case 4:
			e.in("VPADDD %s%d, %s%d, %s%d", v, P(t+T), v, P(t), v, P(t))
			e.in("VPADDD %s%d, %s%d, %s%d", v, P(t+3*T), v, P(t+2*T), v, P(t+2*T))
			e.in("VPADDD %s%d, %s%d, %s%d", v, P(t+2*T), v, P(t), v, P(t))
		case 2:
			e.in("VPADDD %s%d, %s%d, %s%d", v, P(t+T), v, P(t), v, P(t))
		}
	}
	for t := 0; t < T; t++ {
		e.in("VCVTDQ2PS %s%d, %s%d", v, P(t), v, P(t))
	}
	for t := 0; t < T; t++ {
		e.in("VMULPS.BCST %d(DI), %s%d, %s%d", 40*t+36, v, P(t), v, P(t)) // float32(P)·dx
	}
	for t := 0; t < T; t++ {
		e.in("VFMADD231PS %s24, %s%d, %s%d", v, v, P(t), v, t) // acc += that·dw, fused
	}
}

// rowTileSig is the signature of the row-tile kernels (genQ8P, genQ8PA,
// genQ16P, kquantp.go's).
const rowTileSig = "(w unsafe.Pointer, ldw int, x unsafe.Pointer, xs int, nb int, acc *float32, load int, bs int)"

// rowTileArgs loads a row-tile kernel's arguments: SI w, BX ldw, DI x, R10
// xs, CX nb, DX acc, AX load, R14 bs (the bytes from a row's block to its
// next: the block bytes in the row layout, 16 of them in 16-row panels);
// and R8 = 3·ldw, R9 = w + 4·ldw (row 4).
func rowTileArgs(e *emitter) {
	e.in("MOVQ w+0(FP), SI")
	e.in("MOVQ ldw+8(FP), BX")
	e.in("MOVQ x+16(FP), DI")
	e.in("MOVQ xs+24(FP), R10")
	e.in("MOVQ nb+32(FP), CX")
	e.in("MOVQ acc+40(FP), DX")
	e.in("MOVQ load+48(FP), AX")
	e.in("MOVQ bs+56(FP), R14")
	e.in("LEAQ (BX)(BX*2), R8")
	e.in("LEAQ (SI)(BX*4), R9")
}

// accPrologue emits a row-tile kernel's start: with inMem the T
// accumulators at acc (DX, accBytes apart) are cleared unless load (AX)
// is set; else they are loaded into registers v0..v(T-1), or cleared
// there. It ends at the label start.
func accPrologue(e *emitter, v string, T int, inMem bool, accBytes int) {
	e.in("TESTQ AX, AX")
	if inMem {
		e.in("JNZ start")
		e.in("VXORPS %s0, %s0, %s0", v, v, v)
		for t := 0; t < T; t++ {
			e.in("VMOVUPS %s0, %d(DX)", v, accBytes*t)
		}
	} else {
		e.in("JZ zero")
		for t := 0; t < T; t++ {
			e.in("VMOVUPS %d(DX), %s%d", accBytes*t, v, t)
		}
		e.in("JMP start")
		e.label("zero")
		for t := 0; t < T; t++ {
			e.in("VXORPS %s%d, %s%d, %s%d", v, t, v, t, v, t)
		}
	}
	e.label("start")
}

// p8RowAt is the address of byte off of row i (0..7) of an 8-row tile
// whose rows 0 and 4 are at the registers lo and hi (BX = ldw, R8 =
// 3·ldw).
func p8RowAt(lo, hi string, i, off int) string {
	base, r := lo, i
	if i >= 4 {
		base, r = hi, i-4
	}
	switch r {
	case 0:
		return fmt.Sprintf("%d(%s)", off, base)
	case 1:
		return fmt.Sprintf("%d(%s)(BX*1)", off, base)
	case 2:
		return fmt.Sprintf("%d(%s)(BX*2)", off, base)
	}
	return fmt.Sprintf("%d(%s)(R8*1)", off, base)
}

// p8LoopHead emits the start of the 8-row kernels' block loop: AX and R12
// at the next tile's rows 0 and 4 (w + 8·ldw, w + 12·ldw; rowTileArgs set
// R9 = w + 4·ldw), the label loop, and the prefetch of the next tile's
// eight rows at the current block (see p8Prefetch), so that they stream
// in block by block as this tile's are read.
func p8LoopHead(e *emitter) {
	e.in("LEAQ (R9)(BX*4), AX")
	e.in("LEAQ (AX)(BX*4), R12")
	e.label("loop")
	for i := 0; i < 8; i++ {
		e.in("%s %s", p8Prefetch, p8RowAt("AX", "R12", i, 0))
	}
}

// kTokenSums runs a K-quant kernel's integer sums (sums: for tokens ts,
// into accumulators accs and, when given, accs2) for its T tokens: all at
// once into the registers I when there is one per token, else token by
// token into yi (and yi2 when not negative).
func kTokenSums(T int, I []int, yi, yi2 int, sums func(ts, accs, accs2 []int)) {
	if I != nil {
		ts := make([]int, T)
		for t := range ts {
			ts[t] = t
		}
		sums(ts, I, nil)
		return
	}
	var second []int
	if yi2 >= 0 {
		second = []int{yi2}
	}
	for t := 0; t < T; t++ {
		sums([]int{t}, []int{yi}, second)
	}
}

// rowsEpilogue ends a rows kernel's row (rowsMode, genQ32Rows): the eight
// lanes of Y(a) summed by reduceLanes' tree into out[0], out and w moved
// to the next row, the row loop closed.
func rowsEpilogue(e *emitter, a int) {
	e.in("VEXTRACTF128 $1, Y%d, X1", a)
	e.in("VADDPS X1, X%d, X0", a)
	e.in("VMOVHLPS X0, X0, X1")
	e.in("VADDPS X1, X0, X0")
	e.in("VMOVSHDUP X0, X1")
	e.in("VADDSS X1, X0, X0")
	e.in("MOVQ out+32(FP), DX")
	e.in("VMOVSS X0, (DX)")
	e.in("ADDQ $4, DX")
	e.in("MOVQ DX, out+32(FP)")
	e.in("MOVQ w+0(FP), AX")
	e.in("ADDQ BX, AX")
	e.in("MOVQ AX, w+0(FP)")
	e.in("DECQ rows+40(FP)")
	e.in("JNZ row")
	e.label("end")
	e.in("VZEROUPPER")
	e.in("RET")
}

// genIQ4XS: IQ4_XS weights (136-byte super-blocks: f16 d, uint16
// scales_h, uint8 scales_l[4], qs[128]) with Q8_K activations, AVX2 only
// (VPSIGNB has no EVEX form; AVX-512 machines run these). Per super-block
// and lane l, with s_j = the 6-bit scale of sub-block j minus 32 and v the
// level kvalues_iq4nl[nibble] (signed):
//
//	I = Σ_j s_j Σ_{e=4l..4l+3} v[32j+e]·qx[32j+e]
//	acc[l] += float32(I) * (d*dx)
//
// A sub-block's 16 bytes are loaded into both 128-bit lanes, the low
// nibbles kept in the low lane and the high ones in the high lane (its
// values 0..15 and 16..31), looked up with VPSHUFB, then |v| · (qx·sign v)
// by VPMADDUBSW (at most 2·127·127, no saturation) and VPMADDWD by s_j.
func genIQ4XS(e *emitter, R, T int) {
	rg := &regs{max: 16}
	op := opsFor("A")
	name := qname("IQ4_XS", "A", R, T)
	e.frame = 64 // s_j as int16 [8] at 0(SP)
	A := qprologue(e, name, R, T, rg)
	mask, ytab := rg.get(), rg.get()
	e.in("%s qmask0F<>(SB), Y%d", op.movdqu, mask)
	e.in("%s kvIQ4<>(SB), Y%d", op.movdqu, ytab)
	// Sub-block j's values are looked up once (yv, and their magnitudes
	// yabs) for all T tokens, each token's integer sum in its own yi[t]
	// (exact: the order of integer additions does not matter); with
	// 16 registers, R·T + 2·T ≤ 8.
	ysc, yq, yv, yabs, ysx, yp := rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get()
	yi := make([]int, T)
	for t := range yi {
		yi[t] = rg.get()
	}
	e.label("loop")
	for r := 0; r < R; r++ {
		e.in("MOVL %s, R9", rowAddr(r, 4))
		e.in("MOVWLZX %s, R10", rowAddr(r, 2))
		for j := 0; j < 8; j++ {
			e.in("MOVL R9, R11")
			if j > 0 {
				e.in("SHRL $%d, R11", 4*j)
			}
			e.in("ANDL $15, R11")
			e.in("MOVL R10, R12")
			if j > 0 {
				e.in("SHRL $%d, R12", 2*j)
			}
			e.in("ANDL $3, R12")
			e.in("SHLL $4, R12")
			e.in("ORL R12, R11")
			e.in("SUBL $32, R11")
			e.in("MOVW R11, %d(SP)", 2*j)
		}
		for t := 0; t < T; t++ {
			e.in("VPXOR Y%d, Y%d, Y%d", yi[t], yi[t], yi[t])
		}
		for j := 0; j < 8; j++ {
			e.in("VBROADCASTI128 %s, Y%d", rowAddr(r, 8+16*j), yq)
			e.in("VPSRLW $4, Y%d, Y%d", yq, yv)
			e.in("VPBLENDD $0xF0, Y%d, Y%d, Y%d", yv, yq, yq)
			e.in("VPAND Y%d, Y%d, Y%d", mask, yq, yq)
			e.in("VPSHUFB Y%d, Y%d, Y%d", yq, ytab, yv)
			e.in("VPSIGNB Y%d, Y%d, Y%d", yv, yv, yabs)
			e.in("VPBROADCASTW %d(SP), Y%d", 2*j, ysc)
			for t := 0; t < T; t++ {
				e.in("VMOVDQU %d(DI), Y%d", t*xbK+32*j, ysx)
				e.in("VPSIGNB Y%d, Y%d, Y%d", yv, ysx, ysx)
				e.in("VPMADDUBSW Y%d, Y%d, Y%d", ysx, yabs, yp)
				e.in("VPMADDWD Y%d, Y%d, Y%d", ysc, yp, yp)
				e.in("VPADDD Y%d, Y%d, Y%d", yp, yi[t], yi[t])
			}
		}
		yd := yq // free once the integer sums are done
		e.in("VPBROADCASTW %s, X%d", rowAddr(r, 0), yd)
		e.in("VCVTPH2PS X%d, X%d", yd, yd)
		for t := 0; t < T; t++ {
			e.in("VCVTDQ2PS Y%d, Y%d", yi[t], yi[t])
			e.in("VMULSS %d(DI), X%d, X%d", t*xbK+xbKD, yd, yp)
			e.in("VBROADCASTSS X%d, Y%d", yp, yp)
			e.in("VMULPS Y%d, Y%d, Y%d", yp, yi[t], yi[t])
			e.in("VADDPS Y%d, Y%d, Y%d", yi[t], A[t][r], A[t][r])
		}
	}
	qepilogue(e, R, T, A, 136, T*xbK)
	e.frame = 0
}

// genIQ4XSV: IQ4_XS weights with Q8_K activations, AVX-512 (BW, VNNI):
// the AVX2 kernel's integer sums lane for lane, 64 values (two
// sub-blocks 2p, 2p+1) per instruction. Per row and super-block the eight
// scales s_j = (ls_j | hs_j<<4) − 32 are unpacked in vector lanes
// (VPSRLVD of the broadcast scale bytes) into eight words, and VPERMW
// spreads s_2p over the low 256 bits and s_2p+1 over the high ones. Per
// pair the 32 quant bytes become [low nibbles 2p | high 2p | low 2p+1 |
// high 2p+1] (VSHUFI64X2, a masked VPSRLW, VPANDD), the table gives the
// values v (VPSHUFB per 128-bit lane), |v| and v's signs (VPABSB,
// VPMOVB2M) once for all T tokens; per token the activations negated
// where v < 0 (a masked VPSUBB from zero: AVX2's VPSIGNB, which AVX-512
// lacks, to the byte), VPMADDUBSW by |v| and VPDPWSSD by the scale words
// into a 16-lane sum whose halves, added, are the AVX2 kernel's eight
// lanes (dword m: values 4m..4m+3 of each sub-block; exact integers).
// The float steps are the AVX2 kernel's.
func genIQ4XSV(e *emitter, R, T int) {
	if R != 1 {
		panic("genIQ4XSV: one row")
	}
	rg := &regs{max: 32}
	name := qname("IQ4_XS", "V", R, T)
	A := qprologue(e, name, R, T, rg)
	zmask, ztab, zzero := rg.get(), rg.get(), rg.get()
	e.in("VBROADCASTI64X4 qmask0F<>(SB), Z%d", zmask)
	e.in("VBROADCASTI32X4 kvIQ4<>(SB), Z%d", ztab)
	e.in("VPXORD Z%d, Z%d, Z%d", zzero, zzero, zzero)
	idx := make([]int, 4)
	for p := range idx {
		idx[p] = rg.get()
		e.in("VMOVDQU64 kvIQ4perm%d<>(SB), Z%d", p, idx[p])
	}
	zsl, zsh := rg.get(), rg.get()
	e.in("VMOVDQU32 kvIQ4shl<>(SB), Y%d", zsl)
	e.in("VMOVDQU32 kvIQ4shh<>(SB), Y%d", zsh)
	e.in("MOVL $0xFF00FF00, AX")
	e.in("KMOVD AX, K1") // words of 128-bit lanes 1 and 3
	zs8, zq, zv, zabs, zsc, zx, zp := rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get()
	zi := make([]int, T)
	for t := range zi {
		zi[t] = rg.get()
	}
	e.label("loop")
	// s_j: bits 4j..4j+3 of the scale bytes (dword at 4) and bits
	// 2j..2j+1 of the high word (at 2; the dword's upper half does not
	// reach them), as dwords, then words.
	e.in("VPBROADCASTD %s, Y%d", rowAddr(0, 4), zs8)
	e.in("VPSRLVD Y%d, Y%d, Y%d", zsl, zs8, zs8)
	e.in("VPANDD kvIQ4x15<>(SB), Y%d, Y%d", zs8, zs8)
	e.in("VPBROADCASTD %s, Y%d", rowAddr(0, 2), zq)
	e.in("VPSRLVD Y%d, Y%d, Y%d", zsh, zq, zq)
	e.in("VPANDD kvIQ4x3<>(SB), Y%d, Y%d", zq, zq)
	e.in("VPSLLD $4, Y%d, Y%d", zq, zq)
	e.in("VPORD Y%d, Y%d, Y%d", zq, zs8, zs8)
	e.in("VPSUBD kvIQ4x32<>(SB), Y%d, Y%d", zs8, zs8)
	e.in("VPMOVDW Y%d, X%d", zs8, zs8)
	for t := 0; t < T; t++ {
		e.in("VPXORD Z%d, Z%d, Z%d", zi[t], zi[t], zi[t])
	}
	for p := 0; p < 4; p++ {
		e.in("VBROADCASTI64X4 %s, Z%d", rowAddr(0, 8+32*p), zq)
		e.in("VSHUFI64X2 $0x50, Z%d, Z%d, Z%d", zq, zq, zq) // [q2p q2p q2p+1 q2p+1]
		e.in("VPSRLW $4, Z%d, K1, Z%d", zq, zq)
		e.in("VPANDD Z%d, Z%d, Z%d", zmask, zq, zq)
		e.in("VPSHUFB Z%d, Z%d, Z%d", zq, ztab, zv)
		e.in("VPABSB Z%d, Z%d", zv, zabs)
		e.in("VPMOVB2M Z%d, K2", zv)
		e.in("VPERMW Z%d, Z%d, Z%d", zs8, idx[p], zsc)
		for t := 0; t < T; t++ {
			e.in("VMOVDQU64 %d(DI), Z%d", t*xbK+64*p, zx)
			e.in("VPSUBB Z%d, Z%d, K2, Z%d", zx, zzero, zx)
			e.in("VPMADDUBSW Z%d, Z%d, Z%d", zx, zabs, zp)
			e.in("VPDPWSSD Z%d, Z%d, Z%d", zsc, zp, zi[t])
		}
	}
	yd := zq
	e.in("VPBROADCASTW %s, X%d", rowAddr(0, 0), yd)
	e.in("VCVTPH2PS X%d, X%d", yd, yd)
	for t := 0; t < T; t++ {
		e.in("VEXTRACTI64X4 $1, Z%d, Y%d", zi[t], zp)
		e.in("VPADDD Y%d, Y%d, Y%d", zp, zi[t], zi[t])
		e.in("VCVTDQ2PS Y%d, Y%d", zi[t], zi[t])
		e.in("VMULSS %d(DI), X%d, X%d", t*xbK+xbKD, yd, zp)
		e.in("VBROADCASTSS X%d, Y%d", zp, zp)
		e.in("VMULPS Y%d, Y%d, Y%d", zp, zi[t], zi[t])
		e.in("VADDPS Y%d, Y%d, Y%d", zi[t], A[t][0], A[t][0])
	}
	qepilogue(e, R, T, A, 136, T*xbK)
}

// genIQ4XSVData: genIQ4XSV's constants.
func genIQ4XSVData(e *emitter) {
	for p := 0; p < 4; p++ {
		b := make([]byte, 64)
		for w := 0; w < 32; w++ {
			b[2*w] = byte(2*p + w/16) // words 0..15: s_2p, 16..31: s_2p+1
		}
		e.dataBytes(fmt.Sprintf("kvIQ4perm%d", p), b)
	}
	sl, sh := make([]byte, 32), make([]byte, 32)
	for j := 0; j < 8; j++ {
		sl[4*j], sh[4*j] = byte(4*j), byte(2*j)
	}
	e.dataBytes("kvIQ4shl", sl)
	e.dataBytes("kvIQ4shh", sh)
	for _, c := range []struct {
		name string
		v    byte
	}{{"kvIQ4x15", 15}, {"kvIQ4x3", 3}, {"kvIQ4x32", 32}} {
		b := make([]byte, 32)
		for j := 0; j < 8; j++ {
			b[4*j] = c.v
		}
		e.dataBytes(c.name, b)
	}
}
