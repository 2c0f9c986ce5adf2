package policy

import (
	"fmt"
	"math"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// PyramidInfer (arXiv 2405.12532) prunes the tokens themselves during the
// prefill: after each layer only the pivotal context (PvC) goes on, so the
// next layer computes keys, values, attention and FFN for fewer tokens.
//
// Prefill (the whole prompt of T tokens runs as one forward step; a
// prompt run in several steps is pruned after its last one, pruneChunked):
//   - the recent window is the last 1+⌊recent·T⌋ tokens (the last token
//     included); their queries score every earlier token at each layer:
//     attention averaged over all query heads, each query's row weighted by
//     linspace(1, 1.2) from the oldest to the newest;
//   - after layer l (not the last), of the ctx tokens before the window,
//     ⌊ctx·r(l)⌋ are kept, r(l) = (1−decay)(cos(πl/L)+1)/2 + decay: the
//     first Sinks tokens, then the best-scored (ties: the earlier token);
//     the window always goes on. So sets shrink multiplicatively with depth
//     and layer l+1 keeps a subset of layer l's tokens. No pruning happens
//     when ctx ≤ min(min-keep, T − window) or when ⌊ctx·r(l)⌋ would not
//     exceed that floor (the authors' rule: the context never drops to the
//     floor or below it);
//   - a token's KV is stored by each layer it reached (layer l's tables
//     hold the tokens alive at layer l), at its original position.
//
// Decoding: the prompt's KV is never compressed again. Generated tokens
// are pending until 16 of them lie beyond the recent window (of the same
// length as the prompt's); then, in each layer, the oldest 16 are reduced
// to max(1, ⌊16·0.9·r_gen(l)⌋), r_gen with gen-decay, chosen by the
// window's queries' attention, weighted as in the prefill.
//
// The published code sets the same rules (recent ratio 0.2, decay 0.9,
// floor 64, 4 sinks, distance weight 1.2; while generating, chunks of 16,
// compression 0.9, decay 0.1).
const (
	pyrDistance    = 1.2 // the newest recent query's weight (the oldest: 1)
	pyrGenChunk    = 16  // decoding: generated tokens compressed together
	pyrGenCompress = 0.9 // decoding: a chunk keeps 16·0.9·r_gen(l) tokens
)

// The parameters of PyramidInfer (the authors' released defaults).
var (
	pRecent = &Param{Name: "recent", Kind: FloatParam, Doc: "share of the prompt whose queries score the rest", Default: "0.2",
		Lo: 0, LoOpen: true, Hi: 1, HiOpen: true, Fill: 0.2}
	pDecay = &Param{Name: "decay", Kind: FloatParam, Doc: "prefill: last-layer retention of the cosine schedule", Default: "0.9",
		Lo: 0, LoOpen: true, Hi: 1, Fill: 0.9}
	pGenDecay = &Param{Name: "gen-decay", Kind: FloatParam, Doc: "decoding: last-layer retention of a compressed chunk's schedule", Default: "0.1",
		Lo: 0, LoOpen: true, Hi: 1, Fill: 0.1}
	pMinKeep = &Param{Name: "min-keep", Kind: IntParam, Doc: "context never pruned below this many tokens", Default: "64",
		Fill: 64}
)

func init() {
	Register(Method{Name: "pyramidinfer", Order: 10, Doc: "PyramidInfer: tokens pruned between layers during the prefill",
		Params: []string{"sinks", "recent", "decay", "gen-decay", "min-keep"}, Own: []*Param{pRecent, pDecay, pGenDecay, pMinKeep},
		Unused: map[string]string{
			"budget":    "pyramidinfer follows its own schedule; it takes no budget or ratio (set recent, decay, gen-decay, min-keep)",
			"ratio":     "pyramidinfer follows its own schedule; it takes no budget or ratio (set recent, decay, gen-decay, min-keep)",
			"window":    "pyramidinfer's recent window is a share of the prompt ({{recent}}), not a {{window}}",
			"every":     "pyramidinfer compresses generated tokens 16 at a time; it takes no {{every}}",
			"positions": "pyramidinfer keeps original positions ({{positions}})",
			"agg":       "pyramidinfer averages attention over the heads; it takes no {{agg}}",
		},
		Normalize: func(c Config) (Config, error) {
			if c.Sinks == 0 {
				c.Sinks = 4
			}
			return c, nil
		},
		Check: checkPyramid,
		Run: func(st *State) (Runner, error) {
			p := &pyramid{st: st, qrows: make([][][]float32, st.L)}
			st.seq.Prune = p
			return p, nil
		}})
}

// checkPyramid refuses the layouts PyramidInfer's definition does not
// fit. It prunes the tokens (rows) between layers so that the next layer
// computes its keys and values for the survivors only: every layer's KV is
// the pivotal context chosen by the layers below it. On a model whose
// layers read another layer's KV (CLA, YOCO, Layer-Condensed KV), a reader
// above a pruning point attends the owner's KV, tokens it pruned included,
// and an owner read by earlier layers (LCKV) has not run when they score;
// and a sliding-window layer's queries see only its window, so its
// attention cannot rank the older tokens that deeper full-attention layers
// still read (it would prune them all).
func checkPyramid(_ Config, l kvcache.Layout, _ codec.Codec) error {
	if c := sharedLayer(l); c >= 0 {
		return fmt.Errorf("policy: pyramidinfer prunes tokens between layers so that each layer computes and stores KV for the survivors only, but cache layer %d is read by %d model layers (KV shared across layers): a reader would attend tokens pruned below it", c, l.Readers[c])
	}
	if c := boundedLayer(l); c >= 0 {
		return fmt.Errorf("policy: pyramidinfer ranks each layer's whole context by its attention, but cache layer %d is read by sliding-window attention (window %d), which cannot see the older tokens it would prune for every deeper layer", c, l.Windows[c])
	}
	return nil
}

// pyrSchedule is the cosine retention of layer l of L falling from 1 at the
// first layer towards d: (1−d)(cos(πl/L)+1)/2 + d.
func pyrSchedule(l, L int, d float64) float64 {
	return (1-d)*(math.Cos(math.Pi*float64(l)/float64(L))+1)/2 + d
}

// pyrWeights is linspace(1, pyrDistance, n), the weights of n recent
// queries from the oldest to the newest (torch.linspace: [1] when n is 1).
func pyrWeights(n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = 1
		if n > 1 {
			w[i] = float32(1 + (pyrDistance-1)*float64(i)/float64(n-1))
		}
	}
	return w
}

