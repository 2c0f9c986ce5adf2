package kvcache

import (
	"errors"
	"fmt"
	"slices"
)

// Images: a sequence's tables as they are stored, for slot files (engine's
// SaveSlot / RestoreSlot). An Image holds every (layer, KV head) table as
// it is — ragged per head after a policy pruned it, each slot with the
// position it was stored with — and the bytes of its blocks in the pool's
// codecs, not decoded: importing an image into a pool of the same layout,
// codecs, block size and key means gives a sequence whose every stored bit
// is the exported one's (decoding q8, q4 or KIVI and encoding again would
// not). With KIVI the image holds each table's full-precision residual,
// with MiniCache the merged part (the unit directions a layer pair shares,
// stored once, each layer's norms and retained tokens).

// Image is a sequence's tables.
type Image struct {
	Pristine bool         // the tables hold tokens 0..n-1 in order (the prefix cache may index them)
	Hold     bool         // KIVI: new tokens stay in the residual (HoldSeal)
	Last     int          // the layer appended to last
	Tables   []TableImage // [layer·kvHeads + head]
}

// TableImage is one (layer, KV head) table.
type TableImage struct {
	Drop    int   // a window-bounded layer: tokens freed from the head (slot i is token Drop+i)
	FreedTo int32 // a window-bounded layer: one past the highest position freed (0: none)

	N      int            // tokens in the ordinary blocks
	Blocks []BlockImage   // [⌈N/BlockTokens⌉] the ordinary blocks, in token order
	Res    *ResidualImage // KIVI: the newest tokens, not yet sealed; nil without one
	Mini   *MiniImage     // MiniCache: the merged part before the blocks; nil if unmerged
}

// BlockImage is one block's data as the pool lays it out.
type BlockImage struct {
	K   []byte  // [pool's key bytes per block] encoded keys of every slot
	V   []byte  // [pool's value bytes per block] encoded values of every slot
	Pos []int32 // [filled slots] the position stored with each slot
}

// ResidualImage is a KIVI residual.
type ResidualImage struct {
	K, V []uint16 // [cap][headDim] f16 bits
	Pos  []int32  // [cap]
	N    int      // tokens held
}

// MiniImage is the merged part of a MiniCache table.
type MiniImage struct {
	Pair       int          // the other layer of the merged pair
	Counted    bool         // this table (the pair's lower layer) holds the shared direction blocks
	Dir        []BlockImage // the shared direction blocks; empty when !Counted (the pair's table has them)
	DirCnt     []int32      // [direction blocks] tokens in each
	KMag, VMag []float32    // [merged tokens] this layer's key and value norms
	Ret        []BlockImage // this layer's retained tokens, whole
	RetCnt     []int32      // [retained blocks] tokens in each
}

