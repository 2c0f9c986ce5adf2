package tensor

import "math"

// fma32 is the fused multiply-add a·b + c rounded once to float32 (round
// to nearest even), as VFMADD*PS computes it. a·b is exact in float64; the
// float64 sum is corrected when its rounding to float32 would be a double
// rounding (the float64 sum exactly halfway between two float32 values
// while the exact sum is not). Results beyond the float32 range are ±Inf
// as float32(float64) gives them.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	s := p + float64(c)
	// In float32's normal range (and beyond: ±Inf, NaN) float32(s) drops the
	// low 29 bits of s's significand; unless they are exactly one half (a
	// tie), the exact sum, within half a float64 step of s, rounds the same
	// (every float32 tie is a float64): the common case, without the error
	// term, small enough to inline.
	if u := math.Float64bits(s); u&(1<<29-1) != 1<<28 && u>>52&0x7ff >= 1023-126 {
		return float32(s)
	}
	return fma32Rare(p, s, c)
}

// fma32Rare is fma32 when float32(s) may be a double rounding: s = p + c
// rounded to float64, p = a·b exact.
func fma32Rare(p, s float64, c float32) float32 {
	f := float32(s)
	if float64(f) == s || math.IsInf(s, 0) || s != s {
		return f
	}
	// e: the rounding error of s (TwoSum).
	bv := s - p
	e := (p - (s - bv)) + (float64(c) - bv)
	if e == 0 {
		return f
	}
	// g: f's float32 neighbour on the other side of s.
	var g float32
	if float64(f) < s {
		g = math.Nextafter32(f, float32(math.Inf(1)))
	} else {
		g = math.Nextafter32(f, float32(math.Inf(-1)))
	}
	if (float64(f)+float64(g))/2 != s {
		return f // s is not a tie: f is the rounding of the exact sum too
	}
	if (float64(g) > float64(f)) == (e > 0) {
		return g
	}
	return f
}
