package kvcache

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// DefaultBlockTokens is the number of token slots in a block (vLLM's 16).
const DefaultBlockTokens = 16

// ErrNoBlocks is returned when the pool has no free block left.
var ErrNoBlocks = errors.New("kvcache: no free KV blocks")

// PoolConfig sizes a block pool. Exactly one of Arena, MemBytes and
// Tokens sets its capacity.
type PoolConfig struct {
	Layout      Layout
	BlockTokens int         // token slots per block (DefaultBlockTokens is vLLM's 16)
	K, V        codec.Codec // storage codecs of keys and values; nil means f32
	// Arena, if set, is a byte budget shared with other pools: the pool
	// takes its memory from it chunk by chunk as it grows (Arena).
	Arena    *Arena
	MemBytes int64 // or: a budget of the pool's own, in bytes (blocks of every (layer, head) together)
	Tokens   int   // or: room for this many tokens in every (layer, head), pruned ones ragged (ragged.go) included
	// KIVI residual: tokens kept in full precision at the end of each
	// table before they are sealed (only used when K or V is KIVI);
	// 0 means codec.DefaultResidual.
	Residual int
	// KeyShift, if set, is a mean key per (layer, KV head), index
	// layer·KVHeads + head, each [HeadDim], post-RoPE. With a key codec
	// that quantizes per token (q8, q4), each table stores k − mean and
	// reads add it back (codec.Shifted): the stored keys read the same, but
	// the quantization step follows the spread of the keys around their
	// mean instead of their offset. Other key codecs ignore it.
	KeyShift [][]float32
}

// PosBytes is the bytes of the position every slot stores (an int32).
const PosBytes = 4

// Footprint is the storage of one (layer, KV head) table in a pool of some
// codecs and block size: the single definition of the cache's bytes that
// NewPool allocates by and that kvcalc and inspect report.
type Footprint struct {
	BlockTokens    int // token slots per block
	KBytes, VBytes int // one block's keys and values, codec metadata included
	// BlockBytes is one block: KBytes + VBytes + PosBytes·BlockTokens.
	BlockBytes int
	// KIVI (a KIVI codec on either side; all 0 otherwise): the newest
	// tokens of a table wait in a full-precision residual until
	// Residual+SealTokens are there, then the oldest SealTokens (a key
	// group, or one block when only the values are KIVI) are sealed into
	// blocks. The residual buffer has room for Residual+SealTokens tokens
	// of ResidualSlotBytes each (f16 key and value, int32 position).
	KeyGroup          int // KIVI key group (tokens); 0 without KIVI keys
	Residual          int
	SealTokens        int
	ResidualSlotBytes int
}

// FootprintOf checks cfg's codecs and block size as NewPool does, and
// returns what its tables store; it allocates nothing (cfg's size fields
// are not used). Nil codecs are f32.
func FootprintOf(cfg PoolConfig) (Footprint, error) {
	B, d := cfg.BlockTokens, cfg.Layout.HeadDim
	if B < 1 || B > 1<<16 {
		return Footprint{}, fmt.Errorf("kvcache: block size must be between 1 and 65536 tokens, got %d", cfg.BlockTokens)
	}
	if d <= 0 {
		return Footprint{}, fmt.Errorf("kvcache: head dim %d must be positive", d)
	}
	k, v := cfg.K, cfg.V
	if k == nil {
		k = codec.F32Keys
	}
	if v == nil {
		v = codec.F32
	}
	f := Footprint{BlockTokens: B, KBytes: k.BlockBytes(B, d), VBytes: v.BlockBytes(B, d)}
	f.BlockBytes = f.KBytes + f.VBytes + PosBytes*B
	if f.KeyGroup = k.GroupTokens(); f.KeyGroup > 0 {
		if f.KeyGroup%B != 0 {
			return Footprint{}, fmt.Errorf("kvcache: %s key groups of %d tokens must be a multiple of the block size %d", k.Name(), f.KeyGroup, B)
		}
	}
	if !v.PerToken() {
		return Footprint{}, fmt.Errorf("kvcache: codec %s cannot store values", v.Name())
	}
	if r := max(k.Residual(), v.Residual()); r > 0 {
		f.Residual = cfg.Residual
		if f.Residual == 0 {
			f.Residual = r
		}
		if f.Residual < 0 {
			return Footprint{}, fmt.Errorf("kvcache: negative KIVI residual %d", cfg.Residual)
		}
		f.SealTokens = B
		if f.KeyGroup > 0 {
			f.SealTokens = f.KeyGroup
		}
		f.ResidualSlotBytes = 2*2*d + PosBytes
	}
	return f, nil
}

