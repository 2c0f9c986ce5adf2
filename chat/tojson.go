package chat

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Hugging Face's tojson filter. transformers replaces Jinja2's tojson with
// its own (chat_template_utils.py):
//
//	def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
//	    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
//	                      separators=separators, sort_keys=sort_keys)
//
// The engine (github.com/ardanlabs/jinja v1.8.0) offers no way to replace a
// built-in filter: it looks a filter up among its own built-ins first
// (evalFilter's lookupFilter), and only for a name it does not define
// among the render's variables, where a callable serves as a filter. So
// compileJinja renames the filter in the template's source (renameToJSON:
// every "| tojson" in an expression or statement tag, outside string
// literals, raw blocks and comments, becomes "| kvlm_hf_tojson") and the
// render defines kvlm_hf_tojson as hfToJSON, Python's json.dumps.

// tojsonName is the variable the renamed tojson filter calls.
const tojsonName = "kvlm_hf_tojson"

// renameToJSON rewrites src's tojson filters to tojsonName (see above).
// Literal text, comments ({# … #}), raw blocks and string literals inside
// tags are copied unchanged.
func renameToJSON(src string) string {
	var b strings.Builder
	b.Grow(len(src) + 64)
	i := 0
	for i < len(src) {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			b.WriteString(src[i:])
			break
		}
		j += i
		b.WriteString(src[i:j])
		switch src[j+1] {
		case '#': // a comment: copied to its end
			k := strings.Index(src[j+2:], "#}")
			if k < 0 {
				b.WriteString(src[j:])
				return b.String()
			}
			b.WriteString(src[j : j+2+k+2])
			i = j + 2 + k + 2
		case '{', '%':
			end, tag := scanTag(src, j)
			b.WriteString(tag)
			i = end
			if src[j+1] == '%' && isRawTag(src[j:end]) {
				k := rawEnd(src, end)
				b.WriteString(src[end:k])
				i = k
			}
		default:
			b.WriteByte('{')
			i = j + 1
		}
	}
	return b.String()
}

// scanTag reads the tag that opens at src[at] ("{{" or "{%") to its close
// ("}}" or "%}" outside string literals and brackets) and returns the
// index after it and the tag with its tojson filters renamed.
func scanTag(src string, at int) (int, string) {
	closer := "}}"
	if src[at+1] == '%' {
		closer = "%}"
	}
	var b strings.Builder
	b.WriteString(src[at : at+2])
	depth := 0 // open (, [ and { of the expression
	i := at + 2
	for i < len(src) {
		c := src[i]
		switch {
		case c == '\'' || c == '"':
			k := i + 1
			for k < len(src) && src[k] != c {
				if src[k] == '\\' {
					k++
				}
				k++
			}
			k = min(k+1, len(src))
			b.WriteString(src[i:k])
			i = k
			continue
		case depth == 0 && strings.HasPrefix(src[i:], closer):
			b.WriteString(closer)
			return i + 2, b.String()
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth = max(depth-1, 0)
		case c == '|':
			k := i + 1
			for k < len(src) && (src[k] == ' ' || src[k] == '\t' || src[k] == '\n' || src[k] == '\r') {
				k++
			}
			if strings.HasPrefix(src[k:], "tojson") && (k+6 == len(src) || !isIdentByte(src[k+6])) {
				b.WriteString(src[i:k])
				b.WriteString(tojsonName)
				i = k + 6
				continue
			}
		}
		b.WriteByte(c)
		i++
	}
	return len(src), b.String()
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// isRawTag reports whether tag ("{% … %}") is {% raw %}.
func isRawTag(tag string) bool {
	s := strings.TrimSpace(strings.Trim(tag[2:len(tag)-2], "-+"))
	return s == "raw"
}

// rawEnd is the index after the {% endraw %} that closes a raw block whose
// body starts at from (len(src) if none).
func rawEnd(src string, from int) int {
	for i := from; i < len(src); i++ {
		if !strings.HasPrefix(src[i:], "{%") {
			continue
		}
		k := strings.Index(src[i:], "%}")
		if k < 0 {
			break
		}
		if s := strings.TrimSpace(strings.Trim(src[i+2:i+k], "-+")); s == "endraw" {
			return i + k + 2
		}
	}
	return len(src)
}

// hfToJSON is transformers' tojson: json.dumps(x, ensure_ascii, indent,
// separators, sort_keys), the options positional in that order or by
// name, ensure_ascii false by default.
func hfToJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("tojson: no value")
	}
	names := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	if len(args)-1 > len(names) {
		return jinja.Undefined(), fmt.Errorf("tojson takes at most %d arguments after the value, got %d", len(names), len(args)-1)
	}
	opt := map[string]jinja.Value{}
	for i, a := range args[1:] {
		opt[names[i]] = a
	}
	for k, v := range kwargs {
		if _, dup := opt[k]; dup {
			return jinja.Undefined(), fmt.Errorf("tojson got multiple values for argument %q", k)
		}
		opt[k] = v
	}
	var d dumper
	for k, v := range opt {
		switch k {
		case "ensure_ascii":
			d.ascii = v.IsTruthy()
		case "sort_keys":
			d.sort = v.IsTruthy()
		case "indent":
			switch {
			case v.IsNone() || v.IsUndefined():
			case v.IsInt():
				d.indent, d.indented = strings.Repeat(" ", int(max(0, min(v.AsInt(), 1<<10)))), true
			case v.IsString():
				d.indent, d.indented = v.AsString(), true
			default:
				return jinja.Undefined(), fmt.Errorf("tojson: indent must be an integer or a string")
			}
		case "separators":
			if v.IsNone() || v.IsUndefined() {
				break
			}
			if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Get(0).IsString() || !v.AsList().Get(1).IsString() {
				return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
			}
			d.item, d.key, d.seps = v.AsList().Get(0).AsString(), v.AsList().Get(1).AsString(), true
		default:
			return jinja.Undefined(), fmt.Errorf("tojson got an unexpected keyword argument %q", k)
		}
	}
	if !d.seps {
		// json.dumps: (', ', ': '), or (',', ': ') with an indent.
		d.item, d.key = ", ", ": "
		if d.indented {
			d.item = ","
		}
	}
	if err := d.value(args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(d.b.String()), nil
}

