package codec

import (
	"encoding/binary"
	"math"

	"github.com/kvlm/kvlm/tensor"
)

// keyPanels stores keys of a float type (f32, f16, bf16) the way
// attention's score kernels read them, so that they read a block in place
// instead of transposing its keys into a panel every step
// (tensor.PackKeys). The block's slots go in groups of 16
// (tensor.AttnLanes); each group is stored value-major:
//
//	group g (slots 16g … 16g+L−1, L = min(16, n−16g)) from element 16g·d:
//	value c of slot 16g+j at element 16g·d + c·L + j
//
// A full group is exactly the [d][16] panel of tensor.AttnScoresOf; the
// block has the row codec's size, with no padding. Each value is encoded as
// the row codec of its type encodes it (f16, bf16: round to nearest even),
// so keys read back, score and sum as they do in rows.
type keyPanels struct {
	defaults
	t   tensor.DType // F32, F16 or BF16
	row Codec        // the row codec of the same type: F32, F16, BF16
}

// The key codecs of the float types: Parse("f32"|"f16"|"bf16", Keys)
// returns them; they are named as their row codecs.
var (
	F32Keys  Codec = keyPanels{t: tensor.F32, row: F32}
	F16Keys  Codec = keyPanels{t: tensor.F16, row: F16}
	BF16Keys Codec = keyPanels{t: tensor.BF16, row: BF16}
)

func (c keyPanels) Name() string                  { return c.row.Name() }
func (c keyPanels) Bits() int                     { return c.row.Bits() }
func (c keyPanels) BlockBytes(n, d int) int       { return c.row.BlockBytes(n, d) }
func (c keyPanels) BitsPerValue(n, d int) float64 { return bitsPerValue(c, n, d) }
func (keyPanels) PerToken() bool                  { return true }

func (c keyPanels) size() int { return c.row.Bits() / 8 }

// panelSlot returns, for slot i of a block of n slots of d values laid out
// in panels, the element of its first value and the stride L between its
// values (the width of its group).
func panelSlot(n, d, i int) (e, L int) {
	g := i &^ (tensor.AttnLanes - 1)
	L = min(tensor.AttnLanes, n-g)
	return g*d + i - g, L
}

// fullGroup reports whether slots i0 … i0+15 of a block of n slots are one
// full group of its panels (and there are values to read).
func fullGroup(n, d, i0 int) bool {
	return i0 >= 0 && i0%tensor.AttnLanes == 0 && i0+tensor.AttnLanes <= n && d > 0
}

// slot returns the bytes of slot i's group from its first value on, and
// the stride in bytes between its values.
func (c keyPanels) slot(b []byte, n, d, i int) ([]byte, int) {
	es := c.size()
	e, L := panelSlot(n, d, i)
	return b[es*e : es*(e+(d-1)*L+1)], es * L
}

// CopySlot copies slot si of src (sn slots) into slot di of dst (dn).
func (c keyPanels) CopySlot(dst []byte, dn, di int, src []byte, sn, si, d int) bool {
	dv, dst2 := c.slot(dst, dn, d, di)
	sv, sst := c.slot(src, sn, d, si)
	if c.size() == 2 { // f16, bf16: one 16-bit move a value
		for k := range d {
			binary.LittleEndian.PutUint16(dv[k*dst2:], binary.LittleEndian.Uint16(sv[k*sst:]))
		}
		return true
	}
	for k := range d {
		binary.LittleEndian.PutUint32(dv[k*dst2:], binary.LittleEndian.Uint32(sv[k*sst:]))
	}
	return true
}

// MoveSlots moves slots inside one group of 16: value c of the slots is a
// run of the group's row c, so one copy a value (d copies, not cnt·d).
// When the run starts the group and ends it (the window sliding past an
// evicted token), the whole group moves by src−dst values in one copy:
// each row's head takes its own later values, and only the vacated slots
// at the row's end take the next row's.
func (c keyPanels) MoveSlots(b []byte, n, d, dst, src, cnt int) bool {
	return movePanelRun(b, c.size(), n, d, dst, src, cnt)
}