// BytesPerToken is a table's bytes per token held in blocks:
// BlockBytes / BlockTokens (for KIVI: sealed tokens; those in the residual
// cost ResidualSlotBytes).
func (f Footprint) BytesPerToken() float64 { return float64(f.BlockBytes) / float64(f.BlockTokens) }

// Table is what one table holds once n tokens were appended in order (as
// a prefill and decode do, no policy): its blocks, the last one rounded up;
// with KIVI, the tokens not yet sealed (in the residual) and the slots of
// the residual buffer, allocated whole at the first token.
func (f Footprint) Table(n int) (blocks, residualTokens, residualSlots int) {
	if n <= 0 {
		return 0, 0, 0
	}
	if f.SealTokens == 0 {
		return (n + f.BlockTokens - 1) / f.BlockTokens, 0, 0
	}
	sealed := f.sealed(n)
	return sealed / f.BlockTokens, n - sealed, f.Residual + f.SealTokens
}

// Unsealed reports whether, with KIVI, a table of a layer with window w
// (0: none) is never sealed: w ≤ Residual, so every token its queries
// read is among the newest Residual, which KIVI keeps in f16 anyway. Such
// a table holds its window in the residual alone, takes no blocks, and its
// window frees residual tokens one by one (window.go).
func (f Footprint) Unsealed(w int) bool { return f.SealTokens > 0 && w > 0 && w <= f.Residual }

// ResidualBuffer is the slots of the residual buffer a KIVI table of a
// layer with window w (0: none) keeps between appends while it holds held
// tokens there: Residual + SealTokens, or for a never-sealed table
// (Unsealed) max(w, held).
func (f Footprint) ResidualBuffer(w, held int) int {
	if f.Unsealed(w) {
		return max(w, held)
	}
	return f.Residual + f.SealTokens
}

// sealed is how many of n tokens in a KIVI residual are sealed into blocks
// once sealing is due: whole groups of SealTokens while Residual+SealTokens
// tokens are there; 0 without KIVI.
func (f Footprint) sealed(n int) int {
	if f.SealTokens == 0 || n < f.Residual+f.SealTokens {
		return 0
	}
	return (n - f.Residual) / f.SealTokens * f.SealTokens
}

// AdmitBlocks is the blocks a table must be able to draw for n tokens to
// be admitted however they arrive, counting every token as held in
// blocks: ⌈n / BlockTokens⌉ (for KIVI more than Table's blocks, since the
// residual's tokens are counted as if in blocks and the residual buffers
// are outside the arena: a bound, Paged.Need being exact). A pool of
// MemBytes = AdmitBlocks(n) · tables · BlockBytes holds a sequence of n
// tokens.
func (f Footprint) AdmitBlocks(n int) int {
	if n <= 0 {
		return 0
	}
	return (n + f.BlockTokens - 1) / f.BlockTokens
}

// AdmitBytes is AdmitBlocks(n) blocks for every table of layout l, in
// bytes: an arena that holds a sequence of n tokens however they arrive.
func (f Footprint) AdmitBytes(l Layout, n int) int64 {
	return int64(f.AdmitBlocks(n)) * int64(l.Layers) * int64(l.KVHeads) * int64(f.BlockBytes)
}

