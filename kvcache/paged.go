package kvcache

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// table is one (layer, KV head)'s tokens: full blocks (or, ragged, blocks
// each partly filled), then a partly filled last block, then (KIVI only) a
// full-precision residual.
type table struct {
	blocks []int32   // physical blocks, in token order
	n      int       // tokens held in blocks; block j holds min(B, n-j·B), or cnt[j]
	cnt    []int32   // [len(blocks)] tokens in each block when a prune left the table ragged (ragged.go); nil: every block but the last is full
	res    *residual // KIVI: the newest tokens in f16, not yet sealed (residual.go); nil without KIVI
	// resWindow is the layer's window W when the table is never sealed
	// (Footprint.Unsealed: KIVI with W ≤ Residual), 0 otherwise: its
	// tokens stay in res, which the window slides token by token.
	resWindow int
	segs      []Segment   // read view, rebuilt when dirty
	dirty     bool        // blocks or n changed since segs was built
	mini      *merged     // MiniCache: merged and retained tokens before the blocks (minicache.go); nil if unmerged
	kc        codec.Codec // key codec of this (layer, head): the pool's, shifted by its key mean if set (PoolConfig.KeyShift)
	// A window-bounded layer's tables (window.go): drop is the tokens
	// freed from the head so far (the table's slot i is the sequence's
	// token drop+i), freedTo one past the highest position freed (0: none).
	drop    int
	freedTo int32
}

// Paged is one sequence's cache over a shared Pool: for each (layer, KV
// head) a table of blocks. It implements Sequence.
type Paged struct {
	pool   *Pool
	tables []table // [layer·kvHeads + head]
	last   int     // layer appended to last

	pristine   bool     // tables hold tokens 0..n-1 in order (prefix caching allowed)
	hashes     []uint64 // prefix hash of each full block registered or matched
	registered int      // leading blocks known to the prefix cache
	freed      bool
	hold       bool // KIVI: keep new tokens in the residual (see HoldSeal)
}

// NewSequence starts an empty sequence.
func (p *Pool) NewSequence() *Paged {
	s := &Paged{pool: p, tables: make([]table, p.layout.Layers*p.layout.KVHeads), pristine: true}
	for i := range s.tables {
		s.tables[i].dirty = true
		s.tables[i].kc = p.keyCodec(i)
		s.tables[i].resWindow = p.resWindow(i / p.layout.KVHeads)
	}
	return s
}

// Pool is the pool the sequence draws from.
func (s *Paged) Pool() *Pool { return s.pool }

func (s *Paged) Layout() Layout { return s.pool.layout }

// Codecs are the pool's key and value codecs.
func (s *Paged) Codecs() (k, v codec.Codec) { return s.pool.Codecs() }

func (s *Paged) tab(layer, head int) *table { return &s.tables[layer*s.pool.layout.KVHeads+head] }

// tokens a table holds, residual and merged tokens included.
func (t *table) len() int {
	return t.mini.len() + t.n + t.res.len()
}

// Len is the number of tokens of the layer appended to last, counted from
// the sequence's start (those a window freed included).
func (s *Paged) Len() int {
	t := &s.tables[s.last*s.pool.layout.KVHeads]
	return t.drop + t.len()
}

// minLen is the fewest tokens any table counts from the sequence's start
// (those a window freed included).
func (s *Paged) minLen() int {
	m := -1
	for i := range s.tables {
		if l := s.tables[i].drop + s.tables[i].len(); m < 0 || l < m {
			m = l
		}
	}
	return m
}

// Reserve reports ErrNoBlocks when the pool cannot take n more tokens in
// every table now: when their Need is more than the pool can allocate.
func (s *Paged) Reserve(n int) error {
	if s.freed {
		return errors.New("kvcache: sequence already freed")
	}
	if need, have := s.Need(n), s.pool.ObtainableBytes(); need > have {
		return fmt.Errorf("%w: %d tokens need %d bytes, %d can be allocated", ErrNoBlocks, n, need, have)
	}
	return nil
}

