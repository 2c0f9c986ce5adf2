package server

import (
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvlm/kvlm/engine"
)

// serveReal serves f's server through HTTPServer on a loopback listener
// limited to maxConns, and returns its address.
func serveReal(t *testing.T, f *fixture, maxConns int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := f.srv.HTTPServer(log.New(io.Discard, "", 0))
	go hs.Serve(LimitListener(ln, maxConns))
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String()
}

// trickle writes first, then a byte every 100 ms until the server closes
// the connection; it returns what the server answered and when it closed.
func trickle(t *testing.T, addr, first string) (string, time.Duration) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write([]byte(first)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, _ := io.ReadAll(c)
	return string(raw), time.Since(start)
}

func TestSlowClients(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{HeaderTimeout: 300 * time.Millisecond, BodyTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond})
	addr := serveReal(t, f, 0)
	const bound = 3 * time.Second // the trickles would run for minutes
	cases := []struct {
		name, first, answer string
	}{
		{"header", "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a", ""},
		{"body", "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{\"prompt\":", " 408 "},
		{"chunked body", "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n{", " 408 "},
		{"refused body", "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: 4096\r\n\r\n{", " 415 "},
		{"body of a GET", "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4096\r\n\r\n{", " 200 "},
		{"idle", "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", " 200 "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw, d := trickle(t, addr, c.first)
			if d > bound {
				t.Errorf("the connection was held %v", d)
			}
			if c.answer != "" && !strings.Contains(raw, c.answer) {
				t.Errorf("answer %q, want %q", raw, c.answer)
			}
			if c.answer == " 408 " && !strings.Contains(raw, `"error"`) {
				t.Errorf("408 without a JSON error: %q", raw)
			}
		})
	}
	// The body deadline ends with the body: a stream longer than it runs
	// to its end, and so does a request that waits long for its answer.
	t.Run("long stream", func(t *testing.T) {
		f := newFixture(t, engine.Config{}, Options{BodyTimeout: 50 * time.Millisecond})
		addr := serveReal(t, f, 0)
		body := `{"prompt":"Once upon a time","max_tokens":400,"temperature":0,"stream":true,"kv":{"cache_prompt":false}}`
		start := time.Now()
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		chunks, done, err := readSSE(resp.Body)
		if err != nil || !done {
			t.Fatalf("stream cut after %v: done %v, %v", time.Since(start), done, err)
		}
		texts, fin, _ := streamText(chunks, false)
		if fin[0] == "" || len(texts[0]) < 100 {
			t.Errorf("stream: %q %v", texts[0], fin)
		}
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Logf("the stream took %v, less than the body timeout: this run does not test it", d)
		}
	})
}

func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitListener(inner, 2)
	accepted := make(chan net.Conn, 8)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	first := <-accepted
	<-accepted
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted past the limit of 2")
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	first.Close() // a second Close releases nothing more
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("closing a connection did not let the third in")
	}
	// Closing the listener ends an Accept that waits for a slot.
	ln.Close()
	select {
	case err := <-acceptErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept still waits after Close")
	}
	if LimitListener(inner, 0) != inner {
		t.Error("a limit of 0 wraps the listener")
	}
}
