package engine

import (
	"hash/fnv"
	"slices"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/policy"
)

// Compressed prefixes: once a request with a policy has compressed its
// prompt, the compressed tables are cached in its pool
// (kvcache.Paged.RegisterCompressed) under (the prompt's tokens, compKey:
// the canonical form of the method and its parameters, and the codecs),
// with what the engine needs to go on from them: the policy's state
// (policy.Snapshot) and the last prompt token's logits. A later request
// with the same prompt and the same kv settings starts from them
// (startCompressed) and computes none of its prompt. The entries are
// evicted by the pool's LRU like plain prefix blocks.

// compMeta is what a compressed prefix keeps for the engine.
type compMeta struct {
	snap   *policy.Snapshot
	logits []float32 // [vocab] after the prompt's last token
}

// compKey is the key of a compression: the method and every parameter
// (policy.Config.Key), and the pool's codecs.
func compKey(cfg policy.Config, p *kvcache.Pool) uint64 {
	k, v := p.Codecs()
	h := fnv.New64a()
	h.Write([]byte(cfg.Key() + "|" + k.Name() + "/" + v.Name()))
	return h.Sum64()
}

// startCompressed starts s from the compressed prefix of the first k
// tokens of its history (s.compressedLen), if one is cached; it reports
// whether it did (else cache is still empty and s starts as usual). The
// rest of the history, if any, is prefilled on top of it.
func (e *Engine) startCompressed(s *seqState, cache *kvcache.Paged, k int) bool {
	q := s.req
	meta, ok := cache.MatchCompressed(s.hist[:k], compKey(q.r.Policy, q.pool))
	if !q.started {
		if ok {
			e.compHits.Add(1)
		} else {
			e.compMisses.Add(1)
		}
	}
	if !ok {
		return false
	}
	cm := meta.(*compMeta)
	return e.startRestored(s, cache, cm.snap, k, cm.logits)
}

// startRestored starts s over cache, which holds the first k tokens of its
// history as a policy left them, with that policy's state snap and, when
// they were computed, the logits after the k-th token: the compressed
// prefix cache's and kept slots' way in. An error ends s (and frees
// cache); it reports true either way.
func (e *Engine) startRestored(s *seqState, cache *kvcache.Paged, snap *policy.Snapshot, k int, logits []float32) bool {
	q := s.req
	seq, err := e.m.NewSequence(cache)
	if err != nil {
		cache.Free()
		e.finish(s, FinishError, err)
		return true
	}
	seq.Chunk = e.cfg.PrefillChunk
	st, err := policy.Restore(q.r.Policy, seq, snap)
	if err != nil {
		cache.Free()
		e.finish(s, FinishError, err)
		return true
	}
	if !q.started {
		q.started = true
		q.usage.CompressedTokens = k
		e.prefixQueried.Add(int64(len(s.hist)))
		if q.storeComp { // from the shared tier (kvstore.go), not the local cache
			q.usage.StoreTokens = k
		} else {
			q.usage.CachedTokens = k
			e.prefixHit.Add(int64(k))
		}
	}
	s.seq, s.cache, s.pol = seq, cache, st
	s.fed, s.prefilling, s.restored = k, true, logits
	e.running = append(e.running, s)
	return true
}

// storeCompressed caches s's compressed prompt, its first tokens (just
// compressed, before anything runs on top), when the method's state can
// be kept.
func (e *Engine) storeCompressed(s *seqState, tokens []int, logits []float32) {
	snap, ok := s.pol.Snapshot()
	if !ok {
		return
	}
	q := s.req
	c, ok := s.cache.(kvcache.CompressedCache)
	if !ok {
		return
	}
	// Refused for caches not all in blocks (KIVI): nothing is cached.
	logits = slices.Clone(logits)
	if added, err := c.RegisterCompressed(tokens, compKey(q.r.Policy, q.pool), &compMeta{snap: snap, logits: logits}); added && err == nil {
		e.writeCompressed(s, tokens, snap, logits)
	}
}
