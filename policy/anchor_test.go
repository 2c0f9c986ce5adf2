package policy

import (
	"fmt"
	"math"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
)

// TestAnchoredSinks: the sinks that streaming's re-indexed positions and
// LM-Infinite's cap move at every decode step hold, after 300 steps, their
// own key rotated once to where they sit now and encoded — as far from the
// exact key as two encodings are at most (the codec's error on the same
// keys unmoved, twice) — not the rounding of 300 re-rotations compounded.
// The exact key is a float32 cache's key of the same token at its
// original position, rotated by the distance.
func TestAnchoredSinks(t *testing.T) {
	st := loadStories(t)
	m := st.m
	prompt := st.ids[:120]
	const gen, sinks = 300, 4
	// The exact sinks: tokens 0..3 at positions 0..3 in a float32 cache.
	ref, err := m.NewStandaloneSequence(model.KVOptions{Tokens: m.CtxLen})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	if _, err := ref.Forward(prompt[:sinks], false); err != nil {
		t.Fatal(err)
	}
	exact := snapshotKeys(ref)
	rot := m.NewRotator()
	for _, cfg := range []Config{
		{Method: "streaming", Window: 36, Sinks: sinks},
		{Method: "lminfinite", Window: 40, Sinks: sinks},
	} {
		for _, kn := range []string{"f16", "q8", "q4"} {
			t.Run(fmt.Sprintf("%s/%s", cfg.Method, kn), func(t *testing.T) {
				kc, _ := codec.Parse(kn, codec.Keys)
				// The codec's own error on the unmoved sinks.
				plain, err := m.NewStandaloneSequence(model.KVOptions{K: kc, Tokens: m.CtxLen})
				if err != nil {
					t.Fatal(err)
				}
				defer plain.Close()
				if _, err := plain.Forward(prompt[:sinks], false); err != nil {
					t.Fatal(err)
				}
				var once float64
				for tb, rows := range snapshotKeys(plain) {
					for i, row := range rows {
						for j, v := range row {
							once = max(once, math.Abs(v-exact[tb][i][j]))
						}
					}
				}
				seq, err := m.NewStandaloneSequence(model.KVOptions{K: kc, Tokens: 2 * m.CtxLen})
				if err != nil {
					t.Fatal(err)
				}
				defer seq.Close()
				a, err := New(cfg, seq)
				if err != nil {
					t.Fatal(err)
				}
				seq.SetPolicy(a)
				seq.Prompt(len(prompt))
				logits, err := seq.Forward(prompt, false)
				if err != nil {
					t.Fatal(err)
				}
				for range gen {
					if logits, err = seq.Forward([]int{argmax(logits)}, false); err != nil {
						t.Fatal(err)
					}
				}
				got := snapshotKeys(seq)
				l := seq.Cache().Layout()
				moved := 0
				var worst float64
				for tb := range got {
					pos := a.Cache().Positions(tb/l.KVHeads, tb%l.KVHeads)
					for i := range sinks {
						if int(pos[i]) != i {
							moved++
						}
						want := make([]float32, l.HeadDim)
						for j, v := range exact[tb][i] {
							want[j] = float32(v)
						}
						rot.Rotate(want, tb/l.KVHeads, int(pos[i])-i)
						for j, v := range want {
							worst = max(worst, math.Abs(got[tb][i][j]-float64(v))/once)
						}
					}
				}
				if moved == 0 {
					t.Fatal("no sink moved: the test shows nothing")
				}
				t.Logf("%d sinks moved; worst error %.2f× one encoding's (%.3g)", moved, worst, once)
				if worst > 2 {
					t.Fatalf("a sink's key is %.2f× one encoding's error from its exact key rotated once: the rounding compounds", worst)
				}
			})
		}
	}
}
