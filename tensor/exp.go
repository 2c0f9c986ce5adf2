package tensor

import "math"

// The exponential of SwiGLU's sigmoid, computed in float64 and rounded to
// float32, as float32(math.Exp(x)) (and llama2.c's expf) is, but by an
// algorithm the SIMD kernels repeat operation for operation, so the plain
// Go twin and the kernels agree bit for bit: x clamped to [-104, 89]
// (beyond, the float32 result is 0 or +Inf anyway), k = round-half-even(
// x·log2(e)), r = x - k·ln2 (two fused steps, ln2 split in a high and a low
// part), e^r by its Taylor polynomial of degree 13 in Horner form (fused
// multiply-adds; |r| ≤ 0.35, truncation error below 4e-18), times 2^k.
// Its float32 rounding is float32(math.Exp(x)) except, at worst, when
// e^x lies within a few float64 ulps of a float32 rounding boundary.

const (
	expLo    = -104
	expHi    = 89
	expLog2e = 1.4426950408889634
	expLn2Hi = 6.93147180369123816490e-01 // 0x3FE62E42FEE00000
	expLn2Lo = 1.90821492927058770002e-10 // 0x3DEA39EF35793C76
)

// expC[n] = 1/n!, computed as c[n-1]/n (asmgen computes the same).
var expC = func() (c [14]float64) {
	c[0] = 1
	for n := 1; n < len(c); n++ {
		c[n] = c[n-1] / float64(n)
	}
	return c
}()

// exp64 is e^x for SwiGLU (see above); its result is meant to be rounded to
// float32.
func exp64(x float64) float64 {
	if x != x {
		return x
	}
	x = max(expLo, min(expHi, x))
	k := math.RoundToEven(float64(x * expLog2e))
	r := math.FMA(-k, expLn2Hi, x)
	r = math.FMA(-k, expLn2Lo, r)
	p := expC[13]
	for n := 12; n >= 0; n-- {
		p = math.FMA(p, r, expC[n])
	}
	return p * math.Float64frombits(uint64(int64(k)+1023)<<52)
}

// silu is g·sigmoid(g) in llama2.c's float32 steps: g·(1/(1+e^-g)).
func silu(g float32) float32 {
	e := float32(exp64(-float64(g)))
	return g * (1 / (1 + e))
}

// swigluGo is the plain Go twin of the SwiGLU kernels.
func swigluGo(dst, gate, up []float32) {
	up = up[:len(gate)]
	dst = dst[:len(gate)]
	for i, g := range gate {
		dst[i] = silu(g) * up[i]
	}
}
