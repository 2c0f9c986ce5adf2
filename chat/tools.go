package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// ToolCall is one call of a tool that a model's reply asks for.
type ToolCall struct {
	ID        string // the id the model wrote (Mistral's); "" when it wrote none
	Name      string // the function's name
	Arguments string // the arguments: one JSON object, compact, keys in the model's order
}

// ToolSyntax names how a family of models writes tool calls in a reply:
// the syntax its chat template writes an assistant's tool calls in (see
// Template.ToolSyntax).
type ToolSyntax string

// The tool-call syntaxes kvlm reads.
const (
	// ToolsHermes: <tool_call>{"name": …, "arguments": {…}}</tool_call>,
	// one block per call (Hermes 2 Pro and 3, Qwen 2.5, QwQ, Qwen 3,
	// Granite 4, Bielik 3, MiMo-VL, Reka Edge).
	ToolsHermes ToolSyntax = "hermes"
	// ToolsXML: <tool_call><function=NAME><parameter=K>V</parameter>…
	// </function></tool_call> (Qwen3-Coder, Qwen 3.5, Nemotron 3 Nano,
	// Step 3.5; Seed-OSS's <seed:tool_call>). A value is JSON when it parses
	// as JSON and the tool's schema does not make it a string.
	ToolsXML ToolSyntax = "qwen3-coder"
	// ToolsGLM: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>
	// …</tool_call> (GLM 4.5–4.7), values as ToolsXML's.
	ToolsGLM ToolSyntax = "glm"
	// ToolsLlama3: the reply is {"name": …, "parameters": {…}}, calls
	// separated by ";" (Llama 3.1, 3.2, 3.3), after an optional
	// <|python_tag|>.
	ToolsLlama3 ToolSyntax = "llama3"
	// ToolsMistral: [TOOL_CALLS][{"name": …, "arguments": {…}, "id": …}]
	// (Mistral Nemo, v3 vocabularies) or, one call after another,
	// [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{…} with [CALL_ID] optional
	// (Mistral Small 3.2, Ministral 3, Devstral).
	ToolsMistral ToolSyntax = "mistral"
	// ToolsJSONList: <TAG>[{"name": …, "arguments": {…}}, …]</TAG>
	// (Apriel's <tool_calls>, Nemotron Nano 2's <TOOLCALL>).
	ToolsJSONList ToolSyntax = "json-list"
)

// ToolSyntaxes lists the syntaxes kvlm reads, for messages.
var ToolSyntaxes = []ToolSyntax{ToolsHermes, ToolsXML, ToolsGLM, ToolsLlama3, ToolsMistral, ToolsJSONList}

// The probe: a conversation with one tool call, which a template renders in
// the syntax its model writes calls in.
const (
	probeName = "kvlm_probe_fn"
	probeArg  = "kvlm_probe_arg"
	probeID   = "kvlmprobe" // nine letters and digits: Mistral's templates refuse other ids
)

var probeMessages = []byte(`[{"role": "user", "content": "Call the probe."},
{"role": "assistant", "content": "", "tool_calls": [{"id": "` + probeID + `", "type": "function",
 "function": {"name": "` + probeName + `", "arguments": {"` + probeArg + `": "kvlm probe value"}}}]},
{"role": "tool", "tool_call_id": "` + probeID + `", "name": "` + probeName + `", "content": "done"}]`)

var probeTools = []byte(`[{"type": "function", "function": {"name": "` + probeName + `", "description": "A probe.",
 "parameters": {"type": "object", "properties": {"` + probeArg + `": {"type": "string", "description": "A value."}},
 "required": ["` + probeArg + `"]}}}]`)

// The probe's call as each syntax writes it.
var (
	probeHermes   = regexp.MustCompile(`<tool_call>\s*\{"name":\s*"` + probeName + `"`)
	probeGLM      = regexp.MustCompile(`<tool_call>\s*` + probeName + `\s*<arg_key>`)
	probeLlama3   = regexp.MustCompile(`\{"name":\s*"` + probeName + `",\s*"parameters":`)
	probeJSONList = regexp.MustCompile(`<([A-Za-z_]+)>\[\{"name":\s*"` + probeName + `"`)
)

