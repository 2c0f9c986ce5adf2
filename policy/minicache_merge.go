package policy

// MiniCache's merge (Liu et al., arXiv 2405.14366): the keys and values of
// two adjacent layers are merged token by token. Each vector x is split
// into its norm ‖x‖ and its direction x/‖x‖; the directions of the lower
// layer (l−1) and the upper layer (l) are interpolated on the sphere
// (SLERP),
//
//	Ω = arccos(û_{l−1}·û_l),  e = sin((1−t)Ω)/sinΩ · û_{l−1} + sin(tΩ)/sinΩ · û_l
//
// renormalised (a plain LERP when sinΩ ≈ 0), and restored per layer as
// x̂ = ‖x‖·e. The tokens whose layers disagree most (largest Ω/π) are
// retained unmerged in both layers.
//
// This file is the method's logic: which tokens, their directions and
// norms, which are retained. The cache stores the result
// (kvcache.Merging: shared direction blocks, per-layer norms, retained
// blocks; see kvcache/minicache.go).

import (
	"fmt"
	"math"
	"slices"

	"github.com/kvlm/kvlm/kvcache"
)

// MergeOptions are MiniCache's parameters.
type MergeOptions struct {
	// T is the SLERP weight of the upper layer, in [0, 1] (MiniCache: 0.6).
	T float64
	// Gamma is the share of the candidate tokens retained unmerged in both
	// layers: the ⌈γ·n⌉ whose key or value directions differ most between
	// the layers (largest Ω/π of the two). One reference implementation
	// keeps 5%; the paper's exact retention rule is unverified. 0 merges
	// every candidate.
	Gamma float64
	// Recent leaves the newest tokens of each table unmerged; a cut inside
	// the blocks falls on a block boundary.
	Recent int
	// Full merges a multiple of the block size only (decode-time merges:
	// a partly filled last block stays as it is).
	Full bool
}

// MergeStats counts what a merge did, summed over KV heads.
type MergeStats struct {
	Merged   int // tokens merged (stored once for both layers)
	Retained int // tokens retained whole in both layers
}

// Slerp merges the vectors of one token in two adjacent layers as MiniCache
// does: it writes into out the unit direction e interpolated from the
// lower layer's direction (weight 1−t) to the upper's (weight t), and
// returns the angle Ω between them and both norms, computed in float64.
// When sinΩ < 1e-6 the directions are interpolated linearly (LERP) and
// renormalised; a zero vector has no direction, so e is the other layer's
// direction (and Ω is reported as 0: both restore exactly).
func Slerp(lower, upper []float32, t float64, out []float32) (omega, normLower, normUpper float64) {
	d := len(out)
	lower, upper = lower[:d], upper[:d]
	for i := range d {
		normLower += float64(lower[i]) * float64(lower[i])
		normUpper += float64(upper[i]) * float64(upper[i])
	}
	normLower, normUpper = math.Sqrt(normLower), math.Sqrt(normUpper)
	var wl, wu float64 // weights of the unit vectors
	switch {
	case normLower == 0 && normUpper == 0:
		clear(out)
		return 0, 0, 0
	case normLower == 0:
		wu = 1
	case normUpper == 0:
		wl = 1
	default:
		var c float64
		for i := range d {
			c += float64(lower[i]) / normLower * (float64(upper[i]) / normUpper)
		}
		omega = math.Acos(max(-1, min(1, c)))
		if s := math.Sin(omega); s < 1e-6 {
			wl, wu = 1-t, t
		} else {
			wl, wu = math.Sin((1-t)*omega)/s, math.Sin(t*omega)/s
		}
	}
	if normLower > 0 {
		wl /= normLower
	}
	if normUpper > 0 {
		wu /= normUpper
	}
	var n float64
	for i := range d {
		e := wl*float64(lower[i]) + wu*float64(upper[i])
		n += e * e
	}
	if n == 0 { // antipodal directions with t = 0.5: take the upper one
		wl, wu, n = 0, 1/normUpper, 1
	}
	n = math.Sqrt(n)
	for i := range d {
		out[i] = float32((wl*float64(lower[i]) + wu*float64(upper[i])) / n)
	}
	return omega, normLower, normUpper
}

// MergeLayers merges the tables of layers upper−1 and upper of c, for
// every KV head, MiniCache's way: the candidate tokens are the tables'
// oldest unmerged ones, all but the newest max(opt.Recent, KIVI residual
// R) (kvcache.Paged.MergeCandidates), and must hold the same positions in
// both layers. Of them the ⌈γ·n⌉ most distant stay whole in both layers;
// the others are replaced by one shared unit direction per token (keys
// and values, in the pool's codecs) plus each layer's norms
// (kvcache.Paged.StoreMerged: ErrNoBlocks when the pool cannot take the
// directions, with that head unchanged; heads merged before an error stay
// merged). A pair can be merged again later (the new tokens are
// appended); a layer belongs to one pair only.
func MergeLayers(c kvcache.Merging, upper int, opt MergeOptions) (MergeStats, error) {
	var st MergeStats
	switch {
	case !(opt.T >= 0 && opt.T <= 1):
		return st, fmt.Errorf("policy: SLERP weight t=%g must be in [0,1]", opt.T)
	case !(opt.Gamma >= 0 && opt.Gamma <= 1):
		return st, fmt.Errorf("policy: retention share γ=%g must be in [0,1]", opt.Gamma)
	}
	L := c.Layout()
	for h := 0; h < L.KVHeads; h++ {
		cand, err := c.MergeCandidates(upper, h, opt.Recent, opt.Full)
		if err != nil {
			return st, err
		}
		if cand.Len() == 0 {
			continue
		}
		plan := mergePlan(cand, L.HeadDim, opt)
		if err := c.StoreMerged(upper, h, cand, plan); err != nil {
			return st, err
		}
		st.Merged += len(plan.Merged)
		st.Retained += len(plan.Retained)
	}
	return st, nil
}

// mergePlan computes every candidate's directions, norms and distance, and
// retains the ⌈γ·n⌉ most distant (ties: the earlier).
func mergePlan(cand kvcache.MergeCandidates, d int, opt MergeOptions) kvcache.MergePlan {
	c := cand.Len()
	ka, va, kb, vb := cand.K[0], cand.V[0], cand.K[1], cand.V[1]
	ek, ev := make([]float32, c*d), make([]float32, c*d)
	nka, nkb := make([]float32, c), make([]float32, c)
	nva, nvb := make([]float32, c), make([]float32, c)
	dist := make([]float64, c)
	for i := 0; i < c; i++ {
		x := i * d
		wk, a, b := Slerp(ka[x:x+d], kb[x:x+d], opt.T, ek[x:x+d])
		nka[i], nkb[i] = float32(a), float32(b)
		wv, a, b := Slerp(va[x:x+d], vb[x:x+d], opt.T, ev[x:x+d])
		nva[i], nvb[i] = float32(a), float32(b)
		dist[i] = max(wk, wv) / math.Pi
	}
	keepN := min(c, int(math.Ceil(opt.Gamma*float64(c)-1e-9)))
	order := make([]int, c)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int {
		switch {
		case dist[x] > dist[y]:
			return -1
		case dist[x] < dist[y]:
			return 1
		}
		return x - y
	})
	retained := slices.Clone(order[:keepN])
	merged := slices.Clone(order[keepN:])
	slices.Sort(retained)
	slices.Sort(merged)
	return kvcache.MergePlan{Merged: merged, Retained: retained, KDir: ek, VDir: ev,
		KNorm: [2][]float32{nka, nkb}, VNorm: [2][]float32{nva, nvb}}
}
