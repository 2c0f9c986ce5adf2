package kvcache

import "fmt"

// Per-layer windows (Layout.Windows): a cache layer read only by
// sliding-window attention of window W keeps only what its next queries can
// see. On Append(layer, pos, …), before anything is stored, each table of
// the layer drops its leading whole blocks whose every slot is at a
// position ≤ pos[0] − W: the query at pos[0] (and every later one) sees
// positions > pos[0] − W only (model.Config.SlidingWindow's mask).
//
// The drop is cheap and moves nothing: the table's head advances by whole
// blocks (blocks[k:], a reference dropped on each; a block shared with a
// fork or a cached prefix just loses that reference), the tail (the partly
// filled last block, KIVI's residual) is never touched, so block j still
// holds min(B, n − j·B) tokens. Only full blocks go, so a layer holds at
// most W + step + B − 1 tokens' blocks after an append of step tokens
// (Footprint.AdmitWindowBlocks). KIVI: every sealed block carries its key
// group's per-channel range, so a block of a group is freed alone; the
// residual (bounded by Residual + SealTokens anyway) is not slid. A layer
// whose window fits in the residual (W ≤ Residual, Footprint.Unsealed) is
// never sealed at all: KIVI keeps the newest Residual tokens in f16, so
// every token its queries read is there already, and sealed blocks would
// only hold tokens it can no longer see. Its tables hold their tokens in
// the residual alone and take no blocks; the window drops the residual's
// leading tokens at positions ≤ pos[0] − W one by one, and the buffer is
// max(W, held) slots between appends (W − 1 + step tokens after an append
// of step): what the layer computes is what sealing would give, in less
// memory than a float16 window's blocks.
// MiniCache's merged tables (whose merged tokens sit before the blocks)
// are not slid.
//
// table.drop counts the tokens freed so far, so that Len, Truncate and the
// prefix cache still count tokens from the sequence's start; table.freedTo
// is one past the highest position freed, and an append whose queries would
// need a freed position (after a Truncate or a restore further back than
// the window allows) is refused rather than answered wrongly.

// window is cache layer layer's retention bound (0: none).
func (l Layout) window(layer int) int {
	if l.Windows == nil {
		return 0
	}
	return l.Windows[layer]
}

// Windowed reports whether some layer of l is window-bounded.
func (l Layout) Windowed() bool {
	for _, w := range l.Windows {
		if w > 0 {
			return true
		}
	}
	return false
}

// maxPos is the highest position of block b's first n slots.
func (p *Pool) maxPos(b int32, n int) int32 {
	pos := p.posbuf(b)[:n]
	m := pos[0]
	for _, x := range pos[1:] {
		m = max(m, x)
	}
	return m
}

// stale is how many leading full blocks of t hold only positions ≤ limit
// (what sliding to limit frees). The caller holds p.mu.
func (p *Pool) stale(t *table, limit int32) int {
	if t.mini != nil {
		return 0
	}
	k, full := 0, t.n/p.B
	for k < full && p.maxPos(t.blocks[k], p.B) <= limit {
		k++
	}
	return k
}

// slide drops the leading full blocks of t that hold only positions ≤
// limit. The caller holds p.mu.
func (p *Pool) slide(t *table, limit int32) {
	if t.resWindow > 0 {
		if t.mini == nil {
			t.res.slide(t, limit, p.layout.HeadDim)
		}
		return
	}
	k := p.stale(t, limit)
	if k == 0 {
		return
	}
	for _, b := range t.blocks[:k] {
		t.freedTo = max(t.freedTo, p.maxPos(b, p.B)+1)
		p.decref(b)
	}
	t.blocks = t.blocks[k:]
	t.n -= k * p.B
	t.drop += k * p.B
	t.dirty = true
}

// checkWindow refuses an append at p0 to a table of window w whose
// queries would need a position the window already freed.
func checkWindow(t *table, p0 int32, w int) error {
	if t.freedTo > 0 && int64(t.freedTo) > int64(p0)-int64(w)+1 {
		return fmt.Errorf("a token at position %d sees positions from %d on, but the layer's window of %d already freed those below %d", p0, int64(p0)-int64(w)+1, w, t.freedTo)
	}
	return nil
}

// lastPos is the highest position t holds, and whether it holds any.
func (p *Pool) lastPos(t *table) (int32, bool) {
	if r := t.res; r != nil && r.n > 0 {
		return r.pos[r.n-1], true
	}
	if t.n > 0 {
		j := (t.n - 1) / p.B
		return p.maxPos(t.blocks[j], t.n-j*p.B), true
	}
	return 0, false
}

// freeable is the blocks appending at the next position (one past the
// last held) makes table t of window w free for real: its stale leading
// blocks no other sequence or prefix entry references. The caller holds
// p.mu.
func (p *Pool) freeable(t *table, w int) int {
	if w <= 0 {
		return 0
	}
	last, ok := p.lastPos(t)
	if !ok {
		return 0
	}
	k := p.stale(t, last+1-int32(w))
	n := 0
	for _, b := range t.blocks[:k] {
		if p.meta[b].ref == 1 {
			n++
		}
	}
	return n
}

