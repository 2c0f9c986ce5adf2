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
	if t.resWindow > 0 {
		return 0 // never sealed: its tokens stay in the residual
	}
	if p.residual > 0 {
		return p.sealBlocks(t.res.len(), n)
	}
	tail := t.tail(p.B)
	shared := tail != 0 && p.meta[t.blocks[len(t.blocks)-1]].ref > 1
	return p.appendBlocks(tail, shared, n)
}

// Need is the bytes of the arena that appending n more tokens to every
// table of the sequence takes: exactly what the pool's used bytes grow by
// (Usage().BytesUsed), counting a copy of a last block shared with another
// sequence (a fork) and, with KIVI, the groups the new tokens make due for
// sealing. Tokens kept in the residual by HoldSeal count as sealed when
// the hold is released (what that release then takes). The KIVI residual
// buffers themselves are heap memory beside the arena and do not count.
//
// A window-bounded layer first frees the blocks its window hides from the
// new tokens (window.go, the next position taken as one past the last
// held): each table counts its new blocks less those it frees itself,
// never below zero, so Need is what each layer's Append takes, the most the
// pool's used bytes rise at any point of the step (they rise by less, or
// fall, when a layer frees more than it takes).
func (s *Paged) Need(n int) int64 {
	if n <= 0 || s.freed {
		return 0
	}
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	blocks := 0
	for i := range s.tables {
		t := &s.tables[i]
		blocks += max(0, t.need(p, n)-p.freeable(t, p.layout.window(i/p.layout.KVHeads)))
	}
	return int64(blocks) * int64(p.blockBytes)
}

// AdmitBytes is the bytes of the arena a new sequence takes to run a
// prompt of prompt tokens, be forked into samples sequences and append
// one token in each: exactly what Need reports step by step when nothing
// is found in the prefix cache and nothing is pruned (forks share the
// prompt's blocks; each but the last to write copies the shared last
// block, and with KIVI each seals its own residual). The prompt is one
// append (AdmitBytesStep for one in chunks).
func (p *Pool) AdmitBytes(prompt, samples int) int64 {
	return p.AdmitBytesStep(prompt, samples, prompt)
}

// AdmitBytesStep is AdmitBytes for a prompt appended step tokens at a time
// (step ≤ 0: at once), which lets window-bounded layers free blocks during
// the prefill: the sum over layers of the most bytes each layer holds at
// any point of the run (the prefill's steps, then the samples' appends, in
// which the last writer frees the blocks the window hides from the new
// token). Without windows the layers only grow, and this is the bytes the
// pool's used bytes grow by.
func (p *Pool) AdmitBytesStep(prompt, samples, step int) int64 {
	if prompt < 0 || samples < 1 {
		return 0
	}
	if step <= 0 || step > prompt {
		step = prompt
	}
	f := p.fp
	var blocks int
	for c := 0; c < p.layout.Layers; c++ {
		w := p.layout.window(c)
		if f.Unsealed(w) {
			continue // never sealed: no blocks
		}
		peak := f.WindowPeak(prompt, w, step)        // during the prefill
		held, _, _ := f.WindowTable(prompt, w, step) // after it
		// The samples' token at position prompt: what it frees (the
		// last sample to drop the shared blocks frees them), what each
		// takes.
		freed := f.windowDrop(prompt, w) - f.windowDrop(max(0, (prompt-1)/max(step, 1)*step), w)
		var first, last int
		if p.residual > 0 {
			first = p.sealBlocks(prompt-p.sealed(prompt), 1)
			last = first
		} else {
			first, last = p.appendBlocks(prompt, true, 1), p.appendBlocks(prompt, false, 1)
		}
		decode := held + (samples-1)*first + max(0, last-freed)
		blocks += max(peak, decode)
	}
	return int64(blocks) * int64(p.layout.KVHeads) * int64(p.blockBytes)
}

// ObtainableBytes is the bytes of blocks the pool can allocate now
// (Obtainable blocks: its free ones and those of the arena chunks it
// could take).
func (p *Pool) ObtainableBytes() int64 { return int64(p.Obtainable()) * int64(p.blockBytes) }

// CapacityBytes is the bytes of the most blocks the pool can hold (when
// it holds the whole arena).
func (p *Pool) CapacityBytes() int64 { return int64(p.limit) * int64(p.blockBytes) }
