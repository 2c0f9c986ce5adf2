package engine

// The serving engine: many requests over one model, continuous batching.
//
// One goroutine (the scheduler) owns every sequence. Between steps it
// drops cancelled and stopped samples (their blocks are released at once),
// admits waiting requests while the KV budget has room for their prompts,
// runs one decode step of every running sample as one batch
// (model.DecodeBatch: each weight matrix read once for all of them), and
// then up to PrefillChunk prompt tokens of the samples still prefilling, so
// a long prompt is spread over several steps instead of stalling the
// others. When the blocks run out mid-generation, the newest sample is
// preempted: its blocks are freed and it waits at the head of the queue to
// be recomputed from its tokens (prompt and generated so far; the prefix
// cache usually hands most of them back).
//
// KV memory: one kvcache.Pool per (key codec, value codec) pair, created on
// first use, all drawing on one kvcache.Arena of Config.KVMem bytes. A pool
// takes a chunk of the arena (1/256 of it, or one f32 block if larger)
// when it has no free block left, so together the pools never allocate
// more than the budget: a pool dropped (at MaxPools) gives its chunks back
// for the next one, and a pool that needs memory when the arena is spent
// takes the chunks other pools hold only free blocks or cached prefixes in
// (those prefixes are dropped) before it evicts its own cached prefixes
// and, last, fails. Admission and each step check the bytes the cache
// says the work takes (kvcache.Pool.AdmitBytes for a request,
// kvcache.Scheduled.Need for a step) against the bytes referenced in every
// pool together and the budget, and against what the sample's pool can
// still take from the arena (ObtainableBytes: chunk granularity). The
// engine compares bytes; it never counts blocks.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/kvstore"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// Config sets up an Engine. Zero fields take the defaults given.
type Config struct {
	KVMem        int64  // KV byte budget of all pools together (default: MaxRunning full contexts in the default codecs, at most 4 GiB)
	BlockTokens  int    // tokens per KV block (kvcache.DefaultBlockTokens)
	K, V         string // default codecs of keys and values ("f32")
	MaxRunning   int    // samples decoded together at most (32)
	MaxQueue     int    // requests waiting at most; more get ErrQueueFull (256)
	PrefillChunk int    // prompt tokens run per scheduler step (model.DefaultChunk)
	MaxPools     int    // distinct (K, V) codec pairs at most (4); another while all are held: ErrPoolsBusy
	MaxN         int    // samples per request at most (16)
	Observer     Observer
	// KeyShiftPrompt, if set (usually just the BOS token), makes pools
	// whose key codec quantizes per token (q8, q4) store the keys around
	// the model's mean keys (kvcache.PoolConfig.KeyShift), estimated once,
	// when the first such pool is made, by model.KeyMeans from this prompt
	// (model.DefaultKeyMeanTokens tokens the model writes, seed 1).
	KeyShiftPrompt []int
	// Store, if set, is the shared KV tier (kvstore.go, docs/KVSTORE.md):
	// full prefix blocks are written to it and read back by this engine
	// and by others sharing it. The engine does not close it.
	Store        kvstore.Store
	StoreTimeout time.Duration // bounds one store round trip (kvstore.DefaultTimeout)
	StoreQueue   int64         // bytes of writes queued at most; more are dropped (kvstore.DefaultQueueBytes)
	// StoreFetchBytes bounds the bytes of fetched blocks that queued
	// requests hold until they start (DefaultFetchBytes); a lookup past
	// it stops, and the rest of that prompt is computed.
	StoreFetchBytes int64
	// PrefixObserver, if set, hears of the default pool's prefix-cache
	// blocks as they are stored and dropped (KV events: kvevents). Pools
	// of other codec pairs, which requests choose with kv.type_k/type_v,
	// are not reported: their blocks hash alike but do not serve requests
	// of the default codecs.
	PrefixObserver kvcache.PrefixObserver
}

