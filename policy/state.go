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
// It installs itself as the sequence's attention-mass hook when the method
// runs at all, and keeps, per (layer, KV head), the score and the original
// position of every stored slot, compacted along with the cache. What it
// does at each call is the method's: the shared prune of a Scorer, or a
// Runner's own schedule.
//
// Layers are the cache's (owner) layers. On a model whose layers share KV
// (CLA, YOCO, Layer-Condensed KV) the model calls Request and Done once per
// model layer that reads a cache layer, in layer order, so a cache layer c
// gets Layout.Readers[c] calls a step; their attention is aggregated like
// the query heads of a group (Config.Agg: the mean by default, see
// addMass), and a cache layer's new slots are tracked once, whichever
// reader comes first (sync).
type State struct {
	cfg    Config
	method *Method
	run    Runner // nil: full
	seq    *model.Sequence
	cache  kvcache.Compacted
	L, H   int

	scores [][]float32 // [layer·H + head][slot] accumulated or last mass
	orig   [][]int32   // [layer·H + head][slot] original position (token index)
	seen   int         // tokens run through the sequence so far
	steps  int         // decode steps since the start
	prefT  int         // tokens of the prefill in progress (0: none)
	prefAt int         // history index where that prefill starts

	rot     *model.Rotator // re-rotates keys (re-indexing, LM-Infinite's cap)
	anchors [][]anchor     // [layer·H + head] decoded copies of the sinks' keys that moveKeys moves (anchor.go)

	readers []int       // [layer] model layers reading each cache layer (Layout.Readers; 1 each when nil)
	calls   []stepCalls // [layer] the hook's calls for the current step
	stepMax [][]float32 // [layer·H + head][slot] Agg max over several readers: this step's maximum so far
	err     error       // the origins lost track of the cache (reported by Compress and Before)

	Pruned int // prunes applied
}

// stepCalls counts the mass hook's calls for one cache layer in one
// forward step: the k-th Request of a step is the k-th reader's.
type stepCalls struct {
	step      int // the sequence's Computed count during that step (it moves after every step)
	req, done int // Requests and Dones of the step so far
	added     int // slots of the step's tokens tracked so far (sync)
}

// New attaches a policy to a sequence whose cache can be compacted
// (kvcache.Compacted, the policy's view of the cache).
func New(cfg Config, seq *model.Sequence) (*State, error) {
	cfg, err := cfg.Normalize()
	if err != nil {
		return nil, err
	}
	cache, ok := seq.Cache().(kvcache.Compacted)
	if !ok {
		return nil, errors.New("policy: the sequence's cache cannot be compacted")
	}
	m := registry[cfg.Method]
	l := cache.Layout()
	kg, _ := cache.Codecs()
	if err := check(cfg, m, l, kg); err != nil {
		return nil, err
	}
	st := &State{cfg: cfg, method: m, seq: seq, cache: cache, L: l.Layers, H: l.KVHeads,
		scores: make([][]float32, l.Layers*l.KVHeads), orig: make([][]int32, l.Layers*l.KVHeads), seen: seq.Pos(),
		readers: make([]int, l.Layers), calls: make([]stepCalls, l.Layers)}
	for c := range st.readers {
		st.readers[c] = 1
		if l.Readers != nil {
			st.readers[c] = max(1, l.Readers[c])
		}
		st.calls[c].step = -1
	}
	for i := range st.orig {
		st.orig[i] = cache.Positions(i/st.H, i%st.H)
	}
	switch {
	case m.prunes():
		sc := m.Scorer
		if m.NewScorer != nil {
			sc = m.NewScorer(st)
		}
		st.run = &pruner{st: st, sc: sc}
		if cfg.Every > 0 {
			// Eviction during decoding bounds the cache: positions may run on.
			seq.MaxPos = math.MaxInt32
		}
	case m.Run != nil:
		if st.run, err = m.Run(st); err != nil {
			return nil, err
		}
	}
	if st.run != nil {
		seq.Mass = st
	}
	return st, nil
}

// Config is the normalized configuration.
func (st *State) Config() Config { return st.cfg }

// Sequence is the sequence the policy is attached to.
func (st *State) Sequence() *model.Sequence { return st.seq }

// Cache is the sequence's cache.
func (st *State) Cache() kvcache.Compacted { return st.cache }

// BeginPrefill announces that the next forward steps run the n tokens of a
// prompt, so the scorers watch the right queries (SnapKV's observation
// window is the prompt's last W tokens).
//
// With a KIVI cache the prompt stays in full precision until Compress, so
// it is compressed first and quantized after.
func (st *State) BeginPrefill(n int) {
	st.prefT, st.prefAt = n, st.seen
	if st.run != nil {
		st.run.Begin(n)
		st.cache.HoldSeal(true)
	}
}