// movePanelRun is keyPanels.MoveSlots over elements of es bytes (q8 key
// panels' levels are elements of one byte): false when the run crosses
// its group.
func movePanelRun(b []byte, es, n, d, dst, src, cnt int) bool {
	g := dst &^ (tensor.AttnLanes - 1)
	if (src+cnt-1)&^(tensor.AttnLanes-1) != g {
		return false
	}
	e0, L := panelSlot(n, d, g)
	if dst == g && src+cnt == g+L {
		s := src - dst
		copy(b[es*e0:], b[es*(e0+s):es*(e0+d*L)])
		return true
	}
	for k := range d {
		row := b[es*(e0+k*L) : es*(e0+(k+1)*L)]
		copy(row[es*(dst-g):], row[es*(src-g):es*(src-g+cnt)])
	}
	return true
}

func (c keyPanels) Put(dst []byte, n, d, i int, x []float32) {
	v, st := c.slot(dst, n, d, i)
	for k, x := range x[:d] {
		switch c.t {
		case tensor.F32:
			binary.LittleEndian.PutUint32(v[k*st:], math.Float32bits(x))
		case tensor.F16:
			binary.LittleEndian.PutUint16(v[k*st:], tensor.F32ToF16(x))
		default:
			binary.LittleEndian.PutUint16(v[k*st:], tensor.F32ToBF16(x))
		}
	}
}

func (c keyPanels) Get(src []byte, n, d, i int, out []float32) {
	v, st := c.slot(src, n, d, i)
	out = out[:d]
	for k := range out {
		switch c.t {
		case tensor.F32:
			out[k] = math.Float32frombits(binary.LittleEndian.Uint32(v[k*st:]))
		case tensor.F16:
			out[k] = halfTab[binary.LittleEndian.Uint16(v[k*st:])]
		default:
			out[k] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(v[k*st:])) << 16)
		}
	}
}

// gather copies slot i's encoded values into row, as the row codec lays
// out a one-slot block.
func (c keyPanels) gather(src []byte, n, d, i int, row []byte) {
	v, st := c.slot(src, n, d, i)
	es := c.size()
	for k := range d {
		copy(row[k*es:(k+1)*es], v[k*st:k*st+es])
	}
}

// Dot and Axpy gather the slot and run the row codec on it: the same bits
// as keys stored in rows.
func (c keyPanels) Dot(src []byte, n, d, i int, q []float32) float32 {
	var buf [4 * maxStackDim]byte
	row := buf[:]
	if d > maxStackDim {
		row = make([]byte, 4*d)
	}
	c.gather(src, n, d, i, row)
	switch c.t { // concrete calls, so that buf stays on the stack
	case tensor.F32:
		return f32Codec{}.Dot(row, 1, d, 0, q)
	case tensor.F16:
		return f16Codec{}.Dot(row, 1, d, 0, q)
	}
	return bf16Codec{}.Dot(row, 1, d, 0, q)
}

func (c keyPanels) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	var buf [4 * maxStackDim]byte
	row := buf[:]
	if d > maxStackDim {
		row = make([]byte, 4*d)
	}
	c.gather(src, n, d, i, row)
	switch c.t {
	case tensor.F32:
		f32Codec{}.Axpy(row, 1, d, 0, a, out)
	case tensor.F16:
		f16Codec{}.Axpy(row, 1, d, 0, a, out)
	default:
		bf16Codec{}.Axpy(row, 1, d, 0, a, out)
	}
}

// KeyPanel returns, in place, the [d][16] score panel of slots i0 … i0+15
// of a block of n slots and the type of its values (for
// tensor.AttnScoresOf), when c stores panels (F32Keys, F16Keys, BF16Keys)
// and those 16 slots are one full group of the block; false otherwise
// (Codec.KeyPanel).
func KeyPanel(c Codec, src []byte, n, d, i0 int) ([]byte, tensor.DType, bool) {
	return c.KeyPanel(src, n, d, i0)
}

func (c keyPanels) KeyPanel(src []byte, n, d, i0 int) ([]byte, tensor.DType, bool) {
	if !fullGroup(n, d, i0) {
		return nil, 0, false
	}
	es := c.size()
	return src[es*i0*d : es*(i0+tensor.AttnLanes)*d], c.t, true
}

