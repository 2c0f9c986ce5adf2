package kvcache

// MiniCache's storage (Liu et al., arXiv 2405.14366): the keys and values
// of two adjacent layers merged token by token into one unit direction
// each plus each layer's norms, the tokens whose layers disagree most
// retained whole in both. The method itself (which tokens, SLERP, which
// are retained) is policy.MergeLayers; this file stores what it decided
// (Merging: MergeCandidates hands it the candidates, StoreMerged takes its
// MergePlan) and reads it back for attention.
//
// In kvlm's terms, per (layer pair, KV head):
//
//   - the unit directions e of the merged tokens (keys and values, in the
//     pool's codecs: MiniCache combines with q4 or KIVI) are stored once, in
//     blocks referenced by both layers' tables;
//   - each layer keeps its own norms as float32 side arrays (KMag, VMag of
//     the Segments), so attention scores q·k̂ = ‖k‖·(q·e_k) and weighs
//     values by p·‖v‖ without a restored copy;
//   - retained tokens stay whole in blocks of their own layer, copied slot
//     for slot (no requantization, except KIVI keys: see below);
//   - tokens appended after a merge go to ordinary blocks as before, and a
//     later merge (decode-time, whole blocks) appends to both regions.
//
// A merged table holds, in slot order, its merged tokens, its retained
// tokens and then its ordinary blocks and residual: not position order.
// Attention masks by position, so that does not matter to it; Positions
// returns the positions sorted, and Keep, RemoveRange and RewriteKeys refuse
// merged tables. Truncate works as long as it cuts after the merged and
// retained tokens (they are always the oldest ones).
//
// Candidates are decoded from what the cache holds: with a per-token
// quantized pool (q8, q4) tokens are quantized when appended, so a merge
// decodes them and quantizes the directions again. With a KIVI pool the
// candidates are the sealed tokens and the full-precision residual's
// tokens beyond its newest R; a prompt held in the residual (HoldSeal, as
// the policies do during a prefill) is merged from full precision and
// quantized after, MiniCache's "merge, then quantize". KIVI keys of merged
// directions and of retained tokens are quantized per channel over each
// block's own tokens (every block carries its channel metadata anyway, so
// this costs no extra bits); sealed retained keys are thus re-quantized.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvlm/kvlm/kvcache/codec"
)

var errMerged = errors.New("the table is merged with another layer (MiniCache): its slots are not in position order and cannot be pruned or rewritten")

// region is a list of blocks, each with its own fill count: a merge writes
// fresh blocks after the existing ones, so partly filled blocks may sit in
// the middle.
type region struct {
	blocks []int32
	cnt    []int32 // tokens in each block
	n      int     // tokens in all blocks
}

func (r *region) clone() region {
	return region{blocks: slices.Clone(r.blocks), cnt: slices.Clone(r.cnt), n: r.n}
}

// merged is the MiniCache part of a table: the slots before its ordinary
// blocks.
type merged struct {
	pair       int       // the other layer of the merged pair
	counted    bool      // this table (the pair's lower layer) counts the shared blocks in Memory
	dir        region    // unit directions of merged tokens, the same blocks in both tables of the pair
	kmag, vmag []float32 // [dir.n] this layer's key and value norms
	ret        region    // this layer's retained tokens, whole
}

// The methods of merged take a nil receiver for an unmerged table.

func (m *merged) len() int {
	if m == nil {
		return 0
	}
	return m.dir.n + m.ret.n
}

// kc is the table's own key codec (its retained tokens); the merged
// directions, shared by two layers, use the pool's.
func (m *merged) segments(p *Pool, kc codec.Codec, segs []Segment) []Segment {
	if m == nil {
		return segs
	}
	off := 0
	for j, b := range m.dir.blocks {
		n := int(m.dir.cnt[j])
		segs = append(segs, Segment{K: p.kbuf(b), V: p.vbuf(b), KC: p.kc, VC: p.vc, Cap: p.B, N: n, Pos: p.posbuf(b)[:n],
			KMag: m.kmag[off : off+n : off+n], VMag: m.vmag[off : off+n : off+n]})
		off += n
	}
	for j, b := range m.ret.blocks {
		n := int(m.ret.cnt[j])
		segs = append(segs, Segment{K: p.kbuf(b), V: p.vbuf(b), KC: kc, VC: p.vc, Cap: p.B, N: n, Pos: p.posbuf(b)[:n]})
	}
	return segs
}

