//go:build ignore

package main

import "fmt"

// K-quant kernels for several tokens (package tensor's qmm_kp.go, which
// has their Go twins), AVX-512 VNNI: sixteen Q4_K or Q6_K weight rows in
// the sixteen dword lanes of ZMM vectors (kpTranspose: sixteen bytes of
// each row at a time), the quants as unsigned bytes, times tokens of
// Q8_K-style activations (act.go's xbK blocks: qx[256], bs[16], d; block
// b of token t at x + b·xs + t·xbK), with VPDPBUSD integer dot products
// of four values (the activations broadcast), into acc[t·16 + i] (row i
// in lane i), loaded when load is not 0, else cleared; the accumulators
// stay in acc, read and written back once per super-block and token.
// Integer sums (exact) per sixteen values, scaled by the rows' scales in
// integers, then the float steps of the twins (kpQ4K, kpQ6K).
//
// q<typ>Vk16t<T>(w, ldw, x, xs, nb, acc, load), T ≤ 8, unpack each
// super-block in registers for its T tokens (rows at w + i·ldw). For more
// than 8 tokens Q6_K, whose unpacking costs about twice as much, runs in
// two steps per tile:
//
//   - kpuQ6_K(w, ldw, nb, u) unpacks the tile once into u, kuBytes per
//     super-block: quants, scales as int32 lanes, 32·scales as int16
//     pairs, d as float32 lanes;
//   - kpcQ6_Kt<T>(u, x, xs, nb, acc, load) multiplies the unpacked tile
//     by T ≤ 16 tokens,
//
// so that a tile is unpacked once for all the tokens (kpTiles). (Q4_K
// this way ran as fast at 64 tokens, 13% slower at 16: its unpacking in
// registers overlaps the products.)
//
// Unpacked Q6_K super-block (kuBytes): for each group k of sixteen values
// (k = 0..15) at kuK·k: four vectors of quants (vector g: values
// 16k+4g..16k+4g+3 of each row) then the int32 scales sc_k; at kuM eight
// vectors of int16 pairs p (32·sc_{2p}, 32·sc_{2p+1}), multiplied with the
// activations' pairs bs[2p], bs[2p+1]; at kuD d.
const (
	kuK     = 320
	kuScale = 256
	kuM     = 16 * kuK
	kuD     = kuM + 8*64
	kuBytes = kuD + 64
)

// kpPrefetch is the instruction with which the direct kernels prefetch
// the next tile (the sixteen rows after theirs, which kpTiles multiplies
// next) block by block, spread over the arithmetic on the tokens, so that
// the weights stream from memory under it (a prefetch never faults; past
// the end of the matrix it is wasted). "" for none.
const kpPrefetch = "PREFETCHT1"

func genKQuantP(e *emitter) {
	dword := func(name string, v uint32) {
		b := make([]byte, 8)
		for i := range b {
			b[i] = byte(v >> (8 * (i % 4)))
		}
		e.dataBytes(name, b)
	}
	dword("kp0F", 0x0f0f0f0f)
	dword("kp03", 0x03030303)
	dword("kp3F", 0x3f3f3f3f)
	dword("kp30", 0x30303030)
	// VPSHUFB indices, per dword of a 128-bit lane: byte s of the dword
	// zero-extended (kpsc<s>), the int16 pair (byte s, byte s) (kpm<s>),
	// the bytes 2p, 2p, 2p+1, 2p+1 (kp6p<p>: VPSRAW $8 then makes the
	// int16 pair of the two signed bytes).
	table := func(name string, f func(d int) [4]byte) {
		b := make([]byte, 64)
		for i := 0; i < 16; i++ {
			q := f(i % 4)
			copy(b[4*i:], q[:])
		}
		e.dataBytes(name, b)
	}
	for s := 0; s < 4; s++ {
		table(fmt.Sprintf("kpsc%d", s), func(d int) [4]byte { return [4]byte{byte(4*d + s), 0x80, 0x80, 0x80} })
		table(fmt.Sprintf("kpm%d", s), func(d int) [4]byte { return [4]byte{byte(4*d + s), 0x80, byte(4*d + s), 0x80} })
	}
	for p := 0; p < 2; p++ {
		table(fmt.Sprintf("kp6p%d", p), func(d int) [4]byte {
			a := byte(4*d + 2*p)
			return [4]byte{a, a, a + 1, a + 1}
		})
	}
	for _, typ := range []string{"Q4_K", "Q6_K"} {
		for T := 1; T <= 8; T++ {
			genKP(e, typ, T)
		}
	}
	genKPUnpack(e)
	for T := 1; T <= 16; T++ {
		genKPCompute(e, T)
	}
}

