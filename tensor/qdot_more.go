package tensor

import "encoding/binary"

// The integer block products of quant_more.go's types, in qdot.go's
// scheme (eight float32 lanes per row and token; lane l covers values
// 4l..4l+3 of each 32 values). They are the twins of asmgen's AVX2 and
// AVX-512 VNNI kernels, which must give these sums bit for bit: Q5_K
// (genQ4K, Q4_K's with the fifth bit), Q3_K and Q2_K (q3k.go, q2k.go),
// Q4_1, Q5_0, Q5_1 and IQ4_NL (q32more.go), IQ4_XS (genIQ4XS, AVX2 only).
//
//	Q5_0, IQ4_NL (blocks of 32; q in -16..15, or IQ4's levels):
//	  P = Σ q·qx;  acc[l] = fma(float32(P)·dx[l], dw, acc[l])   (as Q4_0)
//	Q4_1, Q5_1 (x = d·q + m, q in 0..15 / 0..31; S = Σ qx):
//	  acc[l] = fma(float32(S)·dx[l], m, fma(float32(P)·dx[l], d, acc[l]))
//	Q5_K (as Q4_K with q in 0..31):
//	  I = Σ_j sc_j · Σ_e q·qx;  M = m_l·(bs[2l] + bs[2l+1])
//	  acc[l] += float32(I)·(d·dx) - float32(M)·(dmin·dx)
//	Q2_K (group g of 32 values holds sub-blocks 2g, 2g+1 of 16):
//	  I = Σ_g sc[2g + l/4] · Σ_e q·qx;  M = m[2l]·bs[2l] + m[2l+1]·bs[2l+1]
//	  acc[l] += float32(I)·(d·dx) - float32(M)·(dmin·dx)
//	Q3_K (q3 = q+4 in 0..7, s = scale-32):
//	  I = Σ_g s[2g + l/4] · Σ_e q3·qx;  M = s[2l]·bs[2l] + s[2l+1]·bs[2l+1]
//	  acc[l] += float32(I - 4·M)·(d·dx)
//	IQ4_XS (sub-block j of 32, s_j = scale-32, levels kvaluesIQ4):
//	  I = Σ_j s_j · Σ_e kv[q]·qx;  acc[l] += float32(I)·(d·dx)

// moreDot is the per-block product of a type of quant_more.go (nil: none).
func moreDot(t DType) func(w, x []byte, acc *[8]float32) {
	switch t {
	case Q4_1:
		return dotQ4_1
	case Q5_0:
		return dotQ5_0
	case Q5_1:
		return dotQ5_1
	case IQ4_NL:
		return dotIQ4_NL
	case Q2_K:
		return dotQ2_K
	case Q3_K:
		return dotQ3_K
	case Q5_K:
		return dotQ5_K
	case IQ4_XS:
		return dotIQ4_XS
	}
	return nil
}

// moreKTypes are this file's types whose activations are the 256-value
// xbK blocks; the others (Q4_1, Q5_0, Q5_1, IQ4_NL) take xb32 blocks.
func moreKType(t DType) bool { return t == Q2_K || t == Q3_K || t == Q5_K || t == IQ4_XS }

// dot32 is the lane loop of the 32-value types: q holds the block's 32
// signed or unsigned levels.
func dot32(q *[32]int32, x []byte, d, m float32, hasMin bool, acc *[8]float32) {
	for l := 0; l < 8; l++ {
		var p, s int32
		for e := 4 * l; e < 4*l+4; e++ {
			qx := int32(int8(x[e]))
			p += q[e] * qx
			s += qx
		}
		dx := f32at(x[xb32D+4*l:])
		acc[l] = fma32(float32(p)*dx, d, acc[l])
		if hasMin {
			acc[l] = fma32(float32(s)*dx, m, acc[l])
		}
	}
}

func dotQ4_1(w, x []byte, acc *[8]float32) {
	var q [32]int32
	for j := 0; j < 16; j++ {
		q[j], q[j+16] = int32(w[4+j]&0x0f), int32(w[4+j]>>4)
	}
	dot32(&q, x, F16ToF32(le16(w)), F16ToF32(le16(w[2:])), true, acc)
}

func dotQ5_0(w, x []byte, acc *[8]float32) {
	q := q5Bits(binary.LittleEndian.Uint32(w[2:]), w[6:22])
	for j := range q {
		q[j] -= 16
	}
	dot32(&q, x, F16ToF32(le16(w)), 0, false, acc)
}

func dotQ5_1(w, x []byte, acc *[8]float32) {
	q := q5Bits(binary.LittleEndian.Uint32(w[4:]), w[8:24])
	dot32(&q, x, F16ToF32(le16(w)), F16ToF32(le16(w[2:])), true, acc)
}

func dotIQ4_NL(w, x []byte, acc *[8]float32) {
	var q [32]int32
	for j := 0; j < 16; j++ {
		q[j], q[j+16] = int32(kvaluesIQ4[w[2+j]&0x0f]), int32(kvaluesIQ4[w[2+j]>>4])
	}
	dot32(&q, x, F16ToF32(le16(w)), 0, false, acc)
}

// bsumsK returns the two activation sums of lane l (bs[2l], bs[2l+1]).
func bsumsK(x []byte, l int) (int32, int32) {
	return int32(int16(le16(x[xbKBs+4*l:]))), int32(int16(le16(x[xbKBs+4*l+2:])))
}

