package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/internal/shared"
)

// TestEvalRecallQuick runs CI's `kvlm eval --suite recall --quick` and
// checks what it writes: every cell measured with its interval around
// it, the full cache and one method under both protocols, the figures,
// and a report section appended after the file's earlier content.
func TestEvalRecallQuick(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tok := shared.Path(t, "models/stories260K/tok512.bin")
	data := filepath.Dir(shared.Path(t, "data/"+eval.HeldOutFile))
	dir := t.TempDir()
	report := filepath.Join(dir, "RESULTS.md")
	const before = "# Results\n\nEarlier sections.\n"
	if err := os.WriteFile(report, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"eval", "--suite", "recall", "--quick", "-m", bin, "--tokenizer", tok, "--data", data, "--out", dir, "--report", report}
	out, errOut, code := kvlm(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "wrote ") {
		t.Errorf("stdout %q", out)
	}
	r := readRecall(t, dir)
	seen := map[string]bool{}
	for _, c := range r.Cells {
		if c.Error != "" {
			t.Errorf("%+v", c)
			continue
		}
		if c.N != r.Config.N || c.Acc < c.Lo || c.Acc > c.Hi || c.Lo < 0 || c.Hi > 1 || c.KVBytes <= 0 {
			t.Errorf("cell %+v", c)
		}
		seen[c.Method+" "+c.Protocol] = true
	}
	for _, k := range []string{"full query-aware", "full query-agnostic", "snapkv query-aware", "snapkv query-agnostic"} {
		if !seen[k] {
			t.Errorf("no %s cells", k)
		}
	}
	// snapkv at 0.25 holds fewer bytes than the full cache.
	var full, snap float64
	for _, c := range r.Cells {
		if c.Protocol == eval.ProtoAware && c.Task == eval.TaskNeedle {
			if c.Method == "full" {
				full = c.KVBytes
			} else {
				snap = c.KVBytes
			}
		}
	}
	if !(snap > 0 && snap < full/2) {
		t.Errorf("KV bytes: snapkv %g, full %g", snap, full)
	}
	md, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	s := string(md)
	if !strings.HasPrefix(s, before) || strings.Count(s, eval.RecallSectionBegin) != 1 || strings.Count(s, eval.RecallSectionEnd) != 1 {
		t.Errorf("report:\n%.600s", s)
	}
	for _, want := range []string{"--quick", "niah_single", "query-agnostic", "recall_niah_full.png", "recall_pareto_cwe.png"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, f := range []string{"recall_niah_full.png", "recall_niah_snapkv_0p25.png", "recall_pareto_vt.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if r.Command == "" || !strings.Contains(r.Command, "--quick") {
		t.Errorf("recall.json records the command %q", r.Command)
	}

	// --from renders the saved run again: the same section, with the
	// run's command and a line saying it was drawn again, running nothing.
	again := filepath.Join(dir, "AGAIN.md")
	if _, errOut, code := kvlm(t, "eval", "--suite", "recall", "--from", filepath.Join(dir, "recall.json"), "--out", dir, "--report", again); code != 0 {
		t.Fatalf("--from: exit %d: %s", code, errOut)
	}
	a2, err := os.ReadFile(again)
	if err != nil {
		t.Fatal(err)
	}
	got, drawn := string(a2), false
	if k := strings.Index(got, "The tables, ranking and figures were drawn again"); k >= 0 {
		e := k + strings.Index(got[k:], "\n\n") + 2
		drawn = strings.Contains(got[k:e], "--from")
		got = got[:k] + got[e:]
	}
	i, j := strings.Index(s, eval.RecallSectionBegin), strings.Index(s, eval.RecallSectionEnd)
	if want := s[i : j+len(eval.RecallSectionEnd)]; !drawn || !strings.Contains(got, want) {
		t.Errorf("--from's section (drawn-again line %v) is not the run's:\n%s", drawn, a2)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-m", bin}, "--model is not read with --from"},
		{[]string{"--ratios", "0.5"}, "--ratios is not read with --from"},
		{[]string{"--quick"}, "--quick is not read with --from"},
	} {
		args := append([]string{"eval", "--suite", "recall", "--from", filepath.Join(dir, "recall.json"), "--out", dir}, c.args...)
		if _, errOut, code := kvlm(t, args...); code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, %q; want %q", c.args, code, errOut, c.want)
		}
	}
	// A saved run without its command and commit is refused.
	r.Command = ""
	old, _ := json.Marshal(r)
	oldPath := filepath.Join(t.TempDir(), "recall.json")
	if err := os.WriteFile(oldPath, old, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := kvlm(t, "eval", "--suite", "recall", "--from", oldPath, "--out", t.TempDir()); code == 0 || !strings.Contains(errOut, "records no command") {
		t.Errorf("a saved run without its command: exit %d, %q", code, errOut)
	}
}

// TestEvalRecallMatrix runs a part of the matrix the flags name and
// checks that the cells are exactly that part.
func TestEvalRecallMatrix(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tok := shared.Path(t, "models/stories260K/tok512.bin")
	dir := t.TempDir()
	_, errOut, code := kvlm(t, "eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--samples", "2",
		"--methods", "streaming", "--tasks", "niah_single,vt", "--ratios", "0.5,0.125", "--codecs", "q8", "--schedules", "decode",
		"--protocols", "query-agnostic", "--recall-contexts", "256", "--depths", "0.3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	r := readRecall(t, dir)
	var got []string
	for _, c := range r.Cells {
		if c.Error != "" || c.N != 2 {
			t.Errorf("%+v", c)
		}
		got = append(got, fmt.Sprintf("%s %g %s %s %s %s %d %g", c.Method, c.Ratio, c.Codec, c.Schedule, c.Protocol, c.Task, c.Context, c.Depth))
	}
	want := []string{
		"full 1 f32 - query-agnostic niah_single 256 0.3", "full 1 f32 - query-agnostic vt 256 -1",
		"streaming 0.5 q8 decode query-agnostic niah_single 256 0.3", "streaming 0.5 q8 decode query-agnostic vt 256 -1",
		"streaming 0.125 q8 decode query-agnostic niah_single 256 0.3", "streaming 0.125 q8 decode query-agnostic vt 256 -1",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("cells\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestEvalRecallMargin: with --margin each cell stops at the first look
// (40, 80, …) where its interval is within the margin, or at --samples;
// the report says so.
func TestEvalRecallMargin(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tok := shared.Path(t, "models/stories260K/tok512.bin")
	dir := t.TempDir()
	report := filepath.Join(dir, "R.md")
	_, errOut, code := kvlm(t, "eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--report", report, "--samples", "90", "--margin", "5",
		"--methods", "streaming", "--tasks", "niah_multikey", "--ratios", "0.25", "--codecs", "f16", "--schedules", "prefill",
		"--protocols", "query-aware", "--recall-contexts", "256")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	r := readRecall(t, dir)
	if len(r.Cells) != 2 || r.Config.Margin != 0.05 || r.Config.N != 90 {
		t.Fatalf("%d cells, margin %g, samples %d", len(r.Cells), r.Config.Margin, r.Config.N)
	}
	stopped := 0
	for _, c := range r.Cells {
		lo, hi := eval.Wilson(c.Correct, c.N, eval.Z95)
		within := (hi-lo)/2 <= 0.05
		if c.N < 90 {
			stopped++
		}
		switch {
		case c.Error != "":
			t.Errorf("%+v", c)
		case c.N == 40 || c.N == 80:
			if !within {
				t.Errorf("%s stopped at %d samples with [%.3f, %.3f]", c.Method, c.N, lo, hi)
			}
		case c.N != 90:
			t.Errorf("%s ran %d samples: not a look, not --samples", c.Method, c.N)
		}
		// The model scores near 0 here: ±5 points holds at the first look.
		if c.Correct == 0 && c.N != 40 {
			t.Errorf("%s: 0 of %d right, yet it did not stop at 40", c.Method, c.N)
		}
	}
	if stopped == 0 {
		t.Error("no cell stopped before --samples: the margin was not exercised")
	}
	md, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "within ±5 points") {
		t.Error("the report does not state the stopping rule")
	}
}

// readRecall reads the recall.json a run wrote to dir.
func readRecall(t *testing.T, dir string) eval.RecallResults {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "recall.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r eval.RecallResults
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestEvalRecallFlags checks that flags the recall suite does not read are
// refused, not ignored, and that recall-data refuses bad input.
func TestEvalRecallFlags(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tok := shared.Path(t, "models/stories260K/tok512.bin")
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--text", "x"}, "--text is not read"},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--seed", "3"}, "--seed is not read"},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--methods", "snapkv,bogus"}, "unknown method"},
		{[]string{"eval", "-m", bin, "--out", dir, "--methods", "snapkv"}, "--methods belongs to --suite recall"},
		{[]string{"eval", "--suite", "nope", "-m", bin, "--out", dir}, "--suite must be"},
		{[]string{"eval", "-m", bin, "--out", dir, "--samples", "3"}, "--samples belongs to --suite recall"},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--samples", "0"}, "--samples must be positive"},
		{[]string{"eval", "-m", bin, "--out", dir, "--ratios", "0.5"}, "--ratios belongs to --suite recall"},
		{[]string{"eval", "-m", bin, "--out", dir, "--recall-contexts", "256"}, "--recall-contexts belongs to --suite recall"},
		{[]string{"eval", "-m", bin, "--out", dir, "--margin", "5"}, "--margin belongs to --suite recall"},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--margin", "-1"}, "--margin -1: want points in [0, 50)"},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--tasks", "vt,nope"}, `--tasks: unknown "nope"`},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--codecs", "q3"}, `--codecs: unknown "q3"`},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--schedules", "own"}, `--schedules: unknown "own"`},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--protocols", "aware"}, `--protocols: unknown "aware"`},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--ratios", "1"}, "--ratios: 1 is not in (0, 1)"},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--depths", "1.5"}, "--depths: 1.5 is not in [0, 1]"},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--recall-contexts", "0"}, "--recall-contexts: 0 is not positive"},
		{[]string{"eval", "--suite", "recall", "-m", bin, "--tokenizer", tok, "--out", dir, "--recall-contexts", "1024"}, "exceeds the model's 512"},
		{[]string{"eval", "recall-data", "--tokenizer", tok, "--task", "niah_single", "--context", "512"}, "needs --depth"},
		{[]string{"eval", "recall-data", "--tokenizer", tok, "--task", "vt", "--context", "512", "--depth", "0.5"}, "--depth is niah_single's"},
		{[]string{"eval", "recall-data", "--tokenizer", tok, "--task", "vt", "--context", "512", "--seed", "4294967295", "--count", "2"}, "straddle"},
		{[]string{"eval", "recall-data", "--tokenizer", tok, "--task", "nope", "--context", "512"}, "unknown task"},
		{[]string{"eval", "recall-data", "--tokenizer", tok, "--task", "vt", "--context", "40"}, "haystack"},
		{[]string{"eval", "recall-data", "--tokenizer", tok, "--task", "vt", "--context", "512", "--haystack", "test"}, "unknown haystack"},
	} {
		_, errOut, code := kvlm(t, c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("%v: exit %d, %q; want an error with %q", c.args, code, errOut, c.want)
		}
	}
	// recall-data's JSON is the suite's sample.
	out, errOut, code := kvlm(t, "eval", "recall-data", "--tokenizer", tok, "--task", "niah_multikey", "--context", "512", "--seed", "4294967296", "--count", "2", "--json")
	if code != 0 {
		t.Fatal(errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines", len(lines))
	}
	var s eval.RecallSample
	if err := json.Unmarshal([]byte(lines[1]), &s); err != nil {
		t.Fatal(err)
	}
	if s.Seed != 1<<32+1 || len(s.Prompt)+len(s.Answer) != 512 || len(s.Parts) != 1 || s.Question <= 0 {
		t.Errorf("sample %+v", s)
	}
	// --haystack train: the same sample but for its story text, which is
	// the train part's (eval.NewRecallVocabFrom with eval.HaystackTrain).
	out, errOut, code = kvlm(t, "eval", "recall-data", "--tokenizer", tok, "--task", "niah_multikey", "--context", "512", "--seed", "4294967297", "--haystack", "train", "--json")
	if code != 0 {
		t.Fatal(errOut)
	}
	var st eval.RecallSample
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	tk, err := loadTokenizer("", tok)
	if err != nil {
		t.Fatal(err)
	}
	v, err := eval.NewRecallVocabFrom(tk, filepath.Dir(shared.Path(t, "data/"+eval.HeldOutFile)), eval.HaystackTrain)
	if err != nil {
		t.Fatal(err)
	}
	want, err := v.Sample(eval.DefaultRecallSpec(), eval.TaskMultiKey, 512, -1, 1<<32+1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Prompt, want.Prompt) || !slices.Equal(st.Answer, s.Answer) || slices.Equal(st.Prompt, s.Prompt) {
		t.Errorf("--haystack train: not the train-haystack sample of the same seed")
	}
}

