// Package engine runs sequences through a model: for now one sequence at a
// time (Generate); the batching scheduler grows here.
package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/sample"
)

// StopReason says why generation ended.
type StopReason string

const (
	StopEOS     StopReason = "eos"     // the model produced the end-of-sequence token
	StopLength  StopReason = "length"  // MaxTokens were generated
	StopContext StopReason = "context" // the model's context length was reached
)

// Request is one generation.
type Request struct {
	Prompt    []int           // token ids, BOS included when wanted; not empty
	MaxTokens int             // new tokens to generate, > 0
	EOS       int             // end-of-sequence id; negative: never stop on a token
	Sampler   *sample.Sampler // nil: greedy
	// OnToken, if set, is called with each new token as it is sampled;
	// an error stops generation and is returned.
	OnToken func(id int) error
	// Policy, if set, compresses the sequence's cache: Generate installs
	// it on the sequence (SetPolicy), whose forward pass compresses once
	// after the prompt and, on the policy's schedule, before each decode
	// step.
	Policy *policy.State
}

// Result is what a generation produced and how long its phases took.
type Result struct {
	Tokens      []int         // generated ids (EOS excluded)
	Stop        StopReason    // why it ended
	PromptN     int           // prompt tokens
	PrefillTime time.Duration // time to run the prompt and sample the first token
	DecodeTime  time.Duration // time for the remaining tokens
	PeakKVBytes int64         // the most KV memory the sequence held
}

// PrefillTokS and DecodeTokS are the phase throughputs (0 when unmeasured).
func (r Result) PrefillTokS() float64 { return rate(r.PromptN, r.PrefillTime) }
func (r Result) DecodeTokS() float64  { return rate(len(r.Tokens)-1, r.DecodeTime) }

func rate(n int, d time.Duration) float64 {
	if n <= 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// Generate runs the prompt through seq (which must be empty), then samples
// up to MaxTokens new tokens. It stops at EOS, at MaxTokens, or when the
// context is full (StopContext, not an error: the tokens so far are kept).
func Generate(seq *model.Sequence, req Request) (Result, error) {
	var res Result
	if len(req.Prompt) == 0 {
		return res, errors.New("engine: empty prompt")
	}
	if req.MaxTokens <= 0 {
		return res, fmt.Errorf("engine: max tokens must be positive, got %d", req.MaxTokens)
	}
	ctx := seq.Model().CtxLen
	if seq.Pos()+len(req.Prompt) > ctx {
		return res, fmt.Errorf("engine: prompt of %d tokens does not fit the context length %d", len(req.Prompt), ctx)
	}
	res.PromptN = len(req.Prompt)
	history := append([]int(nil), req.Prompt...)
	start := time.Now()
	if req.Policy != nil {
		seq.SetPolicy(req.Policy) // the forward pass drives it
		seq.Prompt(len(req.Prompt))
	}
	logits, err := seq.Forward(req.Prompt, false)
	if err != nil {
		return res, err
	}
	res.PeakKVBytes = seq.StepBytes // before the policy compressed the prompt
	decodeStart := time.Time{}
	for {
		var next int
		if req.Sampler != nil {
			next = req.Sampler.Sample(logits, history)
		} else {
			next = argmax(logits)
		}
		if next < 0 {
			return res, errors.New("engine: no token can be sampled: every logit is NaN or -Inf")
		}
		if decodeStart.IsZero() {
			decodeStart = time.Now()
			res.PrefillTime = decodeStart.Sub(start)
		}
		if req.EOS >= 0 && next == req.EOS {
			res.Stop = StopEOS
			break
		}
		res.Tokens = append(res.Tokens, next)
		history = append(history, next)
		if req.OnToken != nil {
			if err := req.OnToken(next); err != nil {
				res.DecodeTime = time.Since(decodeStart)
				return res, err
			}
		}
		if len(res.Tokens) >= req.MaxTokens {
			res.Stop = StopLength
			break
		}
		if seq.Pos() >= seq.MaxPos {
			res.Stop = StopContext
			break
		}
		logits, err = seq.Forward([]int{next}, false)
		res.PeakKVBytes = max(res.PeakKVBytes, seq.Cache().Bytes())
		if err != nil {
			res.DecodeTime = time.Since(decodeStart)
			if errors.Is(err, kvcache.ErrNoBlocks) {
				err = fmt.Errorf("engine: the KV cache pool is full at position %d: %w", seq.Pos(), err)
			}
			return res, err
		}
	}
	res.DecodeTime = time.Since(decodeStart)
	return res, nil
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}
