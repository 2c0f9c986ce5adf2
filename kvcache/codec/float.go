package codec

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/kvlm/kvlm/tensor"
)

// f32Codec: [n][d]float32 little-endian.
type f32Codec struct{ defaults }

func (f32Codec) Name() string                    { return "f32" }
func (f32Codec) Bits() int                       { return 32 }
func (f32Codec) BlockBytes(n, d int) int         { return 4 * n * d }
func (c f32Codec) BitsPerValue(n, d int) float64 { return bitsPerValue(c, n, d) }
func (f32Codec) PerToken() bool                  { return true }
func (f32Codec) row(b []byte, d, i int) []byte   { return b[4*i*d : 4*(i+1)*d] }

// f32s views row i of an f32 block as float32 values (the block layout is
// little-endian float32, the machine's own order on every supported target).
func (c f32Codec) f32s(b []byte, d, i int) []float32 {
	r := c.row(b, d, i)
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(r))), d)
}

func (c f32Codec) Put(dst []byte, n, d, i int, x []float32) { copy(c.f32s(dst, d, i), x[:d]) }

func (c f32Codec) Get(src []byte, n, d, i int, out []float32) { copy(out[:d], c.f32s(src, d, i)) }

func (c f32Codec) Dot(src []byte, n, d, i int, q []float32) float32 {
	return tensor.Dot(q[:d], c.f32s(src, d, i))
}

func (c f32Codec) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	tensor.Axpy(out[:d], a, c.f32s(src, d, i))
}

// half16 holds what f16 and bf16 share: [n][d]uint16 little-endian.
type half16 struct{ defaults }

func (half16) Bits() int                     { return 16 }
func (half16) BlockBytes(n, d int) int       { return 2 * n * d }
func (half16) PerToken() bool                { return true }
func (half16) row(b []byte, d, i int) []byte { return b[2*i*d : 2*(i+1)*d] }

// f16Codec: IEEE half, round to nearest even; overflow gives ±Inf.
type f16Codec struct{ half16 }

func (f16Codec) Name() string                    { return "f16" }
func (c f16Codec) BitsPerValue(n, d int) float64 { return bitsPerValue(c, n, d) }

func (c f16Codec) Put(dst []byte, n, d, i int, x []float32) {
	p := c.row(dst, d, i)
	x = x[:d]
	for j, v := range x {
		binary.LittleEndian.PutUint16(p[2*j:], tensor.F32ToF16(v))
	}
}

func (c f16Codec) Get(src []byte, n, d, i int, out []float32) {
	p := c.row(src, d, i)
	out = out[:d]
	for j := range out {
		out[j] = halfTab[binary.LittleEndian.Uint16(p[2*j:])]
	}
}

func (c f16Codec) Dot(src []byte, n, d, i int, q []float32) float32 {
	p := c.row(src, d, i)
	q = q[:d]
	var s0, s1, s2, s3 float32
	for len(q) >= 4 && len(p) >= 8 {
		s0 += q[0] * halfTab[binary.LittleEndian.Uint16(p[0:])]
		s1 += q[1] * halfTab[binary.LittleEndian.Uint16(p[2:])]
		s2 += q[2] * halfTab[binary.LittleEndian.Uint16(p[4:])]
		s3 += q[3] * halfTab[binary.LittleEndian.Uint16(p[6:])]
		q, p = q[4:], p[8:]
	}
	for j, v := range q {
		s0 += v * halfTab[binary.LittleEndian.Uint16(p[2*j:])]
	}
	return (s0 + s1) + (s2 + s3)
}

func (c f16Codec) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	p := c.row(src, d, i)
	out = out[:d]
	for len(out) >= 4 && len(p) >= 8 {
		out[0] += a * halfTab[binary.LittleEndian.Uint16(p[0:])]
		out[1] += a * halfTab[binary.LittleEndian.Uint16(p[2:])]
		out[2] += a * halfTab[binary.LittleEndian.Uint16(p[4:])]
		out[3] += a * halfTab[binary.LittleEndian.Uint16(p[6:])]
		out, p = out[4:], p[8:]
	}
	for j := range out {
		out[j] += a * halfTab[binary.LittleEndian.Uint16(p[2*j:])]
	}
}

// bf16Codec: bfloat16, round to nearest even; NaN stays NaN.
type bf16Codec struct{ half16 }

func (bf16Codec) Name() string                    { return "bf16" }
func (c bf16Codec) BitsPerValue(n, d int) float64 { return bitsPerValue(c, n, d) }

func bf16(p []byte) float32 { return math.Float32frombits(uint32(binary.LittleEndian.Uint16(p)) << 16) }

func (c bf16Codec) Put(dst []byte, n, d, i int, x []float32) {
	p := c.row(dst, d, i)
	x = x[:d]
	for j, v := range x {
		binary.LittleEndian.PutUint16(p[2*j:], tensor.F32ToBF16(v))
	}
}

func (c bf16Codec) Get(src []byte, n, d, i int, out []float32) {
	p := c.row(src, d, i)
	out = out[:d]
	for j := range out {
		out[j] = bf16(p[2*j:])
	}
}

func (c bf16Codec) Dot(src []byte, n, d, i int, q []float32) float32 {
	p := c.row(src, d, i)
	q = q[:d]
	var s0, s1, s2, s3 float32
	for len(q) >= 4 && len(p) >= 8 {
		s0 += q[0] * bf16(p[0:])
		s1 += q[1] * bf16(p[2:])
		s2 += q[2] * bf16(p[4:])
		s3 += q[3] * bf16(p[6:])
		q, p = q[4:], p[8:]
	}
	for j, v := range q {
		s0 += v * bf16(p[2*j:])
	}
	return (s0 + s1) + (s2 + s3)
}

func (c bf16Codec) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	p := c.row(src, d, i)
	out = out[:d]
	for len(out) >= 4 && len(p) >= 8 {
		out[0] += a * bf16(p[0:])
		out[1] += a * bf16(p[2:])
		out[2] += a * bf16(p[4:])
		out[3] += a * bf16(p[6:])
		out, p = out[4:], p[8:]
	}
	for j := range out {
		out[j] += a * bf16(p[2*j:])
	}
}
