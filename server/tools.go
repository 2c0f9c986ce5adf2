package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/tokenizer"
)

// toolFormat is a chat format that renders the OpenAI API's messages as
// they are (tool calls and results included) with tools, and reads the
// tool calls of a reply: a model's own Jinja template (chat.Template).
type toolFormat interface {
	// RenderJSON renders messages and tools (JSON arrays; tools nil for
	// none), ending with the opening of the assistant's turn.
	RenderJSON(messages, tools []byte) (string, error)
	// ToolSyntax is the syntax replies write calls in; "" for none kvlm reads.
	ToolSyntax() chat.ToolSyntax
	// ParseToolCalls reads a reply's calls (chat.ErrNoToolCall: none).
	ParseToolCalls(reply string, tools []byte) (string, []chat.ToolCall, error)
}

func (f templateFormat) RenderJSON(messages, tools []byte) (string, error) {
	return f.t.RenderJSON(messages, tools, true)
}
func (f templateFormat) ToolSyntax() chat.ToolSyntax { return f.t.ToolSyntax() }
func (f templateFormat) ParseToolCalls(reply string, tools []byte) (string, []chat.ToolCall, error) {
	return f.t.ParseToolCalls(reply, tools)
}

// toolsOf returns the server's format as a toolFormat when it is a model's
// Jinja template (the built-in formats render no tools).
func (s *Server) toolsOf() (toolFormat, bool) {
	f, ok := s.opt.Format.(templateFormat)
	if !ok || !f.t.IsJinja() {
		return nil, false
	}
	return f, true
}

// toolReply is how a chat request's reply is read for tool calls: the
// format, the request's tools (for their parameter types) and whether
// several calls may be returned.
type toolReply struct {
	f        toolFormat
	tools    []byte
	parallel bool
}

// funcName is OpenAI's rule for a function's name.
var funcName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// checkTools validates the request's tools: an array of
// {"type": "function", "function": {"name": …, "description": …,
// "parameters": {…}, "strict": …}}. It returns the array compacted, nil
// for none (absent, null or []).
func checkTools(raw json.RawMessage) ([]byte, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var list []struct {
		Type     string          `json:"type"`
		Function json.RawMessage `json:"function"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("tools", "tools must be an array of {\"type\": \"function\", \"function\": {…}}")
	}
	if len(list) == 0 {
		return nil, nil
	}
	for i, t := range list {
		field := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return nil, badRequest(field+".type", "%s.type must be \"function\", got %q", field, t.Type)
		}
		var fn struct {
			Name        *string         `json:"name"`
			Description *string         `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		}
		d := json.NewDecoder(bytes.NewReader(t.Function))
		d.DisallowUnknownFields()
		if len(t.Function) == 0 || d.Decode(&fn) != nil {
			return nil, badRequest(field+".function", "%s.function must be an object with name, and optionally description, parameters and strict", field)
		}
		if fn.Name == nil || !funcName.MatchString(*fn.Name) {
			return nil, badRequest(field+".function.name", "%s.function.name must be 1 to 64 letters, digits, '_', '.' or '-'", field)
		}
		if p := bytes.TrimSpace(fn.Parameters); len(p) > 0 && string(p) != "null" && p[0] != '{' {
			return nil, badRequest(field+".function.parameters", "%s.function.parameters must be a JSON Schema object", field)
		}
		if fn.Strict != nil && *fn.Strict {
			return nil, badRequest(field+".function.strict", "strict function calling needs constrained decoding, which kvlm does not do")
		}
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, badRequest("tools", "tools: %v", err)
	}
	return b.Bytes(), nil
}

// checkToolChoice reads tool_choice: true for "auto" (or absent), false for
// "none"; "required" and a named function need constrained decoding.
func checkToolChoice(raw json.RawMessage) (bool, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return true, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return false, badRequest("tool_choice", "tool_choice naming a function is not supported: forcing a call needs constrained decoding, which kvlm does not do (use \"auto\" or \"none\")")
	}
	switch s {
	case "auto":
		return true, nil
	case "none":
		return false, nil
	case "required":
		return false, badRequest("tool_choice", "tool_choice \"required\" is not supported: forcing a call needs constrained decoding, which kvlm does not do (use \"auto\" or \"none\")")
	}
	return false, badRequest("tool_choice", "tool_choice must be \"auto\" or \"none\", got %q", s)
}

// requestToolCall is a tool call in an assistant message of the request.
type requestToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// read is message i's role ("developer" read as "system") and its
// content's text; with tools, the role may also be "tool".
func (m chatMessage) read(i int, tools bool) (role, text string, aerr *apiError) {
	field := fmt.Sprintf("messages[%d]", i)
	role = m.Role
	if role == "developer" {
		role = "system"
	}
	switch {
	case role == "system" || role == "user" || role == "assistant" || (tools && role == "tool"):
	case role == "":
		return "", "", badRequest(field+".role", "%s has no role", field)
	case tools:
		return "", "", badRequest(field+".role", "%s: role %q is not supported (system, user, assistant, tool)", field, m.Role)
	default:
		return "", "", badRequest(field+".role", "%s: role %q is not supported (system, user, assistant; tool with a template that renders tools)", field, m.Role)
	}
	text, err := messageText(m.Content)
	if err != nil {
		return "", "", badRequest(field+".content", "%s.content: %v", field, err)
	}
	return role, text, nil
}

// usesTools says whether a message carries what only a tool-aware render
// can write: a tool result or an assistant's tool calls.
func (m chatMessage) usesTools() bool {
	tc := bytes.TrimSpace(m.ToolCalls)
	return m.Role == "tool" || (len(tc) > 0 && string(tc) != "null" && string(tc) != "[]")
}

