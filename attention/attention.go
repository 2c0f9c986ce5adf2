// Package attention computes scaled dot-product attention of queries
// against the keys and values of a paged KV cache, reading every storage
// codec directly (no dequantized copy of the cache).
//
// Work is split over KV heads and tiles of 16 queries. Each query runs, by
// default, a two-pass softmax over its visible slots in llama2.c's order (on
// a CPU the per-worker score buffer is cheap, and prefill then equals decode
// bit for bit); Batch.Online selects a tiled kernel instead, where each
// cache block is a tile of keys and a running maximum, sum and output per
// query head are updated once per tile (online softmax). Decode attention of
// a long cache is split along the keys into chunks computed in parallel,
// each an online softmax giving a partial output and its log-sum-exp, merged
// afterwards (FlashDecoding). On request both hand
// back the attention mass each stored token received, summed over chosen
// queries and aggregated over the query heads that share a KV head — the
// scores the eviction policies need. A segment may carry per-slot
// magnitudes (MiniCache's merged layers store unit directions shared by two
// layers and each layer's norms): scores are then multiplied by KMag[i] and
// value weights by VMag[i]; segments without them take the plain path.
package attention

import (
	"math"

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

	Q   []float32 // [n][Heads·G·HeadDim] queries; group h at offset h·G·HeadDim
	Out []float32 // [n][Heads·G·HeadDim] outputs, same layout
	Pos []int32   // [n] positions; a query sees slots at positions ≤ its own
	// Window, if positive, also hides slots at positions ≤ the query's − Window
	// (sliding-window attention, as Mistral's).
	Window int32

	Segs func(head int) []kvcache.Segment // the stored tokens of each KV head
	Mass *MassRequest                     // nil: no mass wanted

	// Online selects, for batches of several queries, the tiled kernel
	// with an online softmax (a running maximum and sum per query head,
	// updated once per block). By default each query runs the two-pass
	// kernel decode uses, which keeps prefill and decode bit-identical.
	Online bool

	// SplitMin is the number of slots above which a single query's keys
	// are split into parallel chunks (0: DefaultSplitMin); SplitChunk the
	// slots per chunk (0: DefaultSplitChunk). Negative SplitMin: never split.
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
	work   [][]float32
}

