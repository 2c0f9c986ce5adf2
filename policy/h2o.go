package policy

import "github.com/kvlm/kvlm/attention"

// h2o is H2O: every query's attention accumulated (heavy hitters), plus
// the recent window (half the budget by default), evicted greedily at
// every decode step by default.
type h2o struct{ scorerBase }

func (h2o) Mass(st *State, _, _, _ int) *attention.MassRequest {
	return &attention.MassRequest{From: 0, Agg: st.cfg.Agg}
}

func (h2o) Scores(st *State, l, _ int) [][]float32 { return st.scores[l*st.H : (l+1)*st.H] }

// Rows: every query's attention.
func (h2o) Rows(_ *State, _, n int) int { return n }

func init() {
	Register(Method{Name: "h2o", Order: 4, Doc: "H2O: accumulated attention (heavy hitters) + recent",
		Params:       []string{"budget", "ratio", "window", "sinks", "agg", "every", "positions"},
		DefaultEvery: 1, RecentWindow: func(total int) int { return total / 2 }, Scorer: h2o{}})
}