// Request implements model.MassHook: layer is a cache layer, asked once
// per model layer that reads it.
func (st *State) Request(layer, start, n int) *attention.MassRequest {
	c := &st.calls[layer]
	if c.step != st.seq.Computed {
		*c = stepCalls{step: st.seq.Computed}
	}
	c.req++
	if c.req > st.readers[layer] && st.err == nil {
		st.err = fmt.Errorf("policy: cache layer %d was asked %d times in one forward step, but %d model layers read it (Layout.Readers)", layer, c.req, st.readers[layer])
	}
	return st.run.Request(layer, start, n)
}

// Done implements model.MassHook.
func (st *State) Done(layer int, req *attention.MassRequest, q []float32, pos []int32) {
	st.calls[layer].done++
	st.run.Done(layer, req, q, pos)
}

// PromptRows is how many of the last rows of a forward step of n tokens
// (history [start, start+n)) the method scores the attention (or the
// queries) of: a model that computes only a prompt chunk's last row in the
// layers above its last KV owner (prefill early exit), or none of them when
// no logits are wanted, must compute these rows there too, or the
// attention of those layers, which read a cache layer as much as the layers
// below, is missing from its scores. 0 for a method that scores no
// attention (window, streaming, knorm, keydiff, minicache).
func (st *State) PromptRows(start, n int) int {
	switch r := st.run.(type) {
	case nil:
		return 0
	case *pruner:
		return min(n, max(0, r.sc.Rows(st, start, n)))
	case interface{ PromptRows(start, n int) int }:
		return min(n, max(0, r.PromptRows(start, n)))
	}
	return n
}

// reader is which reader of cache layer layer the current call is (0 for
// the first model layer reading it in this step), from its Requests.
func (st *State) reader(layer int) int { return st.calls[layer].req - 1 }

// doneIndex is how many Dones of cache layer layer preceded the current
// one in this step.
func (st *State) doneIndex(layer int) int { return st.calls[layer].done - 1 }

// Compress prunes the cache once, after a prefill, to the budget.
func (st *State) Compress() error {
	defer func() { st.prefT = 0 }()
	if st.run == nil {
		return nil
	}
	if st.err != nil {
		return st.err
	}
	err := st.run.Compress()
	if herr := st.cache.HoldSeal(false); err == nil {
		err = herr
	}
	return err
}

// Before runs the decoding-time schedule before a forward step of incoming
// tokens: for a scorer, every Every steps, tables holding more than the
// budget are pruned so that, with the incoming tokens, they hold at most
// the budget.
func (st *State) Before(incoming int) error {
	if st.run == nil {
		return nil
	}
	if st.err != nil {
		return st.err
	}
	return st.run.Before(incoming)
}

// sync brings the origins (and scores) of layer's tables in line with the
// cache when a reader of layer is about to run the queries of tokens
// [start, start+n), the last of the step (a reader above the last KV
// owner may run only the step's last rows during a prefill). The step's
// new slots are those at positions from the sequence's next position on
// (every slot stored before the step lies before it): the layer's owner
// appended them before its own call, which comes first for an owner read
// by later layers and last for one read by earlier layers (Layer-Condensed
// KV), so a call may find them there or not yet. A window-bounded layer
// may have freed its oldest slots as the owner appended (Layout.Windows):
// they leave the front of the tables. Called at every reader's Request; a
// later reader of the step finds nothing new.
func (st *State) sync(layer, start, n int) {
	st.seen = max(st.seen, start+n)
	p0 := int32(st.seq.Pos())
	added := st.calls[layer].added
	for h := 0; h < st.H; h++ {
		t := layer*st.H + h
		s, m := st.cache.Slots(layer, h), len(st.orig[t])
		a := 0 // trailing slots at positions of this step
		segs := st.cache.Segments(layer, h)
	scan:
		for i := len(segs) - 1; i >= 0; i-- {
			for j := segs[i].N - 1; j >= 0; j-- {
				if segs[i].Pos[j] < p0 {
					break scan
				}
				a++
			}
		}
		fresh := a - st.calls[layer].added // not tracked by an earlier reader of the step
		if fresh > n || fresh < 0 || m+fresh < s {
			st.err = fmt.Errorf("policy: cache layer %d head %d holds %d slots, %d of them new, for %d tracked and a step of %d tokens: the policy lost track of the cache", layer, h, s, a, m, n)
			continue
		}
		if d := m + fresh - s; d > 0 {
			st.orig[t] = st.orig[t][d:]
			st.scores[t] = dropFront(st.scores[t], d)
			if st.stepMax != nil {
				st.stepMax[t] = dropFront(st.stepMax[t], d)
			}
		}
		for i := 0; i < fresh; i++ {
			st.orig[t] = append(st.orig[t], int32(start+n-fresh+i))
		}
		added = max(added, a)
	}
	st.calls[layer].added = added
}

