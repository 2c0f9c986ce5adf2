package chat

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// corpusToolSyntax is the syntax each template of the corpus writes tool
// calls in, as read from its source; templates not listed write none kvlm
// reads (DeepSeek's, Kimi's, gpt-oss's, Gemma 4's, Cohere's, …) or none.
var corpusToolSyntax = map[string]ToolSyntax{
	"Bielik-11B-v3.0-Instruct.jinja":                      ToolsHermes,
	"MiMo-VL.jinja":                                       ToolsHermes,
	"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ToolsHermes,
	"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja":   ToolsHermes,
	"Qwen-QwQ-32B.jinja":                                  ToolsHermes,
	"Qwen-Qwen2.5-7B-Instruct.jinja":                      ToolsHermes,
	"Qwen-Qwen3-0.6B.jinja":                               ToolsHermes,
	"Reka-Edge.jinja":                                     ToolsHermes,
	"ibm-granite-granite-4.0.jinja":                       ToolsHermes,
	"ibm-granite-granite-4.1.jinja":                       ToolsHermes,
	"ByteDance-Seed-OSS.jinja":                            ToolsXML,
	"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja":           ToolsXML,
	"Qwen3-Coder.jinja":                                   ToolsXML,
	"Qwen3.5-4B.jinja":                                    ToolsXML,
	"StepFun3.5-Flash.jinja":                              ToolsXML,
	"GLM-4.6.jinja":                                       ToolsGLM,
	"GLM-4.7-Flash.jinja":                                 ToolsGLM,
	"Mistral-Small-3.2-24B-Instruct-2506.jinja":           ToolsMistral,
	"mistralai-Ministral-3-14B-Reasoning-2512.jinja":      ToolsMistral,
	"mistralai-Mistral-Nemo-Instruct-2407.jinja":          ToolsMistral,
	"unsloth-mistral-Devstral-Small-2507.jinja":           ToolsMistral,
	"meta-llama-Llama-3.1-8B-Instruct.jinja":              ToolsLlama3,
	"meta-llama-Llama-3.2-3B-Instruct.jinja":              ToolsLlama3,
	"meta-llama-Llama-3.3-70B-Instruct.jinja":             ToolsLlama3,
	"Apriel-1.6-15b-Thinker-fixed.jinja":                  ToolsJSONList,
	"unsloth-Apriel-1.5.jinja":                            ToolsJSONList,
	"NVIDIA-Nemotron-Nano-v2.jinja":                       ToolsJSONList,
}

// toolStart is where a call in syn begins in a reply.
func toolStart(syn ToolSyntax, tag string) string {
	switch syn {
	case ToolsMistral:
		return "[TOOL_CALLS]"
	case ToolsLlama3:
		return `{"name"`
	case ToolsXML, ToolsJSONList:
		return "<" + tag + ">"
	}
	return "<tool_call>"
}