// quantPanels stores q8 or q4 keys (the per-token quantizer of Q8 or Q4)
// with their levels laid out in score panels: level c of slot 16g+j is
// element 16g·d + c·L + j of the payload (groups of L = min(16, n−16g)
// slots, as keyPanels; an element is a byte for q8, a nibble for q4, low
// nibble first), and each slot's metadata {f16 scale, f16 min} where the
// row codec keeps it, at n·rb + 4i (rb: the row codec's bytes a row). Every
// slot quantizes and decodes exactly as the row codec's; attention decodes
// a full group straight into its float32 score panel (DecodeKeyPanel)
// instead of decoding rows and transposing them.
type quantPanels struct {
	defaults
	tq     *tokenQuant // Q8 or Q4: the quantizer, the metadata, the block size
	intDot bool        // q8dot, q4dot: attention scores the panels by integer dot products (IntDot)
}

// Q8Keys and Q4Keys are the q8 and q4 codecs of keys, in panels;
// Parse("q8"|"q4", Keys) returns them, and Shifted wraps them as it wraps
// Q8 and Q4.
var (
	Q8Keys Codec = quantPanels{tq: q8}
	Q4Keys Codec = quantPanels{tq: q4}
)

// Q8DotKeys and Q4DotKeys are Q8Keys and Q4Keys, the same blocks, for
// attention that scores their panels by integer dot products with the
// query rounded to int8 (IntDot; tensor.AttnScoresDot): Parse("q8dot" |
// "q4dot", Keys) returns them (and Q8, Q4 for values).
var (
	Q8DotKeys Codec = quantPanels{tq: q8, intDot: true}
	Q4DotKeys Codec = quantPanels{tq: q4, intDot: true}
)

func (c quantPanels) Name() string {
	if c.intDot {
		return c.tq.name + "dot"
	}
	return c.tq.name
}
func (c quantPanels) IntDot() bool                  { return c.intDot }
func (c quantPanels) Bits() int                     { return c.tq.bits }
func (c quantPanels) BlockBytes(n, d int) int       { return c.tq.BlockBytes(n, d) }
func (c quantPanels) BitsPerValue(n, d int) float64 { return bitsPerValue(c, n, d) }
func (quantPanels) PerToken() bool                  { return true }
func (quantPanels) Shiftable() bool                 { return true }

func (c quantPanels) WithShift(mu []float32) Codec {
	return &shiftedPanels{quantPanels: c, shift: append([]float32(nil), mu...)}
}

// at returns the element of slot i's first level and the stride between
// its levels, and slot i's metadata.
func (c quantPanels) at(b []byte, n, d, i int) (e, st int, meta []byte) {
	e, st = panelSlot(n, d, i)
	m := n*c.tq.rowBytes(d) + 4*i
	return e, st, b[m : m+4]
}

func (c quantPanels) level(b []byte, e int) byte {
	if c.tq.bits == 8 {
		return b[e]
	}
	return b[e>>1] >> (4 * (e & 1)) & 15
}

func (c quantPanels) setLevel(b []byte, e int, v byte) {
	if c.tq.bits == 8 {
		b[e] = v
		return
	}
	sh := 4 * (e & 1)
	b[e>>1] = b[e>>1]&^(15<<sh) | v<<sh
}

// one returns a one-slot row-codec block: d levels' row and a meta entry.
func (c quantPanels) one(buf *[maxStackDim + 4]byte, d int) []byte {
	n := c.tq.rowBytes(d) + 4
	if n > len(buf) {
		return make([]byte, n)
	}
	b := buf[:n]
	clear(b)
	return b
}

func (c quantPanels) Put(dst []byte, n, d, i int, x []float32) {
	var buf [maxStackDim + 4]byte
	b := c.one(&buf, d)
	c.tq.Put(b, 1, d, 0, x)
	e, st, meta := c.at(dst, n, d, i)
	for k := range d {
		c.setLevel(dst, e+k*st, byte(unpack(b, c.tq.bits, k)))
	}
	copy(meta, b[c.tq.rowBytes(d):])
}