// dropFront drops the first d entries of x (as many as it has).
func dropFront(x []float32, d int) []float32 { return x[min(d, len(x)):] }

// massRequest is a request with Out sized to layer's tables.
func (st *State) massRequest(layer int, req *attention.MassRequest) *attention.MassRequest {
	req.Out = make([][]float32, st.H)
	for h := range req.Out {
		req.Out[h] = make([]float32, st.cache.Slots(layer, h))
	}
	return req
}

// addMass adds a filled request's mass to the layer's scores. With
// several readers of the layer, their attention is aggregated as the query
// heads of a group are (Config.Agg): the mean (each reader adds its mass
// divided by the number of readers), the sum, or the maximum over the
// step's readers of each reader's mass for the step (a running maximum:
// each reader adds what it raises the step's maximum by). For a step of
// one query (decoding) that is the maximum over every query head of every
// reader; for a step of several queries it is the maximum over readers of
// their per-reader sums over the step's queries (the kernel returns no
// per-query rows).
func (st *State) addMass(layer int, req *attention.MassRequest) {
	R := st.readers[layer]
	if R == 1 {
		for h, m := range req.Out {
			sc := st.grow(layer*st.H+h, len(m))
			for i, v := range m {
				sc[i] += v
			}
		}
		return
	}
	switch st.cfg.Agg {
	case attention.AggMax:
		first := st.doneIndex(layer) == 0
		if st.stepMax == nil {
			st.stepMax = make([][]float32, len(st.scores))
		}
		for h, m := range req.Out {
			t := layer*st.H + h
			sc := st.grow(t, len(m))
			if first {
				st.stepMax[t] = st.stepMax[t][:0]
			}
			for len(st.stepMax[t]) < len(m) {
				st.stepMax[t] = append(st.stepMax[t], 0)
			}
			top := st.stepMax[t]
			for i, v := range m {
				if v > top[i] {
					sc[i] += v - top[i]
					top[i] = v
				}
			}
		}
	case attention.AggSum:
		for h, m := range req.Out {
			sc := st.grow(layer*st.H+h, len(m))
			for i, v := range m {
				sc[i] += v
			}
		}
	default:
		r := float32(R)
		for h, m := range req.Out {
			sc := st.grow(layer*st.H+h, len(m))
			for i, v := range m {
				sc[i] += v / r
			}
		}
	}
}

// grow makes table t's scores at least n long and returns them.
func (st *State) grow(t, n int) []float32 {
	sc := st.scores[t]
	for len(sc) < n {
		sc = append(sc, 0)
	}
	st.scores[t] = sc
	return sc
}

// Scores is table (layer, head)'s score of each slot, as the method's
// mass accumulated it (read-only).
func (st *State) Scores(layer, head int) []float32 { return st.scores[layer*st.H+head] }

// budget is the per-table budget for a sequence of n tokens.
func (st *State) budget(n int) int {
	if st.cfg.Budget > 0 {
		return st.cfg.Budget
	}
	return max(1, int(math.Ceil(st.cfg.Ratio*float64(n))))
}

// pruner runs a Scorer: the shared prune after the prompt and on the
// decoding schedule.
type pruner struct {
	st *State
	sc Scorer
}

func (p *pruner) Begin(int) {}

func (p *pruner) Request(layer, start, n int) *attention.MassRequest {
	p.st.sync(layer, start, n)
	req := p.sc.Mass(p.st, layer, start, n)
	if req == nil {
		return nil
	}
	return p.st.massRequest(layer, req)
}

func (p *pruner) Done(layer int, req *attention.MassRequest, q []float32, pos []int32) {
	p.sc.Done(p.st, layer, req, q, pos)
}

func (p *pruner) Compress() error { return p.st.prune(p.sc, 0) }

func (p *pruner) Before(incoming int) error {
	st := p.st
	if st.cfg.Every <= 0 {
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
			if err := st.prune(p.sc, incoming); err != nil {
				return err
			}
		}
	}
	return p.sc.Step(st, incoming)
}

