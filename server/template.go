package server

import (
	"fmt"
	"strings"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/tokenizer"
)

// ChatFormat turns chat messages into prompt tokens.
type ChatFormat interface {
	Name() string
	// Encode renders msgs, ending with the opening of the assistant's turn.
	Encode(tok tokenizer.Tokenizer, msgs []chat.Message) ([]int, error)
	// Render is the text Encode tokenizes.
	Render(msgs []chat.Message) (string, error)
	// EncodeText tokenizes part of a rendered conversation (special tokens'
	// text becoming those tokens); first: it starts the conversation.
	EncodeText(tok tokenizer.Tokenizer, text string, first bool) []int
	StopIDs(tok tokenizer.Tokenizer) []int // tokens that end the assistant's turn
	Stops() []string                       // texts that end it
}

// PlainName is the template of models that were never trained to chat
// (llama2.c's TinyStories models): every message's content on a line of
// its own, nothing else, so the model continues the text.
const PlainName = "plain"

type plainFormat struct{}

func (plainFormat) Name() string { return PlainName }

func (f plainFormat) Encode(tok tokenizer.Tokenizer, msgs []chat.Message) ([]int, error) {
	text, err := f.Render(msgs)
	if err != nil {
		return nil, err
	}
	return f.EncodeText(tok, text, true), nil
}

func (plainFormat) EncodeText(tok tokenizer.Tokenizer, text string, first bool) []int {
	return tok.Encode(text, first && tokenizer.AddsBOS(tok), false)
}

func (plainFormat) Render(msgs []chat.Message) (string, error) {
	var b strings.Builder
	for _, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant":
		default:
			return "", fmt.Errorf("role %q is not supported (system, user, assistant)", m.Role)
		}
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	return b.String(), nil
}

func (plainFormat) StopIDs(tok tokenizer.Tokenizer) []int { return stopIDs(tok) }
func (plainFormat) Stops() []string                       { return nil }

// stopIDs are EOS, and BOS when it differs (llama2.c's models begin a new
// story with BOS).
func stopIDs(tok tokenizer.Tokenizer) []int {
	var ids []int
	if e := tok.EOS(); e >= 0 {
		ids = append(ids, e)
	}
	if b := tok.BOS(); b >= 0 && b != tok.EOS() {
		ids = append(ids, b)
	}
	return ids
}

type templateFormat struct{ t *chat.Template }

func (f templateFormat) Name() string { return f.t.Name }
func (f templateFormat) Encode(tok tokenizer.Tokenizer, msgs []chat.Message) ([]int, error) {
	return f.t.Encode(tok, msgs, true)
}
func (f templateFormat) Render(msgs []chat.Message) (string, error) { return f.t.Render(msgs, true) }
func (f templateFormat) EncodeText(tok tokenizer.Tokenizer, text string, first bool) []int {
	return tokenizer.EncodeSpecial(tok, text, first && !f.t.WritesBOS && tokenizer.AddsBOS(tok), false)
}
func (f templateFormat) StopIDs(tok tokenizer.Tokenizer) []int { return f.t.StopIDs(tok) }
func (f templateFormat) Stops() []string                       { return f.t.Stops }

// TemplateNames lists what --chat-template accepts.
func TemplateNames() []string { return append([]string{PlainName}, chat.Names()...) }

// ChooseFormat picks the chat format of the model at path: override if
// given (a built-in template name or "plain"); for a GGUF file, its own
// Jinja template (tokenizer.chat_template, rendered as Hugging Face does;
// one that does not parse is an error) or, without one, the built-in
// format its architecture implies (see chat.ForModel);
// for a llama2.c checkpoint, plain (as for a GGUF whose template is
// chat.PlainTemplate, which kvlm convert writes). how says which rule chose.
func ChooseFormat(path string, tok tokenizer.Tokenizer, override string) (f ChatFormat, how string, err error) {
	if strings.EqualFold(strings.TrimSpace(override), PlainName) {
		return plainFormat{}, "override", nil
	}
	isGGUF, err := engine.IsGGUF(path)
	if err != nil {
		return nil, "", err
	}
	if !isGGUF {
		if override == "" {
			return plainFormat{}, "llama2.c checkpoint", nil
		}
		t, _, err := chat.ForModel(chat.Model{Arch: "llama", Tok: tok}, override)
		if err != nil {
			return nil, "", err
		}
		return templateFormat{t}, "override", nil
	}
	g, err := gguf.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer g.Close()
	if override == "" {
		if _, ok := g.Lookup("tokenizer.chat_template"); ok {
			if src, err := g.String("tokenizer.chat_template"); err == nil && chat.IsPlain(src) {
				return plainFormat{}, "chat_template", nil // converted from llama2.c
			}
		}
	}
	t, how, err := chat.FromGGUF(g, tok, override)
	if err != nil {
		return nil, "", err
	}
	return templateFormat{t}, how, nil
}
