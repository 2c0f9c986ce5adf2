package policy

import (
	"math"
	"slices"
)

// adakv is Ada-KV around snapkv: head-adaptive budgets, a share Alpha of
// each layer's budget spread evenly and the rest where the scores are.
type adakv struct{ snap }

func (adakv) Budgets(st *State, l, b, window int, scores [][]float32) []int {
	cand := make([][]float32, st.H)
	for h := range cand {
		n := st.cache.Slots(l, h)
		cand[h] = scores[h][:max(0, n-window)]
	}
	budgets := adaBudgets(cand, b-window, pAlpha.Float(st.cfg))
	for h := range budgets {
		budgets[h] += window
	}
	return budgets
}

var pAlpha = &Param{Name: "alpha", Kind: FloatParam, Doc: "share of the budget spread evenly over the heads", Default: "0.2",
	Lo: 0, Hi: 1, Fill: 0.2}

func init() {
	Register(Method{Name: "adakv", Order: 7, Doc: "Ada-KV: snapkv with head-adaptive budgets",
		Params: []string{"budget", "ratio", "window", "sinks", "agg", "pool", "kernel", "every", "alpha"}, Own: []*Param{pAlpha},
		Normalize: normalizeSnap, Unused: map[string]string{"positions": "%s keeps different numbers of tokens per head or layer, so its positions cannot be re-indexed ({{positions}})"}, Scorer: adakv{}, PrefixTail: observedTail, Describe: func(Config) string { return "" }})
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
