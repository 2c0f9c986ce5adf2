package policy

import (
	"math"
	"slices"
)

// Keep is the one prune's selection: of n slots in original order, keep
// the first sinks, the last window, and the budget−sinks−window
// best-scored slots of the rest; where scores tie at the boundary the
// earlier slot wins. It returns the kept slot indexes in ascending order
// (all of them when n ≤ budget).
func Keep(n, budget, sinks, window int, score []float32) []int {
	if n <= budget {
		keep := make([]int, n)
		for i := range keep {
			keep[i] = i
		}
		return keep
	}
	sinks = min(sinks, budget)
	window = min(window, budget-sinks)
	mid := make([]int, 0, n-sinks-window)
	for i := sinks; i < n-window; i++ {
		mid = append(mid, i)
	}
	rest := budget - sinks - window
	if rest < len(mid) {
		slices.SortStableFunc(mid, func(a, b int) int {
			sa, sb := key(score, a), key(score, b)
			switch {
			case sa > sb:
				return -1
			case sa < sb:
				return 1
			}
			return a - b // ties: the earlier position wins
		})
		mid = mid[:rest]
		slices.Sort(mid)
	}
	keep := make([]int, 0, budget)
	for i := 0; i < sinks; i++ {
		keep = append(keep, i)
	}
	keep = append(keep, mid...)
	for i := n - window; i < n; i++ {
		keep = append(keep, i)
	}
	return keep
}

// key orders scores; NaN sorts last.
func key(score []float32, i int) float32 {
	if i >= len(score) {
		return 0
	}
	v := score[i]
	if v != v {
		return float32(math.Inf(-1))
	}
	return v
}

// pool1d smooths x with a 1-D pooling of the given odd kernel, stride 1,
// padding kernel/2: "avg" divides by the kernel (zero padding counted, as
// PyTorch's avg_pool1d), "max" ignores the padding.
func pool1d(x []float32, kernel int, kind string) []float32 {
	out := make([]float32, len(x))
	r := kernel / 2
	for i := range x {
		if kind == "max" {
			m := float32(math.Inf(-1))
			for j := max(0, i-r); j <= min(len(x)-1, i+r); j++ {
				m = max(m, x[j])
			}
			out[i] = m
			continue
		}
		var s float32
		for j := max(0, i-r); j <= min(len(x)-1, i+r); j++ {
			s += x[j]
		}
		out[i] = s / float32(kernel)
	}
	return out
}

// pyramidBudgets is PyramidKV's per-layer allocation: with average budget
// B, window W, T prompt tokens and L layers, budgets fall linearly from the
// first layer to the last, averaging B.
func pyramidBudgets(B, W, T, L int, beta float64) []int {
	out := make([]int, L)
	if L == 1 {
		out[0] = B
		return out
	}
	minB := float64(B-W) / beta
	maxB := 2*float64(B-W) - minB
	if maxB >= float64(T-W) {
		maxB = float64(T - W)
		minB = 2*float64(B-W) - maxB
	}
	for l := range out {
		out[l] = int(maxB-float64(l)*(maxB-minB)/float64(L-1)) + W
	}
	return out
}

// adaBudgets is Ada-KV's head-adaptive split of a layer's budget: of the
// heads' scores over their candidate slots, the global top H·(B−W) are
// counted per head, and head h keeps round(count·(1−α) + α·(B−W)).
func adaBudgets(scores [][]float32, perHead int, alpha float64) []int {
	type cand struct {
		s    float32
		h, i int
	}
	var all []cand
	for h, sc := range scores {
		for i, v := range sc {
			all = append(all, cand{v, h, i})
		}
	}
	slices.SortStableFunc(all, func(a, b cand) int {
		switch {
		case a.s > b.s:
			return -1
		case a.s < b.s:
			return 1
		case a.h != b.h:
			return a.h - b.h
		}
		return a.i - b.i
	})
	count := make([]int, len(scores))
	for _, c := range all[:min(len(all), perHead*len(scores))] {
		count[c.h]++
	}
	out := make([]int, len(scores))
	for h := range out {
		out[h] = int(math.Round(float64(count[h])*(1-alpha) + alpha*float64(perHead)))
	}
	return out
}
