package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/sample"
	"github.com/kvlm/kvlm/tokenizer"
)

func loadStories(t testing.TB) (*model.Model, tokenizer.Tokenizer) {
	t.Helper()
	m, tok, err := Load(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/stories260K/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, tok
}

func newEngine(t testing.TB, m *model.Model, cfg Config) *Engine {
	t.Helper()
	e, err := New(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

type outcome struct {
	tokens  [][]int
	finish  []FinishReason
	errs    []error
	usage   Usage
	tokenAt []time.Time
}

func collect(t testing.TB, h *Handle) outcome {
	t.Helper()
	o := outcome{tokens: make([][]int, h.N()), finish: make([]FinishReason, h.N()), errs: make([]error, h.N())}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		ev, err := h.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Done {
			o.finish[ev.Choice], o.errs[ev.Choice] = ev.Finish, ev.Err
			continue
		}
		o.tokens[ev.Choice] = append(o.tokens[ev.Choice], ev.Token)
	}
	o.usage = h.Usage()
	return o
}

// reference generates with engine.Generate on a standalone sequence.
func reference(t testing.TB, m *model.Model, prompt []int, n int, p sample.Params) []int {
	t.Helper()
	seq, err := m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	smp, err := samplerFor(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Generate(seq, Request{Prompt: prompt, MaxTokens: n, EOS: -1, Sampler: smp})
	if err != nil {
		t.Fatal(err)
	}
	return res.Tokens
}

func prompts(tok tokenizer.Tokenizer) [][]int {
	texts := []string{"Once upon a time", "The cat sat on the mat and", "Lily and Ben went to the park. They",
		"One day, a little bird", "Tom had a red ball. He", "The sun was hot and the children wanted to swim in the"}
	var out [][]int
	for _, s := range texts {
		out = append(out, tok.Encode(s, true, false))
	}
	return out
}

func checkFree(t testing.TB, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := e.Stats()
		if st.UsedBytes == 0 && st.Running == 0 && st.Waiting == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool not free: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Concurrent requests, batched, give what one sequence alone gives.
func TestEngineMatchesGenerate(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{PrefillChunk: 7})
	ps := prompts(tok)
	var wg sync.WaitGroup
	got := make([]outcome, len(ps))
	params := []sample.Params{{}, {Temperature: 1, TopP: 0.9, Seed: 42}}
	for pi, p := range params {
		for i, pr := range ps {
			h, err := e.Submit(GenRequest{Prompt: pr, MaxTokens: 40 + 10*i, Sampling: p})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() { defer wg.Done(); got[i] = collect(t, h) }()
		}
		wg.Wait()
		for i, pr := range ps {
			want := reference(t, m, pr, 40+10*i, p)
			if !slices.Equal(got[i].tokens[0], want) || got[i].finish[0] != FinishLength {
				t.Errorf("params %d prompt %d: got %v (%s)\nwant %v", pi, i, got[i].tokens[0], got[i].finish[0], want)
			}
			if u := got[i].usage; u.PromptTokens != len(pr) || u.CompletionTokens != len(want) || u.KVBytesPeak <= 0 {
				t.Errorf("usage %+v", u)
			}
		}
	}
	checkFree(t, e)
}

func TestEnginePrefixCache(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{})
	prompt := tok.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.", true, false)
	a := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: 20})))
	b := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: 20})))
	if a.usage.CachedTokens != 0 {
		t.Errorf("first request: %d cached tokens", a.usage.CachedTokens)
	}
	want := (len(prompt) - 1) / 16 * 16
	if b.usage.CachedTokens != want {
		t.Errorf("second request: %d cached tokens, want %d", b.usage.CachedTokens, want)
	}
	if !slices.Equal(a.tokens[0], b.tokens[0]) {
		t.Errorf("outputs differ: %v vs %v", a.tokens[0], b.tokens[0])
	}
	// The next turn of a conversation: the prompt plus the answer and more.
	next := slices.Concat(prompt, a.tokens[0], tok.Encode("Then", false, false))
	c := collect(t, must(e.Submit(GenRequest{Prompt: next, MaxTokens: 5})))
	if c.usage.CachedTokens < (len(prompt)+len(a.tokens[0])-1)/16*16 {
		t.Errorf("next turn: %d of %d tokens cached", c.usage.CachedTokens, len(next))
	}
	st := e.Stats()
	if st.PrefixHit != int64(b.usage.CachedTokens+c.usage.CachedTokens) || st.PrefixQueried != int64(2*len(prompt)+len(next)) {
		t.Errorf("stats %+v", st)
	}
	checkFree(t, e)
}

