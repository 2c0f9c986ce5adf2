//go:build ignore

package main

import "fmt"

// K-quant kernels for several tokens (package tensor's qmm_kp.go), AVX2:
// the kpFunc of kquantp.go's AVX-512 VNNI kernels, same arguments, same
// results (the Go twins' bits), in sixteen YMM registers without VNNI.
//
// q<typ>Ak16t<T>(w, ldw, x, xs, nb, acc, load), T ≤ 8 tokens: for each
// super-block, the sixteen rows one at a time, a row's 256 values in the
// lanes (32 bytes a vector, as stored), unpacked once for the T tokens;
// per token, VPMADDUBSW of the unsigned quants (≤ 15 or ≤ 63) by the
// int8 activations (pairs ≤ 2·63·127: no int16 saturation), VPMADDWD by
// the int16 scale of the pair's sub-block (exact int32), VPADDD: eight
// int32 lanes whose sum is the twins' I (exact, in any order). The mins'
// sum M (Q4_K) by one VPMADDWD of the activations' bs by the mins in
// pairs; Q6_K's -32·M the same way, by -32·sc, as the start of I. Then
// horizontal sums (VPHADDD), token t in lane t, and the twins' float
// steps for the row's T tokens at once: d·dx (and dmin·dx) as float32
// products, VFMADD231PS (VFNMADD231PS for -M). The accumulators stay on
// the stack, transposed (row i's tokens at kpaAcc + 32i, lanes t ≥ T
// unused), copied from acc at the start when load is not 0 (else
// cleared) and back at the end; the super-block's dx of the T tokens at
// kpaDx.
//
// Registers: Y0..Y(T-1) the tokens' I, Y15 0x0F bytes; Q4_K: Y8 the
// products, Y9/Y10 a pair of sub-blocks' scale words, Y11/Y12 their
// quants, Y13 d, dmin (floats), Y14 the row's scales and mins (bytes, in
// both 128-bit lanes), then the mins' sums M and the float steps in the
// registers left; Q6_K: Y8 the high bits qh of a half, Y9 a group's
// quants, Y10 a temporary, Y11 -32·sc (words), then the products, Y12
// the scales as words (even k in the low 128-bit lane, odd in the high),
// Y13 a group's scale words (then d), Y14 0x30 bytes.

// kpaPrefetch is the instruction with which the kernels prefetch the
// next tile's block (the row sixteen rows down) as they multiply a row's
// block; "" for none.
const kpaPrefetch = "PREFETCHT0"

const kpaT = 8 // tokens per call at most

func genKQuantA(e *emitter) {
	bytes32 := func(name string, f func(i int) byte) {
		b := make([]byte, 32)
		for i := range b {
			b[i] = f(i)
		}
		e.dataBytes(name, b)
	}
	bytes32("kpa03", func(int) byte { return 0x03 })
	bytes32("kpa3F", func(int) byte { return 0x3f })
	bytes32("kpa30", func(int) byte { return 0x30 })
	// Q4_K: scale j as words (bytes 8..15 of each lane: scales), the
	// mins in pairs (bytes 0..7: mins; word k of lane l: m_{4l + k/2})
	for j := 0; j < 8; j++ {
		bytes32(fmt.Sprintf("kpasc%d", j), func(i int) byte {
			if i%2 == 1 {
				return 0x80
			}
			return byte(8 + j)
		})
	}
	bytes32("kpam", func(i int) byte {
		if i%2 == 1 {
			return 0x80
		}
		return byte(4*(i/16) + i%16/4)
	})
	// Q6_K: the sixteen scale bytes even ones first, then odd; word g of
	// each lane broadcast
	eo := make([]byte, 16)
	for i := range eo {
		eo[i] = byte(2*(i%8) + i/8)
	}
	e.dataBytes("kpa6eo", eo)
	for g := 0; g < 8; g++ {
		bytes32(fmt.Sprintf("kpa6w%d", g), func(i int) byte { return byte(2*g + i%2) })
	}
	for _, typ := range []string{"Q4_K", "Q6_K"} {
		for T := 1; T <= kpaT; T++ {
			genKPA(e, typ, T)
		}
	}
}

// Stack of the kernels: the accumulators transposed, row i's T tokens
// at kpaAcc + 32i (so that the float steps of a row run on its tokens
// at once), and the super-block's dx of the T tokens at kpaDx.
const (
	kpaAcc   = 0
	kpaDx    = 16 * 32
	kpaFrame = kpaDx + 32
)

