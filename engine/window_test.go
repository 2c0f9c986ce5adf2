package engine

import (
	"bytes"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/sample"
)

// runWatch is memWatch plus the most tokens one step generated (the
// largest decode batch).
type runWatch struct {
	memWatch
	batch int
}

func (w *runWatch) Step(p, g int, d time.Duration) {
	w.memWatch.Step(p, g, d)
	w.mu.Lock()
	w.batch = max(w.batch, g)
	w.mu.Unlock()
}

// TestEngineWindowAdmitsMore: the same six requests (100-token prompts,
// 60 new tokens, prefilled 16 tokens a step) under the same --kv-mem (256
// arena chunks of two 1088-byte f32 blocks: 25 blocks of 16 tokens per
// table). The plain model cannot hold them together (each grows to 10
// blocks per table): it is preempted and decodes at most a few at a time.
// With every layer window-bounded (a sliding window of 16) the cache
// frees what slid out (a sequence holds at most 3 blocks per table), Need
// and AdmitBytesStep say so, and the engine decodes all six in one batch
// without a preemption. The KV memory never exceeds the budget, every
// block comes back, and each output is the model's own run alone.
func TestEngineWindowAdmitsMore(t *testing.T) {
	const budget = 256 * 2 * 1088
	requests := 0
	run := func(window int) (*runWatch, int) {
		m, tok := loadStories(t)
		m.Config.SlidingWindow = window
		if window > 0 && m.KVLayout().Windows == nil {
			t.Skip("the model's KVLayout reports no windows (issue 21's forward pass)")
		}
		w := &runWatch{}
		e := newEngine(t, m, Config{KVMem: budget, MaxRunning: 8, PrefillChunk: 16, Observer: w})
		w.e = e
		short := prompts(tok)
		var ps [][]int
		for i := range short {
			p := slices.Clone(short[i])
			for j := i + 1; len(p) < 100; j++ {
				p = append(p, short[j%len(short)][1:]...) // without their BOS
			}
			ps = append(ps, p[:100])
		}
		requests = len(ps)
		hs := make([]*Handle, len(ps))
		for i, p := range ps {
			hs[i] = must(e.Submit(GenRequest{Prompt: p, MaxTokens: 60}))
		}
		pre := 0
		for i, h := range hs {
			o := collect(t, h)
			if o.finish[0] != FinishLength && o.finish[0] != FinishEOS {
				t.Fatalf("window %d, prompt %d: %s %v", window, i, o.finish[0], o.errs[0])
			}
			if want := reference(t, m, ps[i], 60, sample.Params{}); !slices.Equal(o.tokens[0], want) {
				t.Errorf("window %d, prompt %d: got %v\nwant %v", window, i, o.tokens[0], want)
			}
			pre += o.usage.Preemptions
		}
		if w.arena > e.Stats().BudgetBytes || w.ref > e.Stats().BudgetBytes {
			t.Errorf("window %d: %d bytes allocated, %d referenced, budget %d", window, w.arena, w.ref, e.Stats().BudgetBytes)
		}
		checkFree(t, e)
		t.Logf("window %d: decode batches of at most %d, %d preemptions, at most %d B referenced of %d (%d B allocated)", window, w.batch, pre, w.ref, e.Stats().BudgetBytes, w.arena)
		return w, pre
	}
	plain, plainPre := run(0)
	win, winPre := run(16)
	if plainPre == 0 {
		t.Error("the plain model was never preempted: the budget does not bind")
	}
	if win.batch != requests || win.batch <= plain.batch || winPre != 0 {
		t.Errorf("windowed: decode batches of at most %d (plain %d), %d preemptions (plain %d)", win.batch, plain.batch, winPre, plainPre)
	}
}

// TestEngineWindowSlots: a slot of a window-bounded model saves and
// restores while its windows have freed nothing (the restored tokens go
// to the prefix cache and the next request reuses them, with the model's
// own output); once a window freed tokens, the slot file (version 2)
// holds the tables as they are, the drops included, and restores them
// as they were. Under KIVI (kivi2 keys, kivi4 values) the window of 64
// fits in the residual, so its tables are never sealed and the slot holds
// them as residuals alone (kvcache.Footprint.Unsealed).
func TestEngineWindowSlots(t *testing.T) {
	for _, cp := range [][2]string{{"f32", "f32"}, {"kivi2", "kivi4"}} {
		t.Run(cp[0]+"-"+cp[1], func(t *testing.T) { testEngineWindowSlots(t, cp[0], cp[1]) })
	}
}

