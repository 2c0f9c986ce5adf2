//go:build ignore

package main

// genQ2K: Q2_K weights (84-byte super-blocks: scales[16] (scale in the
// low nibble, min in the high one), qs[64], f16 d, f16 dmin) with Q8_K
// activations. Value i of group g = i/32 (e = i%32) is q = qs[32(g/4)+e]
// >> 2(g%4) & 3. Per super-block and lane l, with sc and m the sixteen
// scales and mins:
//
//	I = Σ_g sc[2g + l/4] · Σ_{e=4l..4l+3} q·qx     (twoBitSums, as Q3_K's)
//	M = m[2l]·bs[2l] + m[2l+1]·bs[2l+1]
//	acc[l] += float32(I)·(d·dx) - float32(M)·(dmin·dx)     (as Q4_K)
func genQ2K(e *emitter, isa string, R, T int) {
	vr := 16
	if isa == "V" {
		vr = 32
	}
	rg := &regs{max: vr}
	op := opsFor(isa)
	name := qname("Q2_K", isa, R, T)
	e.frame = 64 // scales as int16 [16] at 0(SP)
	A := qprologue(e, name, R, T, rg)
	ymin, yd, ydm := rg.get(), rg.get(), rg.get()
	k := newTwoBit(rg)
	I, yi, yi2 := kAccumulators(rg, isa, T)
	e.label("loop")
	for r := 0; r < R; r++ {
		// the sixteen scale bytes as int16: scales (low nibbles; the high
		// bytes are zero) to 0(SP), mins (>> 4) to ymin
		e.in("VPMOVZXBW %s, Y%d", rowAddr(r, 0), ymin)
		e.in("%s qmask0F<>(SB), Y%d, Y%d", op.pand, ymin, k.ysc)
		e.in("%s Y%d, 0(SP)", op.movdqu, k.ysc)
		e.in("VPSRLW $4, Y%d, Y%d", ymin, ymin)
		e.in("VPBROADCASTW %s, X%d", rowAddr(r, 80), yd)
		e.in("VCVTPH2PS X%d, X%d", yd, yd)
		e.in("VPBROADCASTW %s, X%d", rowAddr(r, 82), ydm)
		e.in("VCVTPH2PS X%d, X%d", ydm, ydm)
		tokenSums := func(ts []int, accs, accs2 []int) {
			k.sums(e, isa, r, 16, ts, accs, accs2, nil)
			ym := k.yq // free once the integer sums are done
			for i, t := range ts {
				ia := accs[i]
				if accs2 != nil {
					e.in("VPADDD Y%d, Y%d, Y%d", accs2[i], ia, ia)
				}
				e.in("VPMADDWD %d(DI), Y%d, Y%d", t*xbK+xbKBs, ymin, ym)
				e.in("VCVTDQ2PS Y%d, Y%d", ia, ia)
				e.in("VCVTDQ2PS Y%d, Y%d", ym, ym)
				e.in("VMULSS %d(DI), X%d, X%d", t*xbK+xbKD, yd, k.yp)
				e.in("VBROADCASTSS X%d, Y%d", k.yp, k.yp)
				e.in("VMULPS Y%d, Y%d, Y%d", k.yp, ia, ia)
				e.in("VMULSS %d(DI), X%d, X%d", t*xbK+xbKD, ydm, k.yp)
				e.in("VBROADCASTSS X%d, Y%d", k.yp, k.yp)
				e.in("VMULPS Y%d, Y%d, Y%d", k.yp, ym, ym)
				e.in("VSUBPS Y%d, Y%d, Y%d", ym, ia, ia)
				e.in("VADDPS Y%d, Y%d, Y%d", ia, A[t][r], A[t][r])
			}
		}
		kTokenSums(T, I, yi, yi2, tokenSums)
	}
	qepilogue(e, R, T, A, 84, T*xbK)
	e.frame = 0
}
