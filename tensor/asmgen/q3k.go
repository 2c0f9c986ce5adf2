//go:build ignore

package main

import "fmt"

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
	var z *q3kZ
	if isa == "V" && T == 1 {
		z = newQ3KZ(e, rg)
	}
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
			if z != nil {
				z.sums(e, r, ts[0], accs[0], accs2[0], ys16, k)
			} else {
				q3kSums(e, op, isa, r, ts, accs, accs2, yh, k)
			}
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

// q3kSums is the YMM path of genQ3K's integer sums (twoBitSums with the
// high bit of hmask ORed in; yh holds hmask).
func q3kSums(e *emitter, op isaOps, isa string, r int, ts, accs, accs2 []int, yh int, k *twoBit) {
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
}

// q3kZ: genQ3K's one-token AVX-512 sums, two groups (g = 2p, 2p+1: 64
// values) per instruction. The 2-bit plane of half n (qs[32n..32n+31])
// and hmask are broadcast to both 256-bit halves and shifted per half by
// word (VPSRLVW, VPSLLVW: the low half group 2p's amounts, the high half
// group 2p+1's); VPERMW spreads the scales 2g, 2g+1, 2g+2, 2g+3 over the
// four 128-bit lanes. Dword l of the low half sums values 4l..4l+3 of the
// even groups, of the high half those of the odd groups: the halves,
// added, are the YMM kernel's lanes (exact integers).
type q3kZ struct {
	qsh, hsh, perm [4]int // per pair: qs shifts, hmask shifts, scale indices
	m03, m04       int
}

func newQ3KZ(e *emitter, rg *regs) *q3kZ {
	z := &q3kZ{m03: rg.get(), m04: rg.get()}
	e.in("VBROADCASTI64X4 qmask03<>(SB), Z%d", z.m03)
	e.in("VBROADCASTI64X4 qmask04<>(SB), Z%d", z.m04)
	for p := 0; p < 4; p++ {
		z.qsh[p], z.hsh[p], z.perm[p] = rg.get(), rg.get(), rg.get()
		e.in("VMOVDQU64 kq3qsh%d<>(SB), Z%d", p, z.qsh[p])
		e.in("VMOVDQU64 kq3hsh%d<>(SB), Z%d", p, z.hsh[p])
		e.in("VMOVDQU64 kq3perm%d<>(SB), Z%d", p, z.perm[p])
	}
	return z
}

// genQ3KZData: q3kZ's constants (words).
func genQ3KZData(e *emitter) {
	words := func(name string, f func(w int) int) {
		b := make([]byte, 64)
		for w := 0; w < 32; w++ {
			v := f(w)
			b[2*w], b[2*w+1] = byte(v), byte(v>>8)
		}
		e.dataBytes(name, b)
	}
	for p := 0; p < 4; p++ {
		g0 := 2 * p
		words(fmt.Sprintf("kq3qsh%d", p), func(w int) int { return 2 * ((g0 + w/16) % 4) })
		// hmask bit g to bit 2: left by 2-g for g < 2 (pair 0), else right by g-2
		words(fmt.Sprintf("kq3hsh%d", p), func(w int) int {
			g := g0 + w/16
			if p == 0 {
				return 2 - g
			}
			return g - 2
		})
		words(fmt.Sprintf("kq3perm%d", p), func(w int) int { return 2*g0 + w/8 })
	}
}

// sums adds row r's integer sums for token t into Z(acc) (pairs 0, 2) and
// Z(acc2) (pairs 1, 3), then folds each to its YMM lanes. ys16 holds the
// sixteen scales as words; k's registers are the temporaries.
func (z *q3kZ) sums(e *emitter, r, t, acc, acc2, ys16 int, k *twoBit) {
	e.in("VPXORD Z%d, Z%d, Z%d", acc, acc, acc)
	e.in("VPXORD Z%d, Z%d, Z%d", acc2, acc2, acc2)
	e.in("VBROADCASTI64X4 %s, Z%d", rowAddr(r, 0), k.yt) // hmask, both halves
	for p := 0; p < 4; p++ {
		n := p / 2
		if p%2 == 0 {
			e.in("VBROADCASTI64X4 %s, Z%d", rowAddr(r, 32+32*n), k.yql) // qs of half n, both halves
		}
		e.in("VPSRLVW Z%d, Z%d, Z%d", z.qsh[p], k.yql, k.yq)
		e.in("VPANDD Z%d, Z%d, Z%d", z.m03, k.yq, k.yq)
		if p == 0 {
			e.in("VPSLLVW Z%d, Z%d, Z%d", z.hsh[p], k.yt, k.yv)
		} else {
			e.in("VPSRLVW Z%d, Z%d, Z%d", z.hsh[p], k.yt, k.yv)
		}
		e.in("VPTERNLOGD $0xF8, Z%d, Z%d, Z%d", z.m04, k.yv, k.yq) // q | (h & 4)
		e.in("VPERMW Z%d, Z%d, Z%d", ys16, z.perm[p], k.ysc)
		a := acc
		if p%2 == 1 {
			a = acc2
		}
		e.in("VPMADDUBSW %d(DI), Z%d, Z%d", t*xbK+64*p, k.yq, k.yp)
		e.in("VPDPWSSD Z%d, Z%d, Z%d", k.ysc, k.yp, a)
	}
	for _, a := range []int{acc, acc2} {
		e.in("VEXTRACTI64X4 $1, Z%d, Y%d", a, k.yp)
		e.in("VPADDD Y%d, Y%d, Y%d", k.yp, a, a)
	}
}
