package policy

import (
	"fmt"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
)

// TestInvariants runs every method with several codecs through a prefill,
// a compression and 120 decode steps, and checks after every step: the
// budget of each (layer, KV head) holds (window methods: at most
// sinks+window tokens, the token being processed included), sinks and the
// recent window are kept, kept tokens are in order, the pool holds exactly
// the blocks the tables need (pruned blocks were freed), and nothing leaks.
func TestInvariants(t *testing.T) {
	st := loadStories(t)
	configs := []Config{
		{Method: "window", Window: 40},
		{Method: "streaming", Window: 36, Sinks: 4},
		{Method: "streaming", Window: 36, Sinks: 4, Positions: PosOriginal, Every: 1},
		{Method: "lminfinite", Window: 60, Sinks: 4},
		{Method: "h2o", Budget: 48},
		{Method: "h2o", Ratio: 0.5, Every: 8},
		{Method: "tova", Budget: 40},
		{Method: "snapkv", Budget: 64, Window: 16},
		{Method: "snapkv", Ratio: 0.25, Window: 16, Every: 16},
		{Method: "adakv", Budget: 64, Window: 16},
		{Method: "pyramidkv", Budget: 64, Window: 16},
		{Method: "knorm", Budget: 50, Sinks: 2, Window: 8, Every: 4},
	}
	codecs := [][2]string{{"f32", "f32"}, {"q8", "q4"}, {"kivi4", "kivi2"}}
	for _, cfg := range configs {
		for _, cn := range codecs {
			t.Run(fmt.Sprintf("%s/%s-%s", cfg, cn[0], cn[1]), func(t *testing.T) {
				runInvariants(t, st, cfg, cn)
			})
		}
	}
}

// runInvariants is TestInvariants for one configuration and codec pair.
func runInvariants(t *testing.T, st stories, cfg Config, cn [2]string) {
	runInvariantsOn(t, invShape{m: st.m, ids: st.ids}, cfg, cn)
}

// invShape is what runInvariantsOn runs a policy on: a model, a token
// stream, and optionally a cache layout of its own and a wrapper of the
// policy's mass hook (the fake of a model whose layers share KV).
type invShape struct {
	m      *model.Model
	ids    []int
	layout *kvcache.Layout                                     // nil: the model's
	hook   func(ps *State, seq *model.Sequence) model.MassHook // nil: the policy's own
	passes int                                                 // Sequence.LCKVPasses
}

// newSequence is a sequence of sh's model over a cache of sh's layout.
func (sh invShape) newSequence(kc, vc codec.Codec) (*model.Sequence, error) {
	if sh.layout == nil {
		return sh.m.NewStandaloneSequence(model.KVOptions{K: kc, V: vc, BlockTokens: 16, LCKVPasses: sh.passes})
	}
	pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: *sh.layout, BlockTokens: 16, K: kc, V: vc, Tokens: sh.m.CtxLen})
	if err != nil {
		return nil, err
	}
	return sh.m.NewSequence(pool.NewSequence())
}