// genKPA emits q<typ>Ak16t<T> (see above). GPRs: SI w (block b), BX
// ldw, DI x (block b), R10 xs, CX blocks left, DX acc, R13 the row, R12
// its accumulators (stack), R11 rows left, R9 16·ldw (the next tile).
func genKPA(e *emitter, typ string, T int) {
	bb := 144
	if typ == "Q6_K" {
		bb = 210
	}
	e.frame = kpaFrame
	e.text(fmt.Sprintf("q%sAk16t%d", typ, T), rowTileSig, 64)
	e.frame = 0
	rowTileArgs(e)
	e.in("MOVQ BX, R9")
	e.in("SHLQ $4, R9")
	// the stack cleared (lanes t ≥ T stay 0), acc loaded into it
	e.in("VXORPS Y0, Y0, Y0")
	for i := 0; i < 16; i++ {
		e.in("VMOVUPS Y0, %d(SP)", kpaAcc+32*i)
	}
	e.in("VMOVUPS Y0, %d(SP)", kpaDx)
	e.in("TESTQ AX, AX")
	e.in("JZ start")
	kpaCopy(e, "load", T, func(t int) {
		e.in("VMOVSS %d(DX)(R11*1), X%d", 64*t, t)
		e.in("VMOVSS X%d, %d(SP)(R11*8)", t, kpaAcc+4*t)
	})
	e.label("start")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	e.in("VPBROADCASTD kp0F<>(SB), Y15")
	if typ == "Q6_K" {
		e.in("VMOVDQU kpa30<>(SB), Y14")
	}
	e.label("loop")
	for t := 0; t < T; t++ {
		e.in("VMOVSS %d(DI), X%d", t*xbK+xbKD, t)
		e.in("VMOVSS X%d, %d(SP)", t, kpaDx+4*t)
	}
	e.in("MOVQ SI, R13")
	e.in("LEAQ %d(SP), R12", kpaAcc)
	e.in("MOVQ $16, R11")
	e.label("row")
	if kpaPrefetch != "" {
		for off := 0; off < bb; off += 64 {
			e.in("%s %d(R13)(R9*1)", kpaPrefetch, off)
		}
		e.in("%s %d(R13)(R9*1)", kpaPrefetch, bb-1)
	}
	if typ == "Q4_K" {
		kpaQ4KRow(e, T)
	} else {
		kpaQ6KRow(e, T)
	}
	e.in("ADDQ BX, R13")
	e.in("ADDQ $32, R12")
	e.in("DECQ R11")
	e.in("JNZ row")
	e.in("ADDQ R14, SI")
	e.in("ADDQ R10, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	kpaCopy(e, "store", T, func(t int) {
		e.in("VMOVSS %d(SP)(R11*8), X%d", kpaAcc+4*t, t)
		e.in("VMOVSS X%d, %d(DX)(R11*1)", t, 64*t)
	})
	e.in("VZEROUPPER")
	e.in("RET")
}

// kpaCopy emits a loop over the sixteen rows (R11 = 4i) that runs body
// for each token t < T (acc[t·16 + i] at 64t(DX)(R11*1), its stack copy at
// kpaAcc+4t(SP)(R11*8)).
func kpaCopy(e *emitter, label string, T int, body func(t int)) {
	e.in("XORQ R11, R11")
	e.label(label)
	for t := 0; t < T; t++ {
		body(t)
	}
	e.in("ADDQ $4, R11")
	e.in("CMPQ R11, $64")
	e.in("JNE %s", label)
}

// kpaVec joins the hsum outputs out (lanes: tokens) into one vector
// register of T lanes, and returns its name: X for T ≤ 4, else Y.
func kpaVec(e *emitter, out []int, T int) string {
	if T > 4 {
		e.in("VINSERTI128 $1, X%d, Y%d, Y%d", out[1], out[0], out[0])
		return fmt.Sprintf("Y%d", out[0])
	}
	return fmt.Sprintf("X%d", out[0])
}

