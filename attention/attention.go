// Package attention computes scaled dot-product attention of queries
// against the keys and values of a paged KV cache, reading every storage
// codec directly (no dequantized copy of the cache).
//
// Work is split over KV heads and tiles of up to 16 query tokens. The rows
// of a tile (its tokens × the G query heads of the KV head) are computed
// together, a panel of up to 16 cache slots at a time, by the kernels of
// package tensor: the scores of a panel as a small matrix product (the keys
// transposed into SIMD lanes; every score summed in head-dimension order as
// llama2.c's run.c does), the softmax's exponentials in SIMD, and the
// weighted sum of value rows with the output's values in lanes (slot order
// kept). Float codecs (f32, f16, bf16) are read in place; other codecs
// decode a panel's slots to float32 once per tile.
//
// By default each row runs a two-pass softmax over its visible slots in
// run.c's order (every score, their maximum, the exponentials and their
// sum, each weight divided by the sum, then the weighted sum of values),
// over the panels of 16 slots its query sees only (by the slots'
// positions, whatever their order in the cache); every row's numbers are independent of the tile it is computed in, so a
// prompt run as a matrix and token by token give the same bits.
// Batch.Online selects an online softmax instead, where each panel updates
// a running maximum, sum and output per row. Decode attention of a long
// cache is split along the keys into chunks computed in parallel, each an
// online softmax giving a partial output and its log-sum-exp, merged
// afterwards (FlashDecoding). On request both hand back the attention mass
// each stored token received, summed over chosen queries and aggregated
// over the query heads that share a KV head — the scores the eviction
// policies need. A segment may carry per-slot magnitudes (MiniCache's
// merged layers store unit directions shared by two layers and each layer's
// norms): scores are then multiplied by KMag[i] and value weights by
// VMag[i]; segments without them take the plain path. For a layer that
// reads a later layer's KV (Layer-Condensed KV), Batch.Strict masks the
// diagonal and Batch.Dummy adds a zero key and value to every softmax, on
// every path (exact, online, split, mass).
package attention

import (
	"math"
	"sync"
	"unsafe"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tensor"
)

// Agg says how the scores of the G query heads of a KV head are combined.
type Agg int

const (
	AggMean Agg = iota // the mean over the group (default)
	AggMax             // the maximum
	AggSum             // the sum
)

func (a Agg) String() string {
	return [...]string{"mean", "max", "sum"}[a]
}

// MassRequest asks for the attention mass of every stored slot.
type MassRequest struct {
	// From: only queries t ≥ From of the batch contribute (0: all queries;
	// n−W: an observation window of W; n−1: the last query).
	From int
	Agg  Agg
	// Weights, if set, weights each contributing query: query t ≥ From
	// adds Weights[t−From] times its mass (PyramidInfer weights recent
	// queries by distance). It must cover every query from From on; nil
	// weights every query 1.
	Weights []float32
	// Out[head] receives, added to what it holds, the mass of each slot of
	// that KV head's segments in order: len ≥ the slots of the table.
	Out [][]float32
}

// Batch is the attention of one layer: n query tokens against the cache of
// each KV head.
type Batch struct {
	Heads   int     // KV heads
	G       int     // query heads per KV head
	HeadDim int     // values per head
	Norm    float32 // scores q·k are divided by it: sqrt(HeadDim), as run.c
	// Softcap, if positive, caps every visible score s = q·k/Norm to
	// Softcap·tanh(s/Softcap) before the softmax (Gemma 2's attention
	// logit soft-capping).
	Softcap float32

	Q   []float32 // [n][Heads·G·HeadDim] queries; group h at offset h·G·HeadDim
	Out []float32 // [n][Heads·G·HeadDim] outputs, same layout
	Pos []int32   // [n] positions; a query sees slots at positions ≤ its own
	// Window, if positive, also hides slots at positions ≤ the query's − Window
	// (sliding-window attention, as Mistral's).
	Window int32
	// Strict also hides the slots at the query's own position: a query at
	// p sees slots at positions < p only (Layer-Condensed KV's masked
	// diagonal, for a layer reading a later layer's KV).
	Strict bool
	// Dummy adds one more key and value to every query's softmax, both
	// zeros: a score of 0 whose value adds nothing (Layer-Condensed KV's
	// dummy token, so that a query that sees no slot still attends
	// something). It is not a slot: the attention mass of the slots sums
	// to less than 1 by the dummy's share.
	Dummy bool

	Segs func(head int) []kvcache.Segment // the stored tokens of each KV head
	Mass *MassRequest                     // nil: no mass wanted

	// Online selects, for batches of several queries, an online softmax
	// (a running maximum, sum and output per row, updated once per panel
	// of 16 slots). By default each row runs the two-pass softmax decode
	// uses, which keeps prefill and decode bit-identical.
	Online bool

	// SplitMin is the number of slots above which a single query's keys
	// are split into parallel chunks (0: DefaultSplitMin, and no split when
	// the KV heads alone share out evenly among the tensor.Threads
	// workers); SplitChunk the slots per chunk (0: DefaultSplitChunk).
	// Negative SplitMin: never split.
	SplitMin, SplitChunk int
}

// Defaults of the FlashDecoding split.
const (
	DefaultSplitMin   = 1024
	DefaultSplitChunk = 512
)