// fork copies the bookkeeping and takes a reference to every block. The
// caller holds p.mu.
func (m *merged) fork(p *Pool) *merged {
	if m == nil {
		return nil
	}
	f := &merged{pair: m.pair, counted: m.counted, dir: m.dir.clone(), ret: m.ret.clone(),
		kmag: slices.Clone(m.kmag), vmag: slices.Clone(m.vmag)}
	for _, b := range m.dir.blocks {
		p.incref(b)
	}
	for _, b := range m.ret.blocks {
		p.incref(b)
	}
	return f
}

// free releases the blocks, newest first. The caller holds p.mu.
func (m *merged) free(p *Pool) {
	if m == nil {
		return
	}
	for j := len(m.ret.blocks) - 1; j >= 0; j-- {
		p.decref(m.ret.blocks[j])
	}
	for j := len(m.dir.blocks) - 1; j >= 0; j-- {
		p.decref(m.dir.blocks[j])
	}
}

func (m *merged) memory(p *Pool, mem *Memory) {
	if m == nil {
		return
	}
	per := int64(p.blockBytes)
	mem.Blocks += len(m.ret.blocks)
	mem.Used += int64(m.ret.n) * per / int64(p.B)
	if m.counted {
		mem.Blocks += len(m.dir.blocks)
		mem.Used += int64(m.dir.n) * per / int64(p.B)
	}
	mag := int64(len(m.kmag)+len(m.vmag)) * 4
	mem.Magnitudes += mag
	mem.Used += mag
}

// Merging is a sequence as MiniCache's merge (policy.MergeLayers) sees
// it: the oldest unmerged tokens of a pair of adjacent layers, decoded, and
// the one operation that stores what the merge decided. Which tokens are
// merged, their directions and norms are the policy's; where they go (the
// shared direction blocks, each layer's norms and retained blocks) is the
// cache's.
type Merging interface {
	Layout() Layout
	MergeCandidates(upper, head, recent int, whole bool) (MergeCandidates, error)
	StoreMerged(upper, head int, c MergeCandidates, plan MergePlan) error
}

var _ Merging = (*Paged)(nil)

// MergeCandidates are the tokens of one KV head of a layer pair that can
// be merged: the oldest unmerged ones of both tables, holding the same
// positions, decoded from what the cache stores.
type MergeCandidates struct {
	Pos  []int32      // [n] positions, in slot order
	K, V [2][]float32 // the lower (0) and upper (1) layer's keys and values [n][headDim]
}

// Len is the number of candidates.
func (c MergeCandidates) Len() int { return len(c.Pos) }

// MergePlan is what a merge decided for the candidates: each is either
// merged (one shared unit direction of its key and value, and each layer's
// norms) or retained whole in both layers.
type MergePlan struct {
	Merged, Retained []int     // candidate indexes, ascending, together every candidate once
	KDir, VDir       []float32 // [n][headDim] unit directions (rows of retained candidates are not read)
	// KNorm and VNorm are the lower (0) and upper (1) layer's norms of
	// each candidate's key and value [n] (retained candidates' are not read).
	KNorm, VNorm [2][]float32
}

func (s *Paged) mergeCheck(upper int) error {
	L := s.pool.layout
	switch {
	case s.freed:
		return errors.New("kvcache: merge of a freed sequence")
	case upper < 1 || upper >= L.Layers:
		return fmt.Errorf("kvcache: cannot merge layers %d and %d of %d", upper-1, upper, L.Layers)
	}
	return nil
}

