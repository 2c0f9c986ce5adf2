// Package kvcache stores the keys and values of past tokens so that decoding
// does not recompute them.
//
// The unit of storage is one (layer, KV head): a sequence owns, for each
// layer and KV head, a table of blocks, and each block holds up to Cap tokens
// of keys, values and the original position of each slot. Attention reads a
// block table; a model layer appends to it. That one shape serves a plain
// contiguous cache (one large block per table, see NewContiguous) as well as
// paged, compressed and shared variants.
//
// The interfaces are split by caller, as ollama's former Go cache was:
// Writer is what a model layer calls to store new tokens, Reader is what the
// attention kernels call, and Sequence adds what the runner calls.
package kvcache

import (
	"errors"
	"fmt"
)

// ErrFull is returned when a cache has no room for the tokens being stored.
var ErrFull = errors.New("kvcache: cache is full")

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

// Block holds up to Cap() tokens of one (layer, KV head), stored as f32.
type Block struct {
	K   []float32 // [cap][headDim] keys, after RoPE
	V   []float32 // [cap][headDim] values
	Pos []int32   // [cap] position of each slot, as RoPE saw it
	N   int       // slots filled, from the start
}

// NewBlock allocates an empty block of capacity n for heads of width headDim.
func NewBlock(n, headDim int) *Block {
	return &Block{
		K:   make([]float32, n*headDim),
		V:   make([]float32, n*headDim),
		Pos: make([]int32, n),
	}
}

// Cap is the number of token slots in the block.
func (b *Block) Cap() int { return len(b.Pos) }

// Reader gives attention the stored tokens of one (layer, KV head), in
// storage order.
type Reader interface {
	Blocks(layer, head int) []*Block
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
	// layers hold the same count once a forward pass is complete).
	Len() int
	// Room is how many more tokens can be appended to every layer.
	Room() int
	// Truncate drops every token from index n on, in every layer.
	Truncate(n int) error
	// Bytes is the memory the sequence holds for keys, values and positions.
	Bytes() int64
}
