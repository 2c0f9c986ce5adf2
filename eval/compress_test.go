package eval

import (
	"os"
	"testing"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// TestTrial: the full cache agrees with itself exactly; compression and
// quantization cost something measurable, and less at larger budgets.
func TestTrial(t *testing.T) {
	m, tok, err := engine.Load(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/stories260K/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	text, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(string(text[:8000]), true, false)
	tr := Trial{Context: ids[:300], Continue: ids[300:364], Greedy: 32}
	ref, err := NewReference(m, tr)
	if err != nil {
		t.Fatal(err)
	}
	self, err := Run(m, tr, ref)
	if err != nil {
		t.Fatal(err)
	}
	if self.Top1 != 1 || self.Greedy != 1 || self.NLL != ref.NLL() {
		t.Fatalf("full cache vs itself: %+v (ref NLL %v)", self, ref.NLL())
	}
	for l, e := range self.AttnErr {
		if e != 0 {
			t.Fatalf("full cache vs itself: layer %d attention error %v", l, e)
		}
	}
	var prev TrialResult
	for i, ratio := range []float64{0.125, 0.5} {
		tr.Policy = policy.Config{Method: "snapkv", Ratio: ratio}
		r, err := Run(m, tr, ref)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("snapkv %.3f: NLL %.4f (full %.4f) top1 %.3f greedy %.3f attn err %.3v KV %d of %d B", ratio, r.NLL, ref.NLL(), r.Top1, r.Greedy, r.AttnErr, r.KVBytes, ref.KVBytes())
		if r.KVBytes >= ref.KVBytes() || r.Top1 <= 0 || r.Top1 > 1 {
			t.Fatalf("ratio %v: %+v", ratio, r)
		}
		if i > 0 && (r.KVBytes <= prev.KVBytes || r.AttnErr[0] >= prev.AttnErr[0]) {
			t.Fatalf("a larger budget did not use more memory and err less: %+v vs %+v", r, prev)
		}
		prev = r
	}
	q4, _ := codec.Parse("q4", codec.Keys)
	tr.Policy = policy.Config{}
	tr.KV = model.KVOptions{K: q4, V: q4}
	r, err := Run(m, tr, ref)
	if err != nil {
		t.Fatal(err)
	}
	if r.AttnErr[0] == 0 || r.KVBytes >= ref.KVBytes() {
		t.Fatalf("q4: %+v", r)
	}
}
