// Package codec encodes the keys or values of one KV head for the token slots
// of one cache block, and lets attention read them in place.
//
// A block of a (layer, KV head) holds n token slots of d values each (d =
// head_dim, even, 8..256 in practice). Keys and values pick their codecs
// separately. Every codec works on the whole block's byte slice (of length
// BlockBytes(n, d)) and addresses slot i inside it, so the attention kernels
// call Dot (scores, q·k_i) and Axpy (out += p_i·v_i) straight on the encoded
// bytes: there is never a dequantized copy of the cache.
//
// Codecs and block layouts (all multi-byte fields little-endian; "meta" is
// one 4-byte entry {f16 scale, f16 min}, x̂ = scale·q + min):
//
//	f32   [n][d]float32                                   32 bits/value
//	f16   [n][d]uint16 IEEE half, round to nearest even    16
//	bf16  [n][d]uint16 bfloat16, round to nearest even     16
//	      (f32/f16/bf16 keys: the same values in groups of 16 slots, each
//	      group [d][16], the score panel attention reads; see F32Keys)
//	q8    payload [n][d]uint8, then meta [n]               8 + 32/d
//	      (q8, q4 keys: the levels in groups of 16 slots, each [d][16];
//	      Q8Keys, Q4Keys)
//	q4    payload [n][d/2]byte, then meta [n]              4 + 32/d
//	kivi2/kivi4 (Values): payload [n][⌈d·b/8⌉]byte, then meta [n][⌈d/g⌉],
//	      g = min(G, d) channels per group                 b + 32/g
//	kivi2/kivi4 (Keys): payload [n][⌈d·b/8⌉]byte, then meta [d] (one per
//	      channel, the range of the whole G-token group)   b + 32/n
//
// Packing of sub-byte payloads: within a token's row, channel c lives in
// byte c·b/8 at bit (c·b)%8, low bits first (q4: channel 2j in the low nibble
// of byte j, 2j+1 in the high nibble; 2-bit: channel 4j in bits 0-1 of byte
// j, 4j+1 in bits 2-3, ...). Rows are byte-aligned; a row whose d·b is not a
// multiple of 8 is padded with zero bits.
//
// Quantization (q8, q4, KIVI) is asymmetric min-max with b bits, top =
// 2^b-1. Over each group (a token for q8/q4, a token's g channels for KIVI
// values, a channel over G tokens for KIVI keys) with finite range [lo, hi]:
//
//	min   = the largest f16 ≤ lo                      (rounded down)
//	scale = the smallest f16 ≥ (hi − min)/top          (rounded up)
//	q     = round((x − min)/scale), clamped to [0, top]
//
// The directed rounding of the two f16 metadata makes [min, min+top·scale]
// cover [lo, hi], so no finite in-range value is clamped and the error is
// |x − x̂| ≤ scale/2 (plus float32 rounding of the decode), with scale at most
// one f16 ulp (relative 2^-10) above (hi−min)/top. A constant group whose
// value is an f16 gets scale 0 and decodes exactly; any other constant gets a
// tiny scale and errs by at most that scale/2 (≤ |c|·2^-11/top).
//
// Shifted q8/q4 (keys): Shifted(c, mu) stores x − mu in c's layout and adds
// mu back on every read (Get, Axpy; Dot adds q·mu), so a head whose vectors
// share a large offset is quantized over its spread instead; mu is one
// [d] vector per codec instance (per (layer, KV head) in the cache), not
// block metadata, so bits per value are unchanged.
//
// Non-finite and huge inputs never panic: the range is taken over finite
// values only (0,0 if there is none); NaN and −Inf encode as q = 0 (x̂ =
// min), +Inf as q = top (x̂ = min+top·scale). The f16 metadata saturate at
// ±65504: min below −65504 becomes −65504 and scale above 65504 becomes
// 65504, so values beyond those bounds are clamped. The float codecs store
// NaN and ±Inf as such (f16 overflows to ±Inf above 65519).
package codec

import (
	"fmt"
	"strings"
)

// KIVI defaults (arXiv 2402.02750): quantization groups of 32 (tokens for
// keys, channels for values) and a full-precision residual window of 128
// tokens. The residual is kept by the cache, not by this package.
const (
	DefaultGroup    = 32
	DefaultResidual = 128
)

// Kind says whether a codec stores keys or values; only KIVI cares.
type Kind int

const (
	Keys Kind = iota
	Values
)

