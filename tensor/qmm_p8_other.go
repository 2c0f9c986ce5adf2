//go:build !amd64 || purego

package tensor

// qp8Kern returns the 8-row kernels for weights of type t (Q8_0, Q4_0):
// ks[T-1] takes T tokens.
func qp8Kern(t DType) []qp8Func { return qp8Go[t] }

// qp8Kern16: no 16-token kernel in the plain Go build (p8Tiles runs the
// twins of qp8Kern in turn, with the same results).
func qp8Kern16(t DType) qp8Func { return nil }

// qp8Kern32: nor a 32-token one.
func qp8Kern32(t DType) qp8Func { return nil }

// qp16Kern, qp16Kern16: no 16-row kernels in the plain Go build.
func qp16Kern(t DType) []qp8Func { return nil }
func qp16Kern16(t DType) qp8Func { return nil }

// quantActRowP: the plain Go build has no activation kernel.
func quantActRowP(row []float32, dst []byte, nb, stride int, c int32) bool { return false }
