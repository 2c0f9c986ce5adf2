package chat

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/tokenizer"
)

var (
	sys  = Message{"system", "You are terse."}
	u1   = Message{"user", "Hi there"}
	a1   = Message{"assistant", "Hello! "}
	u2   = Message{"user", " What is 2+2?"}
	conv = []Message{sys, u1, a1, u2}
)

// TestRender checks every template's exact output (the strings the Hugging
// Face Jinja templates render).
func TestRender(t *testing.T) {
	cases := []struct {
		tmpl string
		msgs []Message
		gen  bool
		want string
	}{
		{"llama2", conv, true, "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! </s><s>[INST] What is 2+2? [/INST]"},
		{"llama2", []Message{u1}, false, "<s>[INST] Hi there [/INST]"},
		{"llama2", []Message{u1, a1}, false, "<s>[INST] Hi there [/INST] Hello! </s>"},

		{"llama3", conv, true, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"llama3", []Message{u1}, false, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"},

		{"chatml", conv, true, "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n" +
			"<|im_start|>assistant\nHello! <|im_end|>\n<|im_start|>user\n What is 2+2?<|im_end|>\n<|im_start|>assistant\n"},
		{"chatml", []Message{u1}, false, "<|im_start|>user\nHi there<|im_end|>\n"},

		{"mistral", conv, true, "<s> [INST] You are terse.\n\nHi there [/INST] Hello! </s> [INST]  What is 2+2? [/INST]"},
		{"mistral", []Message{u1}, true, "<s> [INST] Hi there [/INST]"},

		{"zephyr", conv, true, "<|system|>\nYou are terse.</s>\n<|user|>\nHi there</s>\n<|assistant|>\nHello! </s>\n<|user|>\n What is 2+2?</s>\n<|assistant|>\n"},
		{"zephyr", []Message{u1}, false, "<|user|>\nHi there</s>\n"},

		{"phi3", conv, true, "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\nHello! <|end|>\n<|user|>\n What is 2+2?<|end|>\n<|assistant|>\n"},
		{"phi3", []Message{u1}, false, "<|user|>\nHi there<|end|>\n"},

		// Llama 3.1/3.2: the system header always, with the knowledge and
		// today dates; contents trimmed; a tool's text as a JSON string.
		{"llama3.1", conv, true, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
			"Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"llama3.1", []Message{u1}, false, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
			"Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"},
		{"llama3.1", []Message{{"system", "  Be brief.\n"}, u1, {"tool", "{\"t\": \"20\u00b0C\\n\"}\n"}}, true,
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
				"Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>" +
				"<|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"t\\\": \\\"20\u00b0C\\\\n\\\"}\\n\"<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n"},

		// Mistral v3 (7B v0.3): "[INST] " and "[/INST]", the system message
		// in the last user turn, assistant text trimmed.
		{"mistral-v3", conv, true, "<s>[INST] Hi there[/INST] Hello!</s>[INST] You are terse.\n\n What is 2+2?[/INST]"},
		{"mistral-v3", []Message{u1}, true, "<s>[INST] Hi there[/INST]"},
		{"mistral-v3", conv[:3], false, "<s>[INST] Hi there[/INST] Hello!</s>"}, // ends with the assistant: no system
		// v3-tekken (Nemo): no spaces at all, assistant text as is.
		{"mistral-v3-tekken", conv, true, "<s>[INST]Hi there[/INST]Hello! </s>[INST]You are terse.\n\n What is 2+2?[/INST]"},
		{"mistral-v3-tekken", []Message{u1}, true, "<s>[INST]Hi there[/INST]"},
		// v7 (Large 2411): [SYSTEM_PROMPT] blocks wherever system messages are.
		{"mistral-v7", conv, true, "<s>[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT][INST] Hi there[/INST] Hello! </s>[INST]  What is 2+2?[/INST]"},
		{"mistral-v7", []Message{u1, a1, sys, u2}, true, "<s>[INST] Hi there[/INST] Hello! </s>[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT][INST]  What is 2+2?[/INST]"},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.tmpl] = true
		tm, err := Lookup(c.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tm.Render(c.msgs, c.gen)
		if err != nil {
			t.Errorf("%s: %v", c.tmpl, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.tmpl, got, c.want)
		}
	}
	for _, n := range Names() {
		if !covered[n] {
			t.Errorf("template %s has no exact-string case", n)
		}
		if _, ok := jinjaSrc[n]; !ok {
			t.Errorf("template %s has no Jinja source for TestDetect", n)
		}
	}
}

// TestRenderLlamaCppConversation renders llama.cpp's test conversation
// (tests/test-chat-template.cpp: BOS "", a reply with spaces around it)
// and compares with the outputs that file records for the Hugging Face
// templates of Mistral 7B v0.3, Nemo and Large 2411.
func TestRenderLlamaCppConversation(t *testing.T) {
	msgs := []Message{{"system", "You are a helpful assistant"}, {"user", "Hello"}, {"assistant", "Hi there"},
		{"user", "Who are you"}, {"assistant", "   I am an assistant   "}, {"user", "Another question"}}
	for name, want := range map[string]string{
		"mistral-v3":        "[INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>[INST] You are a helpful assistant\n\nAnother question[/INST]",
		"mistral-v3-tekken": "[INST]Hello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]You are a helpful assistant\n\nAnother question[/INST]",
		"mistral-v7":        "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]",
	} {
		tm, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		tm.BOS = ""
		got, err := tm.Render(msgs, true)
		if err != nil || got != want {
			t.Errorf("%s:\n got %q (%v)\nwant %q", name, got, err, want)
		}
	}
}

func TestChatMLDefaultSystem(t *testing.T) {
	tm, _ := Lookup("chatml")
	tm.DefaultSystem = "You are a helpful assistant."
	got, _ := tm.Render([]Message{u1}, true)
	want := "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, _ := tm.Render(conv[:2], false); strings.Contains(got, "helpful") {
		t.Errorf("default system written despite a system message: %q", got)
	}
}

