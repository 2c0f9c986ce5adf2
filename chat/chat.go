// Package chat turns a conversation into the prompt a chat model was trained
// on. A model whose GGUF carries a Jinja chat template
// (tokenizer.chat_template) has that template rendered by a Jinja engine
// (github.com/ardanlabs/jinja) as Hugging Face's apply_chat_template
// renders it (FromJinja; docs/CHAT.md says how closely, template by
// template). The built-in renderers of the common formats (Llama 2,
// Llama 3, Llama 3.1/3.2, ChatML, Mistral v1, v3, v3-tekken and v7,
// Zephyr, Phi-3), each rendering the string its Hugging Face template
// renders without tools (but for two details: TestBuiltinsMatchJinja),
// serve files without a template (chosen by architecture and vocabulary)
// and whoever names one (--chat-template).
package chat

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/tokenizer"
)

// Message is one turn of a conversation. Role is "system", "user" or
// "assistant" (Llama 3 and ChatML pass other roles through).
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Template renders conversations in one chat format.
type Template struct {
	Name string
	// BOS and EOS are the texts of the tokens the template writes as
	// bos_token and eos_token ("<s>", "</s>" by default; ForModel takes them
	// from the vocabulary).
	BOS, EOS string
	// DefaultSystem, for ChatML, is the system message written when a
	// conversation starts without one (Qwen 2's "You are a helpful
	// assistant."); "" for none.
	DefaultSystem string
	// Stops are the texts that end an assistant turn: special tokens (see
	// StopIDs) or plain strings to cut generated text at.
	Stops []string
	// WritesBOS: the rendered prompt starts with BOS's text, so Encode adds
	// no BOS of its own. A model's Jinja template writes whatever BOS it
	// wants (Hugging Face tokenizes its text without adding special
	// tokens): true.
	WritesBOS bool
	// Now is the clock of a Jinja template's strftime_now (time.Now if
	// nil).
	Now func() time.Time

	render  func(t *Template, msgs []Message, gen bool) (string, error)
	jinja   *jinja.Template // the compiled model template (FromJinja); nil for built-ins
	tools   ToolSyntax      // the syntax the Jinja template writes tool calls in; "" for none kvlm reads
	toolTag string          // ToolsJSONList's tag, ToolsXML's open tag
}

// Render returns the prompt for msgs; with gen, it ends with the header of
// the assistant turn the model is to write (add_generation_prompt).
func (t *Template) Render(msgs []Message, gen bool) (string, error) {
	return t.render(t, msgs, gen)
}

// Encode renders msgs and tokenizes the prompt, the text of special tokens
// becoming those tokens. BOS is added when the template does not write it
// and the vocabulary asks for it (tokenizer.AddsBOS).
func (t *Template) Encode(tok tokenizer.Tokenizer, msgs []Message, gen bool) ([]int, error) {
	p, err := t.Render(msgs, gen)
	if err != nil {
		return nil, err
	}
	return tokenizer.EncodeSpecial(tok, p, !t.WritesBOS && tokenizer.AddsBOS(tok), false), nil
}

