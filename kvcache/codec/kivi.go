package codec

import (
	"encoding/binary"
	"fmt"
)

// kiviKeys is KIVI's key codec: asymmetric min-max per channel over a group
// of G tokens. A group usually spans several blocks (G = 32 over 16-token
// blocks); each block keeps its own copy of the group's per-channel metadata
// so that it can be read and freed alone.
//
// Block layout, rb = ⌈d·bits/8⌉ bytes per row:
//
//	[0, n·rb)            payload: row i at i·rb, channels packed low bits first
//	[n·rb, n·rb + 4·d)   meta: channel c at n·rb + 4·c: f16 scale, f16 min
//	                     (x̂_ic = scale_c·u_ic + min_c)
//
// Slots are written all at once by EncodeRange; Put panics.
type kiviKeys struct {
	name  string
	bits  int
	group int
}

func (c *kiviKeys) Name() string                  { return c.name }
func (c *kiviKeys) Bits() int                     { return c.bits }
func (c *kiviKeys) PerToken() bool                { return false }
func (c *kiviKeys) GroupTokens() int              { return c.group }
func (c *kiviKeys) String() string                { return fmt.Sprintf("%s keys(group %d)", c.name, c.group) }
func (c *kiviKeys) rowBytes(d int) int            { return (d*c.bits + 7) / 8 }
func (c *kiviKeys) BlockBytes(n, d int) int       { return n*c.rowBytes(d) + 4*d }
func (c *kiviKeys) BitsPerValue(n, d int) float64 { return bitsPerValue(c, n, d) }

func (c *kiviKeys) slot(b []byte, n, d, i int) (row, metas []byte) {
	rb := c.rowBytes(d)
	return b[i*rb : (i+1)*rb], b[n*rb : n*rb+4*d]
}

func (c *kiviKeys) Put(dst []byte, n, d, i int, x []float32) {
	panic("codec: KIVI keys are written a block at a time with EncodeRange")
}

// EncodeRange encodes the n slots of a block from x [n][d]. lo/hi should
// come from ChannelRange over the whole group; a channel whose lo/hi is not
// finite or has lo > hi takes its range from this block's own values.
// Values outside [lo, hi] are clamped to it. A block must lie inside one
// group (n ≤ G, blocks aligned to groups: B = 16, G = 32 in the cache); for
// a block larger than G pass the range of the whole block.
func (c *kiviKeys) EncodeRange(dst []byte, n, d int, x []float32, lo, hi []float32) {
	rb := c.rowBytes(d)
	payload, metas := dst[:n*rb], dst[n*rb:n*rb+4*d]
	x, lo, hi = x[:n*d], lo[:d], hi[:d]
	clear(payload)
	top := 1<<c.bits - 1
	for ch := range d {
		l, h := lo[ch], hi[ch]
		if !finite(l) || !finite(h) || l > h {
			l, h = float32(0), float32(0)
			first := true
			for i := range n {
				if v := x[i*d+ch]; finite(v) {
					if first || v < l {
						l = v
					}
					if first || v > h {
						h = v
					}
					first = false
				}
			}
		}
		scale, mn := fitRange(l, h, top)
		binary.LittleEndian.PutUint32(metas[4*ch:], meta(scale, mn))
		z := newQuantizer(scale, mn, top)
		for i := range n {
			pack(payload[i*rb:(i+1)*rb], c.bits, ch, z.level(x[i*d+ch]))
		}
	}
}

func (c *kiviKeys) Get(src []byte, n, d, i int, out []float32) {
	row, metas := c.slot(src, n, d, i)
	out = out[:d]
	for ch := range out {
		s, m := unmeta(binary.LittleEndian.Uint32(metas[4*ch:]))
		out[ch] = s*float32(unpack(row, c.bits, ch)) + m
	}
}