// kpRow is the address of byte off of row r (0..15): rows 0, 4, 8, 12 at
// SI, R9, R11, R12, then BX (ldw) and R8 (3·ldw) apart.
func kpRow(r, off int) string {
	base := []string{"SI", "R9", "R11", "R12"}[r/4]
	switch r % 4 {
	case 1:
		return fmt.Sprintf("%d(%s)(BX*1)", off, base)
	case 2:
		return fmt.Sprintf("%d(%s)(BX*2)", off, base)
	case 3:
		return fmt.Sprintf("%d(%s)(R8*1)", off, base)
	}
	return fmt.Sprintf("%d(%s)", off, base)
}

// kpTranspose loads bytes off..off+15 of the sixteen rows and transposes
// them: out[d] lane i = row i's dword d. tmp are eight scratch registers
// (out may be tmp[0..3]).
func kpTranspose(e *emitter, off int, out [4]int, tmp [8]int) {
	for k := 0; k < 4; k++ { // tmp[k]: rows k, k+4, k+8, k+12 in the 128-bit lanes
		e.in("VMOVDQU32 %s, X%d", kpRow(k, off), tmp[k])
		for l := 1; l < 4; l++ {
			e.in("VINSERTI32X4 $%d, %s, Z%d, Z%d", l, kpRow(k+4*l, off), tmp[k], tmp[k])
		}
	}
	e.in("VPUNPCKLDQ Z%d, Z%d, Z%d", tmp[1], tmp[0], tmp[4]) // a0 b0 a1 b1
	e.in("VPUNPCKHDQ Z%d, Z%d, Z%d", tmp[1], tmp[0], tmp[5]) // a2 b2 a3 b3
	e.in("VPUNPCKLDQ Z%d, Z%d, Z%d", tmp[3], tmp[2], tmp[6]) // c0 d0 c1 d1
	e.in("VPUNPCKHDQ Z%d, Z%d, Z%d", tmp[3], tmp[2], tmp[7]) // c2 d2 c3 d3
	e.in("VPUNPCKLQDQ Z%d, Z%d, Z%d", tmp[6], tmp[4], out[0])
	e.in("VPUNPCKHQDQ Z%d, Z%d, Z%d", tmp[6], tmp[4], out[1])
	e.in("VPUNPCKLQDQ Z%d, Z%d, Z%d", tmp[7], tmp[5], out[2])
	e.in("VPUNPCKHQDQ Z%d, Z%d, Z%d", tmp[7], tmp[5], out[3])
}

var kpTmp = [8]int{8, 9, 10, 11, 12, 13, 14, 15}

