//go:build amd64 && !purego

package tensor

import "unsafe"

type (
	qkFunc func(p unsafe.Pointer, xp *float32, k int, c *float32, ldc int)
	pvFunc func(p *float32, ldp int, v unsafe.Pointer, ldv int, n int, o *float32, ldo int, cols int)
)

var (
	qkZ = [3][]qkFunc{
		{nil, qkZm1, qkZm2, qkZm3, qkZm4, qkZm5, qkZm6, qkZm7, qkZm8, qkZm9, qkZm10, qkZm11, qkZm12, qkZm13, qkZm14},
		{nil, qkF16Zm1, qkF16Zm2, qkF16Zm3, qkF16Zm4, qkF16Zm5, qkF16Zm6, qkF16Zm7, qkF16Zm8, qkF16Zm9, qkF16Zm10, qkF16Zm11, qkF16Zm12, qkF16Zm13, qkF16Zm14},
		{nil, qkBF16Zm1, qkBF16Zm2, qkBF16Zm3, qkBF16Zm4, qkBF16Zm5, qkBF16Zm6, qkBF16Zm7, qkBF16Zm8, qkBF16Zm9, qkBF16Zm10, qkBF16Zm11, qkBF16Zm12, qkBF16Zm13, qkBF16Zm14},
	}
	qkY = [3][]qkFunc{
		{nil, qkYm1, qkYm2, qkYm3, qkYm4, qkYm5, qkYm6},
		{nil, qkF16Ym1, qkF16Ym2, qkF16Ym3, qkF16Ym4, qkF16Ym5, qkF16Ym6},
		{nil, qkBF16Ym1, qkBF16Ym2, qkBF16Ym3, qkBF16Ym4, qkBF16Ym5, qkBF16Ym6},
	}

	pvZ = [3][]pvFunc{
		{nil, pvF32Zm1, pvF32Zm2, pvF32Zm3, pvF32Zm4, pvF32Zm5, pvF32Zm6},
		{nil, pvF16Zm1, pvF16Zm2, pvF16Zm3, pvF16Zm4, pvF16Zm5, pvF16Zm6},
		{nil, pvBF16Zm1, pvBF16Zm2, pvBF16Zm3, pvBF16Zm4, pvBF16Zm5, pvBF16Zm6},
	}
	pvY = [3][]pvFunc{
		{nil, pvF32Ym1, pvF32Ym2, pvF32Ym3, pvF32Ym4, pvF32Ym5, pvF32Ym6},
		{nil, pvF16Ym1, pvF16Ym2, pvF16Ym3, pvF16Ym4, pvF16Ym5, pvF16Ym6},
		{nil, pvBF16Ym1, pvBF16Ym2, pvBF16Ym3, pvBF16Ym4, pvBF16Ym5, pvBF16Ym6},
	}
)

// qkKern returns the score kernels of the level in use for panels of type
// t, indexed by rows (nil: plain Go).
func qkKern(t DType) []qkFunc {
	switch level {
	case levelAVX512:
		return qkZ[floatIndex(t)]
	case levelAVX2:
		return qkY[floatIndex(t)]
	}
	return nil
}

// pvKern returns the weighted-sum kernels for values of type t, indexed by
// rows (1..6; nil: plain Go).
func pvKern(t DType) []pvFunc {
	switch level {
	case levelAVX512:
		return pvZ[floatIndex(t)]
	case levelAVX2:
		return pvY[floatIndex(t)]
	}
	return nil
}

func vmaxLanes(s []float32) float32 {
	switch level {
	case levelAVX512:
		return vmaxZ(&s[0], len(s))
	case levelAVX2:
		return vmaxY(&s[0], len(s))
	}
	return vmaxGo(s)
}

func attnExpLanes(s []float32, norm, mx float32) {
	switch level {
	case levelAVX512:
		attnExpZ(&s[0], len(s), norm, mx)
	case levelAVX2:
		attnExpY(&s[0], len(s), norm, mx)
	default:
		attnExpGo(s, norm, mx)
	}
}

func vdivLanes(s []float32, d float32) {
	switch level {
	case levelAVX512:
		vdivZ(&s[0], len(s), d)
	case levelAVX2:
		vdivY(&s[0], len(s), d)
	default:
		vdivGo(s, d)
	}
}

func scaleBytesLanes(dst []float32, u []byte, s, m float32) {
	switch level {
	case levelAVX512:
		scaleBytesZ(&dst[0], &u[0], len(dst), s, m)
	case levelAVX2:
		scaleBytesY(&dst[0], &u[0], len(dst), s, m)
	default:
		scaleBytesGo(dst, u, s, m)
	}
}

