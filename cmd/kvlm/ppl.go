package main

import (
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
)

type pplJSON struct {
	eval.PPLResult
	Mode         string      `json:"mode"`                    // "full", "compress-after" or "stream"
	Policy       string      `json:"policy"`                  // the --kv-policy configuration
	KVBytesPeak  int64       `json:"kv_bytes_peak"`           // the most KV memory held
	KeptPerLayer []int       `json:"kept_per_layer"`          // tokens each layer holds at the end, over its heads
	Kept         [][][]int32 `json:"kept,omitempty"`          // after --compress-after: per layer, per KV head, sorted original positions
	NLLByWindow  []float64   `json:"nll_by_window,omitempty"` // --stream: mean NLL of each --report-every predictions
	Argmax       []int       `json:"argmax,omitempty"`        // --stream: [predictions] the most likely token after each prefix of the text (teacher-forced)
	Greedy       []int       `json:"greedy,omitempty"`        // --greedy N: the N greedy tokens after the whole text
	KVType       string      `json:"kv_type"`                 // codecs of the keys and values, "K/V"
	KeyShift     bool        `json:"kv_key_shift"`            // keys stored around the model's mean keys
}

func newPPL() *cobra.Command {
	var mf modelFlags
	var file string
	var ctx, maxBytes, compressAfter, reportEvery, greedy int
	var stream, asJSON bool
	c := &cobra.Command{
		Use:   "ppl -m MODEL -f FILE [--ctx N]",
		Short: "Perplexity of a text: encode with BOS, feed the first N tokens, score the N-1 predictions",
		Long: `Perplexity of a text: encode with BOS, feed the first --ctx tokens, score the predictions.

With a --kv-policy:
  --compress-after N   prefill N tokens, compress the cache once, then score the rest
                       (the predictions of tokens N+1..ctx-1, made after compression)
  --stream             feed the tokens one by one with the cache bounded by the policy:
                       the whole file, or its first --ctx tokens; --ctx may exceed the
                       model's context (with --kv-policy full, dense attention runs past
                       the trained positions); --json carries the argmax of every
                       prediction, and --greedy N goes on after the text with N greedy
                       tokens, fed the same way (what a server request with the same
                       prompt and policy generates at temperature 0)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("no text given: use -f FILE")
			}
			ctxGiven := cmd.Flags().Changed("ctx")
			if ctx < 2 {
				return fmt.Errorf("--ctx must be at least 2, got %d", ctx)
			}
			if stream && compressAfter > 0 {
				return errors.New("--stream and --compress-after are different experiments: give one")
			}
			if greedy < 0 {
				return fmt.Errorf("--greedy must be 0 or more, got %d", greedy)
			}
			if greedy > 0 && !stream {
				return errors.New("--greedy continues a streamed run: give --stream")
			}
			if reportEvery < 1 {
				return fmt.Errorf("--report-every must be positive")
			}
			pc, err := mf.policyConfig()
			if err != nil {
				return err
			}
			if compressAfter > 0 && pc.Method == "full" {
				return errors.New("--compress-after compresses the cache with the policy: give a --kv-policy other than full")
			}
			if streamed := compressAfter == 0 && (stream || pc.Method != "full"); cmd.Flags().Changed("report-every") && !streamed {
				return errors.New("--report-every reports a streamed run: give --stream (or a --kv-policy without --compress-after)")
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if maxBytes > 0 && len(data) > maxBytes {
				data = data[:maxBytes]
			}
			m, tok, err := mf.load()
			if err != nil {
				return err
			}
			defer m.Close()
			if ctx > m.CtxLen && !stream {
				return fmt.Errorf("--ctx %d is longer than the model's context length %d (use --stream to go past it)", ctx, m.CtxLen)
			}
			if compressAfter < 0 || (compressAfter > 0 && compressAfter >= ctx-1) {
				return fmt.Errorf("--compress-after %d must leave tokens to score before --ctx %d", compressAfter, ctx)
			}
			ids := tok.Encode(string(data), tokenizer.AddsBOS(tok), false)
			if stream && (!ctxGiven || ctx > len(ids)) {
				ctx = len(ids) // the whole text
			}
			if len(ids) < 2 {
				return fmt.Errorf("%s encodes to %d tokens: nothing to predict", file, len(ids))
			}
			if len(ids) < ctx {
				return fmt.Errorf("%s encodes to %d tokens, fewer than --ctx %d", file, len(ids), ctx)
			}
			ids = ids[:ctx]
			opt, err := mf.kvOptions()
			if err != nil {
				return err
			}
			if opt, err = mf.withKeyShift(m, opt); err != nil {
				return err
			}
			if stream && pc.Method == "full" && opt.MemBytes == 0 {
				opt.Tokens = max(ctx, m.CtxLen) // dense: room for every token
			}
			seq, err := m.NewStandaloneSequence(opt)
			if err != nil {
				return err
			}
			defer seq.Close()
			seq.Chunk = mf.chunk
			pol, err := mf.attachPolicy(seq)
			if err != nil {
				return err
			}
			out := pplJSON{Mode: "full", Policy: pc.String(), KVType: kvTypeName(opt), KeyShift: opt.KeyShift != nil}
			switch {
			case compressAfter > 0:
				out.Mode = "compress-after"
				var r eval.CompressResult
				r, err = eval.CompressAfter(seq, pol, ids, compressAfter)
				out.PPLResult, out.KVBytesPeak, out.Kept = r.PPLResult, r.KVBytesPeak, r.Kept
			case stream || pol != nil:
				out.Mode = "stream"
				if pc.Method == "full" {
					seq.MaxPos = math.MaxInt32 // dense attention runs past the trained positions
				}
				var r eval.StreamResult
				r, err = eval.Stream(seq, pol, ids, reportEvery)
				out.PPLResult, out.KVBytesPeak, out.NLLByWindow, out.Argmax = r.PPLResult, r.KVBytesPeak, r.NLLByWindow, r.Argmax
				if err == nil && greedy > 0 {
					out.Greedy, err = eval.StreamGreedy(seq, ids, greedy)
					out.KVBytesPeak = max(out.KVBytesPeak, seq.Cache().Bytes())
				}
			default:
				out.PPLResult, err = eval.Perplexity(seq, ids)
				out.KVBytesPeak = seq.Cache().Bytes()
			}
			if err != nil {
				return err
			}
			if pol != nil {
				out.KeptPerLayer = pol.KeptPerLayer()
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), out)
			}
			w := cmd.OutOrStdout()
			shift := ""
			if out.KeyShift {
				shift = ", key shift"
			}
			fmt.Fprintf(w, "tokens %d  predictions %d  mean NLL %.6f nats  perplexity %.4f  (%s, %s, kv %s%s, peak KV %s)\n",
				out.Tokens, out.Predictions, out.MeanNLL, out.PPL, out.Mode, out.Policy, out.KVType, shift, human(out.KVBytesPeak))
			if greedy > 0 {
				text, prev := "", ids[len(ids)-1]
				for _, t := range out.Greedy {
					text, prev = text+tok.Decode(prev, t), t
				}
				fmt.Fprintf(w, "greedy %v %q\n", out.Greedy, text)
			}
			for i, v := range out.NLLByWindow {
				fmt.Fprintf(w, "  predictions %6d-%6d  mean NLL %.4f\n", i*reportEvery+1, min((i+1)*reportEvery, out.Predictions), v)
			}
			return nil
		},
	}
	mf.register(c)
	mf.registerLCKV(c)
	mf.registerPolicy(c)
	c.Flags().StringVarP(&file, "file", "f", "", "text file")
	c.Flags().IntVar(&ctx, "ctx", 512, "tokens to feed (BOS included); --stream: default the whole file, and more than the file means all of it")
	c.Flags().IntVar(&maxBytes, "bytes", 0, "use only the first N bytes of the file (0 = all)")
	c.Flags().IntVar(&compressAfter, "compress-after", 0, "prefill N tokens, compress the cache, then score the rest")
	c.Flags().BoolVar(&stream, "stream", false, "feed tokens one by one with the cache bounded by the policy")
	c.Flags().IntVar(&reportEvery, "report-every", 1000, "--stream: report the mean NLL of each run of this many predictions")
	c.Flags().IntVar(&greedy, "greedy", 0, "--stream: go on after the text with N greedy tokens and print them")
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return c
}

// kvTypeName names the codecs of opt as "K/V" (f32 when unset).
func kvTypeName(opt model.KVOptions) string {
	k, v := "f32", "f32"
	if opt.K != nil {
		k = opt.K.Name()
	}
	if opt.V != nil {
		v = opt.V.Name()
	}
	return k + "/" + v
}
