package server

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/gguf"
)

// writeMeta writes a GGUF holding only metadata.
func writeMeta(t *testing.T, kv map[string]any) string {
	t.Helper()
	w := gguf.NewWriter()
	for k, v := range kv {
		if err := w.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestChooseFormatJinja: a GGUF's own template is rendered by the Jinja
// engine; one that does not parse is an error, not a fallback; the plain
// template and files without one keep their formats.
func TestChooseFormatJinja(t *testing.T) {
	const src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
	cases := []struct {
		name, tmpl, override string
		wantName, wantHow    string
		wantPrompt, wantErr  string
	}{
		{"model template", src, "", chat.JinjaName, "chat_template", "<user>hi<assistant>", ""},
		{"override", src, "chatml", "chatml", "override", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", ""},
		{"plain", chat.PlainTemplate, "", PlainName, "chat_template", "hi\n", ""},
		{"none", "", "", "llama2", "architecture", "<s>[INST] hi [/INST]", ""},
		{"broken", "{% if messages %}x", "", "", "", "", "does not parse"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kv := map[string]any{"general.architecture": "llama"}
			if c.tmpl != "" {
				kv["tokenizer.chat_template"] = c.tmpl
			}
			f, how, err := ChooseFormat(writeMeta(t, kv), nil, c.override)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || f.Name() != c.wantName || how != c.wantHow {
				t.Fatalf("%v by %s (%v), want %s by %s", f, how, err, c.wantName, c.wantHow)
			}
			p, err := f.Render([]chat.Message{{Role: "user", Content: "hi"}})
			if err != nil || p != c.wantPrompt {
				t.Fatalf("prompt %q (%v), want %q", p, err, c.wantPrompt)
			}
		})
	}
}

// TestChatTemplateRefuses: a conversation the model's template refuses
// (raise_exception) is answered 400 with the template's message.
func TestChatTemplateRefuses(t *testing.T) {
	const src = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}" +
		"{{ m.content + '\\n' }}{% endfor %}"
	tm, err := chat.FromJinja(src, "", "")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, engine.Config{}, Options{Format: templateFormat{tm}})
	code, body := f.post(t, "/v1/chat/completions", map[string]any{"messages": []map[string]string{
		{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Once upon a time"}}, "max_tokens": 3})
	if code != 400 || !strings.Contains(body["error"].(map[string]any)["message"].(string), "System role not supported") {
		t.Fatalf("%d %v", code, body)
	}
	code, body = f.post(t, "/v1/chat/completions", map[string]any{"messages": []map[string]string{
		{"role": "user", "content": "Once upon a time"}}, "max_tokens": 3})
	if code != 200 {
		t.Fatalf("%d %v", code, body)
	}
}
