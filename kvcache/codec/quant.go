package codec

import (
	"encoding/binary"
	"fmt"

	"github.com/kvlm/kvlm/tensor"
)

// tokenQuant is asymmetric min-max quantization per token, in groups of
// channels: q8 and q4 (one group = the whole head, group 0) and KIVI values
// (groups of min(group, d) channels).
//
// Block layout, rb = ⌈d·bits/8⌉ bytes per row, ng = ⌈d/g⌉ groups per token:
//
//	[0, n·rb)              payload: row i at i·rb, channels packed low bits first
//	[n·rb, n·rb + 4·n·ng)  meta: token i, group k at n·rb + 4·(i·ng + k):
//	                       f16 scale, f16 min (x̂ = scale·u + min)
type tokenQuant struct {
	defaults
	name   string
	bits   int
	group  int  // channels per group; 0 means d
	intDot bool // q8dot, q4dot values: attention sums them with integer weights (IntDot)
}

// Shifted returns c storing x − mu instead of x, for a codec quantizing per
// token (q8, q4): Get and Axpy add mu back and Dot adds q·mu (computed once
// per block by DotBlock), so every read is the same as with c except that
// the quantization error is that of x − mu. The block layout and bits per
// value do not change; mu lives with the codec, not in the blocks (Base
// gives the codec the bytes are laid out in, for copying slots). Keys
// whose channels carry a large common offset (the low-frequency RoPE pairs
// of most models) have a per-token range set by that offset; subtracting a
// mean shrinks the range and with it every channel's step.
//
// Any other codec, or a nil mu, is returned unchanged (floats gain
// nothing; KIVI keys are quantized per channel, which a per-channel offset
// does not change). mu must hold finite values, one per channel of the
// vectors it will store; it is copied.
func Shifted(c Codec, mu []float32) Codec {
	if mu != nil && c.Shiftable() {
		if s := c.WithShift(mu); s != nil {
			return s
		}
	}
	return c
}

// Shift returns the mean a Shifted codec subtracts, or nil.
func Shift(c Codec) []float32 { return c.Shift() }

// Base returns the codec whose layout c's blocks have: c itself, or the
// plain codec of a Shifted one. Slot bytes copied with CopySlot(Base(c), …)
// between blocks of the same c stay valid.
func Base(c Codec) Codec {
	if u := c.Unshifted(); u != nil {
		return u
	}
	return c
}

// Shiftable: q8 and q4, one quantization group per token, the case the
// shift is for (see Shifted); KIVI values are not shifted.
func (c *tokenQuant) Shiftable() bool { return c.group == 0 }

func (c *tokenQuant) WithShift(mu []float32) Codec {
	if !c.Shiftable() {
		return nil
	}
	return &shiftedQuant{tokenQuant: c, shift: append([]float32(nil), mu...)}
}

// Residual: KIVI values (grouped channels) keep the newest tokens in full
// precision, as KIVI keys do.
func (c *tokenQuant) Residual() int {
	if c.group > 0 {
		return DefaultResidual
	}
	return 0
}

// shiftedQuant is a tokenQuant over x − shift (see Shifted). It embeds the
// plain codec, so it overrides every method that reads values (Get, Dot,
// Axpy, GetRows, DotBlock) to add the shift back; TestCapabilities holds
// each capability of a shifted codec to its Get.
type shiftedQuant struct {
	*tokenQuant
	shift []float32 // [d]
}

// A shifted codec takes no second shift; its blocks have the plain codec's
// layout (so slots copy as the plain codec's, promoted from it).
func (c *shiftedQuant) Shiftable() bool              { return false }
func (c *shiftedQuant) WithShift(mu []float32) Codec { return nil }
func (c *shiftedQuant) Shift() []float32             { return c.shift }
func (c *shiftedQuant) Unshifted() Codec             { return c.tokenQuant }

func (c *shiftedQuant) String() string { return c.tokenQuant.String() + " shifted" }

// maxShiftStack is the widest vector Put shifts in a stack buffer.
const maxShiftStack = 256

func (c *shiftedQuant) Put(dst []byte, n, d, i int, x []float32) {
	var buf [maxShiftStack]float32
	c.tokenQuant.Put(dst, n, d, i, minusShift(&buf, x, c.shift, d))
}

// minusShift returns x − shift over d values, in buf when it has room.
func minusShift(buf *[maxShiftStack]float32, x, shift []float32, d int) []float32 {
	var y []float32
	if d <= maxShiftStack {
		y = buf[:d]
	} else {
		y = make([]float32, d)
	}
	for j, m := range shift[:d] {
		y[j] = x[j] - m
	}
	return y
}

// plusShift adds a·shift to out (d values), a product then a sum each.
func plusShift(out []float32, a float32, shift []float32, d int) {
	for j, m := range shift[:d] {
		out[j] += a * m
	}
}

func (c *shiftedQuant) Get(src []byte, n, d, i int, out []float32) {
	c.tokenQuant.Get(src, n, d, i, out)
	tensor.Axpy(out[:d], 1, c.shift[:d]) // out += shift: 1·m is exact
}

