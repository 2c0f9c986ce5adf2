// Package sample turns a vector of next-token logits into a token id.
//
// # Pipeline
//
// [Sampler.Sample] applies, in this order:
//
//  1. repetition penalty (llama.cpp convention) over the distinct tokens in
//     the last RepeatLastN entries of history;
//  2. greedy argmax when Temperature == 0 (lowest id wins ties; top-k, top-p
//     and min-p cannot change the argmax, so they are skipped);
//  3. division of every logit by Temperature;
//  4. top-k: all but the k largest logits are set to -Inf (ties at the
//     boundary are broken towards the lowest id, so exactly k survive);
//  5. softmax over the whole vocabulary (float32, max subtracted, as
//     llama2.c), masked tokens get probability 0;
//  6. one coin = random_f32() is drawn from the xorshift64* generator;
//  7. top-p (nucleus), exactly llama2.c's sample_topp: candidates with
//     p >= (1-top_p)/(n-1) are sorted by descending probability (ties by
//     ascending id) and the shortest prefix whose float32 running sum exceeds
//     top_p is kept (all candidates if rounding never exceeds it);
//  8. min-p: candidates with p < MinP*p_max are dropped;
//  9. renormalise and draw: r = coin*sum(kept p), walk the cumulative
//     distribution of the kept candidates (in sorted order after top-p,
//     in id order otherwise) and return the first with r < cdf, or the last
//     kept candidate on rounding.
//
// When neither top-p nor min-p is active nothing is truncated after the
// softmax, so step 9 is llama2.c's sample_mult: the coin is compared against
// the unscaled cumulative distribution in id order.
//
// # Compatibility with llama2.c run.c
//
// With only Temperature, TopP and Seed set, Sample returns the same token as
// run.c's sample() for the same logits and the same seed, step after step:
// same RNG, same float32 arithmetic in the same order. Known differences are
// limited to cases where run.c is undefined or practically unreachable:
//   - run.c's expf (glibc) and float32(math.Exp) may differ by one ulp in
//     rare cases; a draw only changes if the coin lands on that ulp;
//   - run.c built with -Ofast (make runfast) reorders float sums and may
//     differ; the reference is the -O3 build (make run);
//   - run.c's sample_topp reads out of bounds when no probability reaches the
//     cutoff (possible only if top_p < 1/n) or when n == 1; here the argmax
//     is kept instead;
//   - on rounding fall-through sample_mult returns n-1 even if its
//     probability is 0; here the last token with a non-zero probability is
//     returned;
//   - run.c seeds 0 with time(NULL); here Seed 0 means DefaultSeed (callers
//     that want a fresh seed per run use RandomSeed).
//
// # Non-finite and empty input
//
// NaN logits are treated as -Inf (never chosen). If any logit is +Inf after
// penalty and temperature, the choice is uniform among the +Inf tokens
// (greedy: the lowest such id). A temperature so small that dividing would
// overflow the largest finite logit to +Inf divides (logit - max) instead. If the logits are empty or every logit is
// NaN or -Inf, Sample returns NoToken (-1) and draws no random number.
package sample

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// NoToken is returned by Sample when no token can be chosen: empty logits,
// or every logit NaN or -Inf.
const NoToken = -1

// DefaultRepeatLastN is the penalty window used when RepeatLastN is 0.
const DefaultRepeatLastN = 64

// DefaultSeed replaces a zero Seed (xorshift would stay at 0 forever).
const DefaultSeed uint64 = 0x9E3779B97F4A7C15

// RandomSeed returns a non-zero seed from the system's random source, for a
// run that was given no seed: printed with the output, it reproduces the run.
func RandomSeed() uint64 {
	var b [8]byte
	for {
		crand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
		// Keep it below 2^53 so that it survives a round trip through a
		// JSON number read as a float64.
		if s := binary.LittleEndian.Uint64(b[:]) >> 11; s != 0 {
			return s
		}
	}
}

// Params configures a Sampler. The zero value is greedy decoding.
type Params struct {
	Temperature   float32 // 0 = greedy (argmax, lowest id wins ties)
	TopK          int     // 0 = off
	TopP          float32 // 0 or >= 1 = off
	MinP          float32 // 0 = off: drop tokens with p < MinP * p_max
	RepeatPenalty float32 // 0 or 1 = off; > 1 discourages repetition
	RepeatLastN   int     // penalty window; 0 = DefaultRepeatLastN, -1 = whole history
	Seed          uint64  // xorshift64* state; 0 = DefaultSeed
}

