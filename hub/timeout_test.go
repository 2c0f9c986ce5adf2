package hub

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// short are the limits the stall tests run under.
var short = Timeouts{Connect: 200 * time.Millisecond, TLSHandshake: 200 * time.Millisecond, ResponseHeader: 200 * time.Millisecond, Idle: 200 * time.Millisecond}

// stallServer serves GETs of a 10 000-byte file through handler; stall
// blocks until the test ends.
func stallServer(t *testing.T, handler func(w http.ResponseWriter, r *http.Request, stall func())) string {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler(w, r, func() {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs first
	return srv.URL
}

// stallListener accepts TCP connections and never says a word: a TLS
// handshake against it stalls.
func stallListener(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestPullStalls: a server that stalls at any stage gives an error within
// the limit, never a hang.
func TestPullStalls(t *testing.T) {
	const size = 10_000
	head := func(w http.ResponseWriter) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		w.WriteHeader(http.StatusOK)
	}
	cases := []struct {
		name string
		url  func(t *testing.T) string
		want []string
		part int64 // bytes of partial download kept (-1: no file)
	}{
		{"connect", func(t *testing.T) string { return "http://" + stalledConnect(t) + "/m.gguf" }, []string{"HEAD", "did not answer in time", "i/o timeout"}, -1},
		{"TLS handshake", func(t *testing.T) string { return "https://" + stallListener(t) + "/m.gguf" }, []string{"HEAD", "TLS handshake timeout"}, -1},
		{"HEAD headers", func(t *testing.T) string {
			return stallServer(t, func(w http.ResponseWriter, r *http.Request, stall func()) { stall() }) + "/m.gguf"
		}, []string{"HEAD", "timeout awaiting response headers"}, -1},
		{"GET headers", func(t *testing.T) string {
			return stallServer(t, func(w http.ResponseWriter, r *http.Request, stall func()) {
				if r.Method == http.MethodGet {
					stall()
				}
				head(w)
			}) + "/m.gguf"
		}, []string{"GET", "timeout awaiting response headers"}, 0},
		{"body", func(t *testing.T) string {
			return stallServer(t, func(w http.ResponseWriter, r *http.Request, stall func()) {
				head(w)
				if r.Method == http.MethodGet {
					w.Write(make([]byte, 3000))
					w.(http.Flusher).Flush()
					stall()
				}
			}) + "/m.gguf"
		}, []string{"interrupted after 3000 of 10000 bytes", "no data for 200ms", "pull again to resume"}, 3000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref, err := Parse(c.url(t))
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			start := time.Now()
			res, err := Pull(context.Background(), ref, Options{Dir: dir, Timeouts: short})
			el := time.Since(start)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want one with %q", err, w)
				}
			}
			if el > 5*time.Second {
				t.Errorf("took %v under 200 ms limits", el)
			}
			st, err := os.Stat(res.Path + PartSuffix)
			switch {
			case c.part < 0 && err == nil:
				t.Errorf("a partial file was made: %d bytes", st.Size())
			case c.part >= 0 && (err != nil || st.Size() != c.part):
				t.Errorf("partial file %v %v, want %d bytes kept", st, err, c.part)
			}
		})
	}
}

// TestPullSlowBody: a body that takes longer than the idle limit, but never
// pauses that long, downloads: the limit is on silence, not on the whole.
func TestPullSlowBody(t *testing.T) {
	data := randomData(8000)
	url := stallServer(t, func(w http.ResponseWriter, r *http.Request, _ func()) {
		w.Header().Set("Content-Length", fmt.Sprint(len(data)))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodGet {
			return
		}
		for i := 0; i < len(data); i += 1000 {
			w.Write(data[i : i+1000])
			w.(http.Flusher).Flush()
			time.Sleep(60 * time.Millisecond)
		}
	})
	ref, _ := Parse(url + "/slow.gguf")
	start := time.Now()
	res, err := Pull(context.Background(), ref, Options{Dir: t.TempDir(), Timeouts: short})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 2*short.Idle {
		t.Fatalf("the body took only %v: the test does not exceed the idle limit", el)
	}
	if res.Size != int64(len(data)) {
		t.Errorf("result %+v", res)
	}
}

func TestTimeoutsDefaults(t *testing.T) {
	got := Timeouts{Connect: -1, Idle: time.Second}.withDefaults()
	want := Timeouts{Connect: 0, TLSHandshake: DefaultTimeouts.TLSHandshake, ResponseHeader: DefaultTimeouts.ResponseHeader, Idle: time.Second}
	if got != want {
		t.Errorf("withDefaults = %+v, want %+v", got, want)
	}
	tr := NewClient(Timeouts{}).Transport.(*http.Transport)
	if tr.TLSHandshakeTimeout != DefaultTimeouts.TLSHandshake || tr.ResponseHeaderTimeout != DefaultTimeouts.ResponseHeader || tr.Proxy == nil {
		t.Errorf("transport %+v", tr)
	}
}
