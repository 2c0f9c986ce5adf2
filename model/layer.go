package model

// The layer body: one transformer block over the rows of a forward step,
// each row a token of some sequence. A prefill chunk is one span of many
// rows of one sequence; a batched decode step is one span of one row per
// sequence. Every matrix product runs once over all rows; the cache append,
// the attention and the policy hooks run per span, over the span's
// sequence's own cache.

import (
	"fmt"
	"math"
	"slices"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tensor"
)

// pass is the working memory of a forward step over n rows (grown as
// needed).
type pass struct {
	x, xb    []float32 // [n][Dim] residual stream, normalised sub-block input
	q, att   []float32 // [n][QDim] queries, attention output
	k, v     []float32 // [n][KVDim]
	gate, up []float32 // [n][HiddenDim]
	cos, sin []float32 // [n][HeadDim/2] RoPE cosines and sines of each row
	cosL     []float32 // [n][HeadDim/2] likewise for a local layer's own base (Config.LocalRopeTheta)
	sinL     []float32
	pos      []int32 // [n] position of each row
	scr      []attention.Scratch
	mass     []*attention.MassRequest
	spans    []span
	batch    bool // rows of several sequences (errors name the sequence)

	// An iterative prompt pass (Layer-Condensed KV, Sequence.LCKVPasses)
	// over one span. dry: the pass appends nothing to the cache, calls no
	// hook, and an owner's keys and values of the chunk go to cur instead;
	// cur and prev, per cache layer ([cache layers], nil entries for
	// none), are the chunk's keys and values of this pass and of the one
	// before, as one f32 segment per KV head. A layer that reads an
	// earlier (or its own) layer's KV attends the cache plus cur in a dry
	// pass; a layer that reads a later layer's KV attends the cache plus
	// prev, in every pass.
	dry       bool
	cur, prev [][]kvcache.Segment
}

// span says that rows [lo, hi) of a pass are tokens of s, the next ones of
// its history; start is the history index of row lo (a prompt chunk that
// exited early keeps only its last row).
type span struct {
	s      *Sequence
	lo, hi int
	start  int
}

// grow sizes p for n rows in spans spans.
func (p *pass) grow(c Config, n, spans int) {
	p.x = grow(p.x, n*c.Dim)
	p.xb = grow(p.xb, n*c.Dim)
	p.q = grow(p.q, n*c.QDim())
	p.att = grow(p.att, n*c.QDim())
	p.k = grow(p.k, n*c.KVDim())
	p.v = grow(p.v, n*c.KVDim())
	p.gate = grow(p.gate, n*c.HiddenDim)
	p.up = grow(p.up, n*c.HiddenDim)
	half := c.HeadDim / 2
	p.cos = grow(p.cos, n*half)
	p.sin = grow(p.sin, n*half)
	if cap(p.pos) < n {
		p.pos = make([]int32, n)
	}
	p.pos = p.pos[:n]
	if len(p.scr) < spans {
		p.scr = make([]attention.Scratch, spans)
	}
	if cap(p.mass) < spans {
		p.mass = make([]*attention.MassRequest, spans)
	}
	p.mass = p.mass[:spans]
	p.spans = p.spans[:0]
	p.dry, p.cur, p.prev = false, nil, nil
}

// row starts row t of p: token id's embedding at position pos.
func (m *Model) row(p *pass, t, id, pos int) {
	c := m.Config
	m.TokEmb.Row(id, p.x[t*c.Dim:(t+1)*c.Dim])
	if c.EmbedScale != 0 {
		for i := t * c.Dim; i < (t+1)*c.Dim; i++ {
			p.x[i] *= c.EmbedScale
		}
	}
	p.pos[t] = int32(pos)
	half := c.HeadDim / 2
	m.angles(p.cos[t*half:(t+1)*half], p.sin[t*half:(t+1)*half], pos)
}

