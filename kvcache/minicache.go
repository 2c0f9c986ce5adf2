package kvcache

// MiniCache (Liu et al., arXiv 2405.14366): the keys and values of two
// adjacent layers are merged token by token. Each vector x is split into
// its norm ‖x‖ and its direction x/‖x‖; the directions of the lower layer
// (l−1) and the upper layer (l) are interpolated on the sphere (SLERP),
//
//	Ω = arccos(û_{l−1}·û_l),  e = sin((1−t)Ω)/sinΩ · û_{l−1} + sin(tΩ)/sinΩ · û_l
//
// renormalised (a plain LERP when sinΩ ≈ 0), and restored per layer as
// x̂ = ‖x‖·e. The tokens whose layers disagree most (largest Ω/π) are
// retained unmerged in both layers.
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
// Directions are computed from what the cache holds: with a per-token
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
	"math"
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

func (m *merged) len() int { return m.dir.n + m.ret.n }

// kc is the table's own key codec (its retained tokens); the merged
// directions, shared by two layers, use the pool's.
func (m *merged) segments(p *Pool, kc codec.Codec, segs []Segment) []Segment {
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
	for j := len(m.ret.blocks) - 1; j >= 0; j-- {
		p.decref(m.ret.blocks[j])
	}
	for j := len(m.dir.blocks) - 1; j >= 0; j-- {
		p.decref(m.dir.blocks[j])
	}
}