func (k Kind) String() string {
	switch k {
	case Keys:
		return "keys"
	case Values:
		return "values"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Codec encodes one head's vectors (keys or values) for the tokens of one
// block. src/dst is the whole block, BlockBytes(n, d) long; i is the slot.
// Dot and Axpy do not allocate. Lengths are not checked beyond Go's bounds
// checks: a short slice panics.
type Codec interface {
	Name() string                                           // "f32","f16","bf16","q8","q4","kivi2","kivi4"
	Bits() int                                              // payload bits per value (32,16,16,8,4,2,4)
	BlockBytes(n, d int) int                                // bytes of a block of n slots × d values, metadata included
	BitsPerValue(n, d int) float64                          // 8·BlockBytes/(n·d): the honest cost including metadata
	PerToken() bool                                         // slots can be written one at a time with Put
	Put(dst []byte, n, d, i int, x []float32)               // encode slot i from x[:d] (PerToken codecs only; others panic)
	Get(src []byte, n, d, i int, out []float32)             // decode slot i into out[:d]
	Dot(src []byte, n, d, i int, q []float32) float32       // q[:d] · x_i read straight from src
	Axpy(src []byte, n, d, i int, a float32, out []float32) // out[:d] += a · x_i
}

// Grouped is implemented by codecs whose quantization groups span tokens
// (KIVI keys): the caller supplies the per-channel range computed over the
// whole group of G tokens, which may span several blocks (see ChannelRange).
type Grouped interface {
	Codec
	GroupTokens() int // G
	// EncodeRange encodes all n slots of a block from x [n][d], with lo/hi
	// [d] the per-channel min/max over the group the block belongs to.
	EncodeRange(dst []byte, n, d int, x []float32, lo, hi []float32)
}

// Names lists the codec names Parse accepts.
var Names = []string{"f32", "f16", "bf16", "q8", "q4", "kivi2", "kivi4"}

// Parse returns the codec called name (case-insensitive) for keys or values.
// KIVI codecs use DefaultGroup; keys get the per-channel Grouped flavour,
// values the per-token one.
func Parse(name string, kind Kind) (Codec, error) {
	if kind != Keys && kind != Values {
		return nil, fmt.Errorf("codec: invalid kind %d", int(kind))
	}
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "f32":
		if kind == Keys {
			return F32Keys, nil
		}
		return F32, nil
	case "f16":
		if kind == Keys {
			return F16Keys, nil
		}
		return F16, nil
	case "bf16":
		if kind == Keys {
			return BF16Keys, nil
		}
		return BF16, nil
	case "q8":
		if kind == Keys {
			return Q8Keys, nil
		}
		return Q8, nil
	case "q4":
		if kind == Keys {
			return Q4Keys, nil
		}
		return Q4, nil
	case "kivi2":
		return newKIVI(2, DefaultGroup, kind)
	case "kivi4":
		return newKIVI(4, DefaultGroup, kind)
	}
	return nil, fmt.Errorf("codec: unknown codec %q (known: %s)", name, strings.Join(Names, ", "))
}

func newKIVI(bits, group int, kind Kind) (Codec, error) {
	if kind == Keys {
		return NewKIVIKeys(bits, group)
	}
	return NewKIVIValues(bits, group)
}

// Float codecs; safe for concurrent use.
var (
	F32  Codec = f32Codec{}
	F16  Codec = f16Codec{}
	BF16 Codec = bf16Codec{}
	Q8   Codec = &tokenQuant{name: "q8", bits: 8}
	Q4   Codec = &tokenQuant{name: "q4", bits: 4}
)

// NewKIVIValues returns KIVI's value codec: per token, groups of min(group,
// d) channels, bits 2 or 4. group must keep groups byte-aligned (group·bits
// a multiple of 8).
func NewKIVIValues(bits, group int) (Codec, error) {
	if bits != 2 && bits != 4 {
		return nil, fmt.Errorf("codec: KIVI bits %d, want 2 or 4", bits)
	}
	if group <= 0 || group*bits%8 != 0 {
		return nil, fmt.Errorf("codec: KIVI value group %d must be positive with group·%d a multiple of 8", group, bits)
	}
	return &tokenQuant{name: fmt.Sprintf("kivi%d", bits), bits: bits, group: group}, nil
}

// NewKIVIKeys returns KIVI's key codec: per channel over groups of group
// tokens, bits 2 or 4.
func NewKIVIKeys(bits, group int) (Grouped, error) {
	if bits != 2 && bits != 4 {
		return nil, fmt.Errorf("codec: KIVI bits %d, want 2 or 4", bits)
	}
	if group <= 0 {
		return nil, fmt.Errorf("codec: KIVI key group %d must be positive", group)
	}
	return &kiviKeys{name: fmt.Sprintf("kivi%d", bits), bits: bits, group: group}, nil
}

func bitsPerValue(c Codec, n, d int) float64 {
	return 8 * float64(c.BlockBytes(n, d)) / float64(n*d)
}

// BlockDotter is implemented by codecs that score many slots of a block
// faster together than with one Dot call each. KIVI keys have it: their
// per-channel metadata is decoded once per block instead of once per slot.
type BlockDotter interface {
	// DotBlock sets out[i] = q·x_i for the first len(out) ≤ n slots.
	DotBlock(src []byte, n, d int, q []float32, out []float32)
}

// DotAll sets out[i] = q·x_i for the first len(out) ≤ n slots of a block,
// through c's DotBlock when it has one. It does not allocate.
func DotAll(c Codec, src []byte, n, d int, q, out []float32) {
	if b, ok := c.(BlockDotter); ok {
		b.DotBlock(src, n, d, q, out)
		return
	}
	for i := range out {
		out[i] = c.Dot(src, n, d, i, q)
	}
}
