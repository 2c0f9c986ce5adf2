package server

import (
	"testing"

	"github.com/kvlm/kvlm/engine"
)

// TestSeed: a request without a seed samples afresh each time; with one it
// is reproducible. Both endpoints.
func TestSeed(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	cases := []struct {
		name, path string
		chat       bool
		body       map[string]any
	}{
		{"completions", "/v1/completions", false, map[string]any{"prompt": "Once upon a time", "max_tokens": 40}},
		{"chat", "/v1/chat/completions", true, map[string]any{"messages": []map[string]any{{"role": "user", "content": "Once upon a time"}}, "max_tokens": 40}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			text := func(seed any) string {
				t.Helper()
				b := map[string]any{}
				for k, v := range c.body {
					b[k] = v
				}
				if seed != nil {
					b["seed"] = seed
				}
				code, body := f.post(t, c.path, b)
				if code != 200 {
					t.Fatalf("%d %v", code, body)
				}
				return choiceText(body, 0, c.chat)
			}
			seen := map[string]bool{}
			for range 4 {
				seen[text(nil)] = true
			}
			if len(seen) < 2 {
				t.Errorf("4 requests without a seed gave one text: %v", seen)
			}
			if a, b := text(11), text(11); a != b {
				t.Errorf("seed 11 gave %q, then %q", a, b)
			}
		})
	}
}
