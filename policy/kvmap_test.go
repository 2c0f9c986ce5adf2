package policy

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
)

// storiesMaps are the KV source maps of gen-model's cla2, yoco, lckv and
// local-global shapes (docs/ARCHITECTURES.md) on stories260K's 5 layers,
// run with its trained weights (the K/V weights of layers that do not own
// KV go unused), so that attention is as peaked as a real model's:
//
//   - cla2: pairs, the first of each owning KV (owners 0, 2, 4);
//   - yoco: a self-decoder of 2 sliding-window layers (window 32, each its
//     own KV), then a cross-decoder whose first layer owns the global KV
//     the 2 layers above it read (and run only the prompt's last row);
//   - lckv: 2 warmup layers, the 3 others reading the top layer's KV with
//     the diagonal masked;
//   - local-global: windows of 32 but on layers 2 and 4.
var storiesMaps = []struct {
	name     string
	src, win []int
}{
	{"cla2", []int{0, 0, 2, 2, 4}, nil},
	{"yoco", []int{0, 1, 2, 2, 2}, []int{32, 32, 0, 0, 0}},
	{"lckv", []int{0, 1, 4, 4, 4}, nil},
	{"local-global", nil, []int{32, 32, 0, 32, 0}},
}

// mapped is stories260K with the named map of storiesMaps.
func mapped(t *testing.T, name string) stories {
	t.Helper()
	st := loadStories(t)
	for _, m := range storiesMaps {
		if m.name == name {
			st.m.KVSource, st.m.LayerWindows = m.src, m.win
			return st
		}
	}
	t.Fatalf("no map %q", name)
	return st
}

// readerHook records, around a policy's mass hook on a model with a KV
// source map, every Done with the reader it comes from (the k-th call for
// a cache layer in a step is its k-th reader: a prefill exiting early
// above the last owner skips the topmost readers only) and that reader's
// mask.
type readerHook struct {
	ps      *State
	seq     *model.Sequence
	readers [][]int // Config.Readers
	step    []int   // per cache layer: Computed+1 of the current step
	k, cur  []int   // per cache layer: calls in the step; the current call's reader
	calls   []readerCall
}

func newReaderHook(ps *State, seq *model.Sequence) *readerHook {
	c := seq.Model().Config
	n := len(c.Owners())
	return &readerHook{ps: ps, seq: seq, readers: c.Readers(), step: make([]int, n), k: make([]int, n), cur: make([]int, n)}
}

func (r *readerHook) Request(layer, start, n int) *attention.MassRequest {
	if r.step[layer] != r.seq.Computed+1 {
		r.step[layer], r.k[layer] = r.seq.Computed+1, 0
	}
	r.cur[layer] = r.k[layer]
	r.k[layer]++
	return r.ps.Request(layer, start, n)
}

// PromptRows forwards the policy's (model.PromptRows).
func (r *readerHook) PromptRows(start, n int) int { return r.ps.PromptRows(start, n) }

func (r *readerHook) Done(layer int, req *attention.MassRequest, q []float32, pos []int32) {
	r.ps.Done(layer, req, q, pos)
	c := r.seq.Model().Config
	i := r.readers[layer][r.cur[layer]]
	r.calls = append(r.calls, readerCall{layer: layer, reader: r.cur[layer], step: r.seq.Computed,
		q: append([]float32(nil), q...), pos: append([]int32(nil), pos...), strict: c.Source(i) > i, window: c.Window(i)})
}

// TestReadersAggregatedKVMaps: on the real forward pass of each map, a
// method's scores of a cache layer are the aggregate over the model layers
// that read it of each one's attention, computed naively here from the
// queries each reader ran and the stored keys, with each reader's own mask
// (causal, window, or masked diagonal with the zero dummy): H2O's
// accumulated mass is the mean of its readers' masses (CLA2: the two
// layers of each pair), max and sum as --kv-agg says, TOVA's last query,
// SnapKV's observation window.
func TestReadersAggregatedKVMaps(t *testing.T) {
	const T = 40
	for _, mp := range storiesMaps {
		st := mapped(t, mp.name)
		for _, tc := range []struct {
			cfg    Config
			decode int
			last   bool
			window int
		}{
			{cfg: Config{Method: "h2o", Budget: 1000}, decode: 3},
			{cfg: Config{Method: "h2o", Budget: 1000, Agg: attention.AggMax}, decode: 3},
			{cfg: Config{Method: "h2o", Budget: 1000, Agg: attention.AggSum}},
			{cfg: Config{Method: "tova", Budget: 1000}, decode: 2, last: true},
			{cfg: Config{Method: "snapkv", Budget: 1000, Window: 8}, window: 8},
		} {
			t.Run(mp.name+"/"+tc.cfg.String()+"/agg="+tc.cfg.Agg.String(), func(t *testing.T) {
				seq, err := st.m.NewStandaloneSequence(model.KVOptions{BlockTokens: 16, Tokens: 256})
				if err != nil {
					t.Fatal(err)
				}
				defer seq.Close()
				ps, err := New(tc.cfg, seq)
				if err != nil {
					t.Fatal(err)
				}
				hook := newReaderHook(ps, seq)
				seq.Mass = hook
				ps.BeginPrefill(T)
				if _, err := seq.Forward(st.ids[:T], false); err != nil {
					t.Fatal(err)
				}
				from := 0
				if tc.window > 0 {
					from = T - tc.window
				}
				// With max, a reader whose prompt rows exited early (YOCO's
				// cross-decoder above its owner) may lose to the owner's
				// sum everywhere; decoding tells them apart.
				if apart := checkAggregated(t, ps, hook.calls, tc.cfg.Agg, tc.last, from, T); tc.cfg.Agg != attention.AggMax {
					mustDiffer(t, apart)
				}
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
					mustDiffer(t, checkAggregated(t, ps, hook.calls, tc.cfg.Agg, tc.last, 0, T))
				}
			})
		}
	}
}