// detectToolSyntax renders the probe conversation with the template and
// names the syntax its tool call came out in ("" when the template renders
// no tool calls, fails on them, or writes them in a syntax kvlm does not
// read); tag is ToolsJSONList's tag name, or the open tag of ToolsXML.
func (t *Template) detectToolSyntax() (syn ToolSyntax, tag string) {
	out, err := t.applyJSON(probeMessages, probeTools, false)
	if err != nil || !strings.Contains(out, probeName) {
		return "", ""
	}
	switch {
	case strings.Contains(out, "<function="+probeName+">"):
		if strings.Contains(out, "<seed:tool_call>") {
			return ToolsXML, "seed:tool_call"
		}
		if strings.Contains(out, "<tool_call>") {
			return ToolsXML, "tool_call"
		}
	case probeHermes.MatchString(out):
		return ToolsHermes, ""
	case probeGLM.MatchString(out):
		return ToolsGLM, ""
	case strings.Contains(out, "[TOOL_CALLS]"+probeName) || strings.Contains(out, `[TOOL_CALLS][{"name": "`+probeName+`"`):
		return ToolsMistral, ""
	case probeLlama3.MatchString(out) && !strings.Contains(out, "<tool_call>"):
		return ToolsLlama3, ""
	}
	// The last such list is the call (a system prompt may list the tools
	// the same way before it).
	if ms := probeJSONList.FindAllStringSubmatchIndex(out, -1); ms != nil {
		m := ms[len(ms)-1]
		if tag := out[m[2]:m[3]]; strings.Contains(out[m[1]:], "</"+tag+">") {
			return ToolsJSONList, tag
		}
	}
	return "", ""
}

// IsJinja says whether the template is a model's own Jinja template (the
// only kind that renders tools: RenderJSON).
func (t *Template) IsJinja() bool { return t.jinja != nil }

// ToolSyntax is the syntax the template writes tool calls in ("" when it
// renders none that kvlm reads): the one ParseToolCalls reads in a reply.
func (t *Template) ToolSyntax() ToolSyntax { return t.tools }

// RenderJSON renders a conversation given as the OpenAI API's messages (a
// JSON array: tool_calls, tool results and all) with tools (a JSON array,
// nil for none), as Hugging Face's apply_chat_template renders them; with
// gen, it ends with the header of the assistant's turn. Only a model's
// Jinja template renders this form.
func (t *Template) RenderJSON(messages, tools []byte, gen bool) (string, error) {
	return t.applyJSON(messages, tools, gen)
}

// ErrNoToolCall is ParseToolCalls' error for a reply that holds no call.
var ErrNoToolCall = errors.New("chat: the reply holds no tool call")

// ParseToolCalls reads the tool calls of a model's reply, written in the
// template's ToolSyntax: the reply's text outside the calls (trimmed) and
// the calls in order. tools is the request's tools (a JSON array, or nil),
// whose parameter schemas decide whether an XML-style value is a string.
// A reply with no call is ErrNoToolCall; one whose call does not parse is
// another error (the caller answers with the reply as text).
func (t *Template) ParseToolCalls(reply string, tools []byte) (content string, calls []ToolCall, err error) {
	return parseToolCalls(t.tools, t.toolTag, reply, tools)
}

func parseToolCalls(syn ToolSyntax, tag, reply string, tools []byte) (content string, calls []ToolCall, err error) {
	switch syn {
	case ToolsHermes:
		return parseTagged(reply, "<tool_call>", "</tool_call>", func(body string) ([]ToolCall, error) {
			c, err := jsonCall([]byte(body), "arguments")
			return []ToolCall{c}, err
		})
	case ToolsJSONList:
		return parseTagged(reply, "<"+tag+">", "</"+tag+">", func(body string) ([]ToolCall, error) {
			return jsonCalls([]byte(body), "arguments")
		})
	case ToolsXML:
		types := paramTypes(tools)
		return parseTagged(reply, "<"+tag+">", "</"+tag+">", func(body string) ([]ToolCall, error) {
			c, err := xmlCall(body, types)
			return []ToolCall{c}, err
		})
	case ToolsGLM:
		types := paramTypes(tools)
		return parseTagged(reply, "<tool_call>", "</tool_call>", func(body string) ([]ToolCall, error) {
			c, err := glmCall(body, types)
			return []ToolCall{c}, err
		})
	case ToolsLlama3:
		return parseLlama3(reply)
	case ToolsMistral:
		return parseMistral(reply)
	}
	return "", nil, fmt.Errorf("chat: tool-call syntax %q is not one kvlm reads", syn)
}

