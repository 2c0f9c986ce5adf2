package server

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/internal/scripted"
	"github.com/kvlm/kvlm/tokenizer"
)

// scriptedModel writes a scripted model (internal/scripted) to a temporary
// file.
func scriptedModel(t *testing.T, template, after string, script []string, specials []string, eos string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scripted.gguf")
	if err := scripted.Write(path, scripted.Spec{Template: template, After: after, Script: script, Specials: specials, EOS: eos}); err != nil {
		t.Fatal(err)
	}
	return path
}

// toolFixture serves a scripted model with its template as the chat format.
func toolFixture(t *testing.T, path string) *fixture {
	t.Helper()
	m, tok, err := engine.Load(path, "")
	if err != nil {
		t.Fatal(err)
	}
	f, how, err := ChooseFormat(path, tok, "")
	if err != nil || how != "chat_template" {
		t.Fatalf("format %v by %s: %v", f, how, err)
	}
	return serveFixture(t, m, tok, engine.Config{}, Options{ModelName: "scripted", Format: f})
}

func corpusTemplate(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "chat", "testdata", "templates", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var weatherTool = []map[string]any{{"type": "function", "function": map[string]any{
	"name": "get_weather", "description": "The weather in a city.",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}}}}

// TestToolCalls: a model that writes tool calls in its template's syntax
// (Qwen 2.5's hermes blocks; Mistral Nemo's [TOOL_CALLS], a control
// token, then a JSON list) is answered with tool_calls and finish_reason
// "tool_calls", whole and streamed; parallel_tool_calls false keeps the
// first; tool_choice "none" leaves the reply as text; a reply without a
// call is text.
func TestToolCalls(t *testing.T) {
	call := func(city string) string {
		return `{"name": "get_weather", "arguments": {"city": "` + city + `"}}`
	}
	qwen := corpusTemplate(t, "Qwen-Qwen2.5-7B-Instruct.jinja")
	qwenSpecials := []string{"<|im_start|>", "<|im_end|>", "<|endoftext|>"}
	cases := []struct {
		name     string
		template string
		after    string
		script   []string
		specials []string
		eos      string
		req      map[string]any
		content  any      // nil: null
		calls    []string // name(arguments) of each call
		finish   string
	}{
		{"hermes", qwen, "\n", []string{"<tool_call>\n" + call("Paris") + "\n</tool_call>"}, qwenSpecials, "<|im_end|>",
			nil, nil, []string{`get_weather({"city":"Paris"})`}, "tool_calls"},
		{"hermes two, text", qwen, "\n", []string{"Checking both.", "\n<tool_call>\n" + call("Paris") + "\n</tool_call>", "\n<tool_call>\n" + call("Oslo") + "\n</tool_call>"},
			qwenSpecials, "<|im_end|>", nil, "Checking both.", []string{`get_weather({"city":"Paris"})`, `get_weather({"city":"Oslo"})`}, "tool_calls"},
		{"parallel off", qwen, "\n", []string{"<tool_call>\n" + call("Paris") + "\n</tool_call>", "\n<tool_call>\n" + call("Oslo") + "\n</tool_call>"},
			qwenSpecials, "<|im_end|>", map[string]any{"parallel_tool_calls": false}, nil, []string{`get_weather({"city":"Paris"})`}, "tool_calls"},
		{"tool_choice none", qwen, "\n", []string{"<tool_call>\n" + call("Paris") + "\n</tool_call>"}, qwenSpecials, "<|im_end|>",
			map[string]any{"tool_choice": "none"}, "<tool_call>\n" + call("Paris") + "\n</tool_call>", nil, "stop"},
		{"text", qwen, "\n", []string{"It is sunny."}, qwenSpecials, "<|im_end|>", nil, "It is sunny.", nil, "stop"},
		{"mistral control token", corpusTemplate(t, "mistralai-Mistral-Nemo-Instruct-2407.jinja"), "[/INST]",
			[]string{"![TOOL_CALLS]", `[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123xyz"}]`},
			[]string{"<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"}, "</s>",
			nil, nil, []string{`get_weather({"city":"Paris"})#abc123xyz`}, "tool_calls"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := toolFixture(t, scriptedModel(t, c.template, c.after, c.script, c.specials, c.eos))
			req := map[string]any{"messages": []map[string]any{{"role": "user", "content": "Weather in Paris?"}},
				"tools": weatherTool, "max_tokens": 8, "temperature": 0}
			for k, v := range c.req {
				req[k] = v
			}
			code, body := f.post(t, "/v1/chat/completions", req)
			if code != 200 {
				t.Fatalf("%d %v", code, body)
			}
			ch := body["choices"].([]any)[0].(map[string]any)
			msg := ch["message"].(map[string]any)
			if ch["finish_reason"] != c.finish || msg["content"] != c.content {
				t.Fatalf("finish %v content %q, want %v %q (%v)", ch["finish_reason"], msg["content"], c.finish, c.content, body)
			}
			got := callsOf(t, msg["tool_calls"], false)
			if strings.Join(got, ";") != strings.Join(c.calls, ";") {
				t.Fatalf("calls %v, want %v", got, c.calls)
			}
			// Streamed: the same reply, held back until it ends.
			chunks := f.stream(t, "/v1/chat/completions", req)
			var text strings.Builder
			var sgot []string
			finish := ""
			for _, k := range chunks {
				for _, chc := range k["choices"].([]any) {
					chc := chc.(map[string]any)
					d := chc["delta"].(map[string]any)
					if s, ok := d["content"].(string); ok {
						text.WriteString(s)
					}
					sgot = append(sgot, callsOf(t, d["tool_calls"], true)...)
					if fr, ok := chc["finish_reason"].(string); ok {
						finish = fr
					}
				}
			}
			want := ""
			if s, ok := c.content.(string); ok {
				want = s
			}
			if text.String() != want || finish != c.finish || strings.Join(sgot, ";") != strings.Join(c.calls, ";") {
				t.Fatalf("stream: content %q calls %v finish %q, want %q %v %q", text.String(), sgot, finish, want, c.calls, c.finish)
			}
		})
	}
}

