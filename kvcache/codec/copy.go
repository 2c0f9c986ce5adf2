package codec

// CopySlot copies slot si of block src (laid out for sn slots) into slot di
// of block dst (laid out for dn slots) without decoding it: the bytes of a
// quantized slot, metadata included, move unchanged, so compaction is
// lossless. It reports false for codecs whose slots are not self-contained
// (KIVI keys, whose per-channel metadata belongs to a group of tokens).
// See Codec.CopySlot.
func CopySlot(c Codec, dst []byte, dn, di int, src []byte, sn, si, d int) bool {
	return c.CopySlot(dst, dn, di, src, sn, si, d)
}

func (c f32Codec) CopySlot(dst []byte, dn, di int, src []byte, sn, si, d int) bool {
	copy(c.row(dst, d, di), c.row(src, d, si))
	return true
}

func (c half16) CopySlot(dst []byte, dn, di int, src []byte, sn, si, d int) bool {
	copy(c.row(dst, d, di), c.row(src, d, si))
	return true
}

func (c *tokenQuant) CopySlot(dst []byte, dn, di int, src []byte, sn, si, d int) bool {
	dr, dm := c.slot(dst, dn, d, di)
	sr, sm := c.slot(src, sn, d, si)
	copy(dr, sr)
	copy(dm, sm)
	return true
}
