package server

import (
	"fmt"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/tokenizer"
)

// FitTurns renders msgs with f and, while the prompt and room more tokens
// do not fit ctx, drops the oldest whole turn after the system message (a
// user message and the assistant's answer that follows it). It returns the
// prompt's tokens, the messages kept and how many turns were dropped; an
// error when the last message alone, with room, does not fit. It is the
// truncation of kvlm chat --strategy truncate and of a chat request's
// kv.truncate.
func FitTurns(f ChatFormat, tok tokenizer.Tokenizer, msgs []chat.Message, ctx, room int) ([]int, []chat.Message, int, error) {
	dropped := 0
	for {
		ids, err := f.Encode(tok, msgs)
		if err != nil {
			return nil, nil, 0, err
		}
		if len(ids)+room <= ctx {
			return ids, msgs, dropped, nil
		}
		first := 0
		if len(msgs) > 0 && msgs[0].Role == "system" {
			first = 1
		}
		if len(msgs)-first <= 1 {
			return nil, nil, 0, fmt.Errorf("this message is %d tokens; with room for a reply (%d) it does not fit the context of %d", len(ids), room, ctx)
		}
		k := 1
		if first+1 < len(msgs)-1 && msgs[first+1].Role == "assistant" {
			k = 2
		}
		msgs = append(msgs[:first:first], msgs[first+k:]...)
		dropped++
	}
}
