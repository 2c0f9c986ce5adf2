package policy

import "math"

// knorm is the key-norm baseline: −‖k‖, keys of small norm kept.
type knorm struct{ scorerBase }

func (knorm) Scores(st *State, l, _ int) [][]float32 {
	scores := make([][]float32, st.H)
	for h := range scores {
		var out []float32
		st.keyRows(l, h, func(_ int, row []float32) {
			var s float64
			for _, v := range row {
				s += float64(v) * float64(v)
			}
			out = append(out, -float32(math.Sqrt(s)))
		})
		scores[h] = out
	}
	return scores
}

func init() {
	Register(Method{Name: "knorm", Order: 9, Doc: "keys of small norm",
		Params: []string{"budget", "ratio", "window", "sinks", "every", "positions"}, Scorer: knorm{}, PrefixTail: anyTail})
}
