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
//	[0, n·rb)            payload: the levels laid out in score panels, as the
//	                     float keys' (keyPanels): level c of slot 16g+j is
//	                     element 16g·d + c·L + j, L = min(16, n−16g); element
//	                     e at bits e·bits … of the payload, low bits first
//	[n·rb, n·rb + 4·d)   meta: channel c at n·rb + 4·c: f16 scale, f16 min
//	                     (x̂_ic = scale_c·u_ic + min_c)
//
// A full group of 16 slots is then a [d][16] panel of levels, decoded
// straight into attention's float32 score panel (DecodeKeyPanel: a scale
// and minimum per row of the panel). Slots are written all at once by
// EncodeRange; Put panics.
type kiviKeys struct {
	defaults
	name  string
	bits  int
	group int
}

func (c *kiviKeys) Name() string                  { return c.name }
func (c *kiviKeys) Bits() int                     { return c.bits }
func (c *kiviKeys) PerToken() bool                { return false }
func (c *kiviKeys) GroupTokens() int              { return c.group }
func (c *kiviKeys) Residual() int                 { return DefaultResidual }
func (c *kiviKeys) String() string                { return fmt.Sprintf("%s keys(group %d)", c.name, c.group) }
func (c *kiviKeys) rowBytes(d int) int            { return (d*c.bits + 7) / 8 }
func (c *kiviKeys) BlockBytes(n, d int) int       { return n*c.rowBytes(d) + 4*d }
func (c *kiviKeys) BitsPerValue(n, d int) float64 { return bitsPerValue(c, n, d) }

// metas returns a block's per-channel metadata.
func (c *kiviKeys) metas(b []byte, n, d int) []byte {
	rb := c.rowBytes(d)
	return b[n*rb : n*rb+4*d]
}

// scales decodes a block's per-channel scales and minimums into sc[:d]
// and mn[:d].
func (c *kiviKeys) scales(b []byte, n, d int, sc, mn []float32) {
	unmetas(c.metas(b, n, d), sc[:d], mn[:d])
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
			e, L := panelSlot(n, d, i)
			pack(payload, c.bits, e+ch*L, z.level(x[i*d+ch]))
		}
	}
}

func (c *kiviKeys) Get(src []byte, n, d, i int, out []float32) {
	metas := c.metas(src, n, d)
	e, L := panelSlot(n, d, i)
	out = out[:d]
	for ch := range out {
		s, m := unmeta(binary.LittleEndian.Uint32(metas[4*ch:]))
		out[ch] = s*float32(unpack(src, c.bits, e+ch*L)) + m
	}
}

// Dot computes Σ_c q_c·(scale_c·u_c + min_c), decoding each channel's f16
// metadata on the fly (four accumulators over the channels ≡ 0…3 mod 4).
func (c *kiviKeys) Dot(src []byte, n, d, i int, q []float32) float32 {
	metas := c.metas(src, n, d)
	e, L := panelSlot(n, d, i)
	q = q[:d]
	var a [4]float32
	ch := 0
	for ; ch+4 <= d; ch += 4 {
		for k := range 4 {
			a[k] += q[ch+k] * kx(metas[4*(ch+k):], unpack(src, c.bits, e+(ch+k)*L))
		}
	}
	for ; ch < d; ch++ { // d not a multiple of 4
		a[0] += q[ch] * kx(metas[4*ch:], unpack(src, c.bits, e+ch*L))
	}
	return (a[0] + a[1]) + (a[2] + a[3])
}

func (c *kiviKeys) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	metas := c.metas(src, n, d)
	e, L := panelSlot(n, d, i)
	out = out[:d]
	for ch := range out {
		out[ch] += a * kx(metas[4*ch:], unpack(src, c.bits, e+ch*L))
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
func (c *kiviKeys) DotBlock(src []byte, n, d int, q, out []float32) bool {
	if d > maxStackDim {
		return false // Dot per slot
	}
	metas := c.metas(src, n, d)
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
		e, L := panelSlot(n, d, i)
		var a [4]float32
		ch := 0
		for ; ch+4 <= d; ch += 4 {
			for k := range 4 {
				a[k] += qs[ch+k] * float32(unpack(src, c.bits, e+(ch+k)*L))
			}
		}
		for ; ch < d; ch++ {
			a[0] += qs[ch] * float32(unpack(src, c.bits, e+ch*L))
		}
		out[i] = base + ((a[0] + a[1]) + (a[2] + a[3]))
	}
	return true
}