func testEngineWindowSlots(t *testing.T, k, v string) {
	m, tok := loadStories(t)
	m.Config.SlidingWindow = 64
	if m.KVLayout().Windows == nil {
		t.Skip("the model's KVLayout reports no windows (issue 21's forward pass)")
	}
	e := newEngine(t, m, Config{K: k, V: v})
	prompt := tok.Encode("Once upon a time, there was a little girl named Lily.", true, false)
	short, long := 3, 4
	a := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: 20, Slot: &short})))
	collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: 150, Slot: &long})))
	var file bytes.Buffer
	if _, err := e.SaveSlot(short, &file); err != nil {
		t.Fatal(err)
	}
	var longFile bytes.Buffer
	if _, err := e.SaveSlot(long, &longFile); err != nil {
		t.Fatalf("saving a slot whose window freed tokens: %v", err)
	}
	e2 := newEngine(t, m, Config{K: k, V: v})
	if _, err := e2.RestoreSlot(0, bytes.NewReader(file.Bytes())); err != nil {
		t.Fatal(err)
	}
	if _, err := e2.RestoreSlot(1, bytes.NewReader(longFile.Bytes())); err != nil {
		t.Fatal(err)
	}
	var was, is *kvcache.Image
	e.do(func() { was, _ = e.slots[long].cache.(*kvcache.Paged).Image() })
	e2.do(func() { is, _ = e2.slots[1].cache.(*kvcache.Paged).Image() })
	if was == nil || is == nil || !reflect.DeepEqual(was, is) || was.Tables[0].Drop == 0 {
		t.Errorf("the restored slot's tables differ from the saved ones (or no window freed any)")
	}
	if k == "kivi2" && (was.Tables[0].N != 0 || was.Tables[0].Res == nil || was.Tables[0].Res.N != 64) {
		t.Errorf("a never-sealed KIVI table holds %d sealed tokens and a residual of %v, want 0 and the window of 64", was.Tables[0].N, was.Tables[0].Res)
	}
	e2.EraseSlot(1)
	next := slices.Concat(prompt, a.tokens[0], tok.Encode("The end", false, false))
	b := collect(t, must(e2.Submit(GenRequest{Prompt: next, MaxTokens: 5})))
	if k != "kivi2" && b.usage.CachedTokens < (len(prompt)+19)/16*16 { // KIVI tables are never prefix-cached
		t.Errorf("restored slot: %d cached tokens of %d", b.usage.CachedTokens, len(next))
	}
	if want := reference(t, m, next, 5, sample.Params{}); !slices.Equal(b.tokens[0], want) {
		t.Errorf("after restore: %v, want %v", b.tokens[0], want)
	}
}

// TestEngineWindowNotEvicted: tokens a window frees are not counted as
// tokens a compression policy evicted: a policy whose budget holds every
// token reports no eviction on a window-bounded model.
func TestEngineWindowNotEvicted(t *testing.T) {
	m, tok := loadStories(t)
	m.Config.SlidingWindow = 16
	if m.KVLayout().Windows == nil {
		t.Skip("the model's KVLayout reports no windows (issue 21's forward pass)")
	}
	e := newEngine(t, m, Config{PrefillChunk: 16})
	var prompt []int
	for len(prompt) < 100 {
		prompt = append(prompt, prompts(tok)[len(prompt)%6]...)
	}
	o := collect(t, must(e.Submit(GenRequest{Prompt: prompt[:100], MaxTokens: 20, Policy: policy.Config{Method: "h2o", Budget: 1000}})))
	if o.errs[0] != nil {
		t.Fatal(o.errs[0])
	}
	if o.usage.EvictedTokens != 0 {
		t.Errorf("%d tokens reported evicted by a policy that keeps 1000", o.usage.EvictedTokens)
	}
	checkFree(t, e)
}
