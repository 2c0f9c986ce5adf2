package codec

import (
	"encoding/binary"

	"github.com/kvlm/kvlm/tensor"
)

// Block access for attention's tiled kernels (package attention): a block
// of a float codec is a plain [n][d] array that the tensor kernels read in
// place (keys transposed into panels, values as rows); other codecs decode a
// run of slots to float32 rows first (GetRows), once per tile of queries
// instead of once per query.

// Plain reports the element type of a codec whose block is n rows of d
// values of one float type (f32, f16, bf16: row i at byte i·d·size, no
// metadata), which attention's kernels read in place; false for others
// (Codec.Plain).
func Plain(c Codec) (tensor.DType, bool) { return c.Plain() }

func (f32Codec) Plain() (tensor.DType, bool)  { return tensor.F32, true }
func (f16Codec) Plain() (tensor.DType, bool)  { return tensor.F16, true }
func (bf16Codec) Plain() (tensor.DType, bool) { return tensor.BF16, true }

// GetRows decodes slots i0 … i0+cnt−1 of a block of n slots into out
// [cnt][d], each exactly as Get decodes it, with the per-codec work done
// once per call (Codec.GetRows): q8, q4 and KIVI values decode through byte
// tables, KIVI keys read their per-channel metadata once; other codecs
// decode slot by slot.
func GetRows(c Codec, src []byte, n, d, i0, cnt int, out []float32) {
	out = out[:cnt*d]
	if c.GetRows(src, n, d, i0, cnt, out) {
		return
	}
	for i := range cnt {
		c.Get(src, n, d, i0+i, out[i*d:(i+1)*d])
	}
}

// GetRows decodes whole groups of bytes through tensor.ScaleLevels.
func (c *tokenQuant) GetRows(src []byte, n, d, i0, cnt int, out []float32) bool {
	g := c.GroupChannels(d)
	if g*c.bits%8 != 0 || (c.bits != 8 && c.bits != 4 && c.bits != 2) {
		return false
	}
	c.getRows(src, n, d, i0, cnt, g, out[:cnt*d])
	return true
}

// GetRows is the plain codec's, then out += 1·shift per row: the product
// is exact, so these are the bits of the plain sum, in SIMD.
func (c *shiftedQuant) GetRows(src []byte, n, d, i0, cnt int, out []float32) bool {
	if !c.tokenQuant.GetRows(src, n, d, i0, cnt, out) {
		return false
	}
	for i := range cnt {
		tensor.Axpy(out[i*d:(i+1)*d], 1, c.shift[:d])
	}
	return true
}

// GetRows reads the per-channel metadata once.
func (c *kiviKeys) GetRows(src []byte, n, d, i0, cnt int, out []float32) bool {
	if (c.bits != 4 && c.bits != 2) || d > maxStackDim {
		return false
	}
	c.getRows(src, n, d, i0, cnt, out[:cnt*d])
	return true
}

// getRows is Get for cnt slots: per token and group of g channels (whole
// bytes) x̂ = scale·u + min.
func (c *tokenQuant) getRows(src []byte, n, d, i0, cnt, g int, out []float32) {
	rb, ng := c.rowBytes(d), c.groups(d)
	if c.bits != 8 && d%tensor.AttnLanes == 0 && g%tensor.AttnLanes == 0 && cnt*d <= rowsAtOnce {
		c.getRowsLanes(src, n, d, i0, cnt, g, out)
		return
	}
	for i := range cnt {
		row := src[(i0+i)*rb : (i0+i+1)*rb]
		metas := src[n*rb+4*(i0+i)*ng : n*rb+4*(i0+i+1)*ng]
		o := out[i*d : (i+1)*d]
		for k, c0 := 0, 0; c0 < d; k, c0 = k+1, c0+g {
			s, m := unmeta(binary.LittleEndian.Uint32(metas[4*k:]))
			w := min(g, d-c0)
			oc := o[c0 : c0+w]
			p := row[c0*c.bits/8:]
			decodeLevels(p, c.bits, s, m, oc)
		}
	}
}

// rowsAtOnce bounds the values getRowsLanes decodes in one call (a panel
// of 16 slots of a head of up to 256 channels).
const rowsAtOnce = tensor.AttnLanes * maxStackDim

