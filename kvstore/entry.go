package kvstore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// An entry is one value in the store (all integers little-endian):
//
//	magic      [4]byte  "KVLM"
//	version    uint16   FormatVersion
//	kind       uint16   KindBlock or KindCompressed
//	namespace  [16]byte the namespace of its key, repeated
//	hash       uint64   the block's chain hash (its key's); a compressed prefix's hash
//	parent     uint64   the parent block's chain hash (0 for the first block, and for a compressed prefix)
//	ntokens    uint32
//	tokens     [ntokens]int32 the block's token ids; a compressed prefix's whole prompt
//	npayload   uint64
//	payload    [npayload]byte the block's bytes (kvcache.Pool.TierBlockBytes); a compressed prefix's image (engine's slot encoding)
//	checksum   uint64   xxhash64 of everything before it
//
// Open checks every field against what the reader expects, so a value
// under the right key but of another namespace, block, parent, token list
// or size, or with one bit flipped, is refused.

// FormatVersion is the entry format written; Open accepts only it.
const FormatVersion = 1

// Kinds of entries.
const (
	KindBlock      = 1 // one full prefix block: every (layer, KV head) table's block bytes
	KindCompressed = 2 // a compressed prefix: the tables a policy left, its state and the logits
)

var magic = [4]byte{'K', 'V', 'L', 'M'}

// ErrCorrupt: a value that is not the entry asked for (a bad checksum, a
// wrong header, a wrong length, other tokens).
var ErrCorrupt = errors.New("kvstore: corrupt entry")

// Namespace separates entries that must not mix: the sha256 (first 16
// bytes) of a description of everything the bytes depend on (the model's
// fingerprint, codecs, block size, layout, …; engine builds it).
type Namespace [16]byte

// NewNamespace is the namespace of a description.
func NewNamespace(desc string) Namespace {
	s := sha256.Sum256([]byte(desc))
	var n Namespace
	copy(n[:], s[:16])
	return n
}

func (n Namespace) String() string { return hex.EncodeToString(n[:]) }

// Key is the store key of a block: "kvlm:" + namespace + ":" + chain hash,
// in hex.
func Key(ns Namespace, hash uint64) string {
	return "kvlm:" + ns.String() + ":" + strconv.FormatUint(hash, 16)
}

// Header is what an entry says of itself besides its payload.
type Header struct {
	Kind   uint16
	NS     Namespace
	Hash   uint64  // the block's chain hash
	Parent uint64  // its parent's (0: the first block)
	Tokens []int32 // the block's token ids
}

const fixedHeader = 4 + 2 + 2 + 16 + 8 + 8 + 4

// EntrySize is the bytes of an entry with ntokens tokens and a payload of
// npayload bytes.
func EntrySize(ntokens, npayload int) int { return fixedHeader + 4*ntokens + 8 + npayload + 8 }

// AppendHeader starts an entry: it appends h and the payload's length to
// dst (allocating room for the payload and the checksum when dst has
// none). The caller appends exactly npayload bytes, then calls Seal.
func AppendHeader(dst []byte, h Header, npayload int) []byte {
	if dst == nil {
		dst = make([]byte, 0, EntrySize(len(h.Tokens), npayload))
	}
	dst = append(dst, magic[:]...)
	dst = binary.LittleEndian.AppendUint16(dst, FormatVersion)
	dst = binary.LittleEndian.AppendUint16(dst, h.Kind)
	dst = append(dst, h.NS[:]...)
	dst = binary.LittleEndian.AppendUint64(dst, h.Hash)
	dst = binary.LittleEndian.AppendUint64(dst, h.Parent)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(h.Tokens)))
	for _, t := range h.Tokens {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(t))
	}
	return binary.LittleEndian.AppendUint64(dst, uint64(npayload))
}

// Seal appends the checksum of everything in buf.
func Seal(buf []byte) []byte {
	return binary.LittleEndian.AppendUint64(buf, xxhash.Sum64(buf))
}

// Open checks that buf is the entry want describes, with a payload of
// npayload bytes (−1: any length, which the entry states), and returns
// the payload (a part of buf). Any difference is an error wrapping
// ErrCorrupt that says what differed.
func Open(buf []byte, want Header, npayload int) ([]byte, error) {
	bad := func(format string, args ...any) ([]byte, error) {
		return nil, fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if npayload < 0 {
		if len(buf) < EntrySize(len(want.Tokens), 0) {
			return bad("%d bytes, less than a header of %d tokens", len(buf), len(want.Tokens))
		}
		npayload = len(buf) - EntrySize(len(want.Tokens), 0)
	}
	if n := EntrySize(len(want.Tokens), npayload); len(buf) != n {
		return bad("%d bytes, want %d", len(buf), n)
	}
	body, sum := buf[:len(buf)-8], binary.LittleEndian.Uint64(buf[len(buf)-8:])
	if xxhash.Sum64(body) != sum {
		return bad("checksum mismatch")
	}
	le := binary.LittleEndian
	switch {
	case [4]byte(body[0:4]) != magic:
		return bad("no magic")
	case le.Uint16(body[4:]) != FormatVersion:
		return bad("format version %d, want %d", le.Uint16(body[4:]), FormatVersion)
	case le.Uint16(body[6:]) != want.Kind:
		return bad("kind %d, want %d", le.Uint16(body[6:]), want.Kind)
	case Namespace(body[8:24]) != want.NS:
		return bad("another namespace")
	case le.Uint64(body[24:]) != want.Hash:
		return bad("another block hash")
	case le.Uint64(body[32:]) != want.Parent:
		return bad("another parent hash")
	case le.Uint32(body[40:]) != uint32(len(want.Tokens)):
		return bad("%d tokens, want %d", le.Uint32(body[40:]), len(want.Tokens))
	}
	at := fixedHeader
	for i, t := range want.Tokens {
		if got := int32(le.Uint32(body[at:])); got != t {
			return bad("token %d is %d, want %d", i, got, t)
		}
		at += 4
	}
	if le.Uint64(body[at:]) != uint64(npayload) {
		return bad("payload of %d bytes, want %d", le.Uint64(body[at:]), npayload)
	}
	return body[at+8:], nil
}
