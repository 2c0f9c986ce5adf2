package codec

import (
	"encoding/binary"
	"math"

	"github.com/kvlm/kvlm/tensor"
)

// halfToF32 converts IEEE half bits to float32 exactly (same results as
// tensor.F16ToF32, NaN payloads included) without a call into float16; the
// two branches are taken only for subnormals, Inf and NaN.
func halfToF32(h uint16) float32 {
	o := uint32(h&0x7fff) << 13
	e := o & 0x0f800000
	o += (127 - 15) << 23
	switch e {
	case 0x0f800000: // Inf / NaN
		o += (128 - 16) << 23
	case 0: // zero / subnormal: renormalize through a float subtraction
		o += 1 << 23
		o = math.Float32bits(math.Float32frombits(o) - math.Float32frombits(113<<23))
	}
	return math.Float32frombits(o | uint32(h&0x8000)<<16)
}

const (
	halfMax    = 65504.0 // largest finite f16
	halfMaxPos = 0x7bff
	halfMaxNeg = 0xfbff
)

// halfUp toward +Inf, halfDown toward −Inf: the next f16 bit pattern.
func halfUp(h uint16) uint16 {
	switch {
	case h == 0x8000 || h == 0:
		return 0x0001
	case h&0x8000 != 0:
		return h - 1
	}
	return h + 1
}

func halfDown(h uint16) uint16 {
	switch {
	case h == 0 || h == 0x8000:
		return 0x8001
	case h&0x8000 != 0:
		return h + 1
	}
	return h - 1
}

// halfFloor is the largest f16 ≤ v, saturated to [−65504, 65504]; v finite.
func halfFloor(v float64) uint16 {
	if v <= -halfMax {
		return halfMaxNeg
	}
	if v >= halfMax {
		return halfMaxPos
	}
	h := tensor.F32ToF16(float32(v))
	if float64(halfToF32(h)) > v {
		h = halfDown(h)
	}
	return h
}

// halfCeil is the smallest f16 ≥ v, saturated to [−65504, 65504]; v finite.
func halfCeil(v float64) uint16 {
	if v >= halfMax {
		return halfMaxPos
	}
	if v <= -halfMax {
		return halfMaxNeg
	}
	h := tensor.F32ToF16(float32(v))
	if float64(halfToF32(h)) < v {
		h = halfUp(h)
	}
	return h
}

// finite reports whether f is neither NaN nor ±Inf.
func finite(f float32) bool { return f-f == 0 }

// fitRange turns a finite range [lo, hi] (lo ≤ hi) into f16 metadata
// {scale, min} for top = 2^b−1 levels: min rounded down, scale rounded up,
// so that [min, min+top·scale] ⊇ [lo, hi] unless the f16 range saturates.
func fitRange(lo, hi float32, top int) (scale, min uint16) {
	min = halfFloor(float64(lo))
	m := float64(halfToF32(min))
	s := (float64(hi) - m) / float64(top)
	if s <= 0 {
		return 0, min
	}
	return halfCeil(s), min
}

// meta packs {scale, min} as stored: scale in the low 16 bits.
func meta(scale, min uint16) uint32 { return uint32(scale) | uint32(min)<<16 }

func unmeta(m uint32) (scale, min float32) {
	return halfTab[uint16(m)], halfTab[uint16(m>>16)]
}

// unmetas decodes the len(sc) pairs of metas into sc and mn as unmeta
// does, 16 at a time with tensor.HalfPairs (the table lookups of unmeta
// miss the cache at long contexts).
func unmetas(metas []byte, sc, mn []float32) {
	const L = tensor.AttnLanes
	n := len(sc)
	mn = mn[:n]
	var sm [2 * L]float32
	k := 0
	for ; k+L <= n; k += L {
		tensor.HalfPairs(&sm, metas[4*k:4*(k+L)])
		copy(sc[k:k+L], sm[:L])
		copy(mn[k:k+L], sm[L:])
	}
	for ; k < n; k++ {
		sc[k], mn[k] = unmeta(binary.LittleEndian.Uint32(metas[4*k:]))
	}
}

// quantizer maps x to the level round((x−min)/scale) in [0, top]; NaN and
// values below the range give 0, +Inf and values above give top.
type quantizer struct {
	min, inv, top float64
}

func newQuantizer(scale, min uint16, top int) quantizer {
	q := quantizer{min: float64(halfToF32(min)), top: float64(top)}
	if s := float64(halfToF32(scale)); s > 0 {
		q.inv = 1 / s
	}
	return q
}

func (z quantizer) level(x float32) uint32 {
	v := (float64(x) - z.min) * z.inv
	if !(v >= 0) { // NaN, below range, or Inf·0
		return 0
	}
	if v >= z.top {
		return uint32(z.top)
	}
	return uint32(v + 0.5)
}

// rangeOf is the min and max of the finite values of x; (0, 0) if none.
func rangeOf(x []float32) (lo, hi float32) {
	lo, hi = float32(math.Inf(1)), float32(math.Inf(-1))
	for _, v := range x {
		if !finite(v) {
			continue
		}
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	if lo > hi {
		return 0, 0
	}
	return lo, hi
}

// ChannelRange computes, for KIVI keys, the per-channel min and max of the
// finite values of x ([t][d], the t tokens of one group, which may span
// blocks) into lo[:d] and hi[:d]; a channel without finite values gets 0, 0.
func ChannelRange(x []float32, d int, lo, hi []float32) {
	lo, hi = lo[:d], hi[:d]
	inf := float32(math.Inf(1))
	for c := range lo {
		lo[c], hi[c] = inf, -inf
	}
	for len(x) >= d {
		row := x[:d]
		for c, v := range row {
			if !finite(v) {
				continue
			}
			if v < lo[c] {
				lo[c] = v
			}
			if v > hi[c] {
				hi[c] = v
			}
		}
		x = x[d:]
	}
	for c := range lo {
		if lo[c] > hi[c] {
			lo[c], hi[c] = 0, 0
		}
	}
}
