package kvcache

import (
	"fmt"
	"slices"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// Keep rewrites the table of (layer, head) to hold only the given slots
// (indexes into its current order, ascending), in order: leading blocks that
// stay whole are kept as they are, the rest is compacted into fresh blocks
// and the old blocks are released. Slots are copied without decoding, so
// nothing is lost to requantization. This is the one prune every eviction
// policy goes through; a table may end with a different length from the
// others (ragged per-head budgets free memory for real).
//
// With a KIVI residual, sealed key groups cannot be split: only residual
// slots may be dropped. A table merged by MergeLayers (MiniCache) cannot be
// pruned.
func (s *Paged) Keep(layer, head int, keep []int) error {
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := s.keep(s.tab(layer, head), keep, p.layout.window(layer) == 0); err != nil {
		return fmt.Errorf("kvcache: layer %d head %d: %w", layer, head, err)
	}
	return nil
}

// Drop removes the given slots (ascending indexes) of the table of (layer,
// head): Keep of all the others, the same result. A table that may be
// left ragged (ragged.go) loses them inside their blocks, in time
// independent of its length (a decode step's prune: one slot of a
// thousand); any other is compacted as Keep compacts it.
func (s *Paged) Drop(layer, head int, gone []int) error {
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	t := s.tab(layer, head)
	total := t.len()
	if !ascendingBelow(gone, total) {
		return fmt.Errorf("kvcache: layer %d head %d: dropped slots must be ascending indexes below %d", layer, head, total)
	}
	if len(gone) == 0 {
		return nil
	}
	ragged := p.layout.window(layer) == 0
	ok, err := s.dropRagged(t, gone, ragged)
	if ok { // changed, even when compacting it whole after failed
		t.dirty = true
		s.pristine = false
	}
	if err == nil && !ok {
		err = s.keep(t, others(total, gone), ragged)
	}
	if err != nil {
		return fmt.Errorf("kvcache: layer %d head %d: %w", layer, head, err)
	}
	return nil
}

// RemoveRange drops tokens [from, to) of every table, keeping the others in
// order with their original positions. Indexes count from the sequence's
// start: a window-bounded table's freed tokens count (table.drop).
func (s *Paged) RemoveRange(from, to int) error {
	p := s.pool
	if from < 0 || to < from {
		return fmt.Errorf("kvcache: invalid range [%d,%d)", from, to)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range s.tables {
		if t := &s.tables[i]; t.mini != nil && from < t.len() && to > from {
			return fmt.Errorf("kvcache: layer %d: %w", i/p.layout.KVHeads, errMerged)
		}
	}
	for i := range s.tables {
		t := &s.tables[i]
		n := t.len()
		from, to := max(0, from-t.drop), max(0, to-t.drop)
		if from >= n {
			continue
		}
		keep := make([]int, 0, n-(min(to, n)-from))
		for j := 0; j < from; j++ {
			keep = append(keep, j)
		}
		for j := min(to, n); j < n; j++ {
			keep = append(keep, j)
		}
		if err := s.keep(t, keep, p.layout.window(i/p.layout.KVHeads) == 0); err != nil {
			return fmt.Errorf("kvcache: table %d: %w", i, err)
		}
	}
	return nil
}

// keep implements Keep; ragged: the table may be left ragged (ragged.go;
// not a window-bounded layer's). The caller holds p.mu.
func (s *Paged) keep(t *table, keep []int, ragged bool) error {
	p := s.pool
	B, d := p.B, p.layout.HeadDim
	total := t.len()
	if t.mini != nil && len(keep) != total {
		return errMerged
	}
	if !ascendingBelow(keep, total) {
		return fmt.Errorf("kept slots must be ascending indexes below %d", total)
	}
	if len(keep) == total {
		return nil // everything kept
	}
	if t.res == nil {
		ok, err := s.keepRagged(t, keep, ragged)
		if ok { // changed, even when compacting it whole after failed
			t.dirty = true
			s.pristine = false
		}
		if ok || err != nil {
			return err
		}
	}
	// Leading whole blocks that stay as they are.
	same := 0
	for same < len(keep) && keep[same] == same {
		same++
	}
	first := t.leading(B, same)
	// Slots of the blocks from `first` on that survive, and residual ones.
	fromBlocks := make([]int, 0, len(keep)-first*B)
	var fromRes []int
	for _, k := range keep[first*B:] {
		if k < t.n {
			fromBlocks = append(fromBlocks, k)
		} else {
			fromRes = append(fromRes, k-t.n)
		}
	}
	if r := t.res; r != nil {
		if len(fromBlocks) != t.n-first*B {
			return s.keepSealed(t, first, fromBlocks, fromRes)
		}
		r.keep(fromRes, d)
	} else if err := s.compactInPlace(t, first, fromBlocks); err != nil {
		return err
	}
	t.dirty = true
	s.pristine = false
	return nil
}

// compactInPlace moves the kept slots of blocks first.. (table slots,
// ascending) down over the dropped ones, in order, inside the table's own
// blocks (a slot only ever moves to an earlier place, so nothing is
// overwritten before it is read; of a ragged table too, whose slot s sits
// at or after place s), then releases the blocks left empty: every block
// but the last is full after it. Blocks shared with other sequences
// or the prefix cache are copied first (own); no other block is allocated,
// so a full pool can still be pruned. The caller holds p.mu.
func (s *Paged) compactInPlace(t *table, first int, fromBlocks []int) error {
	p := s.pool
	B, d := p.B, p.layout.HeadDim
	used := (len(fromBlocks) + B - 1) / B // blocks that will hold the kept slots
	for j := first; j < first+used; j++ {
		if err := s.own(t, j); err != nil {
			return fmt.Errorf("%w: copying a shared block before compaction", err)
		}
	}
	t.physical(fromBlocks, B)
	kc := codec.Base(t.kc)
	for k := 0; k < len(fromBlocks); {
		slot, dk := fromBlocks[k], first*B+k
		if dk == slot {
			k++
			continue
		}
		// A run of kept slots moving together inside one block (the whole
		// window behind an evicted token): moved in bulk where the codecs
		// can, slot by slot otherwise.
		src, si := t.blocks[slot/B], slot%B
		dst, di := t.blocks[dk/B], dk%B
		limit := min(B-si, B-di, len(fromBlocks)-k) // the run ends at either block's end
		run := 1
		for run < limit && fromBlocks[k+run] == slot+run {
			run++
		}
		if !moveRun(kc, p.kbuf(dst), di, p.kbuf(src), si, run, B, d, src == dst) ||
			!moveRun(p.vc, p.vbuf(dst), di, p.vbuf(src), si, run, B, d, src == dst) {
			return errNoMove(p)
		}
		copy(p.posbuf(dst)[di:di+run], p.posbuf(src)[si:si+run])
		k += run
	}
	for j := len(t.blocks) - 1; j >= first+used; j-- {
		p.decref(t.blocks[j])
	}
	t.blocks = t.blocks[:first+used]
	t.n = first*B + len(fromBlocks)
	t.cnt = nil
	return nil
}

// ascendingBelow says whether slots are strictly ascending indexes in
// [0, n).
func ascendingBelow(slots []int, n int) bool {
	for i, k := range slots {
		if k < 0 || k >= n || (i > 0 && k <= slots[i-1]) {
			return false
		}
	}
	return true
}

// others is the indexes of [0, n) not in slots (ascending, below n), in
// ascending order: the kept slots of a prune named by its dropped ones,
// and the other way round.
func others(n int, slots []int) []int {
	out := make([]int, 0, n-len(slots))
	k := 0
	for i := range n {
		if k < len(slots) && slots[k] == i {
			k++
			continue
		}
		out = append(out, i)
	}
	return out
}

// errNoMove is the error of a codec pair that cannot move slots.
func errNoMove(p *Pool) error {
	return fmt.Errorf("codec %s/%s cannot move slots", p.kc.Name(), p.vc.Name())
}

// moveRun moves slots si … si+run−1 of block src into di … of block dst
// (each of B slots of d values; same: they are one block), in bulk when
// inside one block and the codec can, else slot by slot in ascending
// order; false when the codec cannot move slots at all.
func moveRun(c codec.Codec, dst []byte, di int, src []byte, si, run, B, d int, same bool) bool {
	if same && run > 1 && codec.MoveSlots(c, dst, B, d, di, si, run) {
		return true
	}
	for j := range run {
		if !codec.CopySlot(c, dst, B, di+j, src, B, si+j, d) {
			return false
		}
	}
	return true
}

// Slots is the number of tokens the table of (layer, head) holds.
func (s *Paged) Slots(layer, head int) int { return s.tab(layer, head).len() }

// Positions returns the positions of the table of (layer, head), in slot
// order (a fresh slice). A table merged by MergeLayers does not hold its
// slots in position order (merged, then retained, then newer tokens); its
// positions are returned sorted, and the slot-addressed operations (Keep,
// RewriteKeys) refuse it.
func (s *Paged) Positions(layer, head int) []int32 {
	var out []int32
	for _, seg := range s.Segments(layer, head) {
		out = append(out, seg.Pos[:seg.N]...)
	}
	if s.tab(layer, head).mini != nil {
		slices.Sort(out)
	}
	return out
}

// RewriteKeys lets fn change the position and the key of the given slots
// of (layer, head) (ascending indexes): each key is decoded, handed to fn
// with its position, and encoded back with the position fn returns. It is
// how positions are re-indexed (the model re-rotates the key). Blocks
// shared with other sequences or the prefix cache are copied first (own); keys in KIVI groups cannot be rewritten, and
// quantized keys are re-quantized (lossy).
func (s *Paged) RewriteKeys(layer, head int, slots []int, fn func(pos int32, key []float32) int32) error {
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	t := s.tab(layer, head)
	if t.mini != nil && len(slots) > 0 {
		return fmt.Errorf("kvcache: layer %d head %d: %w", layer, head, errMerged)
	}
	d := p.layout.HeadDim
	key := make([]float32, d)
	c := cursor{t: t, B: p.B}
	for _, i := range slots {
		if i < 0 || i >= t.len() {
			return fmt.Errorf("kvcache: slot %d out of range [0,%d)", i, t.len())
		}
		if i >= t.n {
			t.res.rewriteKey(i-t.n, d, key, fn)
			continue
		}
		if !p.kc.PerToken() {
			return fmt.Errorf("kvcache: %s keys are sealed in groups and cannot be rewritten", p.kc.Name())
		}
		bi, in := c.at(i)
		if err := s.own(t, bi); err != nil {
			return err
		}
		b := t.blocks[bi]
		t.kc.Get(p.kbuf(b), p.B, d, in, key)
		pos := &p.posbuf(b)[in]
		*pos = fn(*pos, key)
		t.kc.Put(p.kbuf(b), p.B, d, in, key)
	}
	t.dirty = true
	s.pristine = false
	if t.freedTo > 0 && len(slots) > 0 {
		// Re-indexed positions: what the window freed, older than every
		// held slot, would sit below the lowest position held now.
		low := t.freedTo
		for j, b := range t.blocks {
			for _, x := range p.posbuf(b)[:t.held(j, p.B)] {
				low = min(low, x)
			}
		}
		if r := t.res; r != nil {
			for _, x := range r.pos[:r.n] {
				low = min(low, x)
			}
		}
		t.freedTo = low
	}
	return nil
}

// own makes block j of table t the table's alone before its contents
// change in place: a block other sequences hold, or one the prefix cache
// names (the plain prefix stays a hit for later sequences), is replaced by
// a copy. When the pool has no block for the copy, a block only the cache
// shares drops its entry instead (the cached prefix gives way); a block
// other sequences hold cannot. The caller holds p.mu.
func (s *Paged) own(t *table, j int) error {
	p := s.pool
	b := t.blocks[j]
	if p.meta[b].ref == 1 && p.meta[b].entry == nil {
		return nil
	}
	nb, err := p.alloc()
	if err != nil {
		if p.meta[b].ref > 1 {
			return err
		}
		p.dropEntry(p.meta[b].entry)
		return nil
	}
	p.copyBlock(nb, b, t.held(j, p.B))
	p.decref(b)
	t.blocks[j] = nb
	p.stats.CopyOnWrite++
	return nil
}
