package server

import (
	"testing"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// TestChatPastTheContext: a 3,000-token conversation (stories260K's
// context is 512) through /v1/chat/completions with kv {policy:
// "streaming"} is fed token by token with eviction, as kvlm ppl --stream
// feeds a text, and answers what one sequence fed the same way answers;
// without a window method it is refused with 400.
func TestChatPastTheContext(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	text := storyText(t, 12600)
	msgs := []chat.Message{{Role: "user", Content: text}}
	prompt, err := f.srv.opt.Format.Encode(f.tok, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(prompt) < 3000 {
		t.Fatalf("%d prompt tokens, want 3000 or more", len(prompt))
	}
	const gen = 20
	body := map[string]any{"messages": []map[string]any{{"role": "user", "content": text}}, "max_tokens": gen, "temperature": 0,
		"kv": map[string]any{"policy": "streaming", "window": 60}}
	code, b := f.post(t, "/v1/chat/completions", body)
	if code != 200 {
		t.Fatalf("%d %v", code, b)
	}
	if pt := num(b, "usage", "prompt_tokens"); int(pt) != len(prompt) {
		t.Fatalf("prompt_tokens %v, want %d", pt, len(prompt))
	}
	// The reference: the prompt fed token by token to one sequence.
	cfg, err := policy.Config{Method: "streaming", Window: 60}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	seq, err := f.m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	st, err := policy.New(cfg, seq)
	if err != nil {
		t.Fatal(err)
	}
	seq.SetPolicy(st)
	var logits []float32
	for _, tok := range prompt {
		if logits, err = seq.Forward([]int{tok}, false); err != nil {
			t.Fatal(err)
		}
	}
	ts := NewTextStream(f.tok, prompt[len(prompt)-1], nil)
	want := ""
	stop := f.srv.opt.Format.StopIDs(f.tok)
	for range gen {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		if containsInt(stop, best) {
			break
		}
		s, _ := ts.Add(best)
		want += s
		if logits, err = seq.Forward([]int{best}, false); err != nil {
			t.Fatal(err)
		}
	}
	want += ts.Flush()
	if got := choiceText(b, 0, true); got != want {
		t.Errorf("answer %q\nwant %q (fed token by token in one sequence)", got, want)
	}
	body["kv"] = map[string]any{"policy": "snapkv", "ratio": 0.25}
	if code, b := f.post(t, "/v1/chat/completions", body); code != 400 {
		t.Errorf("snapkv past the context: %d %v, want 400", code, b)
	}
}

func containsInt(x []int, v int) bool {
	for _, y := range x {
		if y == v {
			return true
		}
	}
	return false
}
