package tensor

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/x448/float16"
)

// This file holds the scalar (pure Go) conversions between float32 and the
// stored element types: the plain floats F32, F16 and BF16 and the ggml block
// formats Q8_0, Q4_0, Q4_K and Q6_K (the others: quant_more.go). Every layout follows ggml's block
// structs byte for byte (all multi-byte fields little-endian):
//
//	block_q8_0 (34 B / 32 values): f16 d; int8 qs[32]            x = d*q
//	block_q4_0 (18 B / 32 values): f16 d; uint8 qs[16]           x = d*(q-8)
//	    value j (j<16) is the low nibble of qs[j], value j+16 its high nibble
//	block_q4_K (144 B / 256 values): f16 d; f16 dmin; uint8 scales[12];
//	    uint8 qs[128]. Eight sub-blocks of 32, each with a 6-bit scale sc and
//	    6-bit min m (packed, see scaleMinK4): x = d*sc*q - dmin*m, q in 0..15.
//	    Each 64 values use 32 bytes of qs: the first 32 values are the low
//	    nibbles (sub-block 2i), the next 32 the high nibbles (sub-block 2i+1).
//	block_q6_K (210 B / 256 values): uint8 ql[128]; uint8 qh[64];
//	    int8 scales[16]; f16 d. x = d*scales[s]*(q-32), q in 0..63 made of a
//	    nibble of ql and two bits of qh, sixteen sub-blocks of 16 values.

// F16ToF32 converts IEEE half-precision bits to float32 (exact).
func F16ToF32(h uint16) float32 { return float16.Frombits(h).Float32() }

// F32ToF16 converts f to IEEE half-precision bits, rounding to nearest even.
func F32ToF16(f float32) uint16 { return float16.Fromfloat32(f).Bits() }

// BF16ToF32 converts bfloat16 bits to float32 (exact).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts f to bfloat16 bits, rounding to nearest even. NaNs stay
// NaN (quietened), as in ggml's ggml_compute_fp32_to_bf16.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep the sign and top payload, force quiet
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

func le16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }

// checkLens validates a conversion of n values of type t stored in nbytes.
func checkLens(op string, t DType, n, nbytes int) error {
	ti, ok := typeOf(t)
	if !ok {
		return fmt.Errorf("tensor: %s: unknown type %d", op, uint32(t))
	}
	if !ti.supported {
		return fmt.Errorf("tensor: %s %s: unsupported type", op, ti.name)
	}
	if n%ti.blockSize != 0 {
		return fmt.Errorf("tensor: %s %s: %d values is not a multiple of the block size %d", op, ti.name, n, ti.blockSize)
	}
	if want := n / ti.blockSize * ti.blockBytes; nbytes != want {
		return fmt.Errorf("tensor: %s %s: %d values take %d bytes, got %d", op, ti.name, n, want, nbytes)
	}
	return nil
}

// Dequantize converts the values stored in src (of type t) to float32 in
// dst. len(dst) must be a multiple of t's block size and len(src) exactly
// the bytes those values take.
func Dequantize(t DType, src []byte, dst []float32) error {
	if err := checkLens("dequantize", t, len(dst), len(src)); err != nil {
		return err
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(le16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(le16(src[2*i:]))
		}
	case Q8_0:
		for i := 0; i < len(dst)/32; i++ {
			dequantQ8_0((*[34]byte)(src[34*i:]), (*[32]float32)(dst[32*i:]))
		}
	case Q4_0:
		for i := 0; i < len(dst)/32; i++ {
			dequantQ4_0((*[18]byte)(src[18*i:]), (*[32]float32)(dst[32*i:]))
		}
	case Q4_K:
		for i := 0; i < len(dst)/QK_K; i++ {
			dequantQ4_K((*[144]byte)(src[144*i:]), (*[QK_K]float32)(dst[QK_K*i:]))
		}
	case Q6_K:
		for i := 0; i < len(dst)/QK_K; i++ {
			dequantQ6_K((*[210]byte)(src[210*i:]), (*[QK_K]float32)(dst[QK_K*i:]))
		}
	default:
		if !moreDequant(t, src, dst) {
			return fmt.Errorf("tensor: dequantize %s: unsupported type", t)
		}
	}
	return nil
}