// MergeCandidates returns the tokens of KV head head of layers upper−1
// and upper that a merge can take: the tables' oldest unmerged ones, all
// but the newest max(recent, KIVI residual R); a cut inside the blocks, or
// any cut when whole is set, falls on a block boundary (the blocks given
// up are released whole). Both tables must hold the same tokens
// (same counts and positions: pruned tables cannot be merged), and neither
// may be merged with a third layer.
func (s *Paged) MergeCandidates(upper, head, recent int, whole bool) (MergeCandidates, error) {
	var out MergeCandidates
	if err := s.mergeCheck(upper); err != nil {
		return out, err
	}
	if recent < 0 {
		return out, fmt.Errorf("kvcache: negative recent window %d", recent)
	}
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	B, d := p.B, p.layout.HeadDim
	ta, tb := s.tab(upper-1, head), s.tab(upper, head)
	wrap := func(err error) error {
		return fmt.Errorf("kvcache: merging layers %d and %d, head %d: %w", upper-1, upper, head, err)
	}
	if err := s.samePair(upper, ta, tb); err != nil {
		return out, wrap(err)
	}
	total := ta.n + ta.res.len()
	c := max(0, total-max(recent, p.residual))
	if whole || c < ta.n {
		c = c / B * B
	}
	if c == 0 {
		return out, nil
	}
	nb := min(c, ta.n) // candidates in blocks; the others are in the residual
	out.Pos = make([]int32, c)
	for j, t := range []*table{ta, tb} {
		k, v := make([]float32, c*d), make([]float32, c*d)
		out.K[j], out.V[j] = k, v
		for i := 0; i < c; i++ {
			x := k[i*d : (i+1)*d]
			y := v[i*d : (i+1)*d]
			var q int32
			if i < nb {
				b := t.blocks[i/B]
				q = p.posbuf(b)[i%B]
				t.kc.Get(p.kbuf(b), B, d, i%B, x)
				p.vc.Get(p.vbuf(b), B, d, i%B, y)
			} else {
				r, o := t.res, i-nb
				q = r.pos[o]
				r.getK(o, d, x)
				r.getV(o, d, y)
			}
			if j == 0 {
				out.Pos[i] = q
			} else if q != out.Pos[i] {
				return MergeCandidates{}, wrap(fmt.Errorf("slot %d holds position %d in one layer and %d in the other (pruned tables cannot be merged)", i, out.Pos[i], q))
			}
		}
	}
	return out, nil
}

// samePair checks that tables ta (layer upper−1) and tb (upper) can be
// merged with each other: not merged elsewhere, the same tokens held.
func (s *Paged) samePair(upper int, ta, tb *table) error {
	if ta.mini != nil && ta.mini.pair != upper || tb.mini != nil && tb.mini.pair != upper-1 {
		return errors.New("a layer is already merged with another layer")
	}
	for _, t := range []*table{ta, tb} {
		if err := s.regular(t); err != nil { // candidates are addressed by block arithmetic
			return err
		}
	}
	if ta.n != tb.n || ta.res.len() != tb.res.len() {
		return fmt.Errorf("the layers hold %d+%d and %d+%d tokens in blocks and residual", ta.n, ta.res.len(), tb.n, tb.res.len())
	}
	return nil
}

// StoreMerged replaces the candidates c (as MergeCandidates returned them,
// the tables unchanged since) by what plan decided: the merged ones by one
// shared unit direction per token (keys and values, in the pool's codecs,
// in blocks both tables reference) plus each layer's norms; the retained
// ones stay whole in each layer (slots of blocks moved without decoding,
// those of the residual encoded from c). The old blocks are released
// before the new ones are taken, so a merge needs no spare blocks beyond
// what the directions of a small merge may add: ErrNoBlocks otherwise,
// with the head unchanged. A pair can be merged again later (the new
// tokens are appended to its regions).
func (s *Paged) StoreMerged(upper, h int, c MergeCandidates, plan MergePlan) error {
	if err := s.mergeCheck(upper); err != nil {
		return err
	}
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := s.storeMerged(upper, h, c, plan); err != nil {
		return fmt.Errorf("kvcache: merging layers %d and %d, head %d: %w", upper-1, upper, h, err)
	}
	return nil
}

// checkPlan checks that plan covers n candidates of head dim d.
func checkPlan(plan MergePlan, n, d int) error {
	seen := make([]bool, n)
	for _, idx := range [][]int{plan.Merged, plan.Retained} {
		for j, i := range idx {
			if i < 0 || i >= n || seen[i] || j > 0 && i <= idx[j-1] {
				return fmt.Errorf("a merge plan must list each of the %d candidates once, in ascending order", n)
			}
			seen[i] = true
		}
	}
	if len(plan.Merged)+len(plan.Retained) != n {
		return fmt.Errorf("a merge plan covers %d of %d candidates", len(plan.Merged)+len(plan.Retained), n)
	}
	if len(plan.Merged) > 0 && (len(plan.KDir) != n*d || len(plan.VDir) != n*d ||
		len(plan.KNorm[0]) != n || len(plan.KNorm[1]) != n || len(plan.VNorm[0]) != n || len(plan.VNorm[1]) != n) {
		return fmt.Errorf("a merge plan needs directions [%d][%d] and norms [%d] of both layers", n, d, n)
	}
	return nil
}

