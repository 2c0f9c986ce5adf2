package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/sample"
	"github.com/kvlm/kvlm/tokenizer"
)

// Limits on what a request may ask for.
const (
	maxStops     = 16
	maxStopBytes = 256
	maxNewTokens = 1 << 20
)

// streamOptions is OpenAI's stream_options.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// kvParams is the "kv" extension object: the request's KV cache policy
// and codecs. Its policy parameters are those of policy.AllParams, each
// as kv.NAME ('-' spelled '_'), kept raw until kvRequest reads them.
type kvParams struct {
	Policy string `json:"policy"` // a policy.Methods name ("full" by default)
	Type   string `json:"type"`   // codec of keys and values
	TypeK  string `json:"type_k"` // codec of keys
	TypeV  string `json:"type_v"` // codec of values
	Slot   *int   `json:"slot"`   // keep the finished sequence in this slot
	// CachePrompt: use and fill the prefix cache (default true).
	CachePrompt *bool `json:"cache_prompt"`
	// Prefix, or PrefixTokens, is the beginning of the prompt (a
	// document) that the policy compresses on its own, query-agnostic,
	// caching it for every request with the same prefix and kv settings
	// (engine.GenRequest.PrefixTokens; docs/PREFIX.md). Prefix is text the
	// prompt's tokens must begin with (for chat: the rendered prompt's
	// text); PrefixTokens a count of the prompt's tokens.
	Prefix       *string `json:"prefix"`
	PrefixTokens *int    `json:"prefix_tokens"`
	// Truncate (chat): drop the oldest whole turns, the system message
	// kept, until the prompt and the reply fit the context (FitTurns).
	Truncate *bool `json:"truncate"`

	params map[string]json.RawMessage // the policy parameters present, by JSON name
}

// UnmarshalJSON reads the fixed fields strictly and keeps the policy
// parameters raw; any other field is refused.
func (kv *kvParams) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return &json.UnmarshalTypeError{Value: te.Value, Type: reflect.TypeOf(kvParams{}), Offset: te.Offset}
		}
		return err
	}
	fixed := map[string]bool{"policy": true, "type": true, "type_k": true, "type_v": true, "slot": true, "cache_prompt": true, "prefix": true, "prefix_tokens": true, "truncate": true}
	type plain kvParams // without this method
	var f plain
	rest := map[string]json.RawMessage{}
	for k, v := range raw {
		if !fixed[k] {
			if _, ok := policy.LookupParam(strings.ReplaceAll(k, "_", "-")); !ok || strings.Contains(k, "-") {
				return fmt.Errorf("json: unknown field %q", k)
			}
			rest[k] = v
		}
	}
	for k := range rest {
		delete(raw, k)
	}
	fb, _ := json.Marshal(raw)
	dec := json.NewDecoder(bytes.NewReader(fb))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return err
	}
	*kv = kvParams(f)
	kv.params = rest
	return nil
}

// commonParams are the fields completions and chat share.
type commonParams struct {
	Model               string             `json:"model"`
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"`
	Temperature         *float64           `json:"temperature"`
	TopP                *float64           `json:"top_p"`
	TopK                *int               `json:"top_k"`
	MinP                *float64           `json:"min_p"`
	RepetitionPenalty   *float64           `json:"repetition_penalty"`
	N                   *int               `json:"n"`
	Stream              *bool              `json:"stream"`
	StreamOptions       *streamOptions     `json:"stream_options"`
	Stop                json.RawMessage    `json:"stop"`
	Seed                *int64             `json:"seed"`
	PresencePenalty     *float64           `json:"presence_penalty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty"`
	LogitBias           map[string]float64 `json:"logit_bias"`
	User                string             `json:"user"`
	Metadata            map[string]string  `json:"metadata"`
	Store               *bool              `json:"store"`
	KV                  *kvParams          `json:"kv"`
}

type completionRequest struct {
	commonParams
	Prompt   json.RawMessage `json:"prompt"`
	Echo     *bool           `json:"echo"`
	Suffix   *string         `json:"suffix"`
	BestOf   *int            `json:"best_of"`
	Logprobs *int            `json:"logprobs"`
}

type chatRequest struct {
	commonParams
	Messages          []chatMessage   `json:"messages"`
	Logprobs          *bool           `json:"logprobs"`
	TopLogprobs       *int            `json:"top_logprobs"`
	ResponseFormat    *responseFormat `json:"response_format"`
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
}

