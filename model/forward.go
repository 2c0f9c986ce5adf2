package model

import (
	"errors"
	"fmt"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tensor"
)

// MassHook lets a policy collect the attention mass each stored slot
// receives. layer is a cache layer, asked once per model layer that reads
// it, in layer order. In the last pass of Layer-Condensed KV's iterative
// prompt encoding, a layer reading a later layer's KV also attends the
// chunk's entries of the pass before, which its owner appends later in the
// step: the model extends each Out[head] by their count, so Done gets
// their mass after the table's slots.
type MassHook interface {
	// Request returns what to collect at layer for the queries of this
	// forward step, which are tokens [start, start+n) of the sequence's
	// history (their positions may differ); nil for nothing.
	Request(layer, start, n int) *attention.MassRequest
	// Done is called after the layer's attention has filled the request,
	// with the layer's queries ([n][heads·headDim], rotated) and positions.
	Done(layer int, req *attention.MassRequest, q []float32, pos []int32)
}

// PromptRows is what a MassHook may also implement: how many of the last
// rows of a forward step of n tokens (history [start, start+n)) it scores
// the attention or the queries of. The prefill early exit (see step) runs
// the layers above the last KV owner for those rows too, since those layers
// read a cache layer as the layers below do and the policy aggregates all
// its readers; a hook that does not implement it gets every row.
type PromptRows interface {
	PromptRows(start, n int) int
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

// Compressor is a KV policy the sequence drives (policy.State): installed
// with SetPolicy, it is told of a prompt when it starts (BeginPrefill with
// the prompt's length), compresses the cache once after the prompt's last
// token ran (Compress), and makes room before every other forward step
// (Before with the step's token count), in Forward and DecodeBatch alike.
type Compressor interface {
	BeginPrefill(n int)
	Compress() error
	Before(incoming int) error
}

// ErrContextFull is returned when tokens would go past the model's context
// length: kvlm never wraps positions around silently.
var ErrContextFull = errors.New("context length reached")

// DefaultLCKVPasses is the number of passes of Layer-Condensed KV's
// iterative prompt encoding the paper uses (Sequence.LCKVPasses).
const DefaultLCKVPasses = 7

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
	// layers without a Prune hook and without prefill early exit (see
	// step), less with them (the prefill compute they save); more with
	// iterative LCKVPasses.
	RowLayers int

	// AttnTap, if set, sees each layer's attention output ([n][QDim],
	// before the output projection) of every forward step: how the
	// evaluation measures what compression does to attention.
	AttnTap func(layer int, out []float32)

	// NoEarlyExit turns the prefill early exit off (see step): every layer
	// runs every row of a prompt chunk, so that a mass hook sees every
	// prompt query of the layers above the last KV owner. The early exit
	// is off as well while a Prune hook is set (a row pruner follows the
	// rows layer by layer).
	NoEarlyExit bool

	// LCKVPasses chooses how a prompt runs on a Layer-Condensed KV model
	// (Config.Condensed): 0, exact sequential encoding, token by token; m >
	// 0, the iterative parallel encoding of Wu & Tu (arXiv 2405.10637,
	// default DefaultLCKVPasses) over each chunk of Chunk tokens: m passes
	// of the chunk as one matrix, the first with the chunk's own entries
	// of every layer that others read from below left out (those readers
	// see the earlier chunks' entries and the dummy), each later pass
	// reading the entries the pass before computed; only the last pass
	// writes the cache. Token t of a chunk is exact once m > t, so m ≥
	// Chunk equals sequential encoding. Decoding is always exact. Set on a
	// model that is not condensed it is an error; so is a Prune hook with
	// m > 1.
	LCKVPasses int

	// StepBytes is the bytes the cache held after the last forward step
	// ran its layers, before a policy compressed it: a prompt's peak.
	StepBytes int64

	pol      Compressor // nil: none
	prompt   int        // tokens of the announced prompt still to run
	prepared int        // tokens the next step's Before already ran for (Prepare)

	w      pass      // working memory of a chunk
	logits []float32 // [n][Vocab]
}

// NewSequence starts an empty sequence over cache, which must fit the
// model's KV layout.
func (m *Model) NewSequence(cache kvcache.Sequence) (*Sequence, error) {
	l, want := cache.Layout(), m.KVLayout()
	if l.Layers != want.Layers || l.KVHeads != m.KVHeads || l.HeadDim != m.HeadDim {
		return nil, fmt.Errorf("model: cache layout %+v does not fit the model (%d cache layers, %d KV heads, head dim %d)",
			l, want.Layers, m.KVHeads, m.HeadDim)
	}
	s := &Sequence{m: m, cache: cache, Chunk: DefaultChunk, pos: cache.Len(), hist: cache.Len(), MaxPos: m.CtxLen}
	return s, nil
}

