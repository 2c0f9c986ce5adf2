package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchBatch runs batched decode (model.DecodeBatch) at batch 1, 2 and
// 5 in two rounds: every size reports a speed, ratios are against batch 1
// (the medians of the rounds'), and the text output names them.
func TestBenchBatch(t *testing.T) {
	s := storiesFiles(t)
	args := []string{"bench", "-m", s.gguf, "--prompt", "8", "--gen", "4", "--reps", "2", "--contexts", "", "--bandwidth-mib", "0", "--ctx-gen", "4", "--batch", "2,1,5"}
	out, errOut, code := kvlm(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("bench exit %d: %s", code, errOut)
	}
	var b benchJSON
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Batch) != 3 {
		t.Fatalf("batch results %+v", b.Batch)
	}
	for i, want := range []int{2, 1, 5} {
		r := b.Batch[i]
		if r.Batch != want || r.Steps != 4 || r.Rounds != 2 || r.DecodeTokS <= 0 || r.VsBatch1 <= 0 {
			t.Errorf("batch %d: %+v", want, r)
		}
	}
	if b.Batch[1].VsBatch1 != 1 {
		t.Errorf("batch 1 ratio %v", b.Batch[1].VsBatch1)
	}
	out, errOut, code = kvlm(t, args...)
	if code != 0 || !strings.Contains(out, "(4 steps of model.DecodeBatch, median of 2 rounds; 1.00× batch 1 in the same round)") || !strings.Contains(out, "batch 5 ") {
		t.Fatalf("bench exit %d: %s%s", code, out, errOut)
	}
	// Without batch 1 there is no ratio (and --mmap maps the file).
	out, errOut, code = kvlm(t, "bench", "--mmap", "-m", s.gguf, "--prompt", "8", "--gen", "4", "--reps", "1", "--contexts", "", "--bandwidth-mib", "0", "--batch", "3", "--json")
	if code != 0 {
		t.Fatalf("bench exit %d: %s", code, errOut)
	}
	b = benchJSON{}
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Batch) != 1 || b.Batch[0].Batch != 3 || b.Batch[0].DecodeTokS <= 0 || b.Batch[0].VsBatch1 != 0 {
		t.Fatalf("batch results %+v", b.Batch)
	}
}