func TestRenderErrors(t *testing.T) {
	for _, c := range []struct {
		tmpl string
		msgs []Message
		want string
	}{
		{"llama2", []Message{a1}, "must alternate"},
		{"llama2", []Message{u1, u1}, "must alternate"},
		{"mistral", []Message{u1, sys}, `role "system" is not supported`},
		{"zephyr", []Message{{"tool", "x"}}, `role "tool" is not supported`},
		{"phi3", []Message{{"tool", "x"}}, `role "tool" is not supported`},
		{"mistral-v3", []Message{u1, u1}, "must alternate"},
		{"mistral-v3-tekken", []Message{sys, a1}, "must alternate"},
		{"mistral-v3", []Message{u1, a1, sys, u2}, `role "system" is not supported`},
		{"mistral-v7", []Message{{"tool", "x"}}, `role "tool" is not supported`},
	} {
		tm, _ := Lookup(c.tmpl)
		if _, err := tm.Render(c.msgs, true); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %v: error %v, want %q", c.tmpl, c.msgs, err, c.want)
		}
	}
	if _, err := Lookup("vicuna"); err == nil || !strings.Contains(err.Error(), `unknown template "vicuna" (known: chatml, llama2, llama3, llama3.1, mistral, mistral-v3, mistral-v3-tekken, mistral-v7, phi3, zephyr)`) {
		t.Errorf("Lookup error %v", err)
	}
}

// Jinja sources as models ship them (abridged where long).
var jinjaSrc = map[string]string{
	"llama2":  "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
	"llama3":  "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
	"chatml":  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
	"mistral": "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
	// Llama 3.1 Instruct's template, its tool branches left out.
	"llama3.1": "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n{%- for message in messages %}\n    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n",
	// Mistral 7B Instruct v0.3's and Nemo's templates, without the tool branches.
	"mistral-v3":        "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- if loop.last and system_message is defined %}\n            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"content\"]|trim + eos_token}}\n    {%- endif %}\n{%- endfor %}\n",
	"mistral-v3-tekken": "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- if loop.last and system_message is defined %}\n            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- message[\"content\"] + eos_token}}\n    {%- endif %}\n{%- endfor %}\n",
	"mistral-v7":        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% endfor %}",
	"zephyr":            "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}",
	"phi3":              "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
}

func TestDetect(t *testing.T) {
	for want, src := range jinjaSrc {
		if got := Detect(src); got != want {
			t.Errorf("Detect(%s template) = %q", want, got)
		}
	}
	if Detect("{{ messages }}") != "" || Detect("") != "" {
		t.Error("unknown templates must not be recognised")
	}
	// Mistral Small 3's v7-tekken ("[SYSTEM_PROMPT]" and "[INST]" with no
	// space, a default system prompt) is not built in: not taken for v7.
	if got := Detect("{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{{- '[INST]' + message['content'] + '[/INST]' }}"); got != "" {
		t.Errorf("v7-tekken detected as %q", got)
	}
	// Every built-in template can be named, and aliases resolve.
	for _, n := range append(Names(), "llama3.2", "Llama-3.1", "mistral-nemo", "mistral-v1") {
		if _, err := Lookup(n); err != nil {
			t.Error(err)
		}
	}
	if tm, _ := Lookup("llama3.2"); tm.Name != "llama3.1" {
		t.Errorf("llama3.2 is %s", tm.Name)
	}
}

