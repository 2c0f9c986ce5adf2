package codec

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNoTypeDispatch keeps codecs dispatched by capability: no type switch
// or type assertion in this package's code (a new codec would have to
// extend it), and outside it no probe of what a codec is by its name
// (KIVI by its "kivi" prefix) or by comparing Shifted's result with the
// codec (Shiftable says it).
func TestNoTypeDispatch(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n.(type) {
			case *ast.TypeSwitchStmt, *ast.TypeAssertExpr:
				t.Errorf("%s: a type switch or assertion; ask the codec (Capabilities)", fset.Position(n.Pos()))
			}
			return true
		})
	}

	// a codec's name compared with, sliced against or prefixed by a
	// literal that begins a codec name; Shifted's result compared
	byName := []*regexp.Regexp{
		regexp.MustCompile(`Name\(\)(\[[^\]]*\])?\s*[!=]=\s*"([^"]+)"`),
		regexp.MustCompile(`HasPrefix\([^,]*Name\(\),\s*"([^"]+)"\)`),
	}
	shifted := regexp.MustCompile(`Shifted\([^()]*(\([^()]*\))?[^()]*\)\s*[!=]=`)
	codecName := func(lit string) bool {
		for _, n := range Names {
			if strings.HasPrefix(n, lit) {
				return true
			}
		}
		return false
	}
	root := filepath.Join("..", "..")
	err = filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if n := e.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "codec" && filepath.Base(filepath.Dir(path)) == "kvcache") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			probe := shifted.MatchString(line)
			for _, p := range byName {
				for _, m := range p.FindAllStringSubmatch(line, -1) {
					probe = probe || codecName(m[len(m)-1])
				}
			}
			if probe {
				t.Errorf("%s:%d: a codec probed by its name or by Shifted; ask its capabilities: %s", path, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
