package shared

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeTB records what Path does to a test instead of doing it.
type fakeTB struct {
	testing.TB
	name           string
	fatal, skipped string
}

func (f *fakeTB) Helper()                        {}
func (f *fakeTB) Name() string                   { return f.name }
func (f *fakeTB) Fatalf(format string, a ...any) { f.fatal = fmt.Sprintf(format, a...) }
func (f *fakeTB) Skip(a ...any)                  { f.skipped = fmt.Sprint(a...) }

func TestPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "models", "m.bin"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(dir, "models", "m.bin")
	cases := []struct {
		name      string
		dir, rel  string
		ci        bool
		want      string // the path returned, "" when the test stops
		fatal     string // substring of the failure, "" for none
		skip      string // substring of the skip message, "" for none
		summaryIn string // substring of the package's summary line
	}{
		{"found", dir, "models/m.bin", false, filepath.Join(dir, "models", "m.bin"), "", "", ""},
		{"found under CI", dir, "models/m.bin", true, filepath.Join(dir, "models", "m.bin"), "", "", ""},
		{"no folder", "", "models/m.bin", false, "", "", "shared folder not found", "1 test skipped in this package: shared folder not found (set KVLM_SHARED; see README)"},
		{"no folder under CI", "", "models/m.bin", true, "", "CI=true", "", ""},
		{"KVLM_SHARED a file", notDir, "models/m.bin", false, "", "", "is not a folder", "1 test skipped in this package: KVLM_SHARED is not a folder"},
		{"KVLM_SHARED missing", filepath.Join(dir, "nowhere"), "x", false, "", "", "is not a folder", "KVLM_SHARED is not a folder"},
		{"file missing", dir, "models/other.bin", false, "", "", "shared file missing", "shared files missing (models/other.bin)"},
		{"file missing under CI", dir, "models/other.bin", true, "", "shared file missing", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tally := newTally()
			tb := &fakeTB{name: "TestX"}
			got := path(tb, c.dir, c.rel, c.ci, tally)
			if got != c.want {
				t.Errorf("path = %q, want %q", got, c.want)
			}
			if c.fatal == "" && tb.fatal != "" || c.fatal != "" && !strings.Contains(tb.fatal, c.fatal) {
				t.Errorf("failure %q, want one containing %q", tb.fatal, c.fatal)
			}
			if c.skip == "" && tb.skipped != "" || c.skip != "" && !strings.Contains(tb.skipped, c.skip) {
				t.Errorf("skip %q, want one containing %q", tb.skipped, c.skip)
			}
			line := tally.summary()
			if c.summaryIn == "" && line != "" || c.summaryIn != "" && !strings.Contains(line, c.summaryIn) {
				t.Errorf("summary %q, want one containing %q", line, c.summaryIn)
			}
		})
	}
}

func TestSummary(t *testing.T) {
	type skip struct{ test, reason, rel string }
	cases := []struct {
		name  string
		skips []skip
		want  string
	}{
		{"none", nil, ""},
		{"one", []skip{{"TestA", reasonNoDir, "a"}},
			"kvlm: 1 test skipped in this package: shared folder not found (set KVLM_SHARED; see README)"},
		{"twelve", func() []skip {
			var s []skip
			for i := range 12 {
				s = append(s, skip{fmt.Sprintf("TestA/%d", i), reasonNoDir, "a"})
			}
			return s
		}(), "kvlm: 12 tests skipped in this package: shared folder not found (set KVLM_SHARED; see README)"},
		{"a test counted once", []skip{{"TestA", reasonNoDir, "a"}, {"TestA", reasonNoDir, "b"}},
			"kvlm: 1 test skipped in this package: shared folder not found (set KVLM_SHARED; see README)"},
		{"missing files listed once, sorted", []skip{{"TestA", reasonNoFiles, "z.bin"}, {"TestB", reasonNoFiles, "a.bin"}, {"TestC", reasonNoFiles, "z.bin"}},
			"kvlm: 3 tests skipped in this package: shared files missing (a.bin, z.bin)"},
		{"two reasons", []skip{{"TestA", reasonNoFiles, "a.bin"}, {"TestB", reasonNoDir, ""}, {"TestC", reasonNoDir, ""}},
			"kvlm: 3 tests skipped in this package: 2: shared folder not found (set KVLM_SHARED; see README); 1: shared files missing (a.bin)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tl := newTally()
			for _, s := range c.skips {
				tl.add(s.test, s.reason, s.rel)
			}
			if got := tl.summary(); got != c.want {
				t.Errorf("summary\n got %q\nwant %q", got, c.want)
			}
		})
	}
}

// TestPathSkipsForReal: through a real test, Path skips and is counted.
func TestPathSkipsForReal(t *testing.T) {
	t.Setenv("CI", "")
	t.Setenv("KVLM_SHARED", filepath.Join(t.TempDir(), "nowhere"))
	before := len(skips.summary())
	var reached bool
	t.Run("inner", func(t *testing.T) {
		Path(t, "models/x.bin")
		reached = true
	})
	if reached {
		t.Fatal("Path returned for a missing folder instead of skipping")
	}
	line := skips.summary()
	if !strings.Contains(line, "1 test skipped") || len(line) == before {
		t.Fatalf("skip not counted: %q", line)
	}
	// This package's own line is not a finding: forget it.
	skips = newTally()
}