// Scratch holds reusable buffers; one per Batch.Run caller.
type Scratch struct {
	items  []item
	states []state
}

// item is one unit of parallel work: (head, query tile) or (head, chunk of
// segments) for a split decode.
type item struct {
	head       int
	q0, q1     int  // queries [q0, q1)
	s0, s1     int  // segments [s0, s1)
	slot0      int  // slots before segment s0 (for mass offsets)
	state      int  // index of the first partial state (split decode)
	splitIndex int  // chunk number within a split head
	mass       bool // the item adds its head's Batch.Mass itself (exact, and its head's only item or run with its head's others in order)
}

// state is the running softmax of one query head: maximum, sum, output.
type state struct {
	m, l float32
	o    []float32 // [HeadDim]
}

// Run computes the batch. It parallelises over KV heads, query tiles and,
// for a single query over many slots, chunks of the keys.
func (b *Batch) Run(sc *Scratch) {
	n := len(b.Pos)
	hd := b.HeadDim
	stride := b.Heads * b.G * hd
	_ = b.Q[n*stride-1]
	_ = b.Out[n*stride-1]
	splitMin, chunk := b.SplitMin, b.SplitChunk
	if splitMin == 0 {
		splitMin = DefaultSplitMin
		if b.Heads%tensor.Threads == 0 {
			// Every worker gets whole heads: splitting them only adds the
			// online softmax and the merge (TinyLlama, 4 KV heads on 2
			// threads: decode 6% slower at 1100-1800 tokens split).
			splitMin = -1
		}
	}
	if chunk <= 0 {
		chunk = DefaultSplitChunk
	}
	sc.items = sc.items[:0]
	nstates := 0
	for h := 0; h < b.Heads; h++ {
		segs := b.Segs(h)
		slots := 0
		for _, s := range segs {
			slots += s.N
		}
		if n == 1 && splitMin > 0 && slots > splitMin && tensor.Threads > 1 {
			// FlashDecoding: chunks of about `chunk` slots, merged below.
			s0, acc, slot0, k := 0, 0, 0, 0
			for si, s := range segs {
				acc += s.N
				if acc >= chunk || si == len(segs)-1 {
					sc.items = append(sc.items, item{head: h, q0: 0, q1: 1, s0: s0, s1: si + 1, slot0: slot0, state: nstates, splitIndex: k})
					nstates += b.G
					k++
					s0, slot0, acc = si+1, slot0+acc, 0
				}
			}
			continue
		}
		tile := queryTile(b.G, slots)
		for q0 := 0; q0 < n; q0 += tile {
			// A head computed in one exact tile (a decode step, a short
			// chunk) adds its attention mass from the weights it computed:
			// the same rows, so the same bits, as the separate pass below
			// that other heads take (which computes the weights again).
			sc.items = append(sc.items, item{head: h, q0: q0, q1: min(q0+tile, n), s0: 0, s1: len(segs), state: -1,
				mass: b.Mass != nil && !b.Online && tile >= n})
		}
	}
	if cap(sc.states) < nstates {
		sc.states = make([]state, nstates)
	}
	sc.states = sc.states[:nstates]
	for i := range sc.states {
		if len(sc.states[i].o) != hd {
			sc.states[i].o = make([]float32, hd)
		}
	}
	run := func(w *tile, it *item) {
		if it.state < 0 && !b.Online {
			w.exact(b, it)
		} else {
			w.online(b, it, sc)
		}
	}
	if b.Mass != nil && !b.Online && nstates == 0 && b.Heads%tensor.Threads == 0 {
		// The mass of a prompt of several tiles a head, added by the
		// tiles themselves: each worker takes whole heads and runs a head's
		// tiles in query order (the items are appended so), which adds
		// every slot's mass row by row in the order the separate pass does.
		for i := range sc.items {
			sc.items[i].mass = true
		}
		tensor.Parallel(b.Heads, 1, func(lo, hi int) {
			w := tiles.Get().(*tile)
			for i := range sc.items {
				if it := &sc.items[i]; it.head >= lo && it.head < hi {
					run(w, it)
				}
			}
			tiles.Put(w)
		})
	} else {
		tensor.Parallel(len(sc.items), 1, func(lo, hi int) {
			w := tiles.Get().(*tile)
			for i := lo; i < hi; i++ {
				run(w, &sc.items[i])
			}
			tiles.Put(w)
		})
	}
	if nstates > 0 {
		b.merge(sc)
	}
	if b.Mass != nil {
		var rest []int // heads whose mass was not added by their item
		for h := 0; h < b.Heads; h++ {
			fused := false
			for i := range sc.items {
				if it := &sc.items[i]; it.head == h && it.mass {
					fused = true
					break
				}
			}
			if !fused {
				rest = append(rest, h)
			}
		}
		tensor.Parallel(len(rest), 1, func(lo, hi int) {
			w := tiles.Get().(*tile)
			for _, h := range rest[lo:hi] {
				b.mass(h, w)
			}
			tiles.Put(w)
		})
	}
}

// tileScores is about the most scores (rows × slots) a tile holds at once:
// long contexts get fewer query tokens per tile.
const tileScores = 1 << 17

