package progress

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal: the master to read what is drawn, the
// slave to draw on.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	n, err := unix.IoctlGetUint32(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Skipf("no pseudo-terminals: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Skipf("no pseudo-terminals: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// TestTerminal: on a terminal the bar is drawn, and ends its line.
func TestTerminal(t *testing.T) {
	m, s := openPTY(t)
	if !IsTerminal(s) {
		t.Fatal("a pty slave is not taken for a terminal")
	}
	got := make(chan string)
	go func() {
		var buf bytes.Buffer
		io.Copy(&buf, m) // ends when the slave closes (EIO)
		got <- buf.String()
	}()
	b := New(s, 4096, "model.gguf", true)
	if !b.Active() {
		t.Fatal("bar inactive on a terminal")
	}
	b.Write(make([]byte, 2048))
	time.Sleep(150 * time.Millisecond) // past the throttle
	b.Write(make([]byte, 2048))
	b.Finish(true)
	s.Close()
	var out string
	select {
	case out = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no output from the pty")
	}
	if !strings.Contains(out, "model.gguf") || !strings.Contains(out, "100%") || !strings.Contains(out, "4.0/4.0 KiB") || !strings.HasPrefix(out, "\r") || !strings.HasSuffix(out, "\n") {
		t.Errorf("drawn %q", out)
	}
}
