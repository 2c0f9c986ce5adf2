package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// JinjaName is the name of a template that renders a model's own Jinja chat
// template (a GGUF's tokenizer.chat_template).
const JinjaName = "chat_template"

// endOfTurn are the texts of the special tokens that end a model's turn in
// the common chat formats; a model template's Stops are those its source
// writes (with EOS).
var endOfTurn = []string{"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<turn|>", "<|endoftext|>",
	"<|end_of_text|>", "<｜end▁of▁sentence｜>", "<|return|>", "<|call|>", "<|assistant_end|>"}

// FromJinja compiles src, a model's Jinja chat template, into a Template
// that renders it as Hugging Face's apply_chat_template does (see
// applyJinja). bos and eos are the texts of the vocabulary's BOS and EOS
// tokens ("" for none); the template's Stops are EOS and the end-of-turn
// tokens its source writes. A template that does not parse is an error.
func FromJinja(src, bos, eos string) (*Template, error) {
	tm, err := compileJinja(src)
	if err != nil {
		return nil, fmt.Errorf("chat: the model's chat template (tokenizer.chat_template) does not parse: %v; name a built-in format with --chat-template (%s)",
			err, strings.Join(Names(), ", "))
	}
	t := &Template{Name: JinjaName, BOS: bos, EOS: eos, WritesBOS: true, render: renderJinja, jinja: tm}
	if eos != "" {
		t.Stops = append(t.Stops, eos)
	}
	for _, s := range endOfTurn {
		if strings.Contains(src, s) && !slices.Contains(t.Stops, s) {
			t.Stops = append(t.Stops, s)
		}
	}
	if strings.Contains(src, "tool") {
		t.tools, t.toolTag = t.detectToolSyntax()
	}
	return t, nil
}

// compileJinja parses src, turning a panic of the engine into an error.
func compileJinja(src string) (tm *jinja.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			tm, err = nil, fmt.Errorf("the Jinja engine failed: %v", r)
		}
	}()
	return jinja.Compile(renameToJSON(src))
}

// renderJinja renders msgs, each as {"role": …, "content": …}, with no tools.
func renderJinja(t *Template, msgs []Message, gen bool) (string, error) {
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Content))
		list[i] = d
	}
	return t.applyJinja(jinja.NewList(list), jinja.None(), gen)
}

// raised is the error of a template's raise_exception(message).
type raised struct{ msg string }

func (r raised) Error() string { return r.msg }

// applyJinja renders the template with the variables transformers'
// apply_chat_template passes (messages, tools — none without tools —,
// documents (none), add_generation_prompt, bos_token and eos_token, none
// where the vocabulary has no such token) and the globals it defines:
// raise_exception(message), which fails the rendering with message, and
// strftime_now(format), Python's strftime of the time t.Now gives (time.Now
// if nil). Its environment renders with trim_blocks and lstrip_blocks, as
// the engine always does. tojson is Hugging Face's (json.dumps with its
// options, ensure_ascii=False by default: hfToJSON, the filter renamed in
// the source by compileJinja, chat/tojson.go).
func (t *Template) applyJinja(messages, tools jinja.Value, gen bool) (out string, err error) {
	str := func(s string) jinja.Value {
		if s == "" {
			return jinja.None()
		}
		return jinja.NewString(s)
	}
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	vars := map[string]jinja.Value{
		"messages":              messages,
		"tools":                 tools,
		"documents":             jinja.None(),
		"add_generation_prompt": jinja.NewBool(gen),
		"bos_token":             str(t.BOS),
		"eos_token":             str(t.EOS),
		"raise_exception": jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
			if len(args) != 1 || !args[0].IsString() {
				return jinja.Undefined(), errors.New("raise_exception takes one string")
			}
			return jinja.Undefined(), raised{args[0].AsString()}
		}),
		tojsonName: jinja.NewCallable("tojson", hfToJSON),
		"strftime_now": jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
			if len(args) != 1 || !args[0].IsString() {
				return jinja.Undefined(), errors.New("strftime_now takes one format string")
			}
			s, err := strftime(now(), args[0].AsString())
			return jinja.NewString(s), err
		}),
	}
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chat: the Jinja engine failed on the model's chat template: %v", r)
		}
	}()
	out, err = t.jinja.RenderValues(vars)
	var r raised
	switch {
	case errors.As(err, &r):
		return "", fmt.Errorf("chat: the model's chat template refuses the conversation: %s", r.msg)
	case err != nil:
		return "", fmt.Errorf("chat: the model's chat template fails to render: %v", err)
	}
	return out, nil
}

