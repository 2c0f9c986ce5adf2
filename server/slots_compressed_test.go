package server

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/policy"
)

// TestSlotFilesCompressed: a completion under a policy (h2o, q8 keys, q4
// values) keeps its compressed sequence in kv.slot; it is saved over
// HTTP, another server restores the file, and a completion whose prompt
// is the slot's tokens with the same kv settings starts from it
// (compressed_tokens: all of them, none computed) and answers what the
// uninterrupted request generated after them.
func TestSlotFilesCompressed(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, engine.Config{}, Options{SlotDir: dir})
	prompt := f.tok.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big red ball.", true, false)
	const M, N = 8, 10
	kv := map[string]any{"policy": "h2o", "budget": 24, "type_k": "q8", "type_v": "q4"}
	// The uninterrupted request, its tokens from the engine.
	h, err := f.srv.Engine().Submit(engine.GenRequest{Prompt: prompt, MaxTokens: M + N, K: "q8", V: "q4", Policy: policy.Config{Method: "h2o", Budget: 24}})
	if err != nil {
		t.Fatal(err)
	}
	var all []int
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		ev, err := h.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Done {
			break
		}
		all = append(all, ev.Token)
	}
	if len(all) != M+N {
		t.Fatalf("%d tokens", len(all))
	}
	withSlot := map[string]any{"slot": 3}
	for k, v := range kv {
		withSlot[k] = v
	}
	if code, b := f.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": M, "temperature": 0, "kv": withSlot}); code != 200 {
		t.Fatalf("%d %v", code, b)
	}
	code, b := f.post(t, "/v1/slots/3?action=save", map[string]any{"filename": "h2o.slot"})
	if code != 200 || int(num(b, "n_saved")) != len(prompt)+M-1 {
		t.Fatalf("save: %d %v", code, b)
	}
	g := newFixture(t, engine.Config{}, Options{SlotDir: dir})
	if code, b := g.post(t, "/v1/slots/0?action=restore", map[string]any{"filename": "h2o.slot"}); code != 200 {
		t.Fatalf("restore: %d %v", code, b)
	}
	next := slices.Concat(prompt, all[:M-1])
	code, b = g.post(t, "/v1/completions", map[string]any{"prompt": next, "max_tokens": N + 1, "temperature": 0, "kv": kv})
	if code != 200 {
		t.Fatalf("%d %v", code, b)
	}
	if c, k := num(b, "usage", "kv", "computed_tokens"), num(b, "usage", "kv", "compressed_tokens"); c != 0 || int(k) != len(next) {
		t.Errorf("continuation: computed %v, from the slot %v of %d", c, k, len(next))
	}
	ts := NewTextStream(f.tok, next[len(next)-1], nil)
	want := ""
	for _, id := range all[M-1:] {
		s, _ := ts.Add(id)
		want += s
	}
	want += ts.Flush()
	if got := choiceText(b, 0, false); got != want {
		t.Errorf("continuation %q\nwant %q (the uninterrupted request)", got, want)
	}
	// A policy whose state a slot cannot keep is refused.
	if code, b := f.post(t, "/v1/completions", map[string]any{"prompt": "a", "max_tokens": 2, "kv": map[string]any{"policy": "pyramidinfer", "slot": 4}}); code != 400 {
		t.Errorf("pyramidinfer slot: %d %v", code, b)
	}
	f.post(t, "/v1/slots/3?action=erase", nil)
	g.post(t, "/v1/slots/0?action=erase", nil)
	waitFree(t, f.srv.Engine())
	waitFree(t, g.srv.Engine())
}