type responseFormat struct {
	Type string `json:"type"`
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`   // an assistant's: [{"id", "type", "function": {"name", "arguments"}}]
	ToolCallID string          `json:"tool_call_id"` // a tool result's
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// decodeBody reads one JSON object into v, strictly.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) *apiError {
	// The guard has checked the Content-Type and read the body.
	body := http.MaxBytesReader(w, r.Body, s.opt.MaxBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, s.opt.MaxBody)
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return jsonError(err, s.opt.MaxBody)
		}
		return badRequest("", "the body must hold one JSON object and nothing after it")
	}
	return nil
}

// jsonError explains a decoding error.
func jsonError(err error, limit int64) *apiError {
	var mbe *http.MaxBytesError
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &mbe):
		return &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("the request body is larger than %d bytes", limit), typ: "invalid_request_error"}
	case errors.Is(err, io.EOF):
		return badRequest("", "empty request body: expected a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "invalid JSON: the body ends in the middle of a value")
	case errors.As(err, &se):
		return badRequest("", "invalid JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	case errors.As(err, &te):
		field := strings.TrimPrefix(te.Field, "commonParams.")
		if field == "" {
			return badRequest("", "the body must be a JSON object, got %s", te.Value)
		}
		return badRequest(field, "field %q must be %s, got %s", field, jsonKind(te.Type), te.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return badRequest(strings.Trim(name, `"`), "unrecognized request argument: %s", name)
	}
	return badRequest("", "invalid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
}

func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}

var seedCounter atomic.Uint64

// params turns the shared fields into an engine request (prompt excluded)
// and the stop strings.
func (s *Server) params(p *commonParams, defaultMax int) (engine.GenRequest, []string, *apiError) {
	var gr engine.GenRequest
	if p.Model != "" && p.Model != s.opt.ModelName {
		return gr, nil, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("the model %q does not exist; this server serves %q", p.Model, s.opt.ModelName),
			typ: "invalid_request_error", param: "model", code: "model_not_found"}
	}
	gr.MaxTokens = defaultMax
	for _, f := range []struct {
		name string
		v    *int
	}{{"max_tokens", p.MaxTokens}, {"max_completion_tokens", p.MaxCompletionTokens}} {
		if f.v == nil {
			continue
		}
		if *f.v < 1 || *f.v > maxNewTokens {
			return gr, nil, badRequest(f.name, "%s must be between 1 and %d, got %d", f.name, maxNewTokens, *f.v)
		}
		gr.MaxTokens = *f.v
	}
	sp := sample.Params{Temperature: 1}
	if v := p.Temperature; v != nil {
		if !(*v >= 0 && *v <= 2) {
			return gr, nil, badRequest("temperature", "temperature must be between 0 and 2, got %g", *v)
		}
		sp.Temperature = float32(*v)
	}
	if v := p.TopP; v != nil {
		if !(*v > 0 && *v <= 1) {
			return gr, nil, badRequest("top_p", "top_p must be in (0, 1], got %g", *v)
		}
		sp.TopP = float32(*v)
	}
	if v := p.TopK; v != nil {
		if *v < -1 {
			return gr, nil, badRequest("top_k", "top_k must be ≥ 0 (0 or -1: off), got %d", *v)
		}
		sp.TopK = max(*v, 0)
	}
	if v := p.MinP; v != nil {
		if !(*v >= 0 && *v <= 1) {
			return gr, nil, badRequest("min_p", "min_p must be in [0, 1], got %g", *v)
		}
		sp.MinP = float32(*v)
	}
	if v := p.RepetitionPenalty; v != nil {
		if !(*v > 0 && *v <= 10) {
			return gr, nil, badRequest("repetition_penalty", "repetition_penalty must be in (0, 10], got %g", *v)
		}
		sp.RepeatPenalty = float32(*v)
	}
	for _, f := range []struct {
		name string
		v    *float64
	}{{"presence_penalty", p.PresencePenalty}, {"frequency_penalty", p.FrequencyPenalty}} {
		if f.v != nil && *f.v != 0 {
			return gr, nil, badRequest(f.name, "%s is not supported; use repetition_penalty", f.name)
		}
	}
	if len(p.LogitBias) > 0 {
		return gr, nil, badRequest("logit_bias", "logit_bias is not supported")
	}
	if p.Seed != nil {
		sp.Seed = uint64(*p.Seed)
	} else {
		sp.Seed = uint64(time.Now().UnixNano()) ^ seedCounter.Add(0x9E3779B97F4A7C15)
	}
	if sp.Seed == 0 {
		sp.Seed = 1
	}
	gr.Sampling = sp
	gr.N = 1
	if p.N != nil {
		if *p.N < 1 || *p.N > s.e.Config().MaxN {
			return gr, nil, badRequest("n", "n must be between 1 and %d, got %d", s.e.Config().MaxN, *p.N)
		}
		gr.N = *p.N
	}
	stops, err := parseStop(p.Stop)
	if err != nil {
		return gr, nil, err
	}
	if p.StreamOptions != nil && (p.Stream == nil || !*p.Stream) {
		return gr, nil, badRequest("stream_options", "stream_options is only allowed with stream: true")
	}
	if kv := p.KV; kv != nil {
		if err := kvRequest(kv, &gr); err != nil {
			return gr, nil, err
		}
	}
	return gr, stops, nil
}

