package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// benchSweep is throughput through the serving engine (continuous
// batching, admission by KV bytes, preemption) at one fixed KV memory, for
// several batch sizes: PyramidInfer's Figure 11 on this machine. At each
// point a new engine of KVMem bytes, at most Batch samples running,
// receives Requests requests at once, each a distinct pseudo-random prompt
// of PromptTokens tokens, decoding GenTokens greedy tokens (no stop
// token, no prefix cache) under Policy in KVType.
type benchSweep struct {
	KVMem        int64             `json:"kv_mem_bytes"` // the engine's KV budget (engine.Engine.Budget)
	Policy       string            `json:"kv_policy"`
	KVType       string            `json:"kv_type"`
	PromptTokens int               `json:"prompt_tokens"`
	GenTokens    int               `json:"gen_tokens"`
	Points       []benchSweepPoint `json:"points"`
}

// benchSweepPoint is one batch size. TokS is every generated token over
// the wall time from the first submission to the last token (prefill
// included, as a served batch sees it); DecodeTokS counts only the
// scheduler steps that ran no prompt tokens (their tokens over their
// time). The batch actually decoded is what the KV memory let run:
// PeakRunning and MeanRunning are the most and the mean tokens generated
// by a scheduler step (engine.Observer.Step: the samples decoded
// together, plus those whose prompt ended in the step); PeakWaiting the most requests and preempted samples
// waiting at the end of a step (engine.Stats.Waiting), Preemptions the
// engine's count (engine.Stats.Preemptions) and RequestsPreempted the
// requests preempted at least once (engine.Usage.Preemptions).
type benchSweepPoint struct {
	Batch             int            `json:"batch"`
	Requests          int            `json:"requests"`
	WallS             float64        `json:"wall_s"`
	Generated         int            `json:"generated"`
	TokS              float64        `json:"tok_s"`
	DecodeTokS        float64        `json:"decode_tok_s"`
	PeakRunning       int            `json:"peak_running"`
	MeanRunning       float64        `json:"mean_running"`
	PeakWaiting       int            `json:"peak_waiting"`
	Preemptions       int64          `json:"preemptions"`
	RequestsPreempted int            `json:"requests_preempted"`
	PeakKVBytes       int64          `json:"peak_kv_bytes"` // the most bytes referenced at the end of a step (engine.Stats.UsedBytes)
	Finish            map[string]int `json:"finish"`        // samples by finish reason
}

// sweepObserver collects a point's step measurements (engine.Observer:
// called on the scheduler goroutine).
type sweepObserver struct {
	e                      *engine.Engine
	decodeSteps, decodeGen int
	decodeTime             time.Duration
	batchSum, peakBatch    int
	peakWaiting            int
	peakBytes              int64
}

func (o *sweepObserver) FirstToken(time.Duration)                    {}
func (o *sweepObserver) InterToken(time.Duration)                    {}
func (o *sweepObserver) Evicted(string, float64)                     {}
func (o *sweepObserver) Preempted()                                  {}
func (o *sweepObserver) Finished(engine.FinishReason, time.Duration) {}
func (o *sweepObserver) Step(prefill, generated int, d time.Duration) {
	if generated > 0 {
		o.batchSum += generated
		o.decodeSteps++
		o.peakBatch = max(o.peakBatch, generated)
	}
	if prefill == 0 && generated > 0 {
		o.decodeGen += generated
		o.decodeTime += d
	}
	if o.e != nil {
		st := o.e.Stats()
		o.peakWaiting = max(o.peakWaiting, st.Waiting)
		o.peakBytes = max(o.peakBytes, st.UsedBytes)
	}
}

