package codec

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/tensor"
)

// ---- data ------------------------------------------------------------------

type dataset struct {
	name string
	gen  func(r *rand.Rand, n, d int) []float32
}

func fill(n, d int, f func(i, c int) float32) []float32 {
	x := make([]float32, n*d)
	for i := range n {
		for c := range d {
			x[i*d+c] = f(i, c)
		}
	}
	return x
}

var datasets = []dataset{
	{"normal", func(r *rand.Rand, n, d int) []float32 {
		return fill(n, d, func(int, int) float32 { return float32(r.NormFloat64()) })
	}},
	{"outliers", func(r *rand.Rand, n, d int) []float32 {
		// a few channels carry large magnitudes, as real keys do
		return fill(n, d, func(_, c int) float32 {
			v := float32(r.NormFloat64())
			if c%17 == 3 {
				v *= 60
			}
			if r.IntN(50) == 0 {
				v *= 300
			}
			return v
		})
	}},
	{"constant", func(r *rand.Rand, n, d int) []float32 {
		v := float32(r.NormFloat64()) // almost surely not an f16
		return fill(n, d, func(int, int) float32 { return v })
	}},
	{"constant-f16", func(r *rand.Rand, n, d int) []float32 {
		return fill(n, d, func(int, int) float32 { return -0.375 })
	}},
	{"zeros", func(r *rand.Rand, n, d int) []float32 { return make([]float32, n*d) }},
	{"negative", func(r *rand.Rand, n, d int) []float32 {
		return fill(n, d, func(int, int) float32 { return -1 - 5*float32(r.Float64()) })
	}},
	{"tiny", func(r *rand.Rand, n, d int) []float32 {
		return fill(n, d, func(int, int) float32 { return 1e-6 * float32(r.NormFloat64()) })
	}},
	{"large", func(r *rand.Rand, n, d int) []float32 {
		return fill(n, d, func(int, int) float32 { return 2000 + 500*float32(r.NormFloat64()) })
	}},
}

var (
	dims  = []int{8, 10, 48, 64, 128}
	sizes = []int{1, 16, 40, 64}
)

type named struct {
	name string
	c    Codec
}

func allCodecs(t testing.TB) []named {
	var out []named
	for _, kind := range []Kind{Keys, Values} {
		for _, name := range Names {
			c, err := Parse(name, kind)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, named{name + "/" + kind.String(), c})
		}
	}
	return out
}

// encode stores x [n][d] in a fresh block of c: Put slot by slot, or, for
// Grouped codecs, EncodeRange with the range of a group (x itself here).
func encode(c Codec, n, d int, x []float32) []byte {
	b := make([]byte, c.BlockBytes(n, d))
	if g, ok := c.(Grouped); ok {
		lo, hi := make([]float32, d), make([]float32, d)
		ChannelRange(x, d, lo, hi)
		g.EncodeRange(b, n, d, x, lo, hi)
		return b
	}
	for i := range n {
		c.Put(b, n, d, i, x[i*d:(i+1)*d])
	}
	return b
}

func decodeAll(c Codec, b []byte, n, d int) []float32 {
	out := make([]float32, n*d)
	for i := range n {
		c.Get(b, n, d, i, out[i*d:(i+1)*d])
	}
	return out
}

// ---- f16 helpers -------------------------------------------------------------

func TestHalfToF32Exhaustive(t *testing.T) {
	for h := range 1 << 16 {
		got, want := halfToF32(uint16(h)), tensor.F16ToF32(uint16(h))
		if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
			t.Fatalf("halfToF32(%#04x) = %v, want %v", h, got, want)
		}
	}
}

func TestHalfFloorCeil(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for k := range 200000 {
		v := r.NormFloat64() * math.Pow(2, float64(r.IntN(44)-28))
		if k%7 == 0 { // exact f16 values must map to themselves
			v = float64(halfToF32(uint16(r.IntN(0x7c00)) | uint16(r.IntN(2))<<15))
		}
		fl, ce := halfFloor(v), halfCeil(v)
		lo, hi := float64(halfToF32(fl)), float64(halfToF32(ce))
		if math.Abs(v) >= halfMax {
			continue
		}
		if lo > v || float64(halfToF32(halfUp(fl))) <= v {
			t.Fatalf("halfFloor(%g) = %g (%#04x) not the largest f16 ≤ v", v, lo, fl)
		}
		if hi < v || float64(halfToF32(halfDown(ce))) >= v {
			t.Fatalf("halfCeil(%g) = %g (%#04x) not the smallest f16 ≥ v", v, hi, ce)
		}
	}
	if halfFloor(-1e6) != halfMaxNeg || halfCeil(1e6) != halfMaxPos {
		t.Fatal("no saturation")
	}
}

