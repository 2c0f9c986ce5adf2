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

// MoveSlots moves slots src … src+cnt−1 of block b (n slots) to dst …
// dst+cnt−1, dst < src, in bulk where c lays the slots out so (see
// Codec.MoveSlots); false when it does not, and nothing is moved.
func MoveSlots(c Codec, b []byte, n, d, dst, src, cnt int) bool {
	if cnt <= 0 || dst == src {
		return true
	}
	if dst > src || dst < 0 || src+cnt > n {
		return false
	}
	return c.MoveSlots(b, n, d, dst, src, cnt)
}

// Rows of d values, one after another: one copy (Go's copy is a memmove).
func (c f32Codec) MoveSlots(b []byte, n, d, dst, src, cnt int) bool {
	copy(b[4*dst*d:], b[4*src*d:4*(src+cnt)*d])
	return true
}

func (c half16) MoveSlots(b []byte, n, d, dst, src, cnt int) bool {
	copy(b[2*dst*d:], b[2*src*d:2*(src+cnt)*d])
	return true
}

// The payload rows, then the metadata of the same slots.
func (c *tokenQuant) MoveSlots(b []byte, n, d, dst, src, cnt int) bool {
	rb, mb := c.rowBytes(d), 4*c.groups(d)
	copy(b[dst*rb:], b[src*rb:(src+cnt)*rb])
	m := n * rb
	copy(b[m+dst*mb:], b[m+src*mb:m+(src+cnt)*mb])
	return true
}