// prune brings every table to its budget minus room for incoming tokens.
func (st *State) prune(sc Scorer, incoming int) error {
	c := st.cfg
	b, sinks, window, err := c.pruneShape(st.method, st.budget(st.seen+incoming), incoming)
	if err != nil {
		return err // Normalize refuses the budgets this can happen with, for one incoming token
	}
	for l := 0; l < st.L; l++ {
		scores := sc.Scores(st, l, window)
		budgets := sc.Budgets(st, l, b, window, scores)
		for h := 0; h < st.H; h++ {
			t := l*st.H + h
			n := st.cache.Slots(l, h)
			var s []float32
			if scores != nil {
				s = scores[h]
			}
			bh := b
			if budgets != nil {
				bh = budgets[h]
			}
			if gone, ok := Dropped(n, bh, sinks, window, s); ok {
				// A few slots (a decode step's prune): dropped as such, in
				// time independent of the table's length.
				if len(gone) == 0 {
					continue
				}
				if err := st.cache.Drop(l, h, gone); err != nil {
					return err
				}
				st.orig[t] = dropAt(st.orig[t], gone)
				st.scores[t] = dropAt(st.scores[t], gone)
				for len(st.scores[t]) < n-len(gone) { // as gatherF: slots not scored yet score 0
					st.scores[t] = append(st.scores[t], 0)
				}
				continue
			}
			keep := Keep(n, bh, sinks, window, s)
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
	sc.Pruned(st)
	st.Pruned++
	if c.Positions == PosReindex {
		return st.reindex()
	}
	return nil
}

// keyRows calls f with each stored key of table (layer, head), decoded,
// in slot order.
func (st *State) keyRows(layer, head int, f func(i int, key []float32)) {
	st.rows(layer, head, true, f)
}

// rows calls f with each stored key (keys) or value of table (layer,
// head), decoded, in slot order.
func (st *State) rows(layer, head int, keys bool, f func(i int, row []float32)) {
	d := st.cache.Layout().HeadDim
	row := make([]float32, d)
	i := 0
	for _, seg := range st.cache.Segments(layer, head) {
		for j := 0; j < seg.N; j++ {
			if keys {
				seg.KC.Get(seg.K, seg.Cap, d, j, row)
			} else {
				seg.VC.Get(seg.V, seg.Cap, d, j, row)
			}
			f(i, row)
			i++
		}
	}
}

// reindex renumbers every table's slots to consecutive positions
// (re-rotating the keys that move): StreamingLLM's positions inside the
// cache, where slot i sits i places after the first and the next token
// right after the last. Attention under RoPE sees only the distance between
// a query and a key, so the run may start at any offset: while decoding
// prunes (Config.Every > 0) it starts at next − n, which keeps the next
// token at its own position and leaves in place every key already at its
// slot's position — under streaming all but the sinks, so a step rewrites
// sinks·layers·heads keys, not the whole cache. When the offset passes
// twice the cache length (or the prompt alone was pruned, so the model's
// context bounds what follows), the run is rebased to 0..n−1 once, so
// positions stay below 3n + 1 and the keys are rotated back only then.
func (st *State) reindex() error {
	n := st.cache.Slots(0, 0)
	next := st.seq.Pos()
	off := next - n
	if st.cfg.Every <= 0 || off < 0 || off > 2*n {
		off = 0
	}
	slots := make([]int, 0, n)
	for t := range st.orig {
		l, h := t/st.H, t%st.H
		if st.cache.Slots(l, h) != n {
			return errors.New("policy: re-indexed positions need the same number of tokens in every head")
		}
		slots = slots[:0]
		i := 0
		for _, seg := range st.cache.Segments(l, h) { // the positions in slot order, read in place
			for _, p := range seg.Pos[:seg.N] {
				if int(p) != off+i {
					slots = append(slots, i)
				}
				i++
			}
		}
		if len(slots) == 0 {
			continue
		}
		if err := st.moveKeys(l, h, slots, func(k int, _ int32) int32 { return int32(off + slots[k]) }); err != nil {
			return err
		}
	}
	st.seq.SetPos(off + n)
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

// gather32 keeps x[i] for i in keep (ascending), in place: x[i] is read
// before anything at or after i is written (the j-th kept value goes to
// index j ≤ keep[j]), so that a prune does not allocate them anew.
func gather32(x []int32, keep []int) []int32 {
	out := x[:0]
	for _, i := range keep {
		if i < len(x) {
			out = append(out, x[i])
		}
	}
	return out
}

// dropAt removes x[i] for i in gone (ascending) from x, in place, the
// rest in order; indexes past len(x) are ignored.
func dropAt[T int32 | float32](x []T, gone []int) []T {
	w, from := 0, 0
	for _, i := range gone {
		if i >= len(x) {
			break
		}
		w += copy(x[w:], x[from:i])
		from = i + 1
	}
	w += copy(x[w:], x[from:])
	return x[:w]
}

// gatherF is gather32 for scores, 0 for the kept slots past len(x) (slots
// not scored yet).
func gatherF(x []float32, keep []int) []float32 {
	out := x[:0]
	for _, i := range keep {
		if i < len(x) {
			out = append(out, x[i])
		} else {
			out = append(out, 0)
		}
	}
	return out
}
