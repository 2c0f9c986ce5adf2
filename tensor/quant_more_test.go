package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

var moreTypes = []DType{Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS}

// dequantActs returns the float values a quantized activation row of nb
// blocks stands for (act.go's layouts: per-lane scales for xb32, one
// scale for xbK).
func dequantActs(t DType, act []byte, nb int) []float64 {
	bs, xb := actLayout(t)
	out := make([]float64, 0, nb*bs)
	for b := 0; b < nb; b++ {
		blk := act[b*xb:]
		for i := 0; i < bs; i++ {
			var d float32
			if bs == 32 {
				d = f32at(blk[xb32D+4*(i/4):])
			} else {
				d = f32at(blk[xbKD:])
			}
			out = append(out, float64(int8(blk[i]))*float64(d))
		}
	}
	return out
}

// TestMoreDotMatchesDequant: the integer kernels of quant_more.go's types
// (decode rows and the 4×4 prefill tiles) equal, up to float32 rounding,
// the float64 sum of the dequantized weights (Dequantize) times the
// dequantized 8-bit activations: a value at the wrong place, a wrong
// scale or min, moves the sum by far more than the bound.
func TestMoreDotMatchesDequant(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, typ := range moreTypes {
		t.Run(typ.String(), func(t *testing.T) {
			for _, nb := range []int{1, 3} {
				bs, xb := actLayout(typ)
				cols, rows, n := nb*typ.BlockSize(), 5, 6
				m := randRawMatrix(r, typ, rows, cols)
				x := randF32(r, n*cols)
				got := make([]float32, n*rows)
				m.MatMul(got, x, n)
				got1 := make([]float32, rows)
				m.MatMul(got1, x, 1)
				w := make([]float32, cols)
				for tok := 0; tok < n; tok++ {
					act := make([]byte, cols/bs*xb)
					quantizeActs(typ, act, x[tok*cols:(tok+1)*cols], cols, [][2]int{{0, 1}})
					a := dequantActs(typ, act, cols/bs)
					for row := 0; row < rows; row++ {
						m.Row(row, w)
						var want, mag float64
						for i := range w {
							want += float64(w[i]) * a[i]
							mag += math.Abs(float64(w[i]) * a[i])
						}
						check := func(what string, v float32) {
							if e := math.Abs(float64(v) - want); e > 1e-5*mag+1e-30 {
								t.Fatalf("%s nb=%d token %d row %d: %g, want %.8g (err %.3g, Σ|w·x| %.3g)", what, nb, tok, row, v, want, e, mag)
							}
						}
						check(fmt.Sprintf("%d tokens", n), got[tok*rows+row])
						if tok == 0 {
							check("1 token", got1[row])
						}
					}
				}
			}
		})
	}
}