// TableBytes is the bytes of Table(n): Paged.Memory().Reserved of a
// sequence of n tokens appended in order is TableBytes(n) times its tables.
func (f Footprint) TableBytes(n int) int64 {
	blocks, _, slots := f.Table(n)
	return int64(blocks)*int64(f.BlockBytes) + int64(slots)*int64(f.ResidualSlotBytes)
}

// pblock is the bookkeeping of one physical block; its data lives in the
// chunk of slot index/bpc, at index%bpc.
type pblock struct {
	ref        int32        // sequences (tables) holding the block
	n          int32        // filled slots
	prev, next int32        // links of the list the block is in (−1: none)
	list       uint8        // listNone, listFree or listCached
	entry      *prefixEntry // the prefix-cache entry the block belongs to, if any
}

// The lists an unreferenced block waits in.
const (
	listNone   = iota // referenced, or not present (its chunk was given back)
	listFree          // unreferenced, holding nothing of value
	listCached        // unreferenced, holding a cached prefix (LRU order)
)

// blist is an intrusive doubly linked list of blocks: O(1) push, pop and
// removal.
type blist struct {
	head, tail int32
	n          int
}

// Pool is the set of KV blocks all sequences of one codec pair draw from.
// A block holds BlockTokens tokens of one (layer, KV head): keys in the K
// codec, values in the V codec, and the position of each slot. Blocks are
// reference counted; unreferenced blocks wait in a free list, or, when
// they hold a cached prefix, in an LRU list where they stay findable until
// they are reused. The memory comes from an Arena, a chunk at a time, only
// when no free block is left: a new block is taken from the free list,
// else from a new chunk (or one another pool of the arena does not use),
// else by evicting the least recently used cached prefix, else from a
// chunk of another pool that only holds cached prefixes.
type Pool struct {
	mu sync.Mutex

	layout     Layout
	B          int           // token slots per block
	kc, vc     codec.Codec   // storage codecs
	kcs        []codec.Codec // key codec per (layer, KV head) when KeyShift applies; nil: kc everywhere
	kBytes     int           // bytes of one block's keys
	vBytes     int           // bytes of one block's values
	blockBytes int           // kBytes + vBytes + 4·B (positions)
	residual   int           // KIVI full-precision residual (tokens)
	group      int           // KIVI key group (tokens); 0 without KIVI keys
	fp         Footprint     // the bytes and sealing rule the pool was sized by

	arena  *Arena
	bpc    int       // blocks per chunk
	limit  int       // blocks at most
	chunks []*pchunk // by slot; nil: given back to the arena
	held   int       // blocks in the chunks held
	meta   []pblock  // [len(chunks)·bpc]
	closed bool

	free, cached blist
	nfree        int         // free.n + cached.n
	idle         idleCounter // chunks held whose blocks are all unreferenced (read by other pools' growth)

	index map[uint64]*prefixEntry // prefix cache: block hash → blocks
	obs   PrefixObserver          // told of full-block entries stored and dropped (observer.go); nil: none

	stats PoolStats
}

// PoolStats are running counters.
type PoolStats struct {
	PrefixQueries   int64 // blocks looked up in the prefix cache
	PrefixHits      int64 // blocks found
	PrefixEvictions int64 // cached blocks reused for new data
	CopyOnWrite     int64 // shared blocks copied before a write
}