// ---- round trip ----------------------------------------------------------------

// metaAt reads a stored {scale, min} entry as float64.
func metaAt(b []byte, off int) (scale, min float64) {
	s, m := unmeta(binary.LittleEndian.Uint32(b[off:]))
	return float64(s), float64(m)
}

// checkGroup verifies one quantization group against the bounds derived in
// the package comment: with [lo, hi] its finite range, b bits, top = 2^b−1,
//
//	min ≤ lo, lo − min ≤ u(lo)           u(v) = one f16 ulp at v ≤ |v|·2^-10 + 2^-24
//	min + top·scale ≥ hi                  (range covered, nothing clamped)
//	scale ≤ (hi−min)/top + u(scale)        ≤ ((hi−lo) + u(lo))/top·(1+2^-10) + 2^-24
//	|x − x̂| ≤ scale/2 + 2^-23·|x̂|          (float32 rounding of scale·u + min)
//
// so that a priori |x − x̂| ≤ ((hi−lo)+|lo|·2^-10+2^-24)/top·(1+2^-10)/2 + 2^-25 + 2^-23|x̂|.
// Constant groups holding an f16 value decode exactly.
func checkGroup(t *testing.T, what string, x, xh []float32, scale, mn float64, top int) {
	t.Helper()
	lo, hi := rangeOf(x)
	l, h := float64(lo), float64(hi)
	ulp := func(v float64) float64 { return math.Abs(v)*0x1p-10 + 0x1p-24 }
	if mn > l || l-mn > ulp(l) {
		t.Fatalf("%s: min %g for lo %g", what, mn, l)
	}
	if mn+float64(top)*scale < h {
		t.Fatalf("%s: range [%g, %g+%d·%g] misses hi %g", what, mn, mn, top, scale, h)
	}
	if scale > (h-mn)/float64(top)+ulp(scale) {
		t.Fatalf("%s: scale %g too large for [%g, %g]", what, scale, mn, h)
	}
	prior := ((h-l)+ulp(l))/float64(top)*(1+0x1p-10)/2 + 0x1p-25
	exact := l == h && float64(halfToF32(tensor.F32ToF16(lo))) == l
	for j := range x {
		e := math.Abs(float64(x[j]) - float64(xh[j]))
		slack := 0x1p-23 * math.Abs(float64(xh[j]))
		if exact && e != 0 {
			t.Fatalf("%s: constant %g decoded as %g", what, x[j], xh[j])
		}
		if e > scale/2+slack || e > prior+slack {
			t.Fatalf("%s: value %d: |%g − %g| = %g > scale/2 = %g (prior %g)", what, j, x[j], xh[j], e, scale/2, prior)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, cc := range allCodecs(t) {
		for _, ds := range datasets {
			for _, d := range dims {
				for _, n := range sizes {
					t.Run(fmt.Sprintf("%s/%s/d%d/n%d", cc.name, ds.name, d, n), func(t *testing.T) {
						if g, ok := cc.c.(Grouped); ok {
							roundTripKeys(t, g, ds.gen(r, max(n, g.GroupTokens()), d), n, d)
							return
						}
						x := ds.gen(r, n, d)
						b := encode(cc.c, n, d, x)
						xh := decodeAll(cc.c, b, n, d)
						checkTokens(t, cc.c, b, x, xh, n, d)
					})
				}
			}
		}
	}
}

func checkTokens(t *testing.T, c Codec, b []byte, x, xh []float32, n, d int) {
	t.Helper()
	switch c.Name() {
	case "f32":
		for j := range x {
			if math.Float32bits(x[j]) != math.Float32bits(xh[j]) {
				t.Fatalf("f32 %d: %g ≠ %g", j, x[j], xh[j])
			}
		}
		return
	case "f16", "bf16":
		rel, tiny := 0x1p-11, 0x1p-25 // f16: subnormals below 2^-14 have ulp 2^-24
		if c.Name() == "bf16" {
			rel, tiny = 0x1p-8, 0
		}
		for j := range x {
			e := math.Abs(float64(x[j]) - float64(xh[j]))
			if e > rel*math.Abs(float64(x[j]))+tiny {
				t.Fatalf("%s %d: %g → %g", c.Name(), j, x[j], xh[j])
			}
		}
		return
	}
	tq, ok := c.(*tokenQuant)
	if !ok { // Q8Keys, Q4Keys: the row codec's quantizer and metadata, the levels in panels
		tq = c.(quantPanels).tq
	}
	g, ng, rb := tq.GroupChannels(d), tq.groups(d), tq.rowBytes(d)
	top := 1<<c.Bits() - 1
	for i := range n {
		for k := range ng {
			c0, c1 := k*g, min((k+1)*g, d)
			s, m := metaAt(b, n*rb+4*(i*ng+k))
			checkGroup(t, fmt.Sprintf("token %d group %d", i, k), x[i*d+c0:i*d+c1], xh[i*d+c0:i*d+c1], s, m, top)
		}
	}
}

// roundTripKeys splits a group of T tokens into blocks of n (T/n blocks,
// each with its own copy of the group's metadata) and checks each channel of
// the group against its range.
func roundTripKeys(t *testing.T, g Grouped, x []float32, n, d int) {
	T := len(x) / d
	lo, hi := make([]float32, d), make([]float32, d)
	ChannelRange(x, d, lo, hi)
	xh := make([]float32, T*d)
	var metas []byte
	for b0 := 0; b0 < T; b0 += n {
		b := make([]byte, g.BlockBytes(n, d))
		g.EncodeRange(b, n, d, x[b0*d:(b0+n)*d], lo, hi)
		copy(xh[b0*d:], decodeAll(g, b, n, d))
		m := b[len(b)-4*d:]
		if metas == nil {
			metas = m
		} else if string(metas) != string(m) {
			t.Fatal("blocks of one group store different metadata")
		}
	}
	col := func(v []float32, c int) []float32 {
		out := make([]float32, T)
		for i := range T {
			out[i] = v[i*d+c]
		}
		return out
	}
	for c := range d {
		s, m := metaAt(metas, 4*c)
		checkGroup(t, fmt.Sprintf("channel %d", c), col(x, c), col(xh, c), s, m, 1<<g.Bits()-1)
	}
}

// Put into one slot leaves the others alone.
func TestPutIsolated(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, cc := range allCodecs(t) {
		if !cc.c.PerToken() {
			continue
		}
		for _, d := range dims {
			n := 16
			x := datasets[1].gen(r, n, d)
			b := encode(cc.c, n, d, x)
			want := decodeAll(cc.c, b, n, d)
			junk := datasets[0].gen(r, 1, d)
			b2 := append([]byte(nil), b...)
			cc.c.Put(b2, n, d, 7, junk)
			got := decodeAll(cc.c, b2, n, d)
			for i := range n {
				if i == 7 {
					continue
				}
				for c := range d {
					if got[i*d+c] != want[i*d+c] {
						t.Fatalf("%s d%d: Put slot 7 changed slot %d", cc.name, d, i)
					}
				}
			}
			cc.c.Put(b2, n, d, 7, x[7*d:8*d]) // writing back restores the block
			if string(b2) != string(b) {
				t.Fatalf("%s d%d: re-Put differs", cc.name, d)
			}
		}
	}
}

// Byte-exact layouts, checked by hand.
func TestLayout(t *testing.T) {
	d, n := 16, 2
	x := make([]float32, d)
	for c := range x {
		x[c] = float32(c) // range [0, 15]
	}
	// q4: scale (15−0)/15 = 1 exactly, min 0: levels are x itself.
	b := make([]byte, Q4.BlockBytes(n, d))
	Q4.Put(b, n, d, 1, x)
	want := []byte{0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe}
	if string(b[8:16]) != string(want) || string(b[:8]) != string(make([]byte, 8)) {
		t.Fatalf("q4 payload % x", b[:16])
	}
	if m := b[16+4:]; m[0] != 0x00 || m[1] != 0x3c || m[2] != 0 || m[3] != 0 { // f16 1.0 = 0x3c00
		t.Fatalf("q4 meta % x", b[16:])
	}
	// q8: scale 15/255 rounded up to f16, payload at i·d, meta at n·d + 4i.
	b = make([]byte, Q8.BlockBytes(n, d))
	Q8.Put(b, n, d, 0, x)
	if len(b) != n*d+4*n || b[1] != 17 || b[15] != 255 {
		t.Fatalf("q8 payload % x", b[:d])
	}
	if s, m := metaAt(b, n*d); m != 0 || s < 15.0/255 || s > 15.0/255*(1+0x1p-10) {
		t.Fatalf("q8 meta %g %g", s, m)
	}
	// kivi2 values, d=64: 4 groups of 16 bytes of payload... per token
	kv, _ := Parse("kivi2", Values)
	if kv.BlockBytes(16, 64) != 16*(16+4*2) {
		t.Fatalf("kivi2 values block %d", kv.BlockBytes(16, 64))
	}
	// kivi2 keys: levels in a panel, value-major: slot 0 = 0,1,2,3 and slot
	// 1 = 3,2,1,0 give the elements (c0 s0, c0 s1, c1 s0, c1 s1, …) = 0,3,1,2,
	// 2,1,3,0, two bits each from bit 0.
	kk, _ := Parse("kivi2", Keys)
	g := kk.(Grouped)
	xk := []float32{0, 1, 2, 3, 3, 2, 1, 0} // n=2 tokens × d=4
	lo, hi := []float32{0, 0, 0, 0}, []float32{3, 3, 3, 3}
	b = make([]byte, g.BlockBytes(2, 4))
	g.EncodeRange(b, 2, 4, xk, lo, hi)
	if len(b) != 2+16 || b[0] != 0b10_01_11_00 || b[1] != 0b00_11_01_10 {
		t.Fatalf("kivi2 keys % x", b)
	}
	for c := range 4 {
		if s, m := metaAt(b, 2+4*c); s != 1 || m != 0 {
			t.Fatalf("kivi2 keys meta %d: %g %g", c, s, m)
		}
	}
}

// ---- NaN, Inf, saturation ---------------------------------------------------

func TestNonFinite(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	d, n := 8, 2
	x := []float32{1, nan, inf, -inf, -1, 0.5, 0.25, 0,
		nan, nan, inf, -inf, nan, inf, -inf, nan} // second token: nothing finite
	for _, cc := range allCodecs(t) {
		b := encode(cc.c, n, d, x)
		xh := decodeAll(cc.c, b, n, d)
		q := []float32{1, 1, 1, 1, 1, 1, 1, 1}
		out := make([]float32, d)
		cc.c.Dot(b, n, d, 0, q)
		cc.c.Axpy(b, n, d, 1, 1, out)
		switch cc.c.Name() {
		case "f32", "f16", "bf16":
			if xh[1] == xh[1] || xh[2] != inf || xh[3] != -inf || xh[0] != 1 {
				t.Fatalf("%s: %v", cc.name, xh[:8])
			}
			continue
		}
		for j, v := range xh {
			if !finite(v) {
				t.Fatalf("%s: value %d decoded as %g", cc.name, j, v)
			}
		}
		if cc.c.PerToken() { // per token: range of token 0 is [-1, 1]
			if xh[0] < 0.9 || xh[1] != xh[3] || xh[1] > -1 || xh[2] < 1 || xh[4] > -0.9 {
				t.Fatalf("%s: %v", cc.name, xh[:8])
			}
			for j := 8; j < 16; j++ {
				if xh[j] != 0 {
					t.Fatalf("%s: no finite value should decode as 0, got %v", cc.name, xh[8:])
				}
			}
		}
	}
	// saturation of the f16 metadata: no panic, no Inf
	big := []float32{-1e6, 1e6, 3e5, -70000, 0, 1, 2, 3}
	for _, cc := range allCodecs(t) {
		if cc.c.Name() == "f16" || cc.c.Name() == "f32" || cc.c.Name() == "bf16" {
			continue
		}
		xh := decodeAll(cc.c, encode(cc.c, 1, 8, big), 1, 8)
		for j, v := range xh {
			if lim := halfMax * float32(1+int(1)<<cc.c.Bits()); !finite(v) || v < -halfMax || v > lim {
				t.Fatalf("%s: value %d = %g", cc.name, j, v)
			}
		}
	}
}

// ---- Dot and Axpy against decode-then-compute -----------------------------------

// minAbs returns, per channel of slot i, |min| of the quantization group the
// value belongs to (0 for the float codecs), read from the block layout.
func minAbs(c Codec, b []byte, n, d, i int) []float64 {
	out := make([]float64, d)
	switch c := c.(type) {
	case *tokenQuant:
		g, ng, rb := c.GroupChannels(d), c.groups(d), c.rowBytes(d)
		for ch := range d {
			_, m := metaAt(b, n*rb+4*(i*ng+ch/g))
			out[ch] = math.Abs(m)
		}
	case quantPanels:
		for ch := range d {
			_, m := metaAt(b, n*c.tq.rowBytes(d)+4*i)
			out[ch] = math.Abs(m)
		}
	case *kiviKeys:
		for ch := range d {
			_, m := metaAt(b, n*c.rowBytes(d)+4*ch)
			out[ch] = math.Abs(m)
		}
	}
	return out
}

// Dot, DotAll and Axpy match decode-then-compute (the reference twin) within
// 1e-5 relative. The quantized codecs compute the factored forms scale·Σq·u +
// min·Σq and (a·scale)·u + a·min, whose float32 rounding is relative to the
// terms |scale·u| + |min| rather than to |x̂| (a cancellation far below the
// quantization step), so the magnitude each tolerance is relative to is
// Σ|q_c|·(|x̂_c| + 2|min_c|), which bounds Σ|q_c|·(|scale·u_c| + |min_c|).
func TestDotAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, cc := range allCodecs(t) {
		for _, ds := range datasets {
			for _, d := range dims {
				for _, n := range sizes {
					x := ds.gen(r, n, d)
					b := encode(cc.c, n, d, x)
					xh := decodeAll(cc.c, b, n, d)
					q := datasets[1].gen(r, 1, d)
					all := make([]float32, n)
					DotAll(cc.c, b, n, d, q, all)
					for i := range n {
						row := xh[i*d : (i+1)*d]
						mins := minAbs(cc.c, b, n, d, i)
						var ref, mag float64
						for c, v := range row {
							ref += float64(q[c]) * float64(v)
							mag += math.Abs(float64(q[c])) * (math.Abs(float64(v)) + 2*mins[c])
						}
						for _, got := range []float32{cc.c.Dot(b, n, d, i, q), all[i]} {
							if math.Abs(float64(got)-ref) > 1e-5*mag+1e-30 {
								t.Fatalf("%s/%s d%d n%d slot %d: Dot/DotAll %g, decoded %g (mag %g)", cc.name, ds.name, d, n, i, got, ref, mag)
							}
						}
						a := float32(r.NormFloat64())
						out := datasets[0].gen(r, 1, d)
						ref2 := make([]float64, d)
						for c := range out {
							ref2[c] = float64(out[c]) + float64(a)*float64(row[c])
						}
						base := append([]float32(nil), out...)
						cc.c.Axpy(b, n, d, i, a, out)
						for c := range out {
							tol := 1e-5 * (math.Abs(float64(base[c])) + math.Abs(float64(a))*(math.Abs(float64(row[c]))+2*mins[c]))
							if math.Abs(float64(out[c])-ref2[c]) > tol+1e-30 {
								t.Fatalf("%s/%s d%d n%d slot %d ch %d: Axpy %g, decoded %g", cc.name, ds.name, d, n, i, c, out[c], ref2[c])
							}
						}
					}
				}
			}
		}
	}
}

func TestNoAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const n, d = 16, 128
	x := datasets[0].gen(r, n, d)
	q := datasets[0].gen(r, 1, d)
	out := make([]float32, d)
	for _, cc := range allCodecs(t) {
		b := encode(cc.c, n, d, x)
		var sink float32
		if a := testing.AllocsPerRun(100, func() { sink += cc.c.Dot(b, n, d, 5, q) }); a != 0 {
			t.Errorf("%s: Dot allocates %v", cc.name, a)
		}
		if a := testing.AllocsPerRun(100, func() { cc.c.Axpy(b, n, d, 5, 0.5, out) }); a != 0 {
			t.Errorf("%s: Axpy allocates %v", cc.name, a)
		}
		scores := make([]float32, n)
		if a := testing.AllocsPerRun(100, func() { DotAll(cc.c, b, n, d, q, scores) }); a != 0 {
			t.Errorf("%s: DotAll allocates %v", cc.name, a)
		}
		// the block decoding that attention runs every step
		rows := make([]float32, n*d)
		if a := testing.AllocsPerRun(100, func() { GetRows(cc.c, b, n, d, 0, n, rows) }); a != 0 {
			t.Errorf("%s: GetRows allocates %v", cc.name, a)
		}
		if a := testing.AllocsPerRun(100, func() { DecodeKeyPanel(cc.c, b, n, d, 0, rows) }); a != 0 {
			t.Errorf("%s: DecodeKeyPanel allocates %v", cc.name, a)
		}
		_ = sink
	}
}

