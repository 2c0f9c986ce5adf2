//go:build ignore

package main

import "fmt"

// genQ32More: the 32-value types of quant_more.go with Q8 activations
// (xb32 blocks, corr = -128·Σ qx per lane, act.go), one row at a time:
//
//	Q4_1 (20 bytes: f16 d, f16 m, qs[16]), Q5_1 (24: d, m, qh u32, qs[16]):
//	  q in 0..15 / 0..31, P = Σ q·qx, S = Σ qx = -(corr >> 7)
//	  acc[l] = fma(float32(S)·dx[l], m, fma(float32(P)·dx[l], d, acc[l]))
//	Q5_0 (22: d, qh, qs[16]): q = q5-16, P = Σ q5·qx + (corr >> 3)
//	IQ4_NL (18: d, qs[16]): q = kvalues_iq4nl[nibble]; AVX2: |q|·(qx·sign q)
//	  (VPSIGNB, as IQ4_XS); AVX-512: (q+128)·qx + corr (as Q8_0)
//	  acc[l] = fma(float32(P)·dx[l], d, acc[l])   (both, as Q4_0)
//
// Nibbles as Q4_0's (values 0..15 low, 16..31 high); the fifth bit k of qh
// for value k: qh broadcast, byte k/8 to byte k (VPSHUFB q5shuf), bit k%8
// kept (q5bits), VPMINUB 1 and VPSLLW 4 make it 16. The sums are integer
// (VPMADDUBSW pairs at most 2·31·127, or 2·127·127 for IQ4_NL) and the
// float part is the twin's (dot32): the results equal it bit for bit.
// float32(S)·m is added as VFNMADD231PS of float32(-S)·dx and m, the same
// rounded value.
func genQ32More(e *emitter, typ, isa string, R, T int) {
	if R != 1 {
		panic("genQ32More: one row")
	}
	vr := 16
	if isa == "V" {
		vr = 32
	}
	rg := &regs{max: vr}
	op := opsFor(isa)
	A := qprologue(e, qname(typ, isa, R, T), R, T, rg)
	var bb, qsOff, qhOff, mOff int // qhOff, mOff: -1 where the type has none
	switch typ {
	case "Q4_1":
		bb, qsOff, qhOff, mOff = 20, 4, -1, 2
	case "Q5_0":
		bb, qsOff, qhOff, mOff = 22, 6, 2, -1
	case "Q5_1":
		bb, qsOff, qhOff, mOff = 24, 8, 4, 2
	case "IQ4_NL":
		bb, qsOff, qhOff, mOff = 18, 2, -1, -1
	default:
		panic(typ)
	}
	mask, ones := rg.get(), -1
	e.in("%s qmask0F<>(SB), Y%d", op.movdqu, mask)
	if isa == "A" {
		ones = rg.get()
		e.in("VMOVDQU qones16<>(SB), Y%d", ones)
	}
	ytab := -1
	if typ == "IQ4_NL" {
		ytab = rg.get()
		tab := "kvIQ4"
		if isa == "V" {
			tab = "kvIQ4u"
		}
		e.in("%s %s<>(SB), Y%d", op.movdqu, tab, ytab)
	}
	yd, ym, yq, yt, yp, yc, yx := rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get()
	e.label("loop")
	// the weights: d (and m) broadcast, the levels to yq (unsigned, or
	// IQ4_NL's: AVX2 signed, AVX-512 plus 128)
	e.in("VPBROADCASTW 0(SI), X%d", yd)
	e.in("VCVTPH2PS X%d, Y%d", yd, yd)
	if mOff >= 0 {
		e.in("VPBROADCASTW %d(SI), X%d", mOff, ym)
		e.in("VCVTPH2PS X%d, Y%d", ym, ym)
	}
	e.in("%s %d(SI), X%d", op.movdqu, qsOff, yq)
	e.in("VPSRLW $4, X%d, X%d", yq, yt)
	e.in("%s $1, X%d, Y%d, Y%d", op.inserti128, yt, yq, yq)
	e.in("%s Y%d, Y%d, Y%d", op.pand, mask, yq, yq)
	if qhOff >= 0 {
		e.in("VPBROADCASTD %d(SI), Y%d", qhOff, yt)
		e.in("VPSHUFB q5shuf<>(SB), Y%d, Y%d", yt, yt)
		e.in("%s q5bits<>(SB), Y%d, Y%d", op.pand, yt, yt)
		e.in("VPMINUB qmask01<>(SB), Y%d, Y%d", yt, yt)
		e.in("VPSLLW $4, Y%d, Y%d", yt, yt)
		e.in("%s Y%d, Y%d, Y%d", op.por, yt, yq, yq)
	}
	if typ == "IQ4_NL" {
		e.in("VPSHUFB Y%d, Y%d, Y%d", yq, ytab, yq)
		if isa == "A" {
			e.in("VPSIGNB Y%d, Y%d, Y%d", yq, yq, yt) // |q|
		}
	}
	for t := 0; t < T; t++ {
		xo := t * xb32
		dx := fmt.Sprintf("%d(DI)", xo+xb32D)
		if isa == "V" {
			switch typ {
			case "IQ4_NL":
				e.in("VMOVDQU32 %d(DI), Y%d", xo+xb32Corr, yp)
			case "Q5_0":
				e.in("VMOVDQU32 %d(DI), Y%d", xo+xb32Corr, yp)
				e.in("VPSRAD $3, Y%d, Y%d", yp, yp)
			default:
				e.in("VPXORD Y%d, Y%d, Y%d", yp, yp, yp)
			}
			e.in("VPDPBUSD %d(DI), Y%d, Y%d", xo, yq, yp)
		} else {
			if typ == "IQ4_NL" {
				e.in("VMOVDQU %d(DI), Y%d", xo, yx)
				e.in("VPSIGNB Y%d, Y%d, Y%d", yq, yx, yx)
				e.in("VPMADDUBSW Y%d, Y%d, Y%d", yx, yt, yp)
			} else {
				e.in("VPMADDUBSW %d(DI), Y%d, Y%d", xo, yq, yp)
			}
			e.in("VPMADDWD Y%d, Y%d, Y%d", ones, yp, yp)
			if typ == "Q5_0" {
				e.in("VMOVDQU %d(DI), Y%d", xo+xb32Corr, yc)
				e.in("VPSRAD $3, Y%d, Y%d", yc, yc)
				e.in("VPADDD Y%d, Y%d, Y%d", yc, yp, yp)
			}
		}
		e.in("VCVTDQ2PS Y%d, Y%d", yp, yp)
		e.in("VMULPS %s, Y%d, Y%d", dx, yp, yp)            // float32(P)·dx
		e.in("VFMADD231PS Y%d, Y%d, Y%d", yd, yp, A[t][0]) // acc += that·d, fused
		if mOff >= 0 {
			e.in("%s %d(DI), Y%d", op.movdqu, xo+xb32Corr, yc)
			e.in("VPSRAD $7, Y%d, Y%d", yc, yc) // -S
			e.in("VCVTDQ2PS Y%d, Y%d", yc, yc)
			e.in("VMULPS %s, Y%d, Y%d", dx, yc, yc)             // float32(-S)·dx
			e.in("VFNMADD231PS Y%d, Y%d, Y%d", ym, yc, A[t][0]) // acc -= that·m, fused
		}
	}
	qepilogue(e, R, T, A, bb, T*xb32)
}

// genQ32MoreData emits genQ32More's tables.
func genQ32MoreData(e *emitter) {
	var shuf, bits, kvu [32]byte
	kv := []int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
	for i := range shuf {
		shuf[i] = byte(i / 8 % 2) // byte i/8 of qh: 0, 1 in the low lane, 2, 3 (as 0, 1 + 2) in the high
		if i >= 16 {
			shuf[i] += 2
		}
		bits[i] = 1 << (i % 8)
		kvu[i] = byte(int(kv[i%16]) + 128)
	}
	e.dataBytes("q5shuf", shuf[:])
	e.dataBytes("q5bits", bits[:])
	e.dataBytes("kvIQ4u", kvu[:])
}