// NewPool makes a pool; it takes memory as blocks are used.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if err := cfg.Layout.Validate(); err != nil {
		return nil, err
	}
	B := cfg.BlockTokens
	if B < 1 || B > 1<<16 {
		return nil, fmt.Errorf("kvcache: block size must be between 1 and 65536 tokens, got %d", cfg.BlockTokens)
	}
	if cfg.K == nil {
		cfg.K = codec.F32Keys
	}
	if cfg.V == nil {
		cfg.V = codec.F32
	}
	p := &Pool{layout: cfg.Layout, B: B, kc: cfg.K, vc: cfg.V, index: map[uint64]*prefixEntry{},
		free: blist{-1, -1, 0}, cached: blist{-1, -1, 0}}
	if err := p.setKeyShift(cfg.KeyShift); err != nil {
		return nil, err
	}
	f, err := FootprintOf(cfg)
	if err != nil {
		return nil, err
	}
	p.kBytes, p.vBytes, p.blockBytes = f.KBytes, f.VBytes, f.BlockBytes
	p.group, p.residual, p.fp = f.KeyGroup, f.Residual, f
	heads := cfg.Layout.Layers * cfg.Layout.KVHeads
	if cfg.Arena != nil {
		if cfg.MemBytes > 0 || cfg.Tokens > 0 {
			return nil, errors.New("kvcache: give the pool an arena, or a size in bytes or tokens, not both")
		}
		p.arena = cfg.Arena
		p.bpc = p.fitBlocks(p.arena.chunk)
		if p.bpc == 0 {
			return nil, fmt.Errorf("kvcache: arena chunks of %d bytes cannot hold one %s/%s block of %d bytes", p.arena.chunk, cfg.K.Name(), cfg.V.Name(), p.blockBytes)
		}
		if int64(p.arena.max)*int64(p.bpc) > 1<<31-1 {
			return nil, fmt.Errorf("kvcache: an arena of %d blocks is too large", int64(p.arena.max)*int64(p.bpc))
		}
		p.limit = p.arena.max * p.bpc
		if p.limit < heads {
			return nil, fmt.Errorf("kvcache: a budget of %d bytes holds %d blocks of %d bytes, fewer than one per (layer, KV head) (%d)",
				p.arena.budget, p.limit, p.blockBytes, heads)
		}
		p.arena.register(p)
		return p, nil
	}
	var blocks int64
	switch {
	case cfg.MemBytes > 0 && cfg.Tokens > 0:
		return nil, errors.New("kvcache: give the pool size as bytes or as tokens, not both")
	case cfg.MemBytes > 0:
		blocks = cfg.MemBytes / int64(p.blockBytes)
	case cfg.Tokens > 0:
		per := (cfg.Tokens + B - 1) / B
		if f.Residual == 0 {
			per += raggedSlack(cfg.Tokens, B) // however a policy prunes them (ragged.go)
		}
		blocks = int64(per) * int64(heads)
	default:
		return nil, errors.New("kvcache: the pool needs a memory budget (bytes or tokens)")
	}
	if blocks < int64(heads) {
		return nil, fmt.Errorf("kvcache: a budget of %d bytes holds %d blocks of %d bytes, fewer than one per (layer, KV head) (%d)",
			cfg.MemBytes, blocks, p.blockBytes, heads)
	}
	if blocks > 1<<31-1 || blocks*int64(p.blockBytes) > 1<<40 {
		return nil, fmt.Errorf("kvcache: pool of %d blocks is too large", blocks)
	}
	// An arena of its own, taken in eighths.
	p.limit = int(blocks)
	p.bpc = (p.limit + 7) / 8
	chunk := p.chunkBytes(p.bpc)
	p.arena = &Arena{chunk: chunk, max: (p.limit + p.bpc - 1) / p.bpc}
	p.arena.budget = int64(p.arena.max) * int64(chunk)
	p.arena.register(p)
	return p, nil
}

// Chunk layout: the keys of its blocks, then their values, then their
// positions, each region starting at a multiple of 64 bytes.

func align64(n int) int { return (n + 63) &^ 63 }

func (p *Pool) chunkOffsets(n int) (v, pos, end int) {
	v = align64(n * p.kBytes)
	pos = align64(v + n*p.vBytes)
	return v, pos, pos + PosBytes*n*p.B
}

// chunkBytes is the size of a chunk of n blocks.
func (p *Pool) chunkBytes(n int) int {
	_, _, end := p.chunkOffsets(n)
	return end
}

