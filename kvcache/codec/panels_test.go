package codec

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/kvlm/kvlm/tensor"
)

// The key codecs of the float types store panels, the value codecs rows.
func TestParseKeyPanels(t *testing.T) {
	for _, c := range []struct {
		name       string
		keys, vals Codec
	}{{"f32", F32Keys, F32}, {"f16", F16Keys, F16}, {"bf16", BF16Keys, BF16}} {
		if k, _ := Parse(c.name, Keys); k != c.keys {
			t.Errorf("Parse(%s, Keys) = %#v", c.name, k)
		}
		if v, _ := Parse(c.name, Values); v != c.vals {
			t.Errorf("Parse(%s, Values) = %#v", c.name, v)
		}
		if c.keys.Name() != c.name || c.keys.Bits() != c.vals.Bits() || c.keys.BlockBytes(24, 8) != c.vals.BlockBytes(24, 8) {
			t.Errorf("%s: keys named %s, %d bits, %d bytes", c.name, c.keys.Name(), c.keys.Bits(), c.keys.BlockBytes(24, 8))
		}
	}
}

// The panels' layout, by hand: groups of 16 slots, value-major, the last
// group as wide as its slots; each value encoded as the row codec encodes
// it.
func TestKeyPanelsLayout(t *testing.T) {
	const n, d = 24, 3
	for _, c := range []struct{ keys, rows Codec }{{F32Keys, F32}, {F16Keys, F16}, {BF16Keys, BF16}} {
		es := c.rows.Bits() / 8
		b := make([]byte, c.keys.BlockBytes(n, d))
		r := make([]byte, c.rows.BlockBytes(n, d))
		for i := range n {
			x := []float32{float32(100 * i), float32(100*i + 1), -float32(i) / 3}
			c.keys.Put(b, n, d, i, x)
			c.rows.Put(r, n, d, i, x)
		}
		for i := range n {
			g, L := i/16*16, 16
			if i >= 16 {
				L = n - 16
			}
			for v := range d {
				at := es * (g*d + v*L + i - g)
				if got, want := b[at:at+es], r[es*(i*d+v):es*(i*d+v+1)]; string(got) != string(want) {
					t.Fatalf("%s slot %d value %d: bytes % x at %d, rows hold % x", c.keys.Name(), i, v, got, at, want)
				}
			}
		}
	}
}

// KeyPanel hands out exactly the panel PackKeys makes of the decoded keys
// (in the keys' own type), for full groups only, and nothing for other
// codecs.
func TestKeyPanel(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const n, d = 40, 64
	for _, kc := range []Codec{F32Keys, F16Keys, BF16Keys} {
		x := datasets[1].gen(r, n, d)
		b := encode(kc, n, d, x)
		rows := decodeAll(kc, b, n, d)
		want := make([]float32, tensor.AttnLanes*d)
		for _, tc := range []struct {
			i0 int
			ok bool
		}{{0, true}, {16, true}, {32, false}, {8, false}, {-16, false}} {
			p, typ, ok := KeyPanel(kc, b, n, d, tc.i0)
			if ok != tc.ok {
				t.Fatalf("%s i0 %d: ok %v, want %v", kc.Name(), tc.i0, ok, tc.ok)
			}
			if !ok {
				continue
			}
			tensor.PackKeys(want, f32Bytes(rows[tc.i0*d:]), tensor.F32, 4*d, tensor.AttnLanes, d)
			for k := range want {
				v := elem(p, typ, k)
				if v != want[k] {
					t.Fatalf("%s i0 %d: panel[%d] = %g, PackKeys %g", kc.Name(), tc.i0, k, v, want[k])
				}
			}
		}
	}
	for _, c := range []Codec{F32, F16, Q8} {
		if _, _, ok := KeyPanel(c, make([]byte, c.BlockBytes(16, d)), 16, d, 0); ok {
			t.Errorf("%s: KeyPanel in place", c.Name())
		}
	}
}

// elem is value k of a panel of type t.
func elem(p []byte, t tensor.DType, k int) float32 {
	switch t {
	case tensor.F32:
		return *(*float32)(unsafe.Pointer(&p[4*k]))
	case tensor.F16:
		return tensor.F16ToF32(uint16(p[2*k]) | uint16(p[2*k+1])<<8)
	}
	return tensor.BF16ToF32(uint16(p[2*k]) | uint16(p[2*k+1])<<8)
}

