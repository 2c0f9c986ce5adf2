package engine

import "testing"

// TestEngineKeyShift: with KeyShiftPrompt, pools of q8/q4 keys store them
// around the model's mean keys; float and KIVI pools, and engines without
// the prompt, do not. A request on a shifted pool still generates.
func TestEngineKeyShift(t *testing.T) {
	m, tok := loadStories(t)
	for _, c := range []struct {
		k      string
		prompt []int
		want   bool
	}{
		{"q8", []int{tok.BOS()}, true},
		{"q4", []int{tok.BOS()}, true},
		{"q8", nil, false},
		{"f16", []int{tok.BOS()}, false},
		{"kivi4", []int{tok.BOS()}, false},
	} {
		e := newEngine(t, m, Config{K: c.k, V: "f32", KeyShiftPrompt: c.prompt})
		if got := e.defPool.KeyShifted(); got != c.want {
			t.Errorf("K %s prompt %v: key shift %v, want %v", c.k, c.prompt, got, c.want)
		}
	}
	e := newEngine(t, m, Config{K: "q8", V: "q8", KeyShiftPrompt: []int{tok.BOS()}})
	h, err := e.Submit(GenRequest{Prompt: tok.Encode("Once upon a time", true, false), MaxTokens: 20})
	if err != nil {
		t.Fatal(err)
	}
	if out := collect(t, h); len(out.tokens[0]) != 20 {
		t.Fatalf("generated %d tokens, want 20", len(out.tokens[0]))
	}
	checkFree(t, e)
}
