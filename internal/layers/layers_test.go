package layers

import (
	"bufio"
	"errors"
	"fmt"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/kvlm/kvlm"

// Rules is the architecture as data: each package's layer (0 lowest) and
// the arrows allowed besides those to a strictly lower layer.
type Rules struct {
	Layers     [][]string       // Layers[i]: the packages of layer i, relative to the module
	Exceptions map[Arrow]string // allowed arrows within one layer, with the reason
}

// Arrow is one import: From imports To.
type Arrow struct{ From, To string }

func (a Arrow) String() string { return a.From + " → " + a.To }

// architecture is the layering docs/ARCHITECTURE.md describes ("Layers"):
// a package imports only packages of lower layers, and the exceptions.
var architecture = Rules{
	Layers: [][]string{
		{"tensor", "gguf", "tokenizer", "sample", "kvstore", "kvevents", "internal/progress", "internal/shared", "internal/redistest", "internal/layers"},
		{"kvcache/codec", "chat", "hub", "internal/scripted"},
		{"kvcache"},
		{"attention"},
		{"model"},
		{"policy", "kvcalc", "convert"},
		{"engine", "eval"},
		{"server"},
		{"cmd/kvlm", "test/openai/scripted"},
	},
	Exceptions: map[Arrow]string{
		{"gguf", "tensor"}: "the GGML type table (block sizes validate tensor sizes), not a second copy of it",
	},
}

// Check returns every arrow of graph (package → its module-internal
// imports) the rules do not allow, and every package they do not place, as
// one line each, sorted.
func Check(graph map[string][]string, r Rules) []string {
	layer := map[string]int{}
	var bad []string
	for i, pkgs := range r.Layers {
		for _, p := range pkgs {
			if j, dup := layer[p]; dup {
				bad = append(bad, fmt.Sprintf("%s is placed in layers %d and %d", p, j, i))
			}
			layer[p] = i
		}
	}
	for a := range r.Exceptions {
		if _, ok := graph[a.From]; !ok {
			bad = append(bad, fmt.Sprintf("exception %s names a package that does not exist", a))
		} else if !slices.Contains(graph[a.From], a.To) {
			bad = append(bad, fmt.Sprintf("exception %s is not used: remove it", a))
		}
	}
	for p, imps := range graph {
		lp, ok := layer[p]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s has no layer: place it in the rules and in docs/ARCHITECTURE.md", p))
			continue
		}
		for _, q := range imps {
			lq, ok := layer[q]
			if !ok {
				continue // reported as a package of its own
			}
			a := Arrow{p, q}
			if _, allowed := r.Exceptions[a]; lq < lp || allowed {
				continue
			}
			if lq == lp {
				bad = append(bad, fmt.Sprintf("%s: both in layer %d, and the arrow is not an exception", a, lp))
			} else {
				bad = append(bad, fmt.Sprintf("%s points up (layer %d imports layer %d)", a, lp, lq))
			}
		}
	}
	for p := range layer {
		if _, ok := graph[p]; !ok {
			bad = append(bad, fmt.Sprintf("%s is placed in a layer but is not a package of the module", p))
		}
	}
	sort.Strings(bad)
	return bad
}

// root is the module's folder: the nearest one above the test's with go.mod.
func root(t *testing.T) string {
	t.Helper()
	d, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		up := filepath.Dir(d)
		if up == d {
			t.Fatal("go.mod not found above the test's folder")
		}
		d = up
	}
}

