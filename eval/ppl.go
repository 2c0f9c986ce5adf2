// Package eval measures model quality: perplexity now; the KV-method sweeps,
// plots and report grow here.
package eval

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvlm/kvlm/model"
)

// PPLResult is the outcome of a perplexity run.
type PPLResult struct {
	Tokens      int     `json:"tokens"`      // tokens fed
	Predictions int     `json:"predictions"` // next-token predictions scored (Tokens-1)
	MeanNLL     float64 `json:"mean_nll"`    // nats per prediction
	PPL         float64 `json:"ppl"`         // exp(MeanNLL)
}

// Perplexity feeds ids through seq (from its current position) and scores
// each next token: mean over the len(ids)-1 predictions of
// −log softmax(logits_p)[ids[p+1]], computed in float64.
func Perplexity(seq *model.Sequence, ids []int) (PPLResult, error) {
	if len(ids) < 2 {
		return PPLResult{}, errors.New("eval: perplexity needs at least 2 tokens")
	}
	chunk := seq.Chunk
	if chunk <= 0 {
		chunk = model.DefaultChunk
	}
	V := seq.Model().Vocab
	var total float64
	for lo := 0; lo < len(ids)-1; lo += chunk {
		hi := min(lo+chunk, len(ids)-1)
		logits, err := seq.Forward(ids[lo:hi], true)
		if err != nil {
			return PPLResult{}, err
		}
		for p := lo; p < hi; p++ {
			total += NLL(logits[(p-lo)*V:(p-lo+1)*V], ids[p+1])
		}
	}
	n := len(ids) - 1
	r := PPLResult{Tokens: len(ids), Predictions: n, MeanNLL: total / float64(n)}
	r.PPL = math.Exp(r.MeanNLL)
	if math.IsNaN(r.MeanNLL) || math.IsInf(r.MeanNLL, 0) {
		return r, fmt.Errorf("eval: mean NLL is %v", r.MeanNLL)
	}
	return r, nil
}

// NLL is −log softmax(logits)[target], in float64.
func NLL(logits []float32, target int) float64 {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v) - mx)
	}
	return -(float64(logits[target]) - mx - math.Log(sum))
}