func parseStop(raw json.RawMessage) ([]string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var stops []string
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		stops = []string{one}
	} else if err := json.Unmarshal(raw, &stops); err != nil {
		return nil, badRequest("stop", "stop must be a string or an array of strings")
	}
	if len(stops) > maxStops {
		return nil, badRequest("stop", "at most %d stop sequences, got %d", maxStops, len(stops))
	}
	for _, s := range stops {
		if s == "" || len(s) > maxStopBytes {
			return nil, badRequest("stop", "stop sequences must be 1 to %d bytes long", maxStopBytes)
		}
	}
	return stops, nil
}

// kvParam is a policy parameter's name in the kv object.
func kvParam(param string) string { return "kv." + policy.JSONName(param) }

// kvRequest applies the "kv" object.
func kvRequest(kv *kvParams, gr *engine.GenRequest) *apiError {
	c := policy.Config{Method: kv.Policy}
	var given []string // the parameters present, which the policy must use
	for _, p := range policy.AllParams() {
		raw, ok := kv.params[policy.JSONName(p.Name)]
		if !ok || string(raw) == "null" {
			continue
		}
		name := kvParam(p.Name)
		var v any
		switch p.Kind {
		case policy.IntParam:
			var x int
			if err := json.Unmarshal(raw, &x); err != nil {
				return badRequest(name, "field %q must be an integer, got %s", name, raw)
			}
			if x < 0 || x > 1<<24 {
				return badRequest(name, "%s must be between 0 and %d, got %d", name, 1<<24, x)
			}
			v = x
		case policy.FloatParam:
			var x float64
			if err := json.Unmarshal(raw, &x); err != nil {
				return badRequest(name, "field %q must be a number, got %s", name, raw)
			}
			v = x
		default:
			var x string
			if err := json.Unmarshal(raw, &x); err != nil {
				return badRequest(name, "field %q must be a string, got %s", name, raw)
			}
			if x == "" {
				continue // "": the method's default
			}
			v = x
		}
		if err := p.Set(&c, v); err != nil {
			return badRequest(name, "%s: %s", name, strings.TrimPrefix(err.Error(), "policy: "))
		}
		given = append(given, p.Name)
	}
	c, err := c.NormalizeGiven(given...)
	if err != nil {
		if pe := (*policy.ParamError)(nil); errors.As(err, &pe) {
			return badRequest(kvParam(pe.Param), "kv: %s", strings.TrimPrefix(pe.Render(kvParam), "policy: "))
		}
		return badRequest("kv.policy", "kv: %s", strings.TrimPrefix(err.Error(), "policy: "))
	}
	gr.Policy = c
	gr.K, gr.V = kv.Type, kv.Type
	if kv.TypeK != "" {
		gr.K = kv.TypeK
	}
	if kv.TypeV != "" {
		gr.V = kv.TypeV
	}
	if kv.Slot != nil {
		if *kv.Slot < 0 || *kv.Slot >= engine.MaxSlots {
			return badRequest("kv.slot", "kv.slot must be between 0 and %d, got %d", engine.MaxSlots-1, *kv.Slot)
		}
		gr.Slot = kv.Slot
	}
	if kv.CachePrompt != nil && !*kv.CachePrompt {
		gr.NoPrefixCache = true
	}
	return nil
}

