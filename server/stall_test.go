//go:build linux || darwin

package server

import (
	"bufio"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvlm/kvlm/engine"
)

// smallBuffers shrinks the send buffer of every accepted connection, so a
// client that stops reading blocks the server's writes soon.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	return c, err
}

// A client that stops reading a stream loses it after WriteTimeout; one
// that goes on reading is never cut (TestSlowClients/long_stream).
func TestStalledReader(t *testing.T) {
	const timeout, stall = 200 * time.Millisecond, 2 * time.Second
	f := newFixture(t, engine.Config{}, Options{WriteTimeout: timeout})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := f.srv.HTTPServer(log.New(io.Discard, "", 0))
	go hs.Serve(smallBuffers{ln})
	defer hs.Close()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"prompt":"Once upon a time","max_tokens":400,"temperature":0,"n":4,"stream":true,"kv":{"cache_prompt":false}}`
	req := "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, " 200 ") {
		t.Fatalf("status line %q %v", line, err)
	}
	// Stop reading for long past the write timeout (the whole
	// generation takes about 2 s here), then read what is left.
	time.Sleep(stall)
	rest, _ := io.ReadAll(br)
	if strings.Contains(string(rest), "data: [DONE]") {
		t.Errorf("a client that stopped reading for %v still got the whole stream (%d bytes)", stall, len(rest))
	}
	waitFree(t, f.srv.Engine())
}