// pyrWindow is the recent window of a prompt of T tokens: 1+⌊recent·T⌋.
func pyrWindow(T int, recent float64) int { return min(T, 1+int(float64(T)*recent)) }

// pyramid is PyramidInfer's Runner, and the sequence's row pruner.
type pyramid struct {
	st *State

	// The prompt (BeginPrefill to Compress).
	T      int       // prompt tokens; 0 outside a prefill
	win    int       // recent window, tokens (the prompt's; kept while decoding)
	chunk  int       // the sequence's Chunk before the prefill raised it
	active bool      // the current step runs the whole prompt: rows are pruned
	stepN  int       // tokens of the current step
	rows   []int32   // history index of each row still computed in the step
	score  []float32 // the current layer's score of each row

	// A prompt run in several steps (chunked prefill) is computed whole
	// and pruned by Compress (pruneChunked).
	chunked bool        // a step of the prefill did not run the whole prompt
	wmass   [][]float32 // [layer][slot] the recent window's weighted head-mean attention

	// Decoding (after Compress).
	decoding bool
	pending  int           // generated tokens not yet compressed: the last slots of every table
	qrows    [][][]float32 // [layer][pending token] its query's head-mean attention over the pending slots up to itself
	chunks   int           // generated chunks compressed
}

// Begin starts a prefill of n tokens: they should run as one forward step
// (the window's queries score the whole prompt at every layer), so the
// sequence's chunk grows to n until Compress restores it. A prompt run in
// several steps anyway (a server's chunked prefill) is computed whole and
// pruned to the same per-layer counts by Compress (pruneChunked).
func (p *pyramid) Begin(n int) {
	p.T, p.win = n, pyrWindow(n, pRecent.Float(p.st.cfg))
	p.chunk = p.st.seq.Chunk
	if p.st.seq.Chunk < n {
		p.st.seq.Chunk = n
	}
	p.chunked = false
	p.wmass = make([][]float32, p.st.L)
}

