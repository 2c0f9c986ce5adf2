//go:build ignore

package main

// genQ3K: Q3_K weights (110-byte super-blocks: hmask[32], qs[64],
// scales[12], f16 d) with Q8_K activations. Value i of group g = i/32
// (e = i%32) is q3 = (qs[32(g/4)+e] >> 2(g%4) & 3) | (hmask[e] >> g & 1)<<2
// in 0..7 (ggml's q = q3 - 4); the sixteen 6-bit scales s (minus 32) are
// unpacked as ggml's kmask trick does. Per super-block and lane l:
//
//	I = Σ_g s[2g + l/4] · Σ_{e=4l..4l+3} q3·qx     (twoBitSums, as Q6_K's)
//	M = s[2l]·bs[2l] + s[2l+1]·bs[2l+1]
//	acc[l] += float32(I - 4·M) * (d*dx)
//
// VPMADDUBSW takes q3 as unsigned (pairs at most 2·7·128), VPMADDWD or
// VPDPWSSD multiplies by the scale: the integer sums are exact.
func genQ3K(e *emitter, isa string, R, T int) {
	vr := 16
	if isa == "V" {
		vr = 32
	}
	rg := &regs{max: vr}
	op := opsFor(isa)
	name := qname("Q3_K", isa, R, T)
	e.frame = 64 // scales as int16 [16] at 0(SP)
	A := qprologue(e, name, R, T, rg)
	ys16, yd, yh := rg.get(), rg.get(), rg.get()
	k := newTwoBit(rg)
	I, yi, yi2 := kAccumulators(rg, isa, T)
	e.label("loop")
	for r := 0; r < R; r++ {
		// The scales (ggml: aux[0..2] = the 12 bytes as uint32s, tmp =
		// aux[2]): scale bytes 4w..4w+3 = ((aux[w%2] >> 4(w/2)) & 0x0f0f0f0f)
		// | (((tmp >> 2w) & 0x03030303) << 4), two words to a general
		// register and two registers to X(ys16) (no store to the stack and
		// narrower loads, which the CPU could not forward), then as int16
		// minus 32 to ys16 and 0(SP).
		e.in("MOVL %s, R9", rowAddr(r, 96))
		e.in("MOVL %s, R10", rowAddr(r, 100))
		e.in("MOVL %s, R11", rowAddr(r, 104))
		word := func(w int, dst string) {
			e.in("MOVL R11, %s", dst)
			if w > 0 {
				e.in("SHRL $%d, %s", 2*w, dst)
			}
			e.in("ANDL $0x03030303, %s", dst)
			e.in("SHLL $4, %s", dst)
			e.in("MOVL %s, R14", []string{"R9", "R10"}[w%2])
			if w >= 2 {
				e.in("SHRL $4, R14")
			}
			e.in("ANDL $0x0f0f0f0f, R14")
			e.in("ORL R14, %s", dst)
		}
		for h := 0; h < 2; h++ {
			word(2*h, "R12")
			word(2*h+1, "R13")
			e.in("SHLQ $32, R13")
			e.in("ORQ R13, R12")
			if h == 0 {
				e.in("VMOVQ R12, X%d", ys16)
			} else {
				e.in("VPINSRQ $1, R12, X%d, X%d", ys16, ys16)
			}
		}
		e.in("VPMOVZXBW X%d, Y%d", ys16, ys16)
		e.in("VPSUBW qw32<>(SB), Y%d, Y%d", ys16, ys16)
		e.in("%s Y%d, 0(SP)", op.movdqu, ys16)
		e.in("VPBROADCASTW %s, X%d", rowAddr(r, 108), yd)
		e.in("VCVTPH2PS X%d, X%d", yd, yd)
		tokenSums := func(ts []int, accs, accs2 []int) {
			e.in("%s %s, Y%d", op.movdqu, rowAddr(r, 0), yh)
			k.sums(e, isa, r, 32, ts, accs, accs2, func(g, yq int) {
				// the high bit g of hmask to bit 2
				switch {
				case g < 2:
					e.in("VPSLLW $%d, Y%d, Y%d", 2-g, yh, k.yt)
				case g == 2:
					e.in("%s Y%d, Y%d", op.movdqu, yh, k.yt)
				default:
					e.in("VPSRLW $%d, Y%d, Y%d", g-2, yh, k.yt)
				}
				e.in("%s qmask04<>(SB), Y%d, Y%d", op.pand, k.yt, k.yt)
				e.in("%s Y%d, Y%d, Y%d", op.por, k.yt, yq, yq)
			})
			for i, t := range ts {
				ia := accs[i]
				if accs2 != nil {
					e.in("VPADDD Y%d, Y%d, Y%d", accs2[i], ia, ia)
				}
				e.in("VPMADDWD %d(DI), Y%d, Y%d", t*xbK+xbKBs, ys16, k.yp)
				e.in("VPSLLD $2, Y%d, Y%d", k.yp, k.yp)
				e.in("VPSUBD Y%d, Y%d, Y%d", k.yp, ia, ia)
				e.in("VCVTDQ2PS Y%d, Y%d", ia, ia)
				e.in("VMULSS %d(DI), X%d, X%d", t*xbK+xbKD, yd, k.yp)
				e.in("VBROADCASTSS X%d, Y%d", k.yp, k.yp)
				e.in("VMULPS Y%d, Y%d, Y%d", k.yp, ia, ia)
				e.in("VADDPS Y%d, Y%d, Y%d", ia, A[t][r], A[t][r])
			}
		}
		kTokenSums(T, I, yi, yi2, tokenSums)
	}
	qepilogue(e, R, T, A, 110, T*xbK)
	e.frame = 0
}

