// Package server is kvlm's OpenAI-compatible HTTP server over the
// continuous-batching engine: /v1/completions and /v1/chat/completions
// (streaming as server-sent events), /v1/models, /health, /metrics
// (Prometheus, with the vLLM names gateways scrape) and sequence slots
// saved to and restored from files (/v1/slots/{id}?action=save|restore|erase).
//
// Each request may carry a "kv" object choosing its own KV cache policy and
// codecs, e.g. {"policy":"snapkv","ratio":0.25,"type_k":"q8"}. Everything a
// client sends is validated: bad JSON, wrong types, unknown fields, values
// out of range and oversized bodies are answered 4xx with a message.
//
// A guard runs before every endpoint (guard.go): the Host header must name
// the server (against DNS rebinding), an API key is checked when one is
// set (all but /health), every request other than GET, HEAD and OPTIONS
// must be Content-Type: application/json (so no web page can post a form
// to it), and the body is read within a deadline. HTTPServer and
// LimitListener add the connection limits (listen.go).
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/kvevents"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Options configure a Server. Zero fields take the defaults given.
type Options struct {
	ModelName string     // the name /v1/models lists and requests must use ("kvlm")
	MaxBody   int64      // request body limit in bytes (1 MiB)
	SlotDir   string     // directory of slot files; "" disables save and restore
	Format    ChatFormat // chat template (plain)
	Logger    *log.Logger

	// APIKey, when set, is required of every request except /health, as
	// "Authorization: Bearer KEY".
	APIKey string
	// ListenAddr is the address the server listens on (host:port); it
	// decides which Host headers are accepted (see guard.go). "" takes the
	// loopback rule.
	ListenAddr string
	// AllowedHosts are further host names accepted in the Host header
	// ("*": any).
	AllowedHosts []string
	// BodyTimeout bounds the reading of a request body, from the end of
	// its headers (10s); negative: none.
	BodyTimeout time.Duration
	// HeaderTimeout bounds the reading of the request line and headers
	// (10s), IdleTimeout a kept-alive connection between requests (60s);
	// both apply to HTTPServer.
	HeaderTimeout, IdleTimeout time.Duration
	// WriteTimeout bounds each write of a response, a stream's events one
	// by one (30s): a client that stops reading loses its request.
	WriteTimeout time.Duration
	// KVEvents, if set, publishes the default pool's prefix blocks as
	// vLLM's KV events (docs/KVEVENTS.md); its counters join /metrics. The
	// caller closes it after the server.
	KVEvents *kvevents.Publisher
}

// Server answers the HTTP API. It owns its engine.
type Server struct {
	e       *engine.Engine
	m       *model.Model
	tok     tokenizer.Tokenizer
	opt     Options
	met     *metrics
	mux     *http.ServeMux
	handler http.Handler
	created int64
	closing atomic.Bool
	log     *log.Logger
}

