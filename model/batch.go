package model

// Batched decode: one new token for each of several sequences, run through
// every weight matrix once for all of them (a matrix of one row per
// sequence), with each sequence's own position, KV cache and attention. This
// is what a continuous-batching scheduler calls between prefill chunks.

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/tensor"
)

// batchScratch is the per-call working memory of DecodeBatch, rows = the
// batch size (grown as needed, reused through a sync.Pool).
type batchScratch struct {
	w      pass
	logits []float32 // [n][Vocab]
}

var batchScratches sync.Pool

// DecodeBatch runs one token per sequence (tokens[i] at seqs[i]'s next
// position) and returns each sequence's next-token logits ([Vocab] each),
// in the sequence's own logits buffer, as Forward: the next Forward or
// DecodeBatch of that sequence reuses it.
//
// The matrix products run over all rows at once; RoPE, the cache append,
// the attention (with the sequence's Mass hook and AttnTap) and the
// position counters are per sequence, exactly as Forward does for one
// token, so the logits equal a per-sequence Forward (to float rounding of
// the batched kernels; bit for bit with F32 weights). A sequence with a
// policy (SetPolicy) has it make room first, as Forward does, unless
// Prepare did; a sequence inside an announced prompt is refused. Sequences
// must be distinct and belong to m. Before anything is written, every
// sequence is checked (token id, position, room in its pool for one
// token): on an error nothing has changed but what the policies of the
// sequences checked so far did to make room. The pool check is per
// sequence: sequences sharing a pool must leave room for all of them
// together (the scheduler's job).
func (m *Model) DecodeBatch(seqs []*Sequence, tokens []int) ([][]float32, error) {
	n := len(seqs)
	if n == 0 {
		return nil, errors.New("model: empty decode batch")
	}
	if len(tokens) != n {
		return nil, fmt.Errorf("model: %d sequences but %d tokens", n, len(tokens))
	}
	c := m.Config
	seen := make(map[*Sequence]bool, n)
	for i, s := range seqs {
		switch {
		case s == nil || s.m != m:
			return nil, fmt.Errorf("model: batch sequence %d does not belong to this model", i)
		case seen[s]:
			return nil, fmt.Errorf("model: sequence %d appears twice in the batch", i)
		case tokens[i] < 0 || tokens[i] >= c.Vocab:
			return nil, fmt.Errorf("model: token id %d out of range [0,%d)", tokens[i], c.Vocab)
		case s.pol != nil && s.prompt > 0:
			return nil, fmt.Errorf("model: batch sequence %d is inside its prompt (%d tokens left)", i, s.prompt)
		}
		seen[s] = true
		if err := s.before(1); err != nil {
			return nil, fmt.Errorf("model: batch sequence %d: %w", i, err)
		}
		if s.pos+1 > s.MaxPos {
			return nil, fmt.Errorf("%w: 1 token at position %d goes past the context length %d", ErrContextFull, s.pos, s.MaxPos)
		}
		if err := s.cache.Reserve(1); err != nil {
			return nil, fmt.Errorf("model: batch sequence %d: %w", i, err)
		}
	}
	b, _ := batchScratches.Get().(*batchScratch)
	if b == nil {
		b = &batchScratch{}
	}
	defer batchScratches.Put(b)
	p := &b.w
	p.grow(c, n, n)
	p.batch = true
	b.logits = grow(b.logits, n*c.Vocab)
	for i, s := range seqs {
		m.row(p, i, tokens[i], s.pos)
		p.spans = append(p.spans, span{s: s, lo: i, hi: i + 1, start: s.hist})
	}
	for li := range m.Layers {
		if err := m.layer(li, p); err != nil {
			return nil, err
		}
	}
	tensor.RMSNormRows(p.x, p.x, m.OutNorm, c.NormEps, n, c.Dim)
	m.Output.MatMul(b.logits, p.x, n)
	softcap(b.logits[:n*c.Vocab], c.FinalSoftcap)
	out := make([][]float32, n)
	for i, s := range seqs {
		s.pos++
		s.hist++
		s.Computed++
		s.StepBytes = s.cache.Bytes()
		s.logits = grow(s.logits, c.Vocab)
		copy(s.logits, b.logits[i*c.Vocab:(i+1)*c.Vocab])
		out[i] = s.logits
	}
	return out, nil
}

// Fork returns a sequence over a fork of s's cache (every block shared,
// copied on first write): the same position, history count, chunk and
// position limit, LCKVPasses and NoEarlyExit, no hooks and no policy. The cache must be one the
// scheduler can fork (kvcache.Scheduled). n > 1 samples of one prompt fork
// after its prefill.
func (s *Sequence) Fork() (*Sequence, error) {
	p, ok := s.cache.(kvcache.Scheduled)
	if !ok {
		return nil, errors.New("model: this cache cannot be forked")
	}
	f, err := s.m.NewSequence(p.Fork())
	if err != nil {
		return nil, err
	}
	f.pos, f.hist, f.Chunk, f.MaxPos, f.LCKVPasses, f.NoEarlyExit = s.pos, s.hist, s.Chunk, s.MaxPos, s.LCKVPasses, s.NoEarlyExit
	return f, nil
}
