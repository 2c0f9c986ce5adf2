package engine

import (
	"slices"
	"testing"

	"github.com/kvlm/kvlm/policy"
)

// TestEnginePolicyPrefixReuse: a request with a policy after a plain one
// with the same 400-token prompt takes the cached blocks the method allows
// (policy.Config.ComputedTail) and computes only the rest, with the
// output of the whole prompt computed in one sequence; the plain prefix is
// still a full hit afterwards.
func TestEnginePolicyPrefixReuse(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{PrefillChunk: 64})
	const T, gen = 400, 12
	prompt := longPrompt(t, tok, T)
	full := (T - 1) / 16 * 16 // what a plain request finds once the prompt is cached
	first := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: gen})))
	if u := first.usage; u.CachedTokens != 0 || u.ComputedTokens != T {
		t.Fatalf("first request: %d cached, %d computed; want 0, %d", u.CachedTokens, u.ComputedTokens, T)
	}
	computed := int64(T)
	for _, c := range []struct {
		cfg    policy.Config
		cached int // prompt tokens from the cache
	}{
		{policy.Config{Method: "snapkv", Ratio: 0.25}, (T - 32) / 16 * 16},               // the observation window is computed
		{policy.Config{Method: "snapkv", Budget: 128, Window: 100}, (T - 100) / 16 * 16}, // a larger window
		{policy.Config{Method: "tova", Budget: 40}, full},                                // the last query only
		{policy.Config{Method: "streaming", Window: 60, Sinks: 4}, full},                 // positions only, then re-indexed
		{policy.Config{Method: "knorm", Ratio: 0.5}, full},                               // keys only
		{policy.Config{Method: "h2o", Budget: 48}, 0},                                    // every query's mass: all computed
		{policy.Config{Method: "pyramidinfer"}, 0},                                       // pruned during the prefill
	} {
		t.Run(c.cfg.String(), func(t *testing.T) {
			o := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: gen, Policy: c.cfg})))
			if o.finish[0] != FinishLength {
				t.Fatalf("finish %s: %v", o.finish[0], o.errs[0])
			}
			if u := o.usage; u.CachedTokens != c.cached || u.ComputedTokens != T-c.cached {
				t.Errorf("%d cached, %d computed; want %d, %d", u.CachedTokens, u.ComputedTokens, c.cached, T-c.cached)
			}
			computed += int64(T - c.cached)
			cfg, err := c.cfg.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			if want, _ := generatePeak(t, m, cfg, prompt, gen, 64); !slices.Equal(o.tokens[0], want) {
				t.Errorf("tokens %v, want %v (the whole prompt computed in one sequence)", o.tokens[0], want)
			}
			// The plain prefix is still a full hit, with the same output.
			p := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: gen})))
			if u := p.usage; u.CachedTokens != full || u.ComputedTokens != T-full {
				t.Errorf("plain request after it: %d cached, %d computed; want %d, %d", u.CachedTokens, u.ComputedTokens, full, T-full)
			}
			computed += int64(T - full)
			if !slices.Equal(p.tokens[0], first.tokens[0]) {
				t.Errorf("plain request after it: %v, want %v", p.tokens[0], first.tokens[0])
			}
		})
	}
	if st := e.Stats(); st.PrefillComputed != computed {
		t.Errorf("engine counted %d prompt tokens computed, the requests %d", st.PrefillComputed, computed)
	}
	checkFree(t, e)
}
