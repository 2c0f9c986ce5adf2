package model

// Batched decode: one new token for each of several sequences, run through
// every weight matrix once for all of them (a matrix of one row per
// sequence), with each sequence's own position, KV cache and attention. This
// is what a continuous-batching scheduler calls between prefill chunks.

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/tensor"
)

// batchScratch is the per-call working memory of DecodeBatch, rows = the
// batch size (grown as needed, reused through a sync.Pool).
type batchScratch struct {
	x, xb     []float32 // [n][Dim]
	q, att    []float32 // [n][QDim]
	k, v      []float32 // [n][KVDim]
	gate, up  []float32 // [n][HiddenDim]
	cos, sin  []float32 // [n][HeadDim/2]
	pos       []int32   // [n]
	logits    []float32 // [n][Vocab]
	mass      []*attention.MassRequest
	attnScrat []attention.Scratch
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
// the batched kernels; bit for bit with F32 weights). Sequences must be
// distinct and belong to m. Before anything is written, every sequence is
// checked (position, token id, room in its pool for one token): on an
// error nothing has changed. The pool check is per sequence: sequences
// sharing a pool must leave room for all of them together (the
// scheduler's job).
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
		case s.pos+1 > s.MaxPos:
			return nil, fmt.Errorf("%w: 1 token at position %d goes past the context length %d", ErrContextFull, s.pos, s.MaxPos)
		}
		seen[s] = true
		if err := s.cache.Reserve(1); err != nil {
			return nil, fmt.Errorf("model: batch sequence %d: %w", i, err)
		}
	}
	b, _ := batchScratches.Get().(*batchScratch)
	if b == nil {
		b = &batchScratch{}
	}
	defer batchScratches.Put(b)
	half := c.HeadDim / 2
	b.x = grow(b.x, n*c.Dim)
	b.xb = grow(b.xb, n*c.Dim)
	b.q = grow(b.q, n*c.QDim())
	b.att = grow(b.att, n*c.QDim())
	b.k = grow(b.k, n*c.KVDim())
	b.v = grow(b.v, n*c.KVDim())
	b.gate = grow(b.gate, n*c.HiddenDim)
	b.up = grow(b.up, n*c.HiddenDim)
	b.cos = grow(b.cos, n*half)
	b.sin = grow(b.sin, n*half)
	b.logits = grow(b.logits, n*c.Vocab)
	if cap(b.pos) < n {
		b.pos = make([]int32, n)
	}
	b.pos = b.pos[:n]
	if len(b.attnScrat) < n {
		b.attnScrat = make([]attention.Scratch, n)
	}
	if cap(b.mass) < n {
		b.mass = make([]*attention.MassRequest, n)
	}
	b.mass = b.mass[:n]

	for i, s := range seqs {
		m.TokEmb.Row(tokens[i], b.x[i*c.Dim:(i+1)*c.Dim])
		p := s.pos
		b.pos[i] = int32(p)
		for j, f := range s.freq {
			a := float32(p) * f
			b.cos[i*half+j] = float32(math.Cos(float64(a)))
			b.sin[i*half+j] = float32(math.Sin(float64(a)))
		}
	}
	norm := float32(math.Sqrt(float64(c.HeadDim)))
	qd, kvd := c.QDim(), c.KVDim()
	for li := range m.Layers {
		L := &m.Layers[li]
		tensor.RMSNormRows(b.xb, b.x, L.AttnNorm, c.NormEps, n, c.Dim)
		m.qkv(L, b.q, b.k, b.v, b.xb, n)
		addBias(b.q, L.Bq, n)
		addBias(b.k, L.Bk, n)
		addBias(b.v, L.Bv, n)
		m.ropeRows(b.q, b.cos, b.sin, n, c.Heads)
		m.ropeRows(b.k, b.cos, b.sin, n, c.KVHeads)
		for i, s := range seqs {
			if err := s.cache.Append(li, b.pos[i:i+1], b.k[i*kvd:(i+1)*kvd], b.v[i*kvd:(i+1)*kvd]); err != nil {
				// Reserve passed, so only a pool shared beyond its room gets
				// here; the sequences of this batch are then inconsistent.
				return nil, fmt.Errorf("model: layer %d, batch sequence %d: %w", li, i, err)
			}
			b.mass[i] = nil
			if s.Mass != nil {
				b.mass[i] = s.Mass.Request(li, s.hist, 1)
			}
		}
		// Attention per sequence, the sequences in parallel (each Run then
		// runs its heads on the calling worker).
		tensor.Parallel(n, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				s := seqs[i]
				att := attention.Batch{Heads: c.KVHeads, G: c.GroupSize(), HeadDim: c.HeadDim, Norm: norm, Window: c.window(),
					Q: b.q[i*qd : (i+1)*qd], Out: b.att[i*qd : (i+1)*qd], Pos: b.pos[i : i+1],
					Segs: func(h int) []kvcache.Segment { return s.cache.Segments(li, h) }, Mass: b.mass[i]}
				att.Run(&b.attnScrat[i])
			}
		})
		for i, s := range seqs {
			if b.mass[i] != nil {
				s.Mass.Done(li, b.mass[i], b.q[i*qd:(i+1)*qd], b.pos[i:i+1])
			}
			if s.AttnTap != nil {
				s.AttnTap(li, b.att[i*qd:(i+1)*qd])
			}
		}
		m.finishLayer(L, b.x, b.xb, b.att, b.gate, b.up, n)
	}
	tensor.RMSNormRows(b.x, b.x, m.OutNorm, c.NormEps, n, c.Dim)
	m.Output.MatMul(b.logits, b.x, n)
	out := make([][]float32, n)
	for i, s := range seqs {
		s.pos++
		s.hist++
		s.Computed++
		s.RowLayers += len(m.Layers)
		s.logits = grow(s.logits, c.Vocab)
		copy(s.logits, b.logits[i*c.Vocab:(i+1)*c.Vocab])
		out[i] = s.logits
	}
	return out, nil
}