// Request implements Runner.
func (p *pyramid) Request(layer, start, n int) *attention.MassRequest {
	st := p.st
	if layer == 0 {
		p.stepN = n
		p.active = p.T > 0 && start == st.prefAt && n == p.T
		if p.T > 0 && !p.active {
			p.chunked = true
		}
		p.rows = p.rows[:0]
		for i := 0; i < n; i++ {
			p.rows = append(p.rows, int32(start+i))
		}
		if p.decoding {
			p.pending += n
		}
	}
	if n != len(p.rows) {
		panic(fmt.Sprintf("policy: pyramidinfer: layer %d runs %d rows, %d expected", layer, n, len(p.rows)))
	}
	for h := 0; h < st.H; h++ {
		st.orig[layer*st.H+h] = append(st.orig[layer*st.H+h], p.rows...)
	}
	if layer == st.L-1 {
		st.seen = start + p.stepN
	}
	var req *attention.MassRequest
	switch {
	case p.active && p.target(layer, n) > 0:
		// The window's queries, weighted by distance (only at layers that
		// prune: the first one never does).
		req = &attention.MassRequest{From: n - p.win, Agg: attention.AggMean, Weights: pyrWeights(p.win)}
	case p.T > 0 && !p.active && layer < st.L-1:
		// A chunk of a prompt run in several steps: the part of the recent
		// window it holds, with the window's weights.
		w0 := st.prefAt + p.T - p.win // history index of the window's first token
		from := max(0, w0-start)
		if from >= n {
			return nil
		}
		req = &attention.MassRequest{From: from, Agg: attention.AggMean, Weights: pyrWeights(p.win)[start+from-w0 : start+n-w0]}
	case p.decoding:
		// The step's last query (one per decode step).
		req = &attention.MassRequest{From: n - 1, Agg: attention.AggMean}
	default:
		return nil
	}
	req.Out = make([][]float32, st.H)
	for h := range req.Out {
		req.Out[h] = make([]float32, st.cache.Slots(layer, h))
	}
	return req
}

// Done implements Runner: the mass averaged over the KV heads (each
// already the mean of its query heads) is the mean over all heads.
func (p *pyramid) Done(layer int, req *attention.MassRequest, _ []float32, _ []int32) {
	H := float32(len(req.Out))
	slots := len(req.Out[0])
	mean := func(first, n int) []float32 {
		out := make([]float32, n)
		for _, m := range req.Out {
			for i := range out {
				out[i] += m[first+i]
			}
		}
		for i := range out {
			out[i] /= H
		}
		return out
	}
	if p.active {
		n := len(p.rows)
		p.score = mean(slots-n, n) // the step's rows are the table's last slots
		return
	}
	if p.T > 0 {
		// Chunked prefill: the window's mass, summed over its chunks.
		m := mean(0, slots)
		for len(p.wmass[layer]) < slots {
			p.wmass[layer] = append(p.wmass[layer], 0)
		}
		for i, v := range m {
			p.wmass[layer][i] += v
		}
		return
	}
	if p.decoding {
		P := p.pending
		for i := 0; i < p.stepN-1; i++ {
			// A step of several tokens scores only its last query.
			p.qrows[layer] = append(p.qrows[layer], make([]float32, P-p.stepN+i+1))
		}
		p.qrows[layer] = append(p.qrows[layer], mean(slots-P, P))
	}
}

// AfterLayer implements model.RowPruner: the prompt's tokens going on to
// the next layer.
func (p *pyramid) AfterLayer(layer int, _ []int32) []int {
	if !p.active {
		return nil
	}
	c := p.st.cfg
	n, W := len(p.rows), p.win
	ctx := n - W
	k := p.target(layer, n)
	if k == 0 {
		return nil
	}
	sinks := 0
	for sinks < ctx && p.rows[sinks] < int32(c.Sinks) {
		sinks++
	}
	keep := Keep(n, max(k, sinks)+W, sinks, W, p.score)
	if len(keep) == n {
		return nil
	}
	for i, r := range keep {
		p.rows[i] = p.rows[r]
	}
	p.rows = p.rows[:len(keep)]
	return keep
}

// target is how many of the context tokens (those before the window)
// layer keeps when n prompt tokens reached it: ⌊ctx·r(layer)⌋, or 0 when
// the layer prunes nothing (the last layer, r = 1, or the context would
// not stay above the floor min(min-keep, T − window)).
func (p *pyramid) target(layer, n int) int {
	L, W := p.st.L, p.win
	if layer >= L-1 {
		return 0
	}
	ctx := n - W
	floor := min(pMinKeep.Int(p.st.cfg), p.T-W)
	r := pyrSchedule(layer, L, pDecay.Float(p.st.cfg))
	if ctx <= floor || r >= 1 {
		return 0
	}
	if k := int(float64(ctx) * r); k > floor {
		return k
	}
	return 0
}

// Compress ends the prefill: its pruning is done, decoding starts.
func (p *pyramid) Compress() error {
	st := p.st
	if p.T > 0 {
		st.seq.Chunk = p.chunk
		if p.chunked {
			if err := p.pruneChunked(); err != nil {
				return err
			}
		}
	}
	pruned := false
	for l := 1; l < st.L; l++ {
		pruned = pruned || st.cache.Slots(l, 0) != st.cache.Slots(0, 0)
	}
	if pruned {
		st.Pruned++
		// The tables no longer hold tokens 0..n−1 in every layer: rewriting
		// no key marks the cache as pruned, so no prefix is registered.
		if err := st.cache.RewriteKeys(0, 0, nil, func(pos int32, _ []float32) int32 { return pos }); err != nil {
			return err
		}
	}
	if p.win == 0 {
		p.win = pyrWindow(st.seen, pRecent.Float(st.cfg))
	}
	p.T, p.active, p.decoding, p.pending = 0, false, true, 0
	p.chunked, p.wmass = false, nil
	for l := range p.qrows {
		p.qrows[l] = nil
	}
	return nil
}