// RowSlice returns the bytes of row `row` of a row-major matrix of type t
// whose rows hold cols values each (GGML: cols is Shape[0]).
func RowSlice(t DType, data []byte, cols, row int) ([]byte, error) {
	rb, err := t.RowBytes(cols)
	if err != nil {
		return nil, fmt.Errorf("tensor: %v", err)
	}
	if row < 0 || rb != 0 && row >= len(data)/rb {
		return nil, fmt.Errorf("tensor: row %d of a %s matrix with %d-byte rows is outside its %d bytes", row, t, rb, len(data))
	}
	return data[row*rb : (row+1)*rb], nil
}

// DequantizeRow converts row `row` of the row-major matrix data (type t,
// len(dst) values per row) into dst. It is the embedding-lookup primitive.
func DequantizeRow(t DType, data []byte, row int, dst []float32) error {
	src, err := RowSlice(t, data, len(dst), row)
	if err != nil {
		return err
	}
	return Dequantize(t, src, dst)
}

func dequantQ8_0(b *[34]byte, y *[32]float32) {
	d := F16ToF32(le16(b[0:]))
	for j := 0; j < 32; j++ {
		y[j] = float32(int8(b[2+j])) * d
	}
}

func dequantQ4_0(b *[18]byte, y *[32]float32) {
	d := F16ToF32(le16(b[0:]))
	for j := 0; j < 16; j++ {
		q := b[2+j]
		y[j] = float32(int(q&0x0f)-8) * d
		y[j+16] = float32(int(q>>4)-8) * d
	}
}

// scaleMinK4 unpacks the 6-bit scale and min of sub-block j (0..7) from the
// 12 packed bytes of a Q4_K (or Q5_K) block, as ggml's get_scale_min_k4:
// bytes 0..3 hold scales 0..3 (low 6 bits), bytes 4..7 mins 0..3; for j>=4
// the low 4 bits come from byte j+4 (scale low nibble, min high nibble) and
// the top 2 bits from the top 2 bits of bytes j-4 (scale) and j (min).
func scaleMinK4(j int, q *[12]byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	sc = q[j+4]&0x0f | (q[j-4]>>6)<<4
	m = q[j+4]>>4 | (q[j]>>6)<<4
	return sc, m
}

func dequantQ4_K(b *[144]byte, y *[QK_K]float32) {
	d := F16ToF32(le16(b[0:]))
	dmin := F16ToF32(le16(b[2:]))
	scales := (*[12]byte)(b[4:16])
	qs := b[16:144]
	for c := 0; c < 4; c++ { // 64 values per chunk: two sub-blocks
		sc1, m1 := scaleMinK4(2*c, scales)
		sc2, m2 := scaleMinK4(2*c+1, scales)
		d1, mm1 := d*float32(sc1), dmin*float32(m1)
		d2, mm2 := d*float32(sc2), dmin*float32(m2)
		q := (*[32]byte)(qs[32*c:])
		out := (*[64]float32)(y[64*c:])
		for l := 0; l < 32; l++ {
			out[l] = d1*float32(q[l]&0x0f) - mm1
			out[l+32] = d2*float32(q[l]>>4) - mm2
		}
	}
}

