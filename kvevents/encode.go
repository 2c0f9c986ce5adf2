package kvevents

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Format is how the events inside a batch are encoded (the batch itself is
// always vLLM's positional [ts, events, data_parallel_rank]).
type Format int

const (
	// Array: each event a positional array whose first element is its tag
	// (msgspec array_like=True, tag=True: vLLM before PR #42892, the
	// format llm-d-kv-cache-manager decodes).
	Array Format = iota
	// Map: each event a map of field names, the tag under "type" (msgspec
	// tag=True without array_like: vLLM after PR #42892).
	Map
)

// Formats are the names ParseFormat takes.
var Formats = []string{"array", "map"}

// ParseFormat reads a Format by name.
func ParseFormat(s string) (Format, error) {
	switch s {
	case "array":
		return Array, nil
	case "map":
		return Map, nil
	}
	return 0, fmt.Errorf("unknown KV event format %q (want array or map)", s)
}

func (f Format) String() string { return Formats[f] }

// The event tags: msgspec's default tag of a tagged struct is its class
// name.
const (
	tagStored  = "BlockStored"
	tagRemoved = "BlockRemoved"
	tagCleared = "AllBlocksCleared"
)

type kind uint8

const (
	stored kind = iota
	removed
	cleared
)

// event is one KV event of a batch. A stored event holds consecutive
// blocks of one chain: hashes[i]'s tokens are tokens[i·B:(i+1)·B], and
// hashes[0] chains onto parent (when hasParent).
type event struct {
	kind      kind
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []int32
}

// encoder writes batches; it is used by the publisher's goroutine only.
type encoder struct {
	format    Format
	blockSize int
	medium    string
	buf       bytes.Buffer
	enc       *msgpack.Encoder
}

func newEncoder(f Format, blockSize int, medium string) *encoder {
	e := &encoder{format: f, blockSize: blockSize, medium: medium}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// batch encodes vLLM's KVEventBatch [ts, events, data_parallel_rank] and
// returns a copy of the bytes.
func (e *encoder) batch(ts float64, events []event, rank int) ([]byte, error) {
	e.buf.Reset()
	w := e.enc
	err := w.EncodeArrayLen(3)
	if err == nil {
		err = w.EncodeFloat64(ts)
	}
	if err == nil {
		err = w.EncodeArrayLen(len(events))
	}
	for i := 0; err == nil && i < len(events); i++ {
		err = e.event(&events[i])
	}
	if err == nil {
		err = w.EncodeInt(int64(rank))
	}
	if err != nil {
		return nil, err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

// field writes a map key in the Map format, nothing in the Array format.
func (e *encoder) field(name string) error {
	if e.format == Map {
		return e.enc.EncodeString(name)
	}
	return nil
}

// head starts an event of n fields after its tag.
func (e *encoder) head(tag string, n int) error {
	var err error
	if e.format == Map {
		err = e.enc.EncodeMapLen(n + 1)
		if err == nil {
			err = e.enc.EncodeString("type")
		}
	} else {
		err = e.enc.EncodeArrayLen(n + 1)
	}
	if err == nil {
		err = e.enc.EncodeString(tag)
	}
	return err
}

// event writes one event with vLLM's fields in vLLM's order:
//
//	BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name)
//	BlockRemoved(block_hashes, medium)
//	AllBlocksCleared()
//
// The fields vLLM gives defaults (extra_keys, group_idx,
// kv_cache_spec_kind, kv_cache_spec_sliding_window) are left out, as
// msgspec's omit_defaults leaves them out when they hold their default.
func (e *encoder) event(ev *event) error {
	w := e.enc
	switch ev.kind {
	case stored:
		return firstErr(
			e.head(tagStored, 7),
			e.field("block_hashes"), e.hashes(ev.hashes),
			e.field("parent_block_hash"), e.parent(ev),
			e.field("token_ids"), e.tokens(ev.tokens),
			e.field("block_size"), w.EncodeInt(int64(e.blockSize)),
			e.field("lora_id"), w.EncodeNil(),
			e.field("medium"), w.EncodeString(e.medium),
			e.field("lora_name"), w.EncodeNil())
	case removed:
		return firstErr(
			e.head(tagRemoved, 2),
			e.field("block_hashes"), e.hashes(ev.hashes),
			e.field("medium"), w.EncodeString(e.medium))
	default:
		return e.head(tagCleared, 0)
	}
}

func (e *encoder) hashes(hs []uint64) error {
	err := e.enc.EncodeArrayLen(len(hs))
	for i := 0; err == nil && i < len(hs); i++ {
		err = e.enc.EncodeUint(hs[i])
	}
	return err
}

func (e *encoder) parent(ev *event) error {
	if !ev.hasParent {
		return e.enc.EncodeNil()
	}
	return e.enc.EncodeUint(ev.parent)
}

func (e *encoder) tokens(ts []int32) error {
	err := e.enc.EncodeArrayLen(len(ts))
	for i := 0; err == nil && i < len(ts); i++ {
		err = e.enc.EncodeInt(int64(ts[i]))
	}
	return err
}

// firstErr is the first non-nil error; the calls it is given ran in order
// (the encoder's writes go to a bytes.Buffer and do not fail but on
// memory).
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