// kvPrefix is the prompt tokens kv.prefix or kv.prefix_tokens names (0:
// neither). encode tokenizes text as the start of a prompt.
func kvPrefix(kv *kvParams, prompt []int, encode func(string) []int) (int, *apiError) {
	switch {
	case kv == nil || (kv.Prefix == nil && kv.PrefixTokens == nil):
		return 0, nil
	case kv.Prefix != nil && kv.PrefixTokens != nil:
		return 0, badRequest("kv.prefix", "give kv.prefix or kv.prefix_tokens, not both")
	case kv.PrefixTokens != nil:
		if n := *kv.PrefixTokens; n < 1 || n > len(prompt) {
			return 0, badRequest("kv.prefix_tokens", "kv.prefix_tokens must be between 1 and the prompt's %d tokens, got %d", len(prompt), n)
		}
		return *kv.PrefixTokens, nil
	}
	if *kv.Prefix == "" {
		return 0, badRequest("kv.prefix", "kv.prefix is empty")
	}
	p := encode(*kv.Prefix)
	if len(p) > len(prompt) {
		return 0, badRequest("kv.prefix", "kv.prefix is %d tokens, longer than the prompt's %d", len(p), len(prompt))
	}
	for i := range p {
		if p[i] != prompt[i] {
			return 0, badRequest("kv.prefix", "the prompt does not begin with kv.prefix: their tokens differ at token %d of %d (the prompt must start with the prefix's text, and the prefix end where a token of the prompt ends, e.g. before a newline)", i, len(p))
		}
	}
	return len(p), nil
}

// promptTokens reads a completions prompt: a string, an array of one
// string, or an array of token ids.
func (s *Server) promptTokens(raw json.RawMessage) ([]int, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return s.encode(text), nil
	}
	var texts []string
	if err := json.Unmarshal(raw, &texts); err == nil {
		if len(texts) != 1 {
			return nil, badRequest("prompt", "one prompt per request, got %d (send one request per prompt)", len(texts))
		}
		return s.encode(texts[0]), nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return nil, badRequest("prompt", "prompt is empty")
		}
		for _, id := range ids {
			if id < 0 || id >= s.tok.VocabSize() {
				return nil, badRequest("prompt", "token id %d out of range [0, %d)", id, s.tok.VocabSize())
			}
		}
		return ids, nil
	}
	return nil, badRequest("prompt", "prompt must be a string, an array of one string, or an array of token ids")
}