func dequantQ6_K(b *[210]byte, y *[QK_K]float32) {
	d := F16ToF32(le16(b[208:]))
	for n := 0; n < 2; n++ { // two halves of 128 values
		ql := (*[64]byte)(b[64*n:])
		qh := (*[32]byte)(b[128+32*n:])
		sc := (*[8]byte)(b[192+8*n:])
		out := (*[128]float32)(y[128*n:])
		for l := 0; l < 32; l++ {
			is := l / 16
			h := qh[l]
			q1 := int(ql[l]&0x0f|(h&3)<<4) - 32
			q2 := int(ql[l+32]&0x0f|((h>>2)&3)<<4) - 32
			q3 := int(ql[l]>>4|((h>>4)&3)<<4) - 32
			q4 := int(ql[l+32]>>4|((h>>6)&3)<<4) - 32
			out[l] = d * float32(int8(sc[is])) * float32(q1)
			out[l+32] = d * float32(int8(sc[is+2])) * float32(q2)
			out[l+64] = d * float32(int8(sc[is+4])) * float32(q3)
			out[l+96] = d * float32(int8(sc[is+6])) * float32(q4)
		}
	}
}

// Quantize stores the float32 values of src as type t in dst, rounding to
// nearest (ggml's reference quantize_row_*_ref for Q8_0 and Q4_0; see
// quantQ4_K and quantQ6_K for the K-quant scale search). len(src) must be a
// multiple of t's block size and len(dst) exactly the bytes they take.
func Quantize(t DType, src []float32, dst []byte) error {
	if err := checkLens("quantize", t, len(src), len(dst)); err != nil {
		return err
	}
	switch t {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
		}
	case Q8_0:
		for i := 0; i < len(src)/32; i++ {
			quantQ8_0((*[32]float32)(src[32*i:]), (*[34]byte)(dst[34*i:]))
		}
	case Q4_0:
		for i := 0; i < len(src)/32; i++ {
			quantQ4_0((*[32]float32)(src[32*i:]), (*[18]byte)(dst[18*i:]))
		}
	case Q4_K:
		for i := 0; i < len(src)/QK_K; i++ {
			quantQ4_K((*[QK_K]float32)(src[QK_K*i:]), (*[144]byte)(dst[144*i:]))
		}
	case Q6_K:
		for i := 0; i < len(src)/QK_K; i++ {
			quantQ6_K((*[QK_K]float32)(src[QK_K*i:]), (*[210]byte)(dst[210*i:]))
		}
	default:
		if !moreQuantize(t, src, dst) {
			return fmt.Errorf("tensor: quantize %s: unsupported type", t)
		}
	}
	return nil
}

// nearestInt rounds half to even, like ggml's nearest_int.
func nearestInt(f float32) int {
	r := math.RoundToEven(float64(f))
	// Clamp before converting: out-of-range float->int conversions are
	// implementation-defined in Go (NaN lands here as well).
	if !(r > -1<<30) {
		return -1 << 30
	}
	if r > 1<<30 {
		return 1 << 30
	}
	return int(r)
}

