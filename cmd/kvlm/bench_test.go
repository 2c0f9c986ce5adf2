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
	if code != 0 || !strings.Contains(out, "batch 1          ") || !strings.Contains(out, "batch 5 ") {
		t.Fatalf("bench exit %d: %s%s", code, out, errOut)
	}
	// Each label says what it measures: the ratio is not the quotient of
	// the medians printed beside it, and batch 1 is not the decode line.
	for _, want := range []string{
		"(1 sequence; 4 steps of model.DecodeBatch after 8-token prompts, median of 2 rounds; vs batch 1: 1.00×, the median of each round's ratio)",
		"(5 sequences' tokens summed; 4 steps of model.DecodeBatch after 8-token prompts, median of 2 rounds; vs batch 1: ",
		"decode           ",
		"(4 tokens after the 8-token prompt, median of 2;",
		"(the process after the prefill and decode runs: weights, runtime, one sequence's KV cache; not the batched runs or the bandwidth buffer)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
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

// TestBenchCompareKV: --compare-kv decodes under two codecs in turns and
// reports both speeds, the median ratio of their token times inside its
// quartiles, and each codec's bytes per token; the KV codec in use is
// reported with its size; bad comparisons are refused.
func TestBenchCompareKV(t *testing.T) {
	s := storiesFiles(t)
	base := []string{"bench", "-m", s.gguf, "--prompt", "8", "--gen", "6", "--reps", "1", "--contexts", "", "--bandwidth-mib", "0", "--batch", ""}
	out, errOut, code := kvlm(t, append(base, "--kv-type", "f16", "--compare-kv", "f32, f16", "--json")...)
	if code != 0 {
		t.Fatalf("bench exit %d: %s", code, errOut)
	}
	var b benchJSON
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	c := b.CompareKV
	if c == nil || c.CodecA != "f32" || c.CodecB != "f16" || c.Rounds != 6 || c.Context != 8+compareWarmup {
		t.Fatalf("compare %+v", c)
	}
	if c.ATokS <= 0 || c.BTokS <= 0 || c.RatioQ1 <= 0 || c.RatioQ1 > c.TimeRatio || c.TimeRatio > c.RatioQ3 {
		t.Fatalf("compare %+v", c)
	}
	// stories260K's pool: 1,280 B of f32 keys and values per token, 640 in
	// f16, and 80 B of positions either way (kvcalc, inspect).
	if c.KVBytesA != 1360 || c.KVBytesB != 720 || b.KVType != "f16/f16" || b.KVBytesPerToken != c.KVBytesB {
		t.Fatalf("KV bytes: %+v, run %s %d", c, b.KVType, b.KVBytesPerToken)
	}
	out, errOut, code = kvlm(t, append(base, "--compare-kv", "q8,f32")...)
	if code != 0 || !strings.Contains(out, "compare KV       q8 ") || !strings.Contains(out, "q8/f32 token time") || !strings.Contains(out, "(f32/f32)") {
		t.Fatalf("bench exit %d: %s%s", code, out, errOut)
	}
	for _, bad := range [][]string{
		{"--compare-kv", "f32"},
		{"--compare-kv", "f32,zz"},
		{"--compare-kv", "f32,f16,q8"},
		{"--compare-kv", "f32,f16", "--prompt", "500", "--gen", "10"},
	} {
		if _, errOut, code := kvlm(t, append(base, bad...)...); code == 0 || !strings.Contains(errOut, "compare-kv") {
			t.Errorf("%v: exit %d, %s", bad, code, errOut)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		x    []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1}, 3}, {[]float64{2, 9, 4}, 4}, {[]float64{4, 1, 3, 10}, 3.5}} {
		if got := median(c.x); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.x, got, c.want)
		}
	}
}
