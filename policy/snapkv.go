package policy

import (
	"math"

	"github.com/kvlm/kvlm/attention"
)

// snapkv is SnapKV: the attention an observation window (the prompt's
// last Window tokens, 32 by default) gives each earlier token, pooled
// over a kernel; during decoding (with Every), the queries since the last
// prune. adakv and pyramidkv are snapkv with other budgets.
type snap struct{ scorerBase }

func (snap) Mass(st *State, _, start, n int) *attention.MassRequest {
	from := -1
	if st.prefT > 0 {
		w := st.prefAt + st.prefT - min(st.cfg.Window, st.prefT) // first observed token
		if start+n > w {
			from = max(0, w-start)
		}
	} else if st.cfg.Every > 0 {
		from = 0 // during decoding: the queries since the last prune
	}
	if from < 0 {
		return nil
	}
	return &attention.MassRequest{From: from, Agg: st.cfg.Agg}
}

// Rows: the queries of the observation window the step holds.
func (s snap) Rows(st *State, start, n int) int {
	if req := s.Mass(st, 0, start, n); req != nil {
		return n - req.From
	}
	return 0
}

// Scores is each slot's pooled attention mass from the observation
// window; window slots score +Inf (they are kept anyway).
func (snap) Scores(st *State, l, window int) [][]float32 {
	scores := make([][]float32, st.H)
	for h := range scores {
		n := st.cache.Slots(l, h)
		raw := make([]float32, n)
		copy(raw, st.scores[l*st.H+h])
		cut := max(0, n-window)
		out := make([]float32, n)
		copy(out, pool1d(raw[:cut], st.cfg.Kernel, st.cfg.Pool))
		for i := cut; i < n; i++ {
			out[i] = float32(math.Inf(1))
		}
		scores[h] = out
	}
	return scores
}

// Pruned restarts the observation window after a prune while decoding.
func (snap) Pruned(st *State) {
	if st.prefT == 0 {
		for t := range st.scores {
			clear(st.scores[t])
		}
	}
}

// normalizeSnap fills in the snapkv family's defaults: window 32, kernel
// 5, avg pooling.
func normalizeSnap(c Config) (Config, error) {
	if c.Window == 0 {
		c.Window = 32
	}
	if c.Kernel == 0 {
		c.Kernel = 5
	}
	if c.Kernel%2 == 0 {
		return c, perr("kernel", "policy: pooling kernel (%s) must be odd, got %d", ref("kernel"), c.Kernel)
	}
	switch c.Pool {
	case "":
		c.Pool = "avg"
	case "avg", "max":
	default:
		return c, perr("pool", "policy: unknown pooling %q (avg, max)", c.Pool)
	}
	return c, nil
}

func init() {
	Register(Method{Name: "snapkv", Order: 6, Doc: "SnapKV: an observation window's pooled attention",
		Params:    []string{"budget", "ratio", "window", "sinks", "agg", "pool", "kernel", "every", "positions"},
		Normalize: normalizeSnap, Scorer: snap{}, PrefixTail: observedTail})
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