// kpaQ4KRow: one Q4_K super-block of the row at R13, T tokens.
func kpaQ4KRow(e *emitter, T int) {
	// A = [d|dmin, u0, u1, u2] (the 12 scale bytes as three dwords)
	e.in("VMOVDQU (R13), X9")
	e.in("VCVTPH2PS X9, X13") // d, dmin in lanes 0, 1
	// high parts: dword 1 scales 4..7 = (u2 & 0x0f) | ((u0 >> 6) & 3) << 4,
	// dword 2 mins 4..7 = ((u2 >> 4) & 0x0f) | ((u1 >> 6) & 3) << 4
	e.in("VPSHUFD $0xFF, X9, X10")
	e.in("VPSRLD $4, X10, X11")
	e.in("VPBLENDD $0x04, X11, X10, X10")
	e.in("VPAND X15, X10, X10")
	e.in("VPSRLD $6, X9, X11")
	e.in("VPAND kpa03<>(SB), X11, X11")
	e.in("VPSLLD $4, X11, X11")
	e.in("VPOR X11, X10, X10")
	// low parts: dword 1 scales 0..3 = u0 & 0x3f, dword 2 mins 0..3 = u1 & 0x3f
	e.in("VPAND kpa3F<>(SB), X9, X9")
	e.in("VPUNPCKLDQ X10, X9, X11")       // scales 0..7 at bytes 8..15
	e.in("VPUNPCKHDQ X10, X9, X12")       // mins 0..7 at bytes 0..7
	e.in("VPBLENDD $0x0C, X11, X12, X12") // mins, scales
	e.in("VINSERTI128 $1, X12, Y12, Y14") // in both 128-bit lanes
	// bytes 16+32c..: sub-blocks 2c (low nibbles), 2c+1 (high)
	for c := 0; c < 4; c++ {
		e.in("VMOVDQU %d(R13), Y12", 16+32*c)
		e.in("VPSRLW $4, Y12, Y11")
		e.in("VPAND Y15, Y11, Y11")
		e.in("VPAND Y15, Y12, Y12")
		e.in("VPSHUFB kpasc%d<>(SB), Y14, Y9", 2*c)
		e.in("VPSHUFB kpasc%d<>(SB), Y14, Y10", 2*c+1)
		for s := 0; s < 2; s++ {
			j := 2*c + s
			q, sc := 12-s, 9+s
			for t := 0; t < T; t++ {
				e.in("VPMADDUBSW %d(DI), Y%d, Y8", t*xbK+32*j, q)
				if j == 0 {
					e.in("VPMADDWD Y%d, Y8, Y%d", sc, t)
					continue
				}
				e.in("VPMADDWD Y%d, Y8, Y8", sc)
				e.in("VPADDD Y8, Y%d, Y%d", t, t)
			}
		}
	}
	iregs := kpaRegs(0, T)
	iout := kpaHSum(e, iregs, 8) // lane t%4 of iout[t/4]: I of token t
	// M = Σ_j m_j·(bs[2j] + bs[2j+1]), lanes j
	e.in("VPSHUFB kpam<>(SB), Y14, Y9")
	free := kpaFree(append(iout, 8, 9, 13, 15)...)
	mregs := free[:T]
	for t := 0; t < T; t++ {
		e.in("VPMADDWD %d(DI), Y9, Y%d", t*xbK+xbKBs, mregs[t])
	}
	mout := kpaHSum(e, mregs, 8) // M
	v := "X"
	if T > 4 {
		v = "Y"
	}
	fi, fm := kpaVec(e, iout, T), kpaVec(e, mout, T)
	e.in("VCVTDQ2PS %s, %s", fi, fi)
	e.in("VCVTDQ2PS %s, %s", fm, fm)
	tmp := kpaFree(13, 15, iout[0], mout[0])
	dd, ddm, a := tmp[0], tmp[1], tmp[2]
	e.in("VBROADCASTSS X13, %s%d", v, dd)
	e.in("VMULPS %d(SP), %s%d, %s%d", kpaDx, v, dd, v, dd) // d·dx
	e.in("VMOVSHDUP X13, X%d", ddm)
	e.in("VBROADCASTSS X%d, %s%d", ddm, v, ddm)
	e.in("VMULPS %d(SP), %s%d, %s%d", kpaDx, v, ddm, v, ddm) // dmin·dx
	e.in("VMOVUPS (R12), %s%d", v, a)
	e.in("VFMADD231PS %s%d, %s, %s%d", v, dd, fi, v, a)   // float32(I)·d·dx + acc, fused
	e.in("VFNMADD231PS %s%d, %s, %s%d", v, ddm, fm, v, a) // - float32(M)·dmin·dx, fused
	e.in("VMOVUPS %s%d, (R12)", v, a)
}

// kpaRegs is the registers r0..r0+n-1.
func kpaRegs(r0, n int) []int {
	var rs []int
	for r := r0; r < r0+n; r++ {
		rs = append(rs, r)
	}
	return rs
}

// kpaFree is the registers Y0..Y15 other than used, in order.
func kpaFree(used ...int) []int {
	var rs []int
	for r := 0; r < 16; r++ {
		u := false
		for _, v := range used {
			u = u || v == r
		}
		if !u {
			rs = append(rs, r)
		}
	}
	return rs
}

