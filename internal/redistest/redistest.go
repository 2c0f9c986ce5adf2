// Package redistest starts a real redis-server for tests: on a free
// loopback port, without persistence, killed when the test ends. Without
// the binary a test skips, except under CI (CI set), where it fails, so
// that CI cannot pass without redis-server.
package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Server is a redis-server the test started.
type Server struct {
	Port int
	args []string
	cmd  *exec.Cmd
	t    testing.TB
}

// Start starts redis-server with args added (e.g. TLS settings) and waits
// until it accepts connections.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not installed (CI installs it: .ci/run)")
		}
		t.Skip("redis-server is not installed")
	}
	s := &Server{Port: freePort(t), args: args, t: t}
	s.args = append([]string{bin}, args...)
	for i, a := range args {
		if a == "--tls-port" && i+1 < len(args) {
			s.Port, _ = strconv.Atoi(args[i+1]) // the port to wait on
		}
	}
	s.start()
	t.Cleanup(s.Kill)
	return s
}

// Addr is 127.0.0.1:Port: the plain port, or the --tls-port given (with
// --port 0).
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is redis://127.0.0.1:PORT.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// FreePort is a loopback port free now.
func FreePort(t testing.TB) int { return freePort(t) }

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) start() {
	s.t.Helper()
	args := append(s.args[1:len(s.args):len(s.args)], "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if !hasArg(args, "--port") {
		args = append(args, "--port", strconv.Itoa(s.Port))
	}
	s.cmd = exec.Command(s.args[0], args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.Kill()
			s.t.Fatalf("redis-server on port %d did not start: %v", s.Port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func hasArg(args []string, a string) bool {
	for _, x := range args {
		if x == a {
			return true
		}
	}
	return false
}

// Kill stops the server (SIGKILL) and waits for it.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// Restart starts the server again on the same port (empty: nothing was
// saved).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// String names the server in messages.
func (s *Server) String() string { return fmt.Sprintf("redis-server on %s", s.Addr()) }