// pruneChunked applies the prefill's schedule after a prompt that ran in
// several steps, so every layer stored all of it: layer by layer, of the
// tokens alive at the layer, the same counts as a single-step prefill
// (target) go on to the next, the first Sinks and the recent window kept,
// the rest chosen by the window's weighted attention at that layer; then
// each layer's tables keep the tokens alive at it. The counts, and so the
// bytes, are those of the single-step prefill; the choice is close to it
// but not identical (there, deeper layers never computed the pruned
// tokens, so their attention differs), and the prefill saves no compute.
func (p *pyramid) pruneChunked() error {
	st, c := p.st, p.st.cfg
	T, W := p.T, p.win
	first := st.cache.Slots(0, 0) - T // slots before the prompt stay
	for t := range st.orig {
		if st.cache.Slots(t/st.H, t%st.H) != first+T {
			return fmt.Errorf("policy: pyramidinfer: layer %d head %d holds %d slots after a %d-token prompt, %d expected", t/st.H, t%st.H, st.cache.Slots(t/st.H, t%st.H), T, first+T)
		}
	}
	alive := make([]int, T) // prompt tokens alive at the layer, as offsets in the prompt
	for i := range alive {
		alive[i] = i
	}
	for l := 0; l < st.L; l++ {
		if l > 0 && len(alive) < T {
			keep := make([]int, 0, first+len(alive))
			for i := 0; i < first; i++ {
				keep = append(keep, i)
			}
			for _, r := range alive {
				keep = append(keep, first+r)
			}
			for h := 0; h < st.H; h++ {
				t := l*st.H + h
				if err := st.cache.Keep(l, h, keep); err != nil {
					return err
				}
				st.orig[t] = gather32(st.orig[t], keep)
			}
		}
		n := len(alive)
		k := p.target(l, n)
		if k == 0 {
			continue
		}
		score := make([]float32, n)
		for i, r := range alive {
			if s := first + r; s < len(p.wmass[l]) {
				score[i] = p.wmass[l][s]
			}
		}
		sinks := 0
		for sinks < n-W && st.prefAt+alive[sinks] < c.Sinks {
			sinks++
		}
		keep := Keep(n, max(k, sinks)+W, sinks, W, score)
		next := make([]int, len(keep))
		for i, j := range keep {
			next[i] = alive[j]
		}
		alive = next
	}
	return nil
}

// Before compresses the oldest pending chunk while 16 generated tokens lie
// beyond the recent window.
func (p *pyramid) Before(int) error {
	for p.decoding && p.pending-p.win >= pyrGenChunk {
		if err := p.compressChunk(); err != nil {
			return err
		}
	}
	return nil
}

// compressChunk reduces, in every layer, the oldest 16 pending tokens to
// the schedule's count, by the weighted attention of the window's queries.
func (p *pyramid) compressChunk() error {
	st := p.st
	C, P, W := pyrGenChunk, p.pending, p.win
	w := pyrWeights(W)
	for l := 0; l < st.L; l++ {
		k := max(1, int(float64(C)*pyrGenCompress*pyrSchedule(l, st.L, pGenDecay.Float(st.cfg))))
		q := p.qrows[l]
		score := make([]float32, C)
		for i := P - W; i < P; i++ {
			for j := range score {
				score[j] += w[i-(P-W)] * q[i][j]
			}
		}
		n := st.cache.Slots(l, 0)
		first := n - P
		keep := make([]int, 0, n-C+k)
		for i := 0; i < first; i++ {
			keep = append(keep, i)
		}
		for _, j := range Keep(C, k, 0, 0, score) {
			keep = append(keep, first+j)
		}
		for i := first + C; i < n; i++ {
			keep = append(keep, i)
		}
		for h := 0; h < st.H; h++ {
			t := l*st.H + h
			if err := st.cache.Keep(l, h, keep); err != nil {
				return err
			}
			st.orig[t] = gather32(st.orig[t], keep)
		}
		// The chunk's own queries leave, and the rows lose the chunk.
		q = q[C:]
		for i := range q {
			q[i] = q[i][C:]
		}
		p.qrows[l] = q
	}
	p.pending -= C
	p.chunks++
	st.Pruned++
	return nil
}