func f32Bytes(x []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}

// Q8Keys and Q4Keys are Q8 and Q4 with the levels in panels: per slot the
// same levels and metadata (by hand), the same decoded, scored and added
// bits, shifted or not; DecodeKeyPanel gives the panel PackKeys makes of
// the decoded rows, for full groups only.
func TestQuantKeys(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	const n, d = 40, 48
	mu := datasets[1].gen(r, 1, d)
	for _, c := range []struct {
		name       string
		rows, pans Codec
	}{
		{"q8", Q8, Q8Keys}, {"q8 shifted", Shifted(Q8, mu), Shifted(Q8Keys, mu)},
		{"q4", Q4, Q4Keys}, {"q4 shifted", Shifted(Q4, mu), Shifted(Q4Keys, mu)},
	} {
		qp, ok := Base(c.pans).(quantPanels)
		if !ok || (Shift(c.rows) != nil) != (Shift(c.pans) != nil) {
			t.Fatalf("%s: %#v", c.name, c.pans)
		}
		if k, _ := Parse(qp.Name(), Keys); k != Base(c.pans) {
			t.Fatalf("Parse(%s, Keys) = %#v", qp.Name(), k)
		}
		if s := Shift(c.pans); s != nil && (&s[0] == &mu[0] || s[5] != mu[5]) {
			t.Fatalf("%s: Shift %v", c.name, s)
		}
		x := datasets[1].gen(r, n, d)
		rb, pb := encode(c.rows, n, d, x), encode(c.pans, n, d, x)
		rw := qp.tq.rowBytes(d)
		if len(rb) != len(pb) || string(rb[n*rw:]) != string(pb[n*rw:]) {
			t.Fatalf("%s: metadata differ", c.name)
		}
		for i := range n {
			g, L := i/16*16, min(16, n-i/16*16)
			for v := range d {
				e := g*d + v*L + i - g
				if got, want := qp.level(pb, e), byte(unpack(rb[i*rw:], qp.Bits(), v)); got != want {
					t.Fatalf("%s slot %d value %d: level %d in panels, %d in rows", c.name, i, v, got, want)
				}
			}
		}
		q := datasets[1].gen(r, 1, d)
		wr, wp := make([]float32, d), make([]float32, d)
		for i := range n {
			c.rows.Get(rb, n, d, i, wr)
			c.pans.Get(pb, n, d, i, wp)
			for v := range d {
				if math.Float32bits(wr[v]) != math.Float32bits(wp[v]) {
					t.Fatalf("%s slot %d: Get %g, rows %g", c.name, i, wp[v], wr[v])
				}
			}
			if a, b := c.rows.Dot(rb, n, d, i, q), c.pans.Dot(pb, n, d, i, q); math.Float32bits(a) != math.Float32bits(b) {
				t.Fatalf("%s slot %d: Dot %g, rows %g", c.name, i, b, a)
			}
			c.rows.Axpy(rb, n, d, i, 0.7, wr)
			c.pans.Axpy(pb, n, d, i, 0.7, wp)
			for v := range d {
				if math.Float32bits(wr[v]) != math.Float32bits(wp[v]) {
					t.Fatalf("%s slot %d: Axpy %g, rows %g", c.name, i, wp[v], wr[v])
				}
			}
		}
		rows := decodeAll(c.rows, rb, n, d)
		want := make([]float32, tensor.AttnLanes*d)
		got := make([]float32, tensor.AttnLanes*d)
		for _, tc := range []struct {
			i0 int
			ok bool
		}{{0, true}, {16, true}, {32, false}, {4, false}, {-16, false}} {
			if ok := DecodeKeyPanel(c.pans, pb, n, d, tc.i0, got); ok != tc.ok {
				t.Fatalf("%s i0 %d: ok %v", c.name, tc.i0, ok)
			} else if !ok {
				continue
			}
			tensor.PackKeys(want, f32Bytes(rows[tc.i0*d:]), tensor.F32, 4*d, tensor.AttnLanes, d)
			for k := range want {
				if math.Float32bits(got[k]) != math.Float32bits(want[k]) {
					t.Fatalf("%s i0 %d: panel[%d] = %g, want %g", c.name, tc.i0, k, got[k], want[k])
				}
			}
		}
		if DecodeKeyPanel(c.rows, rb, n, d, 0, got) {
			t.Fatalf("%s rows decode as panels", c.name)
		}
	}
}

