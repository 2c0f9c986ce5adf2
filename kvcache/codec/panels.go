package codec

import (
	"unsafe"

	"github.com/kvlm/kvlm/tensor"
)

// f32Panels stores float32 keys the way attention's score kernels read
// them, so that they read a block in place instead of transposing its keys
// into a panel every step (tensor.PackKeys). The block's slots go in groups
// of 16 (tensor.AttnLanes); each group is stored value-major:
//
//	group g (slots 16g … 16g+L−1, L = min(16, n−16g)) at float 16g·d:
//	value c of slot 16g+j at float 16g·d + c·L + j
//
// A full group is exactly the [d][16] panel of tensor.AttnScores; the block
// is still 4·n·d bytes, with no padding. Values of a slot are bit-for-bit
// those stored, as with f32.
type f32Panels struct{}

// F32Keys is the f32 codec of keys: f32 values in score panels. Parse("f32",
// Keys) returns it; its name is "f32".
var F32Keys Codec = f32Panels{}

func (f32Panels) Name() string                    { return "f32" }
func (f32Panels) Bits() int                       { return 32 }
func (f32Panels) BlockBytes(n, d int) int         { return 4 * n * d }
func (c f32Panels) BitsPerValue(n, d int) float64 { return bitsPerValue(c, n, d) }
func (f32Panels) PerToken() bool                  { return true }

// slot returns the floats of slot i's group from its first value on, and the
// stride L between its values.
func (f32Panels) slot(b []byte, n, d, i int) ([]float32, int) {
	g := i &^ (tensor.AttnLanes - 1)
	L := min(tensor.AttnLanes, n-g)
	off := 4 * (g*d + i - g)
	end := 4 * (g*d + (d-1)*L + i - g + 1)
	b = b[off:end]
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4), L
}

func (c f32Panels) Put(dst []byte, n, d, i int, x []float32) {
	v, L := c.slot(dst, n, d, i)
	for k, x := range x[:d] {
		v[k*L] = x
	}
}

func (c f32Panels) Get(src []byte, n, d, i int, out []float32) {
	v, L := c.slot(src, n, d, i)
	out = out[:d]
	for k := range out {
		out[k] = v[k*L]
	}
}

// Dot and Axpy gather the slot and run f32's kernels on it, so they give
// f32's bits.
func (c f32Panels) Dot(src []byte, n, d, i int, q []float32) float32 {
	if d > maxStackDim {
		x := make([]float32, d)
		c.Get(src, n, d, i, x)
		return tensor.Dot(q[:d], x)
	}
	var buf [maxStackDim]float32
	c.Get(src, n, d, i, buf[:d])
	return tensor.Dot(q[:d], buf[:d])
}

func (c f32Panels) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	if d > maxStackDim {
		x := make([]float32, d)
		c.Get(src, n, d, i, x)
		tensor.Axpy(out[:d], a, x)
		return
	}
	var buf [maxStackDim]float32
	c.Get(src, n, d, i, buf[:d])
	tensor.Axpy(out[:d], a, buf[:d])
}

// KeyPanel returns, in place, the [d][16] score panel (tensor.PackKeys's
// layout) of slots i0 … i0+15 of a block of n slots, when c stores panels
// (F32Keys) and those 16 slots are one full group of the block; false
// otherwise.
func KeyPanel(c Codec, src []byte, n, d, i0 int) ([]float32, bool) {
	if _, ok := c.(f32Panels); !ok || i0 < 0 || i0%tensor.AttnLanes != 0 || i0+tensor.AttnLanes > n || d <= 0 {
		return nil, false
	}
	b := src[4*i0*d : 4*(i0+tensor.AttnLanes)*d]
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), tensor.AttnLanes*d), true
}