// jsonMessages writes the conversation as the message objects Hugging
// Face's templates read: role, content (a string; "" for null), the
// assistant's tool_calls with their arguments as objects (as transformers
// passes them: templates write them with tojson), a tool result's
// tool_call_id, and name where given.
func jsonMessages(msgs []chatMessage) ([]byte, *apiError) {
	type fn struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	type msg struct {
		Role       string `json:"role"`
		Content    string `json:"content"`
		Name       string `json:"name,omitempty"`
		ToolCalls  []call `json:"tool_calls,omitempty"`
		ToolCallID string `json:"tool_call_id,omitempty"`
	}
	out := make([]msg, len(msgs))
	for i, m := range msgs {
		field := fmt.Sprintf("messages[%d]", i)
		role, text, aerr := m.read(i, true)
		if aerr != nil {
			return nil, aerr
		}
		o := msg{Role: role, Content: text, Name: m.Name}
		if tc := bytes.TrimSpace(m.ToolCalls); len(tc) > 0 && string(tc) != "null" {
			if role != "assistant" {
				return nil, badRequest(field+".tool_calls", "%s: only an assistant message has tool_calls", field)
			}
			var calls []requestToolCall
			d := json.NewDecoder(bytes.NewReader(tc))
			d.DisallowUnknownFields()
			if err := d.Decode(&calls); err != nil {
				return nil, badRequest(field+".tool_calls", "%s.tool_calls must be an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", field)
			}
			for j, c := range calls {
				cf := fmt.Sprintf("%s.tool_calls[%d]", field, j)
				if c.Type != "function" || c.Function.Name == "" {
					return nil, badRequest(cf, "%s must have type \"function\" and a function name", cf)
				}
				args := json.RawMessage(strings.TrimSpace(c.Function.Arguments))
				if len(args) == 0 {
					args = json.RawMessage("{}")
				}
				if args[0] != '{' || !json.Valid(args) {
					return nil, badRequest(cf+".function.arguments", "%s.function.arguments must be a JSON object in a string", cf)
				}
				o.ToolCalls = append(o.ToolCalls, call{ID: c.ID, Type: "function", Function: fn{Name: c.Function.Name, Arguments: args}})
			}
		}
		if m.ToolCallID != "" {
			if role != "tool" {
				return nil, badRequest(field+".tool_call_id", "%s: only a tool message has tool_call_id", field)
			}
			o.ToolCallID = m.ToolCallID
		}
		out[i] = o
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, badRequest("messages", "messages: %v", err)
	}
	return b, nil
}

// encodeToolChat renders and tokenizes a conversation with tools (tools
// nil when tool_choice is "none").
func (s *Server) encodeToolChat(tf toolFormat, msgs []chatMessage, tools []byte) ([]int, *apiError) {
	mj, aerr := jsonMessages(msgs)
	if aerr != nil {
		return nil, aerr
	}
	text, err := tf.RenderJSON(mj, tools)
	if err != nil {
		return nil, badRequest("messages", "%s", strings.TrimPrefix(err.Error(), "chat: "))
	}
	return s.opt.Format.EncodeText(s.tok, text, true), nil
}

// Tool calls in a response.

type toolCallJSON struct {
	Index    *int         `json:"index,omitempty"` // in a stream's delta
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFuncJSON `json:"function"`
}

type toolFuncJSON struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// read splits a finished reply into its text and tool calls. A reply with
// no call, or whose calls do not parse, is text; without parallel, only
// the first call is kept. finish becomes "tool_calls" when there are calls
// and the reply ended by itself.
func (tr *toolReply) read(reply, finish string) (content string, calls []toolCallJSON, fin string) {
	if finish != "stop" {
		return reply, nil, finish
	}
	text, cs, err := tr.f.ParseToolCalls(reply, tr.tools)
	if err != nil || len(cs) == 0 {
		return reply, nil, finish
	}
	if !tr.parallel {
		cs = cs[:1]
	}
	calls = make([]toolCallJSON, len(cs))
	for i, c := range cs {
		id := c.ID
		if id == "" {
			id = newID("call_")
		}
		calls[i] = toolCallJSON{ID: id, Type: "function", Function: toolFuncJSON{Name: c.Name, Arguments: c.Arguments}}
	}
	return text, calls, "tool_calls"
}

// toolsRefused explains why a request with tools cannot be served by the
// format named format: it renders no tools (jinja false), or its template
// writes calls in a syntax kvlm does not read.
func toolsRefused(format string, jinja bool, field string) *apiError {
	if !jinja {
		return badRequest(field, "the chat format %q renders no tools: tools need the model's own Jinja chat template (tokenizer.chat_template)", format)
	}
	names := make([]string, len(chat.ToolSyntaxes))
	for i, n := range chat.ToolSyntaxes {
		names[i] = string(n)
	}
	return badRequest(field, "the model's chat template writes tool calls in a syntax kvlm does not read (it reads %s)", strings.Join(names, ", "))
}

// specialText decodes tokens with control tokens written as their text
// ([TOOL_CALLS], <|python_tag|>): the form a reply's calls are read from.
// Other tokens decode as the vocabulary decodes them.
type specialText struct{ tokenizer.Tokenizer }

func (t specialText) Decode(prev, id int) string {
	if s := t.Tokenizer.Decode(prev, id); s != "" {
		return s
	}
	if ty, ok := t.Tokenizer.(interface{ Type(int) int32 }); !ok || ty.Type(id) != tokenizer.TypeControl {
		return ""
	}
	return strings.Trim(t.Piece(id), "\n")
}