// fitBlocks is how many blocks a chunk of size bytes holds.
func (p *Pool) fitBlocks(size int) int {
	n := size / p.blockBytes
	for n > 0 && p.chunkBytes(n) > size {
		n--
	}
	return n
}

// setKeyShift checks a KeyShift and makes the per-table key codecs.
func (p *Pool) setKeyShift(shift [][]float32) error {
	if shift == nil {
		return nil
	}
	L := p.layout
	if len(shift) != L.Layers*L.KVHeads {
		return fmt.Errorf("kvcache: key shift has %d vectors, the layout needs %d (layers × KV heads)", len(shift), L.Layers*L.KVHeads)
	}
	for i, mu := range shift {
		if len(mu) != L.HeadDim {
			return fmt.Errorf("kvcache: key shift %d has %d values, head dim is %d", i, len(mu), L.HeadDim)
		}
		for _, v := range mu {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("kvcache: key shift %d is not finite", i)
			}
		}
	}
	if !p.kc.Shiftable() {
		return nil // the key codec does not use it
	}
	p.kcs = make([]codec.Codec, len(shift))
	for i, mu := range shift {
		p.kcs[i] = codec.Shifted(p.kc, mu)
	}
	return nil
}

// keyCodec is the key codec of table i (layer·KVHeads + head).
func (p *Pool) keyCodec(i int) codec.Codec {
	if p.kcs == nil {
		return p.kc
	}
	return p.kcs[i]
}

// KeyShifted reports whether the tables store keys shifted by a mean
// (PoolConfig.KeyShift with a per-token quantized key codec).
func (p *Pool) KeyShifted() bool { return p.kcs != nil }

// BlockTokens is the number of token slots in a block.
func (p *Pool) BlockTokens() int { return p.B }

// BlockBytes is the size of one block: keys, values and positions.
func (p *Pool) BlockBytes() int { return p.blockBytes }

// Codecs are the key and value storage codecs.
func (p *Pool) Codecs() (k, v codec.Codec) { return p.kc, p.vc }

// Layout is the per-token shape the pool stores.
func (p *Pool) Layout() Layout { return p.layout }

// Blocks is the most blocks the pool can hold (when it holds the whole
// arena).
func (p *Pool) Blocks() int { return p.limit }

// Usage is a snapshot of the pool's occupancy.
type Usage struct {
	Blocks     int   // held: in the arena chunks the pool holds now
	Capacity   int   // the most blocks the pool can hold
	Used       int   // referenced by at least one sequence
	Cached     int   // free, but still holding a findable prefix
	Free       int   // not referenced (Cached included)
	BytesTotal int64 // bytes of the arena chunks the pool holds
	BytesUsed  int64 // bytes of the used blocks
	PoolStats        // counters
}

// Usage reports the pool's occupancy.
func (p *Pool) Usage() Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := Usage{Blocks: p.held, Capacity: p.limit, Free: p.nfree, Cached: p.cached.n, PoolStats: p.stats}
	u.Used = u.Blocks - u.Free
	for _, c := range p.chunks {
		if c != nil {
			u.BytesTotal += int64(len(c.mem))
		}
	}
	u.BytesUsed = int64(u.Used) * int64(p.blockBytes)
	return u
}

func (p *Pool) chunkOf(b int32) *pchunk { return p.chunks[int(b)/p.bpc] }

func (p *Pool) listOf(id uint8) *blist {
	if id == listCached {
		return &p.cached
	}
	return &p.free
}

// push appends b to the tail of list id.
func (p *Pool) push(id uint8, b int32) {
	l := p.listOf(id)
	m := &p.meta[b]
	m.prev, m.next, m.list = l.tail, -1, id
	if l.tail >= 0 {
		p.meta[l.tail].next = b
	} else {
		l.head = b
	}
	l.tail = b
	l.n++
	p.nfree++
	if id == listCached {
		p.chunkOf(b).cached++
	}
}