// StopIDs returns the token ids that end an assistant turn: EOS and every
// stop text that is a single token of tok.
func (t *Template) StopIDs(tok tokenizer.Tokenizer) []int {
	var ids []int
	if e := tok.EOS(); e >= 0 {
		ids = append(ids, e)
	}
	for _, s := range t.Stops {
		if id, ok := tokenizer.TokenID(tok, s); ok && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// templates are the built-in templates by name.
var templates = map[string]Template{
	"llama2": {Name: "llama2", BOS: "<s>", EOS: "</s>", Stops: []string{"</s>"}, WritesBOS: true, render: renderLlama2},
	"llama3": {Name: "llama3", BOS: "<|begin_of_text|>", EOS: "<|end_of_text|>", Stops: []string{"<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"},
		WritesBOS: true, render: renderLlama3},
	"llama3.1": {Name: "llama3.1", BOS: "<|begin_of_text|>", EOS: "<|end_of_text|>", Stops: []string{"<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"},
		WritesBOS: true, render: renderLlama31},
	"chatml":            {Name: "chatml", BOS: "<s>", EOS: "</s>", Stops: []string{"<|im_end|>", "<|endoftext|>"}, render: renderChatML},
	"mistral":           {Name: "mistral", BOS: "<s>", EOS: "</s>", Stops: []string{"</s>"}, WritesBOS: true, render: renderMistral},
	"mistral-v3":        {Name: "mistral-v3", BOS: "<s>", EOS: "</s>", Stops: []string{"</s>"}, WritesBOS: true, render: renderMistralV3},
	"mistral-v3-tekken": {Name: "mistral-v3-tekken", BOS: "<s>", EOS: "</s>", Stops: []string{"</s>"}, WritesBOS: true, render: renderMistralV3},
	"mistral-v7":        {Name: "mistral-v7", BOS: "<s>", EOS: "</s>", Stops: []string{"</s>"}, WritesBOS: true, render: renderMistralV7},
	"zephyr":            {Name: "zephyr", BOS: "<s>", EOS: "</s>", Stops: []string{"</s>", "<|user|>"}, render: renderZephyr},
	"phi3":              {Name: "phi3", BOS: "<s>", EOS: "<|endoftext|>", Stops: []string{"<|end|>", "<|endoftext|>", "<|user|>"}, render: renderPhi3},
}

// aliases are other names --chat-template accepts.
var aliases = map[string]string{"llama-2": "llama2", "llama-3": "llama3", "qwen": "chatml", "qwen2": "chatml", "phi-3": "phi3",
	"llama-3.1": "llama3.1", "llama3.2": "llama3.1", "llama-3.2": "llama3.1",
	"mistral-v1": "mistral", "mistral-nemo": "mistral-v3-tekken", "tekken": "mistral-v3-tekken"}

// Names lists the built-in templates.
func Names() []string {
	n := make([]string, 0, len(templates))
	for k := range templates {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Lookup returns a copy of the named template.
func Lookup(name string) (*Template, error) {
	key := strings.ToLower(strings.TrimSpace(name))
	if a, ok := aliases[key]; ok {
		key = a
	}
	t, ok := templates[key]
	if !ok {
		return nil, fmt.Errorf("chat: unknown template %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	t.Stops = slices.Clone(t.Stops)
	return &t, nil
}

// PlainTemplate is the Jinja chat template of models never trained to chat
// (llama2.c's TinyStories models): each message's content on a line of its
// own, nothing else, so the model continues the text. kvlm convert writes it
// into the GGUF files it makes of llama2.c checkpoints, which then chat as
// the checkpoints do (server's plain format).
const PlainTemplate = "{% for message in messages %}{{ message['content'] + '\\n' }}{% endfor %}"

// IsPlain reports whether a GGUF's tokenizer.chat_template is PlainTemplate.
func IsPlain(src string) bool { return strings.TrimSpace(src) == PlainTemplate }

var chatmlSystem = regexp.MustCompile(`<\|im_start\|>system(?:\n|\\n)([^'"{}<>\\]+)<\|im_end\|>`)

// Detect recognises a Jinja chat template by its content and returns the
// name of the built-in template rendering the same format, or "" (ForModel
// adds that format's stops to those of a model's own template).
func Detect(src string) string {
	has := func(s ...string) bool {
		for _, x := range s {
			if !strings.Contains(src, x) {
				return false
			}
		}
		return true
	}
	switch {
	case src == "":
		return ""
	case has("<|start_header_id|>", "<|end_header_id|>", "Cutting Knowledge Date"):
		return "llama3.1"
	case has("<|start_header_id|>", "<|end_header_id|>"):
		return "llama3"
	case has("<|im_start|>"):
		return "chatml"
	case has("<|user|>", "<|end|>"):
		return "phi3"
	case has("<|user|>", "<|assistant|>"):
		return "zephyr"
	case has("[INST]", "<<SYS>>"):
		return "llama2"
	case has("[INST]", "[SYSTEM_PROMPT]"):
		// v7 writes "[SYSTEM_PROMPT] " and "[INST] " with a space;
		// v7-tekken (Mistral Small 3), without, is not built in.
		if has("[SYSTEM_PROMPT] ", "[INST] ") {
			return "mistral-v7"
		}
		return ""
	case has("[INST]"):
		// v1 (Mistral 7B v0.1/v0.2) closes user turns with " [/INST]";
		// v3 (v0.3) writes "[INST] " and "[/INST]"; v3-tekken (Nemo)
		// writes "[INST]" as a string of its own, with no space.
		switch {
		case has(" [/INST]"):
			return "mistral"
		case has(`"[INST]"`) || has(`'[INST]'`):
			return "mistral-v3-tekken"
		}
		return "mistral-v3"
	}
	return ""
}

// Model says what ForModel knows of a model.
type Model struct {
	Arch     string              // general.architecture
	Template string              // tokenizer.chat_template ("" if none)
	Tok      tokenizer.Tokenizer // nil if unknown
}

// ForModel chooses the template of a model: override (a name, as given to
// --chat-template) if set; else the model's own Jinja template, rendered as
// Hugging Face renders it (FromJinja); else, for a model without one, the
// built-in format implied by its architecture and vocabulary. BOS and EOS
// texts come from the vocabulary. how says which rule chose ("override",
// "chat_template", "architecture"). A model template that does not parse is
// an error, not a reason to fall back on a built-in format.
func ForModel(m Model, override string) (t *Template, how string, err error) {
	var bos, eos string
	if m.Tok != nil {
		bos, eos = specialText(m.Tok, m.Tok.BOS()), specialText(m.Tok, m.Tok.EOS())
	}
	switch {
	case override != "":
		t, err = Lookup(override)
		how = "override"
	case m.Template != "":
		t, err = FromJinja(m.Template, bos, eos)
		if err != nil {
			return nil, "", err
		}
		if d := Detect(m.Template); d != "" {
			b, _ := Lookup(d)
			for _, s := range b.Stops {
				if !slices.Contains(t.Stops, s) {
					t.Stops = append(t.Stops, s)
				}
			}
		}
		return t, "chat_template", nil
	default:
		t, err = Lookup(byArch(m))
		how = "architecture"
	}
	if err != nil {
		return nil, "", err
	}
	if t.Name == "chatml" {
		if sm := chatmlSystem.FindStringSubmatch(m.Template); sm != nil {
			t.DefaultSystem = sm[1]
		}
	}
	if bos != "" {
		t.BOS = bos
	}
	if eos != "" && t.Name != "phi3" {
		t.EOS = eos
	}
	return t, how, nil
}

// specialText is the text of a special token as a template writes it ("" if
// the id is out of range).
func specialText(tok tokenizer.Tokenizer, id int) string {
	if id < 0 || id >= tok.VocabSize() {
		return ""
	}
	// llama2.c vocabularies store "\n<s>\n".
	return strings.Trim(tok.Piece(id), "\n")
}

func byArch(m Model) string {
	has := func(p string) bool {
		if m.Tok == nil {
			return false
		}
		_, ok := tokenizer.TokenID(m.Tok, p)
		return ok
	}
	switch {
	case m.Arch == "qwen2" || has("<|im_start|>"):
		return "chatml"
	case m.Arch == "phi3" || has("<|end|>") && has("<|user|>"):
		return "phi3"
	case has("<|start_header_id|>"):
		return "llama3"
	case m.Arch == "mistral":
		return "mistral"
	}
	return "llama2"
}

// FromGGUF chooses the template of an open GGUF model (see ForModel).
func FromGGUF(f *gguf.File, tok tokenizer.Tokenizer, override string) (*Template, string, error) {
	m := Model{Tok: tok}
	if _, ok := f.Lookup("general.architecture"); ok {
		a, err := f.String("general.architecture")
		if err != nil {
			return nil, "", err
		}
		m.Arch = a
	}
	if _, ok := f.Lookup("tokenizer.chat_template"); ok {
		s, err := f.String("tokenizer.chat_template")
		if err != nil {
			return nil, "", err
		}
		m.Template = s
	}
	return ForModel(m, override)
}

// splitSystem takes a leading system message off msgs.
func splitSystem(msgs []Message) (sys string, hasSys bool, rest []Message) {
	if len(msgs) > 0 && msgs[0].Role == "system" {
		return msgs[0].Content, true, msgs[1:]
	}
	return "", false, msgs
}

// alternate checks the user/assistant alternation the Llama 2 and Mistral
// templates require.
func alternate(name string, msgs []Message) error {
	for i, m := range msgs {
		if m.Role != "user" && m.Role != "assistant" {
			return fmt.Errorf("chat: %s: role %q is not supported (only an initial system message, then user and assistant)", name, m.Role)
		}
		if (m.Role == "user") != (i%2 == 0) {
			return fmt.Errorf("chat: %s: conversation roles must alternate user/assistant/user/… after the optional system message", name)
		}
	}
	return nil
}

// renderLlama2 is Llama 2 chat's template:
//
//	<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user} [/INST]
//
// (message text stripped of surrounding white space; no generation prompt
// beyond the closing [/INST]).
func renderLlama2(t *Template, msgs []Message, gen bool) (string, error) {
	sys, hasSys, rest := splitSystem(msgs)
	if err := alternate(t.Name, rest); err != nil {
		return "", err
	}
	var b strings.Builder
	for i, m := range rest {
		c := m.Content
		if i == 0 && hasSys {
			c = "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" + c
		}
		if m.Role == "user" {
			b.WriteString(t.BOS + "[INST] " + strings.TrimSpace(c) + " [/INST]")
		} else {
			b.WriteString(" " + strings.TrimSpace(c) + " " + t.EOS)
		}
	}
	return b.String(), nil
}

// renderLlama3 is Llama 3 Instruct's template:
//
//	<|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>…<|start_header_id|>assistant<|end_header_id|>\n\n
func renderLlama3(t *Template, msgs []Message, gen bool) (string, error) {
	var b strings.Builder
	for i, m := range msgs {
		if i == 0 {
			b.WriteString(t.BOS)
		}
		b.WriteString("<|start_header_id|>" + m.Role + "<|end_header_id|>\n\n" + strings.TrimSpace(m.Content) + "<|eot_id|>")
	}
	if gen {
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
	return b.String(), nil
}

// renderChatML is ChatML (Qwen):
//
//	<|im_start|>{role}\n{content}<|im_end|>\n…<|im_start|>assistant\n
//
// with the default system message first when the conversation has none.
func renderChatML(t *Template, msgs []Message, gen bool) (string, error) {
	var b strings.Builder
	for i, m := range msgs {
		if i == 0 && t.DefaultSystem != "" && m.Role != "system" {
			b.WriteString("<|im_start|>system\n" + t.DefaultSystem + "<|im_end|>\n")
		}
		b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
	}
	if gen {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}

// renderMistral is Mistral 7B Instruct's template (v0.1/v0.2):
//
//	<s> [INST] {system}\n\n{user} [/INST] {assistant}</s> [INST] {user} [/INST]
func renderMistral(t *Template, msgs []Message, gen bool) (string, error) {
	sys, hasSys, rest := splitSystem(msgs)
	if err := alternate(t.Name, rest); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(t.BOS)
	for i, m := range rest {
		if m.Role == "user" {
			if i == 0 && hasSys {
				b.WriteString(" [INST] " + sys + "\n\n" + m.Content + " [/INST]")
			} else {
				b.WriteString(" [INST] " + m.Content + " [/INST]")
			}
		} else {
			b.WriteString(" " + m.Content + t.EOS)
		}
	}
	return b.String(), nil
}

// renderZephyr is Zephyr's (and TinyLlama Chat's) template:
//
//	<|system|>\n{system}</s>\n<|user|>\n{user}</s>\n<|assistant|>\n
func renderZephyr(t *Template, msgs []Message, gen bool) (string, error) {
	var b strings.Builder
	for _, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant":
		default:
			return "", fmt.Errorf("chat: zephyr: role %q is not supported (system, user, assistant)", m.Role)
		}
		b.WriteString("<|" + m.Role + "|>\n" + m.Content + t.EOS + "\n")
	}
	if gen {
		b.WriteString("<|assistant|>\n")
	}
	return b.String(), nil
}

// renderPhi3 is Phi-3's template:
//
//	<|system|>\n{system}<|end|>\n<|user|>\n{user}<|end|>\n<|assistant|>\n
func renderPhi3(t *Template, msgs []Message, gen bool) (string, error) {
	var b strings.Builder
	for _, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant":
		default:
			return "", fmt.Errorf("chat: phi3: role %q is not supported (system, user, assistant)", m.Role)
		}
		b.WriteString("<|" + m.Role + "|>\n" + m.Content + "<|end|>\n")
	}
	if gen {
		b.WriteString("<|assistant|>\n")
	}
	return b.String(), nil
}

// Llama 3.1's system header: the official template writes it in every
// prompt, a system message or not. The date is the template's default
// date_string ("26 Jul 2024"); Llama 3.2's template writes today's date
// where its renderer provides strftime_now, and this date otherwise.
const llama31Header = "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"

// renderLlama31 is Llama 3.1/3.2 Instruct's template (meta-llama/
// Llama-3.1-8B-Instruct's tokenizer_config.json chat_template) as it renders
// without tools (no tools, custom_tools or builtin_tools given):
//
//	{{- bos_token }}
//	{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
//	{%- else %}{%- set system_message = "" %}{%- endif %}
//	{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
//	{{- "Cutting Knowledge Date: December 2023\n" }}
//	{{- "Today Date: " + date_string + "\n\n" }}
//	{{- system_message }}{{- "<|eot_id|>" }}
//	{%- for message in messages %}
//	    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
//	        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
//	    {%- elif message.role == "tool" or message.role == "ipython" %}
//	        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
//	        {%- if message.content is mapping or message.content is iterable %}{{- message.content | tojson }}
//	        {%- else %}{{- message.content }}{%- endif %}
//	        {{- "<|eot_id|>" }}
//	    {%- endif %}
//	{%- endfor %}
//	{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}
//
// A string is iterable in Jinja, so a tool message's text is written as a
// JSON string (transformers' tojson: json.dumps with ensure_ascii=False).
func renderLlama31(t *Template, msgs []Message, gen bool) (string, error) {
	sys, _, rest := splitSystem(msgs)
	var b strings.Builder
	b.WriteString(t.BOS + llama31Header + strings.TrimSpace(sys) + "<|eot_id|>")
	for _, m := range rest {
		if m.Role == "tool" || m.Role == "ipython" {
			b.WriteString("<|start_header_id|>ipython<|end_header_id|>\n\n" + pyJSONString(m.Content) + "<|eot_id|>")
			continue
		}
		b.WriteString("<|start_header_id|>" + m.Role + "<|end_header_id|>\n\n" + strings.TrimSpace(m.Content) + "<|eot_id|>")
	}
	if gen {
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
	return b.String(), nil
}

// pyJSONString is Python's json.dumps(s, ensure_ascii=False) of a string:
// quotes, backslashes and control characters escaped, the rest as is.
func pyJSONString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// renderMistralV3 is Mistral's v3 template (mistralai/Mistral-7B-Instruct-v0.3)
// and, for the template named mistral-v3-tekken, its tekken form
// (mistralai/Mistral-Nemo-Instruct-2407), as their tokenizer_config.json
// chat_templates render without tools:
//
//	v3:     {{- bos_token }} … user: {{- "[INST] " + message["content"] + "[/INST]" }}
//	        (the last message, if a user's: {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }})
//	        assistant: {{- " " + message["content"]|trim + eos_token}}
//	tekken: user: {{- "[INST]" + message["content"] + "[/INST]" }} (system likewise, "[INST]" + system_message + "\n\n" + …)
//	        assistant: {{- message["content"] + eos_token}}
//
// that is <s>[INST] user[/INST] assistant</s>[INST] system\n\nuser[/INST]
// and <s>[INST]user[/INST]assistant</s>[INST]system\n\nuser[/INST]. The
// system message goes into the last message only when that is a user's
// (`loop.last and system_message is defined`): a conversation ending with
// an assistant turn renders without it, as the templates do. There is no
// generation prompt.
func renderMistralV3(t *Template, msgs []Message, gen bool) (string, error) {
	sys, hasSys, rest := splitSystem(msgs)
	if err := alternate(t.Name, rest); err != nil {
		return "", err
	}
	tekken := t.Name == "mistral-v3-tekken"
	inst := "[INST] "
	if tekken {
		inst = "[INST]"
	}
	var b strings.Builder
	b.WriteString(t.BOS)
	for i, m := range rest {
		switch {
		case m.Role == "user" && i == len(rest)-1 && hasSys:
			b.WriteString(inst + sys + "\n\n" + m.Content + "[/INST]")
		case m.Role == "user":
			b.WriteString(inst + m.Content + "[/INST]")
		case tekken:
			b.WriteString(m.Content + t.EOS)
		default:
			b.WriteString(" " + strings.TrimSpace(m.Content) + t.EOS)
		}
	}
	return b.String(), nil
}

// renderMistralV7 is Mistral's v7 template (mistralai/Mistral-Large-Instruct-2411):
//
//	{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}
//	{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}
//	{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}
//	{% else %}{{ raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% endfor %}
//
// that is <s>[SYSTEM_PROMPT] system[/SYSTEM_PROMPT][INST] user[/INST] assistant</s>;
// system messages may come anywhere; there is no generation prompt.
func renderMistralV7(t *Template, msgs []Message, gen bool) (string, error) {
	var b strings.Builder
	b.WriteString(t.BOS)
	for _, m := range msgs {
		switch m.Role {
		case "user":
			b.WriteString("[INST] " + m.Content + "[/INST]")
		case "system":
			b.WriteString("[SYSTEM_PROMPT] " + m.Content + "[/SYSTEM_PROMPT]")
		case "assistant":
			b.WriteString(" " + m.Content + t.EOS)
		default:
			return "", fmt.Errorf("chat: %s: role %q is not supported (system, user, assistant)", t.Name, m.Role)
		}
	}
	return b.String(), nil
}
