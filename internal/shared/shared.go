// Package shared locates the project's read-only shared folder (real model
// weights, vocabularies and evaluation texts) for tests and benchmarks.
//
// The folder is ../shared beside the repository root unless the environment
// variable KVLM_SHARED names another place.
//
// A test reaches the folder only through Path. Where the folder or a file is
// missing, Path skips the test, or fails it under CI (CI=true). A package
// whose tests use Path runs them through Main (from its TestMain), which
// says in one line how many tests were skipped and why, since go test shows
// nothing of a passing package but its "ok" line.
package shared

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Dir returns the shared folder, or "" when it cannot be found. A set
// KVLM_SHARED is returned as it is, whether or not it exists.
func Dir() string {
	if d := os.Getenv("KVLM_SHARED"); d != "" {
		return d
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	// file is <root>/internal/shared/shared.go
	root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	d := filepath.Join(filepath.Dir(root), "shared")
	if st, err := os.Stat(d); err == nil && st.IsDir() {
		return d
	}
	return ""
}

// Reasons a test is skipped, as the summary line groups them.
const (
	reasonNoDir   = "shared folder not found (set KVLM_SHARED; see README)"
	reasonBadDir  = "KVLM_SHARED is not a folder"
	reasonNoFiles = "shared files missing"
)

// skips records the tests Path skipped in this test binary.
var skips = newTally()

// Path returns a file inside the shared folder. When the folder or the file
// is absent the test is skipped, except under CI (CI=true), where a missing
// reference is a failure: a golden test must not pass by not running.
func Path(tb testing.TB, rel string) string {
	tb.Helper()
	return path(tb, Dir(), rel, os.Getenv("CI") == "true", skips)
}

func path(tb testing.TB, dir, rel string, ci bool, skips *tally) string {
	tb.Helper()
	reason, detail, p := locate(dir, rel)
	if reason == "" {
		return p
	}
	if ci {
		tb.Fatalf("%s (CI=true: the shared folder is required)", detail)
		return ""
	}
	skips.add(tb.Name(), reason, rel)
	tb.Skip(detail)
	return ""
}

// locate finds rel under dir. It returns the path, or the summary reason and
// a one-line message when it is not there.
func locate(dir, rel string) (reason, detail, path string) {
	if dir == "" {
		return reasonNoDir, "shared folder not found: ../shared is absent and KVLM_SHARED is unset (see README)", ""
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return reasonBadDir, fmt.Sprintf("shared folder not found: KVLM_SHARED=%s is not a folder", dir), ""
	}
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		return reasonNoFiles, fmt.Sprintf("shared file missing: %v", err), ""
	}
	return "", "", p
}

// Main runs a package's tests (call it from TestMain) and, when Path skipped
// some of them, says how many and why in one line. go test hides the output
// of a passing package, so the line goes to the terminal when there is one
// and the run is not verbose; otherwise to stderr.
func Main(m *testing.M) {
	code := m.Run()
	if line := skips.summary(); line != "" {
		w, closeW := reportWriter()
		fmt.Fprintln(w, line)
		closeW()
	}
	os.Exit(code)
}

// reportWriter is where Main writes its line.
func reportWriter() (io.Writer, func()) {
	if !testing.Verbose() {
		if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			return tty, func() { tty.Close() }
		}
	}
	return os.Stderr, func() {}
}

// tally counts skipped tests by reason.
type tally struct {
	mu      sync.Mutex
	tests   map[string]bool            // names of the tests skipped
	reasons map[string]map[string]bool // reason -> tests
	files   map[string]bool            // missing files (reasonNoFiles)
}

func newTally() *tally {
	return &tally{tests: map[string]bool{}, reasons: map[string]map[string]bool{}, files: map[string]bool{}}
}

func (t *tally) add(test, reason, rel string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.tests[test] = true
	if t.reasons[reason] == nil {
		t.reasons[reason] = map[string]bool{}
	}
	t.reasons[reason][test] = true
	if reason == reasonNoFiles {
		t.files[rel] = true
	}
}

// summary is the one line Main prints, or "" when nothing was skipped.
func (t *tally) summary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.tests) == 0 {
		return ""
	}
	var why []string
	for _, r := range []string{reasonNoDir, reasonBadDir, reasonNoFiles} {
		n := len(t.reasons[r])
		if n == 0 {
			continue
		}
		s := r
		if r == reasonNoFiles {
			s += " (" + strings.Join(sortedKeys(t.files), ", ") + ")"
		}
		if len(t.reasons) > 1 {
			s = fmt.Sprintf("%d: %s", n, s)
		}
		why = append(why, s)
	}
	noun := "tests"
	if len(t.tests) == 1 {
		noun = "test"
	}
	return fmt.Sprintf("kvlm: %d %s skipped in this package: %s", len(t.tests), noun, strings.Join(why, "; "))
}

func sortedKeys(m map[string]bool) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