// queryTile is the number of query tokens per tile: up to 16.
func queryTile(G, slots int) int {
	return max(1, min(16, tileScores/(max(G, 1)*max(slots, tensor.AttnLanes))))
}

// Visibility of a panel to a query.
const (
	visNone uint8 = iota // every slot hidden
	visAll               // every slot visible
	visSome              // some slots visible
)

// panel is up to 16 consecutive slots of a head (one column block of the
// scores): slots i0 … i0+n−1 of segment seg, or, for segments of fewer than
// 16 slots (gather), n slots walked from there across segments.
type panel struct {
	seg, i0, n int
	k0         int  // index of its first slot among the head's slots (mass)
	single     bool // all its slots are in segment seg
	room16     bool // single, and segment seg has 16 slots from i0 (keys read as 16 rows)
	kmag, vmag bool // some slot has a key (value) magnitude
	lo, hi     int32
}

// tile is a worker's state and buffers for one item: rows = nq query tokens
// × G query heads, against the panels of a head's segments.
type tile struct {
	segs   []kvcache.Segment
	panels []panel
	pos    []int32 // [panels][16] positions of the panels' slots
	vis    []uint8 // [nq][panels]
	r0, r1 []int   // [nq] query t sees panels in [r0[t], r1[t]) only (r0 = r1: none)
	h      int
	q0, nq int
	rows   int
	p0, p1 int // the panels [p0, p1) some query of the tile sees (a window's)
	ld     int // columns of s: 16 per panel of [p0, p1)

	q, qp []float32 // [rows][hd] queries, gathered and packed
	// s holds the scores, then the weights, of the panels [p0, p1): panel
	// pi in columns (pi−p0)·16 …; a row's columns outside its query's
	// panels [r0, r1) are not written (nothing reads them).
	s    []float32 // [rows][ld]
	o    []float32 // [rows][hd] outputs
	m, l []float32 // [rows] maximum and sum
	kpan []float32 // [hd][16] a key panel
	dec  []float32 // [16][hd] decoded slots
	mag  [tensor.AttnLanes]float32
	// A panel's scales and minimums when its keys or values are read as
	// levels in place: ksm the keys' 16 scales, then 16 minimums
	// (Codec.LevelPanel); ksc, kmn the keys' per-channel ones
	// (Codec.ChannelPanel); vsm the values' (Codec.LevelRows)
	ksm      [2 * tensor.AttnLanes]float32
	ksc, kmn []float32 // [hd]
	vsm      []float32 // [⌈hd/16⌉][2][16]

	// The queries rounded to int8 for key codecs scored by integer dot
	// products (Codec.IntDot), made when a panel first needs them:
	// qd the rows (tensor.PackQueriesDot's layout), qcst their scales and
	// the key shift's part; dotShift the shift qcst holds (nil: none),
	// once dotReady.
	qd       []byte    // [rows·hd]
	qcst     []float32 // [rows][3]
	dotReady bool
	dotShift *float32
	ws       [tensor.DotScratch]byte // tensor.AttnPVDot's scratch
}

var tiles = sync.Pool{New: func() any { return new(tile) }}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

func f32Bytes(x []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}

// setup prepares w for item it: its segments, panels, gathered and packed
// queries, and buffers.
func (w *tile) setup(b *Batch, it *item) {
	hd, G := b.HeadDim, b.G
	w.h, w.q0, w.nq = it.head, it.q0, it.q1-it.q0
	w.rows = w.nq * G
	w.segs = b.Segs(it.head)[it.s0:it.s1]
	w.buildPanels(it.slot0)
	np := len(w.panels)
	w.q = grow(w.q, w.rows*hd)
	w.qp = grow(w.qp, w.rows*hd)
	w.o = grow(w.o, w.rows*hd)
	w.m = grow(w.m, w.rows)
	w.l = grow(w.l, w.rows)
	w.kpan = grow(w.kpan, hd*tensor.AttnLanes)
	w.dec = grow(w.dec, tensor.AttnLanes*hd)
	w.ksc, w.kmn = grow(w.ksc, hd), grow(w.kmn, hd)
	w.vsm = grow(w.vsm, 2*tensor.AttnLanes*((hd+tensor.AttnLanes-1)/tensor.AttnLanes))
	w.vis = grow(w.vis, w.nq*np)
	w.r0, w.r1 = grow(w.r0, w.nq), grow(w.r1, w.nq)
	stride := b.Heads * G * hd
	for t := 0; t < w.nq; t++ {
		off := (w.q0+t)*stride + w.h*G*hd
		copy(w.q[t*G*hd:(t+1)*G*hd], b.Q[off:off+G*hd])
	}
	tensor.PackQueries(w.qp, w.q, w.rows, hd)
	w.dotReady = false
	// Each query's visible panels, by the positions of their slots (in
	// any order): classify hides a panel only when every slot of it is.
	w.p0, w.p1 = np, 0
	for t := 0; t < w.nq; t++ {
		p := b.Pos[w.q0+t]
		r0, r1 := np, 0
		for pi := range w.panels {
			v := b.classify(&w.panels[pi], p)
			w.vis[t*np+pi] = v
			if v != visNone {
				r0, r1 = min(r0, pi), pi+1
			}
		}
		if r0 >= r1 {
			r0, r1 = 0, 0
		} else {
			w.p0, w.p1 = min(w.p0, r0), max(w.p1, r1)
		}
		w.r0[t], w.r1[t] = r0, r1
	}
	if w.p0 >= w.p1 {
		w.p0, w.p1 = 0, 0
	}
	for t := 0; t < w.nq; t++ {
		if w.r0[t] == w.r1[t] {
			w.r0[t], w.r1[t] = w.p0, w.p0
		}
	}
	w.ld = tensor.AttnLanes * (w.p1 - w.p0)
	w.s = grow(w.s, w.rows*w.ld)
}