// kpaHSum sums the int32 lanes of each register regs[t] (exact) into
// lane t%4 of out[t/4] (out[k] is regs[4k]), with tmp a scratch register.
func kpaHSum(e *emitter, regs []int, tmp int) (out []int) {
	for k := 0; k < len(regs); k += 4 {
		sub := regs[k:min(k+4, len(regs))]
		for p := 0; 2*p < len(sub); p++ {
			a, b := sub[2*p], sub[2*p]
			if 2*p+1 < len(sub) {
				b = sub[2*p+1]
			}
			e.in("VPHADDD Y%d, Y%d, Y%d", b, a, a) // per 128-bit lane: a01 a23 b01 b23
			e.in("VEXTRACTI128 $1, Y%d, X%d", a, tmp)
			e.in("VPADDD X%d, X%d, X%d", tmp, a, a) // a(0,1), a(2,3), b(0,1), b(2,3)
		}
		b := sub[0]
		if len(sub) > 2 {
			b = sub[2]
		}
		e.in("VPHADDD X%d, X%d, X%d", b, sub[0], sub[0]) // a, b, c, d
		out = append(out, sub[0])
	}
	return out
}

// kpaQ6KRow: one Q6_K super-block of the row at R13, T tokens.
func kpaQ6KRow(e *emitter, T int) {
	e.in("VMOVDQU 192(R13), X9") // sc[16]
	e.in("VPSHUFB kpa6eo<>(SB), X9, X10")
	e.in("VPMOVSXBW X10, Y12") // even k | odd k, words
	e.in("VPMOVSXBW X9, Y11")
	e.in("VPSLLW $5, Y11, Y11")
	e.in("VPXOR Y10, Y10, Y10")
	e.in("VPSUBW Y11, Y10, Y11") // -32·sc_k
	for t := 0; t < T; t++ {
		e.in("VPMADDWD %d(DI), Y11, Y%d", t*xbK+xbKBs, t) // I starts at -32·M
	}
	for n := 0; n < 2; n++ { // values 128n..128n+127
		e.in("VMOVDQU %d(R13), Y8", 128+32*n) // qh
		// group g = 4n+i of 32 values, scales k = 2g, 2g+1
		for i := 0; i < 4; i++ {
			g := 4*n + i
			ql := 64*n + 32*(i%2)
			if i < 2 {
				e.in("VPAND %d(R13), Y15, Y9", ql)
			} else {
				e.in("VMOVDQU %d(R13), Y9", ql)
				e.in("VPSRLW $4, Y9, Y9")
				e.in("VPAND Y15, Y9, Y9")
			}
			switch i { // qh bits 2i, 2i+1 to bits 4, 5
			case 0:
				e.in("VPSLLW $4, Y8, Y10")
				e.in("VPAND Y14, Y10, Y10")
			case 1:
				e.in("VPSLLW $2, Y8, Y10")
				e.in("VPAND Y14, Y10, Y10")
			case 2:
				e.in("VPAND Y14, Y8, Y10")
			case 3:
				e.in("VPSRLW $2, Y8, Y10")
				e.in("VPAND Y14, Y10, Y10")
			}
			e.in("VPOR Y10, Y9, Y9")
			e.in("VPSHUFB kpa6w%d<>(SB), Y12, Y13", g)
			for t := 0; t < T; t++ {
				e.in("VPMADDUBSW %d(DI), Y9, Y11", t*xbK+32*g)
				e.in("VPMADDWD Y13, Y11, Y11")
				e.in("VPADDD Y11, Y%d, Y%d", t, t)
			}
		}
	}
	iout := kpaHSum(e, kpaRegs(0, T), 8) // lane t%4 of iout[t/4]: I - 32·M of token t
	v := "X"
	if T > 4 {
		v = "Y"
	}
	fi := kpaVec(e, iout, T)
	e.in("VCVTDQ2PS %s, %s", fi, fi)
	e.in("MOVWLZX 208(R13), AX")
	e.in("VMOVD AX, X13")
	e.in("VCVTPH2PS X13, X13") // d
	e.in("VBROADCASTSS X13, %s13", v)
	e.in("VMULPS %d(SP), %s13, %s13", kpaDx, v, v) // d·dx
	a := kpaFree(13, 14, 15, iout[0])[0]
	e.in("VMOVUPS (R12), %s%d", v, a)
	e.in("VFMADD231PS %s13, %s, %s%d", v, fi, v, a) // float32(I - 32·M)·d·dx + acc, fused
	e.in("VMOVUPS %s%d, (R12)", v, a)
}
