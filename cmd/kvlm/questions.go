package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/policy"
	"github.com/spf13/cobra"
)

// questionTexts are the questions kvlm questions asks about the document.
var questionTexts = []string{
	"\nQuestion: Who is in the story?\nAnswer:",
	"\nQuestion: Where does the story happen?\nAnswer:",
	"\nQuestion: What did they want?\nAnswer:",
	"\nQuestion: Who was sad, and why?\nAnswer:",
	"\nQuestion: What happened at the end?\nAnswer:",
	"\nQuestion: What did the little girl find?\nAnswer:",
	"\nQuestion: Who helped them?\nAnswer:",
	"\nQuestion: What is the story about?\nAnswer:",
}

// questionsJSON is what kvlm questions measures.
type questionsJSON struct {
	Model     string          `json:"model"`
	Policy    string          `json:"policy"`
	KV        string          `json:"kv"` // codecs of keys/values
	DocTokens int             `json:"doc_tokens"`
	Questions int             `json:"questions"`
	Gen       int             `json:"gen"`
	Reps      int             `json:"reps"`
	Modes     []questionsMode `json:"modes"`
}

// questionsMode is one way of serving the N questions: question 1, and
// questions 2…N (means over them; each question's TTFT the median over
// the reps, each on a fresh engine).
type questionsMode struct {
	Mode string `json:"mode"`
	// TTFT from submission to the first token, ms.
	TTFT1    float64 `json:"ttft_ms_q1"`
	TTFTRest float64 `json:"ttft_ms_rest"`
	// Prompt tokens the model ran.
	Computed1    float64 `json:"computed_q1"`
	ComputedRest float64 `json:"computed_rest"`
	// KV bytes the request held at most (its prompt before compression
	// included) and when it ended.
	Peak1    float64 `json:"kv_bytes_peak_q1"`
	PeakRest float64 `json:"kv_bytes_peak_rest"`
	End1     float64 `json:"kv_bytes_end_q1"`
	EndRest  float64 `json:"kv_bytes_end_rest"`
	// Bytes of compressed prefixes the engine caches at the end.
	CachedBytes int64 `json:"compressed_cached_bytes"`
}

