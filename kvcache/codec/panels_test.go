package codec

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/kvlm/kvlm/tensor"
)

// F32Keys's layout, by hand: groups of 16 slots, value-major, the last
// group as wide as its slots.
func TestF32KeysLayout(t *testing.T) {
	if c, _ := Parse("f32", Keys); c != F32Keys {
		t.Fatalf("Parse(f32, Keys) = %T, want F32Keys", c)
	}
	if c, _ := Parse("f32", Values); c != F32 {
		t.Fatalf("Parse(f32, Values) = %T, want F32", c)
	}
	const n, d = 24, 3
	b := make([]byte, F32Keys.BlockBytes(n, d))
	if len(b) != 4*n*d {
		t.Fatalf("block %d bytes, want %d", len(b), 4*n*d)
	}
	for i := range n {
		F32Keys.Put(b, n, d, i, []float32{float32(100 * i), float32(100*i + 1), float32(100*i + 2)})
	}
	v := make([]float32, n*d)
	for k := range v {
		v[k] = f32At(b, k)
	}
	for i := range n {
		g, L := i/16*16, 16
		if i >= 16 {
			L = n - 16
		}
		for c := range d {
			if got, want := v[g*d+c*L+i-g], float32(100*i+c); got != want {
				t.Fatalf("slot %d value %d: float %d holds %g, want %g", i, c, g*d+c*L+i-g, got, want)
			}
		}
	}
}

func f32At(b []byte, k int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:])) }

func f32Bytes(x []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}

// KeyPanel hands out exactly the panel PackKeys makes of the decoded keys,
// for full groups only, and nothing for other codecs.
func TestKeyPanel(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const n, d = 40, 64
	x := datasets[1].gen(r, n, d)
	b := encode(F32Keys, n, d, x)
	rows := decodeAll(F32Keys, b, n, d)
	want := make([]float32, tensor.AttnLanes*d)
	for _, tc := range []struct {
		i0 int
		ok bool
	}{{0, true}, {16, true}, {32, false}, {8, false}, {-16, false}} {
		p, ok := KeyPanel(F32Keys, b, n, d, tc.i0)
		if ok != tc.ok {
			t.Fatalf("i0 %d: ok %v, want %v", tc.i0, ok, tc.ok)
		}
		if !ok {
			continue
		}
		tensor.PackKeys(want, f32Bytes(rows[tc.i0*d:]), tensor.F32, 4*d, tensor.AttnLanes, d)
		for k := range want {
			if p[k] != want[k] {
				t.Fatalf("i0 %d: panel[%d] = %g, PackKeys %g", tc.i0, k, p[k], want[k])
			}
		}
	}
	for _, c := range []Codec{F32, F16, Q8} {
		if _, ok := KeyPanel(c, make([]byte, c.BlockBytes(16, d)), 16, d, 0); ok {
			t.Errorf("%s: KeyPanel in place", c.Name())
		}
	}
}