// benchSweepBatch runs --sweep-batch: see benchSweep.
func benchSweepBatch(mf *modelFlags, f *benchFlags, m *model.Model, batches []int) (*benchSweep, error) {
	if mf.kvMem == "" {
		return nil, errors.New("--sweep-batch measures at a fixed KV memory: give --kv-mem, e.g. 1GiB")
	}
	if f.sweepRequests < 0 {
		return nil, fmt.Errorf("--sweep-requests must not be negative, got %d", f.sweepRequests)
	}
	opt, err := mf.kvOptions()
	if err != nil {
		return nil, err
	}
	pc, err := mf.policyConfig()
	if err != nil {
		return nil, err
	}
	res := &benchSweep{Policy: pc.String(), KVType: opt.K.Name() + "/" + opt.V.Name(), PromptTokens: f.promptN, GenTokens: f.genN}
	engine.Fingerprint(m) // once, before the engines' background fingerprints (cached per model)
	for _, b := range batches {
		n := f.sweepRequests
		if n == 0 {
			n = b
		}
		obs := &sweepObserver{}
		e, err := engine.New(m, engine.Config{KVMem: opt.MemBytes, BlockTokens: opt.BlockTokens, K: opt.K.Name(), V: opt.V.Name(),
			MaxRunning: b, MaxQueue: max(n, 256), PrefillChunk: mf.chunk, Observer: obs, KeyShiftPrompt: keyShiftPrompt(mf.keyShift, mf.tok)})
		if err != nil {
			return nil, err
		}
		obs.e = e
		res.KVMem = e.Budget()
		pt, err := sweepPoint(e, obs, m, pc, b, n, f.promptN, f.genN)
		e.Close()
		if err != nil {
			return nil, fmt.Errorf("--sweep-batch %d: %w", b, err)
		}
		res.Points = append(res.Points, pt)
	}
	return res, nil
}

func sweepPoint(e *engine.Engine, obs *sweepObserver, m *model.Model, pc policy.Config, b, n, promptN, gen int) (benchSweepPoint, error) {
	pt := benchSweepPoint{Batch: b, Requests: n, Finish: map[string]int{}}
	hs := make([]*engine.Handle, n)
	t0 := time.Now()
	for i := range hs {
		h, err := e.Submit(engine.GenRequest{Prompt: benchPrompt(promptN, m.Vocab, uint64(100+i)), MaxTokens: gen, Policy: pc, NoPrefixCache: true})
		if err != nil {
			return pt, err
		}
		hs[i] = h
	}
	for _, h := range hs {
		for {
			ev, err := h.Next(context.Background())
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return pt, err
			}
			if ev.Done {
				if ev.Err != nil {
					return pt, ev.Err
				}
				pt.Finish[string(ev.Finish)]++
				continue
			}
			pt.Generated++
		}
		if h.Usage().Preemptions > 0 {
			pt.RequestsPreempted++
		}
	}
	wall := time.Since(t0)
	pt.WallS = wall.Seconds()
	pt.TokS = float64(pt.Generated) / wall.Seconds()
	if obs.decodeTime > 0 {
		pt.DecodeTokS = float64(obs.decodeGen) / obs.decodeTime.Seconds()
	}
	if obs.decodeSteps > 0 {
		pt.MeanRunning = float64(obs.batchSum) / float64(obs.decodeSteps)
	}
	pt.PeakRunning, pt.PeakWaiting, pt.PeakKVBytes = obs.peakBatch, obs.peakWaiting, obs.peakBytes
	pt.Preemptions = e.Stats().Preemptions
	return pt, nil
}

func printSweep(w io.Writer, s *benchSweep) {
	fmt.Fprintf(w, "sweep            through the engine in %s of KV memory, %s, KV %s: %d-token prompts, %d tokens generated each\n",
		human(s.KVMem), s.Policy, s.KVType, s.PromptTokens, s.GenTokens)
	for _, p := range s.Points {
		reasons := make([]string, 0, len(p.Finish))
		for r := range p.Finish {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		fin := ""
		for _, r := range reasons {
			fin += fmt.Sprintf(" %s %d", r, p.Finish[r])
		}
		fmt.Fprintf(w, "sweep batch %-4d %.1f tok/s (%d requests, %d tokens in %.2f s; decode steps alone %.1f tok/s), decoded together at most %d (mean %.1f), waiting at most %d, %d preemptions (%d requests), KV peak %s; finished:%s\n",
			p.Batch, p.TokS, p.Requests, p.Generated, p.WallS, p.DecodeTokS, p.PeakRunning, p.MeanRunning, p.PeakWaiting, p.Preemptions, p.RequestsPreempted, human(p.PeakKVBytes), fin)
	}
}
