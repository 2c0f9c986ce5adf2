package tensor

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// fma32Big is a·b + c rounded once to float32 with math/big.
func fma32Big(a, b, c float32) float32 {
	x := new(big.Float).SetPrec(0).SetMode(big.ToNearestEven)
	x.SetFloat64(float64(a))
	x.SetPrec(200)
	x.Mul(x, new(big.Float).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetFloat64(float64(c)))
	f, _ := x.Float32()
	return f
}

func TestFMA32(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	rnd := func() float32 {
		switch r.IntN(4) {
		case 0:
			return float32(r.NormFloat64())
		case 1:
			return float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(80)-40)))
		case 2:
			return math.Float32frombits(r.Uint32()&^(0xff<<23) | uint32(r.IntN(254)+1)<<23)
		}
		return float32(r.IntN(1000) - 500)
	}
	for i := 0; i < 300000; i++ {
		a, b, c := rnd(), rnd(), rnd()
		if i%3 == 0 {
			// c close to -a·b: cancellation
			c = -float32(float64(a) * float64(b))
		}
		if i%7 == 0 {
			// a tie in float64: a·b = half an ulp of c
			c = float32(1 << 24)
			a, b = 0.5, 1+float32(r.IntN(4))/4096
		}
		got, want := fma32(a, b, c), fma32Big(a, b, c)
		if !sameBits(got, want) {
			t.Fatalf("fma32(%g, %g, %g) = %g, want %g", a, b, c, got, want)
		}
	}
	// A double-rounding case: the float64 sum is a float32 tie.
	a, b, c := float32(1+1.0/(1<<23)), float32(1+1.0/(1<<23)), float32(-1.0/(1<<22))
	if got, want := fma32(a, b, c), fma32Big(a, b, c); got != want {
		t.Errorf("tie: %g, want %g", got, want)
	}
}