// parseTagged finds every open…close block of reply and reads its body;
// the last block may lack its close tag (the reply ended at a stop).
func parseTagged(reply, open, close string, read func(body string) ([]ToolCall, error)) (string, []ToolCall, error) {
	var text strings.Builder
	var calls []ToolCall
	rest := reply
	for {
		i := strings.Index(rest, open)
		if i < 0 {
			text.WriteString(rest)
			break
		}
		text.WriteString(rest[:i])
		rest = rest[i+len(open):]
		body := rest
		if j := strings.Index(rest, close); j >= 0 {
			body, rest = rest[:j], rest[j+len(close):]
		} else {
			rest = ""
		}
		cs, err := read(strings.TrimSpace(body))
		if err != nil {
			return "", nil, err
		}
		calls = append(calls, cs...)
	}
	if len(calls) == 0 {
		return "", nil, ErrNoToolCall
	}
	return strings.TrimSpace(text.String()), calls, nil
}

// jsonCall reads {"name": …, argsKey: {…} or "…", "id": …} (argsKey
// "arguments" or "parameters"; "parameters" is taken for either key).
func jsonCall(b []byte, argsKey string) (ToolCall, error) {
	var obj struct {
		Name       *string         `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
		ID         string          `json:"id"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&obj); err != nil {
		return ToolCall{}, fmt.Errorf("chat: a tool call is not a JSON object: %v", err)
	}
	if d.More() {
		return ToolCall{}, errors.New("chat: text after a tool call's JSON object")
	}
	if obj.Name == nil || *obj.Name == "" {
		return ToolCall{}, errors.New(`chat: a tool call has no "name"`)
	}
	raw := obj.Arguments
	if argsKey == "parameters" || raw == nil {
		if obj.Parameters != nil {
			raw = obj.Parameters
		}
	}
	args, err := argsObject(raw)
	if err != nil {
		return ToolCall{}, fmt.Errorf("chat: tool call %q: %v", *obj.Name, err)
	}
	return ToolCall{ID: obj.ID, Name: *obj.Name, Arguments: args}, nil
}

// jsonCalls reads a JSON array of calls.
func jsonCalls(b []byte, argsKey string) ([]ToolCall, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("chat: the tool calls are not a JSON array: %v", err)
	}
	if len(list) == 0 {
		return nil, errors.New("chat: an empty list of tool calls")
	}
	calls := make([]ToolCall, len(list))
	for i, raw := range list {
		c, err := jsonCall(raw, argsKey)
		if err != nil {
			return nil, err
		}
		calls[i] = c
	}
	return calls, nil
}

// argsObject is a call's arguments as compact JSON: an object, or a
// string holding one (some models write the OpenAI form); absent is {}.
func argsObject(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "{}", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		raw = []byte(strings.TrimSpace(s))
	}
	if len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
		return "", errors.New("its arguments are not a JSON object")
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", err
	}
	return b.String(), nil
}

// paramTypes maps function name → parameter → its schema's "type" (a
// string, or "" when the schema gives several or none).
func paramTypes(tools []byte) map[string]map[string]string {
	var list []struct {
		Function struct {
			Name       string `json:"name"`
			Parameters struct {
				Properties map[string]struct {
					Type json.RawMessage `json:"type"`
				} `json:"properties"`
			} `json:"parameters"`
		} `json:"function"`
	}
	out := map[string]map[string]string{}
	if json.Unmarshal(tools, &list) != nil {
		return out
	}
	for _, f := range list {
		m := map[string]string{}
		for k, p := range f.Function.Parameters.Properties {
			var s string
			if json.Unmarshal(p.Type, &s) == nil {
				m[k] = s
			}
		}
		out[f.Function.Name] = m
	}
	return out
}

// argValue is an XML-style parameter's value as JSON: the text itself as
// a JSON value when it parses as one and the schema does not say string,
// else a JSON string.
func argValue(text, typ string) json.RawMessage {
	if typ != "string" {
		if t := strings.TrimSpace(text); t != "" && json.Valid([]byte(t)) {
			return json.RawMessage(t)
		}
	}
	b, _ := json.Marshal(text)
	return b
}

// objectOf writes keys and values, in order, as one compact JSON object.
func objectOf(keys []string, vals []json.RawMessage) string {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		var c bytes.Buffer
		if json.Compact(&c, vals[i]) != nil {
			c.Reset()
			c.Write(vals[i])
		}
		b.Write(c.Bytes())
	}
	b.WriteByte('}')
	return b.String()
}

var (
	xmlFunction  = regexp.MustCompile(`(?s)^<function=([^>\s]+)>(.*?)(?:</function>\s*)?$`)
	xmlParameter = regexp.MustCompile(`(?s)<parameter=([^>]+)>(.*?)</parameter>`)
	glmPair      = regexp.MustCompile(`(?s)<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>`)
)