// unlink takes b out of the list it is in.
func (p *Pool) unlink(b int32) {
	m := &p.meta[b]
	if m.list == listNone {
		return
	}
	l := p.listOf(m.list)
	if m.prev >= 0 {
		p.meta[m.prev].next = m.next
	} else {
		l.head = m.next
	}
	if m.next >= 0 {
		p.meta[m.next].prev = m.prev
	} else {
		l.tail = m.prev
	}
	if m.list == listCached {
		p.chunkOf(b).cached--
	}
	m.prev, m.next, m.list = -1, -1, listNone
	l.n--
	p.nfree--
}

// uncache moves b, whose prefix entry was dropped, from the cached list
// to the free list if it waits there. The caller holds p.mu.
func (p *Pool) uncache(b int32) {
	if p.meta[b].list == listCached {
		p.unlink(b)
		p.push(listFree, b)
	}
}

// busy notes that b got its first reference (+1) or lost its last (−1).
func (p *Pool) busy(b int32, d int) {
	c := p.chunkOf(b)
	c.busy += d
	switch {
	case d > 0 && c.busy == 1:
		p.idle.Add(-1)
	case d < 0 && c.busy == 0:
		p.idle.Add(1)
	}
}

// grow takes a chunk from the arena (allowCached: also one of another
// pool's that holds cached prefixes) and adds its blocks to the free
// list. The caller holds p.mu.
func (p *Pool) grow(allowCached bool) bool {
	if p.closed || p.held >= p.limit {
		return false
	}
	mem := p.arena.take(p, allowCached)
	if mem == nil {
		return false
	}
	n := min(p.bpc, p.limit-p.held)
	slot := slices.Index(p.chunks, nil)
	if slot < 0 {
		slot = len(p.chunks)
		p.chunks = append(p.chunks, nil)
		p.meta = append(p.meta, make([]pblock, p.bpc)...)
	}
	vo, po, _ := p.chunkOffsets(n)
	c := &pchunk{mem: mem, k: mem[:n*p.kBytes], v: mem[vo : vo+n*p.vBytes],
		pos: unsafe.Slice((*int32)(unsafe.Pointer(&mem[po])), n*p.B)}
	p.chunks[slot] = c
	p.held += n
	p.idle.Add(1)
	for i := range n {
		b := int32(slot*p.bpc + i)
		p.meta[b] = pblock{prev: -1, next: -1}
		p.push(listFree, b)
	}
	return true
}

// releaseIdleChunk gives back to the arena a chunk none of whose blocks
// is referenced (allowCached: also one holding cached prefixes, which are
// dropped), and returns its memory; nil if there is none. The caller
// holds p.mu.
func (p *Pool) releaseIdleChunk(allowCached bool) []byte {
	slot := -1
	for i, c := range p.chunks {
		if c != nil && c.busy == 0 && c.cached == 0 {
			slot = i
			break
		}
	}
	if slot < 0 && allowCached {
		// The chunk of the least recently used cached block that has no
		// referenced block (sequences free their newest blocks first, so
		// the tails of prefixes go before their heads).
		for b := p.cached.head; b >= 0; b = p.meta[b].next {
			if p.chunkOf(b).busy == 0 {
				slot = int(b) / p.bpc
				break
			}
		}
	}
	if slot >= 0 {
		c := p.chunks[slot]
		n := len(c.pos) / p.B
		for i := range n {
			if e := p.meta[slot*p.bpc+i].entry; e != nil {
				p.dropEntry(e)
				p.stats.PrefixEvictions++
			}
		}
		for i := range n {
			b := int32(slot*p.bpc + i)
			p.unlink(b)
			p.meta[b] = pblock{prev: -1, next: -1}
		}
		p.chunks[slot] = nil
		p.held -= n
		p.idle.Add(-1)
		return c.mem
	}
	return nil
}

// obtainable is how many blocks alloc can give now: the free ones and
// those of the chunks the arena could hand over. The caller holds p.mu.
func (p *Pool) obtainable() int {
	return p.nfree + min(p.limit-p.held, p.arena.spare(p)*p.bpc)
}

