// Package shared locates the project's read-only shared folder (real model
// weights, vocabularies and evaluation texts) for tests and benchmarks.
//
// The folder is ../shared beside the repository root unless the environment
// variable KVLM_SHARED names another place.
package shared

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Dir returns the shared folder, or "" when it cannot be found.
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

// Path returns a file inside the shared folder. When the folder or the file
// is absent the test is skipped, except under CI (CI=true), where a missing
// reference is a failure: a golden test must not pass by not running.
func Path(tb testing.TB, rel string) string {
	tb.Helper()
	miss := tb.Skipf
	if os.Getenv("CI") == "true" {
		miss = tb.Fatalf
	}
	d := Dir()
	if d == "" {
		miss("shared folder not found (set KVLM_SHARED)")
	}
	p := filepath.Join(d, filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		miss("shared file missing: %v", err)
	}
	return p
}