func (c *shiftedQuant) Dot(src []byte, n, d, i int, q []float32) float32 {
	return c.tokenQuant.Dot(src, n, d, i, q) + dotF32(q[:d], c.shift[:d])
}

// DotBlock scores the first len(out) slots, with q·shift computed once.
func (c *shiftedQuant) DotBlock(src []byte, n, d int, q []float32, out []float32) bool {
	qm := dotF32(q[:d], c.shift[:d])
	for i := range out {
		out[i] = c.tokenQuant.Dot(src, n, d, i, q) + qm
	}
	return true
}

func (c *shiftedQuant) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	c.tokenQuant.Axpy(src, n, d, i, a, out)
	plusShift(out, a, c.shift, d)
}

func dotF32(a, b []float32) float32 {
	var s float32
	for j, v := range a {
		s += v * b[j]
	}
	return s
}

func (c *tokenQuant) Name() string   { return c.name }
func (c *tokenQuant) IntDot() bool   { return c.intDot }
func (c *tokenQuant) Bits() int      { return c.bits }
func (c *tokenQuant) PerToken() bool { return true }
func (c *tokenQuant) String() string { return fmt.Sprintf("%s(group %d)", c.name, c.group) }

// GroupChannels is the channels per quantization group at head width d.
func (c *tokenQuant) GroupChannels(d int) int {
	if c.group <= 0 || c.group >= d {
		return d
	}
	return c.group
}

func (c *tokenQuant) rowBytes(d int) int { return (d*c.bits + 7) / 8 }

func (c *tokenQuant) groups(d int) int {
	g := c.GroupChannels(d)
	return (d + g - 1) / g
}

func (c *tokenQuant) BlockBytes(n, d int) int {
	return n * (c.rowBytes(d) + 4*c.groups(d))
}

func (c *tokenQuant) BitsPerValue(n, d int) float64 { return bitsPerValue(c, n, d) }

// slot returns token i's payload row and its meta entries.
func (c *tokenQuant) slot(b []byte, n, d, i int) (row, metas []byte) {
	rb, ng := c.rowBytes(d), c.groups(d)
	row = b[i*rb : (i+1)*rb]
	m := n*rb + 4*i*ng
	return row, b[m : m+4*ng]
}

func (c *tokenQuant) Put(dst []byte, n, d, i int, x []float32) {
	row, metas := c.slot(dst, n, d, i)
	x = x[:d]
	clear(row)
	g, top := c.GroupChannels(d), 1<<c.bits-1
	for k, c0 := 0, 0; c0 < d; k, c0 = k+1, c0+g {
		seg := x[c0:min(c0+g, d)]
		lo, hi := rangeOf(seg)
		scale, mn := fitRange(lo, hi, top)
		binary.LittleEndian.PutUint32(metas[4*k:], meta(scale, mn))
		z := newQuantizer(scale, mn, top)
		for j, v := range seg {
			pack(row, c.bits, c0+j, z.level(v))
		}
	}
}

func (c *tokenQuant) Get(src []byte, n, d, i int, out []float32) {
	row, metas := c.slot(src, n, d, i)
	out = out[:d]
	g := c.GroupChannels(d)
	for k, c0 := 0, 0; c0 < d; k, c0 = k+1, c0+g {
		s, m := unmeta(binary.LittleEndian.Uint32(metas[4*k:]))
		for j := c0; j < min(c0+g, d); j++ {
			out[j] = s*float32(unpack(row, c.bits, j)) + m
		}
	}
}

func (c *tokenQuant) Dot(src []byte, n, d, i int, q []float32) float32 {
	row, metas := c.slot(src, n, d, i)
	q = q[:d]
	g := c.GroupChannels(d)
	if g == d { // q8, q4, and KIVI values at d ≤ G: one group
		s, m := unmeta(binary.LittleEndian.Uint32(metas))
		su, sq := c.dot(row, q)
		return s*su + m*sq
	}
	gb := g * c.bits / 8
	var acc float32
	for len(q) > 0 && len(metas) >= 4 {
		w := min(g, len(q))
		s, m := unmeta(binary.LittleEndian.Uint32(metas))
		su, sq := c.dot(row, q[:w])
		acc += s*su + m*sq
		q, metas = q[w:], metas[4:]
		if len(row) > gb {
			row = row[gb:]
		}
	}
	return acc
}

func (c *tokenQuant) dot(p []byte, q []float32) (su, sq float32) {
	switch c.bits {
	case 8:
		return dot8(p, q)
	case 4:
		return dot4(p, q)
	}
	return dot2(p, q)
}

func (c *tokenQuant) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	row, metas := c.slot(src, n, d, i)
	out = out[:d]
	g := c.GroupChannels(d)
	gb := g * c.bits / 8
	for len(out) > 0 && len(metas) >= 4 {
		w := min(g, len(out))
		s, m := unmeta(binary.LittleEndian.Uint32(metas))
		switch c.bits {
		case 8:
			axpy8(row, a*s, a*m, out[:w])
		case 4:
			axpy4(row, a*s, a*m, out[:w])
		default:
			axpy2(row, a*s, a*m, out[:w])
		}
		out, metas = out[w:], metas[4:]
		if len(row) > gb {
			row = row[gb:]
		}
	}
}
