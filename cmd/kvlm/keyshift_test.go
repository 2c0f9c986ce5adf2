package main

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
)

// TestPPLKeyShift: q8 keys stored around the model's mean keys keep the
// stories260K 512-token NLL within 0.1% of the f32 cache (issue 3); the
// plain q8 keys (--kv-key-shift=false) are further off, and f16 keys are
// not touched by the flag.
func TestPPLKeyShift(t *testing.T) {
	s := storiesFiles(t)
	const f32NLL = 1.311214
	nll := func(extra ...string) float64 {
		t.Helper()
		args := append([]string{"ppl", "-f", shared.Path(t, "data/tinystories_valid_head.txt"), "--ctx", "512", "--bytes", "4096", "--json",
			"-m", s.bin, "--tokenizer", s.tok}, extra...)
		out, errOut, code := kvlm(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", extra, code, errOut)
		}
		var r struct {
			MeanNLL float64 `json:"mean_nll"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r.MeanNLL
	}
	rel := func(x float64) float64 { return (x - f32NLL) / f32NLL }
	shifted := nll("--kv-type", "q8")
	plain := nll("--kv-type", "q8", "--kv-key-shift=false")
	t.Logf("q8 ΔNLL: shifted %+.3f%%, plain %+.3f%%", 100*rel(shifted), 100*rel(plain))
	if math.Abs(rel(shifted)) > 0.001 {
		t.Errorf("q8 with the key shift: ΔNLL %+.3f%%, want within 0.1%%", 100*rel(shifted))
	}
	if math.Abs(rel(plain)) <= math.Abs(rel(shifted)) {
		t.Errorf("the key shift did not help: plain %+.4f%%, shifted %+.4f%%", 100*rel(plain), 100*rel(shifted))
	}
	if a, b := nll("--kv-type", "f16"), nll("--kv-type", "f16", "--kv-key-shift=false"); a != b {
		t.Errorf("f16 keys changed with the flag: %v vs %v", a, b)
	}
}