// genKP emits q<typ>Vk16t<T>, the super-blocks unpacked in registers.
// Registers: Z0..Z7 the integer sums I of tokens 0..7, Z8..Z15 the sums P
// of sixteen values (and the mins' sums M; transposition scratch in
// between), Z16.. the transposed quants.
//
// Q4_K, per super-block (sub-block j: 32 values, scale sc_j, min m_j, both
// 6 bits, unpacked as ggml's get_scale_min_k4 in the lanes): for each
// half of a sub-block P = Σ q·qx (|P| ≤ 16·15·127 fits an int16), then
// I += sc_j·P by VPDPWSSD (sc_j in the low word of the lane, 0 in the
// high); M = Σ_j m_j·(bs[2j] + bs[2j+1]) by VPDPWSSD; then
// acc = fma(float32(I), d·dx, acc), acc = fma(-float32(M), dmin·dx, acc).
//
// Q6_K, per super-block (sixteen int8 scales sc_k of 16 values, q =
// ql | qh<<4 in 0..63): P = Σ q·qx per 16 values, I += sc_k·P
// (VPMULLD, VPADDD); M = Σ_k sc_k·bs[k] by VPDPWSSD on pairs; then
// acc = fma(float32(I - 32·M), d·dx, acc).
func genKP(e *emitter, typ string, T int) {
	bb, frame := 144, 256
	if typ == "Q6_K" {
		bb, frame = 210, 320
	}
	e.frame = frame
	e.text(fmt.Sprintf("q%sVk16t%d", typ, T), rowTileSig, 64)
	rowTileArgs(e)
	e.in("LEAQ (R9)(BX*4), R11")
	e.in("LEAQ (R11)(BX*4), R12")
	if kpPrefetch != "" {
		// the next tile: its 16·nb·bb bytes (16 rows, or the next panel)
		e.in("IMUL3Q $%d, CX, R13", 16*bb)
		e.in("ADDQ SI, R13")
	}
	accPrologue(e, "Z", T, true, 64)
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	e.label("loop")
	if kpPrefetch != "" {
		// the next tile's share of this block: it is one range of
		// 16·nb·bb bytes in both layouts, prefetched in 16·bb-byte steps
		for off := 0; off < 16*bb; off += 64 {
			e.in("%s %d(R13)", kpPrefetch, off)
		}
		e.in("ADDQ $%d, R13", 16*bb)
	}
	if typ == "Q4_K" {
		kpQ4KBlock(e, T)
	} else {
		kpQ6KBlock(e, T)
	}
	for _, r := range []string{"SI", "R9", "R11", "R12"} {
		e.in("ADDQ R14, %s", r)
	}
	e.in("ADDQ R10, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
	e.frame = 0
}

// kpZero clears the registers P of the T tokens.
func kpZero(e *emitter, T int) {
	for t := 0; t < T; t++ {
		e.in("VPXORD Z%d, Z%d, Z%d", 8+t, 8+t, 8+t)
	}
}

// kpQ4KBlock: one Q4_K super-block (see genKP). Stack: packed scales 0..3
// at 0(SP), 4..7 at 64(SP), mins at 128(SP) and 192(SP) (a row's four
// 6-bit values in its dword). Z24 0x0F bytes, Z25/Z26 unpacked quants,
// Z27/Z28 the scales of the two sub-blocks of a chunk, Z29 d, Z30 dmin.
func kpQ4KBlock(e *emitter, T int) {
	// d|dmin, then the 12 scale bytes as three dwords u0, u1, u2
	kpTranspose(e, 0, [4]int{8, 9, 10, 11}, kpTmp)
	e.in("VPMOVDW Z8, Y29")
	e.in("VCVTPH2PS Y29, Z29")
	e.in("VPSRLD $16, Z8, Z30")
	e.in("VPMOVDW Z30, Y30")
	e.in("VCVTPH2PS Y30, Z30")
	e.in("VPBROADCASTD kp0F<>(SB), Z24")
	// scales 0..3 = u0 & 0x3f3f3f3f
	e.in("VPANDD.BCST kp3F<>(SB), Z9, Z12")
	e.in("VMOVDQU32 Z12, 0(SP)")
	// scales 4..7 = (u2 & 0x0f0f0f0f) | ((u0 >> 6) & 0x03030303) << 4
	e.in("VPSRLD $6, Z9, Z13")
	e.in("VPANDD.BCST kp03<>(SB), Z13, Z13")
	e.in("VPSLLD $4, Z13, Z13")
	e.in("VPANDD Z24, Z11, Z14")
	e.in("VPORD Z14, Z13, Z13")
	e.in("VMOVDQU32 Z13, 64(SP)")
	// mins 0..3 = u1 & 0x3f3f3f3f
	e.in("VPANDD.BCST kp3F<>(SB), Z10, Z14")
	e.in("VMOVDQU32 Z14, 128(SP)")
	// mins 4..7 = ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 6) & 0x03030303) << 4
	e.in("VPSRLD $4, Z11, Z15")
	e.in("VPANDD Z24, Z15, Z15")
	e.in("VPSRLD $6, Z10, Z14")
	e.in("VPANDD.BCST kp03<>(SB), Z14, Z14")
	e.in("VPSLLD $4, Z14, Z14")
	e.in("VPORD Z14, Z15, Z15")
	e.in("VMOVDQU32 Z15, 192(SP)")
	for t := 0; t < T; t++ {
		e.in("VPXORD Z%d, Z%d, Z%d", t, t, t)
	}
	for c := 0; c < 4; c++ { // bytes 16+32c..: sub-blocks 2c (low nibbles), 2c+1 (high)
		for s := 0; s < 2; s++ {
			j := 2*c + s
			e.in("VMOVDQU32 %d(SP), Z%d", 64*(j/4), 27+s)
			e.in("VPSHUFB kpsc%d<>(SB), Z%d, Z%d", j%4, 27+s, 27+s)
		}
		for h := 0; h < 2; h++ { // values 16h..16h+15 of the sub-blocks
			kpTranspose(e, 16+32*c+16*h, [4]int{16, 17, 18, 19}, kpTmp)
			for s := 0; s < 2; s++ {
				j := 2*c + s
				kpZero(e, T)
				for g := 0; g < 4; g++ {
					w := 25 + g%2
					if s == 0 {
						e.in("VPANDD Z24, Z%d, Z%d", 16+g, w)
					} else {
						e.in("VPSRLW $4, Z%d, Z%d", 16+g, w)
						e.in("VPANDD Z24, Z%d, Z%d", w, w)
					}
					for t := 0; t < T; t++ {
						e.in("VPDPBUSD.BCST %d(DI), Z%d, Z%d", t*xbK+32*j+16*h+4*g, w, 8+t)
					}
				}
				for t := 0; t < T; t++ {
					e.in("VPDPWSSD Z%d, Z%d, Z%d", 27+s, 8+t, t) // I += sc_j·P
				}
			}
		}
	}
	// M = Σ_j m_j·(bs[2j] + bs[2j+1])
	kpZero(e, T)
	for j := 0; j < 8; j++ {
		e.in("VMOVDQU32 %d(SP), Z31", 128+64*(j/4))
		e.in("VPSHUFB kpm%d<>(SB), Z31, Z31", j%4)
		for t := 0; t < T; t++ {
			e.in("VPDPWSSD.BCST %d(DI), Z31, Z%d", t*xbK+xbKBs+4*j, 8+t)
		}
	}
	for t := 0; t < T; t++ {
		e.in("VCVTDQ2PS Z%d, Z%d", t, t)
		e.in("VCVTDQ2PS Z%d, Z%d", 8+t, 8+t)
		e.in("VMULPS.BCST %d(DI), Z29, Z31", t*xbK+xbKD) // d·dx
		e.in("VFMADD213PS %d(DX), Z31, Z%d", 64*t, t)    // float32(I)·that + acc, fused
		e.in("VMULPS.BCST %d(DI), Z30, Z31", t*xbK+xbKD) // dmin·dx
		e.in("VFNMADD231PS Z31, Z%d, Z%d", 8+t, t)       // - float32(M)·that, fused
		e.in("VMOVUPS Z%d, %d(DX)", t, 64*t)
	}
}

// kpQ6KBlock: one Q6_K super-block (see genKP). Stack: the scale bytes
// (dword d of a lane: sc[4d..4d+3]) at 64d(SP), d as float32 at 256(SP).
// Z16..Z19 low quant bytes ql of even groups, Z20..Z23 of odd groups,
// Z24..Z27 the high bits qh, Z28/Z29 unpacked quants, Z30 a scale, Z31 a
// temporary.
func kpQ6KBlock(e *emitter, T int) {
	kpTranspose(e, 192, [4]int{8, 9, 10, 11}, kpTmp)
	for d := 0; d < 4; d++ {
		e.in("VMOVDQU32 Z%d, %d(SP)", 8+d, 64*d)
	}
	// d: sixteen f16 into Y31
	kpQ6D(e, 31, 30)
	e.in("VMOVUPS Z31, 256(SP)")
	for t := 0; t < T; t++ {
		e.in("VPXORD Z%d, Z%d, Z%d", t, t, t)
	}
	for n := 0; n < 2; n++ { // values 128n..128n+127
		for h := 0; h < 2; h++ { // values 16h..16h+15 of each group of 32
			kpTranspose(e, 64*n+16*h, [4]int{16, 17, 18, 19}, kpTmp)
			kpTranspose(e, 64*n+32+16*h, [4]int{20, 21, 22, 23}, kpTmp)
			kpTranspose(e, 128+32*n+16*h, [4]int{24, 25, 26, 27}, kpTmp)
			for i := 0; i < 4; i++ { // group 4n+i: values 128n+32i..
				k := 8*n + 2*i + h // the scale of these 16 values
				e.in("VMOVDQU32 %d(SP), Z30", 64*(k/4))
				if k%4 != 3 {
					e.in("VPSLLD $%d, Z30, Z30", 24-8*(k%4))
				}
				e.in("VPSRAD $24, Z30, Z30")
				kpZero(e, T)
				src := 16 + 4*(i%2)
				for g := 0; g < 4; g++ {
					w := 28 + g%2
					if i < 2 {
						e.in("VPANDD.BCST kp0F<>(SB), Z%d, Z%d", src+g, w)
					} else {
						e.in("VPSRLW $4, Z%d, Z%d", src+g, w)
						e.in("VPANDD.BCST kp0F<>(SB), Z%d, Z%d", w, w)
					}
					hb := kpQ6High(e, i, g)
					e.in("VPTERNLOGD.BCST $0xF8, kp30<>(SB), Z%d, Z%d", hb, w) // w |= hb & 0x30
					for t := 0; t < T; t++ {
						e.in("VPDPBUSD.BCST %d(DI), Z%d, Z%d", t*xbK+128*n+32*i+16*h+4*g, w, 8+t)
					}
				}
				for t := 0; t < T; t++ {
					e.in("VPMULLD Z30, Z%d, Z%d", 8+t, 8+t)
					e.in("VPADDD Z%d, Z%d, Z%d", 8+t, t, t)
				}
			}
		}
	}
	// M = Σ_k sc_k·bs[k], pairs 2p, 2p+1
	kpZero(e, T)
	for p := 0; p < 8; p++ {
		e.in("VMOVDQU32 %d(SP), Z30", 64*(p/2))
		e.in("VPSHUFB kp6p%d<>(SB), Z30, Z30", p%2)
		e.in("VPSRAW $8, Z30, Z30")
		for t := 0; t < T; t++ {
			e.in("VPDPWSSD.BCST %d(DI), Z30, Z%d", t*xbK+xbKBs+4*p, 8+t)
		}
	}
	e.in("VMOVUPS 256(SP), Z31")
	for t := 0; t < T; t++ {
		e.in("VPSLLD $5, Z%d, Z%d", 8+t, 8+t)
		e.in("VPSUBD Z%d, Z%d, Z%d", 8+t, t, t) // I - 32·M
		e.in("VCVTDQ2PS Z%d, Z%d", t, t)
		e.in("VMULPS.BCST %d(DI), Z31, Z30", t*xbK+xbKD) // d·dx
		e.in("VFMADD213PS %d(DX), Z30, Z%d", 64*t, t)    // float32(I - 32·M)·that + acc, fused
		e.in("VMOVUPS Z%d, %d(DX)", t, 64*t)
	}
}

// kuQ is the offset of quant vector g of group k in an unpacked block.
func kuQ(k, g int) int { return kuK*k + 64*g }

// genKPUnpack emits kpuQ6_K (see above): quants ql | qh<<4 (0..63).
func genKPUnpack(e *emitter) {
	const bb = 210
	e.text("kpuQ6_K", "(w unsafe.Pointer, ldw int, nb int, u unsafe.Pointer, bs int)", 40)
	e.in("MOVQ w+0(FP), SI")
	e.in("MOVQ bs+32(FP), R13")
	e.in("MOVQ ldw+8(FP), BX")
	e.in("MOVQ nb+16(FP), CX")
	e.in("MOVQ u+24(FP), DI")
	e.in("LEAQ (BX)(BX*2), R8")
	e.in("LEAQ (SI)(BX*4), R9")
	e.in("LEAQ (R9)(BX*4), R11")
	e.in("LEAQ (R11)(BX*4), R12")
	e.in("VPBROADCASTD kp0F<>(SB), Z28")
	e.in("VPBROADCASTD kp30<>(SB), Z29")
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	e.label("loop")
	kpuQ6K(e)
	for _, r := range []string{"SI", "R9", "R11", "R12"} {
		e.in("ADDQ R13, %s", r)
	}
	e.in("ADDQ $%d, DI", kuBytes)
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}

// kpuQ6K unpacks one Q6_K super-block. Z28 holds 0x0F bytes, Z29 0x30.
func kpuQ6K(e *emitter) {
	kpTranspose(e, 192, [4]int{8, 9, 10, 11}, kpTmp) // lane dword d: sc[4d..4d+3]
	for k := 0; k < 16; k++ {
		v := 8 + k/4
		if k%4 != 3 {
			e.in("VPSLLD $%d, Z%d, Z16", 24-8*(k%4), v)
			v = 16
		}
		e.in("VPSRAD $24, Z%d, Z16", v)
		e.in("VMOVDQU32 Z16, %d(DI)", kuK*k+kuScale)
	}
	for p := 0; p < 8; p++ {
		e.in("VPSHUFB kp6p%d<>(SB), Z%d, Z16", p%2, 8+p/2)
		e.in("VPSRAW $8, Z16, Z16")
		e.in("VPSLLW $5, Z16, Z16") // 32·sc
		e.in("VMOVDQU32 Z16, %d(DI)", kuM+64*p)
	}
	// d: sixteen f16
	kpQ6D(e, 16, 17)
	e.in("VMOVUPS Z16, %d(DI)", kuD)
	for n := 0; n < 2; n++ { // values 128n..128n+127
		for h := 0; h < 2; h++ { // values 16h..16h+15 of each group of 32
			kpTranspose(e, 64*n+16*h, [4]int{16, 17, 18, 19}, kpTmp)     // ql, even groups
			kpTranspose(e, 64*n+32+16*h, [4]int{20, 21, 22, 23}, kpTmp)  // ql, odd groups
			kpTranspose(e, 128+32*n+16*h, [4]int{24, 25, 26, 27}, kpTmp) // qh
			for i := 0; i < 4; i++ {                                     // group 4n+i: values 128n+32i..
				src := 16 + 4*(i%2)
				for g := 0; g < 4; g++ {
					if i < 2 {
						e.in("VPANDD Z28, Z%d, Z30", src+g)
					} else {
						e.in("VPSRLW $4, Z%d, Z30", src+g)
						e.in("VPANDD Z28, Z30, Z30")
					}
					hb := kpQ6High(e, i, g)
					e.in("VPTERNLOGD $0xF8, Z29, Z%d, Z30", hb) // Z30 |= hb & 0x30
					e.in("VMOVDQU32 Z30, %d(DI)", kuQ(8*n+2*i+h, g))
				}
			}
		}
	}
}

// genKPCompute emits kpcQ6_Kt<T> (see above). Registers: Z0..Z15 the
// integer sums I of tokens 0..15, Z16..Z23 the sums P of sixteen values
// (then M) of a wave of up to eight tokens, Z24..Z27 a group's quant
// vectors, Z28 its scales (then a pair vector), Z29 d, Z30 a temporary.
//
// Per super-block and group of sixteen values, P = Σ q·qx, I += sc·P
// (VPMULLD, VPADDD); M = Σ_k 32·sc_k·bs[k] by VPDPWSSD on pairs; then
// acc = fma(float32(I - M), d·dx, acc).
func genKPCompute(e *emitter, T int) {
	e.text(fmt.Sprintf("kpcQ6_Kt%d", T), "(u unsafe.Pointer, x unsafe.Pointer, xs int, nb int, acc *float32, load int)", 48)
	e.in("MOVQ u+0(FP), SI")
	e.in("MOVQ x+8(FP), DI")
	e.in("MOVQ xs+16(FP), R10")
	e.in("MOVQ nb+24(FP), CX")
	e.in("MOVQ acc+32(FP), DX")
	e.in("MOVQ load+40(FP), AX")
	accPrologue(e, "Z", T, true, 64)
	e.in("TESTQ CX, CX")
	e.in("JZ done")
	var waves [][]int // tokens in waves of up to eight
	for t0 := 0; t0 < T; t0 += 8 {
		var w []int
		for t := t0; t < min(T, t0+8); t++ {
			w = append(w, t)
		}
		waves = append(waves, w)
	}
	P := func(t int) int { return 16 + t%8 }
	zeroP := func(w []int) {
		for _, t := range w {
			e.in("VPXORD Z%d, Z%d, Z%d", P(t), P(t), P(t))
		}
	}
	e.label("loop")
	for t := 0; t < T; t++ {
		e.in("VPXORD Z%d, Z%d, Z%d", t, t, t)
	}
	// groups k = 0..15: R9 at group k of the block, R11 at x + 16k
	e.in("MOVQ SI, R9")
	e.in("MOVQ DI, R11")
	e.in("MOVQ $16, R12")
	e.label("group")
	for g := 0; g < 4; g++ {
		e.in("VMOVDQU32 %d(R9), Z%d", 64*g, 24+g)
	}
	e.in("VMOVDQU32 %d(R9), Z28", kuScale)
	for _, w := range waves {
		zeroP(w)
		for g := 0; g < 4; g++ {
			for _, t := range w {
				e.in("VPDPBUSD.BCST %d(R11), Z%d, Z%d", t*xbK+4*g, 24+g, P(t))
			}
		}
		for _, t := range w {
			e.in("VPMULLD Z28, Z%d, Z%d", P(t), P(t)) // I += sc·P
			e.in("VPADDD Z%d, Z%d, Z%d", P(t), t, t)
		}
	}
	e.in("ADDQ $%d, R9", kuK)
	e.in("ADDQ $16, R11")
	e.in("DECQ R12")
	e.in("JNZ group")
	e.in("VMOVUPS %d(SI), Z29", kuD)
	for _, w := range waves {
		zeroP(w)
		for p := 0; p < 8; p++ {
			e.in("VMOVDQU32 %d(SI), Z28", kuM+64*p)
			for _, t := range w {
				e.in("VPDPWSSD.BCST %d(DI), Z28, Z%d", t*xbK+xbKBs+4*p, P(t))
			}
		}
		for _, t := range w {
			e.in("VPSUBD Z%d, Z%d, Z%d", P(t), t, t) // I - 32·M
			e.in("VCVTDQ2PS Z%d, Z%d", t, t)
			e.in("VMULPS.BCST %d(DI), Z29, Z30", t*xbK+xbKD) // d·dx
			e.in("VFMADD213PS %d(DX), Z30, Z%d", 64*t, t)    // float32(I - 32·M)·that + acc, fused
			e.in("VMOVUPS Z%d, %d(DX)", t, 64*t)
		}
	}
	e.in("ADDQ $%d, SI", kuBytes)
	e.in("ADDQ R10, DI")
	e.in("DECQ CX")
	e.in("JNZ loop")
	e.label("done")
	e.in("VZEROUPPER")
	e.in("RET")
}

// kpQ6High moves the Q6_K high bits 2i, 2i+1 of group g (in Z(24+g)) to
// bits 4 and 5, into Z31 where a shift is needed, and returns the
// register that holds them.
func kpQ6High(e *emitter, i, g int) int {
	hb := 24 + g
	switch i {
	case 0:
		e.in("VPSLLW $4, Z%d, Z31", hb)
		hb = 31
	case 1:
		e.in("VPSLLW $2, Z%d, Z31", hb)
		hb = 31
	case 3:
		e.in("VPSRLW $2, Z%d, Z31", hb)
		hb = 31
	}
	return hb
}

// kpQ6D loads the sixteen rows' Q6_K super-block scales d (f16 at byte
// 208) as float32 into Z(a), with X(b) a temporary (AX clobbered).
func kpQ6D(e *emitter, a, b int) {
	e.in("MOVWLZX %s, AX", kpRow(0, 208))
	e.in("VMOVD AX, X%d", a)
	e.in("MOVWLZX %s, AX", kpRow(8, 208))
	e.in("VMOVD AX, X%d", b)
	for i := 1; i < 8; i++ {
		e.in("VPINSRW $%d, %s, X%d, X%d", i, kpRow(i, 208), a, a)
		e.in("VPINSRW $%d, %s, X%d, X%d", i, kpRow(8+i, 208), b, b)
	}
	e.in("VINSERTI32X4 $1, X%d, Y%d, Y%d", b, a, a)
	e.in("VCVTPH2PS Y%d, Z%d", a, a)
}
