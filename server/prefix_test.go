package server

import (
	"os"
	"testing"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/tokenizer"
)

// storyText is the head of the TinyStories validation text: n bytes.
func storyText(t testing.TB, n int) string {
	t.Helper()
	b, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}

// TestPolicyPrefixReuseVisible: a snapkv request after a plain one with
// the same prompt reports the prompt tokens it took from the prefix cache
// (usage.prompt_tokens_details.cached_tokens, kv.cached_tokens) and
// computed only the rest (kv.computed_tokens, and the
// kvlm_prompt_tokens_computed_total counter); a plain one after it is
// still a full hit.
func TestPolicyPrefixReuseVisible(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	prompt := storyText(t, 700)
	code, a := f.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4})
	if code != 200 {
		t.Fatalf("plain request: %d %v", code, a)
	}
	pt := num(a, "usage", "prompt_tokens")
	if pt < 200 {
		t.Fatalf("prompt of %v tokens, want a long one", pt)
	}
	if c := num(a, "usage", "kv", "computed_tokens"); c != pt {
		t.Errorf("first request computed %v of %v prompt tokens", c, pt)
	}
	var b map[string]any
	code, b = f.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "kv": map[string]any{"policy": "snapkv", "ratio": 0.25}})
	if code != 200 {
		t.Fatalf("snapkv request: %d %v", code, b)
	}
	want := float64(int(pt-32) / 16 * 16) // the observation window is computed
	if c := num(b, "usage", "prompt_tokens_details", "cached_tokens"); c != want {
		t.Errorf("snapkv request: %v cached tokens, want %v", c, want)
	}
	if c, k := num(b, "usage", "kv", "computed_tokens"), num(b, "usage", "kv", "cached_tokens"); c != pt-want || k != want {
		t.Errorf("snapkv request: kv usage computed %v cached %v, want %v, %v", c, k, pt-want, want)
	}
	_, c := f.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4})
	if got, full := num(c, "usage", "prompt_tokens_details", "cached_tokens"), float64(int(pt-1)/16*16); got != full {
		t.Errorf("plain request after it: %v cached, want %v", got, full)
	}
	m := f.metrics(t)
	if got, all := m["kvlm_prompt_tokens_computed_total"], num(a, "usage", "kv", "computed_tokens")+num(b, "usage", "kv", "computed_tokens")+num(c, "usage", "kv", "computed_tokens"); got != all {
		t.Errorf("kvlm_prompt_tokens_computed_total = %v, want %v", got, all)
	}
}

// TestCompressedPrefixVisible: the second request with the same document
// and the same kv settings computes none of its prompt
// (kv.computed_tokens 0, kv.compressed_tokens all of it), and /metrics
// counts the hit, the miss and the bytes cached.
func TestCompressedPrefixVisible(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	body := map[string]any{"prompt": storyText(t, 700), "max_tokens": 8, "temperature": 0, "kv": map[string]any{"policy": "snapkv", "ratio": 0.25}}
	_, a := f.post(t, "/v1/completions", body)
	m := f.metrics(t)
	if m["kvlm_compressed_prefix_misses_total"] != 1 || m["kvlm_compressed_prefixes"] != 1 || m["kvlm_compressed_prefix_bytes"] <= 0 {
		t.Errorf("metrics after the first request: misses %v, prefixes %v, bytes %v", m["kvlm_compressed_prefix_misses_total"], m["kvlm_compressed_prefixes"], m["kvlm_compressed_prefix_bytes"])
	}
	code, b := f.post(t, "/v1/completions", body)
	if code != 200 {
		t.Fatalf("%d %v", code, b)
	}
	pt := num(b, "usage", "prompt_tokens")
	if c, k := num(b, "usage", "kv", "computed_tokens"), num(b, "usage", "kv", "compressed_tokens"); c != 0 || k != pt || num(b, "usage", "prompt_tokens_details", "cached_tokens") != pt {
		t.Errorf("second request: computed %v, compressed %v of %v prompt tokens", c, k, pt)
	}
	if choiceText(a, 0, false) != choiceText(b, 0, false) {
		t.Errorf("outputs differ: %q, %q", choiceText(a, 0, false), choiceText(b, 0, false))
	}
	if m := f.metrics(t); m["kvlm_compressed_prefix_hits_total"] != 1 {
		t.Errorf("hits %v", m["kvlm_compressed_prefix_hits_total"])
	}
}

