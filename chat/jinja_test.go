package chat

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var jinjaOracle = flag.Bool("jinja-oracle", false, "run testdata/render.py (Debian's python3-jinja2) and check that testdata/rendered.json is what it writes")

// corpusSpec is testdata/conversations.json.
type corpusSpec struct {
	BOS           string               `json:"bos_token"`
	EOS           string               `json:"eos_token"`
	Now           string               `json:"now"`
	Tools         json.RawMessage      `json:"tools"`
	Conversations []corpusConversation `json:"conversations"`
}

type corpusConversation struct {
	Name                string          `json:"name"`
	When                string          `json:"when"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Tools               bool            `json:"tools"`
	Messages            json.RawMessage `json:"messages"`
}

// corpusRendered is testdata/rendered.json, what Jinja2 renders.
type corpusRendered struct {
	Command string `json:"command"`
	Jinja2  string `json:"jinja2"`
	Python  string `json:"python"`
	Cases   []struct {
		Template     string  `json:"template"`
		Conversation string  `json:"conversation"`
		Output       *string `json:"output"`
		Error        string  `json:"error"`
	} `json:"cases"`
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// jinjaKnown are the corpus templates whose rendering differs from
// Jinja2's, by conversation, with the reason (docs/CHAT.md's table).
var jinjaKnown = map[string]struct {
	convs  []string
	reason string
}{
	// Jinja2 raises where the engine is lenient.
	"CohereForAI-c4ai-command-r-plus-tool_use.jinja":      {noTools, "iterates tools, none without tools: Jinja2 raises TypeError, the engine iterates nothing"},
	"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": {noTools, "iterates tools, none without tools: Jinja2 raises TypeError, the engine iterates nothing"},
	"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja":   {noTools, "iterates tools, none without tools: Jinja2 raises TypeError, the engine iterates nothing"},
	"fireworks-ai-llama-3-firefunction-v2.jinja":          {append(noTools, "tools", "tool-call"), "reads the undefined variable functions: Jinja2 raises UndefinedError, the engine renders it empty"},
	"Kimi-K2-Instruct.jinja":                              {[]string{"tool-call"}, "calls list.append: Jinja2's sandbox refuses it (SecurityError), the engine calls it"},
	"Kimi-K2-Thinking.jinja":                              {[]string{"tool-call"}, "calls list.append: Jinja2's sandbox refuses it (SecurityError), the engine calls it"},
	"llama-cpp-deepseek-r1.jinja":                         {[]string{"tools", "tool-call"}, "tojson of a generator (tools | map(...)): Jinja2 raises TypeError, the engine writes the list"},
	"meetkai-functionary-medium-v3.2.jinja":               {[]string{"tool-call"}, "adds a string and a dict (arguments given as an object): Jinja2 raises TypeError, the engine concatenates"},
	// The engine has no MarkupSafe.
	"meetkai-functionary-medium-v3.1.jinja": {[]string{"tools", "tool-call"}, "'...'|safe + text: Jinja2's Markup HTML-escapes the text it is added to (a quote becomes &#34;), the engine has no Markup"},
}

// noTools are the conversations without tools.
var noTools = []string{"user", "user-nogen", "system", "multiturn", "multiturn-nogen", "whitespace-unicode"}

// minIdentical is the number of corpus templates that render as Jinja2
// does on every conversation: the count may grow, never shrink.
const minIdentical = 50

// renderCorpusCase renders one case of the corpus with kvlm's renderer.
func renderCorpusCase(t *testing.T, spec corpusSpec, src string, conv corpusConversation) (string, error) {
	t.Helper()
	now, err := time.Parse("2006-01-02T15:04:05", spec.Now)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := FromJinja(src, spec.BOS, spec.EOS)
	if err != nil {
		return "", err
	}
	tm.Now = func() time.Time { return now }
	var tools []byte
	if conv.Tools {
		tools = spec.Tools
	}
	return tm.applyJSON(conv.Messages, tools, conv.AddGenerationPrompt)
}

// TestJinjaCorpus renders llama.cpp's corpus of real chat templates
// (testdata/templates) over testdata/conversations.json and compares with
// what Jinja2 renders as Hugging Face does (testdata/rendered.json, written
// by testdata/render.py), byte for byte. Where Jinja2 raises, kvlm must
// fail too (with raise_exception's message where the template raised).
// The templates that differ are exactly those jinjaKnown lists.
func TestJinjaCorpus(t *testing.T) {
	var spec corpusSpec
	var want corpusRendered
	readJSON(t, "testdata/conversations.json", &spec)
	readJSON(t, "testdata/rendered.json", &want)
	if want.Jinja2 == "" || want.Command == "" {
		t.Fatal("rendered.json does not say which Jinja2 and command wrote it")
	}
	convs := map[string]corpusConversation{}
	for _, c := range spec.Conversations {
		convs[c.Name] = c
	}
	files, err := filepath.Glob("testdata/templates/*.jinja")
	if err != nil || len(files) < 50 {
		t.Fatalf("%d templates (%v)", len(files), err)
	}
	seen := map[string]bool{}
	differs := map[string][]string{} // template → conversations that differ
	for _, c := range want.Cases {
		seen[c.Template] = true
		src, err := os.ReadFile(filepath.Join("testdata/templates", c.Template))
		if err != nil {
			t.Fatal(err)
		}
		if c.Conversation == "" { // Jinja2 cannot parse it
			if _, err := FromJinja(string(src), "", ""); err == nil {
				t.Errorf("%s: Jinja2 does not parse it (%s), kvlm does", c.Template, c.Error)
			}
			continue
		}
		conv, ok := convs[c.Conversation]
		if !ok {
			t.Fatalf("%s: unknown conversation %q", c.Template, c.Conversation)
		}
		t.Run(strings.TrimSuffix(c.Template, ".jinja")+"/"+c.Conversation, func(t *testing.T) {
			got, err := renderCorpusCase(t, spec, string(src), conv)
			_, known := jinjaKnown[c.Template]
			known = known && slices.Contains(jinjaKnown[c.Template].convs, c.Conversation)
			bad := ""
			switch {
			case c.Output == nil && err == nil:
				bad = "Jinja2 fails (" + c.Error + "), kvlm renders"
			case c.Output == nil && strings.HasPrefix(c.Error, "TemplateError: ") &&
				!strings.Contains(err.Error(), strings.TrimPrefix(c.Error, "TemplateError: ")):
				bad = "kvlm fails with " + err.Error() + ", Jinja2 with " + c.Error
			case c.Output != nil && err != nil:
				bad = "kvlm fails: " + err.Error()
			case c.Output != nil && got != *c.Output:
				i := 0
				for i < len(got) && i < len(*c.Output) && got[i] == (*c.Output)[i] {
					i++
				}
				bad = "differs from byte " + strconv.Itoa(i) + ": kvlm " + quoteAround(got, i) + ", Jinja2 " + quoteAround(*c.Output, i)
			}
			if bad != "" {
				differs[c.Template] = append(differs[c.Template], c.Conversation)
				if !known {
					t.Error(bad)
				}
			} else if known {
				t.Errorf("renders as Jinja2 does, but jinjaKnown lists it (%s): update jinjaKnown and docs/CHAT.md", jinjaKnown[c.Template].reason)
			}
		})
	}
	for _, f := range files {
		if !seen[filepath.Base(f)] {
			t.Errorf("%s has no case in rendered.json: run render.py", f)
		}
	}
	identical := 0
	for _, f := range files {
		if len(differs[filepath.Base(f)]) == 0 {
			identical++
		}
	}
	names := make([]string, 0, len(differs))
	for n := range differs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t.Logf("differs: %s %v", n, differs[n])
	}
	if identical < minIdentical {
		t.Errorf("%d templates render as Jinja2 does, fewer than minIdentical (%d)", identical, minIdentical)
	}
	t.Logf("%d of %d templates render byte-identical to Jinja2 %s on every conversation (%d cases)", identical, len(files), want.Jinja2, len(want.Cases))
}

// quoteAround quotes s around byte i.
func quoteAround(s string, i int) string {
	lo, hi := max(0, i-30), min(len(s), i+30)
	b, _ := json.Marshal(s[lo:hi])
	return string(b)
}

// TestJinjaOracle (with -jinja-oracle) reruns the oracle: Debian's
// python3-jinja2 rendering the corpus as Hugging Face does must write
// rendered.json byte for byte.
func TestJinjaOracle(t *testing.T) {
	if !*jinjaOracle {
		t.Skip("-jinja-oracle not given (needs /usr/bin/python3 with python3-jinja2)")
	}
	cmd := exec.Command("/usr/bin/python3", "testdata/render.py")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render.py: %v\n%s", err, stderr.String())
	}
	want, err := os.ReadFile("testdata/rendered.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, want) {
		t.Fatalf("render.py writes %d bytes that differ from testdata/rendered.json (%d bytes): rerun %s", len(out), len(want), "`/usr/bin/python3 chat/testdata/render.py > chat/testdata/rendered.json`")
	}
}

// TestStrftime compares with Python's datetime.strftime (Debian 12's
// Python 3.11 on glibc: the strings below are what it printed).
func TestStrftime(t *testing.T) {
	all, nopad := "%a %A %b %B %d %e %H %I %j %m %M %p %S %y %Y %%", "%-d %-m %-H %-I %-j %-M %-S"
	cases := []struct {
		when, format, want string
	}{
		{"2024-07-26T09:05:03", "%Y-%m-%d", "2024-07-26"},
		{"2024-07-26T09:05:03", "%d %b %Y", "26 Jul 2024"},
		{"2024-07-26T09:05:03", "%B %d, %Y", "July 26, 2024"},
		{"2024-07-26T09:05:03", all, "Fri Friday Jul July 26 26 09 09 208 07 05 AM 03 24 2024 %"},
		{"2024-07-26T09:05:03", nopad, "26 7 9 9 208 5 3"},
		{"2026-01-04T00:30:59", "%d %b %Y", "04 Jan 2026"},
		{"2026-01-04T00:30:59", all, "Sun Sunday Jan January 04  4 00 12 004 01 30 AM 59 26 2026 %"},
		{"2026-01-04T00:30:59", nopad, "4 1 0 12 4 30 59"},
		{"2025-12-31T13:00:00", all, "Wed Wednesday Dec December 31 31 13 01 365 12 00 PM 00 25 2025 %"},
		{"2025-12-31T13:00:00", nopad, "31 12 13 1 365 0 0"},
	}
	for _, c := range cases {
		t.Run(c.when+" "+c.format, func(t *testing.T) {
			when, err := time.Parse("2006-01-02T15:04:05", c.when)
			if err != nil {
				t.Fatal(err)
			}
			got, err := strftime(when, c.format)
			if err != nil || got != c.want {
				t.Fatalf("got %q (%v), want %q", got, err, c.want)
			}
		})
	}
	for _, f := range []string{"%c", "%Z", "50%"} {
		if _, err := strftime(time.Now(), f); err == nil || !strings.Contains(err.Error(), "strftime_now") {
			t.Errorf("%q: error %v", f, err)
		}
	}
}

// TestJinjaVariables: what a model template sees, as apply_chat_template
// gives it.
func TestJinjaVariables(t *testing.T) {
	now := func() time.Time { return time.Date(2024, 7, 26, 9, 5, 3, 0, time.UTC) }
	cases := []struct {
		name, src, bos, eos string
		msgs, tools         string
		gen                 bool
		want, err           string
	}{
		{"bos and eos", "{{ bos_token }}|{{ eos_token }}", "<s>", "</s>", `[]`, "", false, "<s>|</s>", ""},
		{"no bos is none", "{{ bos_token is none }} {{ eos_token is none }}", "", "</s>", `[]`, "", false, "True False", ""},
		{"add_generation_prompt", "{{ add_generation_prompt }}", "", "", `[]`, "", true, "True", ""},
		{"tools none without tools", "{{ tools is none }} {{ tools is defined }} {{ documents is none }}", "", "", `[]`, "", false, "True True True", ""},
		{"message keys in order", "{{ messages[0] | tojson }}", "", "", `[{"role":"user","content":"x","b":1,"a":2.5}]`, "", false,
			`{"role": "user", "content": "x", "b": 1, "a": 2.5}`, ""},
		{"tools keys in order", "{% for t in tools %}{% for k, v in t.items() %}{{ k }}={{ v }};{% endfor %}{% endfor %}", "", "", `[]`,
			`[{"z":"1","y":[1,2],"x":true}]`, false, "z=1;y=[1, 2];x=True;", ""},
		{"strftime_now", `{{ strftime_now("%d %b %Y") }}`, "", "", `[]`, "", false, "26 Jul 2024", ""},
		{"trim_blocks and lstrip_blocks", "  {% if true %}\nA\n  {% endif %}\nB", "", "", `[]`, "", false, "A\nB", ""},
		{"loop controls", "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% if m.role == 'x' %}{% continue %}{% endif %}{{ m.role }}{% endfor %}",
			"", "", `[{"role":"a"},{"role":"x"},{"role":"c"}]`, "", false, "a", ""},
		{"namespace and string methods", "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.content.strip().startswith('q') %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}{{ ns.n }}",
			"", "", `[{"content":" q1 "},{"content":"p"},{"content":"q2"}]`, "", false, "2", ""},
		{"raise_exception", "{{ raise_exception('Only user and assistant roles are supported!') }}", "", "", `[]`, "", false, "",
			"chat: the model's chat template refuses the conversation: Only user and assistant roles are supported!"},
		{"bad strftime directive", `{{ strftime_now("%c") }}`, "", "", `[]`, "", false, "", "directive %c is not supported"},
		{"calling a non-function", "{{ messages() }}", "", "", `[]`, "", false, "", "chat: the model's chat template fails to render: "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tm, err := FromJinja(c.src, c.bos, c.eos)
			if err != nil {
				t.Fatal(err)
			}
			tm.Now = now
			var tools []byte
			if c.tools != "" {
				tools = []byte(c.tools)
			}
			got, err := tm.applyJSON([]byte(c.msgs), tools, c.gen)
			switch {
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("error %v, want %q", err, c.err)
			case c.err == "" && (err != nil || got != c.want):
				t.Fatalf("got %q (%v), want %q", got, err, c.want)
			}
		})
	}
}

func TestJSONValueErrors(t *testing.T) {
	deep := strings.Repeat("[", maxJSONDepth+2) + strings.Repeat("]", maxJSONDepth+2)
	for _, in := range []string{``, `[`, `[1,]`, `{"a" 1}`, `[] []`, deep} {
		if _, err := jsonValue([]byte(in)); err == nil {
			t.Errorf("%.20q accepted", in)
		}
	}
	tm, _ := FromJinja("x", "", "")
	if _, err := tm.applyJSON([]byte(`[{"role":`), nil, true); err == nil || !strings.HasPrefix(err.Error(), "chat: messages: ") {
		t.Errorf("bad messages: %v", err)
	}
	b, _ := Lookup("chatml")
	if _, err := b.applyJSON([]byte(`[]`), nil, true); err == nil {
		t.Error("a built-in format took JSON messages")
	}
}

// TestFromJinjaStops: EOS and the end-of-turn tokens the template writes.
func TestFromJinjaStops(t *testing.T) {
	cases := []struct {
		src, eos string
		want     []string
	}{
		{jinjaSrc["chatml"], "<|im_end|>", []string{"<|im_end|>"}},
		{jinjaSrc["llama3"], "<|eot_id|>", []string{"<|eot_id|>"}},
		{jinjaSrc["phi3"], "<|endoftext|>", []string{"<|endoftext|>", "<|end|>"}},
		{"{{ messages }}", "", nil},
	}
	for _, c := range cases {
		tm, err := FromJinja(c.src, "", c.eos)
		if err != nil || !slices.Equal(tm.Stops, c.want) || !tm.WritesBOS || tm.Name != JinjaName {
			t.Errorf("%.30q: %+v (%v), want stops %q", c.src, tm, err, c.want)
		}
	}
	// ForModel adds the stops of the format it recognises (Llama 3's eom).
	tm, _, err := ForModel(Model{Template: jinjaSrc["llama3"]}, "")
	if err != nil || !slices.Contains(tm.Stops, "<|eom_id|>") {
		t.Errorf("%+v %v", tm, err)
	}
}

// TestJinjaConcurrent: one compiled template serves concurrent renderings
// (the server's requests); run with -race.
func TestJinjaConcurrent(t *testing.T) {
	src, err := os.ReadFile("testdata/templates/Qwen-Qwen3-0.6B.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tm, err := FromJinja(string(src), "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}}
	want, err := tm.Render(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			for range 20 {
				if got, err := tm.Render(msgs, true); err != nil || got != want {
					errs <- fmt.Sprintf("%q (%v)", got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