func TestForModel(t *testing.T) {
	cases := []struct {
		m        Model
		override string
		name     string
		how      string
	}{
		{Model{Arch: "llama", Template: jinjaSrc["llama3"]}, "", JinjaName, "chat_template"},
		{Model{Arch: "qwen2", Template: jinjaSrc["chatml"]}, "", JinjaName, "chat_template"},
		{Model{Arch: "qwen2"}, "", "chatml", "architecture"},
		{Model{Arch: "mistral"}, "", "mistral", "architecture"},
		{Model{Arch: "llama"}, "", "llama2", "architecture"},
		{Model{Arch: "llama", Template: "{{ unknown }}"}, "", JinjaName, "chat_template"},
		{Model{Arch: "llama", Template: jinjaSrc["llama3"]}, "ChatML", "chatml", "override"},
		{Model{Arch: "llama", Template: jinjaSrc["llama3"]}, "mistral-v3", "mistral-v3", "override"},
	}
	for _, c := range cases {
		tm, how, err := ForModel(c.m, c.override)
		if err != nil {
			t.Fatal(err)
		}
		if tm.Name != c.name || how != c.how {
			t.Errorf("%+v override %q: %s by %s, want %s by %s", c.m.Arch, c.override, tm.Name, how, c.name, c.how)
		}
	}
	// The model's template renders, default system prompt and all.
	tm, _, _ := ForModel(Model{Arch: "qwen2", Template: jinjaSrc["chatml"]}, "")
	if got, err := tm.Render([]Message{u1}, true); err != nil || !strings.HasPrefix(got, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n") {
		t.Errorf("Qwen's template renders %q (%v)", got, err)
	}
	if _, _, err := ForModel(Model{}, "nope"); err == nil {
		t.Error("unknown override accepted")
	}
	// A template that does not parse is an error, not a fallback.
	_, _, err := ForModel(Model{Arch: "llama", Template: "{% for m in messages %}{{ m.content }}"}, "")
	if err == nil || !strings.Contains(err.Error(), "tokenizer.chat_template) does not parse") || !strings.Contains(err.Error(), "--chat-template") {
		t.Errorf("broken template: %v", err)
	}
}

// TestBuiltinsMatchJinja: each built-in format renders what the Jinja
// engine renders from the template it stands for (jinjaSrc), and fails
// where that template raises (a built-in may be stricter than the abridged
// sources, which lack some of the real templates' checks). builtinDiffers
// are the built-ins that knowingly render otherwise.
func TestBuiltinsMatchJinja(t *testing.T) {
	builtinDiffers := map[string]string{
		"mistral": "llama.cpp's mistral-v1 layout (\" [INST] \", a system message) rather than the Hugging Face string",
		"phi3":    "no eos_token after a conversation rendered without the generation prompt",
	}
	convs := []struct {
		msgs []Message
		gen  bool
	}{{conv, true}, {conv, false}, {[]Message{u1}, true}, {[]Message{u1}, false}, {[]Message{u1, a1}, false},
		{[]Message{sys, u1, a1}, false}, {[]Message{u1, u1}, true}, {[]Message{sys, a1}, true}}
	for _, n := range Names() {
		t.Run(n, func(t *testing.T) {
			b, err := Lookup(n)
			if err != nil {
				t.Fatal(err)
			}
			if n == "chatml" {
				b.DefaultSystem = "You are a helpful assistant."
			}
			j, err := FromJinja(jinjaSrc[n], b.BOS, b.EOS)
			if err != nil {
				t.Fatal(err)
			}
			differs := false
			for _, c := range convs {
				want, werr := j.Render(c.msgs, c.gen)
				got, gerr := b.Render(c.msgs, c.gen)
				if werr != nil && gerr == nil || werr == nil && gerr == nil && got != want {
					differs = true
					if builtinDiffers[n] == "" {
						t.Errorf("%v gen %v: built-in %q (%v), Jinja %q (%v)", c.msgs, c.gen, got, gerr, want, werr)
					}
				}
			}
			if !differs && builtinDiffers[n] != "" {
				t.Errorf("renders as its Jinja source does, but builtinDiffers lists it (%s)", builtinDiffers[n])
			}
		})
	}
}

var llama3Vocab = struct {
	tok *tokenizer.BPE
	err error
}{}

func llama3Tok(t *testing.T) *tokenizer.BPE {
	if llama3Vocab.tok != nil {
		return llama3Vocab.tok
	}
	tokens, types, merges, err := tokenizer.ReadGPT2VocabDir(shared.Path(t, "models/llama3-tokenizer"), tokenizer.Llama3Specials())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.NewBPE(tokenizer.BPEConfig{Tokens: tokens, Types: types, Merges: merges, Pre: "llama-bpe",
		BOS: 128000, EOS: 128009, AddBOS: true})
	if err != nil {
		t.Fatal(err)
	}
	llama3Vocab.tok = tok
	return tok
}

