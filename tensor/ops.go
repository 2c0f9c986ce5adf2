package tensor

import "math"

// Dot is the inner product of a and b (len(b) >= len(a)), summed in order
// as llama2.c's run.c does: the plain reference that faster kernels are
// compared against.
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0 float32
	for i := range a {
		s0 += a[i] * b[i]
	}
	return s0
}

// Axpy adds a·x to dst.
func Axpy(dst []float32, a float32, x []float32) {
	x = x[:len(dst)]
	for i, v := range x {
		dst[i] += a * v
	}
}

// Add adds x to dst element-wise.
func Add(dst, x []float32) {
	x = x[:len(dst)]
	for i, v := range x {
		dst[i] += v
	}
}

// RMSNorm writes w ⊙ x / sqrt(mean(x²) + eps) to dst (dst may alias x).
func RMSNorm(dst, x, w []float32, eps float32) {
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	ss /= float32(len(x))
	ss += eps
	inv := 1 / float32(math.Sqrt(float64(ss)))
	w = w[:len(x)]
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = w[i] * (inv * v)
	}
}

// SwiGLU writes silu(gate) ⊙ up to dst.
func SwiGLU(dst, gate, up []float32) {
	up = up[:len(gate)]
	dst = dst[:len(gate)]
	for i, g := range gate {
		g *= 1 / (1 + float32(math.Exp(float64(-g))))
		dst[i] = g * up[i]
	}
}