// ---- sizes ------------------------------------------------------------------

// Bits per value at n = 16:
//
//	f32/f16/bf16: the payload only.
//	q8, q4: b + 32/d (one f16 scale + min per token).
//	KIVI values: b + 32/min(32, d) (one f16 scale + min per token per group).
//	KIVI keys: b + 32/n (one f16 scale + min per channel per block, i.e. the
//	group's metadata stored once in every block of the group).
func TestBitsPerValue(t *testing.T) {
	want := map[string][3]float64{ // d = 8, 64, 128
		"f32/keys":     {32, 32, 32},
		"f16/keys":     {16, 16, 16},
		"bf16/keys":    {16, 16, 16},
		"q8/keys":      {12, 8.5, 8.25},
		"q4/keys":      {8, 4.5, 4.25},
		"q8dot/keys":   {12, 8.5, 8.25},
		"q4dot/keys":   {8, 4.5, 4.25},
		"kivi2/values": {6, 3, 3},
		"kivi4/values": {8, 5, 5},
		"kivi2/keys":   {4, 4, 4},
		"kivi4/keys":   {6, 6, 6},
	}
	for _, cc := range allCodecs(t) {
		w, ok := want[cc.name]
		if !ok {
			w, ok = want[strings.Replace(cc.name, "values", "keys", 1)]
		}
		if !ok {
			t.Fatalf("no expectation for %s", cc.name)
		}
		for k, d := range []int{8, 64, 128} {
			if got := cc.c.BitsPerValue(16, d); got != w[k] {
				t.Errorf("%s d%d: %v bits/value, want %v", cc.name, d, got, w[k])
			}
			if got := cc.c.BlockBytes(16, d); 8*got != int(w[k]*float64(16*d)) {
				t.Errorf("%s d%d: %d bytes", cc.name, d, got)
			}
		}
	}
}

