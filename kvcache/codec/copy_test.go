package codec

import (
	"math/rand/v2"
	"testing"
)

func TestCopySlot(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	const d = 64
	for _, name := range Names {
		for _, kind := range []Kind{Keys, Values} {
			c, err := Parse(name, kind)
			if err != nil {
				t.Fatal(err)
			}
			if !c.PerToken() {
				if CopySlot(c, nil, 0, 0, nil, 0, 0, d) {
					t.Errorf("%s %s: grouped codec claims slot copies", name, kind)
				}
				continue
			}
			src := make([]byte, c.BlockBytes(16, d))
			dst := make([]byte, c.BlockBytes(4, d))
			x := make([]float32, d)
			for i := 0; i < 16; i++ {
				for j := range x {
					x[j] = float32(rng.NormFloat64())
				}
				c.Put(src, 16, d, i, x)
			}
			if !CopySlot(c, dst, 4, 2, src, 16, 11, d) {
				t.Fatalf("%s: no slot copy", name)
			}
			a, b := make([]float32, d), make([]float32, d)
			c.Get(src, 16, d, 11, a)
			c.Get(dst, 4, d, 2, b)
			for j := range a {
				if a[j] != b[j] {
					t.Fatalf("%s %s: copied slot decodes to %v, want %v", name, kind, b[j], a[j])
				}
			}
		}
	}
}