// Observer receives the engine's measurements (metrics). Calls come from
// the scheduler goroutine and must be quick.
type Observer interface {
	FirstToken(d time.Duration)                   // time from submission to a request's first token
	InterToken(d time.Duration)                   // time between two tokens of a sample
	Step(prefill, generated int, d time.Duration) // one scheduler step: prompt tokens run, tokens generated, its duration
	Evicted(policy string, tokens float64)        // tokens a compression policy dropped (mean over tables)
	Preempted()                                   // a sample was preempted (recomputed later)
	Finished(r FinishReason, e2e time.Duration)   // a sample ended, e2e after its request's submission
}

type nopObserver struct{}

func (nopObserver) FirstToken(time.Duration)             {}
func (nopObserver) InterToken(time.Duration)             {}
func (nopObserver) Step(int, int, time.Duration)         {}
func (nopObserver) Evicted(string, float64)              {}
func (nopObserver) Preempted()                           {}
func (nopObserver) Finished(FinishReason, time.Duration) {}

// Engine schedules generations over one model.
type Engine struct {
	m      *model.Model
	cfg    Config
	obs    Observer
	tables int   // (layer, KV head) tables per sequence
	budget int64 // KV bytes
	arena  *kvcache.Arena

	mu      sync.Mutex
	pools   map[string]*poolEntry // "k/v" → pool
	defPool *kvcache.Pool
	waiting []*request // FIFO, bounded by MaxQueue
	control []func()   // work to run on the scheduler goroutine
	closed  bool
	nextID  uint64
	wakeCh  chan struct{}
	doneCh  chan struct{}

	// Scheduler-owned state (read by Stats through atomics).
	running   []*seqState
	preempted []*seqState
	slots     map[int]*slot

	fpStop atomic.Bool   // Close: give up the fingerprint started by New
	fpDone chan struct{} // closed when it ended

	shiftOnce sync.Once
	shift     [][]float32 // key means for q8/q4 key pools (Config.KeyShiftPrompt)
	shiftErr  error

	nRunning, nWaiting atomic.Int64
	prefixQueried      atomic.Int64 // prompt tokens looked up in the prefix cache
	prefixHit          atomic.Int64 // prompt tokens found there
	prefillComputed    atomic.Int64 // prompt tokens run through the model (prefill)
	compHits           atomic.Int64 // requests started from a compressed prefix
	compMisses         atomic.Int64 // requests with a policy that found none
	preemptions        atomic.Int64
	stepGen            int // tokens generated in the current step

	store  kvstore.Store   // Config.Store, or nil
	writer *kvstore.Writer // its write queue, when store is set
	// fetchHeld is the bytes of fetched blocks queued requests hold
	// (request.fetched), at most cfg.StoreFetchBytes.
	fetchHeld atomic.Int64
	st        storeCounters
}