// TestKIVIKeyPanels: KIVI keys store their levels in score panels (level c
// of slot 16g+j at element 16g·d + c·L + j) with the per-channel metadata
// after them; Get, Dot and Axpy read a slot as the scale and minimum of its
// channel times its level (Dot in four accumulators over the channels), and
// DecodeKeyPanel gives the panel PackKeys makes of the decoded rows, for
// full groups only.
func TestKIVIKeyPanels(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, name := range []string{"kivi2", "kivi4"} {
		for _, d := range []int{48, 64} {
			const n = 40 // groups of 16, 16 and 8 slots
			c, err := Parse(name, Keys)
			if err != nil {
				t.Fatal(err)
			}
			kk := c.(*kiviKeys)
			x := datasets[1].gen(r, n, d)
			lo, hi := make([]float32, d), make([]float32, d)
			ChannelRange(x, d, lo, hi)
			b := make([]byte, c.BlockBytes(n, d))
			kk.EncodeRange(b, n, d, x, lo, hi)
			top := 1<<kk.bits - 1
			scale, minv := make([]float32, d), make([]float32, d)
			for ch := range d {
				s, m := fitRange(lo[ch], hi[ch], top)
				scale[ch], minv[ch] = halfTab[s], halfTab[m]
				z := newQuantizer(s, m, top)
				if gs, gm := metaAt(b, n*kk.rowBytes(d)+4*ch); float32(gs) != scale[ch] || float32(gm) != minv[ch] {
					t.Fatalf("%s d=%d channel %d: meta %g %g, want %g %g", name, d, ch, gs, gm, scale[ch], minv[ch])
				}
				for i := range n {
					g, L := i/16*16, min(16, n-i/16*16)
					e := g*d + ch*L + i - g
					if got, want := unpack(b, kk.bits, e), z.level(x[i*d+ch]); got != want {
						t.Fatalf("%s d=%d slot %d channel %d: level %d, want %d", name, d, i, ch, got, want)
					}
				}
			}
			q := datasets[1].gen(r, 1, d)
			got, acc, want := make([]float32, d), make([]float32, d), make([]float32, d)
			for i := range n {
				c.Get(b, n, d, i, got)
				g, L := i/16*16, min(16, n-i/16*16)
				var a [4]float32
				for ch := range d {
					u := unpack(b, kk.bits, g*d+ch*L+i-g)
					want[ch] = scale[ch]*float32(u) + minv[ch]
					if math.Float32bits(got[ch]) != math.Float32bits(want[ch]) {
						t.Fatalf("%s d=%d slot %d: Get[%d] = %g, want %g", name, d, i, ch, got[ch], want[ch])
					}
					a[ch%4] += q[ch] * want[ch]
				}
				if dot, w := c.Dot(b, n, d, i, q), (a[0]+a[1])+(a[2]+a[3]); math.Float32bits(dot) != math.Float32bits(w) {
					t.Fatalf("%s d=%d slot %d: Dot %g, want %g", name, d, i, dot, w)
				}
				clear(acc)
				c.Axpy(b, n, d, i, 0.7, acc)
				for ch := range d {
					if w := 0.7 * want[ch]; math.Float32bits(acc[ch]) != math.Float32bits(w) {
						t.Fatalf("%s d=%d slot %d: Axpy[%d] = %g, want %g", name, d, i, ch, acc[ch], w)
					}
				}
			}
			rows := decodeAll(c, b, n, d)
			pw := make([]float32, tensor.AttnLanes*d)
			pg := make([]float32, tensor.AttnLanes*d)
			for _, tc := range []struct {
				i0 int
				ok bool
			}{{0, true}, {16, true}, {32, false}, {4, false}, {-16, false}} {
				if ok := DecodeKeyPanel(c, b, n, d, tc.i0, pg); ok != tc.ok {
					t.Fatalf("%s d=%d i0 %d: ok %v", name, d, tc.i0, ok)
				} else if !ok {
					continue
				}
				tensor.PackKeys(pw, f32Bytes(rows[tc.i0*d:]), tensor.F32, 4*d, tensor.AttnLanes, d)
				for k := range pw {
					if math.Float32bits(pg[k]) != math.Float32bits(pw[k]) {
						t.Fatalf("%s d=%d i0 %d: panel[%d] = %g, want %g", name, d, tc.i0, k, pg[k], pw[k])
					}
				}
			}
		}
	}
}