// ---- Parse ------------------------------------------------------------------

func TestParse(t *testing.T) {
	bits := map[string]int{"f32": 32, "f16": 16, "bf16": 16, "q8": 8, "q4": 4, "q8dot": 8, "q4dot": 4, "kivi2": 2, "kivi4": 4}
	for _, kind := range []Kind{Keys, Values} {
		for _, name := range Names {
			c, err := Parse(strings.ToUpper(name), kind)
			if err != nil {
				t.Fatal(err)
			}
			// q8dot and q4dot differ from q8 and q4 in how attention
			// reads their keys and values (IntDot) only.
			dot := strings.HasSuffix(name, "dot")
			if c.Name() != name || c.Bits() != bits[name] {
				t.Errorf("%s: Name %q Bits %d", name, c.Name(), c.Bits())
			}
			if c.IntDot() != dot || Shifted(c, make([]float32, 8)).IntDot() != c.IntDot() {
				t.Errorf("%s/%s: IntDot %v", name, kind, c.IntDot())
			}
			_, grouped := c.(Grouped)
			kiviKey := kind == Keys && strings.HasPrefix(name, "kivi")
			if grouped != kiviKey || c.PerToken() == kiviKey {
				t.Errorf("%s/%s: Grouped %v PerToken %v", name, kind, grouped, c.PerToken())
			}
			if kiviKey && c.(Grouped).GroupTokens() != DefaultGroup {
				t.Errorf("%s: G = %d", name, c.(Grouped).GroupTokens())
			}
		}
	}
	for _, bad := range []string{"", "q2", "int8", "kivi3", "fp16"} {
		_, err := Parse(bad, Values)
		if err == nil || !strings.Contains(err.Error(), "f32, f16, bf16, q8, q4, q8dot, q4dot, kivi2, kivi4") {
			t.Errorf("Parse(%q): %v", bad, err)
		}
	}
	if _, err := Parse("f32", Kind(7)); err == nil {
		t.Error("bad kind accepted")
	}
	if _, err := NewKIVIValues(2, 6); err == nil { // 6·2 bits: groups not byte-aligned
		t.Error("misaligned group accepted")
	}
	if _, err := NewKIVIKeys(3, 32); err == nil {
		t.Error("3 bits accepted")
	}
	kk, _ := Parse("kivi2", Keys)
	defer func() {
		if recover() == nil {
			t.Error("Put on KIVI keys did not panic")
		}
	}()
	kk.Put(make([]byte, kk.BlockBytes(16, 8)), 16, 8, 0, make([]float32, 8))
}