// Image copies the sequence's tables.
func (s *Paged) Image() (*Image, error) {
	p := s.pool
	if s.freed {
		return nil, errors.New("kvcache: sequence already freed")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	H := p.layout.KVHeads
	img := &Image{Pristine: s.pristine, Hold: s.hold, Last: s.last, Tables: make([]TableImage, len(s.tables))}
	for i := range s.tables {
		t := &s.tables[i]
		ti := &img.Tables[i]
		if err := s.regular(t); err != nil { // an image's blocks are full but the last
			return nil, err
		}
		ti.N, ti.Drop, ti.FreedTo = t.n, t.drop, t.freedTo
		for j, b := range t.blocks {
			ti.Blocks = append(ti.Blocks, p.blockImage(b, t.held(j, p.B)))
		}
		if r := t.res; r != nil {
			ti.Res = &ResidualImage{K: slices.Clone(r.k), V: slices.Clone(r.v), Pos: slices.Clone(r.pos), N: r.n}
		}
		if m := t.mini; m != nil {
			mi := &MiniImage{Pair: m.pair, Counted: m.counted, DirCnt: slices.Clone(m.dir.cnt),
				KMag: slices.Clone(m.kmag), VMag: slices.Clone(m.vmag), RetCnt: slices.Clone(m.ret.cnt)}
			if m.counted {
				for j, b := range m.dir.blocks {
					mi.Dir = append(mi.Dir, p.blockImage(b, int(m.dir.cnt[j])))
				}
			} else if o := s.tables[m.pair*H+i%H].mini; o == nil || !o.counted || !slices.Equal(o.dir.blocks, m.dir.blocks) {
				return nil, fmt.Errorf("kvcache: table %d shares its merged directions with layer %d, which does not hold them", i, m.pair)
			}
			for j, b := range m.ret.blocks {
				mi.Ret = append(mi.Ret, p.blockImage(b, int(m.ret.cnt[j])))
			}
			ti.Mini = mi
		}
	}
	return img, nil
}

// blockImage copies block b's data, n slots filled. The caller holds p.mu.
func (p *Pool) blockImage(b int32, n int) BlockImage {
	return BlockImage{K: slices.Clone(p.kbuf(b)), V: slices.Clone(p.vbuf(b)), Pos: slices.Clone(p.posbuf(b)[:n])}
}

// ImportImage makes a sequence of img in this pool. The pool must be of
// the layout, codecs, block size and key means the image was taken from
// (the caller checks what the image does not hold: codecs and key
// means); every size in the image is checked against the pool, so a
// malformed image is an error, never a panic. ErrNoBlocks: not enough
// free blocks now.
func (p *Pool) ImportImage(img *Image) (*Paged, error) {
	L := p.layout
	if len(img.Tables) != L.Layers*L.KVHeads {
		return nil, fmt.Errorf("kvcache: the image holds %d tables, the pool's layout %d", len(img.Tables), L.Layers*L.KVHeads)
	}
	if img.Last < 0 || img.Last >= L.Layers {
		return nil, fmt.Errorf("kvcache: the image's last layer %d is out of range", img.Last)
	}
	if err := p.checkImage(img); err != nil {
		return nil, err
	}
	s := p.NewSequence()
	p.mu.Lock()
	err := s.importTables(img)
	p.mu.Unlock()
	if err != nil {
		s.Free()
		return nil, err
	}
	return s, nil
}

// checkImage checks every size and count of img against the pool.
func (p *Pool) checkImage(img *Image) error {
	L, d := p.layout, p.layout.HeadDim
	block := func(what string, i int, b BlockImage, n int) error {
		if n < 1 || n > p.B || len(b.K) != p.kBytes || len(b.V) != p.vBytes || len(b.Pos) != n {
			return fmt.Errorf("kvcache: image table %d: a %s block does not fit this pool (%d slots of %d, %d key bytes of %d, %d value bytes of %d, %d positions)",
				i, what, n, p.B, len(b.K), p.kBytes, len(b.V), p.vBytes, len(b.Pos))
		}
		for _, x := range b.Pos {
			if x < 0 {
				return fmt.Errorf("kvcache: image table %d: negative position %d", i, x)
			}
		}
		return nil
	}
	region := func(what string, i int, bs []BlockImage, cnt []int32) (int, error) {
		if len(bs) != len(cnt) {
			return 0, fmt.Errorf("kvcache: image table %d: %d %s blocks with %d counts", i, len(bs), what, len(cnt))
		}
		n := 0
		for j, b := range bs {
			if err := block(what, i, b, int(cnt[j])); err != nil {
				return 0, err
			}
			n += int(cnt[j])
		}
		return n, nil
	}
	for i := range img.Tables {
		t := &img.Tables[i]
		if t.Drop < 0 || t.FreedTo < 0 {
			return fmt.Errorf("kvcache: image table %d: %d tokens dropped, freed to %d", i, t.Drop, t.FreedTo)
		}
		if t.N < 0 || len(t.Blocks) != (t.N+p.B-1)/p.B {
			return fmt.Errorf("kvcache: image table %d: %d tokens in %d blocks of %d", i, t.N, len(t.Blocks), p.B)
		}
		for j, b := range t.Blocks {
			if err := block("", i, b, min(p.B, t.N-j*p.B)); err != nil {
				return err
			}
		}
		if r := t.Res; r != nil {
			if p.residual == 0 {
				return fmt.Errorf("kvcache: image table %d holds a KIVI residual; this pool keeps none", i)
			}
			w := p.resWindow(i / L.KVHeads)
			if w > 0 && t.N > 0 {
				return fmt.Errorf("kvcache: image table %d holds %d sealed tokens; its window of %d is never sealed in this pool", i, t.N, w)
			}
			if len(r.Pos) < p.fp.ResidualBuffer(w, r.N) || len(r.K) != len(r.Pos)*d || len(r.V) != len(r.Pos)*d || r.N < 0 || r.N > len(r.Pos) {
				return fmt.Errorf("kvcache: image table %d: a residual of %d tokens in %d slots does not fit this pool", i, r.N, len(r.Pos))
			}
			for _, x := range r.Pos[:r.N] {
				if x < 0 {
					return fmt.Errorf("kvcache: image table %d: negative position %d", i, x)
				}
			}
		}
		m := t.Mini
		if m == nil {
			continue
		}
		h := i % L.KVHeads
		if m.Pair < 0 || m.Pair >= L.Layers || m.Pair == i/L.KVHeads {
			return fmt.Errorf("kvcache: image table %d: merged with layer %d", i, m.Pair)
		}
		o := img.Tables[m.Pair*L.KVHeads+h].Mini
		if o == nil || o.Pair != i/L.KVHeads || o.Counted == m.Counted || !slices.Equal(o.DirCnt, m.DirCnt) {
			return fmt.Errorf("kvcache: image table %d: its merged pair (layer %d) does not match", i, m.Pair)
		}
		nd := 0
		for _, c := range m.DirCnt {
			if c < 1 || int(c) > p.B {
				return fmt.Errorf("kvcache: image table %d: a direction block of %d tokens", i, c)
			}
			nd += int(c)
		}
		if m.Counted {
			if _, err := region("direction", i, m.Dir, m.DirCnt); err != nil {
				return err
			}
		} else if len(m.Dir) != 0 {
			return fmt.Errorf("kvcache: image table %d: direction blocks in the table that shares them", i)
		}
		if len(m.KMag) != nd || len(m.VMag) != nd {
			return fmt.Errorf("kvcache: image table %d: %d and %d norms for %d merged tokens", i, len(m.KMag), len(m.VMag), nd)
		}
		if _, err := region("retained", i, m.Ret, m.RetCnt); err != nil {
			return err
		}
	}
	return nil
}

// importTables fills s (new) from a checked image. The caller holds p.mu;
// on an error the caller frees s.
func (s *Paged) importTables(img *Image) error {
	p := s.pool
	H := p.layout.KVHeads
	put := func(b BlockImage) (int32, error) {
		id, err := p.alloc()
		if err != nil {
			return -1, err
		}
		copy(p.kbuf(id), b.K)
		copy(p.vbuf(id), b.V)
		copy(p.posbuf(id), b.Pos)
		p.meta[id].n = int32(len(b.Pos))
		return id, nil
	}
	fill := func(bs []BlockImage, cnt []int32) (region, error) {
		r := region{}
		for j, b := range bs {
			id, err := put(b)
			if err != nil {
				return r, err
			}
			r.blocks, r.cnt = append(r.blocks, id), append(r.cnt, cnt[j])
			r.n += int(cnt[j])
		}
		return r, nil
	}
	s.pristine, s.hold, s.last = img.Pristine, img.Hold, img.Last
	// Tables holding shared directions first, then the tables sharing them.
	for pass := range 2 {
		for i := range img.Tables {
			ti := &img.Tables[i]
			t := &s.tables[i]
			mi := ti.Mini
			if (pass == 1) != (mi != nil && !mi.Counted) {
				continue
			}
			t.dirty = true
			if mi != nil {
				m := &merged{pair: mi.Pair, counted: mi.Counted, kmag: slices.Clone(mi.KMag), vmag: slices.Clone(mi.VMag)}
				t.mini = m
				if mi.Counted {
					r, err := fill(mi.Dir, mi.DirCnt)
					m.dir = r
					if err != nil {
						return err
					}
				} else {
					m.dir = s.tables[mi.Pair*H+i%H].mini.dir.clone()
					for _, b := range m.dir.blocks {
						p.incref(b)
					}
				}
				r, err := fill(mi.Ret, mi.RetCnt)
				m.ret = r
				if err != nil {
					return err
				}
			}
			for _, b := range ti.Blocks {
				id, err := put(b)
				if err != nil {
					return err
				}
				t.blocks = append(t.blocks, id)
			}
			t.n, t.drop, t.freedTo = ti.N, ti.Drop, ti.FreedTo
			if r := ti.Res; r != nil {
				t.res = &residual{k: slices.Clone(r.K), v: slices.Clone(r.V), pos: slices.Clone(r.Pos), n: r.N}
			}
		}
	}
	return nil
}
