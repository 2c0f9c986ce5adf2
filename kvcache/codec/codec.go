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
//	q8dot, q4dot: q8, q4 (the same blocks) that attention reads by
//	      integer dot products (Codec.IntDot), keys and values
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

	"github.com/kvlm/kvlm/tensor"
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
//
// Besides slot access, a codec answers for its capabilities (Capabilities):
// how attention may read its blocks, whether slots copy, whether it takes a
// key shift, whether it seals tokens in groups. Every codec embeds defaults,
// which answer "no" to each, and overrides what it has; callers ask the
// codec, never its type.
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
	Capabilities
}

// Capabilities are what a codec can do beyond reading and writing a slot,
// each with a default in the embedded defaults type that says it cannot
// (false, nil or 0), so that a codec overrides only what it has. The
// package functions of the same names (Plain, KeyPanel, DecodeKeyPanel,
// GetRows, DotAll, CopySlot, MoveSlots, Shifted, Shift, Base) call them and fall back
// to slot-by-slot work where a codec has no faster way.
type Capabilities interface {
	// Plain reports the element type when a block is n rows of d values of
	// one float type (row i at byte i·d·size, no metadata), which
	// attention's kernels read in place.
	Plain() (tensor.DType, bool)
	// KeyPanel returns, in place, the [d][16] score panel of slots i0 …
	// i0+15 of a block of n slots and the type of its values, when the
	// codec stores float keys in panels and those slots are one full group.
	KeyPanel(src []byte, n, d, i0 int) ([]byte, tensor.DType, bool)
	// DecodeKeyPanel decodes slots i0 … i0+15 into the [d][16] float32
	// score panel out, each value exactly as Get decodes it, when the codec
	// stores quantized keys in panels and those slots are one full group.
	DecodeKeyPanel(src []byte, n, d, i0 int, out []float32) bool
	// LevelPanel returns, in place, the levels of slots i0 … i0+15 as a
	// [d][16] panel of levels of bits bits (tensor.AttnScoresQ's layout),
	// with the 16 slots' scales in sm[0:16] and minimums in sm[16:32], and
	// the shift added per channel (nil: none), when the codec stores
	// per-token quantized keys in panels (q8, q4) and those slots are one
	// full group: value c of slot i0+j is sm[j]·u + sm[16+j] (+ shift[c]),
	// exactly as Get decodes it.
	LevelPanel(src []byte, n, d, i0 int, sm *[2 * tensor.AttnLanes]float32) (levels []byte, bits int, shift []float32, ok bool)
	// ChannelPanel returns, in place, the levels of slots i0 … i0+15 as a
	// [d][16] panel of levels of bits bits (tensor.AttnScoresQC's layout),
	// with channel c's scale in sc[c] and minimum in mn[c] (len ≥ d), when
	// the codec quantizes keys per channel in panels (KIVI) and those slots
	// are one full group: value c of slot i0+j is sc[c]·u + mn[c], exactly
	// as Get decodes it.
	ChannelPanel(src []byte, n, d, i0 int, sc, mn []float32) (levels []byte, bits int, ok bool)
	// LevelRows returns, in place, the levels of slots i0 … i0+cnt−1
	// (cnt ≤ 16) as rows of d levels of bits bits, ld bytes apart
	// (tensor.AttnPVQ's layout), with a scale and minimum per slot and 16
	// channels in sm (len ≥ 32·⌈d/16⌉): value c of slot i0+i is
	// sm[32k+i]·u + sm[32k+16+i], k = c/16, exactly as Get decodes it;
	// when the codec quantizes values per token in rows (q8, q4, KIVI
	// values) with every 16 channels inside one group.
	LevelRows(src []byte, n, d, i0, cnt int, sm []float32) (levels []byte, bits, ld int, ok bool)
	// IntDot reports whether attention reads the codec's levels by integer
	// dot products instead of the decoded values' float arithmetic: keys'
	// LevelPanel panels against the query rounded to int8 per row
	// (tensor.AttnScoresDot: q8dot, q4dot keys), values' LevelRows rows
	// against the weights rounded to int8 per row and panel
	// (tensor.AttnPVDot: q8dot, q4dot values). Faster, and not bit for bit
	// what Get's values give.
	IntDot() bool
	// GetRows decodes slots i0 … i0+cnt−1 into out [cnt][d], each exactly as
	// Get decodes it, with the per-codec work done once per call; false
	// when the codec has no such path (the caller then calls Get).
	GetRows(src []byte, n, d, i0, cnt int, out []float32) bool
	// DotBlock sets out[i] = q·x_i for the first len(out) ≤ n slots, faster
	// than one Dot each; false when the codec has no such path.
	DotBlock(src []byte, n, d int, q, out []float32) bool
	// CopySlot copies slot si of block src (sn slots) into slot di of block
	// dst (dn slots) without decoding it; false for codecs whose slots are
	// not self-contained.
	CopySlot(dst []byte, dn, di int, src []byte, sn, si, d int) bool
	// MoveSlots moves slots src … src+cnt−1 of block b (n slots) to dst …
	// dst+cnt−1 (dst < src; the ranges may overlap) without decoding them,
	// as CopySlot would one by one, in a few bulk copies. The slots it
	// vacates (dst+cnt … src+cnt−1) are left undefined; every other slot
	// keeps what it held. False when the codec has no bulk path for these
	// slots (nothing moved: the caller then copies slot by slot).
	MoveSlots(b []byte, n, d, dst, src, cnt int) bool
	// Shiftable reports whether WithShift gives a codec storing x − mu.
	Shiftable() bool
	// WithShift returns the codec storing x − mu (see Shifted, which is how
	// callers reach it: mu non-nil, copied); nil unless Shiftable.
	WithShift(mu []float32) Codec
	// Shift is the mean a shifted codec subtracts; nil for others.
	Shift() []float32
	// Unshifted is the codec whose layout a shifted codec's blocks have;
	// nil for others (their own).
	Unshifted() Codec
	// GroupTokens is the number of tokens a quantization group spans when
	// it spans tokens (KIVI keys: G, and the codec is Grouped); 0 when
	// every slot is quantized alone.
	GroupTokens() int
	// Residual is the number of newest tokens the codec wants kept in full
	// precision before they are sealed into its blocks (KIVI:
	// DefaultResidual); 0 for none.
	Residual() int
}

