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
// metadata), which attention's kernels read in place; false for others.
func Plain(c Codec) (tensor.DType, bool) {
	switch c.(type) {
	case f32Codec:
		return tensor.F32, true
	case f16Codec:
		return tensor.F16, true
	case bf16Codec:
		return tensor.BF16, true
	}
	return 0, false
}

// GetRows decodes slots i0 … i0+cnt−1 of a block of n slots into out
// [cnt][d], each exactly as Get decodes it, with the per-codec work done
// once per call: q8, q4 and KIVI values decode through byte tables, KIVI
// keys read their per-channel metadata once.
func GetRows(c Codec, src []byte, n, d, i0, cnt int, out []float32) {
	out = out[:cnt*d]
	switch c := c.(type) {
	case *tokenQuant:
		if g := c.GroupChannels(d); g*c.bits%8 == 0 && (c.bits == 8 || c.bits == 4 || c.bits == 2) {
			c.getRows(src, n, d, i0, cnt, g, out)
			return
		}
	case *shiftedQuant:
		if g := c.GroupChannels(d); g*c.bits%8 == 0 && (c.bits == 8 || c.bits == 4 || c.bits == 2) {
			c.tokenQuant.getRows(src, n, d, i0, cnt, g, out)
			for i := range cnt {
				// out += 1·shift: the product is exact, so these are the
				// bits of the plain sum, in SIMD
				tensor.Axpy(out[i*d:(i+1)*d], 1, c.shift[:d])
			}
			return
		}
	case *kiviKeys:
		if (c.bits == 4 || c.bits == 2) && d <= maxStackDim {
			c.getRows(src, n, d, i0, cnt, out)
			return
		}
	}
	for i := range cnt {
		c.Get(src, n, d, i0+i, out[i*d:(i+1)*d])
	}
}

// getRows is Get for cnt slots: per token and group of g channels (whole
// bytes) x̂ = scale·u + min.
func (c *tokenQuant) getRows(src []byte, n, d, i0, cnt, g int, out []float32) {
	rb, ng := c.rowBytes(d), c.groups(d)
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

// decodeLevels sets out[j] = s·u_j + m for the levels u_j of bits bits
// packed in p from its first byte (tensor.ScaleLevels).
func decodeLevels(p []byte, bits int, s, m float32, out []float32) {
	tensor.ScaleLevels(out, p, bits, s, m)
}

// getRows is Get for cnt slots, the per-channel metadata decoded once.
func (c *kiviKeys) getRows(src []byte, n, d, i0, cnt int, out []float32) {
	var sc, mn [maxStackDim]float32
	c.scales(src, n, d, &sc, &mn)
	for i := range cnt {
		e, L := panelSlot(n, d, i0+i)
		o := out[i*d : (i+1)*d]
		for ch := range o {
			o[ch] = sc[ch]*float32(unpack(src, c.bits, e+ch*L)) + mn[ch]
		}
	}
}
