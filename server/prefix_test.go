package server

import (
	"os"
	"testing"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/internal/shared"
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
