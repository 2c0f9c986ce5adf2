// Package progress draws progress bars (github.com/schollz/progressbar/v3)
// on terminals only: a bar asked for on a writer that is not a terminal (a
// log file, a pipe, a test's buffer) draws nothing, so logs get no '\r'
// updates.
package progress

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// IsTerminal reports whether w is a terminal: an *os.File (or anything with
// an Fd method) whose descriptor term.IsTerminal accepts.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	if !ok {
		return false
	}
	return term.IsTerminal(int(f.Fd()))
}

// Bar is a progress bar, or nothing when its writer is not a terminal. The
// zero value and nil draw nothing.
type Bar struct {
	b   *progressbar.ProgressBar
	w   io.Writer
	max int64
}

// New starts a bar on w counting to max (max < 0: unknown, a spinner), with
// byte counts and a rate when bytes is set. It draws nothing unless w is a
// terminal, nor for max 0.
func New(w io.Writer, max int64, desc string, bytes bool) *Bar {
	if w == nil || max == 0 || !IsTerminal(w) {
		return &Bar{} // nothing to show
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
	}
	if bytes {
		opts = append(opts, progressbar.OptionShowBytes(true), progressbar.OptionShowCount(), progressbar.OptionUseIECUnits(true))
	} else {
		opts = append(opts, progressbar.OptionShowDescriptionAtLineEnd())
	}
	return &Bar{b: progressbar.NewOptions64(max, opts...), w: w, max: max}
}

// Active reports whether the bar draws anything.
func (b *Bar) Active() bool { return b != nil && b.b != nil }

// Set64 moves the bar to n (a resumed download's kept bytes).
func (b *Bar) Set64(n int64) {
	if b.Active() {
		_ = b.b.Set64(n)
	}
}

// Add64 advances the bar by n.
func (b *Bar) Add64(n int64) {
	if b.Active() {
		_ = b.b.Add64(n)
	}
}

// Write advances the bar by len(p), so that a Bar can sit in an
// io.MultiWriter.
func (b *Bar) Write(p []byte) (int, error) {
	b.Add64(int64(len(p)))
	return len(p), nil
}

// Describe changes the bar's description.
func (b *Bar) Describe(s string) {
	if b.Active() {
		b.b.Describe(s)
	}
}

// Finish draws the bar complete (ok) or where it stopped, and ends its line.
func (b *Bar) Finish(ok bool) {
	if !b.Active() {
		return
	}
	if ok && b.max >= 0 {
		_ = b.b.Finish()
	} else {
		_ = b.b.Exit()
	}
	fmt.Fprintln(b.w)
}