// ---- benchmarks ---------------------------------------------------------------

func BenchmarkDot(b *testing.B) {
	r := rand.New(rand.NewPCG(11, 12))
	const n, d = 16, 128
	x := datasets[0].gen(r, n, d)
	q := datasets[0].gen(r, 1, d)
	for _, cc := range allCodecs(b) {
		if cc.c.Name() != "kivi2" && cc.c.Name() != "kivi4" && strings.HasSuffix(cc.name, "values") {
			continue // same code as keys
		}
		blk := encode(cc.c, n, d, x)
		b.Run(cc.name, func(b *testing.B) {
			var s float32
			for i := 0; b.Loop(); i++ {
				s += cc.c.Dot(blk, n, d, i&(n-1), q)
			}
			_ = s
		})
	}
}

// BenchmarkDotAll scores a whole 16-slot block; ns/op ÷ 16 compares with Dot.
func BenchmarkDotAll(b *testing.B) {
	r := rand.New(rand.NewPCG(11, 12))
	const n, d = 16, 128
	x := datasets[0].gen(r, n, d)
	q := datasets[0].gen(r, 1, d)
	out := make([]float32, n)
	for _, cc := range allCodecs(b) {
		if cc.c.Name() != "kivi2" && cc.c.Name() != "kivi4" && strings.HasSuffix(cc.name, "values") {
			continue
		}
		blk := encode(cc.c, n, d, x)
		b.Run(cc.name, func(b *testing.B) {
			for b.Loop() {
				DotAll(cc.c, blk, n, d, q, out)
			}
		})
	}
}

