package main

import (
	"encoding/json"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
)

// TestQuestionsCommand: kvlm questions serves the questions in its four
// modes and reports what each computed and held: with the document
// compressed once, questions 2…N compute only their question, as with
// full-cache reuse, and hold less KV than full-cache reuse.
func TestQuestionsCommand(t *testing.T) {
	s := storiesFiles(t)
	out, errOut, code := kvlm(t, "questions", "-m", s.bin, "--tokenizer", s.tok, "-f", shared.Path(t, "data/tinystories_valid_head.txt"),
		"--kv-policy", "snapkv", "--kv-ratio", "0.25", "--doc-tokens", "160", "--questions", "3", "--gen", "2", "--reps", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var q questionsJSON
	if err := json.Unmarshal([]byte(out), &q); err != nil {
		t.Fatal(err)
	}
	modes := map[string]questionsMode{}
	for _, m := range q.Modes {
		modes[m.Mode] = m
	}
	none, full, pol, pre := modes["no-reuse"], modes["full-reuse"], modes["policy"], modes["policy-prefix"]
	if none.Computed1 < 160 || none.ComputedRest < 160 {
		t.Errorf("no-reuse computed %v then %v, want whole prompts", none.Computed1, none.ComputedRest)
	}
	// The document is 10 whole blocks: full-cache reuse also computes
	// only the questions.
	if full.ComputedRest >= 40 || pre.ComputedRest != full.ComputedRest {
		t.Errorf("questions 2…N computed %v (full-cache reuse), %v (document compressed once), want the questions alone", full.ComputedRest, pre.ComputedRest)
	}
	if pol.ComputedRest < 160 {
		t.Errorf("policy per question computed %v, want the whole prompt", pol.ComputedRest)
	}
	if pre.EndRest >= full.EndRest || pre.PeakRest >= full.PeakRest || pre.CachedBytes <= 0 {
		t.Errorf("KV bytes of questions 2…N: %v/%v (compressed once) against %v/%v (full-cache reuse), %d cached", pre.PeakRest, pre.EndRest, full.PeakRest, full.EndRest, pre.CachedBytes)
	}
	for _, bad := range [][]string{
		{"--kv-policy", "full"},
		{"--kv-policy", "snapkv", "--questions", "1"},
		{"--kv-policy", "snapkv", "--doc-tokens", "100000"},
	} {
		args := append([]string{"questions", "-m", s.bin, "--tokenizer", s.tok, "-f", shared.Path(t, "data/tinystories_valid_head.txt")}, bad...)
		if _, errOut, code := kvlm(t, args...); code == 0 || errOut == "" {
			t.Errorf("%v: exit %d, %q", bad, code, errOut)
		}
	}
}