// layer runs layer li over the rows of p's spans. Per the KV source map
// (model/kvmap.go): an owner computes keys and values and appends them to
// its cache layer; every layer attends cache layer CacheLayer(li) with
// window Window(li), and a layer that reads a later layer's KV masks the
// diagonal and adds the zero dummy key and value.
func (m *Model) layer(li int, p *pass) error {
	c := m.Config
	L := &m.Layers[li]
	n := p.spans[len(p.spans)-1].hi
	qd, kvd := c.QDim(), c.KVDim()
	cl, own, later := c.CacheLayer(li), c.Source(li) == li, c.ReadsLater(li)
	tensor.RMSNormRows(p.xb, p.x, L.AttnNorm, c.NormEps, n, c.Dim)
	if own {
		tensor.MatMulMany([][]float32{p.q, p.k, p.v}, []*tensor.Matrix{L.Wq, L.Wk, L.Wv}, p.xb, n)
	} else {
		L.Wq.MatMul(p.q, p.xb, n)
	}
	addBias(p.q, L.Bq, n)
	headNorm(p.q, L.QNorm, c, n*c.Heads) // Q/K norm (qwen3, gemma3): every head of every row
	cos, sin := p.cos, p.sin
	if m.localRope(li) {
		// A local layer's own RoPE base (gemma3).
		half := c.HeadDim / 2
		cos, sin = grow(p.cosL, n*half), grow(p.sinL, n*half)
		p.cosL, p.sinL = cos, sin
		for t := 0; t < n; t++ {
			m.anglesOf(cos[t*half:(t+1)*half], sin[t*half:(t+1)*half], m.freqLocal, int(p.pos[t]))
		}
	}
	m.ropeRows(p.q, cos, sin, n, c.Heads)
	if own {
		addBias(p.k, L.Bk, n)
		addBias(p.v, L.Bv, n)
		headNorm(p.k, L.KNorm, c, n*c.KVHeads)
		m.ropeRows(p.k, cos, sin, n, c.KVHeads)
	}
	for i, sp := range p.spans {
		s, lo, hi := sp.s, sp.lo, sp.hi
		p.mass[i] = nil
		if own && p.dry {
			p.cur[cl] = chunkSegments(p.cur[cl], c, p.pos[lo:hi], p.k[lo*kvd:hi*kvd], p.v[lo*kvd:hi*kvd])
			continue
		}
		if own {
			if err := s.cache.Append(cl, p.pos[lo:hi], p.k[lo*kvd:hi*kvd], p.v[lo*kvd:hi*kvd]); err != nil {
				if p.batch {
					// Reserve passed, so only a pool shared beyond its room gets
					// here; the sequences of this batch are then inconsistent.
					return fmt.Errorf("model: layer %d, batch sequence %d: %w", li, i, err)
				}
				return fmt.Errorf("model: layer %d: %w", li, err)
			}
		}
		if s.Mass != nil && !p.dry {
			p.mass[i] = s.Mass.Request(cl, sp.start, hi-lo)
		}
	}
	// The chunk's keys and values outside the cache (an iterative prompt
	// pass): this pass's for a reader of its own or an earlier layer's KV
	// in a dry pass, the previous pass's for a reader of a later layer's.
	var extra []kvcache.Segment
	switch {
	case later && p.prev != nil:
		extra = p.prev[cl]
	case !later && p.dry:
		extra = p.cur[cl]
	}
	// The chunk's entries outside the cache are slots-to-be of the cache
	// layer (its owner appends them later in this step, in the same order),
	// so a mass request also gets their mass, after the table's slots.
	if extra != nil {
		for i := range p.spans {
			if req := p.mass[i]; req != nil {
				for h := range req.Out {
					req.Out[h] = append(req.Out[h], make([]float32, extra[h].N)...)
				}
			}
		}
	}
	// Attention per span, the spans in parallel (then each Run runs its
	// heads on the calling worker; one span runs its heads in parallel).
	norm := float32(math.Sqrt(float64(c.HeadDim)))
	if c.AttnScale != 0 {
		norm = 1 / c.AttnScale
	}
	tensor.Parallel(len(p.spans), 1, func(a, b int) {
		for i := a; i < b; i++ {
			s, lo, hi := p.spans[i].s, p.spans[i].lo, p.spans[i].hi
			segs := func(h int) []kvcache.Segment { return s.cache.Segments(cl, h) }
			if extra != nil {
				segs = func(h int) []kvcache.Segment {
					cs := s.cache.Segments(cl, h)
					return append(cs[:len(cs):len(cs)], extra[h])
				}
			}
			att := attention.Batch{Heads: c.KVHeads, G: c.GroupSize(), HeadDim: c.HeadDim, Norm: norm, Softcap: c.AttnSoftcap, Window: int32(c.Window(li)),
				Strict: later, Dummy: later,
				Q: p.q[lo*qd : hi*qd], Out: p.att[lo*qd : hi*qd], Pos: p.pos[lo:hi],
				Segs: segs, Mass: p.mass[i]}
			att.Run(&p.scr[i])
		}
	})
	for i, sp := range p.spans {
		s, lo, hi := sp.s, sp.lo, sp.hi
		if p.mass[i] != nil {
			s.Mass.Done(cl, p.mass[i], p.q[lo*qd:hi*qd], p.pos[lo:hi])
		}
		if s.AttnTap != nil && !p.dry {
			s.AttnTap(li, p.att[lo*qd:hi*qd])
		}
		s.RowLayers += hi - lo
	}
	// The output projection and its residual, then RMSNorm, the SwiGLU FFN
	// (GeGLU: gemma3) and its residual; with post-norms (gemma3) each
	// sub-block's output is RMS-normalised before its residual add.
	L.Wo.MatMul(p.xb, p.att, n)
	if L.AttnPost != nil {
		tensor.RMSNormRows(p.xb, p.xb, L.AttnPost, c.NormEps, n, c.Dim)
	}
	tensor.AddRMSNormRows(p.xb, p.x, p.xb, L.FFNNorm, c.NormEps, n, c.Dim)
	tensor.MatMulMany([][]float32{p.gate, p.up}, []*tensor.Matrix{L.WGate, L.WUp}, p.xb, n)
	if c.GELU {
		geglu(p.gate[:n*c.HiddenDim], p.up[:n*c.HiddenDim])
	} else {
		tensor.SwiGLU(p.gate[:n*c.HiddenDim], p.gate[:n*c.HiddenDim], p.up[:n*c.HiddenDim])
	}
	L.WDown.MatMul(p.xb, p.gate, n)
	if L.FFNPost != nil {
		tensor.RMSNormRows(p.xb, p.xb, L.FFNPost, c.NormEps, n, c.Dim)
	}
	tensor.AddRows(p.x, p.xb, n, c.Dim)
	return nil
}