func must(h *Handle, err error) *Handle {
	if err != nil {
		panic(err)
	}
	return h
}

// A pool too small for every sequence at once: samples are preempted and
// recomputed, and the outputs do not change.
func TestEnginePreemption(t *testing.T) {
	m, tok := loadStories(t)
	// 20 tables × 1088-byte blocks: 200 tokens of room in all.
	e := newEngine(t, m, Config{KVMem: 20 * 1088 * 13, MaxRunning: 8})
	ps := prompts(tok)
	hs := make([]*Handle, len(ps))
	for i, p := range ps {
		hs[i] = must(e.Submit(GenRequest{Prompt: p, MaxTokens: 60}))
	}
	pre := 0
	for i, h := range hs {
		o := collect(t, h)
		want := reference(t, m, ps[i], 60, sample.Params{})
		if !slices.Equal(o.tokens[0], want) {
			t.Errorf("prompt %d (%d preemptions): got %v\nwant %v", i, o.usage.Preemptions, o.tokens[0], want)
		}
		pre += o.usage.Preemptions
	}
	if pre == 0 || e.Stats().Preemptions == 0 {
		t.Error("no preemption with a pool for 200 tokens")
	}
	t.Logf("%d preemptions", pre)
	checkFree(t, e)
	// A sequence longer than the whole pool ends with "context".
	o := collect(t, must(e.Submit(GenRequest{Prompt: ps[0], MaxTokens: 400})))
	if o.finish[0] != FinishContext || len(o.tokens[0]) == 0 {
		t.Errorf("over-long sequence: %s after %d tokens", o.finish[0], len(o.tokens[0]))
	}
	checkFree(t, e)
}

func TestEngineCancelAndStop(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{})
	h := must(e.Submit(GenRequest{Prompt: prompts(tok)[0], MaxTokens: 400, N: 2}))
	ctx := context.Background()
	for n := 0; n < 10; {
		ev, err := h.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !ev.Done {
			n++
		}
	}
	h.StopChoice(1)
	h.Cancel()
	o := collect(t, h)
	if o.finish[0] != FinishCancelled && o.finish[0] != FinishLength {
		t.Errorf("finish %v", o.finish)
	}
	checkFree(t, e)
	// Cancelled while waiting.
	e2 := newEngine(t, m, Config{MaxRunning: 1, MaxQueue: 2})
	a := must(e2.Submit(GenRequest{Prompt: prompts(tok)[1], MaxTokens: 300}))
	if _, err := a.Next(ctx); err != nil { // a runs: b and c wait
		t.Fatal(err)
	}
	b := must(e2.Submit(GenRequest{Prompt: prompts(tok)[2], MaxTokens: 300}))
	c := must(e2.Submit(GenRequest{Prompt: prompts(tok)[2], MaxTokens: 300}))
	var ce *CapacityError
	if _, err := e2.Submit(GenRequest{Prompt: prompts(tok)[2], MaxTokens: 300}); !errors.Is(err, ErrQueueFull) || !errors.As(err, &ce) || ce.RetryAfter <= 0 {
		t.Errorf("queue full: %v, want a *CapacityError with ErrQueueFull and a RetryAfter", err)
	}
	b.Cancel()
	c.Cancel()
	a.Cancel()
	for _, h := range []*Handle{a, b, c} {
		if o := collect(t, h); o.finish[0] != FinishCancelled {
			t.Errorf("finish %v", o.finish)
		}
	}
	checkFree(t, e2)
}

