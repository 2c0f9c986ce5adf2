//go:build amd64 && !purego

package tensor

// qp8V and qp8A are the AVX-512 VNNI (1..8 tokens) and AVX2 (1..4
// tokens) kernels of qmm_p8.go.
var (
	qp8V = map[DType][]qp8Func{
		Q8_0: {qQ8_0Vp8t1, qQ8_0Vp8t2, qQ8_0Vp8t3, qQ8_0Vp8t4, qQ8_0Vp8t5, qQ8_0Vp8t6, qQ8_0Vp8t7, qQ8_0Vp8t8},
		Q4_0: {qQ4_0Vp8t1, qQ4_0Vp8t2, qQ4_0Vp8t3, qQ4_0Vp8t4, qQ4_0Vp8t5, qQ4_0Vp8t6, qQ4_0Vp8t7, qQ4_0Vp8t8},
	}
	qp8A = map[DType][]qp8Func{
		Q8_0: {qQ8_0Ap8t1, qQ8_0Ap8t2, qQ8_0Ap8t3, qQ8_0Ap8t4},
		Q4_0: {qQ4_0Ap8t1, qQ4_0Ap8t2, qQ4_0Ap8t3, qQ4_0Ap8t4},
	}
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