// TestEncodeLlama3: the rendered Llama 3 prompt tokenizes to the header
// tokens of Meta's prompt format, with one BOS.
func TestEncodeLlama3(t *testing.T) {
	tok := llama3Tok(t)
	tm, how, err := ForModel(Model{Arch: "llama", Tok: tok}, "")
	if err != nil || tm.Name != "llama3" || how != "architecture" {
		t.Fatalf("%v %v %v", tm, how, err)
	}
	ids, err := tm.Encode(tok, []Message{{"user", "hello"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []int{128000, 128006, 882, 128007, 271, 15339, 128009, 128006, 78191, 128007, 271}
	if !slices.Equal(ids, want) {
		t.Errorf("ids %v, want %v", ids, want)
	}
	stops := tm.StopIDs(tok)
	for _, id := range []int{128009, 128001, 128008} {
		if !slices.Contains(stops, id) {
			t.Errorf("stop ids %v lack %d", stops, id)
		}
	}
}

// TestEncodeJinjaLlama3: a model's own Llama 3 template, rendered by the
// Jinja engine, tokenizes to the same ids as the built-in format: one BOS
// (the template's bos_token; Encode adds none), the header tokens, and the
// end-of-turn stop.
func TestEncodeJinjaLlama3(t *testing.T) {
	tok := llama3Tok(t)
	tm, how, err := ForModel(Model{Arch: "llama", Tok: tok, Template: jinjaSrc["llama3"]}, "")
	if err != nil || tm.Name != JinjaName || how != "chat_template" || tm.BOS != "<|begin_of_text|>" {
		t.Fatalf("%+v %v %v", tm, how, err)
	}
	ids, err := tm.Encode(tok, []Message{{"user", "hello"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []int{128000, 128006, 882, 128007, 271, 15339, 128009, 128006, 78191, 128007, 271}
	if !slices.Equal(ids, want) {
		t.Errorf("ids %v, want %v", ids, want)
	}
	if stops := tm.StopIDs(tok); !slices.Contains(stops, 128009) || !slices.Contains(stops, 128008) {
		t.Errorf("stop ids %v", stops)
	}
}

func TestEncodeLlama2SentencePiece(t *testing.T) {
	tok, err := tokenizer.LoadLlama2C(shared.Path(t, "models/llama2-tokenizer/tokenizer.bin"), 32000)
	if err != nil {
		t.Fatal(err)
	}
	tm, _, err := ForModel(Model{Arch: "llama", Tok: tok}, "")
	if err != nil || tm.Name != "llama2" || tm.BOS != "<s>" || tm.EOS != "</s>" {
		t.Fatalf("%+v %v", tm, err)
	}
	ids, err := tm.Encode(tok, []Message{u1, a1, u2}, true)
	if err != nil {
		t.Fatal(err)
	}
	var want []int
	want = append(want, 1)
	want = append(want, tok.Encode("[INST] Hi there [/INST] Hello! ", false, false)...)
	want = append(want, 2, 1)
	want = append(want, tok.Encode("[INST] What is 2+2? [/INST]", false, false)...)
	if !slices.Equal(ids, want) {
		t.Errorf("ids %v\nwant %v", ids, want)
	}
	if s := tm.StopIDs(tok); !slices.Equal(s, []int{2}) {
		t.Errorf("stops %v", s)
	}
}

func TestFromGGUF(t *testing.T) {
	w := gguf.NewWriter()
	for k, v := range map[string]any{"general.architecture": "qwen2", "tokenizer.chat_template": jinjaSrc["chatml"]} {
		if err := w.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tm, how, err := FromGGUF(f, nil, "")
	if err != nil || tm.Name != JinjaName || how != "chat_template" || !slices.Contains(tm.Stops, "<|im_end|>") {
		t.Fatalf("%+v %s %v", tm, how, err)
	}
	if got, err := tm.Render([]Message{u1}, true); err != nil || got != "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n" {
		t.Errorf("renders %q (%v)", got, err)
	}
}

func TestIsPlain(t *testing.T) {
	llama2, err := Lookup("llama2")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		src  string
		want bool
	}{
		{"plain", PlainTemplate, true},
		{"plain with surrounding space", "\n " + PlainTemplate + "\n", true},
		{"empty", "", false},
		{"llama2", "{% for message in messages %}[INST] <<SYS>>{{ message['content'] }}{% endfor %}", false},
		{"plain with a generation prompt", PlainTemplate + "{% if add_generation_prompt %}A:{% endif %}", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := IsPlain(c.src); got != c.want {
				t.Fatalf("IsPlain(%q) = %v, want %v", c.src, got, c.want)
			}
		})
	}
	// The plain template is recognised as no other format.
	if d := Detect(PlainTemplate); d != "" {
		t.Fatalf("Detect(PlainTemplate) = %q (%s)", d, llama2.Name)
	}
}