// scaleLevelsLanes runs the level decoding kernel of the level in use over
// len(dst), a multiple of 16, levels.
// scaleLevelsLanes runs the level decoding kernel of the level in use
// over len(dst), a multiple of 16, levels, with per scales as
// scaleLevelsGo.
func scaleLevelsLanes(dst []float32, u []byte, bits int, s, m *float32, per int) {
	d, p, n := &dst[0], &u[0], len(dst)
	// direct calls, so that escape analysis sees the kernels' go:noescape
	switch z, y, four := level == levelAVX512, level == levelAVX2, bits == 4; {
	case z && four && per == 0:
		scaleLevels4Z(d, p, n, s, m)
	case z && four:
		scaleLevels4ZR(d, p, n, s, m)
	case z && per == 0:
		scaleLevels2Z(d, p, n, s, m)
	case z:
		scaleLevels2ZR(d, p, n, s, m)
	case y && four && per == 0:
		scaleLevels4Y(d, p, n, s, m)
	case y && four:
		scaleLevels4YR(d, p, n, s, m)
	case y && per == 0:
		scaleLevels2Y(d, p, n, s, m)
	case y:
		scaleLevels2YR(d, p, n, s, m)
	default:
		scaleLevelsGo(dst, u, bits, unsafe.Slice(s, scaleCount(n, per)), unsafe.Slice(m, scaleCount(n, per)), per)
	}
}

func scalePanelLanes(dst []float32, u []byte, sm *[2 * AttnLanes]float32, shift []float32, d, bits int) {
	o, p, q := &dst[0], &u[0], &sm[0]
	var mu *float32
	if shift != nil {
		mu = &shift[0]
	}
	// direct calls, so that escape analysis sees the kernels' go:noescape
	switch {
	case level == levelAVX512 && bits == 8 && mu == nil:
		scalePanelZ(o, p, q, mu, d)
	case level == levelAVX512 && bits == 8:
		scalePanelZShift(o, p, q, mu, d)
	case level == levelAVX512 && mu == nil:
		scalePanel4Z(o, p, q, mu, d)
	case level == levelAVX512:
		scalePanel4ZShift(o, p, q, mu, d)
	case level == levelAVX2 && bits == 8 && mu == nil:
		scalePanelY(o, p, q, mu, d)
	case level == levelAVX2 && bits == 8:
		scalePanelYShift(o, p, q, mu, d)
	case level == levelAVX2 && mu == nil:
		scalePanel4Y(o, p, q, mu, d)
	case level == levelAVX2:
		scalePanel4YShift(o, p, q, mu, d)
	default:
		scalePanelGo(dst, u, sm, shift, d, bits)
	}
}

type (
	qkQFunc func(p *byte, xp *float32, k int, c *float32, ldc int, sm *float32, mu *float32)
	pvQFunc func(p *float32, ldp int, v *byte, ldv int, n int, o *float32, ldo int, cols int, sm *float32)
)

// The fused kernels over quantized keys and values (attnq.go), AVX-512
// only: qkQ[bits 8, 4][shift] and qkC[bits 4, 2] indexed by rows (1..14),
// pvQ[bits 8, 4, 2] by rows (1..6).
var (
	qkQ = [2][2][]qkQFunc{
		{{nil, qkQ8Zm1, qkQ8Zm2, qkQ8Zm3, qkQ8Zm4, qkQ8Zm5, qkQ8Zm6, qkQ8Zm7, qkQ8Zm8, qkQ8Zm9, qkQ8Zm10, qkQ8Zm11, qkQ8Zm12, qkQ8Zm13, qkQ8Zm14},
			{nil, qkQ8Zm1S, qkQ8Zm2S, qkQ8Zm3S, qkQ8Zm4S, qkQ8Zm5S, qkQ8Zm6S, qkQ8Zm7S, qkQ8Zm8S, qkQ8Zm9S, qkQ8Zm10S, qkQ8Zm11S, qkQ8Zm12S, qkQ8Zm13S, qkQ8Zm14S}},
		{{nil, qkQ4Zm1, qkQ4Zm2, qkQ4Zm3, qkQ4Zm4, qkQ4Zm5, qkQ4Zm6, qkQ4Zm7, qkQ4Zm8, qkQ4Zm9, qkQ4Zm10, qkQ4Zm11, qkQ4Zm12, qkQ4Zm13, qkQ4Zm14},
			{nil, qkQ4Zm1S, qkQ4Zm2S, qkQ4Zm3S, qkQ4Zm4S, qkQ4Zm5S, qkQ4Zm6S, qkQ4Zm7S, qkQ4Zm8S, qkQ4Zm9S, qkQ4Zm10S, qkQ4Zm11S, qkQ4Zm12S, qkQ4Zm13S, qkQ4Zm14S}},
	}
	pvQ = [3][]pvQFunc{
		{nil, pvQ8Zm1, pvQ8Zm2, pvQ8Zm3, pvQ8Zm4, pvQ8Zm5, pvQ8Zm6},
		{nil, pvQ4Zm1, pvQ4Zm2, pvQ4Zm3, pvQ4Zm4, pvQ4Zm5, pvQ4Zm6},
		{nil, pvQ2Zm1, pvQ2Zm2, pvQ2Zm3, pvQ2Zm4, pvQ2Zm5, pvQ2Zm6},
	}
	qkC = [2][]qkQFunc{
		{nil, qkC4Zm1, qkC4Zm2, qkC4Zm3, qkC4Zm4, qkC4Zm5, qkC4Zm6, qkC4Zm7, qkC4Zm8, qkC4Zm9, qkC4Zm10, qkC4Zm11, qkC4Zm12, qkC4Zm13, qkC4Zm14},
		{nil, qkC2Zm1, qkC2Zm2, qkC2Zm3, qkC2Zm4, qkC2Zm5, qkC2Zm6, qkC2Zm7, qkC2Zm8, qkC2Zm9, qkC2Zm10, qkC2Zm11, qkC2Zm12, qkC2Zm13, qkC2Zm14},
	}
)

