package tensor

import (
	"math"
	"unsafe"
)

// Dot is the inner product of a and b (len(b) >= len(a)), summed in an
// order that is fixed whatever the kernel set: the first 16·⌊n/16⌋
// products go into sixteen lanes (lane l sums the products i ≡ l mod 16 in
// order), the lanes are added as a fixed tree (dotLanesGo), and the last
// n mod 16 products are added to that one by one. Vectors shorter than 16
// values are thus summed in order, as llama2.c's run.c does. Every product
// and sum is rounded to float32 (no fused multiply-add).
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	n16 := len(a) &^ 15
	var s float32
	if n16 > 0 {
		s = dotLanes(a, b, n16)
	}
	for i := n16; i < len(a); i++ {
		s += float32(a[i] * b[i])
	}
	return s
}

// DotRows sets dst[i] = Dot(a[i·d:(i+1)·d], q) for i < len(dst): one call
// for many dot products with the same vector (attention scores over a
// block of keys), bit for bit equal to calling Dot for each.
func DotRows(dst, a []float32, d int, q []float32) {
	n := len(dst)
	if n == 0 {
		return
	}
	_ = a[n*d-1]
	q = q[:d]
	d16 := d &^ 15
	k := matvecH(F32)
	if k == nil || d16 == 0 {
		for i := range dst {
			dst[i] = Dot(a[i*d:(i+1)*d], q)
		}
		return
	}
	k(unsafe.Pointer(&a[0]), 4*d, &q[0], d16, n, &dst[0])
	if d16 == d {
		return
	}
	for i := range dst {
		s := dst[i]
		row := a[i*d : (i+1)*d]
		for j := d16; j < d; j++ {
			s += float32(row[j] * q[j])
		}
		dst[i] = s
	}
}

// dotLanesGo is the plain Go twin of the Dot kernels (len(a) a multiple of
// 16, len(b) >= len(a)).
func dotLanesGo(a, b []float32) float32 {
	var l [16]float32
	b = b[:len(a)]
	for i := 0; i+16 <= len(a); i += 16 {
		for j := range l {
			l[j] += float32(a[i+j] * b[i+j])
		}
	}
	for j := 0; j < 8; j++ {
		l[j] += l[j+8]
	}
	for j := 0; j < 4; j++ {
		l[j] += l[j+4]
	}
	l[0] += l[2]
	l[1] += l[3]
	return l[0] + l[1]
}

// dotSeq sums the products in order, as llama2.c's run.c does: the plain Go
// matrix product, which the float matmul kernels reproduce exactly.
// (The explicit float32 conversions keep the compiler from fusing a
// multiply and an add, which it may do on GOAMD64=v3.)
func dotSeq(a, b []float32) float32 {
	b = b[:len(a)]
	var s0 float32
	for i := range a {
		s0 += float32(a[i] * b[i])
	}
	return s0
}

// dotFMA is the in-order dot product with one fused multiply-add per
// product (s = a[i]·b[i] + s, rounded once, as fma32 with its common case
// written out): the plain Go twin of the half-float product kernels.
func dotFMA(a, b []float32) float32 {
	b = b[:len(a)]
	var s float32
	for i := range a {
		p := float64(a[i]) * float64(b[i])
		t := p + float64(s)
		if u := math.Float64bits(t); u&(1<<29-1) != 1<<28 && u>>52&0x7ff >= 1023-126 {
			s = float32(t)
			continue
		}
		s = fma32Rare(p, t, s)
	}
	return s
}

// Axpy adds a·x to dst (each element a product and a sum, rounded to
// float32).
func Axpy(dst []float32, a float32, x []float32) {
	x = x[:len(dst)]
	n16 := len(dst) &^ 15
	if n16 > 0 {
		axpyLanes(dst, a, x, n16)
	}
	for i := n16; i < len(dst); i++ {
		dst[i] += float32(a * x[i])
	}
}

func axpyGo(dst []float32, a float32, x []float32) {
	x = x[:len(dst)]
	for i, v := range x {
		dst[i] += float32(a * v)
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
		ss += float32(v * v)
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

// SwiGLU writes silu(gate) ⊙ up to dst, silu(g) = g·(1/(1+e^-g)) in
// float32 steps as llama2.c's run.c, with e^-g from exp64 (exp.go). Long
// inputs are split across the worker pool.
func SwiGLU(dst, gate, up []float32) {
	up = up[:len(gate)]
	dst = dst[:len(gate)]
	Parallel(len(gate), 16384, func(lo, hi int) {
		n8 := lo + (hi-lo)&^7
		if n8 > lo {
			swigluLanes(dst[lo:n8], gate[lo:n8], up[lo:n8])
		}
		swigluGo(dst[n8:hi], gate[n8:hi], up[n8:hi])
	})
}
