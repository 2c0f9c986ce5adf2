package tensor

import (
	"fmt"
	"math"
	"unsafe"
)

// Attention kernels: the scores of a panel of keys for a tile of query rows
// as a small matrix product, the softmax's maximum, exponentials and
// division, and the weighted sum of value rows. Each has a plain Go twin
// (the *Go functions below), which the SIMD kernels reproduce bit for bit:
//
//   - scores: keys in SIMD lanes (a panel P[d][16] of 16 keys transposed,
//     PackKeys), one query row per accumulator; every score is summed in d
//     order from zero, a product then a sum, as llama2.c's run.c does;
//   - AttnExp: float32(e^(s/norm − mx)), the division and subtraction in
//     float32 and the exponential as exp64 (exp.go), whose float32 rounding
//     equals float32(math.Exp);
//   - AttnPV: every output value sums its products in slot order, a
//     product then a sum, as an Axpy per slot does.

// AttnLanes is the number of keys in a score panel.
const AttnLanes = 16

func f32View(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

func elemBytes(t DType) int {
	if t == F32 {
		return 4
	}
	return 2
}

// elemAt is value j of type t (F32, F16, BF16) at b.
func elemAt(b []byte, t DType, j int) float32 {
	switch t {
	case F32:
		return math.Float32frombits(uint32(b[4*j]) | uint32(b[4*j+1])<<8 | uint32(b[4*j+2])<<16 | uint32(b[4*j+3])<<24)
	case F16:
		return F16ToF32(le16(b[2*j:]))
	}
	return BF16ToF32(le16(b[2*j:]))
}

// PackKeys writes n ≤ 16 keys of d values, rows ld bytes apart in src, of
// type t (F32, F16 or BF16), transposed as float32 to panel[c·16 + j] =
// key_j[c]. With n = 16 and d a multiple of 16 it runs the SIMD transpose
// (src must then hold 16 rows); otherwise lanes j ≥ n are set to zero.
func PackKeys(panel []float32, src []byte, t DType, ld, n, d int) {
	panel = panel[:d*AttnLanes]
	es := elemBytes(t)
	if n == AttnLanes && d&15 == 0 && d > 0 {
		_ = src[15*ld+d*es-1]
		if k := floatKern(); k != nil {
			k.pack[floatIndex(t)](&panel[0], unsafe.Pointer(&src[0]), ld, d/16, 16*es)
			return
		}
	}
	packKeysGo(panel, src, t, ld, n, d)
}

func packKeysGo(panel []float32, src []byte, t DType, ld, n, d int) {
	for j := range AttnLanes {
		if j >= n {
			for c := range d {
				panel[c*AttnLanes+j] = 0
			}
			continue
		}
		row := src[j*ld : j*ld+d*elemBytes(t)]
		for c := range d {
			panel[c*AttnLanes+j] = elemAt(row, t, c)
		}
	}
}

// attnMR is the most query rows per score-kernel call at the level in use.
func attnMR() int {
	if level == levelAVX2 {
		return 6
	}
	return 14
}

// PackQueries lays out the query rows q [rows][d] for AttnScores in dst
// (len ≥ rows·d): groups of up to attnMR rows, each stored d-major.
func PackQueries(dst, q []float32, rows, d int) {
	packActivations(dst[:rows*d], q[:rows*d], rows, d, attnMR())
}

// AttnScores sets s[r·lds + j] = Σ_c q_r[c]·panel[c·16 + j] for the rows r
// < rows of qp (from PackQueries at the same kernel level) and the 16 keys j
// of panel (from PackKeys): each summed in c order from zero, a product then
// a sum (run.c's order).
func AttnScores(s []float32, lds int, panel, qp []float32, rows, d int) {
	_ = panel[d*AttnLanes-1]
	attnScores(s, lds, unsafe.Pointer(unsafe.SliceData(panel)), F32, qp, rows, d)
}

// AttnScoresOf is AttnScores over a panel of type t (F32, F16 or BF16)
// stored as bytes, [d][16] values (a key cache that keeps its keys so): each
// value converts exactly to float32, so a half-float panel scores as its
// float32 image packed by PackKeys does, bit for bit.
func AttnScoresOf(s []float32, lds int, panel []byte, t DType, qp []float32, rows, d int) {
	_ = panel[d*AttnLanes*elemBytes(t)-1]
	attnScores(s, lds, unsafe.Pointer(unsafe.SliceData(panel)), t, qp, rows, d)
}

// attnScores: p points at d·16 values of type t (bounds checked by the
// callers).
func attnScores(s []float32, lds int, p unsafe.Pointer, t DType, qp []float32, rows, d int) {
	if rows == 0 {
		return
	}
	_ = s[(rows-1)*lds+AttnLanes-1]
	_ = qp[rows*d-1]
	mr := attnMR()
	k := qkKern(t)
	for t0 := 0; t0 < rows; t0 += mr {
		g := min(mr, rows-t0)
		if k == nil || d == 0 {
			attnScoresGo(s[t0*lds:], lds, p, t, qp[t0*d:(t0+g)*d], g, d)
			continue
		}
		k[g](p, &qp[t0*d], d, &s[t0*lds], 4*lds)
	}
}

// attnScoresGo is the twin of the score kernels for one group of g rows
// packed d-major (qp[c·g + r]), over the panel of type t at p.
func attnScoresGo(s []float32, lds int, p unsafe.Pointer, t DType, qp []float32, g, d int) {
	panel := unsafe.Slice((*byte)(p), d*AttnLanes*elemBytes(t))
	var f32 []float32
	if t == F32 {
		f32 = f32View(panel)
	}
	var acc [14][AttnLanes]float32 // g ≤ 14 rows (attnMR)
	var row [AttnLanes]float32
	for c := range d {
		if f32 != nil {
			copy(row[:], f32[c*AttnLanes:])
		} else {
			for j := range row {
				row[j] = elemAt(panel, t, c*AttnLanes+j)
			}
		}
		for r := range g {
			q := qp[c*g+r]
			a := &acc[r]
			for j := range a {
				a[j] += float32(q * row[j])
			}
		}
	}
	for r := range g {
		copy(s[r*lds:r*lds+AttnLanes], acc[r][:])
	}
}

// maxOp is MAXPS's rule: a if a > b, else b (so a NaN a never wins).
func maxOp(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

// AttnMax returns the largest value of s, ignoring NaNs (−Inf for none):
// sixteen lanes over the first 16·⌊n/16⌋ values then a fixed tree, then the
// rest in order, so that every kernel level returns the same bits.
func AttnMax(s []float32) float32 {
	n16 := len(s) &^ 15
	m := float32(math.Inf(-1))
	if n16 > 0 {
		m = vmaxLanes(s[:n16])
	}
	for _, v := range s[n16:] {
		m = maxOp(v, m)
	}
	return m
}

func vmaxGo(s []float32) float32 {
	var l [16]float32
	for j := range l {
		l[j] = float32(math.Inf(-1))
	}
	for i := 0; i+16 <= len(s); i += 16 {
		for j := range l {
			l[j] = maxOp(s[i+j], l[j])
		}
	}
	for j := 0; j < 8; j++ {
		l[j] = maxOp(l[j+8], l[j])
	}
	for j := 0; j < 4; j++ {
		l[j] = maxOp(l[j+4], l[j])
	}
	l[0] = maxOp(l[2], l[0])
	l[1] = maxOp(l[3], l[1])
	return maxOp(l[1], l[0])
}

// AttnExp sets s[i] = float32(e^(s[i]/norm − mx)) (the division and the
// subtraction rounded to float32; the exponential is exp64's, which rounds
// to float32 as float32(math.Exp) does). −Inf gives 0.
func AttnExp(s []float32, norm, mx float32) {
	n8 := len(s) &^ 7
	if n8 > 0 {
		attnExpLanes(s[:n8], norm, mx)
	}
	attnExpGo(s[n8:], norm, mx)
}

func attnExpGo(s []float32, norm, mx float32) {
	for i, v := range s {
		x := float32(v/norm) - mx
		s[i] = float32(exp64(float64(x)))
	}
}

// AttnDiv divides every value of s by d.
func AttnDiv(s []float32, d float32) {
	n16 := len(s) &^ 15
	if n16 > 0 {
		vdivLanes(s[:n16], d)
	}
	vdivGo(s[n16:], d)
}

func vdivGo(s []float32, d float32) {
	for i, v := range s {
		s[i] = v / d
	}
}

// AttnPV adds the weighted sum of n value rows to rows output rows: for r <
// rows and c < d, o[r·ldo + c] += Σ_{i<n} p[r·ldp + i]·v_i[c], the products
// added one by one in slot order (a product then a sum, as Axpy per slot),
// v_i the d values of type t (F32, F16, BF16) at byte i·ldv of v.
func AttnPV(o []float32, ldo int, p []float32, ldp int, v []byte, t DType, ldv, n, rows, d int) {
	if rows == 0 || n == 0 || d == 0 {
		return
	}
	_ = o[(rows-1)*ldo+d-1]
	_ = p[(rows-1)*ldp+n-1]
	_ = v[(n-1)*ldv+d*elemBytes(t)-1]
	d16 := d &^ 15
	if k := pvKern(t); k != nil && d16 > 0 {
		for r0 := 0; r0 < rows; r0 += 6 {
			g := min(6, rows-r0)
			k[g](&p[r0*ldp], 4*ldp, unsafe.Pointer(&v[0]), ldv, n, &o[r0*ldo], 4*ldo, d16)
		}
		if d16 == d {
			return
		}
		es := elemBytes(t)
		attnPVGo(o[d16:], ldo, p, ldp, v[d16*es:], t, ldv, n, rows, d-d16)
		return
	}
	attnPVGo(o, ldo, p, ldp, v, t, ldv, n, rows, d)
}

func attnPVGo(o []float32, ldo int, p []float32, ldp int, v []byte, t DType, ldv, n, rows, d int) {
	var buf [256]float32
	var row []float32
	if t != F32 {
		if d <= len(buf) {
			row = buf[:d]
		} else {
			row = make([]float32, d)
		}
	}
	for i := range n {
		vi := v[i*ldv : i*ldv+d*elemBytes(t)]
		var x []float32
		if t == F32 {
			x = f32View(vi)[:d]
		} else {
			for c := range row {
				row[c] = elemAt(vi, t, c)
			}
			x = row
		}
		for r := range rows {
			a := p[r*ldp+i]
			or := o[r*ldo : r*ldo+d]
			for c, xv := range x {
				or[c] += float32(a * xv)
			}
		}
	}
}

// ScaleBytes sets dst[j] = s·u[j] + m (a product then a sum, each rounded
// to float32) for j < len(dst): the decoding of 8-bit levels (the KV
// cache's q8 codec).
func ScaleBytes(dst []float32, u []byte, s, m float32) {
	u = u[:len(dst)]
	n16 := len(dst) &^ 15
	if n16 > 0 {
		scaleBytesLanes(dst[:n16], u[:n16], s, m)
	}
	scaleBytesGo(dst[n16:], u[n16:], s, m)
}

// ScaleLevels sets dst[j] = s·u_j + m (a product then a sum, each rounded
// to float32, as ScaleBytes) for j < len(dst), u_j the levels of bits 8, 4
// or 2 packed in u, low bits first (4 bits: u_2k is the low nibble of byte
// k): the decoding of the KV cache's q4, kivi4 and kivi2 rows.
func ScaleLevels(dst []float32, u []byte, bits int, s, m float32) {
	if bits == 8 {
		ScaleBytes(dst, u, s, m)
		return
	}
	checkLevels(dst, u, bits)
	n16 := len(dst) &^ 15
	if n16 > 0 {
		scaleLevelsLanes(dst[:n16], u, bits, &s, &m, 0)
	}
	scaleLevelsGo(dst[n16:], u[n16*bits/8:], bits, unsafe.Slice(&s, 1), unsafe.Slice(&m, 1), 0)
}

// ScaleLevelRows is ScaleLevels over rows of 16 levels with a scale and
// minimum per row: dst[16r + j] = s[r]·u_{16r+j} + m[r] for r < len(s)
// (bits 4 or 2; dst holds 16·len(s) values), the decoding of a panel of
// KIVI keys (row r: channel r of 16 slots).
func ScaleLevelRows(dst []float32, u []byte, bits int, s, m []float32) {
	dst = dst[:AttnLanes*len(s)]
	checkLevels(dst, u, bits)
	m = m[:len(s)]
	if len(s) > 0 {
		scaleLevelsLanes(dst, u, bits, &s[0], &m[0], AttnLanes)
	}
}

func checkLevels(dst []float32, u []byte, bits int) {
	if bits != 4 && bits != 2 {
		panic(fmt.Sprintf("tensor: levels of %d bits", bits))
	}
	if len(dst) > 0 {
		_ = u[(len(dst)*bits+7)/8-1]
	}
}

// packedLevel is level e of levels of bits bits (8, 4 or 2) packed low
// bits first: bits e·bits … of u.
func packedLevel(u []byte, bits, e int) byte {
	pos := e * bits
	return u[pos>>3] >> (pos & 7) & (1<<bits - 1)
}

// scaleCount is the scales that n values take, per as scaleLevelsGo.
func scaleCount(n, per int) int {
	if per == 0 {
		return 1
	}
	return (n + per - 1) / per
}

// scaleLevelsGo is the twin of the level decoding kernels: value j takes
// scale and minimum s[j/per], m[j/per] (per 0: s[0], m[0] for all; per 16:
// a scale per row of 16).
func scaleLevelsGo(dst []float32, u []byte, bits int, s, m []float32, per int) {
	for j := range dst {
		v := packedLevel(u, bits, j)
		k := 0
		if per > 0 {
			k = j / per
		}
		dst[j] = float32(s[k]*float32(v)) + m[k]
	}
}

// ScalePanel decodes a panel of 16 quantized slots stored value-major
// (u[c·16 + j]: value c of slot j): dst[c·16 + j] = sm[j]·u[c·16 + j] +
// sm[16 + j] (a product then a sum, each rounded to float32, as ScaleBytes),
// then + shift[c] (a sum) when shift is not nil, for c < d. sm holds the
// slots' scales, then their minimums.
func ScalePanel(dst []float32, u []byte, sm *[2 * AttnLanes]float32, shift []float32, d int) {
	scalePanel(dst, u, sm, shift, d, 8)
}

// ScalePanel4 is ScalePanel over 4-bit levels: value c of slot j is nibble
// j of the 8 bytes u[8c:8c+8] (slot 2k in the low nibble of byte k, 2k+1 in
// the high one).
func ScalePanel4(dst []float32, u []byte, sm *[2 * AttnLanes]float32, shift []float32, d int) {
	scalePanel(dst, u, sm, shift, d, 4)
}

func scalePanel(dst []float32, u []byte, sm *[2 * AttnLanes]float32, shift []float32, d, bits int) {
	if d <= 0 {
		return
	}
	_ = dst[d*AttnLanes-1]
	_ = u[d*AttnLanes*bits/8-1]
	if shift != nil {
		_ = shift[d-1]
	}
	scalePanelLanes(dst, u, sm, shift, d, bits)
}

// scalePanelGo is the twin of the panel decoding kernels (bits 8 or 4).
func scalePanelGo(dst []float32, u []byte, sm *[2 * AttnLanes]float32, shift []float32, d, bits int) {
	for c := range d {
		o := dst[c*AttnLanes : (c+1)*AttnLanes]
		for j := range o {
			v := packedLevel(u, bits, c*AttnLanes+j)
			o[j] = float32(sm[j]*float32(v)) + sm[AttnLanes+j]
		}
		if shift != nil {
			for j := range o {
				o[j] += shift[c]
			}
		}
	}
}

func scaleBytesGo(dst []float32, u []byte, s, m float32) {
	u = u[:len(dst)]
	for j, b := range u {
		dst[j] = float32(s*float32(b)) + m
	}
}
