package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/engine"
)

func TestEngineErrorStatus(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		status int
		retry  bool
	}{
		{"invalid", &engine.InvalidError{Msg: "prompt too long"}, 400, false},
		{"queue full", fmt.Errorf("%w (3 requests waiting); retry later", engine.ErrQueueFull), 429, true},
		{"closed", engine.ErrClosed, 503, true},
		{"no slot", engine.ErrNoSlot, 404, false},
		{"canceled", context.Canceled, 499, false},
		{"deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), 504, false},
		{"other", errors.New("engine: internal error: boom"), 500, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			writeError(w, engineError(c.err))
			if w.Code != c.status {
				t.Errorf("status %d, want %d", w.Code, c.status)
			}
			if got := w.Header().Get("Retry-After") != ""; got != c.retry {
				t.Errorf("Retry-After %q", w.Header().Get("Retry-After"))
			}
			apiErr(t, w.Body.Bytes())
		})
	}
}

// A stream cut by the engine (here, shutting down) ends with an error
// event, and no sample claims finish_reason "stop".
func TestStreamErrorNotStop(t *testing.T) {
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			f := newFixture(t, engine.Config{}, Options{})
			// Greedy, the text runs 341 tokens (about 0.5 s here) before EOS:
			// the shutdown comes long before.
			body := map[string]any{"max_tokens": 400, "temperature": 0, "stream": true, "n": 2, "kv": map[string]any{"cache_prompt": false}}
			if path == "/v1/completions" {
				body["prompt"] = "Once upon a time"
			} else {
				body["messages"] = []map[string]any{{"role": "user", "content": "Once upon a time"}}
			}
			b, _ := json.Marshal(body)
			resp, err := http.Post(f.ts.URL+path, "application/json", strings.NewReader(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			// Read a few events, then shut the engine down.
			var head strings.Builder
			for range 8 {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("stream ended early: %v %q", err, head.String())
				}
				head.WriteString(line)
			}
			f.srv.Close()
			chunks, done, err := readSSE(strings.NewReader(head.String() + readAll(br)))
			if err != nil || !done {
				t.Fatalf("stream: done %v, %v", done, err)
			}
			var errEvent map[string]any
			for _, c := range chunks {
				if e, ok := c["error"].(map[string]any); ok {
					errEvent = e
					continue
				}
				for _, ch := range c["choices"].([]any) {
					if fr := ch.(map[string]any)["finish_reason"]; fr == "stop" {
						t.Errorf("finish_reason stop in a failed stream: %v", c)
					}
				}
			}
			if errEvent == nil || errEvent["message"] == "" {
				t.Errorf("no error event in %v", chunks[len(chunks)-3:])
			}
		})
	}
}

func readAll(br *bufio.Reader) string {
	var b strings.Builder
	br.WriteTo(&b)
	return b.String()
}

func TestSlotOrphansRemoved(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{".slot-123.tmp", ".slot-.tmp", ".slot-9abc.tmp", "keep.slot", ".slot-x.tmpx", "slot-1.tmp"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, ".slot-dir.tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	newFixture(t, engine.Config{}, Options{SlotDir: dir})
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := ".slot-dir.tmp .slot-x.tmpx keep.slot slot-1.tmp"; strings.Join(left, " ") != want {
		t.Errorf("slot dir holds %v, want %s", left, want)
	}
}

// Slot errors are 4xx with a message, and no response names a server path.
func TestSlotErrors(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, engine.Config{}, Options{SlotDir: dir})
	if code, body := f.post(t, "/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 8, "kv": map[string]any{"slot": 1}}); code != 200 {
		t.Fatal(body)
	}
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "adir", "inner"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "junk.slot"), []byte("not a slot"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, body string
		status           int
		msg              string
	}{
		{"save onto a directory", "/v1/slots/1?action=save", `{"filename":"adir"}`, 409, "not a regular file"},
		{"save onto an empty directory", "/v1/slots/1?action=save", `{"filename":"empty"}`, 409, "not a regular file"},
		{"restore a directory", "/v1/slots/0?action=restore", `{"filename":"adir"}`, 409, "not a regular file"},
		{"restore a missing file", "/v1/slots/0?action=restore", `{"filename":"none.slot"}`, 404, "no slot file"},
		{"restore junk", "/v1/slots/0?action=restore", `{"filename":"junk.slot"}`, 400, "not a kvlm slot file"},
		{"save an empty slot", "/v1/slots/7?action=save", `{"filename":"e.slot"}`, 404, "empty"},
		{"erase an empty slot", "/v1/slots/7?action=erase", `{}`, 404, "empty"},
		{"save", "/v1/slots/1?action=save", `{"filename":"ok.slot"}`, 200, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, raw := f.do(t, "POST", c.path, map[string]string{"Content-Type": "application/json"}, c.body)
			if code != c.status {
				t.Fatalf("status %d, want %d: %s", code, c.status, raw)
			}
			if strings.Contains(string(raw), dir) || strings.Contains(string(raw), os.TempDir()) {
				t.Errorf("the response names a server path: %s", raw)
			}
			if c.msg != "" && !strings.Contains(apiErr(t, raw).Message, c.msg) {
				t.Errorf("message %s, want %q", raw, c.msg)
			}
		})
	}
	// Errors of the file system itself: their paths are cut.
	for _, err := range []error{
		&os.PathError{Op: "open", Path: "/srv/slots/x", Err: os.ErrPermission},
		&os.LinkError{Op: "rename", Old: "/srv/slots/.slot-1.tmp", New: "/srv/slots/x", Err: errors.New("file exists")},
		fmt.Errorf("engine: %w", &os.PathError{Op: "write", Path: "/srv/slots/.slot-2.tmp", Err: errors.New("no space left on device")}),
	} {
		if ae := slotError(err, "write"); strings.Contains(ae.msg, "/srv") || ae.status < 400 {
			t.Errorf("%v → %d %q", err, ae.status, ae.msg)
		}
	}
	f.post(t, "/v1/slots/1?action=erase", nil)
	waitFree(t, f.srv.Engine())
}
