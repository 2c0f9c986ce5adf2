//go:build amd64 && !purego

package tensor

import "unsafe"

var floatKernelsZ = floatKernels{
	mr: 16,
	kern: []kernFunc{
		nil, kernF32Zm1, kernF32Zm2, kernF32Zm3, kernF32Zm4, kernF32Zm5, kernF32Zm6, kernF32Zm7,
		kernF32Zm8, kernF32Zm9, kernF32Zm10, kernF32Zm11, kernF32Zm12, kernF32Zm13, kernF32Zm14, kernF32Zm15,
		kernF32Zm16,
	},
	kernF: []kernFunc{
		nil, kernF32FZm1, kernF32FZm2, kernF32FZm3, kernF32FZm4, kernF32FZm5, kernF32FZm6, kernF32FZm7,
		kernF32FZm8, kernF32FZm9, kernF32FZm10, kernF32FZm11, kernF32FZm12, kernF32FZm13, kernF32FZm14, kernF32FZm15,
		kernF32FZm16,
	},
	half: [2][]halfKernFunc{
		{
			nil, kernF16Zm1, kernF16Zm2, kernF16Zm3, kernF16Zm4, kernF16Zm5, kernF16Zm6, kernF16Zm7,
			kernF16Zm8, kernF16Zm9, kernF16Zm10, kernF16Zm11, kernF16Zm12, kernF16Zm13, kernF16Zm14, kernF16Zm15,
			kernF16Zm16,
		},
		{
			nil, kernBF16Zm1, kernBF16Zm2, kernBF16Zm3, kernBF16Zm4, kernBF16Zm5, kernBF16Zm6, kernBF16Zm7,
			kernBF16Zm8, kernBF16Zm9, kernBF16Zm10, kernBF16Zm11, kernBF16Zm12, kernBF16Zm13, kernBF16Zm14, kernBF16Zm15,
			kernBF16Zm16,
		},
	},
	pack: [3]packFunc{packF32Z, packF16Z, packBF16Z},
}

var floatKernelsY = floatKernels{
	mr: 6,
	kern: []kernFunc{
		nil, kernF32Ym1, kernF32Ym2, kernF32Ym3, kernF32Ym4, kernF32Ym5, kernF32Ym6,
	},
	kernF: []kernFunc{
		nil, kernF32FYm1, kernF32FYm2, kernF32FYm3, kernF32FYm4, kernF32FYm5, kernF32FYm6,
	},
	half: [2][]halfKernFunc{
		{
			nil, kernF16Ym1, kernF16Ym2, kernF16Ym3, kernF16Ym4, kernF16Ym5, kernF16Ym6,
		},
		{
			nil, kernBF16Ym1, kernBF16Ym2, kernBF16Ym3, kernBF16Ym4, kernBF16Ym5, kernBF16Ym6,
		},
	},
	pack: [3]packFunc{packF32Y, packF16Y, packBF16Y},
}

type matvecHFunc func(w unsafe.Pointer, ldw int, x *float32, n int, rows int, dst *float32)

// matvecH returns the one-row-at-a-time matrix-vector kernel of the level
// in use (nil: plain Go), in Dot's order (DotRows).
func matvecH(t DType) matvecHFunc {
	switch {
	case level == levelAVX512 && t == F32:
		return matvecHF32Z
	case level == levelAVX2 && t == F32:
		return matvecHF32Y
	case level == levelAVX512 && t == F16:
		return matvecHF16Z
	case level == levelAVX512 && t == BF16:
		return matvecHBF16Z
	case level == levelAVX2 && t == F16:
		return matvecHF16Y
	case level == levelAVX2 && t == BF16:
		return matvecHBF16Y
	}
	return nil
}

type matvecPFunc func(w unsafe.Pointer, x *float32, nb int, dst *float32)

// matvecP returns the AVX-512 kernel for the 16 rows of a panel of an F16
// or BF16 panel matrix (NewPanelMatrix) times one vector, in Dot's order
// per row; nil at other levels (panels are then read row by row).
func matvecP(t DType) matvecPFunc {
	switch {
	case level == levelAVX512 && t == F16:
		return matvecPF16Z
	case level == levelAVX512 && t == BF16:
		return matvecPBF16Z
	}
	return nil
}

// floatKern returns the float kernels of the level in use (nil: plain Go).
func floatKern() *floatKernels {
	switch level {
	case levelAVX512:
		return &floatKernelsZ
	case levelAVX2:
		return &floatKernelsY
	}
	return nil
}

// dotLanes is the sixteen-lane part of Dot over the first n values (n a
// positive multiple of 16, len(a), len(b) >= n).
func dotLanes(a, b []float32, n int) float32 {
	if level == levelAVX512 {
		return dotZ(&a[0], &b[0], n)
	}
	if level == levelAVX2 {
		return dotY(&a[0], &b[0], n)
	}
	return dotLanesGo(a[:n], b[:n])
}

func axpyLanes(dst []float32, a float32, x []float32, n int) {
	if level == levelAVX512 {
		axpyZ(&dst[0], &x[0], a, n)
	} else if level == levelAVX2 {
		axpyY(&dst[0], &x[0], a, n)
	} else {
		axpyGo(dst[:n], a, x[:n])
	}
}

func memRead(p []byte) uint64 {
	if level == levelAVX512 {
		return memReadZ(&p[0], len(p))
	}
	return memReadGo(p)
}

func swigluLanes(dst, gate, up []float32) {
	switch level {
	case levelAVX512:
		swigluZ(&dst[0], &gate[0], &up[0], len(dst))
	case levelAVX2:
		swigluY(&dst[0], &gate[0], &up[0], len(dst))
	default:
		swigluGo(dst, gate, up)
	}
}

// quantActRow quantizes the nb blocks of one activation row with the
// AVX-512 kernels (blocks stride bytes apart) and reports whether it did:
// not below AVX-512, nor for a row holding an Inf or a NaN, which the Go
// code then quantizes (it defines the result there).
func quantActRow(bs int, row []float32, dst []byte, nb, stride int, corr int32) bool {
	if level != levelAVX512 {
		return false
	}
	var maxBits uint32
	if bs == QK_K {
		_ = dst[(nb-1)*stride+xbK-1]
		maxBits = actQKZ(&row[0], &dst[0], nb, stride)
	} else {
		_ = dst[(nb-1)*stride+xb32-1]
		maxBits = actQ32Z(&row[0], &dst[0], nb, stride, -corr)
	}
	return maxBits < 0x7f800000
}

// prefetch asks for the first n bytes of rows rows ld bytes apart from p.
func prefetch(p unsafe.Pointer, ld, rows, n int) {
	if level >= levelAVX2 {
		prefetchRows(p, ld, rows, n)
	}
}

// Prefetch asks for the bytes of b (into L2), a 64-byte line at a time.
func Prefetch(b []byte) {
	if len(b) > 0 {
		prefetch(unsafe.Pointer(&b[0]), 0, 1, len(b))
	}
}
