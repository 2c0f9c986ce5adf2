package policy

import "github.com/kvlm/kvlm/attention"

// tova is TOVA: the last query's attention, one token set per layer (the
// mean over its KV heads), evicted at every decode step by default.
type tova struct{ scorerBase }

func (tova) Mass(st *State, _, _, n int) *attention.MassRequest {
	return &attention.MassRequest{From: n - 1, Agg: st.cfg.Agg}
}

// Done sets the scores to the last query's mass: on a layer read by
// several model layers, the first reader of the step sets them and the
// others combine theirs in as the query heads of a group are (Config.Agg:
// the mean by default).
func (tova) Done(st *State, layer int, req *attention.MassRequest, _ []float32, _ []int32) {
	R := st.readers[layer]
	if R == 1 {
		for h, m := range req.Out {
			copy(st.grow(layer*st.H+h, len(m)), m)
		}
		return
	}
	first, agg := st.doneIndex(layer) == 0, st.cfg.Agg
	for h, m := range req.Out {
		sc := st.grow(layer*st.H+h, len(m))
		if first {
			clear(sc)
		}
		for i, v := range m {
			switch agg {
			case attention.AggMax:
				sc[i] = max(sc[i], v)
			case attention.AggSum:
				sc[i] += v
			default:
				sc[i] += v / float32(R)
			}
		}
	}
}

// Rows: the last query's attention.
func (tova) Rows(*State, int, int) int { return 1 }

func (tova) Scores(st *State, l, _ int) [][]float32 {
	shared := make([]float32, st.cache.Slots(l, 0))
	for h := 0; h < st.H; h++ {
		for i, v := range st.scores[l*st.H+h] {
			if i < len(shared) {
				shared[i] += v / float32(st.H)
			}
		}
	}
	scores := make([][]float32, st.H)
	for h := range scores {
		scores[h] = shared
	}
	return scores
}

func init() {
	Register(Method{Name: "tova", Order: 5, Doc: "TOVA: the last query's attention, one token set per layer",
		Params:       []string{"budget", "ratio", "window", "sinks", "agg", "every", "positions"},
		DefaultEvery: 1, Scorer: tova{}, PrefixTail: anyTail})
}
