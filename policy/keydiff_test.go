package policy

import (
	"math"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/model"
)

// TestKeyDiffMatchesBruteForce compares KeyDiff's kept tokens of every
// (layer, KV head) on stories260K with a float64 reference computed from
// the stored keys: anchor = mean of the normalised keys, score = −cos(k,
// anchor), explicit sort.
func TestKeyDiffMatchesBruteForce(t *testing.T) {
	st := loadStories(t)
	m := st.m
	const T = 200
	for _, cfg := range []Config{
		{Method: "keydiff", Budget: 64},
		{Method: "keydiff", Budget: 80, Sinks: 4, Window: 8},
		{Method: "keydiff", Ratio: 0.3, Sinks: 2},
	} {
		t.Run(cfg.String(), func(t *testing.T) {
			seqn, err := m.NewStandaloneSequence(model.KVOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer seqn.Close()
			ps, err := New(cfg, seqn)
			if err != nil {
				t.Fatal(err)
			}
			ps.BeginPrefill(T)
			if _, err := seqn.Forward(st.ids[:T], false); err != nil {
				t.Fatal(err)
			}
			keys := snapshotKeys(seqn)
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
			c, b, got := ps.Config(), ps.budget(T), ps.Kept()
			for tb, ks := range keys {
				anchor := make([]float64, m.HeadDim)
				for _, k := range ks {
					n := math.Sqrt(dot64(k, k))
					for j := range anchor {
						anchor[j] += k[j] / n / float64(len(ks))
					}
				}
				score := make([]float64, len(ks))
				for i, k := range ks {
					score[i] = -dot64(k, anchor) / math.Sqrt(dot64(k, k)*dot64(anchor, anchor))
				}
				want := refKeep(T, b, c.Sinks, c.Window, score)
				checkKept(t, tb/m.KVHeads, tb%m.KVHeads, got, want, score, c.Sinks, c.Window)
			}
		})
	}
}

func dot64(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// checkKept compares the kept tokens of table (l, h) with want; where they
// differ, each token in one set only must score within a float32
// rounding of the boundary (the lowest kept score of the reference).
func checkKept(t *testing.T, l, h int, got [][][]int32, want []int, score []float64, sinks, window int) {
	t.Helper()
	g := make([]int, len(got[l][h]))
	for i, v := range got[l][h] {
		g[i] = int(v)
	}
	if slices.Equal(g, want) {
		return
	}
	if len(g) != len(want) {
		t.Fatalf("layer %d head %d: kept %d tokens, want %d", l, h, len(g), len(want))
	}
	edge := math.Inf(1)
	for _, i := range want {
		if i >= sinks && i < len(score)-window {
			edge = math.Min(edge, score[i])
		}
	}
	for _, i := range append(slices.Clone(g), want...) {
		if slices.Contains(g, i) != slices.Contains(want, i) && math.Abs(score[i]-edge) > 1e-5*math.Max(1, math.Abs(edge)) {
			t.Fatalf("layer %d head %d: kept %v\nwant %v (token %d scores %g, boundary %g)", l, h, g, want, i, score[i], edge)
		}
	}
}

// TestKeyDiffInvariants runs keydiff through TestInvariants' checks
// (budget, sinks, window, order, blocks freed, no leak) with each codec.
func TestKeyDiffInvariants(t *testing.T) {
	st := loadStories(t)
	for _, cfg := range []Config{
		{Method: "keydiff", Budget: 50, Sinks: 2, Window: 8, Every: 4},
		{Method: "keydiff", Ratio: 0.4},
	} {
		for _, cn := range [][2]string{{"f32", "f32"}, {"q8", "q4"}, {"kivi4", "kivi2"}} {
			t.Run(cfg.String()+"/"+cn[0]+"-"+cn[1], func(t *testing.T) { runInvariants(t, st, cfg, cn) })
		}
	}
}