// cols returns the columns of w.s that hold panel pi's (pi in [p0, p1)),
// from row 0.
func (w *tile) cols(pi int) []float32 {
	return w.s[(pi-w.p0)*tensor.AttnLanes:]
}

// buildPanels splits w.segs into panels: segments with room for 16 slots
// into panels of 16 of their own, smaller ones gathered 16 slots at a time.
func (w *tile) buildPanels(slot0 int) {
	w.panels = w.panels[:0]
	k := slot0
	gather := -1 // index of an open gather panel
	for si := range w.segs {
		s := &w.segs[si]
		if s.N == 0 {
			continue
		}
		if s.Cap >= tensor.AttnLanes {
			gather = -1
			for i0 := 0; i0 < s.N; i0 += tensor.AttnLanes {
				n := min(tensor.AttnLanes, s.N-i0)
				w.panels = append(w.panels, panel{seg: si, i0: i0, n: n, k0: k, single: true, room16: i0+tensor.AttnLanes <= s.Cap})
				k += n
			}
			continue
		}
		for i := 0; i < s.N; i++ {
			if gather < 0 {
				gather = len(w.panels)
				w.panels = append(w.panels, panel{seg: si, i0: i, k0: k, single: true})
			}
			p := &w.panels[gather]
			if p.seg != si {
				p.single = false
			}
			p.n++
			k++
			if p.n == tensor.AttnLanes {
				gather = -1
			}
		}
	}
	w.pos = grow(w.pos, tensor.AttnLanes*len(w.panels))
	for pi := range w.panels {
		p := &w.panels[pi]
		pos := w.pos[pi*tensor.AttnLanes : (pi+1)*tensor.AttnLanes]
		p.lo, p.hi = math.MaxInt32, math.MinInt32
		if p.single { // the common case, without the per-slot closure
			s := &w.segs[p.seg]
			for j, q := range s.Pos[p.i0 : p.i0+p.n] {
				pos[j] = q
				p.lo, p.hi = min(p.lo, q), max(p.hi, q)
			}
			p.kmag, p.vmag = s.KMag != nil, s.VMag != nil
			continue
		}
		w.walk(p, func(j int, s *kvcache.Segment, i int) {
			q := s.Pos[i]
			pos[j] = q
			p.lo, p.hi = min(p.lo, q), max(p.hi, q)
			p.kmag = p.kmag || s.KMag != nil
			p.vmag = p.vmag || s.VMag != nil
		})
	}
}

// walk calls f for each slot of p: lane j, its segment and slot.
func (w *tile) walk(p *panel, f func(j int, s *kvcache.Segment, i int)) {
	si, i := p.seg, p.i0
	for j := 0; j < p.n; j++ {
		for i >= w.segs[si].N {
			si, i = si+1, 0
		}
		f(j, &w.segs[si], i)
		i++
	}
}

// classify says how much of panel p a query at position q sees.
func (b *Batch) classify(p *panel, q int32) uint8 {
	last := b.last(q)
	if p.lo > last || (b.Window > 0 && p.hi <= q-b.Window) {
		return visNone
	}
	if p.hi <= last && (b.Window <= 0 || p.lo > q-b.Window) {
		return visAll
	}
	return visSome
}

// last is the latest position a query at position q sees: q, or q − 1
// with Strict.
func (b *Batch) last(q int32) int32 {
	if b.Strict {
		return q - 1
	}
	return q
}

// scorePanel fills panel p's columns col (rows ld apart) with the raw
// scores of w.qp against its keys: read as levels in place when its slots
// are one full group of a block whose key codec stores quantized keys in
// panels (Codec.LevelPanel: q8, q4; Codec.ChannelPanel: KIVI), by integer
// dot products with the queries rounded to int8 when the codec asks for
// that (Codec.IntDot: q8dot, q4dot; head sizes a multiple of 4 up to
// tensor.DotMaxHead), else as
// a float panel (keys).
func (w *tile) scorePanel(p *panel, col []float32, ld, hd int) {
	if p.single {
		s := &w.segs[p.seg]
		if lv, bits, shift, ok := s.KC.LevelPanel(s.K, s.Cap, hd, p.i0, &w.ksm); ok {
			if s.KC.IntDot() && hd%4 == 0 && hd <= tensor.DotMaxHead {
				w.dotQueries(shift, hd)
				tensor.AttnScoresDot(col, ld, lv, bits, &w.ksm, w.qd, w.qcst, w.rows, hd)
				return
			}
			tensor.AttnScoresQ(col, ld, lv, bits, &w.ksm, shift, w.qp, w.rows, hd, w.kpan)
			return
		}
		if lv, bits, ok := s.KC.ChannelPanel(s.K, s.Cap, hd, p.i0, w.ksc, w.kmn); ok {
			tensor.AttnScoresQC(col, ld, lv, bits, w.ksc, w.kmn, w.qp, w.rows, hd, w.kpan)
			return
		}
	}
	kp, kt := w.keys(p, hd)
	tensor.AttnScoresOf(col, ld, kp, kt, w.qp, w.rows, hd)
}

