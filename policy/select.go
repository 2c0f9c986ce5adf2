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