func (s *Server) encode(text string) []int {
	return s.tok.Encode(text, tokenizer.AddsBOS(s.tok), false)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case req.Echo != nil && *req.Echo:
		writeError(w, badRequest("echo", "echo is not supported"))
		return
	case req.Suffix != nil && *req.Suffix != "":
		writeError(w, badRequest("suffix", "suffix is not supported"))
		return
	case req.BestOf != nil && *req.BestOf != 1 && (req.N == nil || *req.BestOf != *req.N):
		writeError(w, badRequest("best_of", "best_of is not supported"))
		return
	case req.Logprobs != nil && *req.Logprobs > 0:
		writeError(w, badRequest("logprobs", "logprobs are not supported"))
		return
	}
	prompt, aerr := s.promptTokens(req.Prompt)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	gr, stops, aerr := s.params(&req.commonParams, 16) // OpenAI's default max_tokens for completions
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if len(prompt) == 0 {
		writeError(w, badRequest("prompt", "prompt is empty"))
		return
	}
	gr.Prompt = prompt
	if gr.PrefixTokens, aerr = kvPrefix(req.KV, prompt, s.encode); aerr != nil {
		writeError(w, aerr)
		return
	}
	gr.StopTokens = stopIDs(s.tok)
	if kv := req.KV; kv != nil && kv.Truncate != nil && *kv.Truncate {
		writeError(w, badRequest("kv.truncate", "kv.truncate drops whole turns of a chat; it applies to /v1/chat/completions"))
		return
	}
	s.generate(w, r, false, gr, stops, req.Stream != nil && *req.Stream, req.StreamOptions, 0, nil)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case req.Logprobs != nil && *req.Logprobs:
		writeError(w, badRequest("logprobs", "logprobs are not supported"))
		return
	case req.ResponseFormat != nil && req.ResponseFormat.Type != "" && req.ResponseFormat.Type != "text":
		writeError(w, badRequest("response_format", "response_format %q is not supported (only text)", req.ResponseFormat.Type))
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, badRequest("messages", "messages must hold at least one message"))
		return
	}
	tools, aerr := checkTools(req.Tools)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	auto, aerr := checkToolChoice(req.ToolChoice)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	history := slices.ContainsFunc(req.Messages, chatMessage.usesTools)
	var prompt []int
	var err error
	var tr *toolReply
	dropped := 0
	truncate := req.KV != nil && req.KV.Truncate != nil && *req.KV.Truncate
	switch tf, ok := s.toolsOf(); {
	case tools != nil || history:
		field := "tools"
		if tools == nil {
			field = "messages"
		}
		if !ok || (tools != nil && auto && tf.ToolSyntax() == "") {
			writeError(w, toolsRefused(s.opt.Format.Name(), ok, field))
			return
		}
		if truncate {
			writeError(w, badRequest("kv.truncate", "kv.truncate does not apply to a conversation with tools"))
			return
		}
		if !auto {
			tools = nil // "none": the model is not offered them
		}
		if prompt, aerr = s.encodeToolChat(tf, req.Messages, tools); aerr != nil {
			writeError(w, aerr)
			return
		}
		if tools != nil {
			tr = &toolReply{f: tf, tools: tools, parallel: req.ParallelToolCalls == nil || *req.ParallelToolCalls}
		}
	default:
		msgs := make([]chat.Message, 0, len(req.Messages))
		for i, m := range req.Messages {
			role, text, aerr := m.read(i, false)
			if aerr != nil {
				writeError(w, aerr)
				return
			}
			msgs = append(msgs, chat.Message{Role: role, Content: text})
		}
		if truncate {
			// The reply's share of the context, as kvlm chat gives it.
			ctx := s.m.CtxLen
			room := ctx / 4
			for _, v := range []*int{req.MaxTokens, req.MaxCompletionTokens} {
				if v != nil && *v >= 1 {
					room = min(*v, ctx/4)
				}
			}
			if prompt, _, dropped, err = FitTurns(s.opt.Format, s.tok, msgs, ctx, room); err != nil {
				writeError(w, badRequest("messages", "kv.truncate: %s", strings.TrimPrefix(err.Error(), "chat: ")))
				return
			}
		} else if prompt, err = s.opt.Format.Encode(s.tok, msgs); err != nil {
			writeError(w, badRequest("messages", "%s", strings.TrimPrefix(err.Error(), "chat: ")))
			return
		}
	}
	gr, stops, aerr := s.params(&req.commonParams, max(1, s.m.CtxLen-len(prompt)))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if len(prompt) == 0 {
		writeError(w, badRequest("messages", "the conversation renders to an empty prompt"))
		return
	}
	gr.Prompt = prompt
	gr.PrefixTokens, aerr = kvPrefix(req.KV, prompt, func(text string) []int { return s.opt.Format.EncodeText(s.tok, text, true) })
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	gr.StopTokens = s.opt.Format.StopIDs(s.tok)
	for _, st := range s.opt.Format.Stops() {
		if _, isToken := tokenizer.TokenID(s.tok, st); !isToken && len(stops) < maxStops {
			stops = append(stops, st)
		}
	}
	s.generate(w, r, true, gr, stops, req.Stream != nil && *req.Stream, req.StreamOptions, dropped, tr)
}