// New starts an engine over m. Close stops it.
func New(m *model.Model, cfg Config) (*Engine, error) {
	if cfg.BlockTokens == 0 {
		cfg.BlockTokens = kvcache.DefaultBlockTokens
	}
	if cfg.K == "" {
		cfg.K = "f32"
	}
	if cfg.V == "" {
		cfg.V = "f32"
	}
	if cfg.MaxRunning <= 0 {
		cfg.MaxRunning = 32
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 256
	}
	if cfg.PrefillChunk <= 0 {
		cfg.PrefillChunk = model.DefaultChunk
	}
	if cfg.MaxPools <= 0 {
		cfg.MaxPools = 4
	}
	if cfg.MaxN <= 0 {
		cfg.MaxN = 16
	}
	e := &Engine{m: m, cfg: cfg, obs: cfg.Observer, pools: map[string]*poolEntry{},
		wakeCh: make(chan struct{}, 1), doneCh: make(chan struct{}), slots: map[int]*slot{}}
	if e.obs == nil {
		e.obs = nopObserver{}
	}
	if cfg.StoreTimeout < 0 || cfg.StoreQueue < 0 || cfg.StoreFetchBytes < 0 {
		return nil, fmt.Errorf("the KV store's timeout, queue and fetch bound must not be negative, got %s, %d and %d bytes", cfg.StoreTimeout, cfg.StoreQueue, cfg.StoreFetchBytes)
	}
	if cfg.StoreFetchBytes == 0 {
		cfg.StoreFetchBytes = DefaultFetchBytes
	}
	if cfg.StoreTimeout == 0 {
		cfg.StoreTimeout = kvstore.DefaultTimeout
	}
	if cfg.StoreQueue == 0 {
		cfg.StoreQueue = kvstore.DefaultQueueBytes
	}
	e.cfg = cfg
	l := m.KVLayout()
	e.tables = l.Layers * l.KVHeads
	k, v, err := parseCodecs(cfg.K, cfg.V)
	if err != nil {
		return nil, err
	}
	e.budget = cfg.KVMem
	if e.budget == 0 {
		// MaxRunning full contexts in the default codecs (window-bounded
		// layers at their bound under prefill chunks), capped.
		f, err := kvcache.FootprintOf(kvcache.PoolConfig{Layout: l, BlockTokens: cfg.BlockTokens, K: k, V: v})
		if err != nil {
			return nil, err
		}
		e.budget = min(int64(cfg.MaxRunning)*f.AdmitBytesStep(l, m.CtxLen, cfg.PrefillChunk), 4<<30)
		// At least a block per table and running sequence: under KIVI a
		// model whose every layer's window fits in the residual takes no
		// blocks (kvcache.Footprint.Unsealed), yet requests of other
		// codec pairs share this arena.
		e.budget = max(e.budget, int64(cfg.MaxRunning)*int64(e.tables)*int64(f.BlockBytes))
	}
	chunk, err := chunkBytes(l, cfg.BlockTokens, e.budget)
	if err != nil {
		return nil, err
	}
	if e.arena, err = kvcache.NewArena(e.budget, chunk); err != nil {
		return nil, err
	}
	e.budget = e.arena.Budget()
	if e.defPool, err = e.pool(cfg.K, cfg.V); err != nil {
		return nil, err
	}
	if cfg.PrefixObserver != nil {
		e.defPool.SetPrefixObserver(cfg.PrefixObserver)
	}
	// The weights' fingerprint (slots, system_fingerprint), in the
	// background: loading does not wait for it.
	e.fpDone = make(chan struct{})
	go func() {
		defer close(e.fpDone)
		fingerprint(m, &e.fpStop)
	}()
	if cfg.Store != nil {
		e.store = cfg.Store
		e.writer = kvstore.NewWriter(cfg.Store, cfg.StoreQueue, cfg.StoreTimeout)
	}
	go e.loop()
	return e, nil
}

// Model is the engine's model.
func (e *Engine) Model() *model.Model { return e.m }

// Budget is the KV byte budget.
func (e *Engine) Budget() int64 { return e.budget }

// Config is the configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

func parseCodecs(kn, vn string) (codec.Codec, codec.Codec, error) {
	k, err := codec.Parse(kn, codec.Keys)
	if err != nil {
		return nil, nil, err
	}
	v, err := codec.Parse(vn, codec.Values)
	if err != nil {
		return nil, nil, err
	}
	return k, v, nil
}

// chunkBytes is the arena chunk of an engine: 1/256 of the budget (so
// that MaxPools pools lose little to partly used chunks), and at least
// the largest block of any codec pair (with its 64-byte alignment); 64
// MiB at most.
func chunkBytes(l kvcache.Layout, B int, budget int64) (int, error) {
	big := 0
	for _, kn := range codec.Names {
		for _, vn := range codec.Names {
			k, v, err := parseCodecs(kn, vn)
			if err != nil {
				continue
			}
			f, err := kvcache.FootprintOf(kvcache.PoolConfig{Layout: l, BlockTokens: B, K: k, V: v})
			if err != nil {
				continue // a pair no pool can take (NewPool says why)
			}
			big = max(big, f.BlockBytes+3*64) // its three regions 64-byte aligned
		}
	}
	c := max(int64(big), min(budget/256, 64<<20))
	if c > budget {
		return 0, fmt.Errorf("a KV budget of %d bytes cannot hold one block of %d tokens (%d bytes)", budget, B, big)
	}
	return int(c), nil
}

// poolEntry is a pool and the requests and slots using it.
type poolEntry struct {
	p    *kvcache.Pool
	refs int
}

