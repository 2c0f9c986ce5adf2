//go:build amd64 && !purego

package tensor

// qp8V and qp8A are the AVX-512 VNNI and AVX2 kernels of qmm_p8.go for
// 1..8 tokens.
var (
	qp8V = map[DType][]qp8Func{
		Q8_0: {qQ8_0Vp8t1, qQ8_0Vp8t2, qQ8_0Vp8t3, qQ8_0Vp8t4, qQ8_0Vp8t5, qQ8_0Vp8t6, qQ8_0Vp8t7, qQ8_0Vp8t8},
		Q4_0: {qQ4_0Vp8t1, qQ4_0Vp8t2, qQ4_0Vp8t3, qQ4_0Vp8t4, qQ4_0Vp8t5, qQ4_0Vp8t6, qQ4_0Vp8t7, qQ4_0Vp8t8},
	}
	// qp8V16: the AVX-512 VNNI kernels for 16 tokens (two groups of 8,
	// each block's weights transposed once for both).
	qp8V16 = map[DType]qp8Func{Q8_0: qQ8_0Vp8t16, Q4_0: qQ4_0Vp8t16}
	// qp16V and qp16V16: the 16-row AVX-512 VNNI kernels (ZMM lanes) for
	// 1..8 and 16 tokens.
	qp16V = map[DType][]qp8Func{
		Q8_0: {qQ8_0Vp16t1, qQ8_0Vp16t2, qQ8_0Vp16t3, qQ8_0Vp16t4, qQ8_0Vp16t5, qQ8_0Vp16t6, qQ8_0Vp16t7, qQ8_0Vp16t8},
		Q4_0: {qQ4_0Vp16t1, qQ4_0Vp16t2, qQ4_0Vp16t3, qQ4_0Vp16t4, qQ4_0Vp16t5, qQ4_0Vp16t6, qQ4_0Vp16t7, qQ4_0Vp16t8},
	}
	qp16V16 = map[DType]qp8Func{Q8_0: qQ8_0Vp16t16, Q4_0: qQ4_0Vp16t16}
	qp8A    = map[DType][]qp8Func{
		Q8_0: {qQ8_0Ap8t1, qQ8_0Ap8t2, qQ8_0Ap8t3, qQ8_0Ap8t4, qQ8_0Ap8t5, qQ8_0Ap8t6, qQ8_0Ap8t7, qQ8_0Ap8t8},
		Q4_0: {qQ4_0Ap8t1, qQ4_0Ap8t2, qQ4_0Ap8t3, qQ4_0Ap8t4, qQ4_0Ap8t5, qQ4_0Ap8t6, qQ4_0Ap8t7, qQ4_0Ap8t8},
	}
	// qp8A16 and qp8A32: the AVX2 kernels for 16 and 32 tokens (each
	// block's weights transposed once for all, accumulators in acc).
	qp8A16 = map[DType]qp8Func{Q8_0: qQ8_0Ap8t16, Q4_0: qQ4_0Ap8t16}
	qp8A32 = map[DType]qp8Func{Q8_0: qQ8_0Ap8t32, Q4_0: qQ4_0Ap8t32}
)

// qp8Kern returns the 8-row kernels for weights of type t (Q8_0, Q4_0) at
// the level in use: ks[T-1] takes T tokens.
func qp8Kern(t DType) []qp8Func {
	switch {
	case level == levelAVX512 && cpuVNNI:
		return qp8V[t]
	case level >= levelAVX2:
		return qp8A[t]
	}
	return qp8Go[t]
}

// qp8Kern16 returns the 16-token 8-row kernel for weights of type t at the
// level in use, or nil where there is none (p8Tiles then runs ks in turn).
func qp8Kern16(t DType) qp8Func {
	switch {
	case level == levelAVX512 && cpuVNNI:
		return qp8V16[t]
	case level >= levelAVX2:
		return qp8A16[t]
	}
	return nil
}

// qp8Kern32 returns the 32-token 8-row kernel for weights of type t at the
// level in use, or nil: AVX2 only (and AVX-512 without VNNI), where the
// transposition is a larger share of the work (1.08× Q8_0, 1.12× Q4_0
// the 16-token kernel at 64 tokens); AVX-512 VNNI stops at 16.
func qp8Kern32(t DType) qp8Func {
	if level >= levelAVX2 && !(level == levelAVX512 && cpuVNNI) {
		return qp8A32[t]
	}
	return nil
}

// qp16Kern returns the 16-row kernels for weights of type t at the level
// in use (1..8 tokens), or nil where there are none.
func qp16Kern(t DType) []qp8Func {
	if level == levelAVX512 && cpuVNNI {
		return qp16V[t]
	}
	return nil
}

// qp16Kern16 returns the 16-row 16-token kernel (with qp16Kern).
func qp16Kern16(t DType) qp8Func {
	if level == levelAVX512 && cpuVNNI {
		return qp16V16[t]
	}
	return nil
}

// quantActRowP quantizes the nb blocks of one token (quantActP's values,
// blocks stride bytes apart from dst) with the AVX-512 kernel and reports
// whether it did: not below AVX-512, nor for a row holding an Inf or a
// NaN, which the Go code then quantizes.
func quantActRowP(row []float32, dst []byte, nb, stride int, c int32) bool {
	if level != levelAVX512 {
		return false
	}
	_ = row[nb*32-1]
	_ = dst[(nb-1)*stride+xbP-1]
	return actQPZ(&row[0], &dst[0], nb, stride, -c) < 0x7f800000
}