// TestDocumentQuestions: kv.prefix (text the prompt begins with) and
// kv.prefix_tokens compress a document once for many questions, on both
// endpoints: the first request computes its whole prompt, the next ones
// only their question; bad prefixes are refused with the field named.
func TestDocumentQuestions(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	doc := storyText(t, 900)
	kv := map[string]any{"policy": "snapkv", "ratio": 0.25, "prefix": doc}
	docTokens := float64(len(f.tok.Encode(doc, tokenizer.AddsBOS(f.tok), false)))
	for i, q := range []string{"\nWho was in the story?", "\nWhat did Lily want?", "\nWhere did they go?"} {
		code, b := f.post(t, "/v1/completions", map[string]any{"prompt": doc + q, "max_tokens": 6, "temperature": 0, "kv": kv})
		if code != 200 {
			t.Fatalf("question %d: %d %v", i, code, b)
		}
		pt, c, k := num(b, "usage", "prompt_tokens"), num(b, "usage", "kv", "computed_tokens"), num(b, "usage", "kv", "compressed_tokens")
		if i == 0 {
			if c != pt || k != 0 {
				t.Errorf("question 0: computed %v, compressed %v of %v", c, k, pt)
			}
			continue
		}
		if k != docTokens || c != pt-docTokens {
			t.Errorf("question %d: computed %v, compressed %v of %v; want the %v document tokens compressed", i, c, k, pt, docTokens)
		}
	}
	// kv.prefix_tokens names the same prefix by its length; a chat whose
	// rendered prompt starts with the document, too.
	_, b := f.post(t, "/v1/completions", map[string]any{"prompt": doc + "\nWhy?", "max_tokens": 4,
		"kv": map[string]any{"policy": "snapkv", "ratio": 0.25, "prefix_tokens": docTokens}})
	if k := num(b, "usage", "kv", "compressed_tokens"); k != docTokens {
		t.Errorf("kv.prefix_tokens: %v compressed tokens, want %v", k, docTokens)
	}
	code, c := f.post(t, "/v1/chat/completions", map[string]any{"max_tokens": 4,
		"messages": []map[string]any{{"role": "system", "content": doc}, {"role": "user", "content": "Who was there?"}},
		"kv":       map[string]any{"policy": "snapkv", "ratio": 0.25, "prefix": doc}})
	if code != 200 || num(c, "usage", "kv", "compressed_tokens") != docTokens {
		t.Errorf("chat: %d %v", code, c)
	}
	for _, bad := range []struct {
		kv    map[string]any
		param string
	}{
		{map[string]any{"policy": "snapkv", "ratio": 0.25, "prefix": "Not how it starts"}, "kv.prefix"},
		{map[string]any{"policy": "snapkv", "ratio": 0.25, "prefix": ""}, "kv.prefix"},
		{map[string]any{"policy": "snapkv", "ratio": 0.25, "prefix": doc, "prefix_tokens": 3}, "kv.prefix"},
		{map[string]any{"policy": "snapkv", "ratio": 0.25, "prefix_tokens": 100000}, "kv.prefix_tokens"},
		{map[string]any{"policy": "snapkv", "ratio": 0.25, "prefix": doc + doc}, "kv.prefix"},
	} {
		code, body := f.post(t, "/v1/completions", map[string]any{"prompt": doc + "\nWho?", "max_tokens": 2, "kv": bad.kv})
		if code != 400 || body["error"].(map[string]any)["param"] != bad.param {
			t.Errorf("kv %v: %d %v, want 400 naming %s", bad.kv["prefix_tokens"], code, body, bad.param)
		}
	}
	if code, body := f.post(t, "/v1/completions", map[string]any{"prompt": doc + "\nWho?", "max_tokens": 2, "kv": map[string]any{"prefix": doc}}); code != 400 {
		t.Errorf("a prefix without a policy: %d %v, want 400", code, body)
	}
}