// ropeRows rotates the heads of n rows of x in place, row t by the angles
// cos[t], sin[t] ([n][HeadDim/2]).
func (m *Model) ropeRows(x, cos, sin []float32, n, heads int) {
	hd := m.HeadDim
	half := hd / 2
	neox := m.Rope == RopeNeoX
	w := heads * hd
	// Rows in parallel (at least ~2048 values a worker); each row as before.
	tensor.Parallel(n, max(1, 2048/max(w, 1)), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			cs, sn := cos[t*half:(t+1)*half], sin[t*half:(t+1)*half]
			row := x[t*w : (t+1)*w]
			for h := 0; h < heads; h++ {
				v := row[h*hd : (h+1)*hd]
				for j := 0; j < half; j++ {
					a, b := 2*j, 2*j+1
					if neox {
						a, b = j, j+half
					}
					x0, x1 := v[a], v[b]
					v[a] = x0*cs[j] - x1*sn[j]
					v[b] = x0*sn[j] + x1*cs[j]
				}
			}
		}
	})
}

// Fork returns a sequence over a fork of s's cache (every block shared,
// copied on first write): the same position, history count, chunk and
// position limit, no hooks. The cache must be a *kvcache.Paged. n > 1
// samples of one prompt fork after its prefill.
func (s *Sequence) Fork() (*Sequence, error) {
	p, ok := s.cache.(*kvcache.Paged)
	if !ok {
		return nil, errors.New("model: only a paged cache can be forked")
	}
	f, err := s.m.NewSequence(p.Fork())
	if err != nil {
		return nil, err
	}
	f.pos, f.hist, f.Chunk, f.MaxPos = s.pos, s.hist, s.Chunk, s.MaxPos
	return f, nil
}
