package tensor

import (
	"math/rand"
	"testing"
)

// The row operations equal the one-row functions bit for bit, for any row
// count (groups of four and leftovers, one worker or several) and aliasing.
func TestRowOps(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	fill := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64()) * 3
		}
		return v
	}
	for _, d := range []int{1, 7, 64, 2048} {
		for _, n := range []int{1, 2, 3, 4, 5, 8, 9, 16, 17} {
			x, y, w := fill(n*d), fill(n*d), fill(d)
			const eps = 1e-5
			// RMSNormRows into a separate dst and in place.
			want := make([]float32, n*d)
			for i := 0; i < n; i++ {
				RMSNorm(want[i*d:(i+1)*d], x[i*d:(i+1)*d], w, eps)
			}
			got := make([]float32, n*d)
			RMSNormRows(got, x, w, eps, n, d)
			same(t, "RMSNormRows", d, n, got, want)
			xc := append([]float32(nil), x...)
			RMSNormRows(xc, xc, w, eps, n, d)
			same(t, "RMSNormRows in place", d, n, xc, want)
			// AddRMSNormRows with dst aliasing y, as finishLayer calls it.
			wx := append([]float32(nil), x...)
			Add(wx, y)
			for i := 0; i < n; i++ {
				RMSNorm(want[i*d:(i+1)*d], wx[i*d:(i+1)*d], w, eps)
			}
			gx, gy := append([]float32(nil), x...), append([]float32(nil), y...)
			AddRMSNormRows(gy, gx, gy, w, eps, n, d)
			same(t, "AddRMSNormRows x", d, n, gx, wx)
			same(t, "AddRMSNormRows dst", d, n, gy, want)
			gx = append(gx[:0], x...)
			AddRows(gx, y, n, d)
			same(t, "AddRows", d, n, gx, wx)
		}
	}
}

func same(t *testing.T, what string, d, n int, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s d=%d n=%d: [%d] = %v, want %v", what, d, n, i, got[i], want[i])
		}
	}
}

func BenchmarkRMSNormRows16x2048(b *testing.B) {
	const n, d = 16, 2048
	x, w, dst := make([]float32, n*d), make([]float32, d), make([]float32, n*d)
	for i := range x {
		x[i] = float32(i%97) * 0.01
	}
	for i := range w {
		w[i] = 1
	}
	b.Run("loop", func(b *testing.B) {
		for b.Loop() {
			for t := 0; t < n; t++ {
				RMSNorm(dst[t*d:(t+1)*d], x[t*d:(t+1)*d], w, 1e-5)
			}
		}
	})
	b.Run("range", func(b *testing.B) {
		for b.Loop() {
			rmsNormRange(dst, x, w, 1e-5, 0, n, d)
		}
	})
	b.Run("rows", func(b *testing.B) {
		for b.Loop() {
			RMSNormRows(dst, x, w, 1e-5, n, d)
		}
	})
}