func TestEngineN(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{})
	p := sample.Params{Temperature: 1, TopP: 0.9, Seed: 7}
	pr := prompts(tok)[3]
	o := collect(t, must(e.Submit(GenRequest{Prompt: pr, MaxTokens: 30, N: 3, Sampling: p})))
	for i := range 3 {
		q := p
		q.Seed += uint64(i)
		want := reference(t, m, pr, 30, q)
		if !slices.Equal(o.tokens[i], want) {
			t.Errorf("sample %d: got %v\nwant %v", i, o.tokens[i], want)
		}
	}
	if slices.Equal(o.tokens[0], o.tokens[1]) {
		t.Error("samples 0 and 1 are equal")
	}
	if o.usage.CompletionTokens != 90 {
		t.Errorf("usage %+v", o.usage)
	}
	checkFree(t, e)
}

func TestEnginePoliciesAndCodecs(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{PrefillChunk: 32})
	long := tok.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. Lily's mom said, \"Lily, let's go to the park.\"", true, false)
	cases := []GenRequest{
		{Policy: policy.Config{Method: "snapkv", Ratio: 0.5}},
		{Policy: policy.Config{Method: "streaming", Window: 32}},
		{Policy: policy.Config{Method: "h2o", Budget: 48}, N: 2},
		{Policy: policy.Config{Method: "tova", Budget: 40}, K: "q8", V: "q8"},
		{Policy: policy.Config{Method: "pyramidinfer"}},
		{Policy: policy.Config{Method: "knorm", Ratio: 0.5}, K: "kivi4", V: "kivi4"},
		{K: "f16", V: "q4"},
	}
	var wg sync.WaitGroup
	for i, c := range cases {
		c.Prompt, c.MaxTokens, c.Sampling = long, 80, sample.Params{Temperature: 0.8, Seed: uint64(i + 1)}
		h, err := e.Submit(c)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := collect(t, h)
			for j, f := range o.finish {
				if f == FinishError {
					t.Errorf("case %d sample %d: %v", i, j, o.errs[j])
				}
			}
			if c.Policy.Method != "" && c.Policy.Method != "pyramidinfer" && o.usage.EvictedTokens == 0 {
				t.Errorf("case %d (%s): nothing evicted: %+v", i, c.Policy.Method, o.usage)
			}
			t.Logf("case %d: %+v", i, o.usage)
		}()
	}
	wg.Wait()
	checkFree(t, e)
	if n := len(e.Stats().Pools); n != 4 {
		t.Errorf("%d pools, want 4 (f32/f32 q8/q8 kivi4/kivi4 f16/q4)", n)
	}
	// While four pairs are in use a fifth is refused; once they are idle,
	// an unused pool makes room.
	var held []*Handle
	for _, kv := range [][2]string{{"q8", "q8"}, {"kivi4", "kivi4"}, {"f16", "q4"}} {
		held = append(held, must(e.Submit(GenRequest{Prompt: long, MaxTokens: 300, K: kv[0], V: kv[1]})))
	}
	var ce *CapacityError
	if _, err := e.Submit(GenRequest{Prompt: long, MaxTokens: 1, K: "bf16"}); !errors.As(err, &ce) || !errors.Is(err, ErrPoolsBusy) || ce.RetryAfter <= 0 {
		t.Errorf("a fifth codec pair while four are in use: %v, want a *CapacityError with ErrPoolsBusy and a RetryAfter", err)
	}
	for _, h := range held {
		h.Cancel()
		collect(t, h)
	}
	checkFree(t, e)
	o := collect(t, must(e.Submit(GenRequest{Prompt: long, MaxTokens: 1, K: "bf16"})))
	if o.finish[0] != FinishLength || len(e.Stats().Pools) != 4 {
		t.Errorf("bf16 keys: %v, %d pools", o.finish, len(e.Stats().Pools))
	}
}