// dumper writes values as Python's json.dumps does.
type dumper struct {
	b         strings.Builder
	ascii     bool   // ensure_ascii: every non-ASCII character as \uXXXX
	sort      bool   // sort_keys
	indented  bool   // indent given: one item a line
	indent    string // the indent of one level
	item, key string // separators
	seps      bool   // separators given
}

// newline starts a line at nesting level.
func (d *dumper) newline(level int) {
	d.b.WriteByte('\n')
	for range level {
		d.b.WriteString(d.indent)
	}
}

// maxDepth bounds the nesting written (Python raises RecursionError
// somewhat deeper).
const maxDepth = 512

func (d *dumper) value(v jinja.Value, level int) error {
	if level > maxDepth {
		return fmt.Errorf("tojson: nested deeper than %d", maxDepth)
	}
	switch {
	case v.IsNone():
		d.b.WriteString("null")
	case v.IsBool():
		d.b.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		d.b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		d.b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		d.str(v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			d.b.WriteString("[]")
			return nil
		}
		d.b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				d.b.WriteString(d.item)
			}
			if d.indented {
				d.newline(level + 1)
			}
			if err := d.value(it, level+1); err != nil {
				return err
			}
		}
		if d.indented {
			d.newline(level)
		}
		d.b.WriteByte(']')
	case v.IsDict():
		dict := v.AsDict()
		keys := dict.Keys
		if len(keys) == 0 {
			d.b.WriteString("{}")
			return nil
		}
		if d.sort {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		d.b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				d.b.WriteString(d.item)
			}
			if d.indented {
				d.newline(level + 1)
			}
			d.str(k)
			d.b.WriteString(d.key)
			if err := d.value(dict.Data[k], level+1); err != nil {
				return err
			}
		}
		if d.indented {
			d.newline(level)
		}
		d.b.WriteByte('}')
	case v.IsUndefined():
		return fmt.Errorf("tojson: Object of type Undefined is not JSON serializable")
	default:
		return fmt.Errorf("tojson: a %s is not JSON serializable", kindName(v))
	}
	return nil
}

func kindName(v jinja.Value) string {
	if v.IsCallable() {
		return "function"
	}
	return "value of this kind"
}

// str writes s as a JSON string the way json.dumps does: ", \ and the
// control characters escaped (\n \r \t \b \f, the others \u00XX), and with
// ensure_ascii every character outside ' '…'~' as \uXXXX (a UTF-16
// surrogate pair above U+FFFF); lowercase hex digits.
func (d *dumper) str(s string) {
	const hex = "0123456789abcdef"
	u := func(r rune) {
		d.b.WriteString(`\u`)
		for sh := 12; sh >= 0; sh -= 4 {
			d.b.WriteByte(hex[(r>>sh)&0xf])
		}
	}
	d.b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			d.b.WriteString(`\"`)
		case '\\':
			d.b.WriteString(`\\`)
		case '\n':
			d.b.WriteString(`\n`)
		case '\r':
			d.b.WriteString(`\r`)
		case '\t':
			d.b.WriteString(`\t`)
		case '\b':
			d.b.WriteString(`\b`)
		case '\f':
			d.b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				u(r)
			case d.ascii && r > '~':
				if r > 0xffff {
					r -= 0x10000
					u(0xd800 | (r >> 10))
					u(0xdc00 | (r & 0x3ff))
				} else {
					u(r)
				}
			default:
				d.b.WriteRune(r)
			}
		}
	}
	d.b.WriteByte('"')
}

// pyFloat is Python's repr of a float, as json.dumps writes it: the
// shortest digits that read back the same, in positional notation with a
// ".0" for whole numbers when the decimal exponent is in [-4, 16), else
// d.ddde±XX; Infinity, -Infinity and NaN for the others (allow_nan).
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	k := strings.LastIndexByte(e, 'e')
	exp, _ := strconv.Atoi(e[k+1:])
	if f == 0 || exp >= -4 && exp < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsRune(s, '.') {
			s += ".0"
		}
		return s
	}
	return e
}