// lanePartials returns p[g][l] = Σ_{e=4l..4l+3} q[32g+e]·qx[32g+e] for the
// 256 levels q of a super-block.
func lanePartials(q *[QK_K]int8, x []byte) (p [8][8]int32) {
	x = x[:QK_K]
	for g := 0; g < 8; g++ {
		for l := 0; l < 8; l++ {
			i := 32*g + 4*l
			p[g][l] = int32(q[i])*int32(int8(x[i])) + int32(q[i+1])*int32(int8(x[i+1])) +
				int32(q[i+2])*int32(int8(x[i+2])) + int32(q[i+3])*int32(int8(x[i+3]))
		}
	}
	return p
}

func dotQ5_K(w, x []byte, acc *[8]float32) {
	dx := f32at(x[xbKD:])
	a := F16ToF32(le16(w)) * dx
	bm := F16ToF32(le16(w[2:])) * dx
	scales := (*[12]byte)(w[4:16])
	var sc, mn [8]int32
	for j := 0; j < 8; j++ {
		s, m := scaleMinK4(j, scales)
		sc[j], mn[j] = int32(s), int32(m)
	}
	var q [QK_K]int8
	qh, qs := w[16:48], w[48:176]
	for c := 0; c < 4; c++ {
		for e := 0; e < 32; e++ {
			b, h := qs[32*c+e], qh[e]>>(2*c)
			q[64*c+e] = int8(b&0x0f | (h&1)<<4)
			q[64*c+32+e] = int8(b>>4 | (h>>1&1)<<4)
		}
	}
	p := lanePartials(&q, x)
	for l := 0; l < 8; l++ {
		var I int32
		for j := 0; j < 8; j++ {
			I += sc[j] * p[j][l]
		}
		bs0, bs1 := bsumsK(x, l)
		M := mn[l] * (bs0 + bs1)
		acc[l] += float32(float32(float32(I)*a) - float32(float32(M)*bm))
	}
}

// unpackQ2 sets q[i] to the two low bits of value i of a Q2_K or Q3_K
// super-block (q2Low) and, when hm (Q3_K's hmask) is not nil, bit g =
// i/32 of hm[i%32] as its bit 2: Q3_K's q3 = q+4 in 0..7. A group's 32
// values at a time, the bounds checked once per group.
func unpackQ2(qs []byte, hm []byte, q *[QK_K]int8) {
	for g := 0; g < 8; g++ {
		src, sh := (*[32]byte)(qs[32*(g/4):]), 2*(g%4)
		dst := (*[32]int8)(q[32*g:])
		if hm == nil {
			for e := range dst {
				dst[e] = int8(src[e] >> sh & 3)
			}
			continue
		}
		h := (*[32]byte)(hm)
		for e := range dst {
			dst[e] = int8(src[e]>>sh&3 | (h[e]>>g&1)<<2)
		}
	}
}

func dotQ2_K(w, x []byte, acc *[8]float32) {
	dx := f32at(x[xbKD:])
	a := F16ToF32(le16(w[80:])) * dx
	bm := F16ToF32(le16(w[82:])) * dx
	var q [QK_K]int8
	unpackQ2(w[16:80], nil, &q)
	p := lanePartials(&q, x)
	for l := 0; l < 8; l++ {
		var I int32
		for g := 0; g < 8; g++ {
			I += int32(w[2*g+l/4]&0x0f) * p[g][l]
		}
		bs0, bs1 := bsumsK(x, l)
		M := int32(w[2*l]>>4)*bs0 + int32(w[2*l+1]>>4)*bs1
		acc[l] += float32(float32(float32(I)*a) - float32(float32(M)*bm))
	}
}

func dotQ3_K(w, x []byte, acc *[8]float32) {
	s := F16ToF32(le16(w[108:])) * f32at(x[xbKD:])
	sc := scalesQ3K(w[96:108])
	var q [QK_K]int8
	unpackQ2(w[32:96], w[:32], &q)
	p := lanePartials(&q, x)
	for l := 0; l < 8; l++ {
		var I int32
		for g := 0; g < 8; g++ {
			I += (sc[2*g+l/4] - 32) * p[g][l]
		}
		bs0, bs1 := bsumsK(x, l)
		M := (sc[2*l]-32)*bs0 + (sc[2*l+1]-32)*bs1
		acc[l] += float32(float32(I-4*M) * s)
	}
}

func dotIQ4_XS(w, x []byte, acc *[8]float32) {
	s := F16ToF32(le16(w)) * f32at(x[xbKD:])
	var q [QK_K]int8
	for j := 0; j < 8; j++ {
		qs := w[8+16*j:]
		for e := 0; e < 16; e++ {
			q[32*j+e] = kvaluesIQ4[qs[e]&0x0f]
			q[32*j+16+e] = kvaluesIQ4[qs[e]>>4]
		}
	}
	p := lanePartials(&q, x)
	for l := 0; l < 8; l++ {
		var I int32
		for j := 0; j < 8; j++ {
			I += (scaleIQ4XS(w, j) - 32) * p[j][l]
		}
		acc[l] += float32(float32(I) * s)
	}
}
