package engine

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvstore"
	"github.com/kvlm/kvlm/policy"
)

// The shared KV tier (Config.Store, docs/KVSTORE.md): full prefix blocks
// are written to the store as the local prefix cache registers them, and
// a request whose prompt's next full blocks are not in the local cache
// looks them up there and loads them instead of computing them.
//
// The lookup runs in Submit, in the caller's goroutine, before the request
// joins the queue (lookup): a slow or dead store holds that request, at
// most Config.StoreTimeout a round trip, and never the scheduler or the
// other sequences. The payloads wait on the request; when the scheduler
// starts it (start), the blocks the local cache does not hold by then are
// copied into pool blocks and registered locally (loadFetched): a memory
// copy on the scheduler goroutine, no I/O. Writes go through a
// kvstore.Writer: the scheduler copies a newly registered block out
// (writeThrough) only when the writer's byte-bounded queue has room, and
// never waits on the store.
//
// A key is the namespace (namespace: the weights' fingerprint, the
// codecs, the block size, the KV layout, the key means, the prefix
// extra) and the block's chain hash; an entry repeats them with the
// block's tokens and its parent's hash, under a checksum
// (kvstore.Open). Anything else is a miss: the block is computed.

// maxFetchBytes bounds the entries one lookup round trip reads; a longer
// chain takes more round trips, stopping at the first miss.
const maxFetchBytes = 64 << 20

// tierSeq is a sequence as the shared tier sees it (kvcache.Paged).
type tierSeq interface {
	PrefixBlocks() int
	PrefixHash(j int) (hash, parent uint64)
	AppendPrefixBlock(dst []byte, j int) ([]byte, error)
	ImportPrefix(tokens []int, extra uint64, blocks [][]byte) (int, error)
}

var _ tierSeq = (*kvcache.Paged)(nil)

// storeCounters are the tier's counters (Stats).
type storeCounters struct {
	hit, miss, getErr, corrupt, loaded atomic.Int64
	lastGetErr                         atomic.Value // string
}

// namespace is the namespace of pool p's blocks; false until the weights'
// fingerprint is known (New computes it in the background: until then the
// tier is not used).
func (e *Engine) namespace(p *kvcache.Pool) (kvstore.Namespace, bool) {
	select {
	case <-e.fpDone:
	default:
		return kvstore.Namespace{}, false
	}
	fp := e.fingerprint()
	if fp == "" {
		return kvstore.Namespace{}, false
	}
	k, v := p.Codecs()
	l := p.Layout()
	shift := uint64(0)
	if p.KeyShifted() {
		h := fnv.New64a()
		for _, row := range e.shift {
			for _, x := range row {
				b := math.Float32bits(x)
				h.Write([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)})
			}
		}
		shift = h.Sum64()
	}
	desc := fmt.Sprintf("kvlm kv-store v%d|model %s|k %s|v %s|block %d|layers %d|kv_heads %d|head_dim %d|kv_source %v|windows %v|key_shift %x|extra 0",
		kvstore.FormatVersion, fp, k.Name(), v.Name(), p.BlockTokens(), l.Layers, l.KVHeads, l.HeadDim, e.m.KVSource, l.Windows, shift)
	return kvstore.NewNamespace(desc), true
}

// fetched is what a request's lookup found: the payloads of its prompt's
// full blocks from block from on, in order; or the compressed prefix of
// its prompt (comp).
type fetched struct {
	from   int
	blocks [][]byte
	bytes  int64   // held against Config.StoreFetchBytes (Engine.fetchHeld) until dropFetched
	comp   *slotV2 // decoded and checked against the model and the request (readSlotV2)
}

// lookup reads from the store the prompt's full blocks that follow those
// the local prefix cache holds (the blocks start would take from it), in
// round trips of at most maxFetchBytes, up to the first missing, corrupt
// or unreadable entry. Called by Submit, outside the scheduler.
func (e *Engine) lookup(pool *kvcache.Pool, r *GenRequest, pol policy.Config, streamed bool) *fetched {
	if e.store == nil || r.NoPrefixCache || streamed || !pool.Tierable() {
		return nil
	}
	ns, ok := e.namespace(pool)
	if !ok {
		return nil
	}
	k := len(r.Prompt)
	if r.PrefixTokens > 0 {
		k = r.PrefixTokens
	}
	if pol.Method != "full" {
		if d, n := e.lookupCompressed(pool, ns, r.Prompt, k, pol); d != nil {
			return &fetched{comp: d, bytes: n}
		}
	}
	toks := r.Prompt[:k-pol.ComputedTail(k)+1]
	hashes, local := pool.PrefixChain(toks, 0)
	if local == len(hashes) {
		return nil
	}
	B := pool.BlockTokens()
	size := pool.TierBlockBytes()
	per := max(1, maxFetchBytes/kvstore.EntrySize(B, size))
	f := &fetched{from: local}
	hdr := kvstore.Header{Kind: kvstore.KindBlock, NS: ns, Tokens: make([]int32, B)}
	for j := local; j < len(hashes); {
		n := min(per, len(hashes)-j)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = kvstore.Key(ns, hashes[j+i])
		}
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StoreTimeout)
		vals, err := e.store.Get(ctx, keys)
		cancel()
		if err != nil {
			e.st.lastGetErr.Store(err.Error())
			e.st.getErr.Add(1)
			break
		}
		for i, val := range vals {
			if val == nil {
				break
			}
			hdr.Hash = hashes[j+i]
			hdr.Parent = 0
			if j+i > 0 {
				hdr.Parent = hashes[j+i-1]
			}
			for t := range B {
				hdr.Tokens[t] = int32(toks[(j+i)*B+t])
			}
			payload, err := kvstore.Open(val, hdr, size)
			if err != nil {
				e.st.corrupt.Add(1)
				break
			}
			if !e.holdFetched(int64(len(val))) {
				break // queued requests hold StoreFetchBytes already: computed, counted as a miss
			}
			f.bytes += int64(len(val))
			f.blocks = append(f.blocks, payload)
		}
		j += n
		if len(f.blocks) < j-local {
			break // a miss
		}
	}
	e.st.miss.Add(int64(len(hashes) - local - len(f.blocks)))
	if len(f.blocks) == 0 {
		return nil
	}
	return f
}

// DefaultFetchBytes is Config.StoreFetchBytes's default.
const DefaultFetchBytes = 64 << 20

// holdFetched takes n bytes of the fetch bound for a queued request's
// fetched blocks, if they fit.
func (e *Engine) holdFetched(n int64) bool {
	if e.fetchHeld.Add(n) > e.cfg.StoreFetchBytes {
		e.fetchHeld.Add(-n)
		return false
	}
	return true
}

// dropFetched gives back what f holds of the fetch bound (f may be nil).
func (e *Engine) dropFetched(f *fetched) {
	if f != nil && f.bytes > 0 {
		e.fetchHeld.Add(-f.bytes)
		f.bytes = 0
	}
}

// lookupCompressed reads from the store the compressed prefix of the
// prompt's first k tokens under pol, unless the local pool has it. The
// entry's payload is a slot encoding (slotv2.go) of the compressed
// tables, the policy's state and the logits after token k; it is decoded
// and checked here, outside the scheduler. A compressed prefix counts as
// one block in the hit and miss counters.
func (e *Engine) lookupCompressed(pool *kvcache.Pool, ns kvstore.Namespace, prompt []int, k int, pol policy.Config) (*slotV2, int64) {
	if policy.SlotSavable(pol) != nil {
		return nil, 0
	}
	toks := prompt[:k]
	extra := compKey(pol, pool)
	if pool.HasCompressed(toks, extra) {
		return nil, 0
	}
	h := kvcache.CompressedHash(toks, extra)
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StoreTimeout)
	vals, err := e.store.Get(ctx, []string{compressedKey(ns, h)})
	cancel()
	if err != nil {
		e.st.lastGetErr.Store(err.Error())
		e.st.getErr.Add(1)
		return nil, 0
	}
	if vals[0] == nil {
		e.st.miss.Add(1)
		return nil, 0
	}
	hdr := kvstore.Header{Kind: kvstore.KindCompressed, NS: ns, Hash: h, Tokens: make([]int32, k)}
	for i, t := range toks {
		hdr.Tokens[i] = int32(t)
	}
	body, err := kvstore.Open(vals[0], hdr, -1)
	var d *slotV2
	if err == nil {
		d, err = e.readSlotV2(body)
	}
	if err == nil && (d.cfg.Key() != pol.Key() || !slices.Equal(d.tokens, toks) || d.state == nil || (k == len(prompt) && d.logits == nil)) {
		err = errors.New("another compressed prefix")
	}
	if err != nil {
		e.st.corrupt.Add(1)
		e.st.miss.Add(1)
		return nil, 0
	}
	n := int64(len(vals[0]))
	if !e.holdFetched(n) {
		e.st.miss.Add(1)
		return nil, 0 // queued requests hold StoreFetchBytes already: computed
	}
	return d, n
}

