package tensor

import "math"

// Row-wise operations over n rows of width d (the per-token steps of a
// batched decode or a prefill chunk), the rows split across the worker
// pool. Each row is computed exactly as the one-row function does, so the
// results are bit for bit those of a loop over the rows.

// rowGrain is the fewest rows a worker takes for row operations of width
// d: four (rmsNormRange's group) and about 8192 values, so that narrow
// rows do not pay a parallel region each for little work.
func rowGrain(d int) int { return max(4, 8192/max(d, 1)) }

// RMSNormRows writes RMSNorm(x row t, w, eps) to dst row t for t < n
// (dst may alias x).
func RMSNormRows(dst, x, w []float32, eps float32, n, d int) {
	Parallel(n, rowGrain(d), func(lo, hi int) { rmsNormRange(dst, x, w, eps, lo, hi, d) })
}

// rmsNormRange is RMSNormRows for rows [lo,hi) on the calling goroutine:
// four rows at a time, their sums of squares interleaved (four independent
// chains, each summed in RMSNorm's order, so each row is bit for bit
// RMSNorm's).
func rmsNormRange(dst, x, w []float32, eps float32, lo, hi, d int) {
	t := lo
	for ; t+4 <= hi; t += 4 {
		x0 := x[t*d : (t+1)*d]
		x1 := x[(t+1)*d : (t+2)*d]
		x2 := x[(t+2)*d : (t+3)*d]
		x3 := x[(t+3)*d : (t+4)*d]
		x1, x2, x3 = x1[:len(x0)], x2[:len(x0)], x3[:len(x0)]
		var s0, s1, s2, s3 float32
		for i, v := range x0 {
			v1, v2, v3 := x1[i], x2[i], x3[i]
			s0 += float32(v * v)
			s1 += float32(v1 * v1)
			s2 += float32(v2 * v2)
			s3 += float32(v3 * v3)
		}
		for r, ss := range [4]float32{s0, s1, s2, s3} {
			rmsScale(dst[(t+r)*d:(t+r+1)*d], x[(t+r)*d:(t+r+1)*d], w, eps, ss)
		}
	}
	for ; t < hi; t++ {
		RMSNorm(dst[t*d:(t+1)*d], x[t*d:(t+1)*d], w, eps)
	}
}

// rmsScale finishes RMSNorm of x given its sum of squares ss, exactly as
// RMSNorm does.
func rmsScale(dst, x, w []float32, eps, ss float32) {
	ss /= float32(len(x))
	ss += eps
	inv := 1 / float32(math.Sqrt(float64(ss)))
	w = w[:len(x)]
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = w[i] * (inv * v)
	}
}

// AddRMSNormRows adds y to x row by row (x += y, as Add), then writes
// RMSNorm(x row t, w, eps) to dst row t, for t < n. dst may alias x or y.
func AddRMSNormRows(dst, x, y, w []float32, eps float32, n, d int) {
	Parallel(n, rowGrain(d), func(lo, hi int) {
		// The rows of y are read before dst (which may alias y) is written.
		Add(x[lo*d:hi*d], y[lo*d:hi*d])
		rmsNormRange(dst, x, w, eps, lo, hi, d)
	})
}

// AddRows adds y to x for n rows of width d (x += y, as Add).
func AddRows(x, y []float32, n, d int) {
	Parallel(n, rowGrain(d), func(lo, hi int) {
		Add(x[lo*d:hi*d], y[lo*d:hi*d])
	})
}
