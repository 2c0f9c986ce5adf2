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
	if drop := len(mid) - rest; drop > 0 && drop <= fewDrops {
		mid = dropLowest(mid, drop, score)
	} else if rest < len(mid) {
		mid = keepBest(mid, rest, score)
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

// keepBest keeps the rest best-scored of mid (slot indexes, ascending),
// by a stable sort: higher keys first, of equal keys the earlier slot. It
// returns them in ascending order.
func keepBest(mid []int, rest int, score []float32) []int {
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
	return mid
}

// fewDrops is the most slots Keep removes by passes over the candidates
// (dropLowest, O(drop·n)) rather than by sorting them (O(n log n)): a
// decode step's prune, one token over the budget, removes one.
const fewDrops = 8

// dropLowest removes from mid (slot indexes, ascending) the drop slots
// keepBest's sort would put last: the lowest key, and of equal keys the
// latest slot, one pass each. What is left is the set the sort keeps, in
// ascending order.
func dropLowest(mid []int, drop int, score []float32) []int {
	for range drop {
		worst := 0
		for j := 1; j < len(mid); j++ {
			if key(score, mid[j]) <= key(score, mid[worst]) {
				worst = j
			}
		}
		mid = slices.Delete(mid, worst, worst+1)
	}
	return mid
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
