package eval

import (
	"fmt"
	"math"

	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// CompressResult is a compress-then-continue perplexity.
type CompressResult struct {
	PPLResult
	KVBytesPeak int64       // the most KV memory held
	Kept        [][][]int32 // per layer, per KV head: sorted original positions after compression
}

// StreamResult is a streaming perplexity.
type StreamResult struct {
	PPLResult
	KVBytesPeak int64     // the most KV memory held
	NLLByWindow []float64 // mean NLL of each run of `every` predictions
	Argmax      []int     // [predictions] the most likely next token after ids[:i+1] (teacher-forced greedy path)
}

// CompressAfter prefills ids[:n], compresses, then scores the
// predictions made after compression: tokens n+1..len(ids)-1.
func CompressAfter(seq *model.Sequence, pol *policy.State, ids []int, n int) (CompressResult, error) {
	var out CompressResult
	if pol != nil {
		seq.SetPolicy(pol) // the forward pass drives it
		seq.Prompt(n)
	}
	if _, err := seq.Forward(ids[:n], false); err != nil {
		return out, err
	}
	out.KVBytesPeak = seq.StepBytes // before the policy compressed the prompt
	if pol != nil {
		out.Kept = pol.Kept()
	}
	var total float64
	count := 0
	for p := n; p < len(ids)-1; p++ {
		logits, err := seq.Forward(ids[p:p+1], false)
		if err != nil {
			return out, err
		}
		out.KVBytesPeak = max(out.KVBytesPeak, seq.Cache().Bytes())
		total += NLL(logits, ids[p+1])
		count++
	}
	out.PPLResult = PPLResult{Tokens: len(ids), Predictions: count, MeanNLL: total / float64(count)}
	out.PPL = math.Exp(out.MeanNLL)
	return out, nil
}

// Stream feeds ids one token at a time (in chunks when no policy
// prunes), scoring every prediction, and averages them in windows.
func Stream(seq *model.Sequence, pol *policy.State, ids []int, every int) (StreamResult, error) {
	var out StreamResult
	var total, win float64
	nwin := 0
	count := 0
	step := 1
	if pol == nil {
		step = max(1, seq.Chunk) // no eviction: chunks compute the same numbers faster
	} else {
		seq.SetPolicy(pol) // the forward pass drives it
	}
	V := seq.Model().Vocab
	for p := 0; p < len(ids)-1; p += step {
		hi := min(p+step, len(ids)-1)
		logits, err := seq.Forward(ids[p:hi], true)
		if err != nil {
			return out, fmt.Errorf("at token %d: %w", p, err)
		}
		out.KVBytesPeak = max(out.KVBytesPeak, seq.Cache().Bytes())
		for i := p; i < hi; i++ {
			row := logits[(i-p)*V : (i-p+1)*V]
			out.Argmax = append(out.Argmax, argmax(row))
			nll := NLL(row, ids[i+1])
			total += nll
			win += nll
			nwin++
			count++
			if nwin == every {
				out.NLLByWindow = append(out.NLLByWindow, win/float64(nwin))
				win, nwin = 0, 0
			}
		}
	}
	if nwin > 0 {
		out.NLLByWindow = append(out.NLLByWindow, win/float64(nwin))
	}
	out.PPLResult = PPLResult{Tokens: len(ids), Predictions: count, MeanNLL: total / float64(count)}
	out.PPL = math.Exp(out.MeanNLL)
	if math.IsNaN(out.MeanNLL) || math.IsInf(out.MeanNLL, 0) {
		return out, fmt.Errorf("mean NLL is %v", out.MeanNLL)
	}
	return out, nil
}

// StreamGreedy goes on from a sequence Stream left (every token of ids fed
// but the last): it feeds ids' last token, then n greedy tokens one at a
// time, each a step of the policy's schedule as in Stream, and returns the
// n tokens (the first index of the maximum logit, as sample's greedy
// choice).
func StreamGreedy(seq *model.Sequence, ids []int, n int) ([]int, error) {
	next := ids[len(ids)-1]
	var out []int
	for range n {
		logits, err := seq.Forward([]int{next}, false)
		if err != nil {
			return out, fmt.Errorf("greedy token %d: %w", len(out), err)
		}
		next = argmax(logits)
		out = append(out, next)
	}
	return out, nil
}