// Append stores new tokens of one layer.
func (s *Paged) Append(layer int, pos []int32, k, v []float32) error {
	p := s.pool
	L := p.layout
	if s.freed {
		return errors.New("kvcache: append to a freed sequence")
	}
	if layer < 0 || layer >= L.Layers {
		return fmt.Errorf("kvcache: layer %d out of range [0,%d)", layer, L.Layers)
	}
	n, d := len(pos), L.HeadDim
	width := L.KVHeads * d
	if len(k) != n*width || len(v) != n*width {
		return fmt.Errorf("kvcache: append of %d tokens needs %d keys and values, got %d and %d", n, n*width, len(k), len(v))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if w := L.window(layer); w > 0 && n > 0 {
		// Free what the window hides from these tokens' queries first.
		for h := 0; h < L.KVHeads; h++ {
			if err := checkWindow(s.tab(layer, h), pos[0], w); err != nil {
				return fmt.Errorf("kvcache: layer %d head %d: %w", layer, h, err)
			}
		}
		for h := 0; h < L.KVHeads; h++ {
			p.slide(s.tab(layer, h), pos[0]-int32(w))
		}
	}
	for h := 0; h < L.KVHeads; h++ {
		t := s.tab(layer, h)
		t.dirty = true
		if t.resWindow > 0 {
			t.res = t.res.fit(d, t.res.len()+n, t.resWindow)
		}
		for i := 0; i < n; i++ {
			kx := k[i*width+h*d : i*width+(h+1)*d]
			vx := v[i*width+h*d : i*width+(h+1)*d]
			var err error
			if p.residual > 0 {
				err = s.appendResidual(t, pos[i], kx, vx)
			} else {
				err = s.appendBlock(t, pos[i], kx, vx)
			}
			if err != nil {
				return fmt.Errorf("kvcache: layer %d head %d: %w", layer, h, err)
			}
		}
		if t.resWindow > 0 {
			t.res.shrink(d, p.fp.ResidualBuffer(t.resWindow, t.res.n))
		}
	}
	s.last = layer
	return nil
}

// writable returns the block and slot the table's next token goes to,
// allocating a block or copying a shared one first. The caller holds p.mu.
func (s *Paged) writable(t *table) (int32, int, error) {
	p := s.pool
	slot := t.tail(p.B)
	if slot == 0 {
		b, err := p.alloc()
		if err != nil {
			return -1, 0, err
		}
		t.blocks = append(t.blocks, b)
		if t.cnt != nil {
			t.cnt = append(t.cnt, 0)
		}
		return b, 0, nil
	}
	last := t.blocks[len(t.blocks)-1]
	if p.meta[last].ref > 1 {
		b, err := p.alloc()
		if err != nil {
			return -1, 0, err
		}
		p.copyBlock(b, last, slot)
		p.decref(last)
		t.blocks[len(t.blocks)-1] = b
		p.stats.CopyOnWrite++
		last = b
	}
	return last, slot, nil
}

func (s *Paged) appendBlock(t *table, pos int32, k, v []float32) error {
	p := s.pool
	b, slot, err := s.writable(t)
	if err != nil {
		return err
	}
	d := p.layout.HeadDim
	t.kc.Put(p.kbuf(b), p.B, d, slot, k)
	p.vc.Put(p.vbuf(b), p.B, d, slot, v)
	p.posbuf(b)[slot] = pos
	t.n++
	if t.cnt != nil {
		t.cnt[len(t.cnt)-1]++
	}
	return nil
}

// Segment is a run of token slots of one (layer, KV head) stored with one
// codec pair: a block, or a table's full-precision residual. Attention reads
// slots 0..N-1 through the codecs.
type Segment struct {
	K, V   []byte      // encoded keys and values, laid out for Cap slots
	KC, VC codec.Codec // their codecs
	Cap    int         // slots the encoding is laid out for
	N      int         // filled slots
	Pos    []int32     // [N] position of each slot
	// KMag and VMag, when not nil, are per-slot magnitudes [N]: the
	// stored key (value) of slot i is a unit direction and the token's key
	// (value) is KMag[i] (VMag[i]) times it. MiniCache's merged layers
	// share directions between two layers and keep each layer's norms.
	KMag, VMag []float32
}

// Segments returns (layer, head)'s stored tokens in order. The slice stays
// valid until the sequence next changes.
func (s *Paged) Segments(layer, head int) []Segment {
	t := s.tab(layer, head)
	if !t.dirty {
		return t.segs
	}
	p := s.pool
	t.segs = t.mini.segments(p, t.kc, t.segs[:0])
	for j, b := range t.blocks {
		n := t.held(j, p.B)
		t.segs = append(t.segs, Segment{K: p.kbuf(b), V: p.vbuf(b), KC: t.kc, VC: p.vc, Cap: p.B, N: n, Pos: p.posbuf(b)[:n]})
	}
	t.segs = t.res.segments(t.segs)
	t.dirty = false
	return t.segs
}

// Truncate keeps the first n tokens of every table. With a KIVI residual the
// cut must fall inside the residual (sealed groups are not split). A
// window-bounded layer cannot go back past what its window freed: the cut
// must leave every position the next token (at n) sees.
func (s *Paged) Truncate(n int) error {
	if n < 0 {
		return fmt.Errorf("kvcache: truncate to %d tokens", n)
	}
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range s.tables {
		t := &s.tables[i]
		if n < t.drop+t.len() && n < t.mini.len() {
			return fmt.Errorf("kvcache: cannot truncate to %d tokens: the first %d of layer %d are merged (MiniCache)", n, t.mini.len(), i/p.layout.KVHeads)
		}
		if n < t.drop {
			return fmt.Errorf("kvcache: cannot truncate to %d tokens: layer %d's window freed its first %d", n, i/p.layout.KVHeads, t.drop)
		}
		if w := p.layout.window(i / p.layout.KVHeads); w > 0 && s.pristine && n < t.drop+t.len() {
			if err := checkWindow(t, int32(n), w); err != nil {
				return fmt.Errorf("kvcache: cannot truncate to %d tokens: layer %d: %w", n, i/p.layout.KVHeads, err)
			}
		}
	}
	for i := range s.tables {
		t := &s.tables[i]
		if n >= t.drop+t.len() {
			continue
		}
		t.dirty = true
		n := n - t.drop - t.mini.len() // tokens of the blocks and residual to keep
		if t.res != nil {
			if n < t.n {
				return fmt.Errorf("kvcache: cannot truncate to %d tokens: %d are sealed in KIVI groups", n, t.n)
			}
			t.res.n = n - t.n
			continue
		}
		keep := (n + p.B - 1) / p.B
		if t.cnt != nil { // ragged: the blocks holding the first n
			keep = 0
			for acc := 0; acc < n; keep++ {
				acc += int(t.cnt[keep])
				if acc > n {
					t.cnt[keep] -= int32(acc - n)
				}
			}
			t.cnt = t.cnt[:keep]
		}
		for j := len(t.blocks) - 1; j >= keep; j-- {
			p.decref(t.blocks[j])
		}
		t.blocks = t.blocks[:keep]
		t.n = n
		t.settle(p.B)
	}
	if full := n / p.B; s.registered > full {
		s.registered = full
		s.hashes = s.hashes[:full]
	}
	return nil
}

// Fork returns a new sequence sharing every block of s (reference counted;
// the first write to a shared partly filled block copies it).
func (s *Paged) Fork() *Paged {
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	f := &Paged{pool: p, tables: make([]table, len(s.tables)), last: s.last, pristine: s.pristine,
		hashes: append([]uint64(nil), s.hashes...), registered: s.registered}
	for i := range s.tables {
		t := &s.tables[i]
		ft := &f.tables[i]
		ft.blocks = append([]int32(nil), t.blocks...)
		ft.n, ft.cnt = t.n, slices.Clone(t.cnt)
		ft.dirty = true
		ft.kc = t.kc
		ft.drop, ft.freedTo, ft.resWindow = t.drop, t.freedTo, t.resWindow
		for _, b := range t.blocks {
			p.incref(b)
		}
		ft.mini = t.mini.fork(p)
		ft.res = t.res.clone()
	}
	return f
}

// Free releases every block. The newest blocks are released first so the
// LRU free list reuses them before the (more shareable) prefix blocks.
func (s *Paged) Free() {
	if s.freed {
		return
	}
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range s.tables {
		t := &s.tables[i]
		for j := len(t.blocks) - 1; j >= 0; j-- {
			p.decref(t.blocks[j])
		}
		t.mini.free(p)
		t.blocks, t.n, t.cnt, t.res, t.segs, t.mini = nil, 0, nil, nil, nil, nil
	}
	s.freed = true
}

// Memory is a sequence's KV footprint.
type Memory struct {
	Blocks   int   // blocks referenced (a block shared with others counts here too)
	Reserved int64 // bytes of those blocks plus the residual buffers
	Used     int64 // bytes holding tokens (each slot's share of its block)
	Wasted   int64 // Reserved − Used: empty slots of partly filled blocks
	Residual int64 // bytes of the KIVI full-precision residual buffers
	// Magnitudes is the bytes of MiniCache's per-slot norms of merged
	// tokens (two float32 per merged slot per layer). A block of directions
	// shared by the two layers of a merged pair counts once in Blocks.
	Magnitudes int64
}

// Memory reports the sequence's footprint.
func (s *Paged) Memory() Memory {
	p := s.pool
	var m Memory
	for i := range s.tables {
		t := &s.tables[i]
		m.Blocks += len(t.blocks)
		m.Used += int64(t.n) * int64(p.blockBytes) / int64(p.B)
		t.res.memory(p.layout.HeadDim, &m)
		t.mini.memory(p, &m)
	}
	m.Reserved = int64(m.Blocks)*int64(p.blockBytes) + m.Residual + m.Magnitudes
	m.Wasted = m.Reserved - m.Used
	return m
}

// Bytes is the memory the sequence holds (Memory().Reserved).
func (s *Paged) Bytes() int64 { return s.Memory().Reserved }
