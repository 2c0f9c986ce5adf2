package main

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
)

// benchAttnShare is where a decode step's time goes at one context, by two
// measurements that do not lean on each other:
//
//   - AttnMS times the attention kernels alone: every layer's
//     attention.Batch.Run over the sequence's cache for one query at the
//     next position, built as the layer builds it (model/layer.go), after
//     the timed decode steps, as many times as there were steps;
//     AttnShare is it over StepMS.
//   - ContextShare is (StepMS − the step at --weights-ctx)/StepMS: the
//     part of the step that grows with the context (attention, and
//     whatever else reads the cache), against a step with almost none.
type benchAttnShare struct {
	StepMS       float64 `json:"step_ms"`
	AttnMS       float64 `json:"attn_ms"`
	AttnShare    float64 `json:"attn_share"`
	ContextShare float64 `json:"context_share"`
	KVBytes      int64   `json:"kv_bytes"` // the cache's bytes when the steps began
}

// benchAttention is the mean time of one decode step's attention over
// every layer of seq's cache (see benchAttnShare), over reps passes after
// one untimed pass, for a pseudo-random query.
func benchAttention(m *model.Model, seq *model.Sequence, reps int) time.Duration {
	qd := m.Config.QDim()
	rng := rand.New(rand.NewPCG(7, 7))
	q := make([]float32, qd) // [Heads·HeadDim] one query token
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	batches := benchAttnBatches(m, seq, q, make([]float32, qd))
	var sc attention.Scratch
	pass := func() {
		for i := range batches {
			batches[i].Run(&sc)
		}
	}
	pass()
	t0 := time.Now()
	for r := 0; r < reps; r++ {
		pass()
	}
	return time.Since(t0) / time.Duration(reps)
}

// benchAttnBatches are the attention batches of a decode step at seq's
// next position, one per layer, as model/layer.go builds them: query q
// ([Heads·HeadDim]) against the layer's cache, the output into out (the
// same buffer for every layer).
func benchAttnBatches(m *model.Model, seq *model.Sequence, q, out []float32) []attention.Batch {
	c := m.Config
	pos := []int32{int32(seq.Pos())} // the next token's position: every slot visible
	cache := seq.Cache()
	norm := float32(math.Sqrt(float64(c.HeadDim)))
	b := make([]attention.Batch, c.Layers)
	for li := range b {
		b[li] = attention.Batch{Heads: c.KVHeads, G: c.GroupSize(), HeadDim: c.HeadDim, Norm: norm, Window: int32(c.SlidingWindow),
			Q: q, Out: out, Pos: pos, Segs: func(h int) []kvcache.Segment { return cache.Segments(li, h) }}
	}
	return b
}

// benchContexts times decode at each of contexts (ascending), in one
// sequence in the cache options of the flags: fill (untimed) up to each
// context, time ctxGen decode steps, then the attention alone. A first
// measurement at weightsCtx tokens is the base of ContextShare. Contexts
// that leave no room for ctxGen tokens are returned as skipped.
func benchContexts(mf *modelFlags, m *model.Model, contexts []int, ctxGen, weightsCtx int) (at []benchDecodeAt, base float64, skipped []int, err error) {
	seq, err := mf.sequence(m)
	if err != nil {
		return nil, 0, nil, err
	}
	defer seq.Close()
	fill := benchPrompt(m.CtxLen, m.Vocab, 3)
	steps := func(c int) (float64, error) {
		if c > seq.Pos() {
			if _, err := seq.Forward(fill[seq.Pos():c], false); err != nil {
				return 0, err
			}
		}
		t0 := time.Now()
		for i := 0; i < ctxGen; i++ {
			if _, err := seq.Forward([]int{fill[c+i]}, false); err != nil {
				return 0, err
			}
		}
		return ms(time.Since(t0)) / float64(ctxGen), nil
	}
	if len(contexts) > 0 && weightsCtx+ctxGen <= contexts[0] {
		if base, err = steps(weightsCtx); err != nil {
			return nil, 0, nil, err
		}
	}
	for _, c := range contexts {
		if c+ctxGen > m.CtxLen || c < seq.Pos() {
			skipped = append(skipped, c)
			continue
		}
		if c > seq.Pos() {
			if _, err := seq.Forward(fill[seq.Pos():c], false); err != nil {
				return nil, 0, nil, err
			}
		}
		d := benchDecodeAt{Context: c}
		d.KVBytes = seq.Cache().Bytes()
		step, err := steps(c)
		if err != nil {
			return nil, 0, nil, err
		}
		d.TokS, d.StepMS = 1e3/step, step
		d.AttnMS = ms(benchAttention(m, seq, ctxGen))
		d.AttnShare = d.AttnMS / step
		if base > 0 {
			d.ContextShare = (step - base) / step
		}
		at = append(at, d)
	}
	return at, base, skipped, nil
}
