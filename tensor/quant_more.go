package tensor

import (
	"encoding/binary"
	"math"
)

// This file holds the scalar conversions of the block formats beyond
// quant.go's: Q4_1, Q5_0, Q5_1, IQ4_NL (blocks of 32) and Q2_K, Q3_K, Q5_K,
// IQ4_XS (super-blocks of 256), byte for byte ggml's block structs (all
// multi-byte fields little-endian), dequantized with ggml's
// dequantize_row_* arithmetic (each product and sum rounded to float32, in
// ggml's order: bit for bit its results, TestDequantizeMatchesLlamaCpp):
//
//	block_q4_1 (20 B / 32): f16 d; f16 m; uint8 qs[16]        x = d*q + m, q in 0..15
//	block_q5_0 (22 B / 32): f16 d; uint8 qh[4]; uint8 qs[16]   x = d*(q-16)
//	block_q5_1 (24 B / 32): f16 d; f16 m; uint8 qh[4]; uint8 qs[16]   x = d*q + m
//	    value j (j<16) is the low nibble of qs[j], value j+16 its high
//	    nibble; the fifth bit of value j is bit j of the 32-bit qh.
//	block_iq4_nl (18 B / 32): f16 d; uint8 qs[16]    x = d*kvaluesIQ4[nibble]
//	block_q2_K (84 B / 256): uint8 scales[16]; uint8 qs[64]; f16 d; f16 dmin.
//	    Sixteen sub-blocks of 16, each a 4-bit scale (low nibble) and 4-bit
//	    min (high nibble): x = d*sc*q - dmin*m, q in 0..3.
//	block_q3_K (110 B / 256): uint8 hmask[32]; uint8 qs[64]; uint8 scales[12];
//	    f16 d. Sixteen 6-bit scales s (see scalesQ3K): x = d*(s-32)*(q-4),
//	    q in 0..7 made of two bits of qs and one of hmask.
//	block_q5_K (176 B / 256): f16 d; f16 dmin; uint8 scales[12]; uint8 qh[32];
//	    uint8 qs[128]. Q4_K's layout with a fifth bit per value in qh:
//	    x = d*sc*q - dmin*m, q in 0..31.
//	block_iq4_xs (136 B / 256): f16 d; uint16 scales_h; uint8 scales_l[4];
//	    uint8 qs[128]. Eight sub-blocks of 32 with 6-bit scales ls (four
//	    bits in scales_l, two in scales_h): x = d*(ls-32)*kvaluesIQ4[nibble].
//
// In the 2- and 3-bit K-quants, value 32g+e of a super-block (group g =
// 4n+s of 32 values: half n, shift s; e in 0..31) has its two low bits at
// bits 2s of qs[32n+e] and (Q3_K) its high bit at bit g of hmask[e]; its
// sub-block of 16 is 2g + e/16.

// kvaluesIQ4 are IQ4_NL's and IQ4_XS's sixteen levels (ggml's kvalues_iq4nl).
var kvaluesIQ4 = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// moreDequant dequantizes the types of this file (false: not one of them).
func moreDequant(t DType, src []byte, dst []float32) bool {
	bb, bs := t.BlockBytes(), t.BlockSize()
	var f func(b []byte, y []float32)
	switch t {
	case Q4_1:
		f = dequantQ4_1
	case Q5_0:
		f = dequantQ5_0
	case Q5_1:
		f = dequantQ5_1
	case IQ4_NL:
		f = dequantIQ4_NL
	case Q2_K:
		f = dequantQ2_K
	case Q3_K:
		f = dequantQ3_K
	case Q5_K:
		f = dequantQ5_K
	case IQ4_XS:
		f = dequantIQ4_XS
	default:
		return false
	}
	for i := 0; i < len(dst)/bs; i++ {
		f(src[bb*i:bb*(i+1)], dst[bs*i:bs*(i+1)])
	}
	return true
}

func dequantQ4_1(b []byte, y []float32) {
	d, m := F16ToF32(le16(b[0:])), F16ToF32(le16(b[2:]))
	for j := 0; j < 16; j++ {
		q := b[4+j]
		y[j] = float32(float32(q&0x0f)*d) + m
		y[j+16] = float32(float32(q>>4)*d) + m
	}
}

// q5Bits returns the 32 values 0..31 of a Q5_0/Q5_1 block from its qh
// and qs.
func q5Bits(qh uint32, qs []byte) (q [32]int32) {
	for j := 0; j < 16; j++ {
		q[j] = int32(qs[j]&0x0f) | int32(qh>>j&1)<<4
		q[j+16] = int32(qs[j]>>4) | int32(qh>>(j+16)&1)<<4
	}
	return q
}

