package policy

import "math"

// keydiff is KeyDiff (arXiv 2504.15364): the score of a token is minus
// the cosine similarity between its key and the anchor, the mean of the
// L2-normalised keys of its (layer, KV head); the most distinctive keys
// are kept. It needs no attention.
type keydiff struct{ scorerBase }

func (keydiff) Scores(st *State, l, _ int) [][]float32 {
	scores := make([][]float32, st.H)
	d := st.cache.Layout().HeadDim
	for h := range scores {
		var keys [][]float64
		anchor := make([]float64, d)
		st.keyRows(l, h, func(_ int, row []float32) {
			k := make([]float64, d)
			var nn float64
			for j, v := range row {
				k[j] = float64(v)
				nn += k[j] * k[j]
			}
			if nn > 0 {
				inv := 1 / math.Sqrt(nn)
				for j, v := range k {
					anchor[j] += v * inv
				}
			}
			keys = append(keys, k)
		})
		var an float64
		for j := range anchor {
			anchor[j] /= float64(max(1, len(keys)))
			an += anchor[j] * anchor[j]
		}
		an = math.Sqrt(an)
		out := make([]float32, len(keys))
		for i, k := range keys {
			var dot, kn float64
			for j, v := range k {
				dot += v * anchor[j]
				kn += v * v
			}
			if kn > 0 && an > 0 {
				out[i] = float32(-dot / (math.Sqrt(kn) * an))
			}
		}
		scores[h] = out
	}
	return scores
}

func init() {
	Register(Method{Name: "keydiff", Order: 12, Doc: "KeyDiff: the keys least like their head's mean direction",
		Params: []string{"budget", "ratio", "window", "sinks", "every", "positions"}, Scorer: keydiff{}, PrefixTail: anyTail})
}