// dotQueries makes w.qd and w.qcst for the tile's queries and the key
// shift shift (nil: none), once a tile and again only when the shift
// changes.
func (w *tile) dotQueries(shift []float32, hd int) {
	if !w.dotReady {
		w.qd = grow(w.qd, w.rows*hd)
		w.qcst = grow(w.qcst, 3*w.rows)
		tensor.PackQueriesDot(w.qd, w.qcst, w.q, w.rows, hd)
	}
	if sp := unsafe.SliceData(shift); !w.dotReady || sp != w.dotShift {
		tensor.DotShifts(w.qcst, w.q, shift, w.rows, hd)
		w.dotShift = sp
	}
	w.dotReady = true
}

// keys returns panel p's keys as a [hd][16] score panel and the type of its
// values: in place when the key codec stores float panels
// (Codec.KeyPanel), decoded into w.kpan when it stores quantized ones
// (Codec.DecodeKeyPanel), else packed, transposed, as float32 into w.kpan.
func (w *tile) keys(p *panel, hd int) ([]byte, tensor.DType) {
	if p.single {
		s := &w.segs[p.seg]
		if k, t, ok := s.KC.KeyPanel(s.K, s.Cap, hd, p.i0); ok {
			return k, t
		}
		if s.KC.DecodeKeyPanel(s.K, s.Cap, hd, p.i0, w.kpan) {
			return f32Bytes(w.kpan), tensor.F32
		}
		if t, ok := s.KC.Plain(); ok {
			rb := hd * 4
			if t != tensor.F32 {
				rb = hd * 2
			}
			n := p.n
			if p.room16 {
				n = tensor.AttnLanes
			}
			tensor.PackKeys(w.kpan, s.K[p.i0*rb:], t, rb, n, hd)
			return f32Bytes(w.kpan), tensor.F32
		}
		codec.GetRows(s.KC, s.K, s.Cap, hd, p.i0, p.n, w.dec)
	} else {
		w.walk(p, func(j int, s *kvcache.Segment, i int) {
			s.KC.Get(s.K, s.Cap, hd, i, w.dec[j*hd:(j+1)*hd])
		})
	}
	tensor.PackKeys(w.kpan, f32Bytes(w.dec), tensor.F32, 4*hd, tensor.AttnLanes, hd)
	return f32Bytes(w.kpan), tensor.F32
}

// values returns panel p's value rows as the tensor kernels read them:
// in place for a float codec, else decoded into w.dec.
func (w *tile) values(p *panel, hd int) ([]byte, tensor.DType, int) {
	if p.single {
		s := &w.segs[p.seg]
		if t, ok := s.VC.Plain(); ok {
			rb := hd * 4
			if t != tensor.F32 {
				rb = hd * 2
			}
			return s.V[p.i0*rb:], t, rb
		}
		codec.GetRows(s.VC, s.V, s.Cap, hd, p.i0, p.n, w.dec)
	} else {
		w.walk(p, func(j int, s *kvcache.Segment, i int) {
			s.VC.Get(s.V, s.Cap, hd, i, w.dec[j*hd:(j+1)*hd])
		})
	}
	return f32Bytes(w.dec), tensor.F32, 4 * hd
}

// prefetchAhead is how many panels ahead of the one being read attention
// asks for a panel's keys or values: the blocks of a head are apart in the
// pool, so the hardware's stream prefetch starts over at each.
const prefetchAhead = 4

// prefetch asks for the bytes of panel pi's keys (values: its values),
// when pi is a panel within one segment: the share of the segment's block
// its slots hold.
func (w *tile) prefetch(pi int, values bool) {
	if pi >= w.p1 {
		return
	}
	p := &w.panels[pi]
	if !p.single {
		return
	}
	s := &w.segs[p.seg]
	x := s.K
	if values {
		x = s.V
	}
	n := len(x) / max(s.Cap, 1)
	lo := p.i0 * n
	tensor.Prefetch(x[lo:min(len(x), lo+tensor.AttnLanes*n)])
}