// Imports reads every non-test .go file of the module under dir (files
// under any build constraint count, but not those tagged ignore) and returns
// each package (its folder relative to dir) with its module-internal
// imports, sorted.
func Imports(dir string) (map[string][]string, error) {
	graph := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != dir && (name == "testdata" || name == "node_modules" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if path != dir {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		for _, g := range f.Comments {
			if g.Pos() >= f.Package {
				break
			}
			for _, c := range g.List {
				if constraint.IsGoBuild(c.Text) {
					x, err := constraint.Parse(c.Text)
					if err != nil {
						return fmt.Errorf("%s: %v", path, err)
					}
					if mentions(x, "ignore") {
						return nil
					}
				}
			}
		}
		rel, err := filepath.Rel(dir, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		imps := graph[pkg]
		for _, s := range f.Imports {
			p, err := strconv.Unquote(s.Path.Value)
			if err != nil {
				return fmt.Errorf("%s: %v", path, err)
			}
			if q, ok := strings.CutPrefix(p, module+"/"); ok && !slices.Contains(imps, q) {
				imps = append(imps, q)
			}
		}
		graph[pkg] = imps
		return nil
	})
	for _, imps := range graph {
		sort.Strings(imps)
	}
	return graph, err
}

func mentions(x constraint.Expr, tag string) bool {
	switch x := x.(type) {
	case *constraint.TagExpr:
		return x.Tag == tag
	case *constraint.NotExpr:
		return mentions(x.X, tag)
	case *constraint.AndExpr:
		return mentions(x.X, tag) || mentions(x.Y, tag)
	case *constraint.OrExpr:
		return mentions(x.X, tag) || mentions(x.Y, tag)
	}
	return false
}

func TestLayering(t *testing.T) {
	graph, err := Imports(root(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"tensor", "model", "policy", "cmd/kvlm"} {
		if _, ok := graph[p]; !ok {
			t.Fatalf("package %s not found: the walk of the module is broken (found %d packages)", p, len(graph))
		}
	}
	for _, b := range Check(graph, architecture) {
		t.Error(b)
	}
}

// TestCheck: Check finds each kind of wrong arrow on a made-up graph.
func TestCheck(t *testing.T) {
	rules := Rules{
		Layers:     [][]string{{"a", "b"}, {"c"}, {"d"}},
		Exceptions: map[Arrow]string{{"b", "a"}: "reason"},
	}
	tests := []struct {
		name  string
		graph map[string][]string
		want  []string
	}{
		{"allowed", map[string][]string{"a": nil, "b": {"a"}, "c": {"a", "b"}, "d": {"a", "c"}}, nil},
		{"upward", map[string][]string{"a": nil, "b": {"a"}, "c": {"d"}, "d": nil},
			[]string{"c → d points up (layer 1 imports layer 2)"}},
		{"same layer", map[string][]string{"a": {"b"}, "b": {"a"}, "c": nil, "d": nil},
			[]string{"a → b: both in layer 0, and the arrow is not an exception"}},
		{"unplaced", map[string][]string{"a": nil, "b": {"a"}, "c": nil, "d": nil, "e": {"a"}},
			[]string{"e has no layer: place it in the rules and in docs/ARCHITECTURE.md"}},
		{"gone", map[string][]string{"a": nil, "b": {"a"}, "c": nil},
			[]string{"d is placed in a layer but is not a package of the module"}},
		{"unused exception", map[string][]string{"a": nil, "b": nil, "c": nil, "d": nil},
			[]string{"exception b → a is not used: remove it"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Check(tt.graph, rules); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestImports: Imports reads a made-up module's imports as the rules see
// them (test files, files tagged ignore, testdata and outside imports left
// out; constrained files kept).
func TestImports(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":                  "module " + module + "\n",
		"a/a.go":                  "package a\n",
		"b/b.go":                  "package b\n\nimport (\n\t\"fmt\"\n\t\"" + module + "/a\"\n)\n\nvar _ = fmt.Sprint\n",
		"b/b_amd64.go":            "//go:build amd64 && !purego\n\npackage b\n\nimport _ \"" + module + "/c\"\n",
		"b/b_test.go":             "package b\n\nimport _ \"" + module + "/d\"\n",
		"b/gen.go":                "//go:build ignore\n\npackage main\n\nimport _ \"" + module + "/d\"\n",
		"b/testdata/x.go":         "package x\n\nimport _ \"" + module + "/d\"\n",
		"c/c.go":                  "package c\n",
		"d/d.go":                  "package d\n\nimport _ \"" + module + "/b\"\n",
		"other/go.mod":            "module other\n",
		"other/o.go":              "package o\n\nimport _ \"" + module + "/d\"\n",
		"node_modules/n/index.go": "package n\n",
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Imports(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"a": nil, "b": {"a", "c"}, "c": nil, "d": {"b"}}
	if len(got) != len(want) {
		t.Errorf("got packages %v, want %v", got, want)
	}
	for p, w := range want {
		if g, ok := got[p]; !ok || !slices.Equal(g, w) {
			t.Errorf("%s imports %q, want %q", p, g, w)
		}
	}
}

// docTable reads the packages table of ARCHITECTURE.md: each package with
// the module packages its imports column names ("–": none).
func docTable(text string) (map[string][]string, error) {
	rows := map[string][]string{}
	col := -1
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			if col >= 0 {
				break // the end of the table
			}
			continue
		}
		// A cell may hold an escaped bar (\|): split on the others only.
		cells := strings.Split(strings.Trim(strings.ReplaceAll(line, `\|`, "\x00"), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(strings.ReplaceAll(cells[i], "\x00", "|"))
		}
		if col < 0 {
			if cells[0] != "package" {
				continue
			}
			col = slices.Index(cells, "imports")
			if col < 0 {
				return nil, errors.New("the packages table has no imports column")
			}
			continue
		}
		if strings.Trim(cells[0], "-: ") == "" {
			continue // the rule under the header
		}
		if len(cells) <= col {
			return nil, fmt.Errorf("row %q has no imports cell", cells[0])
		}
		pkg := strings.Trim(cells[0], "`")
		if _, dup := rows[pkg]; dup {
			return nil, fmt.Errorf("package %s has two rows", pkg)
		}
		imps, err := importsCell(cells[col])
		if err != nil {
			return nil, fmt.Errorf("package %s: %v", pkg, err)
		}
		rows[pkg] = imps
	}
	if col < 0 {
		return nil, errors.New("no table with a package and an imports column")
	}
	return rows, sc.Err()
}

var (
	parens = regexp.MustCompile(`\([^()]*\)`)
	ticked = regexp.MustCompile("`([^`]+)`")
	joins  = regexp.MustCompile(`^[\s,]*$`)
)

// importsCell reads "`a`, `b` (why), `c`" as [a b c], "–" as none;
// anything else in the cell is an error, so that a cell the test cannot
// read is not taken for an empty one.
func importsCell(cell string) ([]string, error) {
	if cell == "–" || cell == "-" {
		return nil, nil
	}
	bare := parens.ReplaceAllString(cell, "")
	var imps []string
	for _, m := range ticked.FindAllStringSubmatch(bare, -1) {
		imps = append(imps, m[1])
	}
	if rest := ticked.ReplaceAllString(bare, ""); !joins.MatchString(rest) || len(imps) == 0 {
		return nil, fmt.Errorf("imports cell %q: want `pkg`, `pkg` (a note in parentheses) or –", cell)
	}
	sort.Strings(imps)
	return imps, nil
}

// docLayers reads the layer diagram of ARCHITECTURE.md: the fenced block
// after the line "### Layers", one line per layer from the top, "N  a, b",
// then, after a line "Exceptions…", the exceptions up to a blank line as
// "- `a` → `b`: reason".
func docLayers(text string) (Rules, error) {
	_, after, ok := strings.Cut(text, "\n### Layers\n")
	if !ok {
		return Rules{}, errors.New(`no "### Layers" section`)
	}
	r := Rules{Exceptions: map[Arrow]string{}}
	lines := strings.Split(after, "\n")
	fence, inExceptions := 0, false
	for _, line := range lines {
		if strings.HasPrefix(line, "#") {
			break
		}
		if strings.HasPrefix(line, "```") {
			fence++
			continue
		}
		if fence == 1 {
			num, pkgs, ok := strings.Cut(strings.TrimSpace(line), " ")
			n, err := strconv.Atoi(num)
			if !ok || err != nil || n < 0 || n > 64 {
				return Rules{}, fmt.Errorf("layer line %q: want \"N  pkg, pkg\"", line)
			}
			for len(r.Layers) <= n {
				r.Layers = append(r.Layers, nil)
			}
			for _, p := range strings.Split(pkgs, ",") {
				r.Layers[n] = append(r.Layers[n], strings.TrimSpace(p))
			}
		}
		if fence >= 2 && strings.HasPrefix(line, "Exceptions") {
			inExceptions = true
			continue
		}
		if inExceptions && strings.TrimSpace(line) == "" {
			break
		}
		if inExceptions {
			if !strings.HasPrefix(line, "- `") {
				return Rules{}, fmt.Errorf("exception line %q: want \"- `a` → `b`: reason\"", line)
			}
			arrow, reason, _ := strings.Cut(line[2:], ":")
			from, to, ok := strings.Cut(arrow, "→")
			if !ok {
				return Rules{}, fmt.Errorf("exception line %q: want \"- `a` → `b`: reason\"", line)
			}
			a := Arrow{strings.Trim(strings.TrimSpace(from), "`"), strings.Trim(strings.TrimSpace(to), "`")}
			r.Exceptions[a] = strings.TrimSpace(reason)
		}
	}
	if fence < 2 || len(r.Layers) == 0 {
		return Rules{}, errors.New("the Layers section has no fenced diagram")
	}
	return r, nil
}

// CompareTable returns every difference between the doc's imports column
// and the real imports, one line each, sorted.
func CompareTable(doc, real map[string][]string) []string {
	var bad []string
	for p, imps := range real {
		d, ok := doc[p]
		if !ok {
			bad = append(bad, fmt.Sprintf("package %s has no row in the table", p))
			continue
		}
		var missing, extra []string
		for _, q := range imps {
			if !slices.Contains(d, q) {
				missing = append(missing, q)
			}
		}
		for _, q := range d {
			if !slices.Contains(imps, q) {
				extra = append(extra, q)
			}
		}
		if len(missing) > 0 {
			bad = append(bad, fmt.Sprintf("%s imports %s, which its row does not list", p, strings.Join(missing, ", ")))
		}
		if len(extra) > 0 {
			bad = append(bad, fmt.Sprintf("%s's row lists %s, which it does not import", p, strings.Join(extra, ", ")))
		}
	}
	for p := range doc {
		if _, ok := real[p]; !ok {
			bad = append(bad, fmt.Sprintf("the table has a row for %s, which is not a package of the module", p))
		}
	}
	sort.Strings(bad)
	return bad
}

// TestArchitectureDoc: docs/ARCHITECTURE.md's imports column is the real
// module-internal imports, and its layer diagram is the rules above.
func TestArchitectureDoc(t *testing.T) {
	dir := root(t)
	b, err := os.ReadFile(filepath.Join(dir, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	graph, err := Imports(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("imports column", func(t *testing.T) {
		doc, err := docTable(string(b))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range CompareTable(doc, graph) {
			t.Error(d)
		}
	})
	t.Run("layers", func(t *testing.T) {
		doc, err := docLayers(string(b))
		if err != nil {
			t.Fatal(err)
		}
		if len(doc.Layers) != len(architecture.Layers) {
			t.Fatalf("the doc has %d layers, the rules %d", len(doc.Layers), len(architecture.Layers))
		}
		for i := range doc.Layers {
			d, w := slices.Sorted(slices.Values(doc.Layers[i])), slices.Sorted(slices.Values(architecture.Layers[i]))
			if !slices.Equal(d, w) {
				t.Errorf("layer %d: the doc has %v, the rules %v", i, d, w)
			}
		}
		for a := range architecture.Exceptions {
			if _, ok := doc.Exceptions[a]; !ok {
				t.Errorf("exception %s is not in the doc", a)
			}
		}
		for a := range doc.Exceptions {
			if _, ok := architecture.Exceptions[a]; !ok {
				t.Errorf("the doc has exception %s, the rules do not", a)
			}
		}
	})
}

// TestDocParsers: the doc's readers take a table and a diagram apart as
// written, and refuse what they cannot read rather than read it as empty.
func TestDocParsers(t *testing.T) {
	table := "## Packages\n\n| package | holds | imports |\n|---|---|---|\n" +
		"| `a` | things (`X`, `Y`) | – |\n" +
		"| `b` | more, `x \\| y` | `a` (for `X`), `c` |\n" +
		"| `c` | none | `a` |\n\nDifferences:\n| `z` | not in the table | `a` |\n"
	cells := []struct {
		name, cell string
		want       []string
		err        bool
	}{
		{"none", "–", nil, false},
		{"one", "`tensor`", []string{"tensor"}, false},
		{"notes", "`tensor`, `gguf` (for the type table, `DType`), `chat`", []string{"chat", "gguf", "tensor"}, false},
		{"all", "all", nil, true},
		{"words", "`tensor` and more", nil, true},
		{"empty", "", nil, true},
	}
	for _, c := range cells {
		t.Run("cell "+c.name, func(t *testing.T) {
			got, err := importsCell(c.cell)
			if (err != nil) != c.err || !slices.Equal(got, c.want) {
				t.Errorf("importsCell(%q) = %q, %v; want %q, error %v", c.cell, got, err, c.want, c.err)
			}
		})
	}
	t.Run("table", func(t *testing.T) {
		doc, err := docTable(table)
		if err != nil {
			t.Fatal(err)
		}
		real := map[string][]string{"a": nil, "b": {"a", "c"}, "c": {"a"}}
		if d := CompareTable(doc, real); d != nil {
			t.Errorf("the table as written: %q", d)
		}
		real = map[string][]string{"a": {"c"}, "b": {"a"}, "d": nil}
		want := []string{
			"a imports c, which its row does not list",
			"b's row lists c, which it does not import",
			"package d has no row in the table",
			"the table has a row for c, which is not a package of the module",
		}
		if d := CompareTable(doc, real); !slices.Equal(d, want) {
			t.Errorf("got %q, want %q", d, want)
		}
	})
	t.Run("table without imports", func(t *testing.T) {
		if _, err := docTable("| package | holds |\n|---|---|\n| `a` | x |\n"); err == nil {
			t.Error("a table without an imports column read without error")
		}
	})
	t.Run("layers", func(t *testing.T) {
		text := "x\n### Layers\n\n```\n1  c\n0  a, b\n```\n\nExceptions:\n- `b` → `a`: reason\n\nDifferences:\n- `c` → `a`: not read\n"
		r, err := docLayers(text)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Layers) != 2 || !slices.Equal(r.Layers[0], []string{"a", "b"}) || !slices.Equal(r.Layers[1], []string{"c"}) {
			t.Errorf("layers %q", r.Layers)
		}
		if len(r.Exceptions) != 1 || r.Exceptions[Arrow{"b", "a"}] != "reason" {
			t.Errorf("exceptions %q", r.Exceptions)
		}
		if _, err := docLayers("### Layers\n\n```\ntop  c\n```\n"); err == nil {
			t.Error("a layer line without a number read without error")
		}
	})
}
