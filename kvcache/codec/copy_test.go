package codec

import (
	"math/rand/v2"
	"slices"
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

// TestMoveSlots: moving a run of slots down inside a block in bulk gives
// what copying them slot by slot in ascending order gives (every slot
// decodes alike but the vacated ones, which are undefined), for every
// codec and kind (and the shifted q8 and q4 keys), blocks of 16 and 32
// slots, every shift and run that fits; codecs without a bulk path say so
// and leave the block untouched. One bulk path at least must be taken.
func TestMoveSlots(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const d = 24
	mu := make([]float32, d)
	for j := range mu {
		mu[j] = float32(rng.NormFloat64())
	}
	type tc struct {
		name string
		c    Codec
	}
	var cases []tc
	for _, name := range Names {
		for _, kind := range []Kind{Keys, Values} {
			c, err := Parse(name, kind)
			if err != nil {
				t.Fatal(err)
			}
			cases = append(cases, tc{name + "/" + kind.String(), c})
			if c.Shiftable() {
				cases = append(cases, tc{name + "/" + kind.String() + " shifted", Base(Shifted(c, mu))})
			}
		}
	}
	bulk := 0
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			c := k.c
			if !c.PerToken() {
				if MoveSlots(c, make([]byte, c.BlockBytes(16, d)), 16, d, 0, 1, 2) {
					t.Fatal("a grouped codec claims bulk slot moves")
				}
				return
			}
			for _, n := range []int{16, 32} {
				block := make([]byte, c.BlockBytes(n, d))
				x := make([]float32, d)
				for i := range n {
					for j := range x {
						x[j] = float32(rng.NormFloat64())
					}
					c.Put(block, n, d, i, x)
				}
				for src := 1; src < n; src++ {
					for dst := 0; dst < src; dst++ {
						for cnt := 1; src+cnt <= n; cnt += 3 {
							got := append([]byte(nil), block...)
							ok := MoveSlots(c, got, n, d, dst, src, cnt)
							want := append([]byte(nil), block...)
							if ok {
								bulk++
								for j := range cnt {
									CopySlot(c, want, n, dst+j, want, n, src+j, d)
								}
							}
							// Every slot but the vacated ones decodes as
							// after slot-by-slot copies.
							a, b := make([]float32, d), make([]float32, d)
							for i := range n {
								if i >= dst+cnt && i < src+cnt {
									continue
								}
								c.Get(got, n, d, i, a)
								c.Get(want, n, d, i, b)
								if !slices.Equal(a, b) {
									t.Fatalf("n %d: moving %d slots from %d to %d (bulk %v): slot %d differs from slot-by-slot copies", n, cnt, src, dst, ok, i)
								}
							}
						}
					}
				}
			}
		})
	}
	if bulk == 0 {
		t.Fatal("no codec moved slots in bulk: the test shows nothing")
	}
}
