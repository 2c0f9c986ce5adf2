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
// attention kernels call, and Sequence adds what the runner calls.
package kvcache

import "fmt"

// Layout is the shape of what one sequence stores per token.
type Layout struct {
	Layers  int // layers that keep their own KV
	KVHeads int // key/value heads per layer
	HeadDim int // values per head
}

// Validate reports a layout that cannot hold anything.
func (l Layout) Validate() error {
	if l.Layers <= 0 || l.KVHeads <= 0 || l.HeadDim <= 0 {
		return fmt.Errorf("kvcache: invalid layout %d layers × %d KV heads × %d head dim", l.Layers, l.KVHeads, l.HeadDim)
	}
	return nil
}

// BytesPerToken is the f32 storage of one token across all layers and heads:
// keys and values, without the position metadata.
func (l Layout) BytesPerToken() int64 {
	return 2 * int64(l.Layers) * int64(l.KVHeads) * int64(l.HeadDim) * 4
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

var _ Sequence = (*Paged)(nil)