func BenchmarkAxpy(b *testing.B) {
	r := rand.New(rand.NewPCG(13, 14))
	const n, d = 16, 128
	x := datasets[0].gen(r, n, d)
	out := make([]float32, d)
	for _, cc := range allCodecs(b) {
		if cc.c.Name() != "kivi2" && cc.c.Name() != "kivi4" && strings.HasSuffix(cc.name, "values") {
			continue
		}
		blk := encode(cc.c, n, d, x)
		b.Run(cc.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				cc.c.Axpy(blk, n, d, i&(n-1), 1e-3, out)
			}
		})
	}
}

// ---- shifted keys --------------------------------------------------------------

// TestShifted checks Shifted codecs: the block holds exactly what the plain
// codec would hold for x − mu (so the error bounds of checkGroup apply to
// x − mu), reads add mu back, Dot/DotAll/Axpy agree with the decoded
// vectors, nothing allocates, and codecs that do not quantize per token
// come back unchanged.
func TestShifted(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, name := range []string{"f32", "f16", "bf16", "kivi2", "kivi4"} {
		for _, kind := range []Kind{Keys, Values} {
			c, _ := Parse(name, kind)
			if Shifted(c, []float32{1, 2}) != c || Shift(c) != nil {
				t.Errorf("%s/%s: Shifted changed a codec that does not quantize per token", name, kind)
			}
		}
	}
	for _, plain := range []Codec{Q8, Q4} {
		if Shifted(plain, nil) != plain || Base(plain) != plain {
			t.Errorf("%s: nil shift or Base changed the codec", plain.Name())
		}
		mu := []float32{1, 2, 3, 4, 5, 6, 7, 8}
		c := Shifted(plain, mu)
		mu[0] = 100
		if Shift(c)[0] != 1 || Base(c) != plain {
			t.Errorf("%s: Shifted must keep its own copy of mu and lay blocks out as the plain codec", plain.Name())
		}
		for _, ds := range datasets {
			for _, d := range dims {
				for _, n := range sizes {
					mu := fill(1, d, func(int, int) float32 { return float32(20 * r.NormFloat64()) })
					c := Shifted(plain, mu)
					if c.Name() != plain.Name() || c.BlockBytes(n, d) != plain.BlockBytes(n, d) || !c.PerToken() {
						t.Fatalf("%s: shifted codec changes name, layout or kind", plain.Name())
					}
					x := ds.gen(r, n, d)
					for i := range n {
						for j := range d {
							x[i*d+j] += mu[j] // keys with an offset
						}
					}
					what := fmt.Sprintf("%s/%s/d%d/n%d", plain.Name(), ds.name, d, n)
					b := encode(c, n, d, x)
					// The bytes are the plain codec's encoding of x − mu.
					y := make([]float32, n*d)
					for i := range n {
						for j := range d {
							y[i*d+j] = x[i*d+j] - mu[j]
						}
					}
					if want := encode(plain, n, d, y); string(want) != string(b) {
						t.Fatalf("%s: block is not the plain encoding of x − mu", what)
					}
					yh := decodeAll(plain, b, n, d)
					checkTokens(t, plain, b, y, yh, n, d)
					xh := decodeAll(c, b, n, d)
					for j := range xh {
						if want := yh[j] + mu[j%d]; math.Float32bits(xh[j]) != math.Float32bits(want) {
							t.Fatalf("%s: Get %d = %g, want %g", what, j, xh[j], want)
						}
					}
					// Slots copy as they are.
					cp := make([]byte, len(b))
					for i := range n {
						if !CopySlot(Base(c), cp, n, i, b, n, i, d) {
							t.Fatalf("%s: CopySlot refused", what)
						}
					}
					if string(cp) != string(b) {
						t.Fatalf("%s: CopySlot changed the slots", what)
					}
					q := datasets[1].gen(r, 1, d)
					all := make([]float32, n)
					DotAll(c, b, n, d, q, all)
					for i := range n {
						mins := minAbs(plain, b, n, d, i)
						var ref, mag float64
						for j := range d {
							ref += float64(q[j]) * float64(xh[i*d+j])
							mag += math.Abs(float64(q[j])) * (math.Abs(float64(yh[i*d+j])) + 2*mins[j] + math.Abs(float64(mu[j])) + math.Abs(float64(xh[i*d+j])))
						}
						for _, got := range []float32{c.Dot(b, n, d, i, q), all[i]} {
							if math.Abs(float64(got)-ref) > 1e-5*mag+1e-30 {
								t.Fatalf("%s slot %d: Dot/DotAll %g, decoded %g (mag %g)", what, i, got, ref, mag)
							}
						}
						a := float32(r.NormFloat64())
						out := datasets[0].gen(r, 1, d)
						base := append([]float32(nil), out...)
						c.Axpy(b, n, d, i, a, out)
						for j := range out {
							ref := float64(base[j]) + float64(a)*float64(xh[i*d+j])
							tol := 1e-5 * (math.Abs(float64(base[j])) + math.Abs(float64(a))*(math.Abs(float64(yh[i*d+j]))+2*mins[j]+2*math.Abs(float64(mu[j]))))
							if math.Abs(float64(out[j])-ref) > tol+1e-30 {
								t.Fatalf("%s slot %d ch %d: Axpy %g, decoded %g", what, i, j, out[j], ref)
							}
						}
					}
				}
			}
		}
		const n, d = 16, 128
		mu = datasets[0].gen(r, 1, d)
		c = Shifted(plain, mu)
		x := datasets[0].gen(r, n, d)
		b := make([]byte, c.BlockBytes(n, d))
		q := datasets[0].gen(r, 1, d)
		out := make([]float32, d)
		scores := make([]float32, n)
		var sink float32
		for what, f := range map[string]func(){
			"Put":    func() { c.Put(b, n, d, 3, x[3*d:4*d]) },
			"Dot":    func() { sink += c.Dot(b, n, d, 3, q) },
			"DotAll": func() { DotAll(c, b, n, d, q, scores) },
			"Axpy":   func() { c.Axpy(b, n, d, 3, 0.5, out) },
		} {
			if a := testing.AllocsPerRun(100, f); a != 0 {
				t.Errorf("shifted %s: %s allocates %v", plain.Name(), what, a)
			}
		}
		_ = sink
	}
}

