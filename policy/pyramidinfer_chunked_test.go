package policy

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
)

// TestPyramidInferChunkedPrefill runs a 355-token prompt in one step and
// in chunks of 128 (as the server's prefill does): the chunked prompt is
// pruned by Compress to the same tokens per layer, hence the same bytes,
// below the unpruned cache's; every layer keeps the sinks and the
// recent window, and a subset of the layer below.
func TestPyramidInferChunkedPrefill(t *testing.T) {
	st := loadStories(t)
	m := st.m
	const T = 355
	prompt := st.ids[:T]
	for _, cn := range [][2]string{{"f32", "f32"}, {"q8", "q4"}, {"kivi4", "kivi2"}} {
		kc, _ := codec.Parse(cn[0], codec.Keys)
		vc, _ := codec.Parse(cn[1], codec.Values)
		run := func(chunk int, cfg *Config) (*State, []int, [][][]int32, int64) {
			seq, err := m.NewStandaloneSequence(model.KVOptions{BlockTokens: 16, K: kc, V: vc})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(seq.Close)
			var ps *State
			if cfg != nil {
				if ps, err = New(*cfg, seq); err != nil {
					t.Fatal(err)
				}
				ps.BeginPrefill(T)
			}
			for i := 0; i < T; i += chunk {
				if _, err := seq.Forward(prompt[i:min(i+chunk, T)], false); err != nil {
					t.Fatal(err)
				}
			}
			if ps == nil {
				return nil, nil, nil, seq.Cache().Bytes()
			}
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
			return ps, ps.KeptPerLayer(), ps.Kept(), seq.Cache().Bytes()
		}
		_, _, _, full := run(T, nil)
		for _, decay := range []float64{0, 0.3} {
			t.Run(fmt.Sprintf("%s-%s/decay%g", cn[0], cn[1], decay), func(t *testing.T) {
				checkChunked(t, run, Config{Method: "pyramidinfer", Opts: Opts{}.With("decay", decay)}, full)
			})
		}
	}
}

// checkChunked compares the one-step and the chunked prefill of cfg.
func checkChunked(t *testing.T, run func(int, *Config) (*State, []int, [][][]int32, int64), cfg Config, full int64) {
	const T = 355
	_, oneN, oneKept, oneBytes := run(T, &cfg)
	ps, chN, chKept, chBytes := run(128, &cfg)
	t.Logf("tokens per layer: one step %v, chunks of 128 %v; bytes %d, %d (unpruned %d)", oneN, chN, oneBytes, chBytes, full)
	if !slices.Equal(oneN, chN) || oneBytes != chBytes {
		t.Fatalf("chunked prefill keeps %v (%d bytes), the one-step prefill %v (%d bytes)", chN, chBytes, oneN, oneBytes)
	}
	if chBytes >= full || ps.Pruned == 0 {
		t.Fatalf("chunked prefill holds %d bytes of %d unpruned (pruned %d times)", chBytes, full, ps.Pruned)
	}
	W := pyrWindow(T, 0.2)
	same, total := 0, 0
	for l := range chKept {
		set := chKept[l][0]
		for h := range chKept[l] {
			if !slices.Equal(chKept[l][h], set) {
				t.Fatalf("layer %d: head %d keeps other tokens than head 0", l, h)
			}
		}
		for i := 0; i < 4; i++ {
			if set[i] != int32(i) {
				t.Fatalf("layer %d: sink %d missing", l, i)
			}
		}
		if !slices.Equal(set[len(set)-W:], kvRange(T-W, T)) {
			t.Fatalf("layer %d: the recent window is not kept", l)
		}
		if l > 0 {
			for _, p := range set {
				if _, ok := slices.BinarySearch(chKept[l-1][0], p); !ok {
					t.Fatalf("layer %d keeps %d, which layer %d dropped", l, p, l-1)
				}
			}
		}
		for _, p := range set {
			if _, ok := slices.BinarySearch(oneKept[l][0], p); ok {
				same++
			}
		}
		total += len(set)
	}
	t.Logf("%d of %d kept tokens are those of the one-step prefill", same, total)
	if same*10 < total*9 {
		t.Fatalf("only %d of %d kept tokens are those of the one-step prefill", same, total)
	}
}

func kvRange(a, b int) []int32 {
	out := make([]int32, 0, b-a)
	for i := a; i < b; i++ {
		out = append(out, int32(i))
	}
	return out
}
