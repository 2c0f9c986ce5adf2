package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tensor"
)

// MassHook lets a policy collect the attention mass each stored slot
// receives.
type MassHook interface {
	// Request returns what to collect at layer for the queries of this
	// forward step, which are tokens [start, start+n) of the sequence's
	// history (their positions may differ); nil for nothing.
	Request(layer, start, n int) *attention.MassRequest
	// Done is called after the layer's attention has filled the request,
	// with the layer's queries ([n][heads·headDim], rotated) and positions.
	Done(layer int, req *attention.MassRequest, q []float32, pos []int32)
}

// RowPruner lets a policy drop tokens (rows of the residual stream) between
// the layers of a forward step, as PyramidInfer does during a prefill: a
// dropped token computes nothing in later layers (no K/V, attention or FFN),
// so its KV exists only in the layers it reached and later layers' tables
// hold fewer tokens. Positions stay the original ones.
type RowPruner interface {
	// AfterLayer is called after each layer's FFN but the last one, with
	// the positions of the step's rows still computed. It returns the rows
	// to keep, as ascending indexes into pos, or nil to keep them all. The
	// last row must be kept: its logits are the step's result. The pruner
	// is not consulted when every row's logits are wanted.
	AfterLayer(layer int, pos []int32) []int
}

// ErrContextFull is returned when tokens would go past the model's context
// length: kvlm never wraps positions around silently.
var ErrContextFull = errors.New("context length reached")

// DefaultChunk is the number of prompt tokens a prefill step runs as one
// matrix.
const DefaultChunk = 128

// Sequence runs one token sequence through a model over its own KV cache.
type Sequence struct {
	m     *Model
	cache kvcache.Sequence
	pos   int // position of the next token
	hist  int // tokens run so far (positions may be re-indexed; this is not)
	Chunk int // prefill tokens per step

	// Computed counts the tokens this sequence has run through the layers
	// (prefix-cache hits are not computed).
	Computed int

	// MaxPos is the largest position count Forward accepts: the model's
	// context length unless a bounded cache (a window policy) or an
	// experiment lets positions run past it.
	MaxPos int

	// Mass, if set, is asked before each layer's attention which queries'
	// attention mass to collect, and handed the result (eviction policies).
	// With a Prune hook, a layer's n is the count of rows still computed.
	Mass MassHook

	// Prune, if set, may drop rows between layers (PyramidInfer).
	Prune RowPruner

	// RowLayers counts the rows computed, summed over layers: Computed ×
	// layers without a Prune hook, less with one (the prefill compute a
	// pruner saves).
	RowLayers int

	// AttnTap, if set, sees each layer's attention output ([n][QDim],
	// before the output projection) of every forward step: how the
	// evaluation measures what compression does to attention.
	AttnTap func(layer int, out []float32)

	// Scratch for a chunk of n tokens (grown as needed).
	x      []float32 // [n][Dim] residual stream
	xb     []float32 // [n][Dim] normalised input of a sub-block
	q      []float32 // [n][QDim] queries
	k      []float32 // [n][KVDim] keys
	v      []float32 // [n][KVDim] values
	att    []float32 // [n][QDim] attention output
	gate   []float32 // [n][HiddenDim]
	up     []float32 // [n][HiddenDim]
	pos32  []int32   // [n] positions of the chunk
	cos    []float32 // [n][HeadDim/2] RoPE cosines
	sin    []float32 // [n][HeadDim/2] RoPE sines
	freq   []float32 // [HeadDim/2] RoPE frequencies
	scr    attention.Scratch
	logits []float32 // [n][Vocab]
}

// NewSequence starts an empty sequence over cache, which must fit the
// model's KV layout.
func (m *Model) NewSequence(cache kvcache.Sequence) (*Sequence, error) {
	l := cache.Layout()
	if l.Layers != m.Config.Layers || l.KVHeads != m.KVHeads || l.HeadDim != m.HeadDim {
		return nil, fmt.Errorf("model: cache layout %+v does not fit the model (%d layers, %d KV heads, head dim %d)",
			l, m.Config.Layers, m.KVHeads, m.HeadDim)
	}
	s := &Sequence{m: m, cache: cache, Chunk: DefaultChunk, pos: cache.Len(), MaxPos: m.CtxLen}
	s.freq = m.RopeFreqs()
	return s, nil
}