// WindowDropped is the tokens the window of layer has freed from the head
// of (layer, head) so far (0 for a layer without a window).
func (s *Paged) WindowDropped(layer, head int) int { return s.tab(layer, head).drop }

// Footprint arithmetic of a window-bounded table, tokens at positions
// 0, 1, … appended in order, step at a time (the last step may be
// shorter).

// inBlocks is how many of x tokens appended in order sit in blocks: all
// of them, or with KIVI those sealed.
func (f Footprint) inBlocks(x int) int {
	if f.SealTokens == 0 {
		return x
	}
	return f.sealed(x)
}

// windowDrop is the blocks a table of window w has freed once the append
// at p0 dropped what it frees (the drop is monotone in p0, so this is the
// total of every earlier append too).
func (f Footprint) windowDrop(p0, w int) int {
	if w <= 0 || p0-w+1 <= 0 {
		return 0
	}
	return min(f.inBlocks(p0)/f.BlockTokens, (p0-w+1)/f.BlockTokens)
}

// windowHeld is the blocks a table of window w holds right after the
// append of positions [p0, e).
func (f Footprint) windowHeld(p0, e, w int) int {
	B := f.BlockTokens
	return (f.inBlocks(e)+B-1)/B - f.windowDrop(p0, w)
}

// WindowTable is Table(n) for a table of window w (0: none) whose n tokens
// were appended step at a time (step ≤ 0 or ≥ n: at once): its blocks
// (those the window freed gone), KIVI's residual tokens and buffer slots.
func (f Footprint) WindowTable(n, w, step int) (blocks, residualTokens, residualSlots int) {
	blocks, residualTokens, residualSlots = f.Table(n)
	if n <= 0 || w <= 0 {
		return
	}
	if step <= 0 || step > n {
		step = n
	}
	p0 := (n - 1) / step * step // the last append's start
	if f.Unsealed(w) {
		// Positions p0 − w + 1 … n − 1 in the residual.
		held := min(p0, w-1) + n - p0
		return 0, held, f.ResidualBuffer(w, held)
	}
	return blocks - f.windowDrop(p0, w), residualTokens, residualSlots
}

// WindowTableBytes is the bytes of WindowTable.
func (f Footprint) WindowTableBytes(n, w, step int) int64 {
	blocks, _, slots := f.WindowTable(n, w, step)
	return int64(blocks)*int64(f.BlockBytes) + int64(slots)*int64(f.ResidualSlotBytes)
}

// WindowPeak is the most blocks a table of window w holds at any time
// while n tokens are appended step at a time (KIVI: sealing counted as the
// pool seals): Table's blocks for w = 0.
func (f Footprint) WindowPeak(n, w, step int) int {
	if n <= 0 || f.Unsealed(w) {
		return 0
	}
	if step <= 0 || step > n {
		step = n
	}
	if w <= 0 {
		return (f.inBlocks(n) + f.BlockTokens - 1) / f.BlockTokens
	}
	// Past p0 ≥ w + Residual + SealTokens the held blocks repeat with the
	// period lcm(SealTokens or B, step) of step starts: one period beyond
	// that point covers every value but the last, shorter step's.
	period := f.BlockTokens
	if f.SealTokens > 0 {
		period = f.SealTokens
	}
	horizon := w + f.Residual + 2*max(period, f.BlockTokens) + lcm(period, step) + step
	best := 0
	for p0 := 0; p0 < n && p0 <= horizon; p0 += step {
		best = max(best, f.windowHeld(p0, min(p0+step, n), w))
	}
	last := (n - 1) / step * step
	return max(best, f.windowHeld(last, n, w))
}

// AdmitWindowBlocks is AdmitBlocks(n) for a table of window w (0: none)
// whose tokens arrive at most step at a time however they are split
// (step ≤ 0: all at once), counting every token as held in blocks as
// AdmitBlocks does: after an append of c ≤ step tokens at p0 a table holds
// the blocks of positions p0 − w + 1 … p0 + c − 1 and the block-rounding at
// both ends, at most ⌈(w + step + B − 2) / B⌉, plus one KIVI seal's blocks
// (a seal cannot be freed before the next append). A never-sealed table
// (Unsealed) takes none.
func (f Footprint) AdmitWindowBlocks(n, w, step int) int {
	if f.Unsealed(w) {
		return 0 // its tokens stay in the residual, outside the arena
	}
	all := f.AdmitBlocks(n)
	if w <= 0 || step <= 0 || step >= n {
		return all
	}
	B := f.BlockTokens
	bound := (w + step + B - 2 + B - 1) / B
	bound += f.SealTokens / B
	return min(all, bound)
}

// AdmitBytesStep is AdmitBytes for tokens that arrive at most step at a
// time: every window-bounded layer at AdmitWindowBlocks, the others at
// AdmitBlocks.
func (f Footprint) AdmitBytesStep(l Layout, n, step int) int64 {
	var blocks int64
	for c := 0; c < l.Layers; c++ {
		blocks += int64(f.AdmitWindowBlocks(n, l.window(c), step))
	}
	return blocks * int64(l.KVHeads) * int64(f.BlockBytes)
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }
