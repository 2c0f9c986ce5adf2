package eval

import (
	"math"
	"os"
	"testing"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
)

// TestCodecNLL measures the stories260K 512-token mean NLL (the README's
// protocol) with every KV codec, keys and values alike and each alone, and
// checks each against the f32 cache. The bounds are what each format
// should deliver on this model (head dim 8); q8 keys miss the 0.1% target:
// see the closing note of the KV cache issue and docs/KVCACHE.md.
func TestCodecNLL(t *testing.T) {
	m, tok, err := engine.Load(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/stories260K/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	text, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(string(text[:4096]), true, false)[:512]
	nll := func(k, v string) float64 {
		kc, err := codec.Parse(k, codec.Keys)
		if err != nil {
			t.Fatal(err)
		}
		vc, err := codec.Parse(v, codec.Values)
		if err != nil {
			t.Fatal(err)
		}
		seq, err := m.NewStandaloneSequence(model.KVOptions{K: kc, V: vc})
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Close()
		r, err := Perplexity(seq, ids)
		if err != nil {
			t.Fatal(err)
		}
		return r.MeanNLL
	}
	base := nll("f32", "f32")
	if math.Abs(base-1.311214) > 1e-4 {
		t.Fatalf("f32 mean NLL %.6f, README says 1.311214", base)
	}
	cases := []struct {
		k, v string
		rel  float64 // allowed |ΔNLL| / NLL
	}{
		{"f16", "f16", 0.001},
		{"bf16", "bf16", 0.002},
		{"f32", "q8", 0.001},
		{"q8", "f32", 0.005},
		{"q8", "q8", 0.005},
		{"f32", "q4", 0.01},
		{"q4", "q4", 0.3},
		{"kivi4", "kivi4", 0.005},
		{"kivi2", "kivi2", 0.05},
	}
	for _, c := range cases {
		got := nll(c.k, c.v)
		d := (got - base) / base
		t.Logf("K %-5s V %-5s mean NLL %.6f  Δ %+.6f (%+.3f%%)", c.k, c.v, got, got-base, 100*d)
		if math.IsNaN(got) || math.Abs(d) > c.rel {
			t.Errorf("K %s V %s: mean NLL %.6f is %.3f%% off f32 (bound %.2f%%)", c.k, c.v, got, 100*d, 100*c.rel)
		}
	}
}