func qkQKern(bits int, shift bool) []qkQFunc {
	if level != levelAVX512 || (bits != 8 && bits != 4) {
		return nil
	}
	s := 0
	if shift {
		s = 1
	}
	b := 0
	if bits == 4 {
		b = 1
	}
	return qkQ[b][s]
}

func pvQKern(bits int) []pvQFunc {
	if level != levelAVX512 {
		return nil
	}
	switch bits {
	case 8:
		return pvQ[0]
	case 4:
		return pvQ[1]
	case 2:
		return pvQ[2]
	}
	return nil
}

func qkCKern(bits int) []qkQFunc {
	if level != levelAVX512 {
		return nil
	}
	switch bits {
	case 4:
		return qkC[0]
	case 2:
		return qkC[1]
	}
	return nil
}

type qkDFunc func(p *byte, xp *byte, k int, c *float32, ldc int, sm *float32, cst *float32)

// The dot-product score kernels (attndot.go), AVX-512 with VNNI and VBMI:
// qkD[bits 8, 4] indexed by rows (1..DotMR).
var qkD = [2][]qkDFunc{
	{nil, qkD8Zm1, qkD8Zm2, qkD8Zm3, qkD8Zm4, qkD8Zm5, qkD8Zm6, qkD8Zm7, qkD8Zm8, qkD8Zm9, qkD8Zm10, qkD8Zm11, qkD8Zm12},
	{nil, qkD4Zm1, qkD4Zm2, qkD4Zm3, qkD4Zm4, qkD4Zm5, qkD4Zm6, qkD4Zm7, qkD4Zm8, qkD4Zm9, qkD4Zm10, qkD4Zm11, qkD4Zm12},
}

// qkDKern returns the dot-product score kernels for levels of bits bits
// over rows of d values (8 bits: d a multiple of 4; 4 bits: of 8), or nil.
func qkDKern(bits, d int) []qkDFunc {
	if level != levelAVX512 || !cpuVNNI || !cpuVBMI {
		return nil
	}
	switch {
	case bits == 8 && d%4 == 0:
		return qkD[0]
	case bits == 4 && d%8 == 0:
		return qkD[1]
	}
	return nil
}

type pvDFunc func(p *float32, ldp int, v *byte, ldv int, o *float32, ldo int, cols int, sm *float32, ws *byte)

// The dot-product weighted-sum kernels (attndot.go): pvD[bits 8, 4]
// indexed by rows (1..DotMR).
var pvD = [2][]pvDFunc{
	{nil, pvD8Zm1, pvD8Zm2, pvD8Zm3, pvD8Zm4, pvD8Zm5, pvD8Zm6, pvD8Zm7, pvD8Zm8, pvD8Zm9, pvD8Zm10, pvD8Zm11, pvD8Zm12},
	{nil, pvD4Zm1, pvD4Zm2, pvD4Zm3, pvD4Zm4, pvD4Zm5, pvD4Zm6, pvD4Zm7, pvD4Zm8, pvD4Zm9, pvD4Zm10, pvD4Zm11, pvD4Zm12},
}

func pvDKern(bits int) []pvDFunc {
	if level != levelAVX512 || !cpuVNNI || !cpuVBMI {
		return nil
	}
	if bits == 8 {
		return pvD[0]
	}
	return pvD[1]
}

// halfPairsLanes runs halfPairsZ or halfPairsY (direct calls: sm stays
// where the caller has it) and reports whether it did.
func halfPairsLanes(sm *[2 * AttnLanes]float32, meta *byte) bool {
	switch level {
	case levelAVX512:
		halfPairsZ(meta, &sm[0])
	case levelAVX2:
		halfPairsY(meta, &sm[0])
	default:
		return false
	}
	return true
}