// gather copies slot i into the one-slot row-codec block b (zeroed).
func (c quantPanels) gather(src []byte, n, d, i int, b []byte) {
	e, st, meta := c.at(src, n, d, i)
	for k := range d {
		pack(b, c.tq.bits, k, uint32(c.level(src, e+k*st)))
	}
	copy(b[c.tq.rowBytes(d):], meta)
}

func (c quantPanels) Get(src []byte, n, d, i int, out []float32) {
	var buf [maxStackDim + 4]byte
	b := c.one(&buf, d)
	c.gather(src, n, d, i, b)
	c.tq.Get(b, 1, d, 0, out)
}

func (c quantPanels) Dot(src []byte, n, d, i int, q []float32) float32 {
	var buf [maxStackDim + 4]byte
	b := c.one(&buf, d)
	c.gather(src, n, d, i, b)
	return c.tq.Dot(b, 1, d, 0, q)
}

func (c quantPanels) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	var buf [maxStackDim + 4]byte
	b := c.one(&buf, d)
	c.gather(src, n, d, i, b)
	c.tq.Axpy(b, 1, d, 0, a, out)
}

// CopySlot copies slot si of src (sn slots) into slot di of dst (dn).
func (c quantPanels) CopySlot(dst []byte, dn, di int, src []byte, sn, si, d int) bool {
	de, dst2, dm := c.at(dst, dn, d, di)
	se, sst, sm := c.at(src, sn, d, si)
	for k := range d {
		c.setLevel(dst, de+k*dst2, c.level(src, se+k*sst))
	}
	copy(dm, sm)
	return true
}

// MoveSlots moves slots inside one group of 16, as keyPanels.MoveSlots
// does: level c of the slots is a run of the group's row c (q8: one copy
// a row, or the whole group in one copy when the run ends it; q4: the
// row's nibbles one by one, ascending), and the slots' metadata, one
// entry a slot, in one copy.
func (c quantPanels) MoveSlots(b []byte, n, d, dst, src, cnt int) bool {
	if c.tq.bits == 8 {
		if !movePanelRun(b, 1, n, d, dst, src, cnt) {
			return false
		}
	} else {
		g := dst &^ (tensor.AttnLanes - 1)
		if (src+cnt-1)&^(tensor.AttnLanes-1) != g {
			return false
		}
		e0, L := panelSlot(n, d, g)
		for k := range d {
			e := e0 + k*L - g
			for j := range cnt {
				c.setLevel(b, e+dst+j, c.level(b, e+src+j))
			}
		}
	}
	m := n * c.tq.rowBytes(d)
	copy(b[m+4*dst:], b[m+4*src:m+4*(src+cnt)])
	return true
}

// shiftedPanels is quantPanels over x − shift, read back as shiftedQuant
// reads the row codec (see Shifted). Like shiftedQuant it overrides every
// method of the embedded codec that reads values (Get, Dot, Axpy,
// DecodeKeyPanel); slots copy as the plain codec's.
type shiftedPanels struct {
	quantPanels
	shift []float32 // [d]
}

func (c *shiftedPanels) Shiftable() bool              { return false }
func (c *shiftedPanels) WithShift(mu []float32) Codec { return nil }
func (c *shiftedPanels) Shift() []float32             { return c.shift }
func (c *shiftedPanels) Unshifted() Codec             { return c.quantPanels }

func (c *shiftedPanels) Put(dst []byte, n, d, i int, x []float32) {
	var buf [maxShiftStack]float32
	c.quantPanels.Put(dst, n, d, i, minusShift(&buf, x, c.shift, d))
}

func (c *shiftedPanels) Get(src []byte, n, d, i int, out []float32) {
	c.quantPanels.Get(src, n, d, i, out)
	tensor.Axpy(out[:d], 1, c.shift[:d]) // out += shift: 1·m is exact
}

func (c *shiftedPanels) Dot(src []byte, n, d, i int, q []float32) float32 {
	return c.quantPanels.Dot(src, n, d, i, q) + dotF32(q[:d], c.shift[:d])
}

func (c *shiftedPanels) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	c.quantPanels.Axpy(src, n, d, i, a, out)
	plusShift(out, a, c.shift, d)
}

