package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvlm/kvlm/engine"
)

// Capacity limits (*engine.CapacityError) are retryable: 429 or 503 with
// the engine's Retry-After hint and a code naming the limit; invalid input
// is 400 without it.
func TestCapacityErrorStatus(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		status int
		code   string
		retry  string
	}{
		{"invalid", &engine.InvalidError{Msg: "bad"}, 400, "", ""},
		{"queue full", fmt.Errorf("submit: %w", &engine.CapacityError{Err: engine.ErrQueueFull, Msg: "full", RetryAfter: time.Second}), 429, "queue_full", "1"},
		{"pools busy", &engine.CapacityError{Err: engine.ErrPoolsBusy, Msg: "busy", RetryAfter: 2500 * time.Millisecond}, 503, "kv_pools_busy", "3"},
		{"kv busy", &engine.CapacityError{Err: engine.ErrKVBusy, Msg: "kv", RetryAfter: 0}, 503, "kv_memory_busy", "1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			writeError(w, engineError(c.err))
			var body errorBody
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			code, _ := body.Error.Code.(string)
			if w.Code != c.status || code != c.code || w.Header().Get("Retry-After") != c.retry {
				t.Errorf("status %d code %q Retry-After %q, want %d %q %q", w.Code, code, w.Header().Get("Retry-After"), c.status, c.code, c.retry)
			}
		})
	}
}

// A request for a new codec pair while every pool is held by running
// requests gets 503 and Retry-After, and succeeds once they end.
func TestPoolsBusyRetryable(t *testing.T) {
	f := newFixture(t, engine.Config{MaxPools: 2}, Options{})
	resp, err := http.Post(f.ts.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"Once upon a time","max_tokens":250,"stream":true,"kv":{"type_k":"q8","type_v":"q8"}}`))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil { // the q8 request runs
		t.Fatal(err)
	}
	r2, err := http.Post(f.ts.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"Once upon a time","max_tokens":2,"kv":{"type_k":"f16"}}`))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 503 || r2.Header.Get("Retry-After") == "" || !strings.Contains(string(raw), "kv_pools_busy") {
		t.Errorf("f16 keys while q8 runs: %d Retry-After %q %s", r2.StatusCode, r2.Header.Get("Retry-After"), raw)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waitFree(t, f.srv.Engine())
	if code, body := f.post(t, "/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 2, "kv": map[string]any{"type_k": "f16"}}); code != 200 {
		t.Errorf("f16 keys once q8 ended: %d %v", code, body)
	}
}