// New starts an engine over m with cfg and a server over it.
func New(m *model.Model, tok tokenizer.Tokenizer, cfg engine.Config, opt Options) (*Server, error) {
	if opt.ModelName == "" {
		opt.ModelName = "kvlm"
	}
	if opt.MaxBody <= 0 {
		opt.MaxBody = 1 << 20
	}
	if opt.Format == nil {
		opt.Format = plainFormat{}
	}
	if opt.Logger == nil {
		opt.Logger = log.Default()
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&opt.BodyTimeout, DefaultBodyTimeout}, {&opt.HeaderTimeout, DefaultHeaderTimeout}, {&opt.IdleTimeout, DefaultIdleTimeout}, {&opt.WriteTimeout, DefaultWriteTimeout}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	s := &Server{m: m, tok: tok, opt: opt, created: time.Now().Unix(), log: opt.Logger}
	if opt.SlotDir != "" {
		s.removeOrphans()
	}
	obs := &lateObserver{}
	cfg.Observer = obs
	if opt.KVEvents != nil {
		cfg.PrefixObserver = opt.KVEvents
	}
	e, err := engine.New(m, cfg)
	if err != nil {
		return nil, err
	}
	if opt.KVEvents != nil {
		if bs, et := opt.KVEvents.Config().BlockSize, e.Config().BlockTokens; bs != et {
			e.Close()
			return nil, fmt.Errorf("the KV event publisher has blocks of %d tokens, the engine %d", bs, et)
		}
	}
	s.e = e
	s.met = newMetrics(e, opt.ModelName, opt.KVEvents)
	obs.m.Store(s.met)
	s.mux = http.NewServeMux()
	s.route("/v1/completions", "completions", http.MethodPost, s.completions)
	s.route("/v1/chat/completions", "chat", http.MethodPost, s.chatCompletions)
	s.route("/v1/models", "models", http.MethodGet, s.models)
	s.route("/health", "health", http.MethodGet, s.health)
	s.route("/v1/slots", "slots", http.MethodGet, s.listSlots)
	s.route("/v1/slots/{id}", "slots", http.MethodPost, s.slotAction)
	s.route("/reset_prefix_cache", "reset_prefix_cache", http.MethodPost, s.resetPrefixCache)
	metricsHandler := promhttp.HandlerFor(s.met.reg, promhttp.HandlerOpts{})
	s.route("/metrics", "metrics", http.MethodGet, metricsHandler.ServeHTTP)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path), typ: "not_found_error"})
	})
	s.handler = s.guard(s.mux)
	return s, nil
}

// resetPrefixCache forgets every cached prefix (vLLM's POST
// /reset_prefix_cache; the KV events send AllBlocksCleared) and answers
// {"cleared": entries}.
func (s *Server) resetPrefixCache(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]int{"cleared": s.e.ResetPrefixCache()})
}

// lateObserver forwards to the metrics once they exist (they need the
// engine, which needs an observer).
type lateObserver struct{ m atomic.Pointer[metrics] }

func (o *lateObserver) get() *metrics { return o.m.Load() }
func (o *lateObserver) FirstToken(d time.Duration) {
	if m := o.get(); m != nil {
		m.FirstToken(d)
	}
}
func (o *lateObserver) InterToken(d time.Duration) {
	if m := o.get(); m != nil {
		m.InterToken(d)
	}
}
func (o *lateObserver) Step(p, g int, d time.Duration) {
	if m := o.get(); m != nil {
		m.Step(p, g, d)
	}
}
func (o *lateObserver) Evicted(p string, n float64) {
	if m := o.get(); m != nil {
		m.Evicted(p, n)
	}
}
func (o *lateObserver) Preempted() {
	if m := o.get(); m != nil {
		m.Preempted()
	}
}
func (o *lateObserver) Finished(r engine.FinishReason, e2e time.Duration) {
	if m := o.get(); m != nil {
		m.Finished(r, e2e)
	}
}

// Engine is the server's engine.
func (s *Server) Engine() *engine.Engine { return s.e }

// Handler is the HTTP handler of the whole API, behind the guard (Host,
// API key, Content-Type and body checks; see guard.go).
func (s *Server) Handler() http.Handler { return s.handler }

// Close stops the engine (requests in flight end) after the HTTP server
// has stopped taking requests.
func (s *Server) Close() {
	s.closing.Store(true)
	s.e.Close()
}

// route registers a handler for one method, with panic recovery, a JSON
// 405 for other methods and the request counter.
func (s *Server) route(path, name, method string, h http.HandlerFunc) {
	s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.log.Printf("kvlm server: panic in %s: %v\n%s", path, p, debug.Stack())
				if !sw.wrote {
					writeError(sw, &apiError{status: 500, msg: "internal error", typ: "server_error"})
				}
			}
			s.met.requests.WithLabelValues(name, fmt.Sprint(sw.code())).Inc()
		}()
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			sw.Header().Set("Allow", method)
			writeError(sw, &apiError{status: http.StatusMethodNotAllowed, msg: fmt.Sprintf("%s takes %s, not %s", path, method, r.Method), typ: "invalid_request_error"})
			return
		}
		h(sw, r)
	})
}