// KVOptions chooses the cache of a standalone sequence.
type KVOptions struct {
	BlockTokens int         // 0: kvcache.DefaultBlockTokens
	K, V        codec.Codec // nil: f32
	MemBytes    int64       // pool size in bytes; or
	Tokens      int         // room for this many tokens; both 0: the model's context
	// KeyShift, if set, stores q8/q4 keys around these means (from
	// KeyMeans; indexed layer·KVHeads + head, each [HeadDim]); see
	// kvcache.PoolConfig.KeyShift.
	KeyShift [][]float32
}

// NewStandaloneSequence starts a sequence over a private block pool sized
// for the whole context. Close frees it.
func (m *Model) NewStandaloneSequence(opt KVOptions) (*Sequence, error) {
	if opt.BlockTokens == 0 {
		opt.BlockTokens = kvcache.DefaultBlockTokens
	}
	cfg := kvcache.PoolConfig{Layout: m.KVLayout(), BlockTokens: opt.BlockTokens, K: opt.K, V: opt.V, MemBytes: opt.MemBytes, KeyShift: opt.KeyShift}
	if opt.MemBytes == 0 {
		cfg.Tokens = opt.Tokens
		if cfg.Tokens == 0 {
			cfg.Tokens = m.CtxLen
		}
	}
	pool, err := kvcache.NewPool(cfg)
	if err != nil {
		return nil, err
	}
	return m.NewSequence(pool.NewSequence())
}

// Close releases the sequence's cache.
func (s *Sequence) Close() { s.cache.Free() }

// KVLayout is the per-token shape of the model's KV cache.
func (m *Model) KVLayout() kvcache.Layout {
	return kvcache.Layout{Layers: m.Config.Layers, KVHeads: m.KVHeads, HeadDim: m.HeadDim}
}

// Pos is the position the next token will take.
func (s *Sequence) Pos() int { return s.pos }

// Cache is the sequence's KV cache.
func (s *Sequence) Cache() kvcache.Sequence { return s.cache }

// Model is the model the sequence runs.
func (s *Sequence) Model() *Model { return s.m }

// Forward runs tokens through the model at the next positions, in chunks of
// s.Chunk, and returns logits: [len(tokens)][Vocab] when all is set, else
// the last token's [Vocab]. The slice is reused by the next call.
func (s *Sequence) Forward(tokens []int, all bool) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, errors.New("model: no tokens to run")
	}
	if s.pos+len(tokens) > s.MaxPos {
		return nil, fmt.Errorf("%w: %d tokens at position %d go past the context length %d", ErrContextFull, len(tokens), s.pos, s.MaxPos)
	}
	for _, t := range tokens {
		if t < 0 || t >= s.m.Vocab {
			return nil, fmt.Errorf("model: token id %d out of range [0,%d)", t, s.m.Vocab)
		}
	}
	chunk := s.Chunk
	if chunk <= 0 {
		chunk = DefaultChunk
	}
	V := s.m.Vocab
	if all {
		s.logits = grow(s.logits, len(tokens)*V)
	} else {
		s.logits = grow(s.logits, V)
	}
	for lo := 0; lo < len(tokens); lo += chunk {
		hi := min(lo+chunk, len(tokens))
		var dst []float32
		if all {
			dst = s.logits[lo*V : hi*V]
		} else if hi == len(tokens) {
			dst = s.logits[:V]
		}
		if err := s.step(tokens[lo:hi], dst); err != nil {
			return nil, err
		}
	}
	return s.logits, nil
}

// SetPos sets the position the next token takes: after a policy re-indexed
// the cache's positions, the next token continues from the cache length.
func (s *Sequence) SetPos(n int) { s.pos = n }