// TestInvariantsKVMaps runs every method through the invariants on the
// CLA2 and YOCO maps (and LCKV's and local/global's): budget per cache
// layer, sinks (on unbounded layers) and window kept, one origin per slot
// at its position, blocks freed (a window-bounded layer's too), no leak;
// re-indexed positions are refused where a layer is window-bounded.
func TestInvariantsKVMaps(t *testing.T) {
	for _, mp := range storiesMaps {
		st := mapped(t, mp.name)
		sh := invShape{m: st.m, ids: st.ids}
		lay := st.m.KVLayout()
		codecs := [][2]string{{"f32", "f32"}, {"kivi4", "kivi2"}}
		if mp.name != "cla2" && mp.name != "yoco" {
			codecs = codecs[:1] // CI time: every codec on the two shapes
		}
		for _, cfg := range sharedConfigs {
			for _, cn := range codecs {
				t.Run(fmt.Sprintf("%s/%s/%s-%s", mp.name, cfg, cn[0], cn[1]), func(t *testing.T) {
					if n, _ := cfg.Normalize(); n.Positions == PosReindex && lay.Windows != nil {
						if err := Validate(cfg, lay, nil); err == nil || !contains(err.Error(), "re-indexes positions") {
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

// TestPyramidKVOverCacheLayers: PyramidKV's linearly falling budgets run
// over the cache (owner) layers: on CLA2's map, 3 cache layers keep
// pyramidBudgets(B, W, T, 3, β) tokens, not the 5 model layers' schedule.
func TestPyramidKVOverCacheLayers(t *testing.T) {
	st := mapped(t, "cla2")
	const T, B, W = 150, 64, 16
	seq, err := st.m.NewStandaloneSequence(model.KVOptions{BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	ps, err := New(Config{Method: "pyramidkv", Budget: B, Window: W}, seq)
	if err != nil {
		t.Fatal(err)
	}
	ps.BeginPrefill(T)
	if _, err := seq.Forward(st.ids[:T], false); err != nil {
		t.Fatal(err)
	}
	if err := ps.Compress(); err != nil {
		t.Fatal(err)
	}
	want := pyramidBudgets(B, W, T, 3, 20)
	if five := pyramidBudgets(B, W, T, 5, 20); slices.Equal(want, five[:3]) {
		t.Fatalf("the 3- and 5-layer schedules agree (%v): the test cannot tell them apart", want)
	}
	got := make([]int, ps.L)
	for l := range got {
		got[l] = ps.cache.Slots(l, 0)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("cache layers keep %v tokens, the schedule over 3 cache layers is %v", got, want)
	}
}

// TestMiniCacheKVMaps: MiniCache pairs adjacent cache layers (adjacent KV
// owners) from half the cache layers up: on CLA2's and LCKV's maps (3
// cache layers) cache layers 1 and 2 merge (model layers 2 and 4, and 1
// and 4) and cache layer 0 stays whole; with γ = 1 (every token retained
// whole) the logits are those of the same map without a policy; YOCO's
// pair holds a window-bounded layer and is refused.
func TestMiniCacheKVMaps(t *testing.T) {
	const T = 100
	for _, name := range []string{"cla2", "lckv", "yoco"} {
		t.Run(name, func(t *testing.T) {
			st := mapped(t, name)
			m := st.m
			seq, err := m.NewStandaloneSequence(model.KVOptions{BlockTokens: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			ps, err := New(Config{Method: "minicache", Opts: Opts{}.With("gamma", 1)}, seq)
			if name == "yoco" {
				if err == nil || !contains(err.Error(), "cache layer 1 is read by sliding-window attention") {
					t.Fatalf("minicache on yoco: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			plain, err := m.NewStandaloneSequence(model.KVOptions{BlockTokens: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
			ps.BeginPrefill(T)
			if _, err := seq.Forward(st.ids[:T], false); err != nil {
				t.Fatal(err)
			}
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
			if _, err := plain.Forward(st.ids[:T], false); err != nil {
				t.Fatal(err)
			}
			cache := seq.Cache().(*kvcache.Paged)
			tok := st.ids[T]
			for step := 0; step < 10; step++ {
				if err := ps.Before(1); err != nil {
					t.Fatal(err)
				}
				got, err := seq.Forward([]int{tok}, false)
				if err != nil {
					t.Fatal(err)
				}
				want, err := plain.Forward([]int{tok}, false)
				if err != nil {
					t.Fatal(err)
				}
				for i := range got {
					if d := got[i] - want[i]; d > 1e-4 || d < -1e-4 {
						t.Fatalf("step %d: logit %d is %g, without merging %g", step, i, got[i], want[i])
					}
				}
				tok = argmax(want)
			}
			for l, merged := range []bool{false, true, true} {
				rest := make([]int, cache.Slots(l, 0)-1) // every token but the first
				for i := range rest {
					rest[i] = i + 1
				}
				err := cache.Keep(l, 0, rest)
				if (err != nil) != merged {
					t.Fatalf("cache layer %d: merged %v, but Keep says %v", l, merged, err)
				}
			}
		})
	}
}

// TestEarlyExitKeepsScoredRows: a prefill on YOCO's map exits early above
// the last KV owner (layer 2 of 5), except for the rows whose attention the
// policy scores (State.PromptRows): every prompt row for H2O and Expected,
// the observation window for SnapKV, the last row (needed for the logits
// anyway) for TOVA and the methods that score no attention. Rows computed
// are Sequence.RowLayers; H2O's upper readers ran every prompt query.
func TestEarlyExitKeepsScoredRows(t *testing.T) {
	st := mapped(t, "yoco")
	const T = 40
	for _, c := range []struct {
		cfg  Config
		rows int // rows of the 2 layers above the last owner
	}{
		{Config{Method: "streaming", Window: 12, Sinks: 4, Positions: PosOriginal}, 1},
		{Config{Method: "knorm", Budget: 16}, 1},
		{Config{Method: "tova", Budget: 16}, 1},
		{Config{Method: "snapkv", Budget: 24, Window: 8}, 8},
		{Config{Method: "h2o", Budget: 16}, T},
		{Config{Method: "expected", Budget: 16}, T},
	} {
		t.Run(c.cfg.String(), func(t *testing.T) {
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
			if _, err := seq.Forward(st.ids[:T], false); err != nil {
				t.Fatal(err)
			}
			if want := 3*T + 2*c.rows; seq.RowLayers != want {
				t.Fatalf("%d rows computed, want %d (3 layers × %d + 2 × %d)", seq.RowLayers, want, T, c.rows)
			}
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLCKVPassesWithPolicy: with Layer-Condensed KV's iterative prompt
// passes, the last pass's readers of the top layer attend the chunk's
// entries of the pass before, which the top layer appends after them: their
// mass lands on those slots-to-be (the model extends the request), so H2O's
// scores over the prompt are close to those of sequential encoding, and the
// invariants hold.
func TestLCKVPassesWithPolicy(t *testing.T) {
	st := mapped(t, "lckv")
	const T = 40
	total := func(passes int) float64 {
		seq, err := st.m.NewStandaloneSequence(model.KVOptions{BlockTokens: 16, Tokens: 128, LCKVPasses: passes})
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Close()
		ps, err := New(Config{Method: "h2o", Budget: 1000}, seq)
		if err != nil {
			t.Fatal(err)
		}
		ps.BeginPrefill(T)
		if _, err := seq.Forward(st.ids[:T], false); err != nil {
			t.Fatal(err)
		}
		var s float64
		for h := 0; h < ps.H; h++ {
			for _, v := range ps.Scores(2, h) {
				s += float64(v)
			}
		}
		return s
	}
	seqT, iterT := total(0), total(4)
	if d := iterT/seqT - 1; d > 0.2 || d < -0.2 {
		t.Fatalf("the top layer's prompt mass is %g with 4 passes, %g sequential", iterT, seqT)
	}
	for _, cfg := range []Config{{Method: "h2o", Budget: 48}, {Method: "snapkv", Budget: 64, Window: 16}, {Method: "tova", Budget: 40}} {
		t.Run(cfg.String(), func(t *testing.T) {
			runInvariantsOn(t, invShape{m: st.m, ids: st.ids, passes: 4}, cfg, [2]string{"f32", "f32"})
		})
	}
}