// chunkSegments lays out keys and values of n rows ([n][KVHeads·HeadDim]
// each) as one f32 segment per KV head, reusing segs' storage.
func chunkSegments(segs []kvcache.Segment, c Config, pos []int32, k, v []float32) []kvcache.Segment {
	n, hd := len(pos), c.HeadDim
	if len(segs) != c.KVHeads {
		segs = make([]kvcache.Segment, c.KVHeads)
	}
	for h := range segs {
		sg := &segs[h]
		if len(sg.K) != 4*n*hd {
			sg.K, sg.V = make([]byte, 4*n*hd), make([]byte, 4*n*hd)
		}
		for t := 0; t < n; t++ {
			off := (t*c.KVHeads + h) * hd
			codec.F32.Put(sg.K, n, hd, t, k[off:off+hd])
			codec.F32.Put(sg.V, n, hd, t, v[off:off+hd])
		}
		sg.KC, sg.VC, sg.Cap, sg.N, sg.Pos = codec.F32, codec.F32, n, n, slices.Clone(pos)
	}
	return segs
}

// geglu sets gate to GELU(gate)·up, GELU the tanh approximation
// (PyTorch's gelu(approximate="tanh"), Gemma's gelu_pytorch_tanh):
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
func geglu(gate, up []float32) {
	const c = 0.7978845608028654 // √(2/π)
	tensor.Parallel(len(gate), 4096, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := float64(gate[i])
			gate[i] = float32(0.5*x*(1+math.Tanh(c*(x+0.044715*x*x*x)))) * up[i]
		}
	})
}

// softcap sets each logit x to c·tanh(x/c) (c = 0: nothing).
func softcap(x []float32, c float32) {
	if c == 0 {
		return
	}
	for i, v := range x {
		x[i] = float32(float64(c) * math.Tanh(float64(v)/float64(c)))
	}
}

