package policy

// pyramidkv is PyramidKV: snapkv with budgets falling linearly with
// depth, the first layer's Beta times the last one's.
type pyramidkv struct{ snap }

func (pyramidkv) Budgets(st *State, l, b, window int, _ [][]float32) []int {
	pb := max(pyramidBudgets(b, window, st.cache.Slots(l, 0), st.L, pBeta.Float(st.cfg))[l], window)
	budgets := make([]int, st.H)
	for h := range budgets {
		budgets[h] = pb
	}
	return budgets
}

var pBeta = &Param{Name: "beta", Kind: FloatParam, Doc: "ratio of the largest to the smallest layer budget", Default: "20",
	Lo: 1, Fill: 20}

func init() {
	Register(Method{Name: "pyramidkv", Order: 8, Doc: "PyramidKV: snapkv with budgets shrinking with depth",
		Params: []string{"budget", "ratio", "window", "sinks", "agg", "pool", "kernel", "every", "beta"}, Own: []*Param{pBeta},
		Normalize: normalizeSnap, Unused: map[string]string{"positions": "%s keeps different numbers of tokens per head or layer, so its positions cannot be re-indexed ({{positions}})"}, Scorer: pyramidkv{}, PrefixTail: observedTail, Describe: func(Config) string { return "" }})
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