// checkLCKV refuses LCKVPasses where it cannot apply.
func (s *Sequence) checkLCKV() error {
	switch {
	case s.LCKVPasses < 0:
		return fmt.Errorf("model: %d Layer-Condensed KV prompt passes: want 0 (sequential) or more", s.LCKVPasses)
	case s.LCKVPasses > 0 && !s.m.Condensed():
		return fmt.Errorf("model: Layer-Condensed KV prompt passes (%d) asked of a model without layers that read a later layer's KV", s.LCKVPasses)
	case s.LCKVPasses > 1 && s.Prune != nil:
		return errors.New("model: a row pruner (PyramidInfer) cannot run with Layer-Condensed KV's iterative prompt passes")
	}
	return nil
}

// KVOptions chooses the cache of a standalone sequence.
type KVOptions struct {
	BlockTokens int         // 0: kvcache.DefaultBlockTokens
	K, V        codec.Codec // nil: f32
	MemBytes    int64       // pool size in bytes; or
	Tokens      int         // room for this many tokens; both 0: the model's context
	// KeyShift, if set, stores q8/q4 keys around these means (from
	// KeyMeans; indexed cache layer·KVHeads + head, each [HeadDim]); see
	// kvcache.PoolConfig.KeyShift.
	KeyShift [][]float32
	// LCKVPasses is the sequence's Sequence.LCKVPasses (a Layer-Condensed
	// KV model's prompt encoding; 0: sequential).
	LCKVPasses int
}

