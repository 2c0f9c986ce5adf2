package progress

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestNotTerminal: writers that are not terminals (a buffer, a file, a
// pipe) get nothing, whatever the bar is told.
func TestNotTerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	var buf bytes.Buffer
	for _, c := range []struct {
		name string
		w    interface {
			Write([]byte) (int, error)
		}
	}{{"buffer", &buf}, {"file", f}, {"pipe", w}} {
		t.Run(c.name, func(t *testing.T) {
			if IsTerminal(c.w) {
				t.Fatal("taken for a terminal")
			}
			for _, max := range []int64{1000, -1} {
				b := New(c.w, max, "x", true)
				if b.Active() {
					t.Fatal("bar active")
				}
				b.Set64(10)
				b.Write(make([]byte, 500))
				b.Add64(490)
				b.Describe("y")
				b.Finish(true)
				b.Finish(false)
			}
		})
	}
	if buf.Len() != 0 {
		t.Errorf("buffer got %q", buf.String())
	}
	if st, _ := f.Stat(); st.Size() != 0 {
		t.Errorf("file got %d bytes", st.Size())
	}
	w.Close()
	var got [1]byte
	if n, _ := r.Read(got[:]); n != 0 {
		t.Error("pipe got bytes")
	}
	var nilBar *Bar
	nilBar.Add64(1)
	nilBar.Finish(true)
}