// scores fills panel pi's columns of w.s (pi in [p0, p1)) with the raw
// scores q·k (times the key magnitudes), −Inf where a slot is hidden from
// the row's query (and in lanes past the panel's slots). It reports whether
// any row sees a slot.
func (w *tile) scores(b *Batch, pi int) bool {
	const L = tensor.AttnLanes
	p := &w.panels[pi]
	np, ld, G := len(w.panels), w.ld, b.G
	col := w.cols(pi)
	inf := float32(math.Inf(-1))
	any := false
	for t := 0; t < w.nq; t++ {
		any = any || w.vis[t*np+pi] != visNone
	}
	if !any {
		for r := 0; r < w.rows; r++ {
			c := col[r*ld : r*ld+L]
			for j := range c {
				c[j] = inf
			}
		}
		return false
	}
	w.scorePanel(p, col, ld, b.HeadDim)
	if p.kmag {
		w.scaleByMag(p, col, ld, func(s *kvcache.Segment) []float32 { return s.KMag })
	}
	pos := w.pos[pi*L : pi*L+p.n]
	for t := 0; t < w.nq; t++ {
		v := w.vis[t*np+pi]
		q := b.Pos[w.q0+t]
		for r := t * G; r < (t+1)*G; r++ {
			c := col[r*ld : r*ld+L]
			switch v {
			case visNone:
				for j := range c {
					c[j] = inf
				}
				continue
			case visSome:
				for j, k := range pos {
					if b.hide(k, q) {
						c[j] = inf
					}
				}
			}
			for j := p.n; j < L; j++ {
				c[j] = inf
			}
			if b.Softcap > 0 {
				softcapScores(c[:p.n], b.Norm, b.Softcap)
			}
		}
	}
	return true
}

// softcapScores caps raw scores c (q·k; −Inf: hidden) so that c/norm
// becomes cap·tanh(c/norm/cap); hidden ones stay −Inf.
func softcapScores(c []float32, norm, cap float32) {
	k := float64(norm) * float64(cap)
	for j, v := range c {
		if !math.IsInf(float64(v), -1) {
			c[j] = float32(k * math.Tanh(float64(v)/k))
		}
	}
}

// weighted adds, for panel pi (in [p0, p1)), the weights of w.s (times the
// value magnitudes) times the panel's values to w.o, for the rows of the
// queries that see some of its slots.
func (w *tile) weighted(b *Batch, pi int) {
	p := &w.panels[pi]
	np, ld, G, hd := len(w.panels), w.ld, b.G, b.HeadDim
	col := w.cols(pi)
	if p.vmag {
		w.scaleByMag(p, col, ld, func(s *kvcache.Segment) []float32 { return s.VMag })
	}
	var v []byte
	var vt tensor.DType
	var ldv, bits int
	levels, dot := false, false
	for t0 := 0; t0 < w.nq; {
		if w.vis[t0*np+pi] == visNone {
			t0++
			continue
		}
		t1 := t0 + 1
		for t1 < w.nq && w.vis[t1*np+pi] != visNone {
			t1++
		}
		if v == nil && p.single { // levels in place (Codec.LevelRows)
			s := &w.segs[p.seg]
			v, bits, ldv, levels = s.VC.LevelRows(s.V, s.Cap, hd, p.i0, p.n, w.vsm)
			// A full panel of 8- or 4-bit rows of a codec summed by integer
			// dot products (Codec.IntDot: q8dot, q4dot values, one scale a
			// slot).
			dot = levels && s.VC.IntDot() && (bits == 8 || bits == 4) && p.n == tensor.AttnLanes && hd%tensor.AttnLanes == 0
		}
		if v == nil {
			v, vt, ldv = w.values(p, hd)
		}
		if dot {
			tensor.AttnPVDot(w.o[t0*G*hd:], hd, col[t0*G*ld:], ld, v, bits, ldv, (*[2 * tensor.AttnLanes]float32)(w.vsm), (t1-t0)*G, hd, w.ws[:])
		} else if levels {
			tensor.AttnPVQ(w.o[t0*G*hd:], hd, col[t0*G*ld:], ld, v, bits, ldv, w.vsm, p.n, (t1-t0)*G, hd, w.dec)
		} else {
			tensor.AttnPV(w.o[t0*G*hd:], hd, col[t0*G*ld:], ld, v, vt, ldv, p.n, (t1-t0)*G, hd)
		}
		t0 = t1
	}
}

// probs turns the rows of w.s into attention weights, in run.c's order:
// every score divided by Norm, their maximum, the exponentials and their sum
// (in slot order), each divided by the sum. A row that sees no slot becomes
// zeros with sum 0 (w.l). With Dummy, the dummy's score 0 joins the
// maximum (w.m) and its exponential the sum, added after the slots'.
//
// A row runs over the panels [r0, r1) of its query only: the panels outside
// hold no slot it sees, whose −Inf scores would become weights 0, which
// leave its maximum and sum (added in order from +0) bit for bit as they
// are. Nothing reads a row's columns outside its panels.
func (w *tile) probs(b *Batch) {
	const L = tensor.AttnLanes
	for pi := w.p0; pi < w.p1; pi++ {
		w.prefetch(pi+prefetchAhead, false)
		w.scores(b, pi)
	}
	ld, G := w.ld, b.G
	inf := float32(math.Inf(-1))
	for r := 0; r < w.rows; r++ {
		t := r / G
		row := w.s[r*ld+(w.r0[t]-w.p0)*L : r*ld+(w.r1[t]-w.p0)*L]
		mx := tensor.AttnMax(row)
		if b.Dummy {
			// The dummy's score 0 takes part in the maximum.
			m := float32(0)
			if mx != inf {
				m = max(mx/b.Norm, 0)
				tensor.AttnExp(row, b.Norm, m)
			} else {
				clear(row)
			}
			w.m[r] = m
			continue
		}
		if mx == inf {
			clear(row)
			continue
		}
		tensor.AttnExp(row, b.Norm, mx/b.Norm)
	}
	// The sums, four rows in step where consecutive queries see the same
	// panels (the rows of one query always do).
	for t0 := 0; t0 < w.nq; {
		t1 := t0 + 1
		for t1 < w.nq && w.r0[t1] == w.r0[t0] && w.r1[t1] == w.r1[t0] {
			t1++
		}
		c0, c1 := (w.r0[t0]-w.p0)*L, (w.r1[t0]-w.p0)*L
		rowSums(w.s[t0*G*ld+c0:], ld, c1-c0, (t1-t0)*G, w.l[t0*G:])
		t0 = t1
	}
	if b.Dummy {
		// The dummy's exponential joins the sum, after the slots'.
		for r := 0; r < w.rows; r++ {
			w.l[r] += float32(math.Exp(float64(-w.m[r])))
		}
	}
	for r := 0; r < w.rows; r++ {
		if w.l[r] != 0 {
			t := r / G
			tensor.AttnDiv(w.s[r*ld+(w.r0[t]-w.p0)*L:r*ld+(w.r1[t]-w.p0)*L], w.l[r])
		}
	}
}