// messageText is a message's content: a string, null, or an array of text
// parts.
func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []contentPart
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&parts); err != nil {
		return "", errors.New("must be a string or an array of {\"type\":\"text\",\"text\":…} parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content parts of type %q are not supported (only text)", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// Response shapes.

type usageJSON struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails promptDetails `json:"prompt_tokens_details"`
	KV                  kvUsageJSON   `json:"kv"`
	Timings             *timingsJSON  `json:"timings,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type kvUsageJSON struct {
	BytesPeak    int64 `json:"bytes_peak"`    // the most KV memory the request held
	Bytes        int64 `json:"bytes"`         // KV memory when it ended
	CachedTokens int   `json:"cached_tokens"` // prompt tokens from the prefix cache
	StoreTokens  int   `json:"store_tokens"`  // prompt tokens loaded from the shared KV tier (--kv-store)
	// ComputedTokens is the prompt tokens the model ran (the rest came
	// from the cache; a preempted request's recomputation counts too).
	ComputedTokens int `json:"computed_tokens"`
	// CompressedTokens is the prompt tokens that came from a compressed
	// prefix (docs/PREFIX.md).
	CompressedTokens int `json:"compressed_tokens"`
	// DroppedTurns is the old turns kv.truncate dropped (chat).
	DroppedTurns  int    `json:"dropped_turns"`
	EvictedTokens int    `json:"evicted_tokens"` // tokens the policy dropped (per table, mean)
	Preemptions   int    `json:"preemptions"`
	Policy        string `json:"policy"`
	TypeK         string `json:"type_k"`
	TypeV         string `json:"type_v"`
}

type timingsJSON struct {
	TTFTMS  float64 `json:"ttft_ms"`
	TotalMS float64 `json:"total_ms"`
}

func usageOf(u engine.Usage) *usageJSON {
	return &usageJSON{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens,
		PromptTokensDetails: promptDetails{CachedTokens: u.CachedTokens},
		KV: kvUsageJSON{BytesPeak: u.KVBytesPeak, Bytes: u.KVBytes, CachedTokens: u.CachedTokens, StoreTokens: u.StoreTokens, ComputedTokens: u.ComputedTokens, CompressedTokens: u.CompressedTokens, EvictedTokens: u.EvictedTokens,
			Preemptions: u.Preemptions, Policy: u.Policy, TypeK: u.K, TypeV: u.V}}
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type chatMessageOut struct {
	Role      string         `json:"role,omitempty"`
	Content   *string        `json:"content"` // null when the reply is only tool calls
	ToolCalls []toolCallJSON `json:"tool_calls,omitempty"`
}

type chatDelta struct {
	Role      string         `json:"role,omitempty"`
	Content   *string        `json:"content,omitempty"`
	ToolCalls []toolCallJSON `json:"tool_calls,omitempty"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      *chatMessageOut `json:"message,omitempty"`
	Delta        *chatDelta      `json:"delta,omitempty"`
	Logprobs     any             `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type responseJSON struct {
	ID                string     `json:"id"`
	Object            string     `json:"object"`
	Created           int64      `json:"created"`
	Model             string     `json:"model"`
	SystemFingerprint string     `json:"system_fingerprint"`
	Choices           any        `json:"choices"`
	Usage             *usageJSON `json:"usage,omitempty"`
}

// finishName is the OpenAI finish_reason of an engine ending.
func finishName(f engine.FinishReason) string {
	switch f {
	case engine.FinishLength, engine.FinishContext:
		return "length"
	}
	return "stop"
}

// choiceState is one sample's text as it is built.
type choiceState struct {
	ts     *TextStream
	text   strings.Builder
	finish string // "" while running
	err    error
}

// generate runs an engine request and answers it, whole or streamed. With
// tr (a chat request offering tools), each reply is read for tool calls
// when it ends: its text is decoded with control tokens' text and, in a
// stream, held back until then.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, isChat bool, gr engine.GenRequest, stops []string, stream bool, so *streamOptions, dropped int, tr *toolReply) {
	start := time.Now()
	h, err := s.e.Submit(gr)
	if err != nil {
		writeError(w, engineError(err))
		return
	}
	defer h.Cancel() // the client went away or we are done: release at once
	ctx := r.Context()
	cs := make([]*choiceState, gr.N)
	var dec tokenizer.Tokenizer = s.tok
	if tr != nil {
		dec = specialText{s.tok}
	}
	for i := range cs {
		cs[i] = &choiceState{ts: NewTextStream(dec, gr.Prompt[len(gr.Prompt)-1], stops)}
	}
	id, created := newID("cmpl-"), time.Now().Unix()
	object := "text_completion"
	if isChat {
		id, object = newID("chatcmpl-"), "chat.completion"
	}
	resp := responseJSON{ID: id, Object: object, Created: created, Model: s.opt.ModelName, SystemFingerprint: "kvlm-" + engine.Fingerprint(s.m)[:12]}
	var sse *sseWriter
	if stream {
		sse = newSSE(w)
		if isChat {
			resp.Object = "chat.completion.chunk"
			for i := range cs {
				empty := ""
				resp.Choices = []chatChoice{{Index: i, Delta: &chatDelta{Role: "assistant", Content: &empty}}}
				if sse.send(resp) != nil {
					return
				}
			}
		}
	}
	var firstTok time.Duration
	// delta delivers new text of sample i (and its end, when fin != "").
	delta := func(i int, text, fin string) error {
		c := cs[i]
		c.text.WriteString(text)
		if fin != "" {
			c.finish = fin
		}
		if !stream || (text == "" && fin == "") || (tr != nil && fin == "") {
			return nil
		}
		var calls []toolCallJSON
		if tr != nil && c.err == nil {
			// The reply is whole: deliver it, read for calls, at once.
			text, calls, fin = tr.read(c.text.String(), fin)
			for k := range calls {
				calls[k].Index = &k
			}
		}
		var finp *string
		if fin != "" {
			finp = &fin
		}
		if isChat {
			d := &chatDelta{ToolCalls: calls}
			if text != "" {
				d.Content = &text
			}
			resp.Choices = []chatChoice{{Index: i, Delta: d, FinishReason: finp}}
		} else {
			resp.Choices = []completionChoice{{Index: i, Text: text, FinishReason: finp}}
		}
		return sse.send(resp)
	}
	for {
		ev, err := h.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return // the client is gone; the deferred Cancel frees the blocks
		}
		c := cs[ev.Choice]
		if c.finish != "" {
			continue // ended by a stop string; later events are dropped
		}
		if !ev.Done {
			if firstTok == 0 {
				firstTok = time.Since(start)
			}
			text, stopped := c.ts.Add(ev.Token)
			fin := ""
			if stopped {
				fin = "stop"
				h.StopChoice(ev.Choice)
			}
			if delta(ev.Choice, text, fin) != nil {
				return
			}
			continue
		}
		fin := finishName(ev.Finish)
		switch ev.Finish {
		case engine.FinishError:
			c.err = ev.Err
			s.log.Printf("kvlm server: generation failed: %v", ev.Err)
		case engine.FinishCancelled:
			// Only our own Cancel or shutdown get here.
			c.err = engine.ErrClosed
		}
		if c.err != nil {
			// A failed sample has no finish_reason: the stream ends with
			// an error event instead.
			fin = ""
			c.finish = "error"
		}
		if delta(ev.Choice, c.ts.Flush(), fin) != nil {
			return
		}
	}
	u := h.Usage()
	s.met.prompt(u.PromptTokens)
	usage := usageOf(u)
	usage.KV.DroppedTurns = dropped
	usage.Timings = &timingsJSON{TTFTMS: float64(firstTok) / 1e6, TotalMS: float64(time.Since(start)) / 1e6}
	var failed error
	for _, c := range cs {
		if c.err != nil {
			failed = c.err
		}
	}
	if stream {
		if failed != nil {
			sse.send(engineError(failed).body())
		} else if so != nil && so.IncludeUsage {
			resp.Choices = []any{}
			resp.Usage = usage
			sse.send(resp)
		}
		sse.done()
		return
	}
	if failed != nil {
		writeError(w, engineError(failed))
		return
	}
	resp.Usage = usage
	if isChat {
		ch := make([]chatChoice, len(cs))
		for i, c := range cs {
			text, f := c.text.String(), c.finish
			var calls []toolCallJSON
			if tr != nil {
				text, calls, f = tr.read(text, f)
			}
			m := &chatMessageOut{Role: "assistant", Content: &text, ToolCalls: calls}
			if text == "" && len(calls) > 0 {
				m.Content = nil
			}
			ch[i] = chatChoice{Index: i, Message: m, FinishReason: &f}
		}
		resp.Choices = ch
	} else {
		ch := make([]completionChoice, len(cs))
		for i, c := range cs {
			f := c.finish
			ch[i] = completionChoice{Index: i, Text: c.text.String(), FinishReason: &f}
		}
		resp.Choices = ch
	}
	writeJSON(w, http.StatusOK, resp)
}

// sseWriter writes server-sent events.
type sseWriter struct {
	w   http.ResponseWriter
	f   http.Flusher
	err error
}

func newSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	return &sseWriter{w: w, f: f}
}

func (s *sseWriter) send(v any) error {
	if s.err != nil {
		return s.err
	}
	b, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return err
	}
	if _, err := fmt.Fprintf(s.w, "data: %s\n\n", b); err != nil {
		s.err = err
		return err
	}
	if s.f != nil {
		s.f.Flush()
	}
	return nil
}

func (s *sseWriter) done() {
	if s.err == nil {
		fmt.Fprint(s.w, "data: [DONE]\n\n")
		if s.f != nil {
			s.f.Flush()
		}
	}
}
