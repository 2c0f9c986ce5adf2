//go:build !amd64 || purego

package tensor

// qp8Kern returns the 8-row kernels for weights of type t (Q8_0, Q4_0):
// ks[T-1] takes T tokens.
func qp8Kern(t DType) []qp8Func { return qp8Go[t] }