func clampInt(v, lo, hi int) int {
	if v < lo {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}

// quantQ8_0 is quantize_row_q8_0_ref: d = max|x|/127, q = round(x/d).
func quantQ8_0(x *[32]float32, b *[34]byte) {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(b[0:], F32ToF16(d))
	for j, v := range x {
		// roundf: half away from zero.
		b[2+j] = byte(int8(clampInt(int(roundAway(v*id)), -127, 127)))
	}
}

func roundAway(f float32) float32 {
	r := float32(math.Round(float64(f)))
	if r != r { // NaN
		return 0
	}
	return max(min(r, 1<<20), -1<<20)
}

func abs32(f float32) float32 { return math.Float32frombits(math.Float32bits(f) &^ (1 << 31)) }

// quantQ4_0 is quantize_row_q4_0_ref: the value of largest magnitude maps
// to -8, d = max/-8, q = min(15, trunc(x/d + 8.5)).
func quantQ4_0(x *[32]float32, b *[18]byte) {
	var amax, mx float32
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	d := mx / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(b[0:], F32ToF16(d))
	q := func(v float32) byte {
		f := v*id + 8.5
		if !(f >= 0) { // also NaN
			return 0
		}
		return byte(min(15, int(min(f, 16))))
	}
	for j := 0; j < 16; j++ {
		b[2+j] = q(x[j]) | q(x[j+16])<<4
	}
}

// fitScaleMin fits the values of x (at most QK_K) to levels 0..nmax as
// x ≈ scale*l - m with scale >= 0 and m >= 0 (m is the positive min, as
// K-quants store it).
//
// Search (simpler than ggml's make_qkx2_quants, unweighted): with
// lo = min(min(x), 0) and hi = max(x), try 21 inverse scales
// (nmax + 0.1*k)/(hi-lo), k = -10..10; for each, round the levels, fit scale
// and offset by ordinary least squares (offset clamped to <= 0, refitting the
// scale alone when clamped) and keep the fit with the smallest squared error.
func fitScaleMin(x []float32, nmax int) (scale, m float32) {
	lo, hi := x[0], x[0]
	for _, v := range x[1:] {
		lo, hi = min(lo, v), max(hi, v)
	}
	lo = min(lo, 0)
	if !(hi > lo) { // all equal (<= 0), or NaN
		if lo != lo {
			return 0, 0
		}
		return 0, -lo
	}
	bestErr := float32(math.Inf(1))
	var bestScale, bestOff float32 = (hi - lo) / float32(nmax), lo
	n := float32(len(x))
	var tmp [QK_K]uint8
	for k := -10; k <= 10; k++ {
		iscale := (float32(nmax) + 0.1*float32(k)) / (hi - lo)
		var sl, sl2, sx, slx float32
		for i, v := range x {
			l := uint8(clampInt(nearestInt(iscale*(v-lo)), 0, nmax))
			tmp[i] = l
			fl := float32(l)
			sl += fl
			sl2 += fl * fl
			sx += v
			slx += fl * v
		}
		det := n*sl2 - sl*sl
		if det <= 0 {
			continue
		}
		a := (n*slx - sl*sx) / det
		off := (sl2*sx - sl*slx) / det
		if off > 0 {
			off = 0
			a = slx / sl2
		}
		if a < 0 {
			continue
		}
		var e float32
		for i, v := range x {
			diff := a*float32(tmp[i]) + off - v
			e += diff * diff
		}
		if e < bestErr {
			bestErr, bestScale, bestOff = e, a, off
		}
	}
	// Levels are recomputed by the caller from the 6-bit quantized scales.
	return bestScale, -bestOff
}

// packScalesMinsK4 writes the header of a Q4_K or Q5_K super-block b, as
// quantize_row_q4_K_ref and quantize_row_q5_K_ref do: the eight scales and
// eight mins quantized to 6 bits against d = maxScale/63 and
// dmin = maxMin/63, packed into the 12 bytes at b[4:16], and d, dmin as
// float16 at b[0:4]. It returns the packed scales and d, dmin as stored.
func packScalesMinsK4(b []byte, scales, mins []float32, maxScale, maxMin float32) (sc *[12]byte, d, dmin float32) {
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	sc = (*[12]byte)(b[4:16])
	*sc = [12]byte{}
	for j := 0; j < 8; j++ {
		ls := uint8(clampInt(nearestInt(invScale*scales[j]), 0, 63))
		lm := uint8(clampInt(nearestInt(invMin*mins[j]), 0, 63))
		if j < 4 {
			sc[j] = ls
			sc[j+4] = lm
		} else {
			sc[j+4] = ls&0x0f | (lm&0x0f)<<4
			sc[j-4] |= (ls >> 4) << 6
			sc[j] |= (lm >> 4) << 6
		}
	}
	dh, dminh := F32ToF16(maxScale/63), F32ToF16(maxMin/63)
	binary.LittleEndian.PutUint16(b[0:], dh)
	binary.LittleEndian.PutUint16(b[2:], dminh)
	return sc, F16ToF32(dh), F16ToF32(dminh)
}

// quantQ4_K quantizes one super-block: per 32-value sub-block a scale and
// min from fitScaleMin, then (as quantize_row_q4_K_ref) the eight scales and
// eight mins quantized to 6 bits against d = max(scale)/63 and
// dmin = max(min)/63, and every value rounded to its level with the stored
// (rounded) scale and min.
func quantQ4_K(x *[QK_K]float32, b *[144]byte) {
	scales, mins, maxScale, maxMin := fitScaleMins(x[:], 32, 15)
	sc, d, dmin := packScalesMinsK4(b[:], scales, mins, maxScale, maxMin)

	var all [QK_K]uint8
	for j := 0; j < 8; j++ {
		s, m := scaleMinK4(j, sc)
		levelsScaleMin(x[32*j:32*j+32], all[32*j:], d*float32(s), dmin*float32(m), 15)
	}
	qs := b[16:144]
	for c := 0; c < 4; c++ {
		for l := 0; l < 32; l++ {
			qs[32*c+l] = all[64*c+l] | all[64*c+32+l]<<4
		}
	}
}

// fitScaleSym finds a signed scale for x ≈ scale*l with l in -nmax..nmax-1
// (symmetric quantization, the largest-magnitude value mapping to -nmax).
// Search (a simplification of ggml's make_qx_quants, unweighted): try the 19
// inverse scales -(nmax + 0.1*k)/max, k = -9..9, round, fit the scale by
// least squares and keep the candidate with the smallest squared error.
func fitScaleSym(x []float32, nmax int) float32 {
	var amax, mx float32
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	if !(amax > 1e-30) {
		return 0
	}
	var best, bestGain float32
	for k := -9; k <= 9; k++ {
		iscale := -(float32(nmax) + 0.1*float32(k)) / mx
		var slx, sl2 float32
		for _, v := range x {
			l := float32(clampInt(nearestInt(iscale*v), -nmax, nmax-1))
			slx += l * v
			sl2 += l * l
		}
		// For the least-squares scale slx/sl2 the squared error is
		// sum(x^2) - slx^2/sl2: maximize slx^2/sl2.
		if sl2 > 0 {
			if g := slx * slx / sl2; g > bestGain {
				bestGain, best = g, slx/sl2
			}
		}
	}
	return best
}

// quantQ6_K quantizes one super-block as quantize_row_q6_K_ref: sixteen
// sub-block scales from fitScaleSym, quantized to int8 against
// d = -max/128 (max the scale of largest magnitude), then each value rounded
// to l in -32..31 with the stored scale and stored as l+32.
func quantQ6_K(x *[QK_K]float32, b *[210]byte) {
	var scales [16]float32
	var maxScale, maxAbs float32
	for ib := 0; ib < 16; ib++ {
		s := fitScaleSym(x[16*ib:16*ib+16], 32)
		scales[ib] = s
		if a := abs32(s); a > maxAbs {
			maxAbs, maxScale = a, s
		}
	}
	ql := b[0:128]
	qh := b[128:192]
	sc := b[192:208]
	if maxAbs == 0 {
		clear(b[:])
		return
	}
	iscale := -128 / maxScale
	dh := F32ToF16(1 / iscale)
	binary.LittleEndian.PutUint16(b[208:], dh)
	d := F16ToF32(dh)
	var L [QK_K]uint8
	for ib := 0; ib < 16; ib++ {
		s := int8(clampInt(nearestInt(iscale*scales[ib]), -128, 127))
		sc[ib] = byte(s)
		dd := d * float32(s)
		for i := 16 * ib; i < 16*ib+16; i++ {
			l := 0
			if dd != 0 {
				l = clampInt(nearestInt(x[i]/dd), -32, 31)
			}
			L[i] = uint8(l + 32)
		}
	}
	for n := 0; n < 2; n++ {
		Ln := L[128*n:]
		for l := 0; l < 32; l++ {
			q1, q2, q3, q4 := Ln[l], Ln[l+32], Ln[l+64], Ln[l+96]
			ql[64*n+l] = q1&0x0f | (q3&0x0f)<<4
			ql[64*n+l+32] = q2&0x0f | (q4&0x0f)<<4
			qh[32*n+l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
		}
	}
}