func newQuestions() *cobra.Command {
	var f modelFlags
	var file string
	var docTokens, n, gen, reps int
	var asJSON bool
	c := &cobra.Command{
		Use:   "questions -m MODEL -f DOC --kv-policy P [policy flags]",
		Short: "Measure N questions about one document: compressed once (kv.prefix) against full-cache reuse and no reuse",
		Long: `Serve N questions about one document through the serving engine, each
prompt the document's first --doc-tokens tokens followed by a question, in
four ways, each on a fresh engine:

  no-reuse         no policy, no prefix cache: every question computes all
  full-reuse       no policy, the prefix cache: questions 2…N reuse the
                   document's blocks uncompressed
  policy           the policy on each whole prompt (nothing to reuse: each
                   prompt is compressed with its question)
  policy-prefix    the policy on the document alone (GenRequest.PrefixTokens,
                   the server's kv.prefix): compressed once, query-agnostic,
                   cached; questions 2…N compute only their question

and report, for question 1 and questions 2…N, the time to the first token,
the prompt tokens computed and the KV bytes held (at most, and at the end).
See docs/PREFIX.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pol, err := f.policyConfig()
			if err != nil {
				return err
			}
			switch {
			case pol.Method == "full":
				return errors.New("give a compression policy: --kv-policy NAME (and its parameters)")
			case file == "":
				return errors.New("no document given: use -f FILE")
			case n < 2 || n > len(questionTexts):
				return fmt.Errorf("--questions must be between 2 and %d, got %d", len(questionTexts), n)
			case docTokens < 1 || gen < 1 || reps < 1:
				return fmt.Errorf("--doc-tokens, --gen and --reps must be positive")
			}
			text, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			m, tok, err := f.load()
			if err != nil {
				return err
			}
			defer m.Close()
			ids := tok.Encode(string(text), true, false)
			if len(ids) < docTokens {
				return fmt.Errorf("%s holds %d tokens, fewer than --doc-tokens %d", file, len(ids), docTokens)
			}
			doc := ids[:docTokens]
			var prompts [][]int
			for _, q := range questionTexts[:n] {
				p := slices.Concat(doc, tok.Encode(q, false, false))
				if len(p)+gen > m.CtxLen {
					return fmt.Errorf("a prompt of %d tokens and %d generated go past the context of %d: lower --doc-tokens", len(p), gen, m.CtxLen)
				}
				prompts = append(prompts, p)
			}
			cfg := engine.Config{BlockTokens: f.kvBlock, K: f.kvType, V: f.kvType, PrefillChunk: f.chunk}
			if f.kvTypeK != "" {
				cfg.K = f.kvTypeK
			}
			if f.kvTypeV != "" {
				cfg.V = f.kvTypeV
			}
			if f.kvMem != "" {
				if cfg.KVMem, err = parseBytes(f.kvMem); err != nil {
					return fmt.Errorf("--kv-mem: %w", err)
				}
			}
			out := questionsJSON{Model: f.model, Policy: pol.String(), KV: cfg.K + "/" + cfg.V, DocTokens: docTokens, Questions: n, Gen: gen, Reps: reps}
			for _, mode := range []struct {
				name   string
				policy policy.Config
				cache  bool
				prefix bool
			}{
				{"no-reuse", policy.Config{Method: "full"}, false, false},
				{"full-reuse", policy.Config{Method: "full"}, true, false},
				{"policy", pol, true, false},
				{"policy-prefix", pol, true, true},
			} {
				res := questionsMode{Mode: mode.name}
				ttft := make([][]float64, n) // [question][rep]
				for range reps {
					e, err := engine.New(m, cfg)
					if err != nil {
						return err
					}
					for i, p := range prompts {
						r := engine.GenRequest{Prompt: p, MaxTokens: gen, Policy: mode.policy, NoPrefixCache: !mode.cache}
						if mode.prefix {
							r.PrefixTokens = docTokens
						}
						d, u, err := timeRequest(e, r)
						if err != nil {
							e.Close()
							return fmt.Errorf("%s, question %d: %w", mode.name, i+1, err)
						}
						ttft[i] = append(ttft[i], ms(d))
						w := 1.0 / float64(reps)
						if i > 0 {
							w /= float64(n - 1)
						}
						add := func(a, b *float64) {
							if i == 0 {
								*a += w * float64(u.ComputedTokens)
							} else {
								*b += w * float64(u.ComputedTokens)
							}
						}
						add(&res.Computed1, &res.ComputedRest)
						if i == 0 {
							res.Peak1 += w * float64(u.KVBytesPeak)
							res.End1 += w * float64(u.KVBytes)
						} else {
							res.PeakRest += w * float64(u.KVBytesPeak)
							res.EndRest += w * float64(u.KVBytes)
						}
					}
					res.CachedBytes = e.Stats().CompressedBytes
					e.Close()
				}
				res.TTFT1 = median(ttft[0])
				for _, t := range ttft[1:] {
					res.TTFTRest += median(t) / float64(n-1)
				}
				out.Modes = append(out.Modes, res)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), out)
			}
			printQuestions(cmd.OutOrStdout(), out)
			return nil
		},
	}
	f.register(c)
	f.registerPolicy(c)
	c.Flags().StringVarP(&file, "file", "f", "", "the document: a text file (its first --doc-tokens tokens)")
	c.Flags().IntVar(&docTokens, "doc-tokens", 400, "tokens of the document (BOS included)")
	c.Flags().IntVar(&n, "questions", 8, fmt.Sprintf("questions asked (2 to %d)", len(questionTexts)))
	c.Flags().IntVar(&gen, "gen", 16, "tokens generated per question")
	c.Flags().IntVar(&reps, "reps", 3, "runs of each mode (fresh engines); a question's TTFT is the median")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// timeRequest runs r to its end and returns the time to its first token
// and its usage.
func timeRequest(e *engine.Engine, r engine.GenRequest) (time.Duration, engine.Usage, error) {
	start := time.Now()
	h, err := e.Submit(r)
	if err != nil {
		return 0, engine.Usage{}, err
	}
	var first time.Duration
	for {
		ev, err := h.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, engine.Usage{}, err
		}
		if ev.Done && ev.Finish == engine.FinishError {
			return 0, engine.Usage{}, ev.Err
		}
		if !ev.Done && first == 0 {
			first = time.Since(start)
		}
	}
	return first, h.Usage(), nil
}

func printQuestions(w io.Writer, q questionsJSON) {
	fmt.Fprintf(w, "%s, %d-token document, %d questions, %s, KV %s, %d generated, median of %d runs\n",
		q.Model, q.DocTokens, q.Questions, q.Policy, q.KV, q.Gen, q.Reps)
	fmt.Fprintf(w, "%-14s %10s %10s %10s %10s %12s %12s %12s %12s %12s\n", "mode", "TTFT q1", "TTFT q2+", "comp q1", "comp q2+", "KV peak q1", "KV peak q2+", "KV end q1", "KV end q2+", "cached")
	for _, m := range q.Modes {
		fmt.Fprintf(w, "%-14s %8.2fms %8.2fms %10.0f %10.1f %12.0f %12.0f %12.0f %12.0f %12d\n", m.Mode, m.TTFT1, m.TTFTRest,
			m.Computed1, m.ComputedRest, m.Peak1, m.PeakRest, m.End1, m.EndRest, m.CachedBytes)
	}
}
