package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

type benchJSON struct {
	Model           string  `json:"model"`
	PromptTokens    int     `json:"prompt_tokens"`
	GenTokens       int     `json:"gen_tokens"`
	Reps            int     `json:"reps"`
	Threads         int     `json:"threads"`
	PrefillTokS     float64 `json:"prefill_tok_s"`
	DecodeTokS      float64 `json:"decode_tok_s"`
	WeightsBytes    int64   `json:"weights_bytes"`
	KVBytesPerToken int64   `json:"kv_bytes_per_token"`
	PeakRSSBytes    int64   `json:"peak_rss_bytes"`
}

func newBench() *cobra.Command {
	var mf modelFlags
	var promptN, genN, reps int
	var asJSON bool
	c := &cobra.Command{
		Use:   "bench -m MODEL --prompt N --gen N",
		Short: "Measure prefill and decode speed (median of --reps runs) and peak memory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if promptN < 1 || genN < 1 || reps < 1 {
				return fmt.Errorf("--prompt, --gen and --reps must be at least 1")
			}
			m, _, err := mf.load()
			if err != nil {
				return err
			}
			defer m.Close()
			if promptN+genN > m.CtxLen {
				return fmt.Errorf("--prompt %d + --gen %d exceed the context length %d", promptN, genN, m.CtxLen)
			}
			// A fixed pseudo-random prompt: speed does not depend on the text.
			rng := rand.New(rand.NewPCG(1, 2))
			prompt := make([]int, promptN)
			for i := range prompt {
				prompt[i] = rng.IntN(m.Vocab)
			}
			var pre, dec []float64
			for r := 0; r < reps; r++ {
				seq, err := mf.sequence(m)
				if err != nil {
					return err
				}
				t0 := time.Now()
				logits, err := seq.Forward(prompt, false)
				if err != nil {
					return err
				}
				t1 := time.Now()
				for i := 0; i < genN; i++ {
					next := 0
					for j, v := range logits {
						if v > logits[next] {
							next = j
						}
					}
					if logits, err = seq.Forward([]int{next}, false); err != nil {
						return err
					}
				}
				t2 := time.Now()
				pre = append(pre, float64(promptN)/t1.Sub(t0).Seconds())
				dec = append(dec, float64(genN)/t2.Sub(t1).Seconds())
			}
			res := benchJSON{
				Model: mf.model, PromptTokens: promptN, GenTokens: genN, Reps: reps, Threads: threads(),
				PrefillTokS: median(pre), DecodeTokS: median(dec), WeightsBytes: m.WeightsBytes(),
				KVBytesPerToken: m.KVBytesPerToken(), PeakRSSBytes: peakRSS(),
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "model            %s\n", res.Model)
			fmt.Fprintf(w, "weights          %s\n", human(res.WeightsBytes))
			fmt.Fprintf(w, "KV per token     %d B (f32)\n", res.KVBytesPerToken)
			fmt.Fprintf(w, "threads          %d\n", res.Threads)
			fmt.Fprintf(w, "prefill          %.1f tok/s  (%d tokens, median of %d)\n", res.PrefillTokS, promptN, reps)
			fmt.Fprintf(w, "decode           %.1f tok/s  (%d tokens, median of %d)\n", res.DecodeTokS, genN, reps)
			fmt.Fprintf(w, "peak RSS         %s\n", human(res.PeakRSSBytes))
			return nil
		},
	}
	mf.register(c)
	c.Flags().IntVar(&promptN, "prompt", 128, "prompt tokens")
	c.Flags().IntVar(&genN, "gen", 64, "generated tokens")
	c.Flags().IntVar(&reps, "reps", 3, "repetitions (the median is reported)")
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return c
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

func peakRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Maxrss * 1024 // KiB on Linux
}

func human(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}