// Obtainable is how many blocks the pool can allocate now: its free ones
// and those of the arena chunks it could take (new ones, or ones other
// pools use only for free blocks or cached prefixes).
func (p *Pool) Obtainable() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.obtainable()
}

// Close gives the pool's memory back to its arena. Every sequence of the
// pool must be freed first; the pool cannot be used afterwards.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	var mems [][]byte
	for _, c := range p.chunks {
		if c != nil && c.busy > 0 {
			return fmt.Errorf("kvcache: closing a pool that still has %d blocks in use", p.held-p.nfree)
		}
		if c != nil {
			mems = append(mems, c.mem)
		}
	}
	p.closed = true
	p.arena.give(p, mems)
	p.chunks, p.meta, p.held, p.nfree = nil, nil, 0, 0
	p.free, p.cached = blist{-1, -1, 0}, blist{-1, -1, 0}
	p.observeCleared()
	p.index = map[uint64]*prefixEntry{}
	p.idle.Store(0)
	return nil
}

// alloc takes a block: a free one; else one of a new chunk (or a chunk
// another pool of the arena does not use); else the least recently used
// cached one, dropping its prefix; else one of a chunk another pool only
// keeps cached prefixes in. The caller holds p.mu.
func (p *Pool) alloc() (int32, error) {
	if p.free.n == 0 {
		p.grow(false)
	}
	if p.free.n == 0 && p.cached.n == 0 {
		p.grow(true)
	}
	var b int32
	switch {
	case p.free.n > 0:
		b = p.free.head
	case p.cached.n > 0:
		b = p.cached.head
	case p.closed:
		return -1, errors.New("kvcache: the pool is closed")
	default:
		return -1, ErrNoBlocks
	}
	p.unlink(b)
	m := &p.meta[b]
	if m.entry != nil {
		p.dropEntry(m.entry)
		p.stats.PrefixEvictions++
	}
	m.ref, m.n = 1, 0
	p.busy(b, 1)
	return b, nil
}

// incref takes one more reference; a free block leaves its list.
func (p *Pool) incref(b int32) {
	m := &p.meta[b]
	if m.ref == 0 {
		p.unlink(b)
		p.busy(b, 1)
	}
	m.ref++
}

// decref drops a reference; at zero the block joins the tail of the free
// list, or of the cached list if it holds a prefix entry: it keeps its
// data (and entry) until it is reused.
func (p *Pool) decref(b int32) {
	m := &p.meta[b]
	if m.ref <= 0 {
		panic(fmt.Sprintf("kvcache: block %d released with reference count %d", b, m.ref))
	}
	m.ref--
	if m.ref == 0 {
		p.busy(b, -1)
		if m.entry != nil {
			p.push(listCached, b)
		} else {
			p.push(listFree, b)
		}
	}
}

// Block data views.

func (p *Pool) kbuf(b int32) []byte {
	c, i := p.chunks[int(b)/p.bpc], int(b)%p.bpc
	return c.k[i*p.kBytes : (i+1)*p.kBytes : (i+1)*p.kBytes]
}
func (p *Pool) vbuf(b int32) []byte {
	c, i := p.chunks[int(b)/p.bpc], int(b)%p.bpc
	return c.v[i*p.vBytes : (i+1)*p.vBytes : (i+1)*p.vBytes]
}
func (p *Pool) posbuf(b int32) []int32 {
	c, i := p.chunks[int(b)/p.bpc], int(b)%p.bpc
	return c.pos[i*p.B : (i+1)*p.B : (i+1)*p.B]
}

// copyBlock copies the first n slots of block src into block dst.
func (p *Pool) copyBlock(dst, src int32, n int) {
	copy(p.kbuf(dst), p.kbuf(src))
	copy(p.vbuf(dst), p.vbuf(src))
	copy(p.posbuf(dst)[:n], p.posbuf(src)[:n])
	p.meta[dst].n = int32(n)
}
