package server

import (
	"os"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// storyIDs is the first n tokens of the TinyStories validation text.
func storyIDs(t *testing.T, f *fixture, n int) []int {
	t.Helper()
	text, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ids := f.tok.Encode(string(text[:8000]), true, false)
	return ids[:n]
}

// TestKVParamsRefused: a kv field the policy does not use, or a policy
// that could not run, is a 400 naming the field, before any work.
func TestKVParamsRefused(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	for _, c := range []struct {
		name  string
		kv    map[string]any
		param string
		msg   string
	}{
		{"h2o budget 1", map[string]any{"policy": "h2o", "budget": 1}, "kv.budget", "leaves no room"},
		{"tova budget 1", map[string]any{"policy": "tova", "budget": 1}, "kv.budget", "leaves no room"},
		{"window 1", map[string]any{"policy": "window", "window": 1}, "kv.window", "leaves no room"},
		{"full window", map[string]any{"policy": "full", "window": 8}, "kv.window", "full takes no kv.window"},
		{"full every 0", map[string]any{"every": 0}, "kv.every", "full takes no kv.every"},
		{"streaming kernel", map[string]any{"policy": "streaming", "window": 8, "kernel": 3}, "kv.kernel", "streaming takes no kv.kernel"},
		{"h2o pool", map[string]any{"policy": "h2o", "budget": 8, "pool": "max"}, "kv.pool", "h2o takes no kv.pool"},
		{"knorm agg", map[string]any{"policy": "knorm", "budget": 8, "agg": "mean"}, "kv.agg", "knorm takes no kv.agg"},
		{"pyramidinfer every 0", map[string]any{"policy": "pyramidinfer", "every": 0}, "kv.every", "kv.every"},
		{"snapkv window 0", map[string]any{"policy": "snapkv", "ratio": 0.5, "window": 0}, "kv.window", "kv.window 0"},
		{"streaming sinks 0", map[string]any{"policy": "streaming", "window": 8, "sinks": 0}, "kv.sinks", "kv.sinks 0"},
		{"budget 0", map[string]any{"policy": "h2o", "ratio": 0.5, "budget": 0}, "kv.budget", "kv.budget must be positive"},
		{"adakv reindex", map[string]any{"policy": "adakv", "budget": 40, "positions": "reindex"}, "kv.positions", "kv.positions"},
		{"minicache sinks", map[string]any{"policy": "minicache", "sinks": 2}, "kv.sinks", "minicache takes no kv.sinks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := f.post(t, "/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 4, "kv": c.kv})
			e, _ := body["error"].(map[string]any)
			msg, _ := e["message"].(string)
			param, _ := e["param"].(string)
			if code != 400 || param != c.param || !strings.Contains(msg, c.msg) || strings.Contains(msg, "--kv-") {
				t.Fatalf("status %d, param %q, message %q; want 400, %q, a message with %q", code, param, msg, c.param, c.msg)
			}
		})
	}
	code, body := f.post(t, "/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 4,
		"kv": map[string]any{"policy": "snapkv", "ratio": 0.5, "pool": "max", "agg": "max", "kernel": 3, "window": 4, "sinks": 1, "every": 2, "positions": "reindex"}})
	if code != 200 {
		t.Fatalf("every snapkv field: status %d %v", code, body)
	}
}

// TestKVExplicitChoices: kv.every 0 prunes only after the prompt, and
// kv.positions "original" is honoured for streaming.
func TestKVExplicitChoices(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	prompt := storyIDs(t, f, 60)
	kvOf := func(kv map[string]any) map[string]any {
		t.Helper()
		code, body := f.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 20, "temperature": 0, "kv": kv})
		if code != 200 {
			t.Fatalf("%v: status %d %v", kv, code, body)
		}
		return usageOfBody(body)["kv"].(map[string]any)
	}
	never := kvOf(map[string]any{"policy": "h2o", "budget": 16, "every": 0})
	always := kvOf(map[string]any{"policy": "h2o", "budget": 16})
	if never["evicted_tokens"].(float64) != 60-16 || !strings.Contains(never["policy"].(string), "every=never") {
		t.Errorf("every 0: %v; want %d tokens evicted after the prompt only", never, 60-16)
	}
	if always["evicted_tokens"].(float64) <= 60-16 || always["bytes"].(float64) >= never["bytes"].(float64) {
		t.Errorf("every step: %v, every 0: %v", always, never)
	}
	orig := kvOf(map[string]any{"policy": "streaming", "window": 8, "positions": "original"})
	def := kvOf(map[string]any{"policy": "streaming", "window": 8})
	if p := orig["policy"].(string); !strings.Contains(p, "positions=original") {
		t.Errorf("positions original: policy %q", p)
	}
	if p := def["policy"].(string); !strings.Contains(p, "positions=reindex") {
		t.Errorf("positions default: policy %q", p)
	}
}

// TestKVChunkedPyramidInfer: a 355-token prompt prefilled in chunks of
// 128 is pruned by PyramidInfer as a single step would be.
func TestKVChunkedPyramidInfer(t *testing.T) {
	f := newFixture(t, engine.Config{PrefillChunk: 128}, Options{})
	prompt := storyIDs(t, f, 355)
	kvOf := func(kv map[string]any) map[string]any {
		t.Helper()
		code, body := f.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "kv": kv})
		if code != 200 {
			t.Fatalf("%v: status %d %v", kv, code, body)
		}
		return usageOfBody(body)["kv"].(map[string]any)
	}
	full := kvOf(map[string]any{"policy": "full", "cache_prompt": false})
	pyr := kvOf(map[string]any{"policy": "pyramidinfer"})
	if pyr["evicted_tokens"].(float64) <= 0 || pyr["bytes"].(float64) >= full["bytes"].(float64) {
		t.Fatalf("pyramidinfer in chunks: %v; uncompressed %v", pyr, full)
	}
}

// TestKVPeakBytes: a SnapKV request's bytes_peak is at least the
// uncompressed prompt's bytes and equals the peak kvlm generate reports
// (engine.Generate) for the same greedy run.
func TestKVPeakBytes(t *testing.T) {
	f := newFixture(t, engine.Config{PrefillChunk: 128}, Options{})
	prompt := storyIDs(t, f, 300)
	kv := map[string]any{"policy": "snapkv", "ratio": 0.25}
	code, body := f.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 8, "temperature": 0, "kv": kv})
	if code != 200 {
		t.Fatalf("status %d %v", code, body)
	}
	u := usageOfBody(body)["kv"].(map[string]any)
	_, fb := f.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "kv": map[string]any{"cache_prompt": false}})
	promptBytes := usageOfBody(fb)["kv"].(map[string]any)["bytes"].(float64)

	seq, err := f.m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	seq.Chunk = 128
	ps, err := policy.New(policy.Config{Method: "snapkv", Ratio: 0.25}, seq)
	if err != nil {
		t.Fatal(err)
	}
	res, err := engine.Generate(seq, engine.Request{Prompt: prompt, MaxTokens: 8, EOS: f.tok.EOS(), Policy: ps})
	if err != nil {
		t.Fatal(err)
	}
	peak := u["bytes_peak"].(float64)
	t.Logf("bytes_peak %v, bytes %v, uncompressed prompt %v, Generate's peak %d", peak, u["bytes"], promptBytes, res.PeakKVBytes)
	if peak < promptBytes || peak != float64(res.PeakKVBytes) || peak <= u["bytes"].(float64) {
		t.Fatalf("bytes_peak %v: want ≥ the prompt's %v, = Generate's %d, > the compressed %v", peak, promptBytes, res.PeakKVBytes, u["bytes"])
	}
}