func (m *merged) memory(p *Pool, mem *Memory) {
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

// MergeOptions are MiniCache's parameters.
type MergeOptions struct {
	// T is the SLERP weight of the upper layer, in [0, 1] (MiniCache: 0.6).
	T float64
	// Gamma is the share of the candidate tokens retained unmerged in both
	// layers: the ⌈γ·n⌉ whose key or value directions differ most between
	// the layers (largest Ω/π of the two). One reference implementation
	// keeps 5%; the paper's exact retention rule is unverified. 0 merges
	// every candidate.
	Gamma float64
	// Recent leaves the newest tokens of each table unmerged; a cut inside
	// the blocks falls on a block boundary.
	Recent int
	// Full merges a multiple of the block size only (decode-time merges:
	// a partly filled last block stays as it is).
	Full bool
}

// MergeStats counts what a merge did, summed over KV heads.
type MergeStats struct {
	Merged   int // tokens merged (stored once for both layers)
	Retained int // tokens retained whole in both layers
}

// Slerp merges the vectors of one token in two adjacent layers as MiniCache
// does: it writes into out the unit direction e interpolated from the
// lower layer's direction (weight 1−t) to the upper's (weight t), and
// returns the angle Ω between them and both norms, computed in float64.
// When sinΩ < 1e-6 the directions are interpolated linearly (LERP) and
// renormalised; a zero vector has no direction, so e is the other layer's
// direction (and Ω is reported as 0: both restore exactly).
func Slerp(lower, upper []float32, t float64, out []float32) (omega, normLower, normUpper float64) {
	d := len(out)
	lower, upper = lower[:d], upper[:d]
	for i := range d {
		normLower += float64(lower[i]) * float64(lower[i])
		normUpper += float64(upper[i]) * float64(upper[i])
	}
	normLower, normUpper = math.Sqrt(normLower), math.Sqrt(normUpper)
	var wl, wu float64 // weights of the unit vectors
	switch {
	case normLower == 0 && normUpper == 0:
		clear(out)
		return 0, 0, 0
	case normLower == 0:
		wu = 1
	case normUpper == 0:
		wl = 1
	default:
		var c float64
		for i := range d {
			c += float64(lower[i]) / normLower * (float64(upper[i]) / normUpper)
		}
		omega = math.Acos(max(-1, min(1, c)))
		if s := math.Sin(omega); s < 1e-6 {
			wl, wu = 1-t, t
		} else {
			wl, wu = math.Sin((1-t)*omega)/s, math.Sin(t*omega)/s
		}
	}
	if normLower > 0 {
		wl /= normLower
	}
	if normUpper > 0 {
		wu /= normUpper
	}
	var n float64
	for i := range d {
		e := wl*float64(lower[i]) + wu*float64(upper[i])
		n += e * e
	}
	if n == 0 { // antipodal directions with t = 0.5: take the upper one
		wl, wu, n = 0, 1/normUpper, 1
	}
	n = math.Sqrt(n)
	for i := range d {
		out[i] = float32((wl*float64(lower[i]) + wu*float64(upper[i])) / n)
	}
	return omega, normLower, normUpper
}

// MergeLayers merges the tables of layers upper−1 and upper, for every KV
// head, MiniCache's way: the candidate tokens are the tables' oldest
// unmerged ones, all but the newest max(opt.Recent, KIVI residual R), and
// must hold the same positions in both layers. Of them the ⌈γ·n⌉ most
// distant stay whole in both layers; the others are replaced by one shared
// unit direction per token (keys and values, in the pool's codecs) plus
// each layer's norms. The old blocks are released before the new ones are
// taken, so a merge needs no spare blocks beyond what the directions of a
// small merge may add (ErrNoBlocks otherwise, with that head unchanged;
// heads merged before an error stay merged). A pair can be merged again
// later (the new tokens are appended); a layer belongs to one pair only.
func (s *Paged) MergeLayers(upper int, opt MergeOptions) (MergeStats, error) {
	var st MergeStats
	p := s.pool
	L := p.layout
	switch {
	case s.freed:
		return st, errors.New("kvcache: merge of a freed sequence")
	case upper < 1 || upper >= L.Layers:
		return st, fmt.Errorf("kvcache: cannot merge layers %d and %d of %d", upper-1, upper, L.Layers)
	case !(opt.T >= 0 && opt.T <= 1):
		return st, fmt.Errorf("kvcache: SLERP weight t=%g must be in [0,1]", opt.T)
	case !(opt.Gamma >= 0 && opt.Gamma <= 1):
		return st, fmt.Errorf("kvcache: retention share γ=%g must be in [0,1]", opt.Gamma)
	case opt.Recent < 0:
		return st, fmt.Errorf("kvcache: negative recent window %d", opt.Recent)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for h := 0; h < L.KVHeads; h++ {
		m, r, err := s.mergeHead(upper, h, opt)
		if err != nil {
			return st, fmt.Errorf("kvcache: merging layers %d and %d, head %d: %w", upper-1, upper, h, err)
		}
		st.Merged += m
		st.Retained += r
	}
	return st, nil
}

// mergeHead merges one KV head's pair of tables. The caller holds p.mu.
func (s *Paged) mergeHead(upper, h int, opt MergeOptions) (nMerged, nRetained int, err error) {
	p := s.pool
	B, d := p.B, p.layout.HeadDim
	ta, tb := s.tab(upper-1, h), s.tab(upper, h)
	if ta.mini != nil && ta.mini.pair != upper || tb.mini != nil && tb.mini.pair != upper-1 {
		return 0, 0, errors.New("a layer is already merged with another layer")
	}
	resN := func(t *table) int {
		if t.res == nil {
			return 0
		}
		return t.res.n
	}
	if ta.n != tb.n || resN(ta) != resN(tb) {
		return 0, 0, fmt.Errorf("the layers hold %d+%d and %d+%d tokens in blocks and residual", ta.n, resN(ta), tb.n, resN(tb))
	}
	// Candidates: the oldest c tokens of blocks then residual, leaving the
	// newest max(Recent, KIVI residual) tokens; the blocks left must start
	// on a block boundary.
	total := ta.n + resN(ta)
	c := max(0, total-max(opt.Recent, p.residual))
	if opt.Full || c < ta.n {
		c = c / B * B
	}
	if c == 0 {
		return 0, 0, nil
	}
	nb := min(c, ta.n) // candidates in blocks; the others are in the residual
	// Candidates, decoded, in both layers; their positions must agree.
	pos := make([]int32, c)
	ka, va := make([]float32, c*d), make([]float32, c*d)
	kb, vb := make([]float32, c*d), make([]float32, c*d)
	for j, t := range []*table{ta, tb} {
		k, v := ka, va
		if j == 1 {
			k, v = kb, vb
		}
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
				pos[i] = q
			} else if q != pos[i] {
				return 0, 0, fmt.Errorf("slot %d holds position %d in one layer and %d in the other (pruned tables cannot be merged)", i, pos[i], q)
			}
		}
	}
	// Directions, norms and each token's distance.
	ek, ev := make([]float32, c*d), make([]float32, c*d)
	nka, nkb := make([]float32, c), make([]float32, c)
	nva, nvb := make([]float32, c), make([]float32, c)
	dist := make([]float64, c)
	for i := 0; i < c; i++ {
		x := i * d
		wk, a, b := Slerp(ka[x:x+d], kb[x:x+d], opt.T, ek[x:x+d])
		nka[i], nkb[i] = float32(a), float32(b)
		wv, a, b := Slerp(va[x:x+d], vb[x:x+d], opt.T, ev[x:x+d])
		nva[i], nvb[i] = float32(a), float32(b)
		dist[i] = max(wk, wv) / math.Pi
	}
	keepN := min(c, int(math.Ceil(opt.Gamma*float64(c)-1e-9)))
	order := make([]int, c)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int {
		switch {
		case dist[x] > dist[y]:
			return -1
		case dist[x] < dist[y]:
			return 1
		}
		return x - y
	})
	retained := slices.Clone(order[:keepN])
	mergedIdx := slices.Clone(order[keepN:])
	slices.Sort(retained)
	slices.Sort(mergedIdx)

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
		return 0, 0, fmt.Errorf("%w: merging needs %d blocks, %d free", ErrNoBlocks, need, free+freed)
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
					return 0, 0, fmt.Errorf("codec %s cannot move slots", p.vc.Name())
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
	return len(mergedIdx), keepN, nil
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
