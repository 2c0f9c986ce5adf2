package kvcalc

import (
	"fmt"
	"strings"
)

// Codec names a KV cache storage format. The names are those of the kvcache
// package's codecs, and the sizes below follow their metadata layout.
type Codec string

// The codecs, with their storage cost in bits per value, metadata included,
// for heads of d values:
//
//	f32    32
//	f16    16
//	bf16   16
//	q8     8 + 32/d   asymmetric, per token per head: 8-bit codes plus an
//	                  f16 scale and an f16 zero point per token per head
//	q4     4 + 32/d   the same with 4-bit codes
//	kivi2  keys 2 + 32/G, values 2 + 32·⌈d/G⌉/d, plus an f16 residual
//	kivi4  keys 4 + 32/G, values 4 + 32·⌈d/G⌉/d, plus an f16 residual
//
// KIVI (arXiv 2402.02750) quantizes keys per channel over groups of G = 32
// tokens (an f16 scale and an f16 minimum per channel per group) and values
// per token over groups of G channels (an f16 scale and minimum per group;
// ⌈d/G⌉ groups per token per head, which is the 32/min(G, d) bits of the
// usual formula whenever d is a multiple of G or at most G). The most recent
// R = 128 tokens of each sequence stay in f16 (the residual). Each token's
// codes are byte-aligned rows (as kvcache/codec lays them out), which adds
// padding only when d·b is not a multiple of 8 (kivi2 with d ≡ 2 mod 4).
const (
	F32   Codec = "f32"
	F16   Codec = "f16"
	BF16  Codec = "bf16"
	Q8    Codec = "q8"
	Q4    Codec = "q4"
	KIVI2 Codec = "kivi2"
	KIVI4 Codec = "kivi4"
)

// KIVI's group size G (tokens per key group, channels per value group) and
// residual length R (tokens per sequence kept in f16).
const (
	KIVIGroup    = 32
	KIVIResidual = 128
)

// metaBits is the metadata of one group: an f16 scale and an f16 zero point
// (or minimum).
const metaBits = 32

// Codecs lists every codec, in order of decreasing size.
func Codecs() []Codec { return []Codec{F32, F16, BF16, Q8, Q4, KIVI2, KIVI4} }

// sameBlocks names the kvcache codecs that store another's blocks and
// differ only in how attention reads them (q8dot, q4dot: integer dot
// products): their sizes are that codec's.
var sameBlocks = map[string]Codec{"q8dot": Q8, "q4dot": Q4}

// ParseCodec returns the codec called name (exactly one of Codecs(), or a
// kvcache codec with another's blocks, as that one: q8dot as q8, q4dot as
// q4).
func ParseCodec(name string) (Codec, error) {
	for _, c := range Codecs() {
		if string(c) == name {
			return c, nil
		}
	}
	if c, ok := sameBlocks[name]; ok {
		return c, nil
	}
	names := make([]string, 0, 7)
	for _, c := range Codecs() {
		names = append(names, string(c))
	}
	return "", fmt.Errorf("unknown KV codec %q (known: %s; q8dot and q4dot size as q8 and q4)", name, strings.Join(names, ", "))
}

// Residual is the number of tokens per sequence this codec keeps in f16
// beside its quantized tokens (KIVI's R), 0 for the others.
func (c Codec) Residual() int {
	if c == KIVI2 || c == KIVI4 {
		return KIVIResidual
	}
	return 0
}

// codeBits is the bits of one quantized code.
func (c Codec) codeBits() (int64, bool) {
	switch c {
	case F32:
		return 32, true
	case F16, BF16:
		return 16, true
	case Q8:
		return 8, true
	case Q4:
		return 4, true
	case KIVI2:
		return 2, true
	case KIVI4:
		return 4, true
	}
	return 0, false
}

// keyBitsPerToken is the storage of one token's key in one (layer, KV head),
// in bits, metadata included (quantized part for KIVI).
func (c Codec) keyBitsPerToken(headDim int) (int64, error) {
	b, ok := c.codeBits()
	if !ok {
		_, err := ParseCodec(string(c))
		return 0, err
	}
	if headDim <= 0 {
		return 0, fmt.Errorf("head dim %d must be positive", headDim)
	}
	d := int64(headDim)
	switch c {
	case Q8, Q4:
		return payloadBits(b, d) + metaBits, nil
	case KIVI2, KIVI4:
		// One scale+min per channel per G tokens: 32/G bits per value.
		return payloadBits(b, d) + d*metaBits/KIVIGroup, nil
	}
	return b * d, nil
}

// payloadBits is one token's codes: rows are byte-aligned, as kvcache/codec
// stores them (padding only when d·b is not a multiple of 8).
func payloadBits(b, d int64) int64 { return 8 * ((b*d + 7) / 8) }

// valueBitsPerToken is the same for one token's value.
func (c Codec) valueBitsPerToken(headDim int) (int64, error) {
	if c == KIVI2 || c == KIVI4 {
		if headDim <= 0 {
			return 0, fmt.Errorf("head dim %d must be positive", headDim)
		}
		b, _ := c.codeBits()
		d := int64(headDim)
		groups := (d + KIVIGroup - 1) / KIVIGroup
		return payloadBits(b, d) + metaBits*groups, nil
	}
	return c.keyBitsPerToken(headDim)
}

// KeyBits is the storage of one key value in bits, metadata included, for
// heads of headDim values (for KIVI: the quantized tokens; its residual is
// f16).
func (c Codec) KeyBits(headDim int) (float64, error) {
	n, err := c.keyBitsPerToken(headDim)
	return float64(n) / float64(headDim), err
}

// ValueBits is the storage of one value-cache value in bits, metadata
// included (for KIVI: the quantized tokens).
func (c Codec) ValueBits(headDim int) (float64, error) {
	n, err := c.valueBitsPerToken(headDim)
	return float64(n) / float64(headDim), err
}

// BitsPerValue returns the bits per value, metadata included, of keys stored
// in codec k and of values stored in codec v, for heads of headDim values.
// For KIVI codecs these are the rates of the quantized tokens; the residual
// tokens cost 16 bits per value.
func BitsPerValue(k, v Codec, headDim int) (kBits, vBits float64, err error) {
	if kBits, err = k.KeyBits(headDim); err != nil {
		return 0, 0, err
	}
	if vBits, err = v.ValueBits(headDim); err != nil {
		return 0, 0, err
	}
	return kBits, vBits, nil
}
