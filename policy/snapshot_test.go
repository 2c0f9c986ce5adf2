package policy

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
)

// TestSnapshotRestore: a sequence whose compressed cache is shared by a
// fresh sequence (kvcache's Fork, as a compressed prefix hands it out) and
// whose policy state is restored from a Snapshot taken after the prompt
// continues bit for bit as the original: the same logits at every decode
// step, the same kept tokens, through the decoding-time prunes; methods
// whose state a snapshot cannot hold say so.
func TestSnapshotRestore(t *testing.T) {
	st := loadStories(t)
	m := st.m
	prompt := st.ids[:180]
	const gen = 40
	for _, cfg := range []Config{
		{Method: "window", Window: 40},
		{Method: "streaming", Window: 36, Sinks: 4},
		{Method: "lminfinite", Window: 60, Sinks: 4},
		{Method: "h2o", Budget: 48},
		{Method: "h2o", Ratio: 0.5, Every: 8},
		{Method: "tova", Budget: 40},
		{Method: "snapkv", Ratio: 0.25},
		{Method: "snapkv", Ratio: 0.25, Window: 16, Every: 16},
		{Method: "adakv", Budget: 64, Window: 16},
		{Method: "pyramidkv", Budget: 64, Window: 16},
		{Method: "knorm", Budget: 50, Sinks: 2, Window: 8, Every: 4},
		{Method: "keydiff", Ratio: 0.3},
		{Method: "expected", Ratio: 0.3},
		{Method: "pyramidinfer"},
		{Method: "minicache"},
	} {
		for _, cn := range [][2]string{{"f32", "f32"}, {"q8", "q4"}} {
			t.Run(fmt.Sprintf("%s/%s-%s", cfg, cn[0], cn[1]), func(t *testing.T) {
				kc, _ := codec.Parse(cn[0], codec.Keys)
				vc, _ := codec.Parse(cn[1], codec.Values)
				seq, err := m.NewStandaloneSequence(model.KVOptions{K: kc, V: vc, Tokens: 2 * m.CtxLen})
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
				la, err := seq.Forward(prompt, false)
				if err != nil {
					t.Fatal(err)
				}
				sn, ok := a.Snapshot()
				cacheable := cfg.Method != "expected" && cfg.Method != "pyramidinfer" && cfg.Method != "minicache"
				if ok != cacheable {
					t.Fatalf("Snapshot ok %v, want %v", ok, cacheable)
				}
				if !ok {
					return
				}
				if sn.Tokens() != len(prompt) {
					t.Fatalf("snapshot of %d tokens, want %d", sn.Tokens(), len(prompt))
				}
				fork := seq.Cache().(*kvcache.Paged).Fork()
				defer fork.Free()
				seqB, err := m.NewSequence(fork)
				if err != nil {
					t.Fatal(err)
				}
				b, err := Restore(cfg, seqB, sn)
				if err != nil {
					t.Fatal(err)
				}
				lb := slices.Clone(la)
				for i := range gen {
					if !slices.Equal(la, lb) {
						t.Fatalf("step %d: logits differ", i)
					}
					if fmt.Sprint(a.Kept()) != fmt.Sprint(b.Kept()) {
						t.Fatalf("step %d: kept %v, restored %v", i, a.Kept()[0][0], b.Kept()[0][0])
					}
					tok := argmax(la)
					if la, err = seq.Forward([]int{tok}, false); err != nil {
						t.Fatal(err)
					}
					if lb, err = seqB.Forward([]int{tok}, false); err != nil {
						t.Fatal(err)
					}
				}
				if a.Pruned != b.Pruned || seq.Pos() != seqB.Pos() {
					t.Fatalf("prunes %d/%d, positions %d/%d", a.Pruned, b.Pruned, seq.Pos(), seqB.Pos())
				}
			})
		}
	}
}