// storeMerged implements StoreMerged. The caller holds p.mu.
func (s *Paged) storeMerged(upper, h int, cand MergeCandidates, plan MergePlan) error {
	p := s.pool
	B, d := p.B, p.layout.HeadDim
	ta, tb := s.tab(upper-1, h), s.tab(upper, h)
	if err := s.samePair(upper, ta, tb); err != nil {
		return err
	}
	c := cand.Len()
	if c == 0 {
		return nil
	}
	if c > ta.n+ta.res.len() || c < ta.n && c%B != 0 || len(cand.K[0]) != c*d || len(cand.K[1]) != c*d || len(cand.V[0]) != c*d || len(cand.V[1]) != c*d {
		return fmt.Errorf("%d merge candidates do not match the tables (%d tokens in blocks of %d, %d in the residual)", c, ta.n, B, ta.res.len())
	}
	if err := checkPlan(plan, c, d); err != nil {
		return err
	}
	nb := min(c, ta.n)
	pos := cand.Pos
	ka, va, kb, vb := cand.K[0], cand.V[0], cand.K[1], cand.V[1]
	mergedIdx, retained := plan.Merged, plan.Retained
	keepN := len(retained)
	ek, ev := plan.KDir, plan.VDir
	nka, nkb, nva, nvb := plan.KNorm[0], plan.KNorm[1], plan.VNorm[0], plan.VNorm[1]

	// Blocks needed against blocks the release frees.
	grouped := !p.kc.PerToken()
	fresh := ta.mini == nil
	if fresh {
		ta.mini = &merged{pair: upper, counted: true}
		tb.mini = &merged{pair: upper - 1}
	}
	ma, mb := ta.mini, tb.mini
	need := p.regionNeed(&ma.dir, len(mergedIdx), grouped, 2) +
		p.regionNeed(&ma.ret, keepN, grouped, 1) + p.regionNeed(&mb.ret, keepN, grouped, 1)
	cb := len(ta.blocks) // blocks released
	if nb < ta.n {
		cb = nb / B
	}
	freed := 0
	for _, t := range []*table{ta, tb} {
		for _, b := range t.blocks[:cb] {
			if p.meta[b].ref == 1 {
				freed++
			}
		}
	}
	if free := p.obtainable(); free+freed < need {
		if fresh {
			ta.mini, tb.mini = nil, nil
		}
		return fmt.Errorf("%w: merging needs %d blocks, %d free", ErrNoBlocks, need, free+freed)
	}
	// Retained slots of blocks move without decoding (those of the
	// residual are encoded from full precision): stage them before the
	// release.
	var stage [2]struct{ k, v []byte }
	if keepN > 0 {
		for j, t := range []*table{ta, tb} {
			k, v := ka, va
			if j == 1 {
				k, v = kb, vb
			}
			stage[j].k = make([]byte, t.kc.BlockBytes(keepN, d))
			stage[j].v = make([]byte, p.vc.BlockBytes(keepN, d))
			for o, i := range retained {
				if i >= nb {
					if !grouped {
						t.kc.Put(stage[j].k, keepN, d, o, k[i*d:(i+1)*d])
					}
					p.vc.Put(stage[j].v, keepN, d, o, v[i*d:(i+1)*d])
					continue
				}
				b := t.blocks[i/B]
				if !grouped {
					codec.CopySlot(codec.Base(t.kc), stage[j].k, keepN, o, p.kbuf(b), B, i%B, d)
				}
				if !codec.CopySlot(p.vc, stage[j].v, keepN, o, p.vbuf(b), B, i%B, d) {
					if fresh {
						ta.mini, tb.mini = nil, nil
					}
					return fmt.Errorf("codec %s cannot move slots", p.vc.Name())
				}
			}
		}
	}
	// Release the candidates, then write the new slots.
	for _, t := range []*table{ta, tb} {
		for j := cb - 1; j >= 0; j-- {
			p.decref(t.blocks[j])
		}
		t.blocks = append(t.blocks[:0], t.blocks[cb:]...)
		t.n -= nb
		if m := c - nb; m > 0 {
			t.res.dropOldest(m, d)
		}
		t.dirty = true
	}
	s.fill([]*region{&ma.dir, &mb.dir}, len(mergedIdx), func(b int32, slot, k int) {
		i := mergedIdx[k]
		if !grouped {
			p.kc.Put(p.kbuf(b), B, d, slot, ek[i*d:(i+1)*d])
		}
		p.vc.Put(p.vbuf(b), B, d, slot, ev[i*d:(i+1)*d])
		p.posbuf(b)[slot] = pos[i]
	}, func(k int) []float32 { i := mergedIdx[k]; return ek[i*d : (i+1)*d] })
	for _, i := range mergedIdx {
		ma.kmag, ma.vmag = append(ma.kmag, nka[i]), append(ma.vmag, nva[i])
		mb.kmag, mb.vmag = append(mb.kmag, nkb[i]), append(mb.vmag, nvb[i])
	}
	for j, m := range []*merged{ma, mb} {
		keys, kc := ka, ta.kc
		if j == 1 {
			keys, kc = kb, tb.kc
		}
		sk, sv := stage[j].k, stage[j].v
		s.fill([]*region{&m.ret}, keepN, func(b int32, slot, k int) {
			if !grouped {
				codec.CopySlot(codec.Base(kc), p.kbuf(b), B, slot, sk, keepN, k, d)
			}
			codec.CopySlot(p.vc, p.vbuf(b), B, slot, sv, keepN, k, d)
			p.posbuf(b)[slot] = pos[retained[k]]
		}, func(k int) []float32 { i := retained[k]; return keys[i*d : (i+1)*d] })
	}
	s.pristine = false
	return nil
}