// compressedKey is the store key of a compressed prefix (its hash is not
// a chain hash: a separate key space).
func compressedKey(ns kvstore.Namespace, h uint64) string { return kvstore.Key(ns, h) + ":c" }

// startFetchedCompressed starts s from the compressed prefix its lookup
// found, as startCompressed starts from a local one, and caches it
// locally. It reports whether it did (else cache is still empty and s
// starts as usual: the pool could not take it now, or it did not fit
// the pool after all, counted as a miss).
func (e *Engine) startFetchedCompressed(s *seqState, cache *kvcache.Paged, k int) bool {
	q := s.req
	f := q.fetched
	if f == nil || f.comp == nil || q.started {
		return false
	}
	q.fetched = nil
	e.dropFetched(f)
	sl, err := e.restoreV2(f.comp, q.pool)
	if err != nil {
		e.st.miss.Add(1)
		if !errors.Is(err, ErrKVBusy) {
			e.st.corrupt.Add(1)
		}
		return false
	}
	c := sl.cache.(*kvcache.Paged)
	e.st.hit.Add(1)
	e.st.loaded.Add(c.Bytes())
	var logits []float32
	if k == len(s.hist) {
		logits = sl.logits
	}
	c.RegisterCompressed(s.hist[:k], compKey(q.r.Policy, q.pool), &compMeta{snap: sl.snap, logits: sl.logits})
	cache.Free()
	q.storeComp = true
	return e.startRestored(s, c, sl.snap, k, logits)
}

// writeCompressed queues for the store the compressed prefix s just
// cached locally (storeCompressed): its tables, policy state and logits
// in the slot encoding.
func (e *Engine) writeCompressed(s *seqState, tokens []int, snap *policy.Snapshot, logits []float32) {
	q := s.req
	if e.writer == nil || policy.SlotSavable(q.r.Policy) != nil {
		return
	}
	ns, ok := e.namespace(q.pool)
	if !ok {
		return
	}
	// The entry is about the cache's bytes: skip the copy when it
	// cannot fit the queue.
	if !e.writer.Fits(int(s.cache.Bytes())) {
		e.writer.Drop()
		return
	}
	body, err := e.encodeSlotV2(&slot{cache: s.cache, pool: q.pool, tokens: tokens, cfg: q.r.Policy, snap: snap, logits: logits, pos: s.seq.Pos()})
	if err != nil {
		return
	}
	extra := compKey(q.r.Policy, q.pool)
	h := kvcache.CompressedHash(tokens, extra)
	hdr := kvstore.Header{Kind: kvstore.KindCompressed, NS: ns, Hash: h, Tokens: make([]int32, len(tokens))}
	for i, t := range tokens {
		hdr.Tokens[i] = int32(t)
	}
	buf := kvstore.AppendHeader(nil, hdr, len(body))
	e.writer.Put(compressedKey(ns, h), kvstore.Seal(append(buf, body...)))
}

