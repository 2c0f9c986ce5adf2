package policy

import (
	"fmt"
	"math"
	"testing"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
)

// twoReaders is a hand-written fake of a model whose every cache layer is
// read by two model layers (CLA2-like): the model's real call is the
// first reader, and after its Done a second reader, whose queries are the
// first's times scale, runs its own attention over the same cache layer
// and calls the policy's Request and Done in turn, as the model calls them
// for the next model layer reading that cache layer. The cache's layout
// says Readers = 2 for every layer.
type twoReaders struct {
	ps       *State
	seq      *model.Sequence
	scale    float32
	start, n int
	sc       attention.Scratch
	// calls records every Done: cache layer, reader, step, queries, positions.
	calls []readerCall
}

type readerCall struct {
	layer, reader, step int
	q                   []float32 // [n][heads·headDim] rotated
	pos                 []int32
	strict              bool // the reader masks the diagonal and adds the zero dummy (it reads a later layer's KV)
	window              int  // the reader's attention window (0: full)
}

func (f *twoReaders) Request(layer, start, n int) *attention.MassRequest {
	f.start, f.n = start, n
	req := f.ps.Request(layer, start, n)
	if req == nil {
		// The second reader asks too (and a method asks both or neither).
		if r2 := f.ps.Request(layer, start, n); r2 != nil {
			panic("policy: the second reader was asked for mass the first was not")
		}
	}
	return req
}

func (f *twoReaders) Done(layer int, req *attention.MassRequest, q []float32, pos []int32) {
	f.ps.Done(layer, req, q, pos)
	step := f.seq.Computed
	f.calls = append(f.calls, readerCall{layer: layer, reader: 0, step: step, q: append([]float32(nil), q...), pos: append([]int32(nil), pos...)})
	r2 := f.ps.Request(layer, f.start, f.n)
	if r2 == nil {
		panic("policy: the first reader was asked for mass the second was not")
	}
	m := f.seq.Model()
	q2 := make([]float32, len(q))
	for i, v := range q {
		q2[i] = v * f.scale
	}
	cache := f.seq.Cache()
	b := attention.Batch{Heads: m.KVHeads, G: m.Config.GroupSize(), HeadDim: m.HeadDim, Norm: float32(math.Sqrt(float64(m.HeadDim))),
		Q: q2, Out: make([]float32, len(q2)), Pos: pos, Segs: func(h int) []kvcache.Segment { return cache.Segments(layer, h) }, Mass: r2}
	b.Run(&f.sc)
	f.ps.Done(layer, r2, q2, pos)
	f.calls = append(f.calls, readerCall{layer: layer, reader: 1, step: step, q: q2, pos: append([]int32(nil), pos...)})
}

// twoReaderShape is the stories model with the fake: every cache layer
// read by two model layers.
func twoReaderShape(st stories, scale float32) (invShape, *[]*twoReaders) {
	l := st.m.KVLayout()
	l.Readers = make([]int, l.Layers)
	for i := range l.Readers {
		l.Readers[i] = 2
	}
	var fakes []*twoReaders
	return invShape{m: st.m, ids: st.ids, layout: &l, hook: func(ps *State, seq *model.Sequence) model.MassHook {
		f := &twoReaders{ps: ps, seq: seq, scale: scale}
		fakes = append(fakes, f)
		return f
	}}, &fakes
}

// sharedConfigs are the configurations every shape runs through the
// invariants: each method that runs on layers read by several model layers.
var sharedConfigs = []Config{
	{Method: "window", Window: 40},
	{Method: "streaming", Window: 36, Sinks: 4},
	{Method: "lminfinite", Window: 60, Sinks: 4},
	{Method: "h2o", Budget: 48},
	{Method: "h2o", Ratio: 0.5, Every: 8, Agg: attention.AggMax},
	{Method: "tova", Budget: 40},
	{Method: "snapkv", Budget: 64, Window: 16},
	{Method: "snapkv", Ratio: 0.25, Window: 16, Every: 16},
	{Method: "adakv", Budget: 64, Window: 16},
	{Method: "pyramidkv", Budget: 64, Window: 16},
	{Method: "knorm", Budget: 50, Sinks: 2, Window: 8, Every: 4},
	{Method: "keydiff", Budget: 50, Sinks: 2, Window: 8, Every: 4},
	{Method: "expected", Budget: 50, Window: 8, Every: 4},
}