// DecodeKeyPanel decodes slots i0 … i0+15 of a block of n slots into the
// [d][16] float32 score panel out (tensor.AttnScores's layout), each value
// exactly as Get decodes it, when c stores quantized keys in panels (q8 or
// q4 keys, shifted or not; KIVI keys) and those slots are one full group
// of the block; it reports false otherwise (Codec.DecodeKeyPanel).
func DecodeKeyPanel(c Codec, src []byte, n, d, i0 int, out []float32) bool {
	return c.DecodeKeyPanel(src, n, d, i0, out)
}

func (c quantPanels) DecodeKeyPanel(src []byte, n, d, i0 int, out []float32) bool {
	return c.decodePanel(src, n, d, i0, nil, out)
}

func (c *shiftedPanels) DecodeKeyPanel(src []byte, n, d, i0 int, out []float32) bool {
	return c.quantPanels.decodePanel(src, n, d, i0, c.shift[:d], out)
}

// decodePanel decodes a full group with each slot's scale and minimum,
// plus shift per row when shift is not nil.
func (c quantPanels) decodePanel(src []byte, n, d, i0 int, shift, out []float32) bool {
	if !fullGroup(n, d, i0) {
		return false
	}
	var sm [2 * tensor.AttnLanes]float32
	m := n*c.tq.rowBytes(d) + 4*i0
	meta := src[m : m+4*tensor.AttnLanes]
	for j := range tensor.AttnLanes {
		sm[j], sm[tensor.AttnLanes+j] = unmeta(binary.LittleEndian.Uint32(meta[4*j:]))
	}
	if c.tq.bits == 8 {
		tensor.ScalePanel(out, src[i0*d:(i0+tensor.AttnLanes)*d], &sm, shift, d)
	} else {
		tensor.ScalePanel4(out, src[i0*d/2:(i0+tensor.AttnLanes)*d/2], &sm, shift, d)
	}
	return true
}

// DecodeKeyPanel for KIVI keys: row c of the panel is channel c of the 16
// slots, decoded with the channel's scale and minimum.
func (c *kiviKeys) DecodeKeyPanel(src []byte, n, d, i0 int, out []float32) bool {
	if !fullGroup(n, d, i0) || d > maxStackDim {
		return false
	}
	var sc, mn [maxStackDim]float32
	c.scales(src, n, d, sc[:], mn[:])
	lo, hi := i0*d*c.bits/8, (i0+tensor.AttnLanes)*d*c.bits/8
	tensor.ScaleLevelRows(out, src[lo:hi], c.bits, sc[:d], mn[:d])
	return true
}

// LevelPanel: a full group's levels in place and its slots' metadata
// decoded (Codec.LevelPanel).
func (c quantPanels) LevelPanel(src []byte, n, d, i0 int, sm *[2 * tensor.AttnLanes]float32) ([]byte, int, []float32, bool) {
	if !fullGroup(n, d, i0) || d*c.tq.bits%8 != 0 {
		return nil, 0, nil, false
	}
	bits := c.tq.bits
	m := n*c.tq.rowBytes(d) + 4*i0
	tensor.HalfPairs(sm, src[m:m+4*tensor.AttnLanes])
	return src[i0*d*bits/8 : (i0+tensor.AttnLanes)*d*bits/8], bits, nil, true
}

func (c *shiftedPanels) LevelPanel(src []byte, n, d, i0 int, sm *[2 * tensor.AttnLanes]float32) ([]byte, int, []float32, bool) {
	lv, bits, _, ok := c.quantPanels.LevelPanel(src, n, d, i0, sm)
	return lv, bits, c.shift[:d], ok
}

// ChannelPanel: a full group's levels in place and the block's
// per-channel metadata decoded (Codec.ChannelPanel).
func (c *kiviKeys) ChannelPanel(src []byte, n, d, i0 int, sc, mn []float32) ([]byte, int, bool) {
	if !fullGroup(n, d, i0) || d > maxStackDim || len(sc) < d || len(mn) < d {
		return nil, 0, false
	}
	c.scales(src, n, d, sc, mn)
	return src[i0*d*c.bits/8 : (i0+tensor.AttnLanes)*d*c.bits/8], c.bits, true
}