// TestToolSyntaxCorpus: each template of the corpus is found to write the
// tool-call syntax listed for it, and the assistant turn Jinja2 rendered
// for the corpus's tool-call conversation (testdata/rendered.json: a call
// of get_weather with city Paris and unit celsius), cut where the model's
// reply would start and end (the syntax's first mark, the template's
// first stop), parses back to that call.
func TestToolSyntaxCorpus(t *testing.T) {
	var spec corpusSpec
	var want corpusRendered
	readJSON(t, "testdata/conversations.json", &spec)
	readJSON(t, "testdata/rendered.json", &want)
	files, err := filepath.Glob("testdata/templates/*.jinja")
	if err != nil || len(files) < 50 {
		t.Fatalf("%d templates (%v)", len(files), err)
	}
	rendered := map[string]string{}
	for _, c := range want.Cases {
		if c.Conversation == "tool-call" && c.Output != nil {
			rendered[c.Template] = *c.Output
		}
	}
	found := 0
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(strings.TrimSuffix(name, ".jinja"), func(t *testing.T) {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			tm, err := FromJinja(string(src), spec.BOS, spec.EOS)
			if err != nil {
				if _, listed := corpusToolSyntax[name]; listed {
					t.Fatal(err)
				}
				return
			}
			if tm.ToolSyntax() != corpusToolSyntax[name] {
				t.Fatalf("syntax %q, want %q", tm.ToolSyntax(), corpusToolSyntax[name])
			}
			if tm.ToolSyntax() == "" {
				return
			}
			found++
			out, ok := rendered[name]
			if !ok {
				t.Fatal("Jinja2 rendered no tool-call conversation")
			}
			out = out[strings.LastIndex(out, "What is the weather in Paris?"):]
			i := strings.LastIndex(out, toolStart(tm.ToolSyntax(), tm.toolTag))
			if i < 0 {
				t.Fatalf("no %q in %q", toolStart(tm.ToolSyntax(), tm.toolTag), out)
			}
			reply := out[i:]
			for _, s := range tm.Stops {
				if j := strings.Index(reply, s); j >= 0 {
					reply = reply[:j]
				}
			}
			content, calls, err := tm.ParseToolCalls(reply, spec.Tools)
			if err != nil || len(calls) != 1 || calls[0].Name != "get_weather" || calls[0].Arguments != `{"city":"Paris","unit":"celsius"}` {
				t.Fatalf("reply %q: content %q, calls %+v (%v)", reply, content, calls, err)
			}
		})
	}
	if found != len(corpusToolSyntax) {
		t.Errorf("%d templates write a syntax kvlm reads, want %d", found, len(corpusToolSyntax))
	}
}