// item is one unit of parallel work: (head, query tile) or (head, chunk of
// segments) for a split decode.
type item struct {
	head       int
	q0, q1     int // queries [q0, q1)
	s0, s1     int // segments [s0, s1)
	slot0      int // slots before segment s0 (for mass offsets)
	state      int // index of the first partial state (split decode)
	splitIndex int // chunk number within a split head
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
		// Query tiles of up to 16 tokens per item.
		const tile = 16
		for q0 := 0; q0 < n; q0 += tile {
			sc.items = append(sc.items, item{head: h, q0: q0, q1: min(q0+tile, n), s0: 0, s1: len(segs), state: -1})
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
	workers := tensor.Threads
	if len(sc.work) < workers {
		sc.work = make([][]float32, workers)
	}
	tensor.Parallel(len(sc.items), 1, func(lo, hi int) {
		var buf []float32
		for i := lo; i < hi; i++ {
			if it := &sc.items[i]; it.state < 0 && !b.Online {
				for t := it.q0; t < it.q1; t++ {
					buf = b.runExact(it.head, t, buf)
				}
			} else {
				buf = b.runItem(it, sc, buf)
			}
		}
	})
	if nstates > 0 {
		b.merge(sc)
	}
	if b.Mass != nil {
		tensor.Parallel(b.Heads, 1, func(lo, hi int) {
			var buf []float32
			for h := lo; h < hi; h++ {
				buf = b.mass(h, buf)
			}
		})
	}
}

// runItem computes one item with online softmax, tile = segment. Split
// items leave their partial state in sc.states; others write Out.
func (b *Batch) runItem(it *item, sc *Scratch, buf []float32) []float32 {
	hd, G := b.HeadDim, b.G
	stride := b.Heads * G * hd
	segs := b.Segs(it.head)[it.s0:it.s1]
	maxN := 0
	for _, s := range segs {
		maxN = max(maxN, s.N)
	}
	need := G*maxN + G*hd + 2*G
	if cap(buf) < need {
		buf = make([]float32, need)
	}
	buf = buf[:need]
	scores := buf[:G*maxN]
	for t := it.q0; t < it.q1; t++ {
		p := b.Pos[t]
		qt := b.Q[t*stride+it.head*G*hd : t*stride+(it.head+1)*G*hd]
		var o []float32
		var ms, ls []float32
		if it.state >= 0 {
			for j := 0; j < G; j++ {
				st := &sc.states[it.state+j]
				st.m, st.l = float32(math.Inf(-1)), 0
				clear(st.o)
			}
		} else {
			o = b.Out[t*stride+it.head*G*hd : t*stride+(it.head+1)*G*hd]
			clear(o)
			ms = buf[G*maxN+G*hd : G*maxN+G*hd+G]
			ls = buf[G*maxN+G*hd+G : G*maxN+G*hd+2*G]
			for j := range ms {
				ms[j], ls[j] = float32(math.Inf(-1)), 0
			}
		}
		for _, s := range segs {
			// The tile's scores; slots after the query's position are masked.
			for j := 0; j < G; j++ {
				qj := qt[j*hd : (j+1)*hd]
				var m *float32
				var l *float32
				var oj []float32
				if it.state >= 0 {
					st := &sc.states[it.state+j]
					m, l, oj = &st.m, &st.l, st.o
				} else {
					m, l, oj = &ms[j], &ls[j], o[j*hd:(j+1)*hd]
				}
				sj := scores[j*maxN : j*maxN+s.N]
				codec.DotAll(s.KC, s.K, s.Cap, hd, qj, sj)
				if s.KMag != nil {
					scaleBy(sj, s.KMag)
				}
				tmax := float32(math.Inf(-1))
				for i := 0; i < s.N; i++ {
					if b.hide(s.Pos[i], p) {
						continue
					}
					v := sj[i] / b.Norm
					sj[i] = v
					if v > tmax {
						tmax = v
					}
				}
				if tmax == float32(math.Inf(-1)) {
					continue // no visible slot in this tile
				}
				mNew := *m
				if tmax > mNew {
					mNew = tmax
				}
				if mNew != *m && *l != 0 {
					f := float32(math.Exp(float64(*m - mNew)))
					*l *= f
					for c := range oj {
						oj[c] *= f
					}
				}
				*m = mNew
				if s.VMag != nil {
					for i := 0; i < s.N; i++ {
						if b.hide(s.Pos[i], p) {
							continue
						}
						e := float32(math.Exp(float64(sj[i] - mNew)))
						*l += e
						s.VC.Axpy(s.V, s.Cap, hd, i, e*s.VMag[i], oj)
					}
					continue
				}
				for i := 0; i < s.N; i++ {
					if b.hide(s.Pos[i], p) {
						continue
					}
					e := float32(math.Exp(float64(sj[i] - mNew)))
					*l += e
					s.VC.Axpy(s.V, s.Cap, hd, i, e, oj)
				}
			}
		}
		if it.state < 0 {
			for j := 0; j < G; j++ {
				if ls[j] == 0 {
					continue
				}
				oj := o[j*hd : (j+1)*hd]
				for c := range oj {
					oj[c] /= ls[j]
				}
			}
		}
	}
	return buf
}

// runExact is the attention of query t over all of a head's visible slots
// in two passes, in llama2.c's order: every score, their maximum, the
// exponentials and their sum, each weight divided by the sum, then the
// weighted sum of values. Prefill and decode share it, so a prompt run as a
// matrix and token by token give the same numbers.
func (b *Batch) runExact(h, t int, buf []float32) []float32 {
	hd, G := b.HeadDim, b.G
	stride := b.Heads * G * hd
	segs := b.Segs(h)
	slots := 0
	for _, s := range segs {
		slots += s.N
	}
	if cap(buf) < slots {
		buf = make([]float32, slots)
	}
	sc := buf[:slots]
	p := b.Pos[t]
	for j := 0; j < G; j++ {
		qj := b.Q[t*stride+(h*G+j)*hd : t*stride+(h*G+j+1)*hd]
		oj := b.Out[t*stride+(h*G+j)*hd : t*stride+(h*G+j+1)*hd]
		clear(oj)
		k := 0
		mx := float32(math.Inf(-1))
		for _, s := range segs {
			if b.hidden(s, p) {
				// A block wholly after the query (later prompt tokens of a
				// prefill chunk): no need to score it.
				for i := range sc[k : k+s.N] {
					sc[k+i] = float32(math.Inf(-1))
				}
				k += s.N
				continue
			}
			codec.DotAll(s.KC, s.K, s.Cap, hd, qj, sc[k:k+s.N])
			if s.KMag != nil {
				scaleBy(sc[k:k+s.N], s.KMag)
			}
			for i := 0; i < s.N; i++ {
				if b.hide(s.Pos[i], p) {
					sc[k+i] = float32(math.Inf(-1))
					continue
				}
				sc[k+i] /= b.Norm
				mx = max(mx, sc[k+i])
			}
			k += s.N
		}
		if mx == float32(math.Inf(-1)) {
			continue
		}
		var sum float32
		for i, v := range sc {
			e := float32(math.Exp(float64(v - mx)))
			sc[i] = e
			sum += e
		}
		for i := range sc {
			sc[i] /= sum
		}
		k = 0
		for _, s := range segs {
			if s.VMag != nil {
				for i := 0; i < s.N; i++ {
					if a := sc[k+i]; a != 0 {
						s.VC.Axpy(s.V, s.Cap, hd, i, a*s.VMag[i], oj)
					}
				}
				k += s.N
				continue
			}
			for i := 0; i < s.N; i++ {
				if a := sc[k+i]; a != 0 {
					s.VC.Axpy(s.V, s.Cap, hd, i, a, oj)
				}
			}
			k += s.N
		}
	}
	return buf
}

// hide reports whether a query at position p must not see a slot at
// position q: q is later, or outside the sliding window.
func (b *Batch) hide(q, p int32) bool {
	return q > p || (b.Window > 0 && q <= p-b.Window)
}

// hidden reports whether every slot of s is hidden from position p.
func (b *Batch) hidden(s kvcache.Segment, p int32) bool {
	for _, q := range s.Pos[:s.N] {
		if !b.hide(q, p) {
			return false
		}
	}
	return true
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
// recomputes the scores with the final softmax normalisers.
func (b *Batch) mass(h int, buf []float32) []float32 {
	hd, G := b.HeadDim, b.G
	stride := b.Heads * G * hd
	segs := b.Segs(h)
	slots := 0
	for _, s := range segs {
		slots += s.N
	}
	need := G * (slots + 2)
	if cap(buf) < need {
		buf = make([]float32, need)
	}
	buf = buf[:need]
	out := b.Mass.Out[h]
	from := max(b.Mass.From, 0)
	for t := from; t < len(b.Pos); t++ {
		p := b.Pos[t]
		wt := float32(1) // ×1 leaves every unweighted sum bit for bit as it was
		if b.Mass.Weights != nil {
			wt = b.Mass.Weights[t-from]
		}
		qt := b.Q[t*stride+h*G*hd : t*stride+(h+1)*G*hd]
		sc := buf[:G*slots]
		ms := buf[G*slots : G*slots+G]
		ls := buf[G*slots+G : G*slots+2*G]
		for j := 0; j < G; j++ {
			qj := qt[j*hd : (j+1)*hd]
			m := float32(math.Inf(-1))
			k := 0
			for _, s := range segs {
				for i := 0; i < s.N; i++ {
					v := float32(math.Inf(-1))
					if !b.hide(s.Pos[i], p) {
						d := s.KC.Dot(s.K, s.Cap, hd, i, qj)
						if s.KMag != nil {
							d *= s.KMag[i]
						}
						v = d / b.Norm
					}
					sc[j*slots+k] = v
					if v > m {
						m = v
					}
					k++
				}
			}
			var l float32
			for k := 0; k < slots; k++ {
				if v := sc[j*slots+k]; v > float32(math.Inf(-1)) {
					e := float32(math.Exp(float64(v - m)))
					sc[j*slots+k] = e
					l += e
				} else {
					sc[j*slots+k] = 0
				}
			}
			ms[j], ls[j] = m, l
		}
		for k := 0; k < slots; k++ {
			var agg float32
			for j := 0; j < G; j++ {
				if ls[j] == 0 {
					continue
				}
				pj := sc[j*slots+k] / ls[j]
				switch b.Mass.Agg {
				case AggMax:
					agg = max(agg, pj)
				default:
					agg += pj
				}
			}
			if b.Mass.Agg == AggMean {
				agg /= float32(G)
			}
			out[k] += wt * agg
		}
	}
	return buf
}

// scaleBy multiplies each score by its slot's key magnitude (a segment
// whose keys are stored as unit directions, see kvcache.Segment.KMag).
func scaleBy(sc, mag []float32) {
	mag = mag[:len(sc)]
	for i := range sc {
		sc[i] *= mag[i]
	}
}