// pool returns the pool of a codec pair with one more reference (release
// it with unref), creating it on first use. At MaxPools pairs an unused
// pool (no reference, no block held) is dropped to make room.
func (e *Engine) pool(kn, vn string) (*kvcache.Pool, error) {
	if kn == "" {
		kn = e.cfg.K
	}
	if vn == "" {
		vn = e.cfg.V
	}
	k, v, err := parseCodecs(kn, vn)
	if err != nil {
		return nil, err
	}
	key := k.Name() + "/" + v.Name()
	e.mu.Lock()
	defer e.mu.Unlock()
	if pe := e.pools[key]; pe != nil {
		pe.refs++
		return pe.p, nil
	}
	if len(e.pools) >= e.cfg.MaxPools {
		for name, pe := range e.pools {
			if pe.p != e.defPool && pe.refs == 0 && pe.p.Usage().Used == 0 && pe.p.Close() == nil {
				delete(e.pools, name) // its memory went back to the arena
				break
			}
		}
	}
	if e.cfg.MaxPools == 1 && e.defPool != nil {
		return nil, fmt.Errorf("the server keeps one KV codec pair, %s/%s (MaxPools 1)", e.cfg.K, e.cfg.V)
	}
	if len(e.pools) >= e.cfg.MaxPools {
		return nil, capacity(ErrPoolsBusy, "the server keeps at most %d KV codec pairs at once and all are in use (%s); retry later", e.cfg.MaxPools, strings.Join(e.poolNamesLocked(), ", "))
	}
	var shift [][]float32
	if len(e.cfg.KeyShiftPrompt) > 0 && k.Shiftable() {
		e.shiftOnce.Do(func() { e.shift, e.shiftErr = e.m.KeyMeans(e.cfg.KeyShiftPrompt, 0, 1) })
		if e.shiftErr != nil {
			return nil, fmt.Errorf("key means for %s keys: %w", k.Name(), e.shiftErr)
		}
		shift = e.shift
	}
	p, err := kvcache.NewPool(kvcache.PoolConfig{Layout: e.m.KVLayout(), BlockTokens: e.cfg.BlockTokens, K: k, V: v, Arena: e.arena, KeyShift: shift})
	if err != nil {
		return nil, err
	}
	e.pools[key] = &poolEntry{p: p, refs: 1}
	return p, nil
}

// poolError is what Submit and RestoreSlot answer when pool fails: a
// capacity error as it is, anything else (unknown codecs, a budget too
// small for the pair) as the client's.
func poolError(err error) error {
	var ce *CapacityError
	if errors.As(err, &ce) {
		return err
	}
	return invalid("kv: %v", err)
}

// ref adds delta references to the pool p.
func (e *Engine) ref(p *kvcache.Pool, delta int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, pe := range e.pools {
		if pe.p == p {
			pe.refs += delta
			return
		}
	}
}

func (e *Engine) poolNamesLocked() []string {
	var out []string
	for k := range e.pools {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func (e *Engine) poolList() []*kvcache.Pool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*kvcache.Pool, 0, len(e.pools))
	for _, pe := range e.pools {
		out = append(out, pe.p)
	}
	return out
}

// usedBytes is what every pool's referenced blocks take.
func (e *Engine) usedBytes() int64 {
	var n int64
	for _, p := range e.poolList() {
		n += p.Usage().BytesUsed
	}
	return n
}

func (e *Engine) wake() {
	select {
	case e.wakeCh <- struct{}{}:
	default:
	}
}