func finite(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// Validate reports the first invalid field, if any.
func (p Params) Validate() error {
	switch {
	case !finite(p.Temperature) || p.Temperature < 0:
		return fmt.Errorf("sample: temperature must be a finite number >= 0 (0 = greedy), got %v", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("sample: top_k must be >= 0 (0 = off), got %d", p.TopK)
	case math.IsNaN(float64(p.TopP)) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("sample: top_p must be in [0, 1] (0 or 1 = off), got %v", p.TopP)
	case math.IsNaN(float64(p.MinP)) || p.MinP < 0 || p.MinP > 1:
		return fmt.Errorf("sample: min_p must be in [0, 1] (0 = off), got %v", p.MinP)
	case !finite(p.RepeatPenalty) || p.RepeatPenalty < 0:
		return fmt.Errorf("sample: repeat_penalty must be a finite number > 0 (0 or 1 = off), got %v", p.RepeatPenalty)
	case p.RepeatLastN < -1:
		return fmt.Errorf("sample: repeat_last_n must be >= -1 (0 = %d, -1 = whole history), got %d", DefaultRepeatLastN, p.RepeatLastN)
	}
	return nil
}

type probIndex struct {
	prob  float32
	index int32
}

// Sampler draws tokens. It keeps the RNG state and reusable scratch
// buffers, so it is not safe for concurrent use; use one per sequence.
type Sampler struct {
	p       Params
	penalty bool
	lastN   int // -1 = whole history
	rng     uint64

	buf   []float32
	cand  []probIndex
	heap  []int32
	stamp []uint32
	gen   uint32
}

// New validates p and returns a Sampler seeded with p.Seed.
func New(p Params) (*Sampler, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	s := &Sampler{p: p, rng: p.Seed}
	if s.rng == 0 {
		s.rng = DefaultSeed
	}
	s.penalty = p.RepeatPenalty != 0 && p.RepeatPenalty != 1
	s.lastN = p.RepeatLastN
	if s.lastN == 0 {
		s.lastN = DefaultRepeatLastN
	}
	return s, nil
}

// Params returns the parameters the Sampler was built with.
func (s *Sampler) Params() Params { return s.p }

// randU32 is llama2.c's random_u32: xorshift64*, upper 32 bits.
func (s *Sampler) randU32() uint32 {
	x := s.rng
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	s.rng = x
	return uint32((x * 0x2545F4914F6CDD1D) >> 32)
}

// randF32 is llama2.c's random_f32: a float32 in [0, 1) with 24 random bits.
func (s *Sampler) randF32() float32 {
	return float32(s.randU32()>>8) / 16777216
}

// Sample returns the next token id for logits (one entry per vocabulary
// id). history holds the previous token ids, oldest first; it is only read
// by the repetition penalty (ids outside [0, len(logits)) are ignored).
// Neither slice is modified. Returns NoToken for empty or all-NaN/-Inf
// logits. Steady-state calls with the same vocabulary size do not allocate.
func (s *Sampler) Sample(logits []float32, history []int) int {
	n := len(logits)
	if n == 0 {
		return NoToken
	}
	x := s.load(logits)
	if s.penalty {
		s.applyPenalty(x, history)
	}
	if s.p.Temperature == 0 {
		return argmax(x)
	}
	if t := s.p.Temperature; t != 1 { // x/1 == x, run.c's division by 1 is a no-op
		scale(x, t)
	}
	if k := s.p.TopK; k > 0 && k < n {
		s.topK(x, k)
	}
	if !softmax(x) {
		return NoToken
	}
	coin := s.randF32()

	topP := s.p.TopP > 0 && s.p.TopP < 1
	if !topP && s.p.MinP == 0 {
		return sampleMult(x, coin)
	}
	if n == 1 {
		return 0
	}

	cand := s.cand[:0]
	if topP {
		cand = nucleus(cand, x, s.p.TopP)
	} else {
		for i, p := range x {
			if p > 0 {
				cand = append(cand, probIndex{p, int32(i)})
			}
		}
	}
	if s.p.MinP > 0 {
		cand = minP(cand, s.p.MinP, topP)
	}
	s.cand = cand[:0]

	// renormalise and draw
	var total float32
	for _, c := range cand {
		total += c.prob
	}
	r := coin * total
	var cdf float32
	for _, c := range cand {
		cdf += c.prob
		if r < cdf {
			return int(c.index)
		}
	}
	return int(cand[len(cand)-1].index) // rounding
}

// load copies logits into the scratch buffer, NaN -> -Inf.
func (s *Sampler) load(logits []float32) []float32 {
	n := len(logits)
	if cap(s.buf) < n {
		s.buf = make([]float32, n)
		s.cand = make([]probIndex, 0, n)
	}
	x := s.buf[:n]
	negInf := float32(math.Inf(-1))
	for i, v := range logits {
		if v != v {
			v = negInf
		}
		x[i] = v
	}
	return x
}

// applyPenalty divides positive and multiplies non-positive logits by the
// penalty, once per distinct token in the window.
func (s *Sampler) applyPenalty(x []float32, history []int) {
	n := len(x)
	if len(s.stamp) < n {
		s.stamp = make([]uint32, n)
	}
	s.gen++
	if s.gen == 0 {
		clear(s.stamp)
		s.gen = 1
	}
	h := history
	if s.lastN >= 0 && len(h) > s.lastN {
		h = h[len(h)-s.lastN:]
	}
	pen := s.p.RepeatPenalty
	for _, t := range h {
		if t < 0 || t >= n || s.stamp[t] == s.gen {
			continue
		}
		s.stamp[t] = s.gen
		if x[t] > 0 {
			x[t] /= pen
		} else {
			x[t] *= pen
		}
	}
}

// argmax returns the first index of the maximum (NaN already mapped to
// -Inf), or NoToken if every value is -Inf.
func argmax(x []float32) int {
	best, bv := 0, x[0]
	for i := 1; i < len(x); i++ {
		if x[i] > bv {
			best, bv = i, x[i]
		}
	}
	if math.IsInf(float64(bv), -1) {
		return NoToken
	}
	return best
}

// scale divides x by t as run.c does. If that would overflow the largest
// finite logit to +Inf (tiny t), the max is subtracted first so that the
// ranking survives.
func scale(x []float32, t float32) {
	if t < 1 {
		mx := x[0]
		for _, v := range x[1:] {
			mx = max(mx, v)
		}
		if !math.IsInf(float64(mx), 0) && math.IsInf(float64(mx/t), 1) {
			for i, v := range x {
				x[i] = (v - mx) / t
			}
			return
		}
	}
	for i := range x {
		x[i] /= t
	}
}

// topK sets every logit outside the k best (value desc, id asc) to -Inf.
// It keeps a min-heap of the k best ids, the root being the worst kept.
func (s *Sampler) topK(x []float32, k int) {
	// worse reports whether id a ranks below id b.
	worse := func(a, b int32) bool {
		return x[a] < x[b] || (x[a] == x[b] && a > b)
	}
	if cap(s.heap) < k {
		s.heap = make([]int32, 0, k)
	}
	h := s.heap[:0]
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= len(h) {
				return
			}
			m := l
			if r := l + 1; r < len(h) && worse(h[r], h[l]) {
				m = r
			}
			if !worse(h[m], h[i]) {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for i := range int32(len(x)) {
		if len(h) < k {
			h = append(h, i)
			for j := len(h) - 1; j > 0; {
				p := (j - 1) / 2
				if !worse(h[j], h[p]) {
					break
				}
				h[j], h[p] = h[p], h[j]
				j = p
			}
		} else if worse(h[0], i) {
			h[0] = i
			down(0)
		}
	}
	root := h[0]
	negInf := float32(math.Inf(-1))
	for i := range int32(len(x)) {
		if worse(i, root) {
			x[i] = negInf
		}
	}
	s.heap = h[:0]
}

// softmax is llama2.c's softmax (float32, max subtracted, sequential sum),
// extended to non-finite input: false if every value is -Inf, uniform over
// the +Inf entries if any.
func softmax(x []float32) bool {
	mx := x[0]
	for _, v := range x[1:] {
		if v > mx {
			mx = v
		}
	}
	switch {
	case math.IsInf(float64(mx), -1):
		return false
	case math.IsInf(float64(mx), 1):
		for i, v := range x {
			if v == mx {
				x[i] = 1
			} else {
				x[i] = 0
			}
		}
	default:
		for i, v := range x {
			x[i] = float32(math.Exp(float64(v - mx)))
		}
	}
	var sum float32
	for _, v := range x {
		sum += v
	}
	for i := range x {
		x[i] /= sum
	}
	return true
}

// sampleMult is llama2.c's sample_mult. On rounding fall-through it returns
// the last token with non-zero probability (run.c: n-1).
func sampleMult(p []float32, coin float32) int {
	var cdf float32
	for i, v := range p {
		cdf += v
		if coin < cdf {
			return i
		}
	}
	for i := len(p) - 1; i > 0; i-- {
		if p[i] > 0 {
			return i
		}
	}
	return 0
}

func byProbDesc(a, b probIndex) int {
	switch {
	case a.prob > b.prob:
		return -1
	case a.prob < b.prob:
		return 1
	}
	return int(a.index - b.index)
}

// nucleus is the truncation part of llama2.c's sample_topp; it appends the
// kept candidates to cand in descending probability order. Equal
// probabilities are ordered by ascending id, as glibc's (merge sort) qsort
// leaves them.
func nucleus(cand []probIndex, p []float32, topp float32) []probIndex {
	cutoff := (1 - topp) / float32(len(p)-1)
	for i, v := range p {
		if v >= cutoff {
			cand = append(cand, probIndex{v, int32(i)})
		}
	}
	if len(cand) == 0 { // run.c: undefined; the argmax is always in the nucleus
		i := argmax(p)
		return append(cand, probIndex{p[i], int32(i)})
	}
	slices.SortFunc(cand, byProbDesc)
	var cum float32
	for i := range cand {
		cum += cand[i].prob
		if cum > topp {
			return cand[:i+1]
		}
	}
	return cand
}

// minP drops candidates with p < minp*p_max, keeping their order. sorted
// says cand is in descending order (p_max first).
func minP(cand []probIndex, minp float32, sorted bool) []probIndex {
	var pmax float32
	if sorted {
		pmax = cand[0].prob
	} else {
		for _, c := range cand {
			pmax = max(pmax, c.prob)
		}
	}
	thr := minp * pmax
	out := cand[:0]
	for _, c := range cand {
		if c.prob >= thr {
			out = append(out, c)
		}
	}
	return out
}
