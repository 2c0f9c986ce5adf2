package policy

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
)

// State applies a policy to one sequence. Use it in three places:
//
//	st.BeginPrefill(len(prompt)); seq.Forward(prompt); st.Compress()  // once after prefill
//	st.Before(1); seq.Forward([]int{tok})                               // each decode step
//
// It installs itself as the sequence's attention-mass hook when its scorer
// needs attention, and keeps, per (layer, KV head), the score and the
// original position of every stored slot, compacted along with the cache.
type State struct {
	cfg   Config
	kind  kind
	seq   *model.Sequence
	cache *kvcache.Paged
	L, H  int

	scores [][]float32 // [layer·H + head][slot] accumulated or last mass
	orig   [][]int32   // [layer·H + head][slot] original position (token index)
	seen   int         // tokens run through the sequence so far
	steps  int         // decode steps since the start
	prefT  int         // tokens of the prefill in progress (0: none)
	prefAt int         // history index where that prefill starts

	rot *model.Rotator // re-rotates keys (re-indexing, LM-Infinite's cap)

	Pruned int // prunes applied

	pyr *pyramid // pyramidinfer's own schedule (pyramidinfer.go); nil for the others
}

// New attaches a policy to a sequence whose cache is a *kvcache.Paged.
func New(cfg Config, seq *model.Sequence) (*State, error) {
	cfg, err := cfg.Normalize()
	if err != nil {
		return nil, err
	}
	cache, ok := seq.Cache().(*kvcache.Paged)
	if !ok {
		return nil, errors.New("policy: the sequence's cache is not paged")
	}
	k, _ := methodKind(cfg.Method)
	l := cache.Layout()
	if k == kindMerge && len(cfg.MergedPairs(l.Layers)) == 0 {
		return nil, fmt.Errorf("policy: minicache has no layer pair to merge from layer %d of %d", max(cfg.MergeFrom, l.Layers/2), l.Layers)
	}
	st := &State{cfg: cfg, kind: k, seq: seq, cache: cache, L: l.Layers, H: l.KVHeads,
		scores: make([][]float32, l.Layers*l.KVHeads), orig: make([][]int32, l.Layers*l.KVHeads), seen: seq.Pos()}
	for i := range st.orig {
		st.orig[i] = cache.Positions(i/st.H, i%st.H)
	}
	if k != kindNone {
		seq.Mass = st
	}
	if k == kindPyramid { // hook: pyramidinfer.go
		st.pyr = newPyramid(st)
		seq.Prune = st.pyr
	}
	if cfg.Every > 0 && k != kindMerge { // merging (minicache) does not bound the cache
		// Eviction during decoding bounds the cache: positions may run on.
		seq.MaxPos = math.MaxInt32
	}
	if kg, _ := cache.Pool().Codecs(); !kg.PerToken() {
		if cfg.Positions == PosReindex {
			return nil, fmt.Errorf("policy: re-indexed positions need per-token keys; %s keys are sealed in groups", kg.Name())
		}
		if cfg.Method == "lminfinite" {
			return nil, fmt.Errorf("policy: lminfinite moves its global tokens at every step, which needs per-token keys; %s keys are sealed in groups", kg.Name())
		}
	}
	return st, nil
}

// Config is the normalized configuration.
func (st *State) Config() Config { return st.cfg }

// BeginPrefill announces that the next forward steps run the n tokens of a
// prompt, so the scorers watch the right queries (SnapKV's observation
// window is the prompt's last W tokens).
//
// With a KIVI cache the prompt stays in full precision until Compress, so
// it is compressed first and quantized after.
func (st *State) BeginPrefill(n int) {
	st.prefT, st.prefAt = n, st.seen
	if st.pyr != nil { // hook: pyramidinfer.go
		st.pyr.begin(n)
	}
	if st.kind != kindNone {
		st.cache.HoldSeal(true)
	}
}

// Request implements model.MassHook.
func (st *State) Request(layer, start, n int) *attention.MassRequest {
	if st.pyr != nil { // hook: pyramidinfer.go
		return st.pyr.request(layer, start, n)
	}
	// New slots were appended to the layer's tables: track their origin.
	for h := 0; h < st.H; h++ {
		t := layer*st.H + h
		for i := 0; i < n; i++ {
			st.orig[t] = append(st.orig[t], int32(start+i))
		}
	}
	if layer == st.L-1 {
		st.seen = start + n
	}
	from := -1
	switch st.kind {
	case kindAccum:
		from = 0
	case kindLast:
		from = n - 1
	case kindSnap:
		if st.prefT > 0 {
			w := st.prefAt + st.prefT - min(st.cfg.Window, st.prefT) // first observed token
			if start+n > w {
				from = max(0, w-start)
			}
		} else if st.cfg.Every > 0 {
			from = 0 // during decoding: the queries since the last prune
		}
	}
	if from < 0 {
		return nil
	}
	req := &attention.MassRequest{From: from, Agg: st.cfg.Agg, Out: make([][]float32, st.H)}
	for h := range req.Out {
		req.Out[h] = make([]float32, st.cache.Slots(layer, h))
	}
	return req
}