// Submit validates a request and queues it. Errors: *InvalidError (the
// request can never run), *CapacityError (not now: ErrQueueFull,
// ErrPoolsBusy), ErrClosed.
func (e *Engine) Submit(r GenRequest) (*Handle, error) {
	if r.N == 0 {
		r.N = 1
	}
	if err := e.validate(&r); err != nil {
		return nil, err
	}
	pool, err := e.pool(r.K, r.V)
	if err != nil {
		return nil, poolError(err)
	}
	queued := false
	defer func() {
		if !queued {
			e.ref(pool, -1)
		}
	}()
	pol, err := r.Policy.Normalize()
	if err != nil {
		return nil, invalid("kv: %v", err)
	}
	r.Policy = pol
	streamed := false
	if len(r.Prompt) >= e.m.CtxLen {
		_, ok := pol.StreamBound()
		if ok && r.PrefixTokens != 0 {
			return nil, invalid("kv: a prompt longer than the context (%d tokens; the context is %d) is read token by token, with no prefix compressed on its own: drop kv.prefix", len(r.Prompt), e.m.CtxLen)
		}
		if !ok {
			return nil, invalid("the prompt is %d tokens; the context length is %d, and at least one token must be generated (a window method that prunes while decoding, kv.policy window, streaming or lminfinite, reads a longer prompt token by token)", len(r.Prompt), e.m.CtxLen)
		}
		streamed = true
	}
	if r.PrefixTokens != 0 && pol.Method == "full" {
		return nil, invalid("kv: a prefix to compress needs a compression policy (without one, the prefix cache reuses it as it is)")
	}
	if r.Slot != nil {
		if err := policy.SlotSavable(pol); err != nil {
			return nil, invalid("kv: a slot cannot keep this sequence: %v", err)
		}
	}
	// What policy.New would refuse for this pool (re-indexed positions
	// with grouped keys, …) is refused now.
	if kc, _ := pool.Codecs(); pol.Method != "full" {
		if err := policy.Validate(pol, pool.Layout(), kc); err != nil {
			return nil, invalid("kv: %v", err)
		}
	}
	admit := len(r.Prompt)
	if streamed {
		b, _ := pol.StreamBound()
		admit = min(admit, b)
	}
	if need, whole := pool.AdmitBytesStep(admit, r.N, e.cfg.PrefillChunk), pool.CapacityBytes(); need > whole {
		return nil, invalid("the prompt needs %d bytes of KV cache, more than the whole pool (%d bytes)", need, whole)
	}
	// The shared tier's lookup, here in the caller's goroutine
	// (kvstore.go); not for a request the queue will refuse.
	var found *fetched
	e.mu.Lock()
	refused := e.closed || len(e.waiting) >= e.cfg.MaxQueue
	e.mu.Unlock()
	if !refused {
		found = e.lookup(pool, &r, pol, streamed)
	}
	h := newHandle(r.N, e.wake)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		e.dropFetched(found)
		return nil, ErrClosed
	}
	if len(e.waiting) >= e.cfg.MaxQueue {
		e.dropFetched(found)
		return nil, capacity(ErrQueueFull, "%v (%d requests waiting); retry later", ErrQueueFull, len(e.waiting))
	}
	e.nextID++
	req := &request{id: e.nextID, r: r, h: h, pool: pool, submitted: time.Now(), streamed: streamed,
		usage: Usage{PromptTokens: len(r.Prompt), Policy: pol.String()}, fetched: found}
	kc, vc := pool.Codecs()
	req.usage.K, req.usage.V = kc.Name(), vc.Name()
	e.waiting = append(e.waiting, req)
	queued = true
	e.nWaiting.Add(1) // the scheduler recounts at its next step
	e.wake()
	return h, nil
}

func (e *Engine) validate(r *GenRequest) error {
	m := e.m
	switch {
	case len(r.Prompt) == 0:
		return invalid("empty prompt")
	case r.MaxTokens <= 0:
		return invalid("max_tokens must be at least 1, got %d", r.MaxTokens)
	case r.N < 1 || r.N > e.cfg.MaxN:
		return invalid("n must be between 1 and %d, got %d", e.cfg.MaxN, r.N)
	case r.N > e.cfg.MaxRunning:
		return invalid("n = %d is more than the server runs at once (%d)", r.N, e.cfg.MaxRunning)
	}
	for _, t := range r.Prompt {
		if t < 0 || t >= m.Vocab {
			return invalid("prompt token id %d out of range [0,%d)", t, m.Vocab)
		}
	}
	if err := r.Sampling.Validate(); err != nil {
		return invalid("%v", err)
	}
	if r.PrefixTokens < 0 || r.PrefixTokens > len(r.Prompt) {
		return invalid("kv: the prefix to compress must be between 1 and the prompt's %d tokens, got %d", len(r.Prompt), r.PrefixTokens)
	}
	if r.Slot != nil && (*r.Slot < 0 || *r.Slot >= MaxSlots) {
		return invalid("kv: slot must be between 0 and %d, got %d", MaxSlots-1, *r.Slot)
	}
	return nil
}