// TestParseToolCalls: replies as models write them, in each syntax: text
// around calls, several calls, ids, string arguments, typed XML values,
// an unclosed last call; and replies that are text or malformed.
func TestParseToolCalls(t *testing.T) {
	tools := []byte(`[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties":
		{"n": {"type": "integer"}, "s": {"type": "string"}, "o": {"type": "object"}}}}}]`)
	type call = ToolCall
	cases := []struct {
		name    string
		syn     ToolSyntax
		tag     string
		reply   string
		content string
		calls   []call
		err     string // "" ok, "none" ErrNoToolCall, else a part of the error
	}{
		{"hermes one", ToolsHermes, "", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 1}}\n</tool_call>", "",
			[]call{{Name: "f", Arguments: `{"n":1}`}}, ""},
		{"hermes text and two", ToolsHermes, "", "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": \"{\\\"a\\\": [1, 2]}\"}\n</tool_call>",
			"Let me check.", []call{{Name: "f", Arguments: `{}`}, {Name: "g", Arguments: `{"a":[1,2]}`}}, ""},
		{"hermes unclosed", ToolsHermes, "", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"x\"}}", "",
			[]call{{Name: "f", Arguments: `{"s":"x"}`}}, ""},
		{"hermes think kept", ToolsHermes, "", "<think>\nhmm\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "<think>\nhmm\n</think>",
			[]call{{Name: "f", Arguments: `{}`}}, ""},
		{"hermes text only", ToolsHermes, "", "The weather is fine.", "", nil, "none"},
		{"hermes bad json", ToolsHermes, "", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 1}\n</tool_call>", "", nil, "not a JSON object"},
		{"hermes no name", ToolsHermes, "", "<tool_call>{\"arguments\": {}}</tool_call>", "", nil, "no \"name\""},
		{"hermes array args", ToolsHermes, "", "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "", nil, "not a JSON object"},
		{"xml typed", ToolsXML, "tool_call", "<tool_call>\n<function=f>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\n42\n</parameter>\n<parameter=o>\n{\"k\": true}\n</parameter>\n</function>\n</tool_call>", "",
			[]call{{Name: "f", Arguments: `{"n":42,"s":"42","o":{"k":true}}`}}, ""},
		{"xml multiline string", ToolsXML, "tool_call", "ok\n<tool_call>\n<function=f>\n<parameter=s>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>", "ok",
			[]call{{Name: "f", Arguments: `{"s":"line 1\nline 2"}`}}, ""},
		{"xml seed tag", ToolsXML, "seed:tool_call", "<seed:tool_call>\n<function=f>\n<parameter=s>x</parameter>\n</function>\n</seed:tool_call>", "",
			[]call{{Name: "f", Arguments: `{"s":"x"}`}}, ""},
		{"xml no function", ToolsXML, "tool_call", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "", nil, "lacks <function=NAME>"},
		{"glm", ToolsGLM, "", "<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n<arg_key>s</arg_key>\n<arg_value>7</arg_value>\n</tool_call>", "",
			[]call{{Name: "f", Arguments: `{"n":7,"s":"7"}`}}, ""},
		{"glm no name", ToolsGLM, "", "<tool_call><arg_key>n</arg_key><arg_value>7</arg_value></tool_call>", "", nil, "no function name"},
		{"llama3", ToolsLlama3, "", `{"name": "f", "parameters": {"n": 1}}`, "", []call{{Name: "f", Arguments: `{"n":1}`}}, ""},
		{"llama3 python tag, two", ToolsLlama3, "", `<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"s": "a;b"}}`, "",
			[]call{{Name: "f", Arguments: `{}`}, {Name: "g", Arguments: `{"s":"a;b"}`}}, ""},
		{"llama3 text", ToolsLlama3, "", "It is 22 °C in Paris.", "", nil, "none"},
		{"llama3 trailing text", ToolsLlama3, "", `{"name": "f", "parameters": {}} and more`, "", nil, "text after"},
		{"mistral list", ToolsMistral, "", `[TOOL_CALLS][{"name": "f", "arguments": {"n": 1}, "id": "abc123def"}]`, "",
			[]call{{ID: "abc123def", Name: "f", Arguments: `{"n":1}`}}, ""},
		{"mistral args", ToolsMistral, "", `Sure.[TOOL_CALLS]f[ARGS]{"n": 1}[TOOL_CALLS]g[CALL_ID]x1y2z3w4v[ARGS]{}`, "Sure.",
			[]call{{Name: "f", Arguments: `{"n":1}`}, {ID: "x1y2z3w4v", Name: "g", Arguments: `{}`}}, ""},
		{"mistral no args mark", ToolsMistral, "", `[TOOL_CALLS]f{"n": 1}`, "", nil, "lacks [ARGS]"},
		{"mistral text", ToolsMistral, "", "Hello.", "", nil, "none"},
		{"json list", ToolsJSONList, "tool_calls", `Calling.<tool_calls>[{"name": "f", "arguments": {"n": 1}, "id": "c1"}, {"name": "g", "arguments": {}}]</tool_calls>`, "Calling.",
			[]call{{ID: "c1", Name: "f", Arguments: `{"n":1}`}, {Name: "g", Arguments: `{}`}}, ""},
		{"json list empty", ToolsJSONList, "TOOLCALL", `<TOOLCALL>[]</TOOLCALL>`, "", nil, "empty list"},
		{"unknown syntax", "deepseek", "", "x", "", nil, "not one kvlm reads"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			content, calls, err := parseToolCalls(c.syn, c.tag, c.reply, tools)
			switch {
			case c.err == "none":
				if !errors.Is(err, ErrNoToolCall) {
					t.Fatalf("err %v, want ErrNoToolCall", err)
				}
				return
			case c.err != "":
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if content != c.content || len(calls) != len(c.calls) {
				t.Fatalf("content %q calls %+v, want %q %+v", content, calls, c.content, c.calls)
			}
			for i := range calls {
				if calls[i] != c.calls[i] {
					t.Fatalf("call %d: %+v, want %+v", i, calls[i], c.calls[i])
				}
			}
		})
	}
}