// Truncate drops every token from position n on (n ≤ Pos).
func (s *Sequence) Truncate(n int) error {
	if n < 0 || n > s.pos {
		return fmt.Errorf("model: truncate to %d tokens of %d", n, s.pos)
	}
	if err := s.cache.Truncate(n); err != nil {
		return err
	}
	s.pos, s.hist = n, n
	return nil
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// step runs one chunk of tokens. dst receives logits: for every token when
// len(dst) is n·Vocab, for the last token when it is Vocab, none when nil.
func (s *Sequence) step(tokens []int, dst []float32) error {
	m, c := s.m, s.m.Config
	n := len(tokens)
	s.x = grow(s.x, n*c.Dim)
	s.xb = grow(s.xb, n*c.Dim)
	s.q = grow(s.q, n*c.QDim())
	s.k = grow(s.k, n*c.KVDim())
	s.v = grow(s.v, n*c.KVDim())
	s.att = grow(s.att, n*c.QDim())
	s.gate = grow(s.gate, n*c.HiddenDim)
	s.up = grow(s.up, n*c.HiddenDim)
	half := c.HeadDim / 2
	s.cos = grow(s.cos, n*half)
	s.sin = grow(s.sin, n*half)
	if cap(s.pos32) < n {
		s.pos32 = make([]int32, n)
	}
	s.pos32 = s.pos32[:n]
	if err := s.cache.Reserve(n); err != nil {
		return err
	}
	for t, id := range tokens {
		m.TokEmb.Row(id, s.x[t*c.Dim:(t+1)*c.Dim])
		p := s.pos + t
		s.pos32[t] = int32(p)
		for j, f := range s.freq {
			a := float32(p) * f
			s.cos[t*half+j] = float32(math.Cos(float64(a)))
			s.sin[t*half+j] = float32(math.Sin(float64(a)))
		}
	}
	norm := float32(math.Sqrt(float64(c.HeadDim)))
	rows := n // rows still computed: fewer than n once a pruner dropped some
	prune := s.Prune != nil && len(dst) != n*c.Vocab
	for li := range m.Layers {
		L := &m.Layers[li]
		n := rows
		tensor.RMSNormRows(s.xb, s.x, L.AttnNorm, c.NormEps, n, c.Dim)
		m.qkv(L, s.q, s.k, s.v, s.xb, n)
		addBias(s.q, L.Bq, n)
		addBias(s.k, L.Bk, n)
		addBias(s.v, L.Bv, n)
		s.rope(s.q, n, c.Heads)
		s.rope(s.k, n, c.KVHeads)
		// Sliced to the live rows (the whole buffers when nothing was pruned).
		pos, q := s.pos32[:n], s.q[:n*c.QDim()]
		if err := s.cache.Append(li, pos, s.k[:n*c.KVDim()], s.v[:n*c.KVDim()]); err != nil {
			return fmt.Errorf("model: layer %d: %w", li, err)
		}
		att := attention.Batch{Heads: c.KVHeads, G: c.GroupSize(), HeadDim: c.HeadDim, Norm: norm, Window: c.window(),
			Q: q, Out: s.att[:n*c.QDim()], Pos: pos, Segs: func(h int) []kvcache.Segment { return s.cache.Segments(li, h) }}
		if s.Mass != nil {
			att.Mass = s.Mass.Request(li, s.hist, n)
		}
		att.Run(&s.scr)
		if att.Mass != nil {
			s.Mass.Done(li, att.Mass, q, pos)
		}
		if s.AttnTap != nil {
			s.AttnTap(li, s.att[:n*c.QDim()])
		}
		m.finishLayer(L, s.x, s.xb, s.att, s.gate, s.up, n)
		s.RowLayers += n
		if prune && li < len(m.Layers)-1 {
			if keep := s.Prune.AfterLayer(li, pos); keep != nil {
				if err := s.compactRows(keep, n); err != nil {
					return fmt.Errorf("model: layer %d: %w", li, err)
				}
				rows = len(keep)
			}
		}
	}
	s.pos += n
	s.hist += n
	s.Computed += n
	n = rows // the rows left: the last one is the step's last token
	switch len(dst) {
	case 0:
	case c.Vocab:
		last := s.x[(n-1)*c.Dim : n*c.Dim]
		tensor.RMSNorm(last, last, m.OutNorm, c.NormEps)
		m.Output.MatVec(dst, last)
	default:
		tensor.RMSNormRows(s.x, s.x, m.OutNorm, c.NormEps, n, c.Dim)
		m.Output.MatMul(dst, s.x, n)
	}
	return nil
}

// compactRows keeps rows keep (ascending indexes below n, the last row
// among them) of the per-row state that outlives a layer: the residual
// stream, the positions and the RoPE tables.
func (s *Sequence) compactRows(keep []int, n int) error {
	for i, r := range keep {
		if r < 0 || r >= n || (i > 0 && r <= keep[i-1]) {
			return fmt.Errorf("row pruner: kept rows must be ascending indexes below %d", n)
		}
	}
	if len(keep) == 0 || keep[len(keep)-1] != n-1 {
		return errors.New("row pruner: the last row must be kept")
	}
	D, half := s.m.Dim, s.m.HeadDim/2
	for i, r := range keep {
		if r == i {
			continue
		}
		// r > i: rows move towards the front, so copying in order is safe.
		copy(s.x[i*D:(i+1)*D], s.x[r*D:(r+1)*D])
		copy(s.cos[i*half:(i+1)*half], s.cos[r*half:(r+1)*half])
		copy(s.sin[i*half:(i+1)*half], s.sin[r*half:(r+1)*half])
		s.pos32[i] = s.pos32[r]
	}
	return nil
}

func addBias(x, b []float32, n int) {
	if b == nil {
		return
	}
	w := len(b)
	for t := 0; t < n; t++ {
		tensor.Add(x[t*w:(t+1)*w], b)
	}
}

// qkv computes the queries, keys and values of n rows of xb (before
// biases and RoPE): one quantization of xb and one parallel region for the
// three matrices.
func (m *Model) qkv(L *Layer, q, k, v, xb []float32, n int) {
	tensor.MatMulMany([][]float32{q, k, v}, []*tensor.Matrix{L.Wq, L.Wk, L.Wv}, xb, n)
}

// finishLayer completes a layer for n rows after attention: the output
// projection and its residual, then RMSNorm, the SwiGLU FFN and its
// residual. x [n][Dim] is the residual stream, att [n][QDim] the attention
// output; xb [n][Dim], gate and up [n][HiddenDim] are scratch.
func (m *Model) finishLayer(L *Layer, x, xb, att, gate, up []float32, n int) {
	c := m.Config
	L.Wo.MatMul(xb, att, n)
	tensor.AddRMSNormRows(xb, x, xb, L.FFNNorm, c.NormEps, n, c.Dim)
	tensor.MatMulMany([][]float32{gate, up}, []*tensor.Matrix{L.WGate, L.WUp}, xb, n)
	tensor.SwiGLU(gate[:n*c.HiddenDim], gate[:n*c.HiddenDim], up[:n*c.HiddenDim])
	L.WDown.MatMul(xb, gate, n)
	tensor.AddRows(x, xb, n, c.Dim)
}

// Rotate turns one head's key, rotated by RoPE for some position, into the
// key for a position delta further on (delta may be negative): how a policy
// re-indexes the positions of cached keys. A Rotator does the same faster
// when many keys move.
func (m *Model) Rotate(key []float32, delta int) { m.NewRotator().Rotate(key, delta) }

// Rotator re-rotates keys by position deltas, keeping the cosines and sines
// of the deltas it has seen (a re-indexing policy moves most keys by the same
// few deltas step after step). Not safe for concurrent use.
type Rotator struct {
	freq   []float32            // [HeadDim/2] RoPE frequencies
	neox   bool                 // NEOX halves instead of interleaved pairs
	tables map[int][2][]float32 // delta → cosines, sines [HeadDim/2]
}

// NewRotator returns a rotator for the model's RoPE.
func (m *Model) NewRotator() *Rotator {
	return &Rotator{freq: m.RopeFreqs(), neox: m.Rope == RopeNeoX, tables: map[int][2][]float32{}}
}

// Rotate moves key by delta positions.
func (r *Rotator) Rotate(key []float32, delta int) {
	if delta == 0 {
		return
	}
	t, ok := r.tables[delta]
	if !ok {
		if len(r.tables) > 256 {
			clear(r.tables)
		}
		t = [2][]float32{make([]float32, len(r.freq)), make([]float32, len(r.freq))}
		for j, f := range r.freq {
			a := float64(delta) * float64(f)
			t[0][j], t[1][j] = float32(math.Cos(a)), float32(math.Sin(a))
		}
		r.tables[delta] = t
	}
	half := len(r.freq)
	for j := range r.freq {
		cs, sn := t[0][j], t[1][j]
		x0, x1 := 2*j, 2*j+1
		if r.neox {
			x0, x1 = j, j+half
		}
		v0, v1 := key[x0], key[x1]
		key[x0] = v0*cs - v1*sn
		key[x1] = v0*sn + v1*cs
	}
}

// rope rotates the heads of n rows of x in place by each row's position.
func (s *Sequence) rope(x []float32, n, heads int) { s.m.ropeRows(x, s.cos, s.sin, n, heads) }