// callsOf reads tool_calls as name(arguments)[#id when the model wrote it];
// in a stream each has its index in order.
func callsOf(t *testing.T, v any, stream bool) []string {
	t.Helper()
	if v == nil {
		return nil
	}
	var out []string
	for i, c := range v.([]any) {
		c := c.(map[string]any)
		fn := c["function"].(map[string]any)
		id, _ := c["id"].(string)
		if c["type"] != "function" || id == "" {
			t.Fatalf("call %v", c)
		}
		if stream && c["index"] != float64(i) {
			t.Fatalf("stream call %d has index %v", i, c["index"])
		}
		s := fn["name"].(string) + "(" + fn["arguments"].(string) + ")"
		if !strings.HasPrefix(id, "call_") {
			s += "#" + id
		}
		out = append(out, s)
	}
	return out
}

// TestToolConversation: a conversation with an assistant's tool call and
// the tool's result renders through the model's template exactly as the
// template renders the same JSON (the prompt's token count), and bad tool
// requests are refused with the field named.
func TestToolConversation(t *testing.T) {
	qwen := corpusTemplate(t, "Qwen-Qwen2.5-7B-Instruct.jinja")
	path := scriptedModel(t, qwen, "\n", []string{"It is 22 degrees."}, []string{"<|im_start|>", "<|im_end|>", "<|endoftext|>"}, "<|im_end|>")
	f := toolFixture(t, path)
	history := []map[string]any{
		{"role": "user", "content": "Weather in Paris?"},
		{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": "call_1", "type": "function",
			"function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris"}`}}}},
		{"role": "tool", "tool_call_id": "call_1", "content": `{"temperature": 22}`},
	}
	code, body := f.post(t, "/v1/chat/completions", map[string]any{"messages": history, "tools": weatherTool, "max_tokens": 8})
	if code != 200 {
		t.Fatalf("%d %v", code, body)
	}
	// What the template renders for the same conversation, arguments as an
	// object (as transformers passes them).
	tm, err := chat.FromJinja(qwen, "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	want, err := tm.RenderJSON([]byte(`[{"role": "user", "content": "Weather in Paris?"},
		{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
		{"role": "tool", "content": "{\"temperature\": 22}", "tool_call_id": "call_1"}]`), mustJSON(t, weatherTool), true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(want, `<tool_call>`) || !strings.Contains(want, "<tool_response>") || !strings.Contains(want, "get_weather") {
		t.Fatalf("the template rendered %q", want)
	}
	if n := len(tokenizer.EncodeSpecial(f.tok, want, false, false)); body["usage"].(map[string]any)["prompt_tokens"] != float64(n) {
		t.Fatalf("prompt_tokens %v, want %d (the rendering of %q)", body["usage"].(map[string]any)["prompt_tokens"], n, want)
	}
	msg := body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	if msg["content"] != "It is 22 degrees." {
		t.Fatalf("content %v", msg["content"])
	}

	bad := []struct {
		name  string
		req   map[string]any
		field string
		msg   string
	}{
		{"tools not a list", map[string]any{"tools": map[string]any{"x": 1}}, "tools", "must be an array"},
		{"tool type", map[string]any{"tools": []map[string]any{{"type": "code", "function": map[string]any{"name": "f"}}}}, "tools[0].type", `must be "function"`},
		{"tool name", map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "a b"}}}}, "tools[0].function.name", "letters, digits"},
		{"tool unknown key", map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "f", "x": 1}}}}, "tools[0].function", "optionally description"},
		{"strict", map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "f", "strict": true}}}}, "tools[0].function.strict", "constrained decoding"},
		{"required", map[string]any{"tools": weatherTool, "tool_choice": "required"}, "tool_choice", "constrained decoding"},
		{"named", map[string]any{"tools": weatherTool, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}}, "tool_choice", "constrained decoding"},
		{"choice word", map[string]any{"tools": weatherTool, "tool_choice": "always"}, "tool_choice", `"auto" or "none"`},
		{"bad arguments", map[string]any{"messages": []map[string]any{{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": []map[string]any{{"id": "c", "type": "function",
			"function": map[string]any{"name": "f", "arguments": "[1]"}}}}}}, "messages[1].tool_calls[0].function.arguments", "JSON object"},
		{"tool_calls on user", map[string]any{"messages": []map[string]any{{"role": "user", "content": "x", "tool_calls": []map[string]any{}}, {"role": "tool", "content": "y"}}}, "messages[0].tool_calls", "only an assistant"},
		{"truncate", map[string]any{"tools": weatherTool, "kv": map[string]any{"truncate": true}}, "kv.truncate", "tools"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			req := map[string]any{"messages": []map[string]any{{"role": "user", "content": "x"}}, "max_tokens": 2}
			for k, v := range c.req {
				req[k] = v
			}
			code, body := f.post(t, "/v1/chat/completions", req)
			e, _ := body["error"].(map[string]any)
			if code != 400 || e == nil || e["param"] != c.field || !strings.Contains(e["message"].(string), c.msg) {
				t.Fatalf("%d %v, want 400 on %s (%q)", code, body, c.field, c.msg)
			}
		})
	}
}

// TestToolsRefused: a format that renders no tools (a built-in one, or a
// Jinja template whose calls kvlm cannot read) refuses tools and tool
// messages with a clear error rather than dropping them.
func TestToolsRefused(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{}) // plain format
	code, body := f.post(t, "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "x"}}, "tools": weatherTool})
	if code != 400 || !strings.Contains(body["error"].(map[string]any)["message"].(string), "renders no tools") {
		t.Fatalf("%d %v", code, body)
	}
	code, body = f.post(t, "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "tool", "content": "x", "tool_call_id": "c"}}})
	if code != 400 || body["error"].(map[string]any)["param"] != "messages" {
		t.Fatalf("%d %v", code, body)
	}
	// An empty list is no tools.
	code, body = f.post(t, "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "x"}}, "tools": []any{}, "max_tokens": 2})
	if code != 200 {
		t.Fatalf("%d %v", code, body)
	}
	// DeepSeek V3.1's template renders calls in a syntax kvlm does not read.
	tm, err := chat.FromJinja(corpusTemplate(t, "deepseek-ai-DeepSeek-V3.1.jinja"), "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	f = newFixture(t, engine.Config{}, Options{Format: templateFormat{tm}})
	code, body = f.post(t, "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "x"}}, "tools": weatherTool})
	if code != 400 || !strings.Contains(body["error"].(map[string]any)["message"].(string), "does not read") {
		t.Fatalf("%d %v", code, body)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
