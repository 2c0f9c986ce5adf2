package main

import (
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/internal/shared"
)

// TestEvalQuick runs `kvlm eval --quick` and checks the structure and the
// sanity of what it writes: perplexities finite and positive, the full
// cache agreeing with itself, bytes falling with the ratio, every figure
// written and embedded in the report.
func TestEvalQuick(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tok := shared.Path(t, "models/stories260K/tok512.bin")
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	dir := t.TempDir()
	out, errOut, code := kvlm(t, "eval", "-m", bin, "--tokenizer", tok, "--text", text, "--out", dir, "--quick")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "wrote ") || strings.Contains(out, "%") {
		t.Errorf("stdout should be one summary line, got %q", out)
	}
	if errOut != "" {
		t.Errorf("stderr is not a terminal, yet got %d bytes (a progress bar?): %.200q", len(errOut), errOut)
	}
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r eval.Results
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	s := r.Setup
	if !s.Quick || len(s.Samples) != s.Contexts || s.Contexts < 1 || len(s.Ratios) < 2 {
		t.Fatalf("setup: %+v", s)
	}
	for _, c := range s.Samples {
		if c.Length < s.MinContext || c.Length > s.MaxContext {
			t.Errorf("context length %d outside %d–%d", c.Length, s.MinContext, s.MaxContext)
		}
	}
	finitePos := func(what string, v float64) {
		t.Helper()
		if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
			t.Errorf("%s = %v, want finite and positive", what, v)
		}
	}
	in01 := func(what string, v float64) {
		t.Helper()
		if !(v >= 0 && v <= 1) {
			t.Errorf("%s = %v, want in [0, 1]", what, v)
		}
	}

	// Compress-then-continue.
	var methods []string
	run := 0
	for _, c := range r.Compress {
		name := c.Method + " " + c.Codec
		if c.Contexts == 0 {
			if c.Error == "" {
				t.Errorf("%s %g: no contexts and no error", name, c.Ratio)
			}
			continue
		}
		run++
		if c.Contexts != s.Contexts || len(c.PerContext.NLL) != c.Contexts {
			t.Errorf("%s %g: %d contexts measured of %d", name, c.Ratio, c.Contexts, s.Contexts)
		}
		finitePos(name+" ppl", c.PPL)
		finitePos(name+" nll", c.NLL)
		finitePos(name+" kv bytes", c.KVBytes)
		finitePos(name+" kvcalc bytes", c.KVCalcBytes)
		in01(name+" top1", c.Top1)
		in01(name+" greedy", c.Greedy)
		if len(c.AttnErr) != s.ModelConfig.Layers {
			t.Errorf("%s: %d attention errors for %d layers", name, len(c.AttnErr), s.ModelConfig.Layers)
		}
		for _, e := range c.AttnErr {
			if math.IsNaN(e) || e < 0 {
				t.Errorf("%s: attention error %v", name, e)
			}
		}
		if c.KVBytes > c.KVBytesPeak {
			t.Errorf("%s %g: bytes %v above the peak %v", name, c.Ratio, c.KVBytes, c.KVBytesPeak)
		}
		if c.Method != "full" && !slices.Contains(methods, c.Method) {
			methods = append(methods, c.Method)
		}
	}
	if run < 10 {
		t.Fatalf("only %d cells ran", run)
	}
	for _, m := range []string{"window", "streaming", "lminfinite", "h2o", "tova", "snapkv", "adakv", "pyramidkv", "knorm"} {
		if !slices.Contains(methods, m) {
			t.Errorf("method %s missing from the sweep", m)
		}
	}
	var full *eval.CompressCell
	for i, c := range r.Compress {
		if c.Method == "full" && c.Codec == "f32" {
			full = &r.Compress[i]
		}
	}
	if full == nil || full.Top1 != 1 || full.Greedy != 1 || full.NLL != full.RefNLL || full.AttnMean != 0 {
		t.Fatalf("the full f32 cache must agree with itself exactly: %+v", full)
	}
	// Bytes fall with the ratio, for every method and codec.
	for _, m := range methods {
		for _, cd := range s.Codecs {
			var prev *eval.CompressCell
			for _, ratio := range s.Ratios { // descending
				for i, c := range r.Compress {
					if c.Method != m || c.Codec != cd || c.Ratio != ratio || c.Contexts == 0 {
						continue
					}
					// KIVI's f32 residual holds up to 159 tokens per table
					// whatever the budget: its bytes only never grow.
					if prev != nil && (c.KVBytes > prev.KVBytes || c.KVBytes == prev.KVBytes && c.Codec != "kivi2") {
						t.Errorf("%s %s: ratio %g holds %v bytes, ratio %g %v", m, cd, ratio, c.KVBytes, prev.Ratio, prev.KVBytes)
					}
					if prev != nil && c.KeptFrac >= prev.KeptFrac {
						t.Errorf("%s %s: ratio %g keeps %v, ratio %g %v", m, cd, ratio, c.KeptFrac, prev.Ratio, prev.KeptFrac)
					}
					prev = &r.Compress[i]
				}
			}
		}
	}

	// Streaming.
	labels := map[string]bool{}
	for _, st := range r.Stream {
		if st.Error != "" {
			t.Errorf("stream %s: %s", st.Label, st.Error)
			continue
		}
		labels[st.Label] = true
		finitePos("stream "+st.Label+" ppl", st.PPL)
		want := (st.Tokens + st.Every - 1) / st.Every
		if len(st.NLLByWindow) != want {
			t.Errorf("stream %s: %d windows, want %d", st.Label, len(st.NLLByWindow), want)
		}
		if st.Method != "full" && (st.Budget != s.StreamBudget || st.KVBytesPeak >= int64(st.Tokens)*s.ModelConfig.KVPerTok) {
			t.Errorf("stream %s: budget %d, peak %d bytes", st.Label, st.Budget, st.KVBytesPeak)
		}
	}
	for _, l := range []string{"dense", "window", "lminfinite"} {
		if !labels[l] {
			t.Errorf("stream %s missing", l)
		}
	}

	// Kept picture, seed tables, figures, report.
	if len(r.Kept.Methods) == 0 || len(r.Kept.Methods[0].Kept) != s.ModelConfig.Layers {
		t.Errorf("kept picture: %+v", r.Kept)
	}
	if len(r.Seeds) != 2 || !strings.Contains(r.Seeds[1].Output, "1237.0") {
		t.Errorf("kvcalc tables: %+v", r.Seeds)
	}
	report, err := os.ReadFile(filepath.Join(dir, "RESULTS.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"stream", "pareto_greedy", "pareto_top1", "pareto_nll", "attention_error", "kept_tokens"} {
		f, err := os.Open(filepath.Join(dir, name+".png"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(f); err != nil {
			t.Errorf("%s.png: %v", name, err)
		}
		f.Close()
		if st, err := os.Stat(filepath.Join(dir, name+".svg")); err != nil || st.Size() == 0 {
			t.Errorf("%s.svg: %v", name, err)
		}
		if !strings.Contains(string(report), "]("+name+".png)") {
			t.Errorf("report does not embed %s.png", name)
		}
	}
	for _, want := range []string{"## Findings", "Best method at each budget", "What each codec costs", "Do sinks rescue streaming?", "## Setup", "seed 1", "kvcalc --preset gpt3-175b", "81 / 324 / 1297"} {
		if !strings.Contains(string(report), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

func TestEvalErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"eval", "--out", "x"}, "no model"},
		{[]string{"eval", "-m", "x"}, "no output folder"},
		{[]string{"eval", "-m", "x", "--out", "y", "--jobs", "0"}, "--jobs"},
	} {
		_, errOut, code := kvlm(t, c.args...)
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, %q (want %q)", c.args, code, errOut, c.want)
		}
	}
}