func TestEngineInvalid(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{KVMem: 20 * 1088 * 4})
	p := prompts(tok)[0]
	bad := []GenRequest{
		{},
		{Prompt: p},
		{Prompt: p, MaxTokens: -1},
		{Prompt: make([]int, m.CtxLen), MaxTokens: 1},
		{Prompt: []int{1, 9999}, MaxTokens: 1},
		{Prompt: p, MaxTokens: 1, N: 100},
		{Prompt: p, MaxTokens: 1, Sampling: sample.Params{Temperature: -1}},
		{Prompt: p, MaxTokens: 1, Policy: policy.Config{Method: "nope"}},
		{Prompt: p, MaxTokens: 1, Policy: policy.Config{Method: "snapkv"}},
		{Prompt: p, MaxTokens: 1, K: "q3"},
		{Prompt: p, MaxTokens: 1, K: "kivi2", Policy: policy.Config{Method: "streaming", Window: 8, Positions: policy.PosReindex}},
		{Prompt: make([]int, 100), MaxTokens: 1},                                                 // more than the pool
		{Prompt: p, MaxTokens: 1, Slot: new(int), Policy: policy.Config{Method: "pyramidinfer"}}, // its state cannot be saved
	}
	for i, r := range bad {
		_, err := e.Submit(r)
		var ie *InvalidError
		if !errors.As(err, &ie) {
			t.Errorf("case %d: %v", i, err)
		} else {
			t.Logf("case %d: %v", i, err)
		}
	}
}

func TestEngineSlots(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{})
	prompt := tok.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park.", true, false)
	slot := 3
	a := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: 20, Slot: &slot})))
	infos, err := e.Slots()
	if err != nil || len(infos) != 1 || infos[0].Tokens != len(prompt)+19 {
		t.Fatalf("slots %+v %v", infos, err)
	}
	var file bytes.Buffer
	if _, err := e.SaveSlot(3, &file); err != nil {
		t.Fatal(err)
	}
	if _, err := e.SaveSlot(4, io.Discard); !errors.Is(err, ErrNoSlot) {
		t.Errorf("empty slot saved: %v", err)
	}
	// A fresh engine (no prefix cache) restores the file.
	e2 := newEngine(t, m, Config{K: "f32"})
	if _, err := e2.RestoreSlot(0, bytes.NewReader(file.Bytes())); err != nil {
		t.Fatal(err)
	}
	next := slices.Concat(prompt, a.tokens[0], tok.Encode("The end", false, false))
	b := collect(t, must(e2.Submit(GenRequest{Prompt: next, MaxTokens: 5})))
	if b.usage.CachedTokens < (len(prompt)+19)/16*16 {
		t.Errorf("restored slot: %d cached tokens of %d", b.usage.CachedTokens, len(next))
	}
	want := reference(t, m, next, 5, sample.Params{})
	if !slices.Equal(b.tokens[0], want) {
		t.Errorf("after restore: %v, want %v", b.tokens[0], want)
	}
	// Corrupt files.
	bad := slices.Clone(file.Bytes())
	bad[len(bad)/2] ^= 1
	if _, err := e2.RestoreSlot(1, bytes.NewReader(bad)); err == nil {
		t.Error("corrupt file restored")
	}
	if _, err := e2.RestoreSlot(1, bytes.NewReader(file.Bytes()[:100])); err == nil {
		t.Error("truncated file restored")
	}
	other := bytes.Replace(file.Bytes(), []byte(Fingerprint(m)), []byte(fmt.Sprintf("%032x", 1)), 1)
	if _, err := e2.RestoreSlot(1, bytes.NewReader(other)); err == nil {
		t.Error("another model's file restored")
	}
	if err := e2.EraseSlot(0); err != nil {
		t.Error(err)
	}
	if err := e.EraseSlot(3); err != nil {
		t.Error(err)
	}
	checkFree(t, e)
	checkFree(t, e2)
}