// rowSums sets l[r] to the sum of the first width values of row r of s
// (rows ld apart), added in order from zero (four rows in step).
func rowSums(s []float32, ld, width, rows int, l []float32) {
	r := 0
	for ; r+4 <= rows; r += 4 {
		a := s[r*ld : r*ld+width]
		b, c, d := s[(r+1)*ld:(r+1)*ld+width], s[(r+2)*ld:(r+2)*ld+width], s[(r+3)*ld:(r+3)*ld+width]
		var s0, s1, s2, s3 float32
		for i, v := range a {
			s0 += v
			s1 += b[i]
			s2 += c[i]
			s3 += d[i]
		}
		l[r], l[r+1], l[r+2], l[r+3] = s0, s1, s2, s3
	}
	for ; r < rows; r++ {
		var s0 float32
		for _, v := range s[r*ld : r*ld+width] {
			s0 += v
		}
		l[r] = s0
	}
}

// exact computes item it (a head and a tile of queries) with the two-pass
// softmax and writes Out.
func (w *tile) exact(b *Batch, it *item) {
	w.setup(b, it)
	w.probs(b)
	if it.mass {
		b.addMass(it.head, w, it.q0) // before weighted, which may scale the weights in place
	}
	hd, G := b.HeadDim, b.G
	clear(w.o[:w.rows*hd])
	for pi := w.p0; pi < w.p1; pi++ {
		w.prefetch(pi+prefetchAhead, true)
		w.weighted(b, pi)
	}
	stride := b.Heads * G * hd
	for t := 0; t < w.nq; t++ {
		off := (w.q0+t)*stride + w.h*G*hd
		copy(b.Out[off:off+G*hd], w.o[t*G*hd:(t+1)*G*hd])
	}
}

// online computes item it with an online softmax, panel by panel: a split
// item leaves its partial state in sc.states, others write Out.
func (w *tile) online(b *Batch, it *item, sc *Scratch) {
	const L = tensor.AttnLanes
	w.setup(b, it)
	hd, G, ld := b.HeadDim, b.G, w.ld
	inf := float32(math.Inf(-1))
	for r := 0; r < w.rows; r++ {
		w.m[r], w.l[r] = inf, 0
	}
	if b.Dummy && it.splitIndex == 0 {
		// The dummy (score 0, value 0) as a first panel of its own: in the
		// first chunk of a split head only.
		for r := 0; r < w.rows; r++ {
			w.m[r], w.l[r] = 0, 1
		}
	}
	clear(w.o[:w.rows*hd])
	for pi := w.p0; pi < w.p1; pi++ {
		w.prefetch(pi+prefetchAhead, false)
		w.prefetch(pi+prefetchAhead, true)
		if !w.scores(b, pi) {
			continue
		}
		c0 := (pi - w.p0) * L
		for r := 0; r < w.rows; r++ {
			if w.vis[(r/G)*len(w.panels)+pi] == visNone {
				continue // all −Inf: it would leave the row as it is
			}
			c := w.s[r*ld+c0 : r*ld+c0+L]
			tmax := tensor.AttnMax(c)
			if tmax == inf {
				clear(c) // nothing visible in this panel
				continue
			}
			tmax /= b.Norm
			m := w.m[r]
			mNew := m
			if tmax > mNew {
				mNew = tmax
			}
			if mNew != m && w.l[r] != 0 {
				f := float32(math.Exp(float64(m - mNew)))
				w.l[r] *= f
				for i, v := range w.o[r*hd : (r+1)*hd] {
					w.o[r*hd+i] = v * f
				}
			}
			w.m[r] = mNew
			tensor.AttnExp(c, b.Norm, mNew)
			l := w.l[r]
			for _, e := range c {
				l += e
			}
			w.l[r] = l
		}
		w.weighted(b, pi)
	}
	if it.state >= 0 {
		for j := 0; j < G; j++ {
			st := &sc.states[it.state+j]
			st.m, st.l = w.m[j], w.l[j]
			copy(st.o, w.o[j*hd:(j+1)*hd])
		}
		return
	}
	stride := b.Heads * G * hd
	for r := 0; r < w.rows; r++ {
		if w.l[r] != 0 {
			tensor.AttnDiv(w.o[r*hd:(r+1)*hd], w.l[r])
		}
	}
	for t := 0; t < w.nq; t++ {
		off := (w.q0+t)*stride + w.h*G*hd
		copy(b.Out[off:off+G*hd], w.o[t*G*hd:(t+1)*G*hd])
	}
}