// defaults gives every Capabilities method its "cannot" answer; every codec
// embeds it (directly or through the codec it wraps) and overrides what it
// has.
type defaults struct{}

func (defaults) Plain() (tensor.DType, bool)                                    { return 0, false }
func (defaults) KeyPanel(src []byte, n, d, i0 int) ([]byte, tensor.DType, bool) { return nil, 0, false }
func (defaults) DecodeKeyPanel(src []byte, n, d, i0 int, out []float32) bool    { return false }
func (defaults) GetRows(src []byte, n, d, i0, cnt int, out []float32) bool      { return false }
func (defaults) LevelPanel(src []byte, n, d, i0 int, sm *[2 * tensor.AttnLanes]float32) ([]byte, int, []float32, bool) {
	return nil, 0, nil, false
}
func (defaults) ChannelPanel(src []byte, n, d, i0 int, sc, mn []float32) ([]byte, int, bool) {
	return nil, 0, false
}
func (defaults) IntDot() bool { return false }
func (defaults) LevelRows(src []byte, n, d, i0, cnt int, sm []float32) ([]byte, int, int, bool) {
	return nil, 0, 0, false
}
func (defaults) DotBlock(src []byte, n, d int, q, out []float32) bool            { return false }
func (defaults) CopySlot(dst []byte, dn, di int, src []byte, sn, si, d int) bool { return false }
func (defaults) MoveSlots(b []byte, n, d, dst, src, cnt int) bool                { return false }
func (defaults) Shiftable() bool                                                 { return false }
func (defaults) WithShift(mu []float32) Codec                                    { return nil }
func (defaults) Shift() []float32                                                { return nil }
func (defaults) Unshifted() Codec                                                { return nil }
func (defaults) GroupTokens() int                                                { return 0 }
func (defaults) Residual() int                                                   { return 0 }

// Grouped is implemented by codecs whose quantization groups span tokens
// (KIVI keys, GroupTokens() > 0): the caller supplies the per-channel range
// computed over the whole group of G tokens, which may span several blocks
// (see ChannelRange).
type Grouped interface {
	Codec
	// EncodeRange encodes all n slots of a block from x [n][d], with lo/hi
	// [d] the per-channel min/max over the group the block belongs to.
	EncodeRange(dst []byte, n, d int, x []float32, lo, hi []float32)
}

// parsers lists the codecs Parse knows, in the order of Names (largest
// first): a name and the constructor of its key and value codecs. A new
// codec is a file of this package and a line here.
var parsers = []struct {
	name string
	new  func(Kind) (Codec, error)
}{
	{"f32", pair(F32Keys, F32)},
	{"f16", pair(F16Keys, F16)},
	{"bf16", pair(BF16Keys, BF16)},
	{"q8", pair(Q8Keys, Q8)},
	{"q4", pair(Q4Keys, Q4)},
	{"q8dot", pair(Q8DotKeys, Q8Dot)},
	{"q4dot", pair(Q4DotKeys, Q4Dot)},
	{"kivi2", func(k Kind) (Codec, error) { return newKIVI(2, DefaultGroup, k) }},
	{"kivi4", func(k Kind) (Codec, error) { return newKIVI(4, DefaultGroup, k) }},
}

// pair is the constructor of a codec with fixed key and value flavours.
func pair(keys, values Codec) func(Kind) (Codec, error) {
	return func(k Kind) (Codec, error) {
		if k == Keys {
			return keys, nil
		}
		return values, nil
	}
}

// Names lists the codec names Parse accepts.
var Names = func() []string {
	n := make([]string, len(parsers))
	for i, p := range parsers {
		n[i] = p.name
	}
	return n
}()

// Parse returns the codec called name (case-insensitive) for keys or values.
// KIVI codecs use DefaultGroup; keys get the per-channel Grouped flavour,
// values the per-token one.
func Parse(name string, kind Kind) (Codec, error) {
	if kind != Keys && kind != Values {
		return nil, fmt.Errorf("codec: invalid kind %d", int(kind))
	}
	want := strings.ToLower(strings.TrimSpace(name))
	for _, p := range parsers {
		if p.name == want {
			return p.new(kind)
		}
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
	Q8   Codec = q8
	Q4   Codec = q4

	q8 = &tokenQuant{name: "q8", bits: 8}
	q4 = &tokenQuant{name: "q4", bits: 4}
)

// Q8Dot and Q4Dot are Q8 and Q4 (the same blocks) for attention that sums
// their values with the weights rounded to int8 (IntDot;
// tensor.AttnPVDot): Parse("q8dot" | "q4dot", Values) returns them.
var (
	Q8Dot Codec = &tokenQuant{name: "q8dot", bits: 8, intDot: true}
	Q4Dot Codec = &tokenQuant{name: "q4dot", bits: 4, intDot: true}
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

// DotAll sets out[i] = q·x_i for the first len(out) ≤ n slots of a block,
// through c's DotBlock when it has one. It does not allocate.
func DotAll(c Codec, src []byte, n, d int, q, out []float32) {
	if c.DotBlock(src, n, d, q, out) {
		return
	}
	for i := range out {
		out[i] = c.Dot(src, n, d, i, q)
	}
}