func dequantQ5_0(b []byte, y []float32) {
	d := F16ToF32(le16(b[0:]))
	q := q5Bits(binary.LittleEndian.Uint32(b[2:]), b[6:22])
	for j := range q {
		y[j] = float32(q[j]-16) * d
	}
}

func dequantQ5_1(b []byte, y []float32) {
	d, m := F16ToF32(le16(b[0:])), F16ToF32(le16(b[2:]))
	q := q5Bits(binary.LittleEndian.Uint32(b[4:]), b[8:24])
	for j := range q {
		y[j] = float32(float32(q[j])*d) + m
	}
}

func dequantIQ4_NL(b []byte, y []float32) {
	d := F16ToF32(le16(b[0:]))
	for j := 0; j < 16; j++ {
		y[j] = d * float32(kvaluesIQ4[b[2+j]&0x0f])
		y[j+16] = d * float32(kvaluesIQ4[b[2+j]>>4])
	}
}

// q2Low returns the two low bits of value i of a Q2_K or Q3_K
// super-block from its qs[64].
func q2Low(qs []byte, i int) int32 {
	g, e := i/32, i%32
	return int32(qs[32*(g/4)+e] >> (2 * (g % 4)) & 3)
}

func dequantQ2_K(b []byte, y []float32) {
	d, dmin := F16ToF32(le16(b[80:])), F16ToF32(le16(b[82:]))
	qs := b[16:80]
	for k := 0; k < 16; k++ {
		sc := b[k]
		dl := d * float32(sc&0x0f)
		ml := dmin * float32(sc>>4)
		for i := 16 * k; i < 16*k+16; i++ {
			y[i] = float32(dl*float32(q2Low(qs, i))) - ml
		}
	}
}

// scalesQ3K unpacks the sixteen 6-bit scales of a Q3_K block (0..63,
// stored with an offset of 32) from its 12 bytes: scale k's low four bits
// are the low nibble of byte k (k < 8) or the high nibble of byte k-8,
// its high two bits bits 2(k/4) of byte 8 + k%4.
func scalesQ3K(s []byte) (sc [16]int32) {
	for k := 0; k < 16; k++ {
		lo := s[k%8] & 0x0f
		if k >= 8 {
			lo = s[k-8] >> 4
		}
		hi := s[8+k%4] >> (2 * (k / 4)) & 3
		sc[k] = int32(lo | hi<<4)
	}
	return sc
}

// q3Value returns value i of a Q3_K super-block as q-4 in -4..3.
func q3Value(b []byte, i int) int32 {
	g, e := i/32, i%32
	h := int32(b[e]>>g&1) << 2
	return (q2Low(b[32:96], i) | h) - 4
}

func dequantQ3_K(b []byte, y []float32) {
	d := F16ToF32(le16(b[108:]))
	sc := scalesQ3K(b[96:108])
	for k := 0; k < 16; k++ {
		dl := d * float32(sc[k]-32)
		for i := 16 * k; i < 16*k+16; i++ {
			y[i] = dl * float32(q3Value(b, i))
		}
	}
}

// q5KValue returns value i (0..31) of a Q5_K super-block: sub-block
// j = i/32's nibble (as Q4_K) and bit j of qh[i%32].
func q5KValue(b []byte, i int) int32 {
	j, e := i/32, i%32
	q := b[48+32*(j/2)+e] >> (4 * (j % 2)) & 0x0f
	return int32(q) | int32(b[16+e]>>j&1)<<4
}