// Stats is a snapshot of the engine for metrics.
type Stats struct {
	Running, Waiting int   // samples decoding or prefilling (a request counts its n until they are forked, as MaxRunning does); requests and preempted samples waiting
	BudgetBytes      int64 // the KV byte budget
	UsedBytes        int64 // referenced by sequences, all pools
	ArenaBytes       int64 // KV memory allocated (arena chunks; never more than BudgetBytes)
	HeldBytes        int64 // of which held by pools now (the rest waits for reuse)
	Pools            []PoolStats
	PrefixQueried    int64 // prompt tokens looked up in the prefix cache
	PrefixHit        int64 // prompt tokens served from it
	PrefillComputed  int64 // prompt tokens run through the model (recomputations included)
	// Compressed prefixes (requests with a policy): lookups that found
	// one, lookups that did not, and what the pools cache (entries, bytes
	// of their blocks; all pools).
	CompressedHits, CompressedMisses int64
	CompressedPrefixes               int
	CompressedBytes                  int64
	Preemptions                      int64
	Store                            StoreStats // the shared KV tier (Config.Store)
}

// PoolStats is one codec pair's pool.
type PoolStats struct {
	Name string // "k/v" codec names
	kvcache.Usage
	BlockTokens int
	BlockBytes  int
}

// Stats reports the engine's state; safe from any goroutine.
func (e *Engine) Stats() Stats {
	st := Stats{Running: int(e.nRunning.Load()), Waiting: int(e.nWaiting.Load()), BudgetBytes: e.budget,
		PrefixQueried: e.prefixQueried.Load(), PrefixHit: e.prefixHit.Load(), PrefillComputed: e.prefillComputed.Load(),
		CompressedHits: e.compHits.Load(), CompressedMisses: e.compMisses.Load(), Preemptions: e.preemptions.Load(), Store: e.StoreStats()}
	au := e.arena.Usage()
	st.ArenaBytes, st.HeldBytes = au.Allocated, au.Held
	e.mu.Lock()
	names := make(map[*kvcache.Pool]string, len(e.pools))
	for k, pe := range e.pools {
		names[pe.p] = k
	}
	e.mu.Unlock()
	for p, name := range names {
		u := p.Usage()
		st.UsedBytes += u.BytesUsed
		n, b := p.CompressedPrefixes()
		st.CompressedPrefixes += n
		st.CompressedBytes += b
		st.Pools = append(st.Pools, PoolStats{Name: name, Usage: u, BlockTokens: p.BlockTokens(), BlockBytes: p.BlockBytes()})
	}
	sortPools(st.Pools)
	return st
}

func sortPools(p []PoolStats) {
	for i := 1; i < len(p); i++ {
		for j := i; j > 0 && p[j].Name < p[j-1].Name; j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
}

// Close stops the scheduler: waiting and running requests end with
// FinishCancelled and every block is released.
// ResetPrefixCache forgets every pool's cached prefixes (full blocks and
// compressed prompts; kvcache.Pool.ClearPrefixes), as vLLM's
// reset_prefix_cache: requests running keep their blocks, later prompts
// are computed again. It returns the entries forgotten.
func (e *Engine) ResetPrefixCache() int {
	e.mu.Lock()
	pools := make([]*kvcache.Pool, 0, len(e.pools))
	for _, pe := range e.pools {
		pools = append(pools, pe.p)
	}
	e.mu.Unlock()
	n := 0
	for _, p := range pools {
		n += p.ClearPrefixes()
	}
	return n
}

func (e *Engine) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.doneCh
		return
	}
	e.closed = true
	e.mu.Unlock()
	e.fpStop.Store(true) // the model may be closed after the engine
	e.wake()
	<-e.doneCh
	<-e.fpDone
	e.closeStore()
}

// do runs fn on the scheduler goroutine and waits for it.
func (e *Engine) do(fn func()) error {
	done := make(chan struct{})
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.control = append(e.control, func() { defer close(done); fn() })
	e.mu.Unlock()
	e.wake()
	select {
	case <-done:
		return nil
	case <-e.doneCh:
		return ErrClosed
	}
}

var errKVFull = errors.New("the KV cache pool cannot hold this sequence")