// BenchmarkEngineThroughput: total generated tokens per second with 16
// concurrent requests, batched (MaxRunning 16) and one at a time
// (MaxRunning 1).
//
//	go test -run X -bench EngineThroughput -benchtime 3x ./engine/
func BenchmarkEngineThroughput(b *testing.B) {
	m, tok := loadStories(b)
	ps := prompts(tok)
	for _, running := range []int{1, 16} {
		b.Run(fmt.Sprintf("max-running=%d", running), func(b *testing.B) {
			e := newEngine(b, m, Config{MaxRunning: running})
			total := 0
			for b.Loop() {
				var wg sync.WaitGroup
				for i := range 16 {
					h := must(e.Submit(GenRequest{Prompt: ps[i%len(ps)], MaxTokens: 128, Sampling: sample.Params{Temperature: 1, Seed: uint64(i + 1)}}))
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							ev, err := h.Next(context.Background())
							if err != nil {
								return
							}
							if !ev.Done {
								total++
							}
						}
					}()
				}
				wg.Wait()
			}
			b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// stepWatch records, at the end of every scheduler step, the most samples
// that were running at once (read on the scheduler goroutine).
type stepWatch struct {
	nopObserver
	e   *Engine
	mu  sync.Mutex
	max int
}

func (w *stepWatch) Step(int, int, time.Duration) {
	w.mu.Lock()
	w.max = max(w.max, len(w.e.running))
	w.mu.Unlock()
}

// --max-running counts every sample of an n > 1 request, also before its
// samples are forked (after the prompt's prefill) and when it is preempted.
func TestEngineMaxRunningCountsSamples(t *testing.T) {
	m, tok := loadStories(t)
	ps := prompts(tok)
	cases := []struct {
		name       string
		maxRunning int
		ns         []int // n of each request, submitted together
		kvMem      int64 // small: samples are preempted (and readmitted)
		long       bool  // long prompts, prefilled 8 tokens a step: preempted while prefilling, before their fork
	}{
		{"n=4 then singles", 4, []int{4, 1, 1, 1}, 0, false},
		{"singles then n=3", 4, []int{1, 3, 1, 2}, 0, false},
		{"two n=2", 3, []int{2, 2, 1}, 0, false},
		{"preempted", 4, []int{3, 3, 1, 2, 4}, 120 << 10, false},
		{"preempted in prefill", 4, []int{1, 3, 3, 1, 2}, 200 << 10, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := &stepWatch{}
			cfg := Config{MaxRunning: c.maxRunning, KVMem: c.kvMem, Observer: w}
			if c.long {
				cfg.PrefillChunk = 8
			}
			e := newEngine(t, m, cfg)
			w.e = e
			var hs []*Handle
			for i, n := range c.ns {
				prompt := ps[i]
				if c.long {
					prompt = slices.Concat(ps[i], ps[(i+1)%len(ps)], ps[(i+2)%len(ps)], ps[(i+3)%len(ps)])
				}
				hs = append(hs, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: 40, N: n,
					Sampling: sample.Params{Temperature: 1, Seed: uint64(i + 1)}})))
			}
			for i, h := range hs {
				o := collect(t, h)
				for j, f := range o.finish {
					if f != FinishLength && f != FinishEOS {
						t.Errorf("request %d sample %d: %s %v", i, j, f, o.errs[j])
					}
				}
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.max > c.maxRunning {
				t.Errorf("%d samples ran at once, MaxRunning is %d", w.max, c.maxRunning)
			}
			if c.kvMem > 0 && e.Stats().Preemptions == 0 {
				t.Errorf("nothing was preempted with %d bytes of KV", c.kvMem)
			}
			if w.max < c.maxRunning-1 {
				t.Errorf("at most %d samples ran at once: the test does not load the engine (MaxRunning %d)", w.max, c.maxRunning)
			}
			checkFree(t, e)
		})
	}
}