func dequantQ5_K(b []byte, y []float32) {
	d, dmin := F16ToF32(le16(b[0:])), F16ToF32(le16(b[2:]))
	scales := (*[12]byte)(b[4:16])
	for j := 0; j < 8; j++ {
		sc, m := scaleMinK4(j, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		for i := 32 * j; i < 32*j+32; i++ {
			y[i] = float32(d1*float32(q5KValue(b, i))) - m1
		}
	}
}

// scaleIQ4XS returns sub-block ib's 6-bit scale (0..63, offset 32) of an
// IQ4_XS block.
func scaleIQ4XS(b []byte, ib int) int32 {
	lo := b[4+ib/2] >> (4 * (ib % 2)) & 0x0f
	hi := le16(b[2:]) >> (2 * ib) & 3
	return int32(lo) | int32(hi)<<4
}

func dequantIQ4_XS(b []byte, y []float32) {
	d := F16ToF32(le16(b[0:]))
	for ib := 0; ib < 8; ib++ {
		dl := d * float32(scaleIQ4XS(b, ib)-32)
		qs := b[8+16*ib:]
		for j := 0; j < 16; j++ {
			y[32*ib+j] = dl * float32(kvaluesIQ4[qs[j]&0x0f])
			y[32*ib+16+j] = dl * float32(kvaluesIQ4[qs[j]>>4])
		}
	}
}

// moreQuantize quantizes the types of this file (false: not one of them).
func moreQuantize(t DType, src []float32, dst []byte) bool {
	bb, bs := t.BlockBytes(), t.BlockSize()
	var f func(x []float32, b []byte)
	switch t {
	case Q4_1:
		f = quantQ4_1
	case Q5_0:
		f = quantQ5_0
	case Q5_1:
		f = quantQ5_1
	case IQ4_NL:
		f = func(x []float32, b []byte) { quantIQ4(x, b, 32) }
	case Q2_K:
		f = quantQ2_K
	case Q3_K:
		f = quantQ3_K
	case Q5_K:
		f = quantQ5_K
	case IQ4_XS:
		f = func(x []float32, b []byte) { quantIQ4(x, b, QK_K) }
	default:
		return false
	}
	for i := 0; i < len(src)/bs; i++ {
		b := dst[bb*i : bb*(i+1)]
		clear(b)
		f(src[bs*i:bs*(i+1)], b)
	}
	return true
}

// truncU8 is C's (uint8_t)/(int8_t) conversion of a non-negative float
// below 256 (truncation); NaN and negatives give 0.
func truncU8(f float32) int {
	if !(f >= 0) {
		return 0
	}
	return int(min(f, 255))
}

// minMax returns the smallest and largest of x.
func minMax(x []float32) (lo, hi float32) {
	lo, hi = float32(math.MaxFloat32), -float32(math.MaxFloat32)
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// quantQ4_1 is quantize_row_q4_1_ref: d = (max-min)/15, m = min,
// q = min(15, trunc((x-min)/d + 0.5)).
func quantQ4_1(x []float32, b []byte) {
	lo, hi := minMax(x)
	d := (hi - lo) / 15
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(b[0:], F32ToF16(d))
	binary.LittleEndian.PutUint16(b[2:], F32ToF16(lo))
	for j := 0; j < 16; j++ {
		q0 := min(15, truncU8(float32((x[j]-lo)*id)+0.5))
		q1 := min(15, truncU8(float32((x[j+16]-lo)*id)+0.5))
		b[4+j] = byte(q0 | q1<<4)
	}
}

// putQ5 stores 32 values 0..31 as a Q5_0/Q5_1 block's qh and qs.
func putQ5(q *[32]int, qh, qs []byte) {
	var h uint32
	for j := 0; j < 16; j++ {
		qs[j] = byte(q[j]&0x0f | (q[j+16]&0x0f)<<4)
		h |= uint32(q[j]>>4&1)<<j | uint32(q[j+16]>>4&1)<<(j+16)
	}
	binary.LittleEndian.PutUint32(qh, h)
}

// quantQ5_0 is quantize_row_q5_0_ref: the value of largest magnitude maps
// to -16, d = max/-16, q = min(31, trunc(x/d + 16.5)).
func quantQ5_0(x []float32, b []byte) {
	var amax, mx float32
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	d := mx / -16
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(b[0:], F32ToF16(d))
	var q [32]int
	for j, v := range x[:32] {
		q[j] = min(31, truncU8(float32(v*id)+16.5))
	}
	putQ5(&q, b[2:6], b[6:22])
}

// quantQ5_1 is quantize_row_q5_1_ref: d = (max-min)/31, m = min,
// q = trunc((x-min)/d + 0.5).
func quantQ5_1(x []float32, b []byte) {
	lo, hi := minMax(x)
	d := (hi - lo) / 31
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(b[0:], F32ToF16(d))
	binary.LittleEndian.PutUint16(b[2:], F32ToF16(lo))
	var q [32]int
	for j, v := range x[:32] {
		q[j] = min(31, truncU8(float32((v-lo)*id)+0.5))
	}
	putQ5(&q, b[4:8], b[8:24])
}

// bestIndexIQ4 is ggml's best_index_int8 over kvaluesIQ4: the index of
// the level nearest x (the upper one on a tie).
func bestIndexIQ4(x float32) int {
	v := &kvaluesIQ4
	if x <= float32(v[0]) {
		return 0
	}
	if x >= float32(v[15]) {
		return 15
	}
	lo, hi := 0, 15
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if x < float32(v[mid]) {
			hi = mid
		} else {
			lo = mid
		}
	}
	if x-float32(v[hi-1]) < float32(v[hi])-x {
		return hi - 1
	}
	return hi
}

// fitIQ4 is the scale search of ggml's quantize_row_iq4_nl_impl for one
// block of 32 without an importance matrix (weights x², ntry 7): start
// from d = -max/-127, then try the inverse scales (k-127)/max for
// k = -7..7, each refitted by weighted least squares, keeping the best.
func fitIQ4(x []float32) float32 {
	var amax, mx float32
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	if amax < 1e-15 { // GROUP_MAX_EPS
		return 0
	}
	v0 := float32(kvaluesIQ4[0])
	fit := func(id float32) (sumqx, sumq2 float32) {
		for _, v := range x {
			q := float32(kvaluesIQ4[bestIndexIQ4(id*v)])
			w := v * v
			sumqx += float32(w*q) * v
			sumq2 += float32(w*q) * q
		}
		return sumqx, sumq2
	}
	d := -mx / v0
	sumqx, sumq2 := fit(1 / d)
	d = 0
	if sumq2 > 0 {
		d = sumqx / sumq2
	}
	best := d * sumqx
	for k := -7; k <= 7; k++ {
		sumqx, sumq2 := fit((float32(k) + v0) / mx)
		if sumq2 > 0 && sumqx*sumqx > best*sumq2 {
			d = sumqx / sumq2
			best = d * sumqx
		}
	}
	return d
}

// quantIQ4 is ggml's quantize_row_iq4_nl_impl without an importance
// matrix for one block of n values: IQ4_NL (n = 32: the block's fitted
// scale stored as is) or IQ4_XS (n = 256: eight fitted scales quantized
// to 6 bits against d = -max/32, max the scale of largest magnitude).
// Each value then takes the level nearest x/scale.
func quantIQ4(x []float32, b []byte, n int) {
	var L [QK_K]uint8
	if n == 32 {
		d := fitIQ4(x)
		binary.LittleEndian.PutUint16(b[0:], F32ToF16(d))
		var id float32
		if d != 0 {
			id = 1 / d
		}
		for j := 0; j < 32; j++ {
			L[j] = uint8(bestIndexIQ4(id * x[j]))
		}
		for j := 0; j < 16; j++ {
			b[2+j] = L[j] | L[j+16]<<4
		}
		return
	}
	var scales [8]float32
	var maxScale, amaxScale float32
	for ib := 0; ib < 8; ib++ {
		scales[ib] = fitIQ4(x[32*ib : 32*ib+32])
		if a := abs32(scales[ib]); a > amaxScale {
			amaxScale, maxScale = a, scales[ib]
		}
	}
	d := -maxScale / 32
	binary.LittleEndian.PutUint16(b[0:], F32ToF16(d))
	var id float32
	if d != 0 {
		id = 1 / d
	}
	var sh uint16
	for ib := 0; ib < 8; ib++ {
		l := clampInt(nearestInt(id*scales[ib]), -32, 31)
		dl := d * float32(l)
		var idl float32
		if dl != 0 {
			idl = 1 / dl
		}
		for j := 32 * ib; j < 32*ib+32; j++ {
			L[j] = uint8(bestIndexIQ4(idl * x[j]))
		}
		l += 32
		b[4+ib/2] |= byte(l&0x0f) << (4 * (ib % 2))
		sh |= uint16(l>>4) << (2 * ib)
	}
	binary.LittleEndian.PutUint16(b[2:], sh)
	for i := 0; i < 8; i++ {
		for j := 0; j < 16; j++ {
			b[8+16*i+j] = L[32*i+j] | L[32*i+16+j]<<4
		}
	}
}

// fitScaleMins fits each sub-block of sub values of x with fitScaleMin
// (levels 0..nmax) and returns the scales, mins and their maxima.
func fitScaleMins(x []float32, sub, nmax int) (scales, mins []float32, maxScale, maxMin float32) {
	n := len(x) / sub
	scales, mins = make([]float32, n), make([]float32, n)
	for j := 0; j < n; j++ {
		scales[j], mins[j] = fitScaleMin(x[sub*j:sub*j+sub], nmax)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	return scales, mins, maxScale, maxMin
}

// levelsScaleMin rounds x to levels 0..nmax for x ≈ dd*l - dm (all 0 when
// dd is 0).
func levelsScaleMin(x []float32, L []uint8, dd, dm float32, nmax int) {
	for i, v := range x {
		L[i] = 0
		if dd != 0 {
			L[i] = uint8(clampInt(nearestInt((v+dm)/dd), 0, nmax))
		}
	}
}

// quantQ5_K quantizes one super-block as quantize_row_q5_K_ref does:
// per 32-value sub-block a scale and min (fitScaleMin, levels 0..31; ggml
// uses make_qkx2_quants), the eight scales and mins quantized to 6 bits
// against d = max(scale)/63 and dmin = max(min)/63 (packed as Q4_K's), and
// every value rounded to its level with the stored scale and min.
func quantQ5_K(x []float32, b []byte) {
	scales, mins, maxScale, maxMin := fitScaleMins(x, 32, 31)
	sc, d, dmin := packScalesMinsK4(b, scales, mins, maxScale, maxMin)
	var L [QK_K]uint8
	for j := 0; j < 8; j++ {
		s, m := scaleMinK4(j, sc)
		levelsScaleMin(x[32*j:32*j+32], L[32*j:], d*float32(s), dmin*float32(m), 31)
	}
	qh, qs := b[16:48], b[48:176]
	for i, l := range L {
		j, e := i/32, i%32
		qs[32*(j/2)+e] |= (l & 0x0f) << (4 * (j % 2))
		qh[e] |= (l >> 4) << j
	}
}

// putQ2Low stores the two low bits of the 256 values L into qs[64] (the
// inverse of q2Low).
func putQ2Low(L *[QK_K]uint8, qs []byte) {
	for i, l := range L {
		g, e := i/32, i%32
		qs[32*(g/4)+e] |= (l & 3) << (2 * (g % 4))
	}
}

// quantQ2_K quantizes one super-block as quantize_row_q2_K_ref does: per
// 16-value sub-block a scale and min (fitScaleMin, levels 0..3; ggml uses
// make_qkx2_quants), quantized to 4 bits against d = max(scale)/15 and
// dmin = max(min)/15, then every value rounded with the stored ones.
func quantQ2_K(x []float32, b []byte) {
	scales, mins, maxScale, maxMin := fitScaleMins(x, 16, 3)
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 15 / maxScale
	}
	if maxMin > 0 {
		invMin = 15 / maxMin
	}
	for k := 0; k < 16; k++ {
		ls := clampInt(nearestInt(invScale*scales[k]), 0, 15)
		lm := clampInt(nearestInt(invMin*mins[k]), 0, 15)
		b[k] = byte(ls | lm<<4)
	}
	dh, dminh := F32ToF16(maxScale/15), F32ToF16(maxMin/15)
	binary.LittleEndian.PutUint16(b[80:], dh)
	binary.LittleEndian.PutUint16(b[82:], dminh)
	d, dmin := F16ToF32(dh), F16ToF32(dminh)
	var L [QK_K]uint8
	for k := 0; k < 16; k++ {
		levelsScaleMin(x[16*k:16*k+16], L[16*k:], d*float32(b[k]&0x0f), dmin*float32(b[k]>>4), 3)
	}
	putQ2Low(&L, b[16:80])
}

// quantQ3_K quantizes one super-block as quantize_row_q3_K_ref does: per
// 16-value sub-block a signed scale (fitScaleSym, levels -4..3; ggml uses
// make_q3_quants), the sixteen scales quantized to -32..31 against
// d = -max/32 (max the scale of largest magnitude) and stored with an
// offset of 32, then every value rounded to -4..3 with its stored scale
// and stored as q+4.
func quantQ3_K(x []float32, b []byte) {
	var scales [16]float32
	var maxScale, amax float32
	for k := 0; k < 16; k++ {
		scales[k] = fitScaleSym(x[16*k:16*k+16], 4)
		if a := abs32(scales[k]); a > amax {
			amax, maxScale = a, scales[k]
		}
	}
	if amax == 0 {
		return // all zero: d = 0 (scales of 0 are stored as 32 below)
	}
	iscale := -32 / maxScale
	var ls [16]int
	for k := range ls {
		ls[k] = clampInt(nearestInt(iscale*scales[k]), -32, 31) + 32
		lo := byte(ls[k] & 0x0f)
		if k < 8 {
			b[96+k] |= lo
		} else {
			b[96+k-8] |= lo << 4
		}
		b[96+8+k%4] |= byte(ls[k]>>4) << (2 * (k / 4))
	}
	dh := F32ToF16(1 / iscale)
	binary.LittleEndian.PutUint16(b[108:], dh)
	d := F16ToF32(dh)
	var L [QK_K]uint8
	for k := 0; k < 16; k++ {
		dd := d * float32(ls[k]-32)
		for i := 16 * k; i < 16*k+16; i++ {
			l := 0
			if dd != 0 {
				l = clampInt(nearestInt(x[i]/dd), -4, 3)
			}
			L[i] = uint8(l + 4)
		}
	}
	putQ2Low(&L, b[32:96])
	for i, l := range L {
		b[i%32] |= (l >> 2) << (i / 32)
	}
}