// regionNeed is the number of blocks fill takes to append n tokens to r,
// whose blocks are held by `holders` tables of this sequence. The caller
// holds p.mu.
func (p *Pool) regionNeed(r *region, n int, grouped bool, holders int) int {
	if n == 0 {
		return 0
	}
	need := 0
	if j := len(r.blocks) - 1; j >= 0 && !grouped && int(r.cnt[j]) < p.B {
		room := p.B - int(r.cnt[j])
		if p.meta[r.blocks[j]].ref > int32(holders) {
			need++ // copy-on-write
		}
		n = max(0, n-room)
	}
	return need + (n+p.B-1)/p.B
}

// fill appends n tokens to region rs[0] and its mirrors rs[1:] (the other
// tables of this sequence holding the same blocks). put writes token k into
// a slot (its value, its position and, unless keys are grouped, its key).
// It first tops up the last block when keys can be written slot by slot
// (copying it if another sequence shares it), then takes fresh blocks;
// grouped keys (KIVI) are quantized per channel over each fresh block's
// tokens, read through keyRow. The caller holds p.mu and has checked with
// regionNeed that the blocks are free.
func (s *Paged) fill(rs []*region, n int, put func(b int32, slot, k int), keyRow func(k int) []float32) {
	p := s.pool
	B, d := p.B, p.layout.HeadDim
	grouped := !p.kc.PerToken()
	g, _ := p.kc.(codec.Grouped)
	r := rs[0]
	k := 0
	if j := len(r.blocks) - 1; n > 0 && j >= 0 && !grouped && int(r.cnt[j]) < B {
		b, fill := r.blocks[j], int(r.cnt[j])
		if p.meta[b].ref > int32(len(rs)) {
			nb := s.mustAlloc(len(rs))
			p.copyBlock(nb, b, fill)
			for range rs {
				p.decref(b)
			}
			for _, x := range rs {
				x.blocks[j] = nb
			}
			p.stats.CopyOnWrite++
			b = nb
		}
		for ; k < n && fill < B; k, fill = k+1, fill+1 {
			put(b, fill, k)
		}
		for _, x := range rs {
			x.cnt[j] = int32(fill)
		}
	}
	var x, lo, hi []float32
	for k < n {
		b := s.mustAlloc(len(rs))
		cnt := min(B, n-k)
		for i := 0; i < cnt; i++ {
			put(b, i, k+i)
		}
		if grouped {
			if x == nil {
				x, lo, hi = make([]float32, B*d), make([]float32, d), make([]float32, d)
			}
			for i := 0; i < B; i++ {
				copy(x[i*d:(i+1)*d], keyRow(k+min(i, cnt-1))) // pad with the last row
			}
			groupRange(x[:cnt*d], d, lo, hi)
			g.EncodeRange(p.kbuf(b), B, d, x, lo, hi)
		}
		for _, x := range rs {
			x.blocks = append(x.blocks, b)
			x.cnt = append(x.cnt, int32(cnt))
		}
		k += cnt
	}
	for _, x := range rs {
		x.n += n
	}
}

// mustAlloc takes a fresh block with one reference per holder; regionNeed
// has checked there is one. The caller holds p.mu.
func (s *Paged) mustAlloc(holders int) int32 {
	p := s.pool
	b, err := p.alloc()
	if err != nil {
		panic("kvcache: merge ran out of blocks after checking for them")
	}
	for i := 1; i < holders; i++ {
		p.incref(b)
	}
	return b
}
