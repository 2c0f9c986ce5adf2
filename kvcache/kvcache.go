// Package kvcache stores the keys and values of past tokens so that decoding
// does not recompute them.
//
// The unit of storage is one (layer, KV head): a sequence owns, for each
// layer and KV head, a table of blocks drawn from a shared Pool, and each
// block holds BlockTokens tokens of keys and values (in the pool's storage
// codecs) and the position of each slot. Blocks are reference counted, so
// sequences fork and share prompt prefixes without copying; a write to a
// shared block copies it first.
//
// The interfaces are split by caller, as ollama's former Go cache was:
// Writer is what a model layer calls to store new tokens, Reader is what the
// attention kernels call, Sequence adds what the runner calls, Scheduled
// what a serving scheduler calls (admission in bytes, forks, the prefix
// cache) and Compacted what a compression policy calls (slots, positions,
// pruning, re-indexing). Paged implements them all.
package kvcache

import (
	"fmt"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// Layout is the shape of what one sequence stores per token.
type Layout struct {
	Layers  int // layers that keep their own KV (a model's KV owners)
	KVHeads int // key/value heads per layer
	HeadDim int // values per head
	// Windows, if set ([Layers]), bounds each layer: a layer with
	// Windows[l] = W > 0 is read by sliding-window attention only, so it
	// needs only the tokens of the latest W positions (0: all).
	Windows []int `json:",omitempty"`
	// Readers, if set ([Layers]), is how many model layers attend each
	// layer (nil: one each); a policy aggregates their attention.
	Readers []int `json:",omitempty"`
}

// Validate reports a layout that cannot hold anything.
func (l Layout) Validate() error {
	if l.Layers <= 0 || l.KVHeads <= 0 || l.HeadDim <= 0 {
		return fmt.Errorf("kvcache: invalid layout %d layers × %d KV heads × %d head dim", l.Layers, l.KVHeads, l.HeadDim)
	}
	if l.Windows != nil && len(l.Windows) != l.Layers {
		return fmt.Errorf("kvcache: layout has %d windows for %d layers", len(l.Windows), l.Layers)
	}
	for c, w := range l.Windows {
		if w < 0 || w > 1<<30 {
			return fmt.Errorf("kvcache: layer %d's window %d is out of range [0, 2^30]", c, w)
		}
	}
	if l.Readers != nil && len(l.Readers) != l.Layers {
		return fmt.Errorf("kvcache: layout has %d reader counts for %d layers", len(l.Readers), l.Layers)
	}
	return nil
}

// Reader gives attention the stored tokens of one (layer, KV head), in
// storage order, as segments of slots in one codec pair.
type Reader interface {
	Segments(layer, head int) []Segment
}

// Writer is what a model layer calls to store the keys and values of new
// tokens.
type Writer interface {
	// Append stores n = len(pos) new tokens for one layer. k and v are
	// [n][kvHeads][headDim], keys already rotated.
	Append(layer int, pos []int32, k, v []float32) error
}

// Sequence is one sequence's cache, as the runner sees it.
type Sequence interface {
	Reader
	Writer
	Layout() Layout
	// Len is the number of tokens stored in the last layer appended to (all
	// layers hold the same count once a forward pass is complete, unless a
	// policy pruned them).
	Len() int
	// Reserve reports an error wrapping ErrNoBlocks when n more tokens do
	// not fit in every layer now.
	Reserve(n int) error
	// Truncate drops every token from index n on, in every layer.
	Truncate(n int) error
	// Bytes is the memory the sequence holds for keys, values and positions.
	Bytes() int64
	// Free releases the sequence's storage; it must not be used afterwards.
	Free()
}

// Scheduled is a sequence as a scheduler sees it: it admits work by
// comparing the bytes the cache reports (Need; Pool.AdmitBytes before a
// sequence exists) with its budget, never by counting blocks.
type Scheduled interface {
	Sequence
	// Need is the bytes of the arena appending n more tokens takes
	// (copies of shared blocks and KIVI sealing included).
	Need(n int) int64
	// Fork shares every block with a new sequence (copy on write).
	Fork() *Paged
	// MatchPrefix attaches cached blocks that start tokens to an empty
	// sequence; RegisterPrefix makes its full blocks findable.
	MatchPrefix(tokens []int, extra uint64) int
	RegisterPrefix(tokens []int, extra uint64)
	// Slots is the tokens one (layer, KV head) holds (a policy may have
	// pruned some); WindowDropped those a window-bounded layer freed from
	// its head (Layout.Windows).
	Slots(layer, head int) int
	WindowDropped(layer, head int) int
}

// Compacted is a sequence as a compression policy sees it: the slots of
// each (layer, KV head), their positions and stored keys, and the one
// prune (Keep, or Drop for a few slots) and the one rewrite (RewriteKeys)
// every method goes through.
type Compacted interface {
	Reader
	Layout() Layout
	// Codecs are the storage codecs of keys and values (whether keys can
	// be rewritten one by one: codec.Codec.PerToken).
	Codecs() (k, v codec.Codec)
	Slots(layer, head int) int
	Positions(layer, head int) []int32
	Keep(layer, head int, keep []int) error
	// Drop is Keep of every slot but gone (ascending indexes): a prune of
	// a few slots, in time independent of the table's length where the
	// table can be left ragged.
	Drop(layer, head int, gone []int) error
	RewriteKeys(layer, head int, slots []int, fn func(pos int32, key []float32) int32) error
	// HoldSeal keeps a KIVI cache's new tokens in full precision (a prompt
	// is compressed before it is quantized).
	HoldSeal(hold bool) error
}

var (
	_ Sequence  = (*Paged)(nil)
	_ Scheduled = (*Paged)(nil)
	_ Compacted = (*Paged)(nil)
)
