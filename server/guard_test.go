package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/engine"
)

// do sends a request with the given headers and returns the status, the
// response headers and the raw body.
func (f *fixture) do(t testing.TB, method, path string, hdr map[string]string, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == "" {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, raw
}

// apiErr decodes an OpenAI error body; it fails the test if the body is
// not one.
func apiErr(t testing.TB, raw []byte) errorJSON {
	t.Helper()
	var b struct {
		Error *errorJSON `json:"error"`
	}
	if err := json.Unmarshal(raw, &b); err != nil || b.Error == nil || b.Error.Message == "" || b.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %q", raw)
	}
	return *b.Error
}

func TestAPIKey(t *testing.T) {
	const key = "sk-test-0123456789"
	f := newFixture(t, engine.Config{}, Options{APIKey: key})
	completion := `{"prompt":"Once upon a time","max_tokens":2}`
	cases := []struct {
		name, method, path, auth, body string
		status                         int
	}{
		{"completion without key", "POST", "/v1/completions", "", completion, 401},
		{"completion wrong key", "POST", "/v1/completions", "Bearer sk-wrong", completion, 401},
		{"completion key prefix", "POST", "/v1/completions", "Bearer " + key[:len(key)-1], completion, 401},
		{"completion key longer", "POST", "/v1/completions", "Bearer " + key + "x", completion, 401},
		{"completion basic auth", "POST", "/v1/completions", "Basic " + key, completion, 401},
		{"completion bare key", "POST", "/v1/completions", key, completion, 401},
		{"completion empty bearer", "POST", "/v1/completions", "Bearer ", completion, 401},
		{"chat without key", "POST", "/v1/chat/completions", "", `{"messages":[{"role":"user","content":"a"}],"max_tokens":2}`, 401},
		{"slot erase without key", "POST", "/v1/slots/0?action=erase", "", `{}`, 401},
		{"slots without key", "GET", "/v1/slots", "", "", 401},
		{"models without key", "GET", "/v1/models", "", "", 401},
		{"metrics without key", "GET", "/metrics", "", "", 401},
		{"unknown path without key", "GET", "/v1/secret", "", "", 401},
		{"health without key", "GET", "/health", "", "", 200},
		{"models with key", "GET", "/v1/models", "Bearer " + key, "", 200},
		{"metrics with key", "GET", "/metrics", "Bearer " + key, "", 200},
		{"lower-case scheme", "GET", "/v1/models", "bearer " + key, "", 200},
		{"completion with key", "POST", "/v1/completions", "Bearer " + key, completion, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{"Content-Type": "application/json"}
			if c.auth != "" {
				hdr["Authorization"] = c.auth
			}
			code, h, raw := f.do(t, c.method, c.path, hdr, c.body)
			if code != c.status {
				t.Fatalf("status %d, want %d: %s", code, c.status, raw)
			}
			if code == 401 {
				e := apiErr(t, raw)
				if e.Code != "invalid_api_key" || h.Get("WWW-Authenticate") == "" {
					t.Errorf("401 body %s, WWW-Authenticate %q", raw, h.Get("WWW-Authenticate"))
				}
				if strings.Contains(string(raw), key[3:]) {
					t.Errorf("the 401 echoes the key: %s", raw)
				}
			}
		})
	}
	// Only the one authorized completion reached the engine.
	want := int64(len(f.srv.encode("Once upon a time")))
	if st := f.srv.Engine().Stats(); st.PrefixQueried != want {
		t.Errorf("the engine saw %d prompt tokens, want the %d of the authorized request", st.PrefixQueried, want)
	}
}

// A browser can send a form or a no-cors fetch to any address without a
// preflight: none of them may act.
func TestContentTypeRequired(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{SlotDir: t.TempDir()})
	if code, body := f.post(t, "/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 4, "kv": map[string]any{"slot": 3}}); code != 200 {
		t.Fatalf("filling slot 3: %d %v", code, body)
	}
	type ep struct{ path, body string }
	endpoints := []ep{
		{"/v1/completions", `{"prompt":"a","max_tokens":1}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":1}`},
		{"/v1/slots/3?action=save", `{"filename":"x.slot"}`},
		{"/v1/slots/3?action=restore", `{"filename":"x.slot"}`},
		{"/v1/slots/3?action=erase", ``},
		{"/v1/slots/3?action=erase", `{}`},
	}
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/vnd.api+json", "application/jsonx", "text/json"} {
		for _, e := range endpoints {
			t.Run(ct+" "+e.path, func(t *testing.T) {
				hdr := map[string]string{}
				if ct != "" {
					hdr["Content-Type"] = ct
				}
				code, _, raw := f.do(t, "POST", e.path, hdr, e.body)
				if code != http.StatusUnsupportedMediaType {
					t.Fatalf("status %d, want 415: %s", code, raw)
				}
				if msg := apiErr(t, raw).Message; !strings.Contains(msg, "application/json") {
					t.Errorf("message %q", msg)
				}
			})
		}
	}
	code, _, raw := f.do(t, "GET", "/v1/slots", nil, "")
	if code != 200 || !strings.Contains(string(raw), `"id":3`) {
		t.Errorf("slot 3 is gone after the refused requests: %d %s", code, raw)
	}
	// application/json with parameters is fine.
	code, _, raw = f.do(t, "POST", "/v1/slots/3?action=erase", map[string]string{"Content-Type": "application/json; charset=utf-8"}, "")
	if code != 200 {
		t.Errorf("erase with application/json; charset=utf-8: %d %s", code, raw)
	}
}

