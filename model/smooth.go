package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/kvlm/kvlm/kvcache"
)

// DefaultKeyMeanTokens is the length of the text KeyMeans has the model
// write when asked for 0 tokens.
const DefaultKeyMeanTokens = 256

// KeyMeans estimates, for each (layer, KV head), the mean of the keys the
// model stores (after RoPE): the key shift of kvcache.PoolConfig, which lets
// a per-token quantized key cache (q8, q4) spend its steps on the spread of
// the keys around their mean rather than on their offset.
//
// The estimate needs no data: starting from prompt (at least one token,
// usually BOS), the model writes n tokens itself, sampled at temperature 1
// with a generator seeded by seed, over an f32 cache, and every key it
// stores, prompt included, is averaged. The result is a deterministic
// function of the weights, prompt, n and seed. n is cut to fit the context.
// The result is indexed cache layer·KVHeads + head, each [HeadDim].
func (m *Model) KeyMeans(prompt []int, n int, seed uint64) ([][]float32, error) {
	if len(prompt) == 0 {
		return nil, errors.New("model: key means need a prompt of at least one token")
	}
	if n <= 0 {
		n = DefaultKeyMeanTokens
	}
	n = min(n, m.CtxLen-len(prompt))
	if n < 0 {
		return nil, fmt.Errorf("model: a prompt of %d tokens does not fit the context %d", len(prompt), m.CtxLen)
	}
	pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: m.KVLayout(), BlockTokens: kvcache.DefaultBlockTokens, Tokens: len(prompt) + n})
	if err != nil {
		return nil, err
	}
	cl := m.KVLayout().Layers // cache layers: the KV owners
	rec := &keyRecorder{Paged: pool.NewSequence(), heads: m.KVHeads, d: m.HeadDim,
		sum: make([]float64, cl*m.KVHeads*m.HeadDim), count: make([]int, cl)}
	defer rec.Free()
	seq, err := m.NewSequence(rec)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x6b65796d65616e73))
	probs := make([]float64, m.Vocab)
	next := prompt
	for i := 0; i < n; i++ {
		logits, err := seq.Forward(next, false)
		if err != nil {
			return nil, err
		}
		next = []int{sampleT1(logits, probs, rng.Float64())}
	}
	if n == 0 {
		if _, err := seq.Forward(next, false); err != nil {
			return nil, err
		}
	}
	out := make([][]float32, cl*m.KVHeads)
	for i := range out {
		l := i / m.KVHeads
		out[i] = make([]float32, m.HeadDim)
		for c := range out[i] {
			v := rec.sum[i*m.HeadDim+c] / float64(rec.count[l])
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("model: key mean of cache layer %d is not finite", l)
			}
			out[i][c] = float32(v)
		}
	}
	return out, nil
}

// sampleT1 draws a token from softmax(logits) with the uniform u in [0,1).
func sampleT1(logits []float32, probs []float64, u float64) int {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for i, v := range logits {
		probs[i] = math.Exp(float64(v) - mx)
		sum += probs[i]
	}
	u *= sum
	for i, p := range probs {
		if u -= p; u < 0 {
			return i
		}
	}
	return len(logits) - 1
}

// keyRecorder is an f32 cache that sums the keys appended to it.
type keyRecorder struct {
	*kvcache.Paged
	heads, d int
	sum      []float64 // [layer][head][d]
	count    []int     // [layer] tokens appended
}

func (r *keyRecorder) Append(layer int, pos []int32, k, v []float32) error {
	if err := r.Paged.Append(layer, pos, k, v); err != nil {
		return err
	}
	w := r.heads * r.d
	base := layer * w
	for t := range pos {
		for j, x := range k[t*w : (t+1)*w] {
			r.sum[base+j] += float64(x)
		}
	}
	r.count[layer] += len(pos)
	return nil
}