// NewStandaloneSequence starts a sequence over a private block pool sized
// for the whole context. Close frees it.
func (m *Model) NewStandaloneSequence(opt KVOptions) (*Sequence, error) {
	pool, err := m.NewPool(opt)
	if err != nil {
		return nil, err
	}
	s, err := m.NewSequence(pool.NewSequence())
	if err != nil {
		return nil, err
	}
	s.LCKVPasses = opt.LCKVPasses
	if err := s.checkLCKV(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// NewPool makes a block pool for the model's KV layout as opt says (its
// codecs, key shift and block size; MemBytes bytes, else Tokens tokens,
// else the model's context). NewStandaloneSequence runs one sequence in
// such a pool; several sequences in one share its prefix cache.
func (m *Model) NewPool(opt KVOptions) (*kvcache.Pool, error) {
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
	return kvcache.NewPool(cfg)
}

// Close releases the sequence's cache.
func (s *Sequence) Close() { s.cache.Free() }

// KVLayout is the per-token shape of the model's KV cache: one cache layer
// per KV owner (Config.Owners), each cache layer's retention bound
// (Config.CacheWindows) and, when some cache layer has more than one,
// how many model layers read each.
func (m *Model) KVLayout() kvcache.Layout {
	c := m.Config
	l := kvcache.Layout{Layers: len(c.Owners()), KVHeads: m.KVHeads, HeadDim: m.HeadDim, Windows: c.CacheWindows()}
	readers := c.Readers()
	for _, r := range readers {
		if len(r) != 1 {
			l.Readers = make([]int, len(readers))
			for cl, r := range readers {
				l.Readers[cl] = len(r)
			}
			break
		}
	}
	return l
}

// Pos is the position the next token will take.
func (s *Sequence) Pos() int { return s.pos }

// Cache is the sequence's KV cache.
func (s *Sequence) Cache() kvcache.Sequence { return s.cache }

// Model is the model the sequence runs.
func (s *Sequence) Model() *Model { return s.m }

// SetPolicy installs the KV policy the sequence drives from now on (nil:
// none); see Compressor. Announce a prompt with Prompt.
func (s *Sequence) SetPolicy(p Compressor) { s.pol, s.prompt, s.prepared = p, 0, 0 }

// Policy is the installed policy (nil: none).
func (s *Sequence) Policy() Compressor { return s.pol }

// Prompt announces that the next n tokens run (by one Forward or several,
// as a scheduler prefills in chunks) are a prompt: the policy's
// BeginPrefill(n) now, its Compress after the last of them. Without a
// policy it does nothing.
func (s *Sequence) Prompt(n int) {
	if s.pol == nil || n <= 0 {
		return
	}
	s.prompt, s.prepared = n, 0
	s.pol.BeginPrefill(n)
}

// Prepare runs the policy's Before for the next step of n tokens now
// rather than at its start, so that a scheduler sees the room the step
// needs after the policy made room; that step then does not run it again.
// Without a policy, or inside a prompt, it does nothing.
func (s *Sequence) Prepare(n int) error {
	if s.pol == nil || s.prompt > 0 || s.prepared > 0 || n <= 0 {
		return nil
	}
	if err := s.pol.Before(n); err != nil {
		return err
	}
	s.prepared = n
	return nil
}

// before drives the policy at the start of a step of n tokens: nothing
// inside a prompt (which must not be overrun), else Before unless Prepare
// ran it.
func (s *Sequence) before(n int) error {
	switch {
	case s.pol == nil:
		return nil
	case s.prompt > 0:
		if n > s.prompt {
			return fmt.Errorf("model: %d tokens run past the prompt's last %d", n, s.prompt)
		}
		return nil
	case s.prepared > 0:
		p := s.prepared
		s.prepared = 0
		if p != n {
			return fmt.Errorf("model: a step prepared for %d tokens runs %d", p, n)
		}
		return nil
	}
	return s.pol.Before(n)
}

// after drives the policy at the end of a step of n tokens: Compress
// after a prompt's last token.
func (s *Sequence) after(n int) error {
	s.StepBytes = s.cache.Bytes()
	if s.pol == nil || s.prompt == 0 {
		return nil
	}
	s.prompt -= n
	if s.prompt > 0 {
		return nil
	}
	return s.pol.Compress()
}

// Forward runs tokens through the model at the next positions, in chunks of
// s.Chunk, and returns logits: [len(tokens)][Vocab] when all is set, else
// the last token's [Vocab]. The slice is reused by the next call. With a
// policy (SetPolicy), it first lets the policy make room for the tokens,
// unless they are part of an announced prompt, and compresses the cache
// after a prompt's last token.
func (s *Sequence) Forward(tokens []int, all bool) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, errors.New("model: no tokens to run")
	}
	for _, t := range tokens {
		if t < 0 || t >= s.m.Vocab {
			return nil, fmt.Errorf("model: token id %d out of range [0,%d)", t, s.m.Vocab)
		}
	}
	if err := s.before(len(tokens)); err != nil {
		return nil, err
	}
	if s.pos+len(tokens) > s.MaxPos {
		return nil, fmt.Errorf("%w: %d tokens at position %d go past the context length %d", ErrContextFull, len(tokens), s.pos, s.MaxPos)
	}
	if err := s.checkLCKV(); err != nil {
		return nil, err
	}
	chunk := s.Chunk
	if chunk <= 0 {
		chunk = DefaultChunk
	}
	if s.m.Condensed() && s.LCKVPasses == 0 {
		// Exact sequential encoding: a token's layers that read a later
		// layer's KV need the earlier tokens' entries of that layer.
		chunk = 1
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
	if err := s.after(len(tokens)); err != nil {
		return nil, err
	}
	return s.logits, nil
}

// SetPos sets the position the next token takes: after a policy re-indexed
// the cache's positions, the next token continues from the cache length.
func (s *Sequence) SetPos(n int) { s.pos = n }

// SetHistory sets the count of tokens run so far (what a policy numbers
// the origins of new tokens from; positions may be re-indexed, this is
// not), for a sequence whose cache was restored compressed.
func (s *Sequence) SetHistory(n int) { s.hist = n }

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
//
// Prefill early exit: when not every token's logits are wanted, the layers
// above the last KV owner (Config.LastOwner) run for the last row only, or
// not at all when no logits are wanted: no later token reads anything they
// produce, so this is exact. A mass hook's scored rows run there too
// (PromptRows): a policy scoring every prompt query's attention (H2O) keeps
// them all, one that scores none (a window) none. NoEarlyExit or a Prune
// hook turns it off. With LCKVPasses > 1 on a Layer-Condensed KV model,
// the chunk runs that many passes (see LCKVPasses).
func (s *Sequence) step(tokens []int, dst []float32) error {
	m, c := s.m, s.m.Config
	n := len(tokens)
	p := &s.w
	if err := s.cache.Reserve(n); err != nil {
		return err
	}
	passes := 1
	if s.LCKVPasses > 1 && n > 1 {
		passes = s.LCKVPasses
	}
	var cur, prev [][]kvcache.Segment
	if passes > 1 {
		nc := len(c.Owners())
		cur, prev = make([][]kvcache.Segment, nc), make([][]kvcache.Segment, nc)
	}
	all := len(dst) == n*c.Vocab
	last := c.LastOwner()
	// A pass before the last only computes the keys and values the next
	// pass's readers of a later layer see: the layers up to the highest
	// such source.
	lastRead := 0
	for i := 0; i < c.Layers; i++ {
		if c.ReadsLater(i) {
			lastRead = max(lastRead, c.Source(i))
		}
	}
	for k := 0; k < passes; k++ {
		p.grow(c, n, 1)
		p.batch = false
		for t, id := range tokens {
			m.row(p, t, id, s.pos+t)
		}
		p.spans = append(p.spans, span{s: s, lo: 0, hi: n, start: s.hist})
		if passes > 1 {
			p.dry, p.cur, p.prev = k < passes-1, cur, prev
		}
		prune := s.Prune != nil && !all
		for li := range m.Layers {
			if p.dry && li > lastRead {
				break
			}
			if li > last && !all && !s.NoEarlyExit && s.Prune == nil {
				// The rows still needed above the last owner: the last one
				// for its logits, and those whose attention a mass hook
				// scores (PromptRows); a dry pass needs none.
				rows := 0
				if !p.dry {
					if len(dst) > 0 {
						rows = 1
					}
					rows = max(rows, s.hookRows(n))
				}
				if rows == 0 {
					break // nothing above the last owner is needed
				}
				if r := p.spans[0].hi; r > rows {
					keep := make([]int, rows)
					for i := range keep {
						keep[i] = r - rows + i
					}
					if err := p.compactRows(c, keep, r); err != nil {
						return err
					}
					p.spans[0].hi, p.spans[0].start = rows, s.hist+n-rows
				}
			}
			if err := m.layer(li, p); err != nil {
				return err
			}
			if rows := p.spans[0].hi; prune && li < len(m.Layers)-1 {
				if keep := s.Prune.AfterLayer(li, p.pos[:rows]); keep != nil {
					if err := p.compactRows(c, keep, rows); err != nil {
						return fmt.Errorf("model: layer %d: %w", li, err)
					}
					p.spans[0].hi = len(keep)
				}
			}
		}
		if p.dry {
			// This pass's keys and values are what the next pass's readers
			// of a later layer see; the older ones' storage is reused.
			cur, prev = prev, cur
		}
	}
	s.pos += n
	s.hist += n
	s.Computed += n
	n = p.spans[0].hi // the rows left: the last one is the step's last token
	switch len(dst) {
	case 0:
	case c.Vocab:
		last := p.x[(n-1)*c.Dim : n*c.Dim]
		tensor.RMSNorm(last, last, m.OutNorm, c.NormEps)
		m.Output.MatVec(dst, last)
		softcap(dst, c.FinalSoftcap)
	default:
		tensor.RMSNormRows(p.x, p.x, m.OutNorm, c.NormEps, n, c.Dim)
		m.Output.MatMul(dst, p.x, n)
		softcap(dst[:n*c.Vocab], c.FinalSoftcap)
	}
	return nil
}

// hookRows is how many of the last rows of a step of n tokens the mass
// hook scores (PromptRows; every row for a hook that does not say, none
// without a hook).
func (s *Sequence) hookRows(n int) int {
	switch h := s.Mass.(type) {
	case nil:
		return 0
	case PromptRows:
		return min(n, max(0, h.PromptRows(s.hist, n)))
	}
	return n
}

// compactRows keeps rows keep (ascending indexes below n, the last row
// among them) of the per-row state that outlives a layer: the residual
// stream, the positions and the RoPE tables.
func (p *pass) compactRows(c Config, keep []int, n int) error {
	for i, r := range keep {
		if r < 0 || r >= n || (i > 0 && r <= keep[i-1]) {
			return fmt.Errorf("row pruner: kept rows must be ascending indexes below %d", n)
		}
	}
	if len(keep) == 0 || keep[len(keep)-1] != n-1 {
		return errors.New("row pruner: the last row must be kept")
	}
	D, half := c.Dim, c.HeadDim/2
	for i, r := range keep {
		if r == i {
			continue
		}
		// r > i: rows move towards the front, so copying in order is safe.
		copy(p.x[i*D:(i+1)*D], p.x[r*D:(r+1)*D])
		copy(p.cos[i*half:(i+1)*half], p.cos[r*half:(r+1)*half])
		copy(p.sin[i*half:(i+1)*half], p.sin[r*half:(r+1)*half])
		p.pos[i] = p.pos[r]
	}
	return nil
}
