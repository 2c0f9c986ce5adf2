package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// The prefix cache: a full block of a sequence whose tables still hold
// tokens 0..n-1 in order is indexed by
//
//	hash(parent block's hash, the block's token ids, extra)
//
// where extra separates caches that must not mix (say, a compression
// configuration). An entry names the physical blocks of every (layer, KV
// head) for those tokens. A new sequence whose prompt starts with indexed
// blocks takes references to them and skips their prefill. Entries outlive
// their sequences: unreferenced blocks wait in the pool's LRU free list, and
// an entry is dropped only when one of its blocks is reused.

// prefixEntry is one cached token block, or a compressed prefix
// (compressed.go).
type prefixEntry struct {
	hash   uint64
	tokens []int32 // the block's token ids, compared on lookup (no collisions); a compressed prefix's whole prompt
	extra  uint64
	blocks []int32 // [layers·kvHeads] physical blocks, in table order; a compressed prefix's: every table's, concatenated
	comp   *compressed
	// dependents are the compressed prefixes that also read blocks this
	// entry owns: they go when it goes.
	dependents []*prefixEntry
	dropped    bool
}

// blockHash chains a block's tokens onto its parent's hash: the first 8
// bytes (big-endian) of SHA-256 over the parent hash, extra and every token
// (widened from uint32), each as 8 little-endian bytes. A cryptographic
// hash, not a fast one such as FNV: a prompt's chain names KV that other
// clients (and, through the shared tier, other replicas) reuse, and FNV
// second preimages can be computed, which would let one client's prompt
// poison the cached KV of another's (as vLLM's CVE-2025-25183 did with
// Python's hash). Tokens are compared on lookup, parents by this hash.
func blockHash(parent uint64, tokens []int32, extra uint64) uint64 {
	buf := make([]byte, 0, 16+8*len(tokens))
	buf = binary.LittleEndian.AppendUint64(buf, parent)
	buf = binary.LittleEndian.AppendUint64(buf, extra)
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(uint32(t)))
	}
	sum := sha256.Sum256(buf)
	return binary.BigEndian.Uint64(sum[:8])
}

func sameTokens(a []int32, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if int(a[i]) != b[i] {
			return false
		}
	}
	return true
}

// dropEntry forgets an entry; its blocks stay where they are. The caller
// holds p.mu.
func (p *Pool) dropEntry(e *prefixEntry) {
	if e.dropped {
		return
	}
	e.dropped = true
	if p.index[e.hash] == e {
		delete(p.index, e.hash)
		p.observeRemoved(e)
	}
	for _, b := range e.blocks {
		if p.meta[b].entry == e {
			p.meta[b].entry = nil
			p.uncache(b)
		}
	}
	deps := e.dependents
	e.dependents = nil
	for _, d := range deps {
		p.dropEntry(d)
	}
	if e.comp != nil {
		for _, o := range e.comp.owners {
			o.dependents = slices.DeleteFunc(o.dependents, func(d *prefixEntry) bool { return d == e })
		}
		e.comp.owners = nil
	}
}

// MatchPrefix attaches to an empty sequence the cached blocks that start
// tokens, and returns how many tokens they hold (a multiple of the block
// size). At least one token is always left to compute, so the caller gets
// logits. extra must match what RegisterPrefix was given.
func (s *Paged) MatchPrefix(tokens []int, extra uint64) int {
	p := s.pool
	if !s.prefixable() || s.Len() != 0 {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	parent := uint64(0)
	matched := 0
	for j := 0; (j+1)*p.B <= len(tokens)-1; j++ {
		blk := tokens[j*p.B : (j+1)*p.B]
		toks := make([]int32, p.B)
		for i, t := range blk {
			toks[i] = int32(t)
		}
		h := blockHash(parent, toks, extra)
		p.stats.PrefixQueries++
		e := p.index[h]
		if e == nil || e.comp != nil || e.extra != extra || !sameTokens(e.tokens, blk) {
			break
		}
		p.stats.PrefixHits++
		for i := range s.tables {
			b := e.blocks[i]
			p.incref(b)
			s.tables[i].blocks = append(s.tables[i].blocks, b)
			s.tables[i].n += p.B
			s.tables[i].dirty = true
		}
		s.hashes = append(s.hashes, h)
		parent = h
		matched += p.B
	}
	s.registered = len(s.hashes)
	// A window-bounded layer keeps only the blocks the next token (at
	// matched) can see; the others go back to the cached list, their
	// entries intact.
	L := p.layout
	for layer := range L.Layers {
		if w := L.window(layer); w > 0 && matched > 0 {
			for h := range L.KVHeads {
				p.slide(s.tab(layer, h), int32(matched-w))
			}
		}
	}
	return matched
}

// RegisterPrefix makes the sequence's full blocks findable by later
// sequences. tokens are the ids the sequence holds, from the start. Blocks
// already registered (or matched) are skipped; nothing is registered once the
// sequence's tables no longer hold tokens 0..n-1 in order (after pruning) or
// when keys are kept in a KIVI residual. An entry names a block of every
// table: registration stops at the first block a window-bounded layer has
// freed (it and the blocks after it stay unregistered; entries registered
// before the window freed their blocks stay valid, those blocks waiting in
// the cached list).
func (s *Paged) RegisterPrefix(tokens []int, extra uint64) {
	p := s.pool
	if !s.prefixable() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	full := min(len(tokens), s.minLen()) / p.B
	for j := s.registered; j < full; j++ {
		parent := uint64(0)
		if j > 0 {
			parent = s.hashes[j-1]
		}
		if s.freedBlock(j) {
			break
		}
		blk := tokens[j*p.B : (j+1)*p.B]
		toks := make([]int32, p.B)
		for i, t := range blk {
			toks[i] = int32(t)
		}
		h := blockHash(parent, toks, extra)
		s.hashes = append(s.hashes, h)
		if e := p.index[h]; e != nil {
			continue // the same tokens are cached already, in other blocks
		}
		e := &prefixEntry{hash: h, tokens: toks, extra: extra, blocks: make([]int32, len(s.tables))}
		for i := range s.tables {
			t := &s.tables[i]
			b := t.blocks[j-t.drop/p.B]
			e.blocks[i] = b
			if old := p.meta[b].entry; old != nil {
				p.dropEntry(old)
			}
			p.meta[b].entry = e
		}
		p.index[h] = e
		p.observeStored(e, parent, j)
	}
	s.registered = len(s.hashes)
}

// freedBlock reports whether some table's window freed the sequence's
// block j (a pristine table frees whole leading blocks: drop is a multiple
// of the block size).
func (s *Paged) freedBlock(j int) bool {
	for i := range s.tables {
		if s.tables[i].drop > j*s.pool.B {
			return true
		}
	}
	return false
}

// prefixable: the tables hold tokens 0..n-1 in order, in blocks only.
func (s *Paged) prefixable() bool { return s.pristine && s.pool.residual == 0 }