// loadFetched copies into cache the fetched blocks that follow its
// matched tokens (the local prefix cache's) and returns the tokens loaded.
// Fetched blocks it cannot use (the local cache lost blocks before them
// since the lookup; the pool ran dry) count as misses.
func (e *Engine) loadFetched(q *request, cache kvcache.Scheduled, hist []int, matched int) int {
	f := q.fetched
	q.fetched = nil
	e.dropFetched(f)
	c, ok := cache.(tierSeq)
	if f == nil || f.comp != nil || !ok {
		return 0
	}
	B := q.pool.BlockTokens()
	j := matched / B
	if j < f.from || j >= f.from+len(f.blocks) {
		if j < f.from {
			e.st.miss.Add(int64(len(f.blocks)))
		}
		return 0
	}
	use := f.blocks[j-f.from:]
	n, err := c.ImportPrefix(hist, 0, use)
	if err != nil && !errors.Is(err, kvcache.ErrNoBlocks) {
		e.st.corrupt.Add(1) // a payload of the wrong size passed Open: not expected
	}
	e.st.hit.Add(int64(n / B))
	e.st.miss.Add(int64(len(use) - n/B))
	e.st.loaded.Add(int64(n/B) * int64(q.pool.TierBlockBytes()))
	return n
}

// registerPrefix makes s's full blocks findable in the local prefix cache
// and queues the new ones for the store.
func (e *Engine) registerPrefix(s *seqState) {
	s.cache.RegisterPrefix(s.hist[:s.fed], 0)
	e.writeThrough(s)
}

// writeThrough queues for the store the prefix blocks of s registered
// since the last call, those the queue has room for (the others are
// dropped, counted by the writer).
func (e *Engine) writeThrough(s *seqState) {
	if e.writer == nil {
		return
	}
	c, ok := s.cache.(tierSeq)
	if !ok {
		return
	}
	n := c.PrefixBlocks()
	if s.stored >= n {
		return
	}
	from := s.stored
	s.stored = n
	p := s.req.pool
	ns, ok := e.namespace(p)
	if !ok || !p.Tierable() {
		return
	}
	B, size := p.BlockTokens(), p.TierBlockBytes()
	entry := kvstore.EntrySize(B, size)
	hdr := kvstore.Header{Kind: kvstore.KindBlock, NS: ns, Tokens: make([]int32, B)}
	for j := from; j < n; j++ {
		if !e.writer.Fits(entry) {
			e.writer.Drop()
			continue
		}
		hdr.Hash, hdr.Parent = c.PrefixHash(j)
		for t := range B {
			hdr.Tokens[t] = int32(s.hist[j*B+t])
		}
		buf := kvstore.AppendHeader(nil, hdr, size)
		buf, err := c.AppendPrefixBlock(buf, j)
		if err != nil {
			return
		}
		e.writer.Put(kvstore.Key(ns, hdr.Hash), kvstore.Seal(buf))
	}
}

// closeStore flushes the writer (at most a second, or ten timeouts).
func (e *Engine) closeStore() {
	if e.writer != nil {
		e.writer.Close(max(time.Second, 10*e.cfg.StoreTimeout))
	}
}

// StoreStats are the shared tier's counters (Stats.Store).
type StoreStats struct {
	Enabled      bool
	HitBlocks    int64 // blocks loaded from the store
	MissBlocks   int64 // blocks looked up there and computed instead (missing, corrupt, unreadable, unusable)
	GetErrors    int64 // lookups (round trips) that failed: the store down, a timeout
	SetErrors    int64 // write pipelines that failed
	Corrupt      int64 // entries refused (checksum, header, length, tokens)
	Written      int64 // blocks written
	Dropped      int64 // blocks not written: the queue was full, or the write failed
	LoadedBytes  int64 // payload bytes of the blocks loaded
	WrittenBytes int64 // entry bytes written
	QueuedBytes  int64 // entry bytes waiting to be written
	LastGetError string
	LastSetError string
}

// StoreStats reports the shared tier's counters; safe from any goroutine.
func (e *Engine) StoreStats() StoreStats {
	if e.store == nil {
		return StoreStats{}
	}
	w := e.writer.Stats()
	lg, _ := e.st.lastGetErr.Load().(string)
	return StoreStats{LastGetError: lg, LastSetError: w.LastError, Enabled: true, HitBlocks: e.st.hit.Load(), MissBlocks: e.st.miss.Load(), GetErrors: e.st.getErr.Load(),
		SetErrors: w.Errors, Corrupt: e.st.corrupt.Load(), Written: w.Written, Dropped: w.Dropped,
		LoadedBytes: e.st.loaded.Load(), WrittenBytes: w.WrittenBytes, QueuedBytes: w.QueuedBytes}
}
