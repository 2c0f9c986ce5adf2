package kvcache

// PrefixObserver hears of the prefix cache's full-block entries as they
// come and go (KV events for prefix-aware routers: package kvevents). Its
// methods are called with the pool's lock held, on the goroutine that
// changed the cache (the scheduler's): they must be quick, must not block
// and must not call back into the pool. Compressed prefixes
// (compressed.go) are not blocks of one prompt and are not reported.
type PrefixObserver interface {
	// BlockStored: a full block of tokens was indexed under hash, chained
	// onto parent (hasParent is false for a prompt's first block, whose
	// parent is 0). tokens is the entry's own slice: read it, do not keep
	// or change it.
	BlockStored(hash, parent uint64, hasParent bool, tokens []int32)
	// BlockRemoved: the entry of hash was dropped (one of its blocks was
	// reused for other data, its chunk went back to the arena, or a
	// copy-on-write could not copy it): the hash is no longer found.
	BlockRemoved(hash uint64)
	// AllBlocksCleared: every entry was forgotten at once (ClearPrefixes,
	// or the pool closed).
	AllBlocksCleared()
}

// SetPrefixObserver makes o hear of the pool's prefix entries from now on
// (nil: nobody). Set it before the pool is used: entries indexed before
// are not reported.
func (p *Pool) SetPrefixObserver(o PrefixObserver) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.obs = o
}

// observeStored reports a new full-block entry e, the sequence's block j.
// The caller holds p.mu.
func (p *Pool) observeStored(e *prefixEntry, parent uint64, j int) {
	if p.obs != nil && e.comp == nil {
		p.obs.BlockStored(e.hash, parent, j > 0, e.tokens)
	}
}

// observeRemoved reports that the full-block entry e left the index. The
// caller holds p.mu.
func (p *Pool) observeRemoved(e *prefixEntry) {
	if p.obs != nil && e.comp == nil {
		p.obs.BlockRemoved(e.hash)
	}
}

// observeCleared reports that the whole index was forgotten, if it held a
// full-block entry. The caller holds p.mu.
func (p *Pool) observeCleared() {
	if p.obs == nil {
		return
	}
	for _, e := range p.index {
		if e.comp == nil {
			p.obs.AllBlocksCleared()
			return
		}
	}
}

// ClearPrefixes forgets every prefix entry, full blocks and compressed
// prefixes alike (vLLM's reset_prefix_cache): the blocks stay where they
// are, those no sequence holds become free, and later prompts find
// nothing until they are registered again. The observer hears one
// AllBlocksCleared (when a full-block entry was there), not a removal per
// entry. It returns the entries forgotten.
func (p *Pool) ClearPrefixes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.observeCleared()
	obs := p.obs
	p.obs = nil
	n := len(p.index)
	for _, e := range p.index {
		p.dropEntry(e)
	}
	p.obs = obs
	return n
}
