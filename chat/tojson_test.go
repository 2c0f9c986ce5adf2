package chat

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// TestToJSONMatchesPython: hfToJSON writes what transformers' tojson
// (Python's json.dumps) writes, byte for byte, on the values and options
// chat/testdata/tojson.py records (key order kept and sorted, indents of
// spaces, 0 and a tab, ensure_ascii with surrogate pairs, control
// characters, separators, Python's float repr).
func TestToJSONMatchesPython(t *testing.T) {
	var rec struct {
		Command string
		Cases   []struct {
			Value   string
			Options map[string]json.RawMessage
			Output  string
		}
	}
	readJSON(t, "testdata/tojson.json", &rec)
	if rec.Command == "" || len(rec.Cases) < 50 {
		t.Fatalf("tojson.json: %d cases, command %q", len(rec.Cases), rec.Command)
	}
	for i, c := range rec.Cases {
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			v, err := jsonValue([]byte(c.Value))
			if err != nil {
				t.Fatal(err)
			}
			kw := map[string]jinja.Value{}
			for k, raw := range c.Options {
				if kw[k], err = jsonValue(raw); err != nil {
					t.Fatal(err)
				}
			}
			got, err := hfToJSON([]jinja.Value{v}, kw)
			if err != nil {
				t.Fatal(err)
			}
			if got.AsString() != c.Output {
				t.Fatalf("value %s, options %v:\nkvlm   %q\nPython %q", c.Value, c.Options, got.AsString(), c.Output)
			}
		})
	}
}

// TestToJSONErrors: what json.dumps refuses, and options tojson does not
// take, are errors.
func TestToJSONErrors(t *testing.T) {
	str := jinja.NewString("x")
	for _, c := range []struct {
		name string
		args []jinja.Value
		kw   map[string]jinja.Value
		want string
	}{
		{"undefined", []jinja.Value{jinja.Undefined()}, nil, "Undefined is not JSON serializable"},
		{"no value", nil, nil, "no value"},
		{"unknown option", []jinja.Value{str}, map[string]jinja.Value{"width": jinja.NewInt(3)}, `unexpected keyword argument "width"`},
		{"bad indent", []jinja.Value{str}, map[string]jinja.Value{"indent": jinja.NewList(nil)}, "indent must be an integer or a string"},
		{"bad separators", []jinja.Value{str}, map[string]jinja.Value{"separators": str}, "separators must be two strings"},
		{"too many", []jinja.Value{str, jinja.NewBool(true), jinja.None(), jinja.None(), jinja.NewBool(false), jinja.None()}, nil, "at most 4 arguments"},
		{"twice", []jinja.Value{str, jinja.NewBool(true)}, map[string]jinja.Value{"ensure_ascii": jinja.NewBool(false)}, `multiple values for argument "ensure_ascii"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := hfToJSON(c.args, c.kw)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

// TestRenameToJSON: the tojson filters of expressions and statements are
// renamed, nothing else: literal text, comments, raw blocks, string
// literals, other names that start with tojson.
func TestRenameToJSON(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"{{ x | tojson }}", "{{ x | kvlm_hf_tojson }}"},
		{"{{- x|tojson(indent=4) -}}", "{{- x|kvlm_hf_tojson(indent=4) -}}"},
		{"{%- set s = (x | tojson) + '|tojson' %}", "{%- set s = (x | kvlm_hf_tojson) + '|tojson' %}"},
		{"{{ {'a': {'b': 1}} | tojson }}", "{{ {'a': {'b': 1}} | kvlm_hf_tojson }}"},
		{`{{ "a \" | tojson" ~ x | tojson | safe }}`, `{{ "a \" | tojson" ~ x | kvlm_hf_tojson | safe }}`},
		{"text | tojson {# x | tojson #}", "text | tojson {# x | tojson #}"},
		{"{% raw %}{{ x | tojson }}{% endraw %}{{ y | tojson }}", "{% raw %}{{ x | tojson }}{% endraw %}{{ y | kvlm_hf_tojson }}"},
		{"{{ x | tojsonish }}{{ x | lower }}", "{{ x | tojsonish }}{{ x | lower }}"},
		{"{{ x |\n tojson }}", "{{ x |\n kvlm_hf_tojson }}"},
		{"{ not a tag } {{ x | tojson", "{ not a tag } {{ x | kvlm_hf_tojson"},
	} {
		if got := renameToJSON(c.src); got != c.want {
			t.Errorf("renameToJSON(%q) = %q, want %q", c.src, got, c.want)
		}
	}
}

// TestTemplateToJSON: a model template's tojson is Hugging Face's in a
// rendering: key order kept under indent, options honoured, inside a
// macro too.
func TestTemplateToJSON(t *testing.T) {
	src := `{% macro j(v) %}{{ v | tojson(ensure_ascii=True) }}{% endmacro %}` +
		`{{ tools | tojson(indent=2) }}|{{ j(messages[0].content) }}|{{ messages[0] | tojson(separators=(',', ':')) }}`
	tm, err := FromJinja(src, "", "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tm.applyJSON([]byte(`[{"role": "user", "content": "20 °C <b>"}]`), []byte(`[{"z": 1, "a": [true, 1.0]}]`), false)
	if err != nil {
		t.Fatal(err)
	}
	want := "[\n  {\n    \"z\": 1,\n    \"a\": [\n      true,\n      1.0\n    ]\n  }\n]|\"20 \\u00b0C <b>\"|{\"role\":\"user\",\"content\":\"20 °C <b>\"}"
	if got != want {
		t.Fatalf("rendered %q\nwant     %q", got, want)
	}
}
