package kvcache

// What appending tokens costs, in bytes of the arena: the one place the
// block arithmetic of admission lives. The scheduler compares these bytes
// with its budget and never counts blocks itself.

// appendBlocks is the blocks a table whose blocks hold filled tokens takes
// for n more tokens written slot by slot: a copy of its partly filled last
// block first when another sequence shares it (shared), then a block per
// BlockTokens.
func (p *Pool) appendBlocks(filled int, shared bool, n int) int {
	if n <= 0 {
		return 0
	}
	blocks := 0
	if slot := filled % p.B; slot != 0 {
		if shared {
			blocks++ // copy-on-write
		}
		n -= p.B - slot
	}
	if n > 0 {
		blocks += (n + p.B - 1) / p.B
	}
	return blocks
}

// sealed is how many of res tokens in a KIVI residual are sealed into
// blocks once sealing is due (Footprint.sealed, the rule sealFull follows).
func (p *Pool) sealed(res int) int { return p.fp.sealed(res) }

// sealBlocks is the blocks a KIVI table holding res residual tokens takes
// for n more: the groups they make due (a group of sealSize tokens is
// sealed into sealSize/BlockTokens fresh blocks).
func (p *Pool) sealBlocks(res, n int) int {
	if n <= 0 {
		return 0
	}
	return (p.sealed(res+n) - p.sealed(res)) / p.B
}

// need is the blocks table t takes for n more tokens. The caller holds
// p.mu.
func (t *table) need(p *Pool, n int) int {
	if p.residual > 0 {
		return p.sealBlocks(t.res.len(), n)
	}
	shared := t.n%p.B != 0 && p.meta[t.blocks[len(t.blocks)-1]].ref > 1
	return p.appendBlocks(t.n, shared, n)
}

// Need is the bytes of the arena that appending n more tokens to every
// table of the sequence takes: exactly what the pool's used bytes grow by
// (Usage().BytesUsed), counting a copy of a last block shared with another
// sequence (a fork) and, with KIVI, the groups the new tokens make due for
// sealing. Tokens kept in the residual by HoldSeal count as sealed when
// the hold is released (what that release then takes). The KIVI residual
// buffers themselves are heap memory beside the arena and do not count.
func (s *Paged) Need(n int) int64 {
	if n <= 0 || s.freed {
		return 0
	}
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	blocks := 0
	for i := range s.tables {
		blocks += s.tables[i].need(p, n)
	}
	return int64(blocks) * int64(p.blockBytes)
}

// AdmitBytes is the bytes of the arena a new sequence takes to run a
// prompt of prompt tokens, be forked into samples sequences and append
// one token in each: exactly what Need reports step by step when nothing
// is found in the prefix cache and nothing is pruned (forks share the
// prompt's blocks; each but the last to write copies the shared last
// block, and with KIVI each seals its own residual).
func (p *Pool) AdmitBytes(prompt, samples int) int64 {
	if prompt < 0 || samples < 1 {
		return 0
	}
	var blocks int
	if p.residual > 0 {
		blocks = p.sealBlocks(0, prompt) + samples*p.sealBlocks(prompt-p.sealed(prompt), 1)
	} else {
		blocks = p.appendBlocks(0, false, prompt) + (samples-1)*p.appendBlocks(prompt, true, 1) + p.appendBlocks(prompt, false, 1)
	}
	return int64(blocks) * int64(p.layout.Layers*p.layout.KVHeads) * int64(p.blockBytes)
}

// ObtainableBytes is the bytes of blocks the pool can allocate now
// (Obtainable blocks: its free ones and those of the arena chunks it
// could take).
func (p *Pool) ObtainableBytes() int64 { return int64(p.Obtainable()) * int64(p.blockBytes) }

// CapacityBytes is the bytes of the most blocks the pool can hold (when
// it holds the whole arena).
func (p *Pool) CapacityBytes() int64 { return int64(p.limit) * int64(p.blockBytes) }