// Done implements model.MassHook: it adds (or, for TOVA, sets) the mass.
func (st *State) Done(layer int, req *attention.MassRequest, _ []float32, _ []int32) {
	if st.pyr != nil { // hook: pyramidinfer.go
		st.pyr.done(layer, req)
		return
	}
	for h, m := range req.Out {
		t := layer*st.H + h
		sc := st.scores[t]
		for len(sc) < len(m) {
			sc = append(sc, 0)
		}
		if st.kind == kindLast {
			copy(sc, m)
		} else {
			for i, v := range m {
				sc[i] += v
			}
		}
		st.scores[t] = sc
	}
}

// Compress prunes the cache once, after a prefill, to the budget.
func (st *State) Compress() error {
	defer func() { st.prefT = 0 }()
	if st.kind == kindNone {
		return nil
	}
	if st.pyr != nil { // hook: pyramidinfer.go (the prompt was pruned during the prefill)
		err := st.pyr.compress()
		if herr := st.cache.HoldSeal(false); err == nil {
			err = herr
		}
		return err
	}
	if st.kind == kindMerge { // hook: minicache.go (layers merged, no token dropped)
		err := st.merge(false)
		if herr := st.cache.HoldSeal(false); err == nil {
			err = herr
		}
		return err
	}
	if err := st.prune(0); err != nil {
		st.cache.HoldSeal(false)
		return err
	}
	return st.cache.HoldSeal(false)
}

// Before runs the decoding-time schedule before a forward step of incoming
// tokens: every Every steps, tables holding more than the budget are pruned
// so that, with the incoming tokens, they hold at most the budget. It also
// applies LM-Infinite's distance cap to the global tokens.
func (st *State) Before(incoming int) error {
	if st.pyr != nil { // hook: pyramidinfer.go
		return st.pyr.before()
	}
	if st.kind == kindMerge { // hook: minicache.go
		return st.mergeBefore()
	}
	if st.kind == kindNone || st.cfg.Every <= 0 {
		return nil
	}
	st.steps++
	if st.steps%st.cfg.Every == 0 {
		over := false
		for t := range st.orig {
			if st.cache.Slots(t/st.H, t%st.H)+incoming > st.budget(st.seen+incoming) {
				over = true
				break
			}
		}
		if over {
			if err := st.prune(incoming); err != nil {
				return err
			}
		}
	}
	if st.cfg.Method == "lminfinite" {
		return st.capDistance(incoming)
	}
	return nil
}

// budget is the per-table budget for a sequence of n tokens.
func (st *State) budget(n int) int {
	if st.cfg.Budget > 0 {
		return st.cfg.Budget
	}
	return max(1, int(math.Ceil(st.cfg.Ratio*float64(n))))
}

// prune brings every table to its budget minus room for incoming tokens.
func (st *State) prune(incoming int) error {
	c := st.cfg
	b, sinks, window, err := c.pruneShape(st.kind, st.budget(st.seen+incoming), incoming)
	if err != nil {
		return err // Normalize refuses the budgets this can happen with, for one incoming token
	}
	for l := 0; l < st.L; l++ {
		budgets := make([]int, st.H)
		for h := range budgets {
			budgets[h] = b
		}
		var scores [][]float32
		switch st.kind {
		case kindSnap:
			scores = make([][]float32, st.H)
			for h := range scores {
				scores[h] = st.snapScores(l, h, window)
			}
			switch c.Method {
			case "pyramidkv":
				pb := pyramidBudgets(b, window, st.cache.Slots(l, 0), st.L, c.Beta)[l]
				for h := range budgets {
					budgets[h] = max(pb, window)
				}
			case "adakv":
				cand := make([][]float32, st.H)
				for h := range cand {
					n := st.cache.Slots(l, h)
					cand[h] = scores[h][:max(0, n-window)]
				}
				for h, ab := range adaBudgets(cand, b-window, c.Alpha) {
					budgets[h] = ab + window
				}
			}
		case kindLast:
			// TOVA: one token set per layer, by the attention of all heads.
			shared := make([]float32, st.cache.Slots(l, 0))
			for h := 0; h < st.H; h++ {
				for i, v := range st.scores[l*st.H+h] {
					if i < len(shared) {
						shared[i] += v / float32(st.H)
					}
				}
			}
			scores = make([][]float32, st.H)
			for h := range scores {
				scores[h] = shared
			}
		case kindAccum:
			scores = st.scores[l*st.H : (l+1)*st.H]
		case kindNorm:
			scores = make([][]float32, st.H)
			for h := range scores {
				scores[h] = st.normScores(l, h)
			}
		}
		for h := 0; h < st.H; h++ {
			t := l*st.H + h
			n := st.cache.Slots(l, h)
			var sc []float32
			if scores != nil {
				sc = scores[h]
			}
			keep := Keep(n, budgets[h], sinks, window, sc)
			if len(keep) == n {
				continue
			}
			if err := st.cache.Keep(l, h, keep); err != nil {
				return err
			}
			st.orig[t] = gather32(st.orig[t], keep)
			st.scores[t] = gatherF(st.scores[t], keep)
		}
	}
	if st.kind == kindSnap && st.prefT == 0 {
		// During decoding the observation window restarts after each prune.
		for t := range st.scores {
			clear(st.scores[t])
		}
	}
	st.Pruned++
	if c.Positions == PosReindex {
		return st.reindex()
	}
	return nil
}