// hide reports whether a query at position p must not see a slot at
// position q: q is later (or the same, with Strict), or outside the
// sliding window.
func (b *Batch) hide(q, p int32) bool {
	return q > b.last(p) || (b.Window > 0 && q <= p-b.Window)
}

// merge combines the partial states of split heads by log-sum-exp.
func (b *Batch) merge(sc *Scratch) {
	hd, G := b.HeadDim, b.G
	stride := b.Heads * G * hd
	for i := 0; i < len(sc.items); {
		it := sc.items[i]
		if it.state < 0 {
			i++
			continue
		}
		// Items of one split head are consecutive.
		j := i
		for j < len(sc.items) && sc.items[j].head == it.head && sc.items[j].state >= 0 {
			j++
		}
		o := b.Out[it.head*G*hd : (it.head+1)*G*hd]
		_ = stride
		for g := 0; g < G; g++ {
			M := float32(math.Inf(-1))
			for k := i; k < j; k++ {
				if st := sc.states[sc.items[k].state+g]; st.l > 0 && st.m > M {
					M = st.m
				}
			}
			og := o[g*hd : (g+1)*hd]
			clear(og)
			var L float32
			for k := i; k < j; k++ {
				st := sc.states[sc.items[k].state+g]
				if st.l == 0 {
					continue
				}
				f := float32(math.Exp(float64(st.m - M)))
				L += st.l * f
				tensor.Axpy(og, f, st.o)
			}
			if L > 0 {
				for c := range og {
					og[c] /= L
				}
			}
		}
		i = j
	}
}

// mass adds each slot's attention probability, summed over the requested
// queries and aggregated over the G query heads, to Mass.Out[head]. It
// recomputes the weights of the exact path, tile by tile of queries, for
// the heads whose item did not add them (item.mass).
func (b *Batch) mass(h int, w *tile) {
	G := b.G
	from := max(b.Mass.From, 0)
	n := len(b.Pos)
	segs := b.Segs(h)
	slots := 0
	for _, s := range segs {
		slots += s.N
	}
	nq := queryTile(G, slots)
	for q0 := from; q0 < n; q0 += nq {
		it := item{head: h, q0: q0, q1: min(q0+nq, n), s0: 0, s1: len(segs), state: -1}
		w.setup(b, &it)
		w.probs(b)
		b.addMass(h, w, q0)
	}
}

// addMass adds to Mass.Out[h] the mass of the tile's queries q0+t ≥
// Mass.From, from the weights probs left in w.s.
func (b *Batch) addMass(h int, w *tile, q0 int) {
	const L = tensor.AttnLanes
	G := b.G
	out := b.Mass.Out[h]
	from := max(b.Mass.From, 0)
	ld := w.ld
	for t := max(0, from-q0); t < w.nq; t++ {
		wt := float32(1) // ×1 leaves every unweighted sum bit for bit as it was
		if b.Mass.Weights != nil {
			wt = b.Mass.Weights[q0+t-from]
		}
		// Only the panels the query sees: the others' weights are 0.
		for pi := w.r0[t]; pi < w.r1[t]; pi++ {
			if w.vis[t*len(w.panels)+pi] == visNone {
				continue
			}
			p := &w.panels[pi]
			c0 := (pi - w.p0) * L
			o := out[p.k0 : p.k0+p.n]
			// The query heads' weights of the panel, aggregated lane by
			// lane over g in order: per slot the same operations as a sum
			// over g slot by slot, bit for bit.
			var acc [L]float32
			agg := acc[:len(o)]
			for g := 0; g < G; g++ {
				r := t*G + g
				if w.l[r] == 0 {
					continue
				}
				row := w.s[r*ld+c0 : r*ld+c0+len(o)]
				if b.Mass.Agg == AggMax {
					for j, pj := range row {
						agg[j] = max(agg[j], pj)
					}
				} else {
					for j, pj := range row {
						agg[j] += pj
					}
				}
			}
			if b.Mass.Agg == AggMean {
				for j := range agg {
					agg[j] /= float32(G)
				}
			}
			for j, a := range agg {
				o[j] += wt * a
			}
		}
	}
}

// scaleByMag multiplies the panel's columns of every row of col (rows ld
// apart) by each slot's magnitude, mag(segment)[slot], or 1 for segments
// without magnitudes (MiniCache's merged layers, see kvcache.Segment).
func (w *tile) scaleByMag(p *panel, col []float32, ld int, mag func(*kvcache.Segment) []float32) {
	for j := range w.mag {
		w.mag[j] = 1
	}
	w.walk(p, func(j int, s *kvcache.Segment, i int) {
		if m := mag(s); m != nil {
			w.mag[j] = m[i]
		}
	})
	for r := 0; r < w.rows; r++ {
		c := col[r*ld : r*ld+p.n]
		for j := range c {
			c[j] *= w.mag[j]
		}
	}
}
