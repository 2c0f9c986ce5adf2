package kvcache

import (
	"slices"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// Ragged tables: a prune that drops a few slots of a large table compacts
// only the blocks that held them. Decoding under StreamingLLM or H2O drops
// one token a table a step; compacting the whole table behind it moved
// every later slot, so the prune cost as much as reading the cache again
// (at 16K with a 1,024 budget, 10.7 ms of a 34 ms step). Compacted in its
// own block, a dropped slot moves at most BlockTokens − 1 others, and the
// block holds one token fewer (table.cnt). Tokens stay in order; blocks
// other than the last may hold fewer than BlockTokens. A block that fits
// into the one before it is merged into it, so StreamingLLM's steady state
// (the sinks' block drained, then topped up from the next) holds one block
// more than full blocks would.
//
// The slack is bounded: when the blocks a prune leaves exceed maxBlocks,
// the table is compacted whole (compactInPlace), back to full blocks.
// Tables of fewer than raggedMin blocks are always compacted whole (cheap,
// and dense: small caches pay no slack). A ragged table's empty slots are in
// Memory's Wasted and Reserved and in the pool's used bytes, so the
// admission's budget and every reported KV size count them.
//
// Only plain tables become ragged: not with a KIVI residual (its sealed
// groups are not split), a window-bounded layer's (its window frees whole
// leading blocks) or a merged one's (MiniCache). Operations that address
// slots by block arithmetic compact a ragged table first (regular).

// raggedMin is the fewest full blocks a pruned table must fill to be left
// ragged (512 tokens in blocks of 16).
const raggedMin = 32

// maxBlocks is the most blocks a ragged table of n tokens may keep: the
// ceil(n/B) of full blocks plus one in 32, at least one (at most ~3% of
// its bytes; a policy that drops scattered slots compacts the table whole
// about once every n/32 steps, not every step).
func maxBlocks(n, B int) int {
	full := (n + B - 1) / B
	return full + max(1, full/32)
}

// raggedSlack is the blocks beyond ⌈n/B⌉ that a table of at most n tokens
// may hold, pruned and appended to: maxBlocks' slack after the prune, and
// one block more for the tokens appended next (a ragged table's last block
// may be full when a dense one's has room); 0 where n does not fill
// raggedMin blocks (such tables are always compacted whole). A pool sized
// in tokens has room for it (NewPool).
func raggedSlack(n, B int) int {
	full := (n + B - 1) / B
	if full < raggedMin {
		return 0
	}
	return maxBlocks(n, B) - full + 1
}

// held is the tokens block j of t holds.
func (t *table) held(j, B int) int {
	if t.cnt != nil {
		return int(t.cnt[j])
	}
	return min(B, t.n-j*B)
}

// tail is the slot the table's next token goes to in its last block, 0
// when that block is full or there is none (the token takes a new block).
func (t *table) tail(B int) int {
	if t.cnt == nil || len(t.blocks) == 0 {
		return t.n % B
	}
	return int(t.cnt[len(t.cnt)-1]) % B
}

// cursor walks a table's slots in ascending order, giving each one's
// block and place in it without a scan from the start.
type cursor struct {
	t    *table
	B    int
	j    int // block of the slot asked last
	base int // slots of the blocks before j
}

// at returns the block index and the slot inside it of table slot i (i <
// t.n; cheapest when not below the one asked before).
func (c *cursor) at(i int) (j, in int) {
	if c.t.cnt == nil {
		return i / c.B, i % c.B
	}
	if i < c.base {
		c.j, c.base = 0, 0
	}
	for i-c.base >= int(c.t.cnt[c.j]) {
		c.base += int(c.t.cnt[c.j])
		c.j++
	}
	return c.j, i - c.base
}

// physical maps ascending table slots of the blocks (below t.n) to their
// places counted over whole blocks (block j's slot i is j·B+i), in place.
// A ragged table's place of slot s is never below s.
func (t *table) physical(slots []int, B int) {
	if t.cnt == nil {
		return
	}
	c := cursor{t: t, B: B}
	for k, s := range slots {
		j, i := c.at(s)
		slots[k] = j*B + i
	}
}

// keepRagged is dropRagged of the slots of the blocks not in keep
// (ascending table slots, all below t.n).
func (s *Paged) keepRagged(t *table, keep []int, ragged bool) (bool, error) {
	B := s.pool.B
	if !s.mayRag(t, ragged) || (len(keep)+B-1)/B < raggedMin {
		return false, nil
	}
	return s.dropRagged(t, others(t.n, keep), ragged)
}

// mayRag says whether table t may be left ragged (ragged false: a
// window-bounded layer's; a KIVI or merged table may not).
func (s *Paged) mayRag(t *table, ragged bool) bool {
	return ragged && s.pool.residual == 0 && t.res == nil && t.mini == nil && t.drop == 0
}

// dropRagged drops the given slots (ascending, below t.n) by compacting
// each block that loses some inside itself, releases the blocks left
// empty and merges a block into the one before it where both fit in one:
// time in the dropped slots and the table's blocks, not its tokens. It
// reports false, changing nothing, when the table may not be ragged
// (mayRag), keeps fewer than raggedMin blocks' tokens, or would be left
// with far more than maxBlocks; it compacts the table whole when the
// blocks left exceed maxBlocks. The caller holds p.mu.
func (s *Paged) dropRagged(t *table, gone []int, ragged bool) (bool, error) {
	p := s.pool
	B, d := p.B, p.layout.HeadDim
	n := t.n - len(gone)
	if !s.mayRag(t, ragged) || (n+B-1)/B < raggedMin {
		return false, nil
	}
	// Each dropped slot's block and place in it; the blocks left.
	js, is := make([]int, len(gone)), make([]int, len(gone))
	c := cursor{t: t, B: B}
	for k, g := range gone {
		js[k], is[k] = c.at(g)
	}
	// group calls f with each block that loses slots and the range of gone
	// that it loses.
	group := func(f func(j, k, e int) error) error {
		for k := 0; k < len(gone); {
			e := k + 1
			for e < len(gone) && js[e] == js[k] {
				e++
			}
			if err := f(js[k], k, e); err != nil {
				return err
			}
			k = e
		}
		return nil
	}
	emptied := 0
	group(func(j, k, e int) error {
		if e-k == t.held(j, B) {
			emptied++
		}
		return nil
	})
	if len(t.blocks)-emptied > 2*maxBlocks(n, B) {
		return false, nil // merges cannot bring it near the bound: compact whole
	}
	// Blocks that change are made the table's own first, so a pool too
	// full to copy a shared one fails before anything moved.
	if err := group(func(j, k, e int) error {
		if e-k < t.held(j, B) {
			return s.own(t, j)
		}
		return nil
	}); err != nil {
		return false, err
	}
	if t.cnt == nil {
		t.cnt = make([]int32, len(t.blocks))
		for j := range t.cnt {
			t.cnt[j] = int32(min(B, t.n-j*B))
		}
	}
	kc := codec.Base(t.kc)
	if err := group(func(j, k, e int) error {
		have := int(t.cnt[j])
		t.cnt[j] -= int32(e - k)
		if e-k == have {
			return nil
		}
		b := t.blocks[j]
		w := is[k]
		for q := k; q < e; q++ { // the slots after each dropped one, down to w
			from, to := is[q]+1, have
			if q+1 < e {
				to = is[q+1]
			}
			if run := to - from; run > 0 {
				if !moveRun(kc, p.kbuf(b), w, p.kbuf(b), from, run, B, d, true) ||
					!moveRun(p.vc, p.vbuf(b), w, p.vbuf(b), from, run, B, d, true) {
					return errNoMove(p)
				}
				pos := p.posbuf(b)
				copy(pos[w:w+run], pos[from:to])
				w += run
			}
		}
		return nil
	}); err != nil {
		return false, err
	}
	if emptied > 0 {
		w := 0
		for j, b := range t.blocks {
			if t.cnt[j] == 0 {
				p.decref(b)
				continue
			}
			t.blocks[w], t.cnt[w] = b, t.cnt[j]
			w++
		}
		t.blocks, t.cnt = t.blocks[:w], t.cnt[:w]
	}
	t.n = n
	s.mergeBlocks(t)
	t.settle(B)
	if len(t.blocks) > maxBlocks(t.n, B) {
		return true, s.regular(t)
	}
	return true, nil
}

// mergeBlocks moves each block of a ragged table that fits after the
// tokens of the block before it there, and releases it. A merge that would
// need a copy of a shared block the pool cannot give is skipped. The caller
// holds p.mu.
func (s *Paged) mergeBlocks(t *table) {
	p := s.pool
	B, d := p.B, p.layout.HeadDim
	kc := codec.Base(t.kc)
	for j := 1; j < len(t.blocks); {
		a, n := int(t.cnt[j-1]), int(t.cnt[j])
		if a+n > B || s.own(t, j-1) != nil {
			j++
			continue
		}
		dst, src := t.blocks[j-1], t.blocks[j]
		// Slots of dst past a are free: a failed copy leaves nothing behind.
		if !moveRun(kc, p.kbuf(dst), a, p.kbuf(src), 0, n, B, d, false) ||
			!moveRun(p.vc, p.vbuf(dst), a, p.vbuf(src), 0, n, B, d, false) {
			j++
			continue
		}
		copy(p.posbuf(dst)[a:a+n], p.posbuf(src)[:n])
		p.decref(src)
		t.cnt[j-1] += int32(n)
		t.blocks = append(t.blocks[:j], t.blocks[j+1:]...)
		t.cnt = append(t.cnt[:j], t.cnt[j+1:]...)
	}
}

// settle drops t.cnt when every block but the last is full again.
func (t *table) settle(B int) {
	if t.cnt == nil {
		return
	}
	last := len(t.cnt) - 1
	if last < 0 || !slices.ContainsFunc(t.cnt[:last], func(n int32) bool { return int(n) != B }) && t.cnt[last] > 0 {
		t.cnt = nil
	}
}

// regular compacts a ragged table whole, back to full blocks (every one
// but the last); a regular table is left as it is. The caller holds p.mu.
func (s *Paged) regular(t *table) error {
	if t.cnt == nil {
		return nil
	}
	all := make([]int, t.n)
	for i := range all {
		all[i] = i
	}
	first := t.leading(s.pool.B, t.n)
	if err := s.compactInPlace(t, first, all[first*s.pool.B:]); err != nil {
		return err
	}
	t.dirty = true
	return nil
}

// leading is the leading blocks of t that are full and keep all their
// slots when the first same slots of the table are kept.
func (t *table) leading(B, same int) int {
	j := 0
	for j < len(t.blocks) && t.held(j, B) == B && same >= (j+1)*B {
		j++
	}
	return j
}
