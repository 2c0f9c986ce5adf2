package kvcache

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// DefaultBlockTokens is the number of token slots in a block (vLLM's 16).
const DefaultBlockTokens = 16

// ErrNoBlocks is returned when the pool has no free block left.
var ErrNoBlocks = errors.New("kvcache: no free KV blocks")

// PoolConfig sizes a block pool. Exactly one of MemBytes and Tokens sets
// its capacity.
type PoolConfig struct {
	Layout      Layout
	BlockTokens int         // token slots per block (DefaultBlockTokens is vLLM's 16)
	K, V        codec.Codec // storage codecs of keys and values; nil means f32
	MemBytes    int64       // arena size in bytes (blocks of every (layer, head) together)
	Tokens      int         // or: room for this many tokens in every (layer, head)
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
	if g, ok := k.(codec.Grouped); ok {
		f.KeyGroup = g.GroupTokens()
		if f.KeyGroup%B != 0 {
			return Footprint{}, fmt.Errorf("kvcache: %s key groups of %d tokens must be a multiple of the block size %d", k.Name(), f.KeyGroup, B)
		}
	}
	if !v.PerToken() {
		return Footprint{}, fmt.Errorf("kvcache: codec %s cannot store values", v.Name())
	}
	if f.KeyGroup > 0 || isKIVI(v) {
		f.Residual = cfg.Residual
		if f.Residual == 0 {
			f.Residual = codec.DefaultResidual
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
	sealed := 0
	if n > f.Residual {
		sealed = (n - f.Residual) / f.SealTokens * f.SealTokens
	}
	return sealed / f.BlockTokens, n - sealed, f.Residual + f.SealTokens
}

// AdmitBlocks is the blocks a table must be able to draw for n tokens to
// be admitted however they arrive: Paged.Reserve counts every incoming
// token as needing block room, KIVI's residual ones too, so ⌈n /
// BlockTokens⌉ (for KIVI more than Table's blocks, the residual buffers
// being outside the arena). A pool of MemBytes = AdmitBlocks(n) · tables ·
// BlockBytes holds a sequence of n tokens.
func (f Footprint) AdmitBlocks(n int) int {
	if n <= 0 {
		return 0
	}
	return (n + f.BlockTokens - 1) / f.BlockTokens
}

// TableBytes is the bytes of Table(n): Paged.Memory().Reserved of a
// sequence of n tokens appended in order is TableBytes(n) times its tables.
func (f Footprint) TableBytes(n int) int64 {
	blocks, _, slots := f.Table(n)
	return int64(blocks)*int64(f.BlockBytes) + int64(slots)*int64(f.ResidualSlotBytes)
}

// pblock is the bookkeeping of one physical block; its data lives in the
// pool's arenas at the same index.
type pblock struct {
	ref        int32        // sequences (tables) holding the block
	n          int32        // filled slots
	prev, next int32        // links of the free LRU list (−1: none)
	onFree     bool         // in the free list
	entry      *prefixEntry // the prefix-cache entry the block belongs to, if any
}

// Pool is the arena of KV blocks all sequences draw from. A block holds
// BlockTokens tokens of one (layer, KV head): keys in the K codec, values in
// the V codec, and the position of each slot. Blocks are reference counted;
// unreferenced blocks wait in an LRU free list, and those that hold a cached
// prefix stay findable until they are reused.
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

	kdata []byte   // [blocks][kBytes]
	vdata []byte   // [blocks][vBytes]
	pos   []int32  // [blocks][B]
	meta  []pblock // [blocks]

	freeHead, freeTail int32 // LRU free list: allocate from the head
	nfree              int

	index map[uint64]*prefixEntry // prefix cache: block hash → blocks

	stats PoolStats
}

// PoolStats are running counters.
type PoolStats struct {
	PrefixQueries   int64 // blocks looked up in the prefix cache
	PrefixHits      int64 // blocks found
	PrefixEvictions int64 // cached blocks reused for new data
	CopyOnWrite     int64 // shared blocks copied before a write
}

// NewPool allocates the arena.
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
	p := &Pool{layout: cfg.Layout, B: B, kc: cfg.K, vc: cfg.V, index: map[uint64]*prefixEntry{}}
	if err := p.setKeyShift(cfg.KeyShift); err != nil {
		return nil, err
	}
	f, err := FootprintOf(cfg)
	if err != nil {
		return nil, err
	}
	p.kBytes, p.vBytes, p.blockBytes = f.KBytes, f.VBytes, f.BlockBytes
	p.group, p.residual = f.KeyGroup, f.Residual
	heads := cfg.Layout.Layers * cfg.Layout.KVHeads
	var blocks int64
	switch {
	case cfg.MemBytes > 0 && cfg.Tokens > 0:
		return nil, errors.New("kvcache: give the pool size as bytes or as tokens, not both")
	case cfg.MemBytes > 0:
		blocks = cfg.MemBytes / int64(p.blockBytes)
	case cfg.Tokens > 0:
		blocks = int64((cfg.Tokens+B-1)/B) * int64(heads)
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
	n := int(blocks)
	p.kdata = make([]byte, n*p.kBytes)
	p.vdata = make([]byte, n*p.vBytes)
	p.pos = make([]int32, n*B)
	p.meta = make([]pblock, n)
	p.freeHead, p.freeTail = -1, -1
	for i := range p.meta {
		p.meta[i].prev, p.meta[i].next = -1, -1
		p.pushFree(int32(i))
	}
	return p, nil
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
	if codec.Shifted(p.kc, shift[0]) == p.kc {
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

func isKIVI(c codec.Codec) bool { return len(c.Name()) > 4 && c.Name()[:4] == "kivi" }

// BlockTokens is the number of token slots in a block.
func (p *Pool) BlockTokens() int { return p.B }

// BlockBytes is the size of one block: keys, values and positions.
func (p *Pool) BlockBytes() int { return p.blockBytes }

// Codecs are the key and value storage codecs.
func (p *Pool) Codecs() (k, v codec.Codec) { return p.kc, p.vc }

// Layout is the per-token shape the pool stores.
func (p *Pool) Layout() Layout { return p.layout }

// Blocks is the total number of blocks in the arena.
func (p *Pool) Blocks() int { return len(p.meta) }

// Usage is a snapshot of the pool's occupancy.
type Usage struct {
	Blocks     int   // in the arena
	Used       int   // referenced by at least one sequence
	Cached     int   // free, but still holding a findable prefix
	Free       int   // not referenced (Cached included)
	BytesTotal int64 // arena bytes
	BytesUsed  int64 // bytes of the used blocks
	PoolStats        // counters
}

// Usage reports the pool's occupancy.
func (p *Pool) Usage() Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := Usage{Blocks: len(p.meta), Free: p.nfree, PoolStats: p.stats}
	u.Used = u.Blocks - u.Free
	for _, e := range p.index {
		for _, b := range e.blocks {
			if p.meta[b].ref == 0 {
				u.Cached++
			}
		}
	}
	u.BytesTotal = int64(u.Blocks) * int64(p.blockBytes)
	u.BytesUsed = int64(u.Used) * int64(p.blockBytes)
	return u
}

// The free list is intrusive and doubly linked: O(1) push, pop and removal.

func (p *Pool) pushFree(b int32) {
	m := &p.meta[b]
	m.prev, m.next, m.onFree = p.freeTail, -1, true
	if p.freeTail >= 0 {
		p.meta[p.freeTail].next = b
	} else {
		p.freeHead = b
	}
	p.freeTail = b
	p.nfree++
}

func (p *Pool) unlinkFree(b int32) {
	m := &p.meta[b]
	if m.prev >= 0 {
		p.meta[m.prev].next = m.next
	} else {
		p.freeHead = m.next
	}
	if m.next >= 0 {
		p.meta[m.next].prev = m.prev
	} else {
		p.freeTail = m.prev
	}
	m.prev, m.next, m.onFree = -1, -1, false
	p.nfree--
}

// alloc takes the least recently freed block, dropping the cached prefix it
// held, if any. The caller holds p.mu.
func (p *Pool) alloc() (int32, error) {
	b := p.freeHead
	if b < 0 {
		return -1, ErrNoBlocks
	}
	p.unlinkFree(b)
	m := &p.meta[b]
	if m.entry != nil {
		p.dropEntry(m.entry)
		p.stats.PrefixEvictions++
	}
	m.ref, m.n = 1, 0
	return b, nil
}

// incref takes one more reference; a free block leaves the free list.
func (p *Pool) incref(b int32) {
	m := &p.meta[b]
	if m.ref == 0 && m.onFree {
		p.unlinkFree(b)
	}
	m.ref++
}

// decref drops a reference; at zero the block joins the free list's tail,
// keeping its data (and its prefix entry) until it is reused.
func (p *Pool) decref(b int32) {
	m := &p.meta[b]
	if m.ref <= 0 {
		panic(fmt.Sprintf("kvcache: block %d released with reference count %d", b, m.ref))
	}
	m.ref--
	if m.ref == 0 {
		p.pushFree(b)
	}
}

// Block data views.

func (p *Pool) kbuf(b int32) []byte {
	return p.kdata[int(b)*p.kBytes : (int(b)+1)*p.kBytes : (int(b)+1)*p.kBytes]
}
func (p *Pool) vbuf(b int32) []byte {
	return p.vdata[int(b)*p.vBytes : (int(b)+1)*p.vBytes : (int(b)+1)*p.vBytes]
}
func (p *Pool) posbuf(b int32) []int32 { return p.pos[int(b)*p.B : (int(b)+1)*p.B : (int(b)+1)*p.B] }

// copyBlock copies the first n slots of block src into block dst.
func (p *Pool) copyBlock(dst, src int32, n int) {
	copy(p.kbuf(dst), p.kbuf(src))
	copy(p.vbuf(dst), p.vbuf(src))
	copy(p.posbuf(dst)[:n], p.posbuf(src)[:n])
	p.meta[dst].n = int32(n)
}