// TestEvalRecallWords: `kvlm eval recall-words` prints the suite's word
// pool (the words the vocabulary encodes in ≤ 2 tokens, in the suite's
// order, each with its ids), the pool the samples draw from; no
// vocabulary is refused.
func TestEvalRecallWords(t *testing.T) {
	tok := shared.Path(t, "models/stories260K/tok512.bin")
	out, errOut, code := kvlm(t, "eval", "recall-words", "--tokenizer", tok)
	if code != 0 {
		t.Fatal(errOut)
	}
	var got []struct {
		Word string `json:"word"`
		IDs  []int  `json:"ids"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	tk, err := loadTokenizer("", tok)
	if err != nil {
		t.Fatal(err)
	}
	v, err := eval.NewRecallVocab(tk, filepath.Dir(shared.Path(t, "data/"+eval.HeldOutFile)))
	if err != nil {
		t.Fatal(err)
	}
	var words []string
	for _, w := range got {
		words = append(words, w.Word)
		if ids := tk.Encode(w.Word, false, false); !slices.Equal(ids, w.IDs) || len(ids) > 2 {
			t.Errorf("%q: ids %v, the vocabulary encodes it as %v", w.Word, w.IDs, ids)
		}
	}
	if !slices.Equal(words, v.Words()) || len(words) < 12 {
		t.Errorf("pool %v, the suite's %v", words, v.Words())
	}
	if _, errOut, code := kvlm(t, "eval", "recall-words"); code == 0 || !strings.Contains(errOut, "no vocabulary") {
		t.Errorf("no vocabulary: exit %d, %q", code, errOut)
	}
}