// getRowsLanes is getRows in one kernel call for cnt slots of 2- or 4-bit
// levels whose groups are whole rows of 16 values: each group's scale and
// minimum repeated for its rows of 16 (g/16, fewer in a short last
// group), the cnt slots' payload (rows adjacent, d·bits/8 bytes each)
// decoded by tensor.ScaleLevelRows. Each value is s·u + m, rounded as
// decodeLevels rounds it: the same bits, one call a panel instead of one
// a group.
func (c *tokenQuant) getRowsLanes(src []byte, n, d, i0, cnt, g int, out []float32) {
	const L = tensor.AttnLanes
	rb, ng := c.rowBytes(d), c.groups(d)
	var sb, mb, gs, gm [rowsAtOnce / L]float32
	rows := cnt * d / L
	sc, mn := sb[:rows], mb[:rows]
	unmetas(src[n*rb+4*i0*ng:n*rb+4*(i0+cnt)*ng], gs[:cnt*ng], gm[:cnt*ng])
	r, k := 0, 0
	for range cnt {
		for c0 := 0; c0 < d; c0 += g {
			s, m := gs[k], gm[k]
			k++
			for range min(g, d-c0) / L {
				sc[r], mn[r] = s, m
				r++
			}
		}
	}
	tensor.ScaleLevelRows(out[:cnt*d], src[i0*rb:(i0+cnt)*rb], c.bits, sc, mn)
}

// decodeLevels sets out[j] = s·u_j + m for the levels u_j of bits bits
// packed in p from its first byte (tensor.ScaleLevels).
func decodeLevels(p []byte, bits int, s, m float32, out []float32) {
	tensor.ScaleLevels(out, p, bits, s, m)
}

// getRows is Get for cnt slots, the per-channel metadata decoded once.
func (c *kiviKeys) getRows(src []byte, n, d, i0, cnt int, out []float32) {
	var sc, mn [maxStackDim]float32
	c.scales(src, n, d, sc[:], mn[:])
	for i := range cnt {
		e, L := panelSlot(n, d, i0+i)
		o := out[i*d : (i+1)*d]
		for ch := range o {
			o[ch] = sc[ch]*float32(unpack(src, c.bits, e+ch*L)) + mn[ch]
		}
	}
}

// LevelRows: q8 and q4 rows (one group a slot) and KIVI values (groups
// of 16·k channels) in place, the slots' metadata decoded and spread over
// their 16-channel runs (Codec.LevelRows).
func (c *tokenQuant) LevelRows(src []byte, n, d, i0, cnt int, sm []float32) ([]byte, int, int, bool) {
	const L = tensor.AttnLanes
	g := c.GroupChannels(d)
	ng := c.groups(d)
	if (c.bits != 8 && c.bits != 4 && c.bits != 2) || d*c.bits%8 != 0 || cnt < 1 || cnt > L ||
		(ng > 1 && g%L != 0) || len(sm) < 2*L*((d+L-1)/L) {
		return nil, 0, 0, false
	}
	rb := c.rowBytes(d)
	m := n*rb + 4*i0*ng
	var buf [2 * L]float32
	for grp := range ng { // the 16 slots' pairs of group grp: i·ng + grp
		if ng == 1 && cnt == L {
			tensor.HalfPairs(&buf, src[m:m+4*L])
		} else {
			var mb [4 * L]byte
			for i := range cnt {
				binary.LittleEndian.PutUint32(mb[4*i:], binary.LittleEndian.Uint32(src[m+4*(i*ng+grp):]))
			}
			tensor.HalfPairs(&buf, mb[:])
		}
		for k := grp * g / L; k*L < min((grp+1)*g, d); k++ { // its runs of 16 channels
			copy(sm[2*L*k:2*L*(k+1)], buf[:])
		}
	}
	return src[i0*rb : (i0+cnt)*rb], c.bits, rb, true
}

// LevelRows: none, the shift is not in the levels (shifted rows decode
// through GetRows).
func (c *shiftedQuant) LevelRows(src []byte, n, d, i0, cnt int, sm []float32) ([]byte, int, int, bool) {
	return nil, 0, 0, false
}