// TestShiftedShrinksStep: keys with a large common offset get the step of
// their spread, not of their offset.
func TestShiftedShrinksStep(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	const n, d = 64, 8
	mu := []float32{0, 0, 0, 0, 0, 1, 18, -3}
	x := fill(n, d, func(_, c int) float32 { return mu[c] + 2*float32(r.NormFloat64()) })
	for _, plain := range []Codec{Q8, Q4} {
		rms := func(c Codec) float64 {
			xh := decodeAll(c, encode(c, n, d, x), n, d)
			var s float64
			for j := range x {
				s += (float64(x[j]) - float64(xh[j])) * (float64(x[j]) - float64(xh[j]))
			}
			return math.Sqrt(s / float64(len(x)))
		}
		p, s := rms(plain), rms(Shifted(plain, mu))
		t.Logf("%s: RMS error %.3g plain, %.3g shifted", plain.Name(), p, s)
		if s > 0.7*p {
			t.Errorf("%s: shifting by the mean left the RMS error at %.3g (plain %.3g)", plain.Name(), s, p)
		}
	}
}

// BenchmarkShifted: the cost of the shift on q8/q4 scores (DotAll adds q·mu
// once per block) and on encoding.
func BenchmarkShifted(b *testing.B) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, d := range []int{8, 128} {
		const n = 16
		x := datasets[0].gen(r, n, d)
		q := datasets[0].gen(r, 1, d)
		mu := datasets[0].gen(r, 1, d)
		out := make([]float32, n)
		for _, plain := range []Codec{Q8, Q4} {
			for _, c := range []Codec{plain, Shifted(plain, mu)} {
				name := fmt.Sprintf("%s/d%d", plain.Name(), d)
				if c != plain {
					name += "/shifted"
				}
				blk := encode(c, n, d, x)
				b.Run(name+"/DotAll", func(b *testing.B) {
					for b.Loop() {
						DotAll(c, blk, n, d, q, out)
					}
				})
				b.Run(name+"/Put", func(b *testing.B) {
					for b.Loop() {
						c.Put(blk, n, d, 3, x[3*d:4*d])
					}
				})
			}
		}
	}
}
