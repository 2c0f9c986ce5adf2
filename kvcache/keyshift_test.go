package kvcache

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// testShift is a key shift for layout l (nil unless on): small offsets, so
// the codec tolerances of the tests that use it still hold.
func testShift(l Layout, on bool) [][]float32 {
	if !on {
		return nil
	}
	r := rand.New(rand.NewPCG(21, 22))
	out := make([][]float32, l.Layers*l.KVHeads)
	for i := range out {
		out[i] = make([]float32, l.HeadDim)
		for c := range out[i] {
			out[i][c] = float32(0.5 * r.NormFloat64())
		}
	}
	return out
}

func TestKeyShiftConfig(t *testing.T) {
	l := Layout{Layers: 2, KVHeads: 2, HeadDim: 8}
	good := testShift(l, true)
	for _, name := range []string{"f32", "f16", "bf16", "kivi4"} {
		kc, _ := codec.Parse(name, codec.Keys)
		p, err := NewPool(PoolConfig{Layout: l, BlockTokens: 16, K: kc, Tokens: 64, KeyShift: good})
		if err != nil {
			t.Fatal(err)
		}
		if p.KeyShifted() {
			t.Errorf("%s keys: a key shift was applied to a codec that gains nothing", name)
		}
	}
	nan := testShift(l, true)
	nan[3][2] = float32(math.NaN())
	for what, bad := range map[string][][]float32{
		"count":      good[:3],
		"dim":        {good[0], good[1], good[2], good[3][:7]},
		"not finite": nan,
	} {
		if _, err := NewPool(PoolConfig{Layout: l, BlockTokens: 16, K: codec.Q8, Tokens: 64, KeyShift: bad}); err == nil {
			t.Errorf("%s: bad key shift accepted", what)
		}
	}
}

// TestKeyShiftReads: with a shift, every read path (segments, fork and
// copy-on-write, prefix reuse, re-written keys) returns the keys with the
// shift added back, and the error against the keys appended is that of
// quantizing k − mean.
func TestKeyShiftReads(t *testing.T) {
	const L, H, d, B, T = 2, 2, 8, 4, 37
	l := Layout{Layers: L, KVHeads: H, HeadDim: d}
	shift := make([][]float32, L*H)
	r := rand.New(rand.NewPCG(23, 24))
	for i := range shift {
		shift[i] = make([]float32, d)
		shift[i][d-1] = float32(20 + 5*r.NormFloat64()) // an offset channel, as real keys have
	}
	keys := make([][]float32, L)
	for li := range keys {
		keys[li] = make([]float32, T*H*d)
		for i := range keys[li] {
			keys[li][i] = float32(r.NormFloat64()) + shift[li*H+(i/d)%H][i%d]
		}
	}
	vals := make([]float32, T*H*d)
	pos := make([]int32, T)
	for i := range pos {
		pos[i] = int32(i)
	}
	maxErr := func(s *Paged) float64 {
		var e float64
		x := make([]float32, d)
		for li := 0; li < L; li++ {
			for h := 0; h < H; h++ {
				i := 0
				for _, seg := range s.Segments(li, h) {
					for j := 0; j < seg.N; j++ {
						seg.KC.Get(seg.K, seg.Cap, d, j, x)
						p := int(seg.Pos[j])
						for c := range x {
							e = math.Max(e, math.Abs(float64(x[c]-keys[li][(p*H+h)*d+c])))
						}
						i++
					}
				}
				if i != T {
					t.Fatalf("layer %d head %d: %d slots", li, h, i)
				}
			}
		}
		return e
	}
	for _, name := range []string{"q8", "q4"} {
		kc, _ := codec.Parse(name, codec.Keys)
		run := func(sh [][]float32) (*Pool, *Paged) {
			p, err := NewPool(PoolConfig{Layout: l, BlockTokens: B, K: kc, Tokens: 4 * T, KeyShift: sh})
			if err != nil {
				t.Fatal(err)
			}
			s := p.NewSequence()
			for li := 0; li < L; li++ {
				if err := s.Append(li, pos, keys[li], vals); err != nil {
					t.Fatal(err)
				}
			}
			return p, s
		}
		_, plain := run(nil)
		p, s := run(shift)
		ep, es := maxErr(plain), maxErr(s)
		// The spread is ~±4 around the mean against an offset of ~20.
		if es > 0.4*ep {
			t.Errorf("%s: max key error %.3g shifted, %.3g plain", name, es, ep)
		}
		f := s.Fork()
		if e := maxErr(f); e != es {
			t.Errorf("%s: fork reads error %g, original %g", name, e, es)
		}
		// Copy-on-write of the shared partly filled block keeps the shift.
		for li := 0; li < L; li++ {
			if err := f.Append(li, []int32{T}, keys[li][:H*d], vals[:H*d]); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Truncate(T); err != nil {
			t.Fatal(err)
		}
		if e := maxErr(f); e != es {
			t.Errorf("%s: after copy-on-write the fork reads error %g, original %g", name, e, es)
		}
		// Re-written keys (a re-indexing policy) are decoded with the
		// shift and encoded again with it.
		all := make([]int, T)
		for i := range all {
			all[i] = i
		}
		for li := 0; li < L; li++ {
			for h := 0; h < H; h++ {
				if err := f.RewriteKeys(li, h, all, func(p int32, key []float32) int32 { return p }); err != nil {
					t.Fatal(err)
				}
			}
		}
		if e := maxErr(f); e > 2*es {
			t.Errorf("%s: re-written keys err %g, first encoding %g", name, e, es)
		}
		f.Free()
		s.Free()
		checkInvariants(t, p, nil)
	}
}