func TestHostHeader(t *testing.T) {
	cases := []struct {
		listen  string
		allowed []string
		host    string
		ok      bool
	}{
		{"127.0.0.1:8080", nil, "127.0.0.1:8080", true},
		{"127.0.0.1:8080", nil, "127.0.0.1", true},
		{"127.0.0.1:8080", nil, "localhost", true},
		{"127.0.0.1:8080", nil, "LOCALHOST:9", true},
		{"127.0.0.1:8080", nil, "localhost.", true},
		{"127.0.0.1:8080", nil, "app.localhost:8080", true},
		{"127.0.0.1:8080", nil, "[::1]:8080", true},
		{"127.0.0.1:8080", nil, "[::1]", true},
		{"127.0.0.1:8080", nil, "127.1.2.3", true},
		{"127.0.0.1:8080", nil, "evil.example:8080", false},
		{"127.0.0.1:8080", nil, "localhost.evil.example", false},
		{"127.0.0.1:8080", nil, "192.168.1.5:8080", false},
		{"127.0.0.1:8080", nil, "0.0.0.0:8080", false},
		{"127.0.0.1:8080", nil, "", false},
		{"127.0.0.1:8080", []string{"kvlm.lan"}, "KVLM.lan:8080", true},
		{"127.0.0.1:8080", []string{"kvlm.lan"}, "other.lan", false},
		{"127.0.0.1:8080", []string{"*"}, "anything.example", true},
		{"", nil, "127.0.0.1:1", true},
		{"", nil, "10.0.0.1", false},
		{"[::1]:8080", nil, "[::1]:8080", true},
		{"[::1]:8080", nil, "evil.example", false},
		{"0.0.0.0:8080", nil, "192.168.1.5:8080", true},
		{"0.0.0.0:8080", nil, "[fe80::1]:8080", true},
		{"0.0.0.0:8080", nil, "localhost:8080", true},
		{"0.0.0.0:8080", nil, "0.0.0.0:8080", false},
		{"0.0.0.0:8080", nil, "[::]:8080", false},
		{"0.0.0.0:8080", nil, "evil.example", false},
		{"0.0.0.0:8080", []string{"gpu1.lan", "api.example.com:443"}, "api.example.com", true},
		{"0.0.0.0:8080", []string{"gpu1.lan"}, "gpu1.lan:8080", true},
		{"[::]:8080", nil, "10.1.2.3", true},
		{"10.0.0.2:8080", nil, "10.0.0.2:8080", true},
		{"10.0.0.2:8080", nil, "rebind.evil.example", false},
	}
	for _, c := range cases {
		t.Run(c.listen+" "+strings.Join(c.allowed, ",")+" "+c.host, func(t *testing.T) {
			allowed := map[string]bool{}
			for _, h := range c.allowed {
				allowed[normalHost(h)] = true
			}
			got := allowed["*"] || hostAllowed(c.host, listensOnLoopback(c.listen), allowed)
			if got != c.ok {
				t.Errorf("allowed = %v, want %v", got, c.ok)
			}
		})
	}
	// Through the server: a rebinding page's Host gets 403 on every
	// endpoint, /health included; the allow-list lets a name in.
	f := newFixture(t, engine.Config{}, Options{ListenAddr: "127.0.0.1:8080", AllowedHosts: []string{"kvlm.lan"}})
	for _, c := range []struct {
		method, path, host, body string
		status                   int
	}{
		{"GET", "/health", "evil.example:8080", "", 403},
		{"GET", "/v1/models", "evil.example", "", 403},
		{"POST", "/v1/completions", "evil.example", `{"prompt":"a","max_tokens":1}`, 403},
		{"POST", "/v1/slots/0?action=erase", "evil.example", `{}`, 403},
		{"GET", "/v1/models", "localhost:8080", "", 200},
		{"GET", "/v1/models", "kvlm.lan", "", 200},
	} {
		code, _, raw := f.do(t, c.method, c.path, map[string]string{"Host": c.host, "Content-Type": "application/json"}, c.body)
		if code != c.status {
			t.Errorf("%s %s Host %s: %d, want %d: %s", c.method, c.path, c.host, code, c.status, raw)
		}
		if code == 403 && apiErr(t, raw).Code != "host_not_allowed" {
			t.Errorf("403 body %s", raw)
		}
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:8080": true, "localhost:8080": true, "127.0.0.2:1": true,
		"0.0.0.0:8080": false, "[::]:8080": false, ":8080": false, "10.0.0.1:80": false, "example.com:80": false, "": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
