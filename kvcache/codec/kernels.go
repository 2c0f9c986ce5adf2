package codec

// Kernels over packed unsigned levels. p starts at the byte holding the
// first channel (always byte-aligned); q/out has one entry per channel.
// dotN returns Σ q_c·u_c and Σ q_c, so that with x̂ = s·u + m the dot
// product is s·Σq·u + m·Σq. axpyN adds as·u_c + am to out_c.
// Levels are turned into floats through small tables (lut8/lut4/lut2, 7 KiB
// in all), which is faster in scalar Go than integer-to-float conversions.
// The loops are written with both slices re-sliced in step and guarded by
// their lengths, which lets the compiler drop the bounds checks.

var (
	lut8 [256]float32    // byte → its value
	lut4 [256][2]float32 // byte → low nibble, high nibble
	lut2 [256][4]float32 // byte → its four 2-bit fields, low bits first

	// halfTab[h] is the float32 value of f16 bits h (256 KiB): one load per
	// element in the f16 codec and the KIVI key metadata.
	halfTab [1 << 16]float32
)

func init() {
	for b := range 256 {
		lut8[b] = float32(b)
		lut4[b] = [2]float32{float32(b & 15), float32(b >> 4)}
		lut2[b] = [4]float32{float32(b & 3), float32(b >> 2 & 3), float32(b >> 4 & 3), float32(b >> 6)}
	}
	for h := range halfTab {
		halfTab[h] = halfToF32(uint16(h))
	}
}

func dot8(p []byte, q []float32) (su, sq float32) {
	var a0, a1, a2, a3, b0, b1 float32
	for len(q) >= 4 && len(p) >= 4 {
		a0 += q[0] * lut8[p[0]]
		a1 += q[1] * lut8[p[1]]
		a2 += q[2] * lut8[p[2]]
		a3 += q[3] * lut8[p[3]]
		b0 += q[0] + q[1]
		b1 += q[2] + q[3]
		q, p = q[4:], p[4:]
	}
	for j, v := range q {
		a0 += v * float32(p[j])
		b0 += v
	}
	return (a0 + a1) + (a2 + a3), b0 + b1
}

func axpy8(p []byte, as, am float32, out []float32) {
	for len(out) >= 4 && len(p) >= 4 {
		out[0] += as*lut8[p[0]] + am
		out[1] += as*lut8[p[1]] + am
		out[2] += as*lut8[p[2]] + am
		out[3] += as*lut8[p[3]] + am
		out, p = out[4:], p[4:]
	}
	for j := range out {
		out[j] += as*float32(p[j]) + am
	}
}

func dot4(p []byte, q []float32) (su, sq float32) {
	var a0, a1, a2, a3, b0, b1 float32
	for len(q) >= 4 && len(p) >= 2 {
		x, y := &lut4[p[0]], &lut4[p[1]]
		a0 += q[0] * x[0]
		a1 += q[1] * x[1]
		a2 += q[2] * y[0]
		a3 += q[3] * y[1]
		b0 += q[0] + q[1]
		b1 += q[2] + q[3]
		q, p = q[4:], p[2:]
	}
	for j, v := range q {
		a0 += v * float32(p[j>>1]>>(4*(j&1))&15)
		b0 += v
	}
	return (a0 + a1) + (a2 + a3), b0 + b1
}

func axpy4(p []byte, as, am float32, out []float32) {
	for len(out) >= 4 && len(p) >= 2 {
		x, y := &lut4[p[0]], &lut4[p[1]]
		out[0] += as*x[0] + am
		out[1] += as*x[1] + am
		out[2] += as*y[0] + am
		out[3] += as*y[1] + am
		out, p = out[4:], p[2:]
	}
	for j := range out {
		out[j] += as*float32(p[j>>1]>>(4*(j&1))&15) + am
	}
}

func dot2(p []byte, q []float32) (su, sq float32) {
	var a0, a1, a2, a3, b0, b1 float32
	for len(q) >= 4 && len(p) >= 1 {
		x := &lut2[p[0]]
		a0 += q[0] * x[0]
		a1 += q[1] * x[1]
		a2 += q[2] * x[2]
		a3 += q[3] * x[3]
		b0 += q[0] + q[1]
		b1 += q[2] + q[3]
		q, p = q[4:], p[1:]
	}
	for j, v := range q {
		a0 += v * float32(p[j>>2]>>(2*(j&3))&3)
		b0 += v
	}
	return (a0 + a1) + (a2 + a3), b0 + b1
}

func axpy2(p []byte, as, am float32, out []float32) {
	for len(out) >= 4 && len(p) >= 1 {
		x := &lut2[p[0]]
		out[0] += as*x[0] + am
		out[1] += as*x[1] + am
		out[2] += as*x[2] + am
		out[3] += as*x[3] + am
		out, p = out[4:], p[1:]
	}
	for j := range out {
		out[j] += as*float32(p[j>>2]>>(2*(j&3))&3) + am
	}
}

// level c of a row packed at b bits (b in 2, 4, 8).
func unpack(p []byte, bits, c int) uint32 {
	pos := c * bits
	return uint32(p[pos>>3]>>(pos&7)) & (1<<bits - 1)
}

// pack ORs level u into channel c of a row (the row must start zeroed).
func pack(p []byte, bits, c int, u uint32) {
	pos := c * bits
	p[pos>>3] |= byte(u << (pos & 7))
}
