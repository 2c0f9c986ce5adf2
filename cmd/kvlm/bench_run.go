package main

import (
	"time"

	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// benchTimedPolicy is the policy a bench run installs on its sequence: the
// policy's own State, driven by the forward pass as engine.Generate drives
// it, with the time of its calls measured so that the compression step is
// not counted as prefill, nor its decode-time schedule hidden in decode.
type benchTimedPolicy struct {
	st       *policy.State
	compress time.Duration // Compress: once, after the prompt
	before   time.Duration // Before: every decode step, summed
}

func (p *benchTimedPolicy) BeginPrefill(n int) { p.st.BeginPrefill(n) }

func (p *benchTimedPolicy) Compress() error {
	t0 := time.Now()
	err := p.st.Compress()
	p.compress += time.Since(t0)
	return err
}

func (p *benchTimedPolicy) Before(n int) error {
	t0 := time.Now()
	err := p.st.Before(n)
	p.before += time.Since(t0)
	return err
}

// benchOneRun is one sequence's prompt then greedy decode, timed by phase.
type benchOneRun struct {
	prefill  time.Duration // the prompt's forward pass, the compression step excluded
	compress time.Duration // the policy's Compress after the prompt (0: none)
	decode   time.Duration // the decode steps, the policy's Before included
	before   time.Duration // of which the policy's Before
	// Cache bytes (kvcache.Sequence.Bytes): after the prompt ran its
	// layers (before the policy compressed it), after the compression
	// step, after the last decode step, and the mean over the decode
	// steps of the bytes each step read (held when it started, its own
	// token included).
	bytesPrefill, bytesCompressed, bytesEnd int64
	bytesDecodeMean                         float64
	kept                                    []int // tokens each layer keeps at the end (policy only)
}

// benchRunSeq runs prompt through a new sequence in the cache options opt
// with the policy pc (nil or Method full: none), then decodes gen greedy
// tokens. The sequence's pool holds exactly what the run stores unless
// opt has a byte budget.
func benchRunSeq(mf *modelFlags, m *model.Model, opt model.KVOptions, pc *policy.Config, prompt []int, gen int) (benchOneRun, error) {
	var r benchOneRun
	if opt.MemBytes == 0 && opt.Tokens == 0 {
		opt.Tokens = len(prompt) + gen
	}
	seq, err := mf.sequenceWith(m, opt)
	if err != nil {
		return r, err
	}
	defer seq.Close()
	var tp *benchTimedPolicy
	if pc != nil && pc.Method != "full" {
		st, err := policy.New(*pc, seq)
		if err != nil {
			return r, err
		}
		tp = &benchTimedPolicy{st: st}
		seq.SetPolicy(tp)
		seq.Prompt(len(prompt))
	}
	t0 := time.Now()
	logits, err := seq.Forward(prompt, false)
	if err != nil {
		return r, err
	}
	r.prefill = time.Since(t0)
	r.bytesPrefill, r.bytesCompressed = seq.StepBytes, seq.Cache().Bytes()
	if tp != nil {
		r.compress = tp.compress
		r.prefill -= tp.compress
	}
	var sum float64
	t1 := time.Now()
	for i := 0; i < gen; i++ {
		if logits, err = seq.Forward([]int{argmaxF(logits)}, false); err != nil {
			return r, err
		}
		sum += float64(seq.StepBytes) // after the step ran its layers: what its attention read
	}
	r.decode = time.Since(t1)
	if gen > 0 {
		r.bytesDecodeMean = sum / float64(gen)
	}
	r.bytesEnd = seq.Cache().Bytes()
	if tp != nil {
		r.before = tp.before
		r.kept = tp.st.KeptPerLayer()
	}
	return r, nil
}