// snapScores is SnapKV's score of each slot before the window: the pooled
// attention mass the observation window gave it. Window slots score +Inf
// (they are kept anyway).
func (st *State) snapScores(l, h, window int) []float32 {
	n := st.cache.Slots(l, h)
	raw := make([]float32, n)
	copy(raw, st.scores[l*st.H+h])
	cut := max(0, n-window)
	out := make([]float32, n)
	copy(out, pool1d(raw[:cut], st.cfg.Kernel, st.cfg.Pool))
	for i := cut; i < n; i++ {
		out[i] = float32(math.Inf(1))
	}
	return out
}

// normScores is the key-norm baseline: −‖k‖, small keys kept.
func (st *State) normScores(l, h int) []float32 {
	d := st.cache.Layout().HeadDim
	row := make([]float32, d)
	var out []float32
	for _, seg := range st.cache.Segments(l, h) {
		for i := 0; i < seg.N; i++ {
			seg.KC.Get(seg.K, seg.Cap, d, i, row)
			var s float64
			for _, v := range row {
				s += float64(v) * float64(v)
			}
			out = append(out, -float32(math.Sqrt(s)))
		}
	}
	return out
}

// reindex renumbers every table's slots 0..n-1 (re-rotating the keys) and
// moves the sequence's next position to the cache length.
func (st *State) reindex() error {
	n := st.cache.Slots(0, 0)
	m := st.rotator()
	for t := range st.orig {
		l, h := t/st.H, t%st.H
		if st.cache.Slots(l, h) != n {
			return errors.New("policy: re-indexed positions need the same number of tokens in every head")
		}
		slots := make([]int, n)
		for i := range slots {
			slots[i] = i
		}
		i := 0
		err := st.cache.RewriteKeys(l, h, slots, func(pos int32, key []float32) int32 {
			np := int32(i)
			m.Rotate(key, int(np-pos))
			i++
			return np
		})
		if err != nil {
			return err
		}
	}
	st.seq.SetPos(n)
	return nil
}

// capDistance is LM-Infinite's cap: a global (sink) token is never seen
// further away than the local window, so before each step the sinks move
// to position next−Window when that is later than where they are.
func (st *State) capDistance(incoming int) error {
	next := int32(st.seq.Pos())
	target := next - int32(st.cfg.Window)
	m := st.rotator()
	for t := range st.orig {
		l, h := t/st.H, t%st.H
		s := min(st.cfg.Sinks, st.cache.Slots(l, h))
		slots := make([]int, s)
		for i := range slots {
			slots[i] = i
		}
		err := st.cache.RewriteKeys(l, h, slots, func(pos int32, key []float32) int32 {
			if target <= pos {
				return pos
			}
			m.Rotate(key, int(target-pos))
			return target
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// rotator re-rotates keys for re-indexing, with cached tables.
func (st *State) rotator() *model.Rotator {
	if st.rot == nil {
		st.rot = st.seq.Model().NewRotator()
	}
	return st.rot
}

// Kept returns, for each layer and KV head, the sorted original positions
// of the tokens left in the cache.
func (st *State) Kept() [][][]int32 {
	out := make([][][]int32, st.L)
	for l := range out {
		out[l] = make([][]int32, st.H)
		for h := range out[l] {
			out[l][h] = append([]int32(nil), st.orig[l*st.H+h]...)
		}
	}
	return out
}

// KeptPerLayer is the number of tokens each layer keeps, summed over its
// heads.
func (st *State) KeptPerLayer() []int {
	out := make([]int, st.L)
	for t := range st.orig {
		out[t/st.H] += st.cache.Slots(t/st.H, t%st.H)
	}
	return out
}

func gather32(x []int32, keep []int) []int32 {
	out := make([]int32, 0, len(keep))
	for _, i := range keep {
		if i < len(x) {
			out = append(out, x[i])
		}
	}
	return out
}

func gatherF(x []float32, keep []int) []float32 {
	out := make([]float32, 0, len(keep))
	for _, i := range keep {
		if i < len(x) {
			out = append(out, x[i])
		} else {
			out = append(out, 0)
		}
	}
	return out
}