// xmlCall reads <function=NAME><parameter=K>\nV\n</parameter>…</function>.
func xmlCall(body string, types map[string]map[string]string) (ToolCall, error) {
	m := xmlFunction.FindStringSubmatch(body)
	if m == nil {
		return ToolCall{}, errors.New("chat: a tool call lacks <function=NAME>")
	}
	name := m[1]
	var keys []string
	var vals []json.RawMessage
	rest := m[2]
	for _, p := range xmlParameter.FindAllStringSubmatch(rest, -1) {
		// The template writes "\n" around each value.
		v := strings.TrimSuffix(strings.TrimPrefix(p[2], "\n"), "\n")
		keys = append(keys, p[1])
		vals = append(vals, argValue(v, types[name][p[1]]))
	}
	if strings.TrimSpace(xmlParameter.ReplaceAllString(rest, "")) != "" {
		return ToolCall{}, fmt.Errorf("chat: tool call %q holds text outside its parameters", name)
	}
	return ToolCall{Name: name, Arguments: objectOf(keys, vals)}, nil
}

// glmCall reads NAME<arg_key>K</arg_key><arg_value>V</arg_value>….
func glmCall(body string, types map[string]map[string]string) (ToolCall, error) {
	name, rest, _ := strings.Cut(body, "<arg_key>")
	if rest != "" {
		rest = "<arg_key>" + rest
	}
	name = strings.TrimSpace(name)
	if name == "" || strings.ContainsAny(name, "<>\n") {
		return ToolCall{}, errors.New("chat: a tool call has no function name")
	}
	var keys []string
	var vals []json.RawMessage
	for _, p := range glmPair.FindAllStringSubmatch(rest, -1) {
		keys = append(keys, p[1])
		vals = append(vals, argValue(p[2], types[name][p[1]]))
	}
	if strings.TrimSpace(glmPair.ReplaceAllString(rest, "")) != "" {
		return ToolCall{}, fmt.Errorf("chat: tool call %q holds text outside its arguments", name)
	}
	return ToolCall{Name: name, Arguments: objectOf(keys, vals)}, nil
}

// parseLlama3 reads a reply that is one or more {"name": …, "parameters":
// …} objects separated by ";", after an optional <|python_tag|>. A reply
// that starts otherwise is text.
func parseLlama3(reply string) (string, []ToolCall, error) {
	s := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(reply), "<|python_tag|>"))
	if !strings.HasPrefix(s, "{") {
		return "", nil, ErrNoToolCall
	}
	var calls []ToolCall
	d := json.NewDecoder(strings.NewReader(s))
	for {
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			return "", nil, fmt.Errorf("chat: a tool call is not a JSON object: %v", err)
		}
		c, err := jsonCall(raw, "parameters")
		if err != nil {
			return "", nil, err
		}
		calls = append(calls, c)
		rest := strings.TrimSpace(s[d.InputOffset():])
		if rest == "" {
			return "", calls, nil
		}
		if rest[0] != ';' {
			return "", nil, errors.New("chat: text after a tool call")
		}
		s = strings.TrimSpace(rest[1:])
		d = json.NewDecoder(strings.NewReader(s))
	}
}

// parseMistral reads [TOOL_CALLS] followed by a JSON list, or by
// NAME[CALL_ID]ID[ARGS]{…} once per call; the text before the first
// [TOOL_CALLS] is the content.
func parseMistral(reply string) (string, []ToolCall, error) {
	const mark = "[TOOL_CALLS]"
	i := strings.Index(reply, mark)
	if i < 0 {
		return "", nil, ErrNoToolCall
	}
	content := strings.TrimSpace(reply[:i])
	rest := strings.TrimSpace(reply[i+len(mark):])
	if strings.HasPrefix(rest, "[") {
		calls, err := jsonCalls([]byte(rest), "arguments")
		return content, calls, err
	}
	var calls []ToolCall
	for _, part := range strings.Split(rest, mark) {
		name, args, ok := strings.Cut(part, "[ARGS]")
		if !ok {
			return "", nil, errors.New("chat: a tool call lacks [ARGS]")
		}
		name, id, _ := strings.Cut(name, "[CALL_ID]")
		name = strings.TrimSpace(name)
		if name == "" {
			return "", nil, errors.New("chat: a tool call has no function name")
		}
		a, err := argsObject(json.RawMessage(strings.TrimSpace(args)))
		if err != nil {
			return "", nil, fmt.Errorf("chat: tool call %q: %v", name, err)
		}
		calls = append(calls, ToolCall{ID: strings.TrimSpace(id), Name: name, Arguments: a})
	}
	return content, calls, nil
}