// twoBit holds the registers of twoBitSums.
type twoBit struct{ yv, yql, yq, yt, ysc, yp int }

func newTwoBit(rg *regs) *twoBit {
	return &twoBit{rg.get(), rg.get(), rg.get(), rg.get(), rg.get(), rg.get()}
}

// kAccumulators are a K-quant kernel's integer accumulators (kTokenSums):
// one per token (I) with AVX-512 where the registers allow, else yi and,
// for one token with AVX-512, a second chain yi2 (-1: none).
func kAccumulators(rg *regs, isa string, T int) (I []int, yi, yi2 int) {
	if isa == "V" && T > 1 && rg.max-rg.next >= T+1 {
		for t := 0; t < T; t++ {
			I = append(I, rg.get())
		}
	}
	yi, yi2 = rg.get(), -1
	if isa == "V" && T == 1 {
		yi2 = rg.get()
	}
	return I, yi, yi2
}

// sums emits the integer sums of the 2-bit plane of Q2_K and Q3_K (qs[64]
// at byte qsOff of row r; the sixteen int16 scales at 0(SP)) for tokens ts
// into accs (odd groups into accs2 when given): group g = 4n+i of 32
// values has the bits 2i of qs[32n..32n+31], hi (when not nil) ORs more
// bits into them, and its two sub-blocks' scales are words 2g, 2g+1 (the
// q6shuf table: words 2i, 2i+1 of half n's eight).
func (k *twoBit) sums(e *emitter, isa string, r, qsOff int, ts, accs, accs2 []int, hi func(g, yq int)) {
	op := opsFor(isa)
	for _, ia := range append(append([]int{}, accs...), accs2...) {
		e.in("%s Y%d, Y%d, Y%d", op.pxor, ia, ia, ia)
	}
	for n := 0; n < 2; n++ {
		e.in("%s %d(SP), Y%d", op.broadcasti128, 16*n, k.yv)
		e.in("%s %s, Y%d", op.movdqu, rowAddr(r, qsOff+32*n), k.yql)
		for i := 0; i < 4; i++ {
			g := 4*n + i
			if i > 0 {
				e.in("VPSRLW $%d, Y%d, Y%d", 2*i, k.yql, k.yq)
				e.in("%s qmask03<>(SB), Y%d, Y%d", op.pand, k.yq, k.yq)
			} else {
				e.in("%s qmask03<>(SB), Y%d, Y%d", op.pand, k.yql, k.yq)
			}
			if hi != nil {
				hi(g, k.yq)
			}
			e.in("VPSHUFB q6shuf%d<>(SB), Y%d, Y%d", i, k.yv, k.ysc)
			for j, t := range ts {
				acc := accs[j]
				if accs2 != nil && g%2 == 1 {
					acc = accs2[j]
				}
				e.in("VPMADDUBSW %d(DI), Y%d, Y%d", t*xbK+32*g, k.yq, k.yp)
				if isa == "V" {
					e.in("VPDPWSSD Y%d, Y%d, Y%d", k.ysc, k.yp, acc)
				} else {
					e.in("VPMADDWD Y%d, Y%d, Y%d", k.ysc, k.yp, k.yp)
					e.in("VPADDD Y%d, Y%d, Y%d", k.yp, acc, acc)
				}
			}
		}
	}
}
