package engine

import (
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/tokenizer"
)

// longPrompt is the first n tokens of the TinyStories validation text.
func longPrompt(t *testing.T, tok tokenizer.Tokenizer, n int) []int {
	t.Helper()
	text, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(string(text[:8000]), true, false)
	if len(ids) < n {
		t.Fatalf("%d tokens, %d wanted", len(ids), n)
	}
	return ids[:n]
}

// promptEndBytes is the KV memory of prompt in a fresh uncompressed
// sequence.
func promptEndBytes(t *testing.T, m *model.Model, prompt []int) int64 {
	t.Helper()
	seq, err := m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	if _, err := seq.Forward(prompt, false); err != nil {
		t.Fatal(err)
	}
	return seq.Cache().Bytes()
}

// generatePeak runs engine.Generate (what kvlm generate runs) under cfg
// with the prefill chunk, greedy, and returns its tokens and peak bytes.
func generatePeak(t *testing.T, m *model.Model, cfg policy.Config, prompt []int, n, chunk int) ([]int, int64) {
	t.Helper()
	seq, err := m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	seq.Chunk = chunk
	var ps *policy.State
	if cfg.Method != "full" {
		if ps, err = policy.New(cfg, seq); err != nil {
			t.Fatal(err)
		}
	}
	res, err := Generate(seq, Request{Prompt: prompt, MaxTokens: n, EOS: -1, Policy: ps})
	if err != nil {
		t.Fatal(err)
	}
	return res.Tokens, res.PeakKVBytes
}

// TestEnginePeakBeforeCompression: a request's KVBytesPeak is the most KV
// memory it held, the prompt's before the policy compressed it included,
// and equals the peak engine.Generate (kvlm generate --json) reports for
// the same run.
func TestEnginePeakBeforeCompression(t *testing.T) {
	m, tok := loadStories(t)
	const T, n = 355, 8
	prompt := longPrompt(t, tok, T)
	full := promptEndBytes(t, m, prompt)
	for _, c := range []struct {
		name  string
		cfg   policy.Config
		chunk int
	}{
		{"snapkv", policy.Config{Method: "snapkv", Ratio: 0.25}, 128},
		{"h2o", policy.Config{Method: "h2o", Budget: 64}, 128},
		{"streaming", policy.Config{Method: "streaming", Window: 60}, 128},
		{"knorm", policy.Config{Method: "knorm", Budget: 100, Every: 4}, 128},
		{"full", policy.Config{Method: "full"}, 128},
		{"pyramidinfer one step", policy.Config{Method: "pyramidinfer"}, 512},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, m, Config{PrefillChunk: c.chunk})
			h, err := e.Submit(GenRequest{Prompt: prompt, MaxTokens: n, Policy: c.cfg})
			if err != nil {
				t.Fatal(err)
			}
			o := collect(t, h)
			if o.errs[0] != nil || o.finish[0] != FinishLength {
				t.Fatalf("finish %s, %v", o.finish[0], o.errs[0])
			}
			cfg, err := c.cfg.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			toks, peak := generatePeak(t, m, cfg, prompt, n, c.chunk)
			u := o.usage
			t.Logf("engine peak %d, end %d; Generate peak %d; uncompressed prompt %d", u.KVBytesPeak, u.KVBytes, peak, full)
			if !slices.Equal(o.tokens[0], toks) {
				t.Fatalf("engine tokens %v, Generate %v", o.tokens[0], toks)
			}
			if u.KVBytesPeak != peak {
				t.Fatalf("engine peak %d bytes, Generate's %d", u.KVBytesPeak, peak)
			}
			if c.cfg.Method != "pyramidinfer" && u.KVBytesPeak < full {
				t.Fatalf("peak %d bytes below the uncompressed prompt's %d", u.KVBytesPeak, full)
			}
			if u.KVBytesPeak < u.KVBytes {
				t.Fatalf("peak %d below the bytes at the end %d", u.KVBytesPeak, u.KVBytes)
			}
			checkFree(t, e)
		})
	}
}

// TestEnginePyramidInferChunkedPrefill: PyramidInfer prunes a prompt the
// engine prefills in chunks to the bytes of a single-step prefill.
func TestEnginePyramidInferChunkedPrefill(t *testing.T) {
	m, tok := loadStories(t)
	const T = 355
	prompt := longPrompt(t, tok, T)
	run := func(chunk int, cfg policy.Config) Usage {
		e := newEngine(t, m, Config{PrefillChunk: chunk})
		h, err := e.Submit(GenRequest{Prompt: prompt, MaxTokens: 1, Policy: cfg})
		if err != nil {
			t.Fatal(err)
		}
		o := collect(t, h)
		if o.errs[0] != nil {
			t.Fatal(o.errs[0])
		}
		checkFree(t, e)
		return o.usage
	}
	full := run(128, policy.Config{Method: "full"})
	for _, decay := range []float64{0, 0.3} {
		cfg := policy.Config{Method: "pyramidinfer", Opts: policy.Opts{}.With("decay", decay)}
		one, chunked := run(512, cfg), run(128, cfg)
		t.Logf("decay %g: bytes %d in one step, %d in chunks of 128, %d uncompressed; evicted %d, %d", decay, one.KVBytes, chunked.KVBytes, full.KVBytes, one.EvictedTokens, chunked.EvictedTokens)
		if chunked.KVBytes != one.KVBytes || chunked.KVBytes >= full.KVBytes || chunked.EvictedTokens == 0 || chunked.EvictedTokens != one.EvictedTokens {
			t.Fatalf("decay %g: chunked prefill ends with %d bytes (%d evicted), one step %d, uncompressed %d", decay, chunked.KVBytes, chunked.EvictedTokens, one.KVBytes, full.KVBytes)
		}
	}
}

// TestEngineRefusesUnrunnablePolicy: a policy that could not run is an
// InvalidError at Submit, before any work, not a failure mid-request.
func TestEngineRefusesUnrunnablePolicy(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{})
	prompt := longPrompt(t, tok, 40)
	for _, c := range []struct {
		name string
		cfg  policy.Config
	}{
		{"h2o budget 1", policy.Config{Method: "h2o", Budget: 1}},
		{"tova budget 1", policy.Config{Method: "tova", Budget: 1}},
		{"window 1", policy.Config{Method: "window", Window: 1}},
		{"knorm budget = sinks, every step", policy.Config{Method: "knorm", Budget: 2, Sinks: 2, Every: 1}},
		{"adakv reindex", policy.Config{Method: "adakv", Budget: 40, Positions: policy.PosReindex}},
		{"minicache without a pair", policy.Config{Method: "minicache", Opts: policy.Opts{}.With("merge-from", 4)}},
		{"full with a window", policy.Config{Method: "full", Window: 8}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.Submit(GenRequest{Prompt: prompt, MaxTokens: 4, Policy: c.cfg})
			var ie *InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("Submit: %v, want an InvalidError", err)
			}
		})
	}
	checkFree(t, e)
}
