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
	if gone, ok := Dropped(n, budget, sinks, window, score); ok {
		mid = slices.DeleteFunc(mid, func(i int) bool { _, found := slices.BinarySearch(gone, i); return found })
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
// (Dropped, O(drop·n)) rather than by sorting them (O(n log n)): a decode
// step's prune, one token over the budget, removes one.
const fewDrops = 8

// Dropped is what Keep(n, budget, sinks, window, score) drops when that is
// at most fewDrops slots: the slot indexes, ascending, found without
// building the kept list (a decode step's prune drops one of a thousand,
// and the cache drops it in O(1) blocks: kvcache.Paged.Drop). Each pass
// drops the candidate keepBest's sort would put last: the lowest key, and
// of equal keys the latest slot. ok is false when Keep drops more (the
// caller prunes by Keep); none, with ok, when n ≤ budget.
func Dropped(n, budget, sinks, window int, score []float32) (gone []int, ok bool) {
	drop := n - budget
	if drop <= 0 {
		return nil, true
	}
	if drop > fewDrops {
		return nil, false
	}
	sinks = min(sinks, budget)
	window = min(window, budget-sinks)
	gone = make([]int, 0, drop)
	for range drop {
		worst := -1
		for j := sinks; j < n-window; j++ {
			if worst >= 0 && key(score, j) > key(score, worst) || slices.Contains(gone, j) {
				continue
			}
			worst = j
		}
		gone = append(gone, worst)
	}
	slices.Sort(gone)
	return gone, true
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