// headNorm RMS-normalises heads heads of x ([heads][HeadDim], in place)
// by w ([HeadDim]); nothing when w is nil.
func headNorm(x, w []float32, c Config, heads int) {
	if w == nil {
		return
	}
	tensor.RMSNormRows(x, x, w, c.NormEps, heads, c.HeadDim)
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

// RoPE. The angle of pair j at position p is p·freq[j] (RopeFreqs); one
// frequency table per model, computed when it is loaded.

// ropeFreqs is the model's RoPE frequency table.
func (m *Model) ropeFreqs() []float32 {
	if m.freq == nil { // a model built by hand, not checked
		return m.RopeFreqs()
	}
	return m.freq
}

// angles fills the cosines and sines ([HeadDim/2] each) of position pos.
func (m *Model) angles(cos, sin []float32, pos int) { m.anglesOf(cos, sin, m.ropeFreqs(), pos) }

// anglesOf fills the cosines and sines of position pos for frequencies
// freq, times the RoPE attention factor (Config.RopeAttnFactor).
func (m *Model) anglesOf(cos, sin, freq []float32, pos int) {
	scale := float32(1)
	if m.RopeAttnFactor != 0 {
		scale = m.RopeAttnFactor
	}
	for j, f := range freq {
		a := float32(pos) * f
		cos[j] = float32(math.Cos(float64(a))) * scale
		sin[j] = float32(math.Sin(float64(a))) * scale
	}
}

// rotate turns the dimension pairs of one head v by the angles whose
// cosines and sines are cs, sn ([HeadDim/2]): adjacent pairs, or NeoX
// halves. The one RoPE rotation: of queries and keys in the forward pass,
// and of cached keys re-indexed by a Rotator.
func rotate(v, cs, sn []float32, neox bool) {
	half := len(cs)
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

// ropeRows rotates the heads of n rows of x in place, row t by the angles
// cos[t], sin[t] ([n][HeadDim/2]).
func (m *Model) ropeRows(x, cos, sin []float32, n, heads int) {
	hd := m.HeadDim
	half := hd / 2
	neox := m.Rope == RopeNeoX
	w := heads * hd
	// Rows in parallel (at least ~2048 values a worker).
	tensor.Parallel(n, max(1, 2048/max(w, 1)), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			cs, sn := cos[t*half:(t+1)*half], sin[t*half:(t+1)*half]
			row := x[t*w : (t+1)*w]
			for h := 0; h < heads; h++ {
				rotate(row[h*hd:(h+1)*hd], cs, sn, neox)
			}
		}
	})
}

// localRope reports whether layer li rotates with the local layers' own
// RoPE base (Config.LocalRopeTheta: a windowed layer of gemma3).
func (m *Model) localRope(li int) bool { return m.freqLocal != nil && m.Window(li) > 0 }

// Rotate turns one head's key of cache layer cl, rotated by RoPE for some
// position, into the key for a position delta further on (delta may be
// negative): how a policy re-indexes the positions of cached keys. A
// Rotator does the same faster when many keys move.
func (m *Model) Rotate(key []float32, cl, delta int) { m.NewRotator().Rotate(key, cl, delta) }

// Rotator re-rotates the keys of each cache layer by position deltas, with
// the RoPE of the layer that wrote them (a local layer's own base on gemma3,
// the global base and scaling elsewhere), keeping the cosines and sines of
// the deltas it has seen (a re-indexing policy moves most keys by the same
// few deltas step after step). Not safe for concurrent use.
type Rotator struct {
	neox  bool     // NEOX halves instead of interleaved pairs
	sets  []rotSet // the model's distinct frequency tables: global, then local if any
	layer []int    // [cache layers] index into sets of the owner layer's RoPE
}

// rotSet is one RoPE frequency table and its rotations by delta.
type rotSet struct {
	freq   []float32            // RoPE frequencies [HeadDim/2]
	tables map[int][2][]float32 // delta → cosines, sines [HeadDim/2]
}

// NewRotator returns a rotator for the model's RoPE, layer by layer.
func (m *Model) NewRotator() *Rotator {
	r := &Rotator{neox: m.Rope == RopeNeoX, sets: []rotSet{{freq: m.ropeFreqs(), tables: map[int][2][]float32{}}}}
	if m.freqLocal != nil {
		r.sets = append(r.sets, rotSet{freq: m.freqLocal, tables: map[int][2][]float32{}})
	}
	owners := m.Owners()
	r.layer = make([]int, len(owners))
	for cl, li := range owners {
		if m.localRope(li) {
			r.layer[cl] = 1
		}
	}
	return r
}

// Rotate moves key, of cache layer cl, by delta positions.
func (r *Rotator) Rotate(key []float32, cl, delta int) {
	if delta == 0 {
		return
	}
	set := &r.sets[r.layer[cl]]
	t, ok := set.tables[delta]
	if !ok {
		if len(set.tables) > 256 {
			clear(set.tables)
		}
		t = [2][]float32{make([]float32, len(set.freq)), make([]float32, len(set.freq))}
		for j, f := range set.freq {
			a := float64(delta) * float64(f)
			t[0][j], t[1][j] = float32(math.Cos(a)), float32(math.Sin(a))
		}
		set.tables[delta] = t
	}
	rotate(key, t[0], t[1], r.neox)
}
