package kvcache

import (
	"errors"
	"slices"
)

// Compressed prefixes: the tables of a sequence whose prompt a policy
// compressed (ragged per (layer, KV head), each slot with its kept
// position), cached under (the prompt's tokens, extra) so that a later
// sequence with the same prompt and the same compression starts from them
// and computes nothing of it. extra is the caller's key of the compression
// (the method and every parameter; the pool fixes the codecs).
//
// An entry is a prefixEntry with comp set, in the same index and under the
// same LRU as plain blocks: once no sequence holds its blocks they wait in
// the pool's cached list, and the entry is dropped when one of them is
// reused. A block the entry shares with another entry (a plain prefix
// block a policy kept whole) stays that entry's: the compressed one
// depends on it and is dropped with it. Blocks change only through copies
// (Paged.own), and a sequence appending to a partly filled block the entry
// names writes only slots past the entry's, so the entry's slots stay as
// they were registered.

// CompressedCache is a sequence as a scheduler that caches compressed
// prefixes sees it (Paged).
type CompressedCache interface {
	RegisterCompressed(tokens []int, extra uint64, meta any) (bool, error)
	MatchCompressed(tokens []int, extra uint64) (meta any, ok bool)
}

var _ CompressedCache = (*Paged)(nil)

// compressed is what a compressed prefix holds besides its blocks.
type compressed struct {
	n      []int          // [layers·kvHeads] tokens of each table
	nb     []int          // [layers·kvHeads] blocks of each table (in prefixEntry.blocks, in table order)
	meta   any            // the caller's state of the sequence (policy state, logits, positions)
	owners []*prefixEntry // the entries owning blocks it shares (it is in their dependents)
}

// compTag separates compressed prefixes' hashes from plain blocks'.
const compTag = 0x636f6d7072657373 // "compress"

func compHash(tokens []int, extra uint64) ([]int32, uint64) {
	toks := make([]int32, len(tokens))
	for i, t := range tokens {
		toks[i] = int32(t)
	}
	return toks, blockHash(compTag, toks, extra)
}

// ErrNotCacheable: the sequence's tables are not all in blocks (a KIVI
// residual, MiniCache's merged layers), so they cannot be cached.
var ErrNotCacheable = errors.New("kvcache: only tables held in blocks can be cached compressed (no KIVI residual, no merged layers)")

// RegisterCompressed caches the sequence's tables as they are now, under
// (tokens, extra), with meta, the caller's state of the sequence handed
// back by MatchCompressed. tokens are the ids the sequence ran, from the
// start. It reports whether an entry was added (false: one was there).
func (s *Paged) RegisterCompressed(tokens []int, extra uint64, meta any) (bool, error) {
	p := s.pool
	if s.freed {
		return false, errors.New("kvcache: sequence already freed")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range s.tables {
		if t := &s.tables[i]; t.res != nil || t.mini != nil {
			return false, ErrNotCacheable
		}
	}
	toks, h := compHash(tokens, extra)
	if e := p.index[h]; e != nil {
		return false, nil // this prompt is cached already (or a colliding hash keeps its place)
	}
	for i := range s.tables {
		if err := s.regular(&s.tables[i]); err != nil { // a ragged table is cached compacted
			return false, err
		}
	}
	c := &compressed{n: make([]int, len(s.tables)), nb: make([]int, len(s.tables)), meta: meta}
	e := &prefixEntry{hash: h, tokens: toks, extra: extra, comp: c}
	for i := range s.tables {
		t := &s.tables[i]
		c.n[i], c.nb[i] = t.n, len(t.blocks)
		e.blocks = append(e.blocks, t.blocks...)
		for _, b := range t.blocks {
			switch o := p.meta[b].entry; {
			case o == nil:
				p.meta[b].entry = e
			case o != e && !slices.Contains(c.owners, o):
				c.owners = append(c.owners, o)
				o.dependents = append(o.dependents, e)
			}
		}
	}
	p.index[h] = e
	return true, nil
}

// MatchCompressed attaches to an empty sequence the compressed prefix
// cached under (tokens, extra) and returns its meta; ok is false when
// there is none.
func (s *Paged) MatchCompressed(tokens []int, extra uint64) (meta any, ok bool) {
	p := s.pool
	if s.freed || s.Len() != 0 {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	toks, h := compHash(tokens, extra)
	e := p.index[h]
	if e == nil || e.comp == nil || e.extra != extra || !slices.Equal(e.tokens, toks) {
		return nil, false
	}
	at := 0
	for i := range s.tables {
		t := &s.tables[i]
		nb := e.comp.nb[i]
		t.blocks = append(t.blocks[:0], e.blocks[at:at+nb]...)
		at += nb
		t.n, t.cnt = e.comp.n[i], nil // cached compacted (RegisterCompressed)
		t.dirty = true
		for _, b := range t.blocks {
			p.incref(b)
		}
	}
	s.pristine = false
	return e.comp.meta, true
}

// CompressedPrefixes is the count of compressed prefixes the pool caches
// and the bytes of their blocks (a block two of them share counts in
// each).
func (p *Pool) CompressedPrefixes() (n int, bytes int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.index {
		if e.comp != nil {
			n++
			bytes += int64(len(e.blocks)) * int64(p.blockBytes)
		}
	}
	return n, bytes
}
