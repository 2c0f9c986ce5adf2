package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/engine"
)

// TestFitTurns: the oldest whole turns after the system message go
// first, one user message and its answer at a time, until the prompt and
// the room fit; the last message is never dropped.
func TestFitTurns(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	long := strings.Repeat("The cat sat on the mat. ", 12) // about 80 tokens
	sys := chat.Message{Role: "system", Content: "You tell stories."}
	turn := func(i int) []chat.Message {
		return []chat.Message{{Role: "user", Content: fmt.Sprintf("Turn %d. %s", i, long)}, {Role: "assistant", Content: long}}
	}
	var conv []chat.Message
	for i := range 5 {
		conv = append(conv, turn(i)...)
	}
	last := chat.Message{Role: "user", Content: "And then?"}
	// want is the fewest whole turns (pairs) of conv to drop for the
	// prompt and room to fit ctx, counted by rendering each candidate.
	want := func(head []chat.Message, ctx, room int) int {
		for d := 0; d <= 5; d++ {
			msgs := append(append(append([]chat.Message{}, head...), conv[2*d:]...), last)
			ids, _ := f.srv.opt.Format.Encode(f.tok, msgs)
			if len(ids)+room <= ctx {
				return d
			}
		}
		return -1
	}
	sysDrop, roomDrop, bareDrop := want([]chat.Message{sys}, 512, 16), want([]chat.Message{sys}, 512, 128), want(nil, 512, 16)
	if sysDrop < 1 || roomDrop < sysDrop || bareDrop < 1 {
		t.Fatalf("the conversation does not exercise truncation: %d %d %d turns to drop", sysDrop, roomDrop, bareDrop)
	}
	for _, c := range []struct {
		name    string
		msgs    []chat.Message
		ctx     int
		room    int
		dropped int
		first   string // the first message kept
		err     bool
	}{
		{"fits", append([]chat.Message{sys}, last), 512, 16, 0, sys.Content, false},
		{"system kept", append(append([]chat.Message{sys}, conv...), last), 512, 16, sysDrop, sys.Content, false},
		{"more room", append(append([]chat.Message{sys}, conv...), last), 512, 128, roomDrop, sys.Content, false},
		{"no system", append(append([]chat.Message{}, conv...), last), 512, 16, bareDrop, conv[2*bareDrop].Content, false},
		{"user messages without answers go one by one", []chat.Message{{Role: "user", Content: "a"}, {Role: "user", Content: long}, last}, 90, 16, 2, last.Content, false},
		{"the last message does not fit", []chat.Message{sys, {Role: "user", Content: strings.Repeat(long, 8)}}, 512, 16, 0, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ids, kept, dropped, err := FitTurns(f.srv.opt.Format, f.tok, c.msgs, c.ctx, c.room)
			if c.err {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if dropped != c.dropped || kept[0].Content != c.first || kept[len(kept)-1] != last {
				t.Fatalf("dropped %d (want %d), first kept %.20q (want %.20q)", dropped, c.dropped, kept[0].Content, c.first)
			}
			if len(ids)+c.room > c.ctx {
				t.Fatalf("%d tokens + %d do not fit %d", len(ids), c.room, c.ctx)
			}
		})
	}
}

// TestChatTruncate: kv.truncate drops the oldest whole turns of a chat
// that does not fit, keeping the system message, and answers what the
// conversation with those turns left out answers; without it the chat is
// refused, and completions take no kv.truncate.
func TestChatTruncate(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	long := strings.Repeat("The cat sat on the mat. ", 12)
	msgs := []map[string]any{{"role": "system", "content": "You tell stories."}}
	for i := range 5 {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("Turn %d. %s", i, long)}, map[string]any{"role": "assistant", "content": long})
	}
	msgs = append(msgs, map[string]any{"role": "user", "content": "And then?"})
	body := map[string]any{"messages": msgs, "max_tokens": 16, "temperature": 0}
	if code, b := f.post(t, "/v1/chat/completions", body); code != 400 {
		t.Fatalf("too long without kv.truncate: %d %v", code, b)
	}
	body["kv"] = map[string]any{"truncate": true}
	code, b := f.post(t, "/v1/chat/completions", body)
	if code != 200 {
		t.Fatalf("%d %v", code, b)
	}
	dropped := int(num(b, "usage", "kv", "dropped_turns"))
	if dropped == 0 || num(b, "usage", "prompt_tokens")+16 > float64(f.m.CtxLen) {
		t.Fatalf("dropped %d turns, %v prompt tokens", dropped, num(b, "usage", "prompt_tokens"))
	}
	// The same conversation with those turns left out, sent as it is.
	short := append([]map[string]any{msgs[0]}, msgs[1+2*dropped:]...)
	code, c := f.post(t, "/v1/chat/completions", map[string]any{"messages": short, "max_tokens": 16, "temperature": 0})
	if code != 200 || num(c, "usage", "prompt_tokens") != num(b, "usage", "prompt_tokens") || choiceText(c, 0, true) != choiceText(b, 0, true) {
		t.Errorf("the truncated conversation sent as it is: %d %v, want %v", code, c, b)
	}
	// One turn fewer dropped does not fit.
	more := append([]map[string]any{msgs[0]}, msgs[1+2*(dropped-1):]...)
	if code, _ := f.post(t, "/v1/chat/completions", map[string]any{"messages": more, "max_tokens": 16}); code != 400 {
		t.Errorf("with one turn fewer dropped: %d, want 400 (it does not fit)", code)
	}
	if code, _ := f.post(t, "/v1/completions", map[string]any{"prompt": "x", "kv": map[string]any{"truncate": true}}); code != 400 {
		t.Errorf("completions with kv.truncate: %d, want 400", code)
	}
}
