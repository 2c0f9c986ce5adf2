package codec

// CopySlot copies slot si of block src (laid out for sn slots) into slot di
// of block dst (laid out for dn slots) without decoding it: the bytes of a
// quantized slot, metadata included, move unchanged, so compaction is
// lossless. It reports false for codecs whose slots are not self-contained
// (KIVI keys, whose per-channel metadata belongs to a group of tokens).
func CopySlot(c Codec, dst []byte, dn, di int, src []byte, sn, si, d int) bool {
	switch c := c.(type) {
	case f32Codec:
		copy(c.row(dst, d, di), c.row(src, d, si))
	case keyPanels:
		c.copySlot(dst, dn, di, src, sn, si, d)
	case quantPanels:
		c.copySlot(dst, dn, di, src, sn, si, d)
	case f16Codec:
		copy(c.row(dst, d, di), c.row(src, d, si))
	case bf16Codec:
		copy(c.row(dst, d, di), c.row(src, d, si))
	case *tokenQuant:
		dr, dm := c.slot(dst, dn, d, di)
		sr, sm := c.slot(src, sn, d, si)
		copy(dr, sr)
		copy(dm, sm)
	default:
		return false
	}
	return true
}