// applyJSON renders the template over messages and tools given as JSON
// arrays (the forms the OpenAI API and Hugging Face take, tool_calls and
// all), object keys in their order; tools nil or "null" for none.
func (t *Template) applyJSON(messages, tools []byte, gen bool) (string, error) {
	if t.jinja == nil {
		return "", fmt.Errorf("chat: %s is a built-in format, not a Jinja template", t.Name)
	}
	msgs, err := jsonValue(messages)
	if err != nil {
		return "", fmt.Errorf("chat: messages: %v", err)
	}
	tv := jinja.None()
	if len(bytes.TrimSpace(tools)) > 0 {
		if tv, err = jsonValue(tools); err != nil {
			return "", fmt.Errorf("chat: tools: %v", err)
		}
	}
	return t.applyJinja(msgs, tv, gen)
}

// jsonValue decodes one JSON value into the engine's values, keeping the
// order of object keys (as Python's json.loads does, which tojson and
// dict iteration then follow); integers stay integers.
func jsonValue(data []byte) (jinja.Value, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d, 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := d.Token(); err == nil {
		return jinja.Undefined(), errors.New("more than one JSON value")
	}
	return v, nil
}

// maxJSONDepth bounds the nesting decodeValue follows.
const maxJSONDepth = 64

func decodeValue(d *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), fmt.Errorf("JSON nested deeper than %d", maxJSONDepth)
	}
	tok, err := d.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch tok := tok.(type) {
	case json.Delim:
		if tok == '[' {
			var items []jinja.Value
			for d.More() {
				v, err := decodeValue(d, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			_, err := d.Token() // ]
			return jinja.NewList(items), err
		}
		obj := jinja.NewDict()
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return jinja.Undefined(), err
			}
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return jinja.Undefined(), err
			}
			obj.AsDict().Set(k.(string), v)
		}
		_, err := d.Token() // }
		return obj, err
	case nil:
		return jinja.None(), nil
	default: // bool, string, json.Number
		return jinja.FromGoValue(tok), nil
	}
}

// strftime is Python's datetime.strftime (on glibc) for the directives
// chat templates use: %a %A %b %B %d %e %H %I %j %m %M %p %S %y %Y %%,
// and glibc's "-" flag (no padding) on the numeric ones. Any other
// directive is an error rather than a guess.
func strftime(t time.Time, format string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		pad := true
		if i < len(format) && format[i] == '-' {
			pad = false
			i++
		}
		if i >= len(format) {
			return "", fmt.Errorf("strftime_now: format %q ends inside a directive", format)
		}
		num := func(n, width int) {
			if pad {
				fmt.Fprintf(&b, "%0*d", width, n)
			} else {
				fmt.Fprintf(&b, "%d", n)
			}
		}
		hour12 := t.Hour() % 12
		if hour12 == 0 {
			hour12 = 12
		}
		switch format[i] {
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'd':
			num(t.Day(), 2)
		case 'e':
			if pad {
				fmt.Fprintf(&b, "%2d", t.Day())
			} else {
				num(t.Day(), 1)
			}
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			num(hour12, 2)
		case 'j':
			num(t.YearDay(), 3)
		case 'm':
			num(int(t.Month()), 2)
		case 'M':
			num(t.Minute(), 2)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'S':
			num(t.Second(), 2)
		case 'y':
			num(t.Year()%100, 2)
		case 'Y':
			num(t.Year(), 4)
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("strftime_now: directive %%%c is not supported (supported: %%a %%A %%b %%B %%d %%e %%H %%I %%j %%m %%M %%p %%S %%y %%Y %%%%)", format[i])
		}
	}
	return b.String(), nil
}
