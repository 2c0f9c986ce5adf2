package server

import (
	"log"
	"net"
	"net/http"
	"sync"
	"time"
)

// HTTPServer is an http.Server for s.Handler() with the connection
// timeouts of the options: ReadHeaderTimeout for the request line and
// headers, IdleTimeout between requests of a kept-alive connection, and
// 64 KiB of headers at most. The body has its own deadline (BodyTimeout),
// and each write of a response its own (WriteTimeout), both set by the
// guard; there is no ReadTimeout or WriteTimeout on the whole request,
// which would cut long generations and event streams.
func (s *Server) HTTPServer(errorLog *log.Logger) *http.Server {
	return &http.Server{Handler: s.Handler(), ReadHeaderTimeout: s.opt.HeaderTimeout, IdleTimeout: s.opt.IdleTimeout,
		MaxHeaderBytes: 64 << 10, ErrorLog: errorLog}
}

// LimitListener accepts at most n connections at a time: past that, Accept
// waits until one closes (the next ones wait in the kernel's backlog).
// n ≤ 0: no limit.
func LimitListener(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// Defaults of the connection limits.
const (
	DefaultHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout   = 10 * time.Second
	DefaultIdleTimeout   = 60 * time.Second
	DefaultWriteTimeout  = 30 * time.Second
	DefaultMaxConns      = 512
)
