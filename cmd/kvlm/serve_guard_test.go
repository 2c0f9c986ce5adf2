package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// startServe runs kvlm serve with args on stories260K and returns its base
// URL and its stderr; the server stops at the end of the test.
func startServe(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	s := storiesFiles(t)
	var out syncBuffer
	errOut := &syncBuffer{}
	root := newRoot(&out, errOut)
	root.SetArgs(append([]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--kv-mem", "4MiB", "--max-running", "4"}, args...))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve returned %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop")
		}
	})
	re := regexp.MustCompile(`listening on (http://\S+)`)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if m := re.FindStringSubmatch(errOut.String()); m != nil {
			u := m[1]
			// A 0.0.0.0 listener is reached through loopback.
			u = strings.Replace(u, "//0.0.0.0:", "//127.0.0.1:", 1)
			u = strings.Replace(u, "//[::]:", "//127.0.0.1:", 1)
			return u, errOut
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended (%v): %s", err, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address in %q", errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func get(t *testing.T, u string, hdr map[string]string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestServeAPIKey(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  string
	}{
		{"flag", []string{"--addr", "127.0.0.1:0", "--api-key", "s3cret"}, ""},
		{"env", []string{"--addr", "127.0.0.1:0"}, "s3cret"},
		{"flag over env", []string{"--addr", "127.0.0.1:0", "--api-key", "s3cret"}, "other"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("KVLM_API_KEY", c.env)
			u, _ := startServe(t, c.args...)
			if code := get(t, u+"/v1/models", nil); code != 401 {
				t.Errorf("no key: %d", code)
			}
			if code := get(t, u+"/v1/models", map[string]string{"Authorization": "Bearer other"}); code != 401 {
				t.Errorf("wrong key: %d", code)
			}
			if code := get(t, u+"/v1/models", map[string]string{"Authorization": "Bearer s3cret"}); code != 200 {
				t.Errorf("key: %d", code)
			}
			if code := get(t, u+"/health", nil); code != 200 {
				t.Errorf("/health: %d", code)
			}
		})
	}
	_, errOut, code := kvlm(t, "serve", "-m", "x", "--api-key", " padded")
	if code == 0 || !strings.Contains(errOut, "--api-key") {
		t.Errorf("padded key: %d %q", code, errOut)
	}
}

func TestServeConnectionFlagValues(t *testing.T) {
	for _, c := range []struct{ flag, value string }{
		{"--header-timeout", "-1s"}, {"--body-timeout", "-1ms"}, {"--idle-timeout", "-2s"}, {"--write-timeout", "-1s"},
		{"--max-conns", "-1"}, {"--body-timeout", "soon"},
	} {
		t.Run(c.flag+" "+c.value, func(t *testing.T) {
			_, errOut, code := kvlm(t, "serve", "-m", "x", c.flag, c.value)
			if code == 0 || !strings.Contains(errOut, c.flag) {
				t.Errorf("code %d, %q", code, errOut)
			}
		})
	}
}

// Listening on a non-loopback address without a key warns, in one line.
func TestServeWarning(t *testing.T) {
	const warning = "without --api-key"
	for _, c := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--addr", "0.0.0.0:0"}, true},
		{[]string{"--addr", "0.0.0.0:0", "--api-key", "k"}, false},
		{[]string{"--addr", "127.0.0.1:0"}, false},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Setenv("KVLM_API_KEY", "")
			_, errOut := startServe(t, c.args...)
			got := strings.Count(errOut.String(), warning)
			if (got == 1) != c.warn || got > 1 {
				t.Errorf("%d warnings in %q", got, errOut.String())
			}
		})
	}
}

func TestServeAllowedHosts(t *testing.T) {
	u, _ := startServe(t, "--addr", "127.0.0.1:0", "--allowed-hosts", "kvlm.lan,api.example")
	for host, want := range map[string]int{"kvlm.lan": 200, "api.example:443": 200, "evil.example": 403, "localhost": 200} {
		if code := get(t, u+"/v1/models", map[string]string{"Host": host}); code != want {
			t.Errorf("Host %s: %d, want %d", host, code, want)
		}
	}
}

// The connection flags reach the HTTP server: a trickled header or body
// and an idle connection are cut at their timeouts, and past --max-conns
// a connection waits.
func TestServeConnectionFlags(t *testing.T) {
	u, _ := startServe(t, "--addr", "127.0.0.1:0", "--header-timeout", "300ms", "--body-timeout", "300ms", "--idle-timeout", "300ms", "--max-conns", "2")
	pu, _ := url.Parse(u)
	addr := pu.Host
	// closedWithin dials, writes first, and reports how long until the
	// server closed the connection (reading whatever it answered).
	closedWithin := func(first string, trickle bool) (time.Duration, string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		c.Write([]byte(first))
		stop := make(chan struct{})
		if trickle {
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
						if _, err := c.Write([]byte("a")); err != nil {
							return
						}
					}
				}
			}()
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		raw, _ := io.ReadAll(c)
		close(stop)
		return time.Since(start), string(raw)
	}
	if d, _ := closedWithin("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", true); d > 3*time.Second {
		t.Errorf("trickled header held the connection %v", d)
	}
	d, raw := closedWithin("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", true)
	if d > 3*time.Second || !strings.Contains(raw, " 408 ") {
		t.Errorf("trickled body held the connection %v, answer %q", d, raw)
	}
	if d, raw := closedWithin("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", false); d > 3*time.Second || !strings.Contains(raw, " 200 ") {
		t.Errorf("idle connection held %v, answer %q", d, raw)
	}
	// Two connections that send nothing fill --max-conns 2: a third
	// request waits until one goes (here, at its header timeout).
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	time.Sleep(50 * time.Millisecond) // both accepted
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.Write([]byte("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	waited := time.Since(start)
	if err != nil || !strings.Contains(line, " 200 ") {
		t.Fatalf("third connection: %q %v", line, err)
	}
	if waited < 150*time.Millisecond {
		t.Errorf("the third connection was served after %v, while two held the limit of 2", waited)
	}
}