// runInvariantsOn is runInvariants on any shape: the budget is per cache
// (owner) layer, and a window-bounded cache layer (Layout.Windows) may
// have freed its sinks, which its readers cannot see anyway.
func runInvariantsOn(t *testing.T, sh invShape, cfg Config, cn [2]string) {
	const T = 150
	kc, _ := codec.Parse(cn[0], codec.Keys)
	vc, _ := codec.Parse(cn[1], codec.Values)
	seq, err := sh.newSequence(kc, vc)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := New(cfg, seq)
	if err != nil {
		if cfg.Positions == PosReindex || cfg.Method == "lminfinite" || (cfg.Method == "streaming" && cfg.Every == 0) {
			if !kc.PerToken() {
				return // re-indexing KIVI keys is refused with an error: fine
			}
		}
		t.Fatal(err)
	}
	if sh.hook != nil {
		seq.Mass = sh.hook(ps, seq)
	}
	c := ps.Config()
	pool := seq.Cache().(*kvcache.Paged).Pool()
	lay := seq.Cache().Layout()
	bounded := func(l int) bool { return lay.Windows != nil && lay.Windows[l] > 0 }
	ps.BeginPrefill(T)
	if _, err := seq.Forward(sh.ids[:T], false); err != nil {
		t.Fatal(err)
	}
	if err := ps.Compress(); err != nil {
		t.Fatal(err)
	}
	// grown: tokens appended since the last compression, for
	// methods that do not evict while decoding.
	check := func(stage string, grown int) {
		t.Helper()
		b := ps.budget(ps.seen)
		cache := seq.Cache().(*kvcache.Paged)
		for l, heads := range ps.Kept() {
			for h, kept := range heads {
				n := len(kept)
				if n != cache.Slots(l, h) {
					t.Fatalf("%s: layer %d head %d: %d origins for %d slots", stage, l, h, n, cache.Slots(l, h))
				}
				if pos := cache.Positions(l, h); c.Positions == PosOriginal && c.Method != "lminfinite" {
					for i := range pos {
						if pos[i] != kept[i] {
							t.Fatalf("%s: layer %d head %d: slot %d holds position %d, its origin says %d", stage, l, h, i, pos[i], kept[i])
						}
					}
				}
				limit := b
				switch c.Method {
				case "adakv":
					limit = b * lay.KVHeads // ragged heads
				case "pyramidkv":
					limit = 2 * b
				}
				if c.Every > 1 {
					limit += c.Every
				}
				if c.Every == 0 {
					limit += grown
				}
				if n > limit {
					t.Fatalf("%s: layer %d head %d holds %d tokens, budget %d", stage, l, h, n, limit)
				}
				for i := 1; i < n; i++ {
					if kept[i] <= kept[i-1] {
						t.Fatalf("%s: layer %d head %d: kept tokens out of order: %v", stage, l, h, kept)
					}
				}
				if !bounded(l) {
					for i := 0; i < min(c.Sinks, n); i++ {
						if kept[i] != int32(i) {
							t.Fatalf("%s: layer %d head %d: sink %d lost: %v", stage, l, h, i, kept[:c.Sinks])
						}
					}
				}
				if c.Every <= 1 && c.Method != "adakv" && c.Method != "pyramidkv" {
					w := min(c.Window, n)
					last := int32(ps.seen - 1)
					for i := 0; i < w; i++ {
						if kept[n-1-i] != last-int32(i) {
							t.Fatalf("%s: layer %d head %d: recent token %d lost: %v", stage, l, h, last-int32(i), kept[n-w:])
						}
					}
				}
			}
		}
		// The pool holds exactly the blocks the tables need: each table
		// is dense (full blocks and one partly filled last block).
		need := 0
		for l := 0; l < lay.Layers; l++ {
			for h := 0; h < lay.KVHeads; h++ {
				n := cache.Slots(l, h)
				if cn[0] == "kivi4" {
					n -= residualOf(cache, l, h)
				}
				need += (n + 15) / 16
			}
		}
		if u := pool.Usage(); u.Used != need || cache.Memory().Blocks != need {
			t.Fatalf("%s: pool uses %d blocks, the tables hold %d, they need %d", stage, u.Used, cache.Memory().Blocks, need)
		}
	}
	check("after compression", 0)
	tok := sh.ids[T]
	for step := 0; step < 120; step++ {
		if err := ps.Before(1); err != nil {
			t.Fatal(err)
		}
		logits, err := seq.Forward([]int{tok}, false)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		tok = argmax(logits)
		if c.Method == "window" || c.Method == "streaming" || c.Method == "lminfinite" {
			for l := 0; l < lay.Layers; l++ {
				if n := seq.Cache().(*kvcache.Paged).Slots(l, 0); n > c.Sinks+c.Window {
					t.Fatalf("step %d: layer %d holds %d tokens, more than sinks+window %d", step, l, n, c.Sinks+c.Window)
				}
			}
		}
		check(fmt.Sprintf("step %d", step), step+1)
	}
	seq.Close()
	if u := pool.Usage(); u.Used != 0 {
		t.Fatalf("%d blocks leaked", u.Used)
	}
}

func argmax(x []float32) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}

// residualOf counts the slots of a table kept in the KIVI residual (the
// segment that is not a 16-token block).
func residualOf(c *kvcache.Paged, l, h int) int {
	n := 0
	for _, s := range c.Segments(l, h) {
		if s.Cap != 16 {
			n += s.N
		}
	}
	return n
}