// TestInvariantsTwoReaders runs every method through TestInvariants'
// checks on the fake of a model whose every cache layer has two readers
// (two Request/Done pairs per cache layer and step): one origin per slot
// (a cache layer's new tokens tracked once), the budget per cache layer,
// sinks and window kept, blocks freed, no leak.
func TestInvariantsTwoReaders(t *testing.T) {
	st := loadStories(t)
	sh, _ := twoReaderShape(st, -0.7)
	for _, cfg := range sharedConfigs {
		for _, cn := range [][2]string{{"f32", "f32"}, {"kivi4", "kivi2"}} {
			t.Run(fmt.Sprintf("%s/%s-%s", cfg, cn[0], cn[1]), func(t *testing.T) { runInvariantsOn(t, sh, cfg, cn) })
		}
	}
}

// TestReadersAggregated: on the fake with two readers per cache layer, a
// method's scores are its scores of each reader's attention, computed
// naively here from the recorded queries and the stored keys, aggregated
// over the readers as the query heads of a group (the mean by default;
// sum; max: of each step's per-reader sums): H2O's accumulated mass after
// a prompt and after decode steps, TOVA's last query, SnapKV's window.
// It fails if only one reader is counted, or both summed for the mean.
func TestReadersAggregated(t *testing.T) {
	st := loadStories(t)
	const T = 40
	cases := []struct {
		cfg    Config
		decode int  // decode steps before the last check
		last   bool // only the last query of the last step counts (TOVA)
		window int  // only the prompt's last window queries count (SnapKV)
	}{
		{cfg: Config{Method: "h2o", Budget: 1000}, decode: 3},
		{cfg: Config{Method: "h2o", Budget: 1000, Agg: attention.AggSum}, decode: 3},
		{cfg: Config{Method: "h2o", Budget: 1000, Agg: attention.AggMax}, decode: 3},
		{cfg: Config{Method: "tova", Budget: 1000}, decode: 2, last: true},
		{cfg: Config{Method: "tova", Budget: 1000, Agg: attention.AggMax}, last: true},
		{cfg: Config{Method: "snapkv", Budget: 1000, Window: 8}, window: 8},
	}
	for _, tc := range cases {
		t.Run(tc.cfg.String()+"/agg="+tc.cfg.Agg.String(), func(t *testing.T) {
			sh, fakes := twoReaderShape(st, -0.7)
			seq, err := sh.newSequence(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			ps, err := New(tc.cfg, seq)
			if err != nil {
				t.Fatal(err)
			}
			seq.Mass = sh.hook(ps, seq)
			f := (*fakes)[0]
			ps.BeginPrefill(T)
			if _, err := seq.Forward(st.ids[:T], false); err != nil {
				t.Fatal(err)
			}
			from := 0
			if tc.window > 0 {
				from = T - tc.window
			}
			mustDiffer(t, checkAggregated(t, ps, f.calls, tc.cfg.Agg, tc.last, from, T))
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < tc.decode; i++ {
				if err := ps.Before(1); err != nil {
					t.Fatal(err)
				}
				if _, err := seq.Forward([]int{st.ids[T+i]}, false); err != nil {
					t.Fatal(err)
				}
			}
			if tc.decode > 0 {
				mustDiffer(t, checkAggregated(t, ps, f.calls, tc.cfg.Agg, tc.last, 0, T))
			}
		})
	}
}

// checkAggregated compares every table's scores with the naive
// aggregation of the recorded readers' attention over the stored keys
// (nothing pruned: slot j holds position j). Only queries at positions ≥
// from count while the prompt (positions < prompt) runs; last: only the
// last recorded step's last query. The mean divides by the layout's
// readers, whether or not each ran in a step (a prefill exiting early
// above the last KV owner runs none or only the last row of them). It
// returns how far apart the aggregate and the first reader alone are, the
// least over the tables of layers with several readers (+Inf if none): a
// test that a reader left out would fail needs it positive.
func checkAggregated(t *testing.T, ps *State, calls []readerCall, agg attention.Agg, last bool, from, prompt int) float64 {
	t.Helper()
	apart := math.Inf(1)
	m := ps.seq.Model()
	keys := snapshotKeys(ps.seq)
	H, G, d := m.KVHeads, m.Config.GroupSize(), m.HeadDim
	lastStep := calls[len(calls)-1].step
	for l := 0; l < ps.L; l++ {
		R := ps.readers[l]
		for h := 0; h < H; h++ {
			k, kpos := keys[l*H+h], ps.cache.Positions(l, h)
			mass := map[int][][]float64{} // [step][reader][slot]
			var steps []int
			for _, c := range calls {
				if c.layer != l || (last && c.step != lastStep) {
					continue
				}
				if mass[c.step] == nil {
					mass[c.step] = make([][]float64, R)
					for r := range mass[c.step] {
						mass[c.step][r] = make([]float64, len(k))
					}
					steps = append(steps, c.step)
				}
				qd := len(c.q) / len(c.pos)
				for i, p := range c.pos {
					if (int(p) < prompt && int(p) < from) || (last && i != len(c.pos)-1) {
						continue
					}
					row := make([]float64, len(k))
					for g := 0; g < G; g++ {
						q := c.q[i*qd+(h*G+g)*d : i*qd+(h*G+g+1)*d]
						for j, v := range attnProbs(q, k, kpos, p, c.strict, c.window) {
							switch agg {
							case attention.AggMax:
								row[j] = math.Max(row[j], v)
							case attention.AggSum:
								row[j] += v
							default:
								row[j] += v / float64(G)
							}
						}
					}
					for j, v := range row {
						mass[c.step][c.reader][j] += v
					}
				}
			}
			want := make([]float64, len(k))
			one := make([]float64, len(k)) // the first reader alone
			for _, s := range steps {
				for j := range want {
					var a float64
					for r := 0; r < R; r++ {
						v := mass[s][r][j]
						switch agg {
						case attention.AggMax:
							a = math.Max(a, v)
						case attention.AggSum:
							a += v
						default:
							a += v / float64(R)
						}
					}
					want[j] += a
					one[j] += mass[s][0][j]
				}
			}
			got := ps.Scores(l, h)
			far := 0.0
			for j := range want {
				var g float64
				if j < len(got) {
					g = float64(got[j])
				}
				if math.Abs(g-want[j]) > 1e-4*(1+math.Abs(want[j])) {
					t.Fatalf("layer %d head %d slot %d: score %g, the readers' aggregate %g (first reader alone %g)", l, h, j, g, want[j], one[j])
				}
				far = math.Max(far, math.Abs(want[j]-one[j]))
			}
			if R > 1 {
				apart = math.Min(apart, far)
			}
		}
	}
	return apart
}

// mustDiffer fails when the readers' aggregate was the first reader's
// alone (checkAggregated's result): the test could not tell them apart.
func mustDiffer(t *testing.T, apart float64) {
	t.Helper()
	if apart < 1e-3 {
		t.Fatalf("the readers' aggregate is the first reader's (%g apart): the test cannot tell them apart", apart)
	}
}

// attnProbs is the naive attention of one query head at position qpos
// over keys at positions kpos: softmax(q·k/√d) over the keys it sees —
// kpos ≤ qpos (kpos < qpos when strict), kpos > qpos − window when window
// > 0 — and, when strict, a dummy key of zeros (score 0) that takes its
// share of the softmax and is no slot.
func attnProbs(q []float32, keys [][]float64, kpos []int32, qpos int32, strict bool, window int) []float64 {
	p := make([]float64, len(keys))
	mx := math.Inf(-1)
	if strict {
		mx = 0
	}
	seen := func(j int) bool {
		return (kpos[j] < qpos || !strict && kpos[j] == qpos) && (window == 0 || kpos[j] > qpos-int32(window))
	}
	for j, k := range keys {
		if !seen(j) {
			continue
		}
		s := 0.0
		for c := range k {
			s += float64(q[c]) * k[c]
		}
		p[j] = s / math.Sqrt(float64(len(k)))
		mx = math.Max(mx, p[j])
	}
	sum := 0.0
	if strict {
		sum = math.Exp(-mx) // the dummy
	}
	for j := range p {
		if seen(j) {
			p[j] = math.Exp(p[j] - mx)
			sum += p[j]
		} else {
			p[j] = 0
		}
	}
	for j := range p {
		p[j] /= sum
	}
	return p
}

// TestValidateSharedLayouts: what Validate refuses on the layouts of
// models that share KV across layers (Readers) or bound layers by a
// window (Windows), with the reason, and what it lets run; New refuses
// the same on a cache of that layout.
func TestValidateSharedLayouts(t *testing.T) {
	cla := kvcache.Layout{Layers: 3, KVHeads: 4, HeadDim: 8, Readers: []int{2, 2, 2}}
	cla2 := kvcache.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, Readers: []int{2, 2}}
	yoco := kvcache.Layout{Layers: 3, KVHeads: 4, HeadDim: 8, Windows: []int{16, 16, 0}, Readers: []int{1, 1, 2}}
	local := kvcache.Layout{Layers: 4, KVHeads: 4, HeadDim: 8, Windows: []int{16, 0, 16, 0}}
	from := func(f int) Opts { return Opts{}.With("merge-from", float64(f)) }
	cases := []struct {
		name string
		cfg  Config
		l    kvcache.Layout
		want string // "" runs
	}{
		{"pyramidinfer on CLA", Config{Method: "pyramidinfer"}, cla, "cache layer 0 is read by 2 model layers"},
		{"pyramidinfer on YOCO", Config{Method: "pyramidinfer"}, yoco, "read by 2 model layers"},
		{"pyramidinfer on local-global", Config{Method: "pyramidinfer"}, local, "cache layer 0 is read by sliding-window attention (window 16)"},
		{"streaming re-indexes on YOCO", Config{Method: "streaming", Window: 36, Sinks: 4}, yoco, "re-indexes positions"},
		{"h2o re-indexed on local-global", Config{Method: "h2o", Budget: 32, Positions: PosReindex}, local, "use --kv-positions original"},
		{"streaming on equal windows (Mistral)", Config{Method: "streaming", Window: 36, Sinks: 4}, kvcache.Layout{Layers: 3, KVHeads: 4, HeadDim: 8, Windows: []int{16, 16, 16}}, ""},
		{"streaming on unequal windows", Config{Method: "streaming", Window: 36, Sinks: 4}, kvcache.Layout{Layers: 3, KVHeads: 4, HeadDim: 8, Windows: []int{16, 16, 32}}, "cache layer 0 keeps the last 16 positions and cache layer 2 the last 32 positions"},
		{"streaming, original positions, on YOCO", Config{Method: "streaming", Window: 36, Sinks: 4, Positions: PosOriginal}, yoco, ""},
		{"streaming on CLA", Config{Method: "streaming", Window: 36, Sinks: 4}, cla, ""},
		{"h2o on CLA", Config{Method: "h2o", Budget: 32}, cla, ""},
		{"snapkv on YOCO", Config{Method: "snapkv", Budget: 64}, yoco, ""},
		{"pyramidkv on CLA", Config{Method: "pyramidkv", Budget: 64}, cla, ""},
		{"lminfinite on local-global", Config{Method: "lminfinite", Window: 60, Sinks: 4}, local, ""},
		{"minicache on 3 cache layers", Config{Method: "minicache"}, cla, ""},
		{"minicache on 2 cache layers", Config{Method: "minicache"}, cla2, "no cache layer pair to merge from cache layer 1 of 2"},
		{"minicache pair with a windowed layer", Config{Method: "minicache"}, yoco, "cache layer 1 is read by sliding-window attention"},
		{"minicache from a windowed layer", Config{Method: "minicache", Opts: from(2)}, local, "cache layers 2 and 3"},
		{"minicache past the windowed layers", Config{Method: "minicache", Opts: from(1)}, kvcache.Layout{Layers: 3, KVHeads: 4, HeadDim: 8, Windows: []int{16, 0, 0}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Validate(c.cfg, c.l, nil)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
		})
	}
	// New refuses what Validate refuses, on a cache of that layout.
	st := loadStories(t)
	l := st.m.KVLayout()
	l.Readers = []int{1, 2, 1, 1, 1}
	sh := invShape{m: st.m, ids: st.ids, layout: &l}
	seq, err := sh.newSequence(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	_, nerr := New(Config{Method: "pyramidinfer"}, seq)
	verr := Validate(Config{Method: "pyramidinfer"}, l, nil)
	if nerr == nil || verr == nil || nerr.Error() != verr.Error() {
		t.Fatalf("New: %v; Validate: %v", nerr, verr)
	}
}

// windowFree is a hand-written fake of a window-bounded cache
// (Layout.Windows): before the first reader of a bounded cache layer runs
// in a step, the layer's owner having appended the step's tokens, it frees
// the layer's oldest whole blocks (16 slots) whose every slot lies at a
// position ≤ p0 − W, p0 the step's first position, as the contract lets
// the cache do.
type windowFree struct {
	inner model.MassHook
	seq   *model.Sequence
	win   []int
	step  []int // Computed at the last free, per cache layer
}

func (f *windowFree) Request(layer, start, n int) *attention.MassRequest {
	if w := f.win[layer]; w > 0 && f.step[layer] != f.seq.Computed+1 {
		f.step[layer] = f.seq.Computed + 1
		cache := f.seq.Cache().(kvcache.Compacted)
		bound := int32(f.seq.Pos() - w)
		for h := 0; h < cache.Layout().KVHeads; h++ {
			pos := cache.Positions(layer, h)
			d := 0
			for d < len(pos) && pos[d] <= bound {
				d++
			}
			if d -= d % 16; d > 0 {
				if err := cache.Keep(layer, h, seq(d, len(pos))); err != nil {
					panic(err)
				}
			}
		}
	}
	return f.inner.Request(layer, start, n)
}

func (f *windowFree) Done(layer int, req *attention.MassRequest, q []float32, pos []int32) {
	f.inner.Done(layer, req, q, pos)
}

// windowShape is the stories model with layers 1 and 3 (every layer with
// all) bounded to a window of 24 by the windowFree fake (the model's
// attention itself is left full: the fake tests the policy's bookkeeping,
// not the masks), and, with twoReaders, every cache layer read twice.
func windowShape(st stories, twoReaders, all bool) invShape {
	sh := invShape{m: st.m, ids: st.ids}
	inner := func(ps *State, _ *model.Sequence) model.MassHook { return ps }
	if twoReaders {
		sh, _ = twoReaderShape(st, -0.7)
		inner = sh.hook
	}
	l := st.m.KVLayout()
	if sh.layout != nil {
		l = *sh.layout
	}
	l.Windows = []int{0, 24, 0, 24, 0}
	if all {
		l.Windows = []int{24, 24, 24, 24, 24}
	}
	sh.layout = &l
	sh.hook = func(ps *State, seq *model.Sequence) model.MassHook {
		return &windowFree{inner: inner(ps, seq), seq: seq, win: l.Windows, step: make([]int, l.Layers)}
	}
	return sh
}

// TestInvariantsWindowFreed runs the invariants on layouts whose cache
// layers 1 and 3 free their blocks as they slide out of a window (the
// windowFree fake), alone and with two readers per cache layer: the
// origins follow the cache (the freed slots leave the front of the tables
// and the slots keep their positions), and re-indexed positions are
// refused where the layers' bounds differ; with every layer bounded alike
// (Mistral-style) they run.
func TestInvariantsWindowFreed(t *testing.T) {
	st := loadStories(t)
	for _, shape := range []struct{ two, all bool }{{false, false}, {true, false}, {false, true}} {
		sh := windowShape(st, shape.two, shape.all)
		codecs := [][2]string{{"f32", "f32"}, {"q8", "q4"}}
		if shape.two || shape.all {
			codecs = codecs[:1] // CI time
		}
		for _, cfg := range sharedConfigs {
			for _, cn := range codecs {
				t.Run(fmt.Sprintf("readers2=%v/all=%v/%s/%s-%s", shape.two, shape.all, cfg, cn[0], cn[1]), func(t *testing.T) {
					if n, _ := cfg.Normalize(); n.Positions == PosReindex && !shape.all {
						if err := Validate(cfg, *sh.layout, nil); err == nil || !contains(err.Error(), "re-indexes positions") {
							t.Fatalf("re-indexed positions on a window-bounded layout: %v", err)
						}
						return
					}
					runInvariantsOn(t, sh, cfg, cn)
				})
			}
		}
	}
}

// TestReaderCountMismatch: a model that calls the hook more often per
// step than its layout's Readers say gets a clear error from Compress,
// not scores and origins off by a reader.
func TestReaderCountMismatch(t *testing.T) {
	st := loadStories(t)
	sh, _ := twoReaderShape(st, -0.7)
	sh.layout = nil // the layout says one reader per cache layer
	seq, err := sh.newSequence(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	ps, err := New(Config{Method: "h2o", Budget: 16}, seq)
	if err != nil {
		t.Fatal(err)
	}
	seq.Mass = sh.hook(ps, seq)
	ps.BeginPrefill(20)
	if _, err := seq.Forward(st.ids[:20], false); err != nil {
		t.Fatal(err)
	}
	if err := ps.Compress(); err == nil || !contains(err.Error(), "cache layer 0 was asked 2 times in one forward step, but 1 model layers read it") {
		t.Fatalf("Compress: %v", err)
	}
}

// TestPromptRows: the rows of a prompt step whose attention (or queries)
// each method scores, which a model exiting a prefill early above its last
// KV owner must still compute there.
func TestPromptRows(t *testing.T) {
	st := loadStories(t)
	const T = 40
	cases := []struct {
		cfg         Config
		start, n    int // a step of the prompt: history [start, start+n)
		want, after int // during the prompt; in a decode step of one token
	}{
		{Config{Method: "h2o", Budget: 16}, 0, T, T, 1},
		{Config{Method: "h2o", Budget: 16}, 16, 16, 16, 1},
		{Config{Method: "tova", Budget: 16}, 0, T, 1, 1},
		{Config{Method: "snapkv", Budget: 24, Window: 8}, 0, T, 8, 0},
		{Config{Method: "snapkv", Budget: 24, Window: 8}, 0, 16, 0, 0},
		{Config{Method: "snapkv", Budget: 24, Window: 8}, 28, 8, 4, 0},
		{Config{Method: "snapkv", Budget: 24, Window: 8, Every: 4}, 0, T, 8, 1},
		{Config{Method: "expected", Budget: 16}, 0, T, T, 0},
		{Config{Method: "knorm", Budget: 16}, 0, T, 0, 0},
		{Config{Method: "streaming", Window: 12, Sinks: 4}, 0, T, 0, 0},
		{Config{Method: "minicache"}, 0, T, 0, 0},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/[%d,%d)", c.cfg, c.start, c.start+c.n), func(t *testing.T) {
			seq, err := st.m.NewStandaloneSequence(model.KVOptions{BlockTokens: 16, Tokens: 128})
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			ps, err := New(c.cfg, seq)
			if err != nil {
				t.Fatal(err)
			}
			ps.BeginPrefill(T)
			if got := ps.PromptRows(c.start, c.n); got != c.want {
				t.Fatalf("prompt: %d rows, want %d", got, c.want)
			}
			if _, err := seq.Forward(st.ids[:T], false); err != nil {
				t.Fatal(err)
			}
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
			if got := ps.PromptRows(T, 1); got != c.after {
				t.Fatalf("decoding: %d rows, want %d", got, c.after)
			}
		})
	}
}