// statusWriter records the status code and passes flushes through.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(c int) {
	if !w.wrote {
		w.status, w.wrote = c, true
	}
	w.ResponseWriter.WriteHeader(c)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = 200, true
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) code() int {
	if w.status == 0 {
		return 200
	}
	return w.status
}

// apiError is an error answered in OpenAI's format.
type apiError struct {
	status int
	msg    string
	typ    string
	param  string
	code   string
	// retryAfter is the Retry-After (seconds) writeError sends with a 429
	// or 503 (1 when 0): the engine's hint for a capacity limit.
	retryAfter int
}

func (e *apiError) Error() string { return e.msg }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...), typ: "invalid_request_error", param: param}
}

type errorBody struct {
	Error errorJSON `json:"error"`
}

type errorJSON struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

func (e *apiError) body() errorBody {
	b := errorBody{Error: errorJSON{Message: e.msg, Type: e.typ, Code: e.code}}
	if e.param != "" {
		b.Error.Param = &e.param
	}
	if e.code == "" {
		b.Error.Code = nil
	}
	return b
}

// writeError answers e. 429 and 503 are retryable: they carry Retry-After.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.typ == "" {
		e.typ = "invalid_request_error"
	}
	if (e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable) && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, e.retryAfter)))
	}
	writeJSON(w, e.status, e.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = 500
		b = []byte(`{"error":{"message":"cannot encode the response","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// engineError maps an engine error to an HTTP answer; it is the one place
// that does (slotError adds the file errors of slots). The client's fault
// (*engine.InvalidError) is 400; a capacity limit (*engine.CapacityError)
// is retryable, 429 for the full queue and 503 for the codec pools or the
// KV memory, which writeError sends with Retry-After (the engine's hint).
func engineError(err error) *apiError {
	var ie *engine.InvalidError
	var ce *engine.CapacityError
	switch {
	case errors.As(err, &ie):
		return badRequest("", "%s", ie.Msg)
	case errors.Is(err, engine.ErrNoSlot):
		return &apiError{status: http.StatusNotFound, msg: "the slot is empty", typ: "invalid_request_error", param: "id"}
	case errors.As(err, &ce), errors.Is(err, engine.ErrQueueFull):
		ae := &apiError{status: http.StatusServiceUnavailable, msg: err.Error(), typ: "server_error"}
		if ce != nil {
			ae.retryAfter = int((ce.RetryAfter + time.Second - 1) / time.Second)
		}
		switch {
		case errors.Is(err, engine.ErrQueueFull):
			ae.status, ae.typ, ae.code = http.StatusTooManyRequests, "rate_limit_error", "queue_full"
		case errors.Is(err, engine.ErrPoolsBusy):
			ae.code = "kv_pools_busy"
		case errors.Is(err, engine.ErrKVBusy):
			ae.code = "kv_memory_busy"
		}
		return ae
	case errors.Is(err, engine.ErrClosed):
		return &apiError{status: http.StatusServiceUnavailable, msg: "the server is shutting down", typ: "server_error"}
	case errors.Is(err, context.Canceled):
		return &apiError{status: 499, msg: "client closed the request", typ: "invalid_request_error"}
	case errors.Is(err, context.DeadlineExceeded):
		return &apiError{status: http.StatusGatewayTimeout, msg: "the request timed out", typ: "server_error"}
	}
	return &apiError{status: http.StatusInternalServerError, msg: err.Error(), typ: "server_error"}
}

func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.closing.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "shutting down"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": s.opt.ModelName, "object": "model", "created": s.created, "owned_by": "kvlm",
			"max_model_len": s.m.CtxLen, "chat_template": s.opt.Format.Name(),
		}},
	})
}
