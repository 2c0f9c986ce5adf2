package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/sample"
)

// memWatch records at every scheduler step the most KV memory allocated
// (the arena) and held by the pools together (their chunks), and the most
// pools that existed at once.
type memWatch struct {
	nopObserver
	e                *Engine
	mu               sync.Mutex
	arena, held, ref int64
	pools            int
}

func (w *memWatch) Step(int, int, time.Duration) {
	st := w.e.Stats()
	var held int64
	for _, p := range st.Pools {
		held += p.BytesTotal
	}
	w.mu.Lock()
	w.arena = max(w.arena, st.ArenaBytes)
	w.held = max(w.held, held)
	w.ref = max(w.ref, st.UsedBytes)
	w.pools = max(w.pools, len(st.Pools))
	w.mu.Unlock()
}

// Requests rotating through every (K, V) codec pair, more pairs than
// MaxPools (pools are dropped and made again) and more distinct prompts
// than the budget holds (cached prefixes fill it): the KV memory the
// pools allocate together, cached and free blocks included, never exceeds
// the budget, and every request still runs.
func TestEngineKVMemoryBounded(t *testing.T) {
	m, tok := loadStories(t)
	for _, c := range []struct {
		name     string
		budget   int64
		maxPools int
		perPair  int
	}{
		{"2MiB four pools", 2 << 20, 4, 4},
		{"1MiB seven pools", 1 << 20, 7, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := &memWatch{}
			e := newEngine(t, m, Config{KVMem: c.budget, MaxPools: c.maxPools, MaxRunning: 8, Observer: w})
			w.e = e
			req := 0
			for round := range 2 {
				for _, kn := range codec.Names {
					for _, vn := range codec.Names {
						var hs []*Handle
						for range c.perPair {
							req++
							text := fmt.Sprintf("Once upon a time, in a town number %d, there lived a little girl who loved to play with her %d friends in the park every day.", req, round)
							h, err := e.Submit(GenRequest{Prompt: tok.Encode(text, true, false), MaxTokens: 5, K: kn, V: vn, N: 1 + req%2,
								Sampling: sample.Params{Temperature: 1, Seed: uint64(req)}})
							if err != nil {
								t.Fatalf("%s/%s: %v", kn, vn, err)
							}
							hs = append(hs, h)
						}
						for _, h := range hs {
							o := collect(t, h)
							for j, f := range o.finish {
								if f != FinishLength && f != FinishEOS {
									t.Errorf("%s/%s sample %d: %s %v", kn, vn, j, f, o.errs[j])
								}
							}
						}
					}
				}
			}
			checkFree(t, e)
			st := e.Stats()
			w.mu.Lock()
			defer w.mu.Unlock()
			t.Logf("budget %d: arena allocated at most %d, pools held at most %d, referenced at most %d; %d pools at most; end: %+v",
				st.BudgetBytes, w.arena, w.held, w.ref, w.pools, st)
			if w.arena > st.BudgetBytes || w.held > st.BudgetBytes || st.BudgetBytes > c.budget {
				t.Errorf("KV memory allocated %d, held by the pools %d: more than the budget %d", w.arena, w.held, st.BudgetBytes)
			}
			if w.arena < st.BudgetBytes/2 {
				t.Errorf("the arena never filled (%d of %d bytes): the test does not press the budget", w.arena, st.BudgetBytes)
			}
			if w.pools < min(c.maxPools, 2) {
				t.Errorf("at most %d pools at once", w.pools)
			}
		})
	}
}