// Dot computes Σ_c q_c·(scale_c·u_c + min_c), decoding each channel's f16
// metadata on the fly.
func (c *kiviKeys) Dot(src []byte, n, d, i int, q []float32) float32 {
	row, metas := c.slot(src, n, d, i)
	q = q[:d]
	var a0, a1, a2, a3 float32
	if c.bits == 4 {
		for len(q) >= 4 && len(row) >= 2 && len(metas) >= 16 {
			x, y := row[0], row[1]
			a0 += q[0] * kx(metas[0:], uint32(x&15))
			a1 += q[1] * kx(metas[4:], uint32(x>>4))
			a2 += q[2] * kx(metas[8:], uint32(y&15))
			a3 += q[3] * kx(metas[12:], uint32(y>>4))
			q, row, metas = q[4:], row[2:], metas[16:]
		}
	} else {
		for len(q) >= 4 && len(row) >= 1 && len(metas) >= 16 {
			x := row[0]
			a0 += q[0] * kx(metas[0:], uint32(x&3))
			a1 += q[1] * kx(metas[4:], uint32(x>>2&3))
			a2 += q[2] * kx(metas[8:], uint32(x>>4&3))
			a3 += q[3] * kx(metas[12:], uint32(x>>6))
			q, row, metas = q[4:], row[1:], metas[16:]
		}
	}
	for j, v := range q { // d not a multiple of 4
		a0 += v * kx(metas[4*j:], unpack(row, c.bits, j))
	}
	return (a0 + a1) + (a2 + a3)
}

func (c *kiviKeys) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	row, metas := c.slot(src, n, d, i)
	out = out[:d]
	if c.bits == 4 {
		for len(out) >= 4 && len(row) >= 2 && len(metas) >= 16 {
			x, y := row[0], row[1]
			out[0] += a * kx(metas[0:], uint32(x&15))
			out[1] += a * kx(metas[4:], uint32(x>>4))
			out[2] += a * kx(metas[8:], uint32(y&15))
			out[3] += a * kx(metas[12:], uint32(y>>4))
			out, row, metas = out[4:], row[2:], metas[16:]
		}
	} else {
		for len(out) >= 4 && len(row) >= 1 && len(metas) >= 16 {
			x := row[0]
			out[0] += a * kx(metas[0:], uint32(x&3))
			out[1] += a * kx(metas[4:], uint32(x>>2&3))
			out[2] += a * kx(metas[8:], uint32(x>>4&3))
			out[3] += a * kx(metas[12:], uint32(x>>6))
			out, row, metas = out[4:], row[1:], metas[16:]
		}
	}
	for j := range out {
		out[j] += a * kx(metas[4*j:], unpack(row, c.bits, j))
	}
}

// kx decodes one key value from its channel's meta entry and level.
func kx(m []byte, u uint32) float32 {
	s, mn := unmeta(binary.LittleEndian.Uint32(m))
	return s*float32(u) + mn
}

// maxStackDim bounds the head width DotBlock handles with a stack buffer;
// wider heads fall back to Dot per slot.
const maxStackDim = 256

// DotBlock folds the per-channel scales into the query once per block,
// qs_c = q_c·scale_c and base = Σ q_c·min_c, so that each slot costs what a
// q4 Dot does: q·x_i = base + Σ qs_c·u_ic.
func (c *kiviKeys) DotBlock(src []byte, n, d int, q, out []float32) {
	if d > maxStackDim {
		for i := range out {
			out[i] = c.Dot(src, n, d, i, q)
		}
		return
	}
	rb := c.rowBytes(d)
	metas := src[n*rb : n*rb+4*d]
	var buf [maxStackDim]float32
	qs := buf[:d]
	q = q[:d]
	var b0, b1 float32
	for ch := 0; ch+1 < d; ch += 2 {
		s0, m0 := unmeta(binary.LittleEndian.Uint32(metas[4*ch:]))
		s1, m1 := unmeta(binary.LittleEndian.Uint32(metas[4*ch+4:]))
		qs[ch], qs[ch+1] = q[ch]*s0, q[ch+1]*s1
		b0 += q[ch] * m0
		b1 += q[ch+1] * m1
	}
	if d&1 != 0 {
		s, m := unmeta(binary.LittleEndian.Uint32(metas[4*(d-1):]))
		qs[d-1] = q[d-1] * s
		b0 += q[d-1] * m
	}
	base := b0 + b1
	for i := range out {
		row := src[i*rb : (i+1)*rb]
		var su float32
		if c.bits == 4 {
			su, _ = dot4(row, qs)
		} else {
			su, _ = dot2(row, qs)
		}
		out[i] = base + su
	}
}
