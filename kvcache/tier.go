package kvcache

import (
	"errors"
	"fmt"
	"slices"
)

// The shared tier's side of the pool (package kvstore holds the store):
// full prefix blocks copied out as bytes after they are registered, and
// copied in as if they had been computed (compressed prefixes go through
// Image and ImportImage, as slot files do). A block's bytes are, for every
// (layer, KV head) table in table order, the block's encoded keys (the
// pool's key bytes per block) then its encoded values; a full block of a
// pristine sequence holds positions j·B … j·B+B−1, which are not stored.
// Only pools and sequences whose prefix blocks the local prefix cache
// may index take part (Tierable), and no layout with window-bounded
// layers (a window frees a prefix's early blocks in some tables only).

// Tierable reports whether the pool's full prefix blocks can go to and
// come from the shared tier: no KIVI residual, no window-bounded layer.
func (p *Pool) Tierable() bool { return p.residual == 0 && len(p.layout.Windows) == 0 }

// TierBlockBytes is the bytes of one block in the tier: every table's
// key and value bytes of one block.
func (p *Pool) TierBlockBytes() int {
	return p.layout.Layers * p.layout.KVHeads * (p.kBytes + p.vBytes)
}

// PrefixChain is the chain hashes of the full blocks of tokens that
// MatchPrefix would look up (it always leaves one token to compute), and
// how many of them, from the first, the local prefix cache holds now.
func (p *Pool) PrefixChain(tokens []int, extra uint64) (hashes []uint64, local int) {
	parent := uint64(0)
	toks := make([]int32, p.B)
	p.mu.Lock()
	defer p.mu.Unlock()
	local = -1
	for j := 0; (j+1)*p.B <= len(tokens)-1; j++ {
		blk := tokens[j*p.B : (j+1)*p.B]
		for i, t := range blk {
			toks[i] = int32(t)
		}
		h := blockHash(parent, toks, extra)
		if local < 0 {
			if e := p.index[h]; e == nil || e.comp != nil || e.extra != extra || !sameTokens(e.tokens, blk) {
				local = j
			}
		}
		hashes = append(hashes, h)
		parent = h
	}
	if local < 0 {
		local = len(hashes)
	}
	return hashes, local
}

// PrefixBlocks is how many leading full blocks of the sequence the prefix
// cache knows (registered or matched): blocks 0 … PrefixBlocks()−1 can be
// copied out with AppendPrefixBlock.
func (s *Paged) PrefixBlocks() int {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return len(s.hashes)
}

// PrefixHash is the chain hash of the sequence's prefix block j and its
// parent's (0 for the first block).
func (s *Paged) PrefixHash(j int) (hash, parent uint64) {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	if j > 0 {
		parent = s.hashes[j-1]
	}
	return s.hashes[j], parent
}

// AppendPrefixBlock appends the bytes of the sequence's prefix block j
// (TierBlockBytes) to dst.
func (s *Paged) AppendPrefixBlock(dst []byte, j int) ([]byte, error) {
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.freed {
		return dst, errors.New("kvcache: sequence already freed")
	}
	if !p.Tierable() || !s.pristine || j < 0 || j >= len(s.hashes) {
		return dst, fmt.Errorf("kvcache: block %d is not a prefix block of the sequence", j)
	}
	for i := range s.tables {
		t := &s.tables[i]
		if t.drop != 0 || j >= len(t.blocks) || t.n < (j+1)*p.B {
			return dst, fmt.Errorf("kvcache: table %d no longer holds block %d", i, j)
		}
		b := t.blocks[j]
		dst = append(dst, p.kbuf(b)...)
		dst = append(dst, p.vbuf(b)...)
	}
	return dst, nil
}

// ImportPrefix appends blocks to a sequence that holds only prefix
// blocks (none, or those MatchPrefix attached): blocks[i] is the bytes
// (TierBlockBytes, as AppendPrefixBlock wrote them) of the sequence's next
// block, whose tokens are tokens[j·B : (j+1)·B] for j = PrefixBlocks()+i.
// The blocks are registered in the prefix cache as if they had been
// computed. It returns the tokens appended; an error (a wrong size, no
// free block) keeps the blocks appended before it.
func (s *Paged) ImportPrefix(tokens []int, extra uint64, blocks [][]byte) (int, error) {
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.freed {
		return 0, errors.New("kvcache: sequence already freed")
	}
	if !p.Tierable() || !s.pristine {
		return 0, errors.New("kvcache: the sequence's blocks cannot come from the shared tier")
	}
	j0 := len(s.hashes)
	for i := range s.tables {
		if t := &s.tables[i]; t.n != j0*p.B || len(t.blocks) != j0 || t.drop != 0 {
			return 0, fmt.Errorf("kvcache: table %d holds %d tokens, not its %d prefix blocks", i, t.n, j0)
		}
	}
	size := p.TierBlockBytes()
	toks := make([]int32, p.B)
	added := 0
	for i, data := range blocks {
		j := j0 + i
		if (j+1)*p.B > len(tokens) {
			return added, fmt.Errorf("kvcache: block %d is past the %d tokens given", j, len(tokens))
		}
		if len(data) != size {
			return added, fmt.Errorf("kvcache: a tier block of %d bytes, want %d", len(data), size)
		}
		// Take every table's block first, so that a pool running dry
		// leaves the tables as they were.
		ids := make([]int32, len(s.tables))
		for t := range ids {
			b, err := p.alloc()
			if err != nil {
				for _, x := range ids[:t] {
					p.decref(x)
				}
				return added, err
			}
			ids[t] = b
		}
		blk := tokens[j*p.B : (j+1)*p.B]
		for k, t := range blk {
			toks[k] = int32(t)
		}
		parent := uint64(0)
		if j > 0 {
			parent = s.hashes[j-1]
		}
		h := blockHash(parent, toks, extra)
		var e *prefixEntry
		if p.index[h] == nil {
			e = &prefixEntry{hash: h, tokens: append([]int32(nil), toks...), extra: extra, blocks: ids}
			p.index[h] = e
		}
		at := 0
		for ti, b := range ids {
			copy(p.kbuf(b), data[at:at+p.kBytes])
			at += p.kBytes
			copy(p.vbuf(b), data[at:at+p.vBytes])
			at += p.vBytes
			pos := p.posbuf(b)
			for k := range pos {
				pos[k] = int32(j*p.B + k)
			}
			p.meta[b].n = int32(p.B)
			p.meta[b].entry = e
			t := &s.tables[ti]
			t.blocks = append(t.blocks, b)
			t.n += p.B
			t.dirty = true
		}
		s.hashes = append(s.hashes, h)
		s.registered = len(s.hashes)
		added += p.B
	}
	return added, nil
}

// CompressedHash is the hash the compressed prefix cache keys (tokens,
// extra) under (the shared tier's key of a compressed prefix).
func CompressedHash(tokens []int, extra uint64) uint64 {
	_, h := compHash(tokens, extra)
	return h
}

// HasCompressed reports whether the pool caches a compressed prefix of
// (tokens, extra) now (MatchCompressed would find it).
func (p *Pool) HasCompressed(tokens []int, extra uint64) bool {
	toks, h := compHash(tokens, extra)
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.index[h]
	return e != nil && e.comp != nil && e.extra == extra && slices.Equal(e.tokens, toks)
}
