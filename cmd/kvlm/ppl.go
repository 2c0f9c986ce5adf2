package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/kvlm/kvlm/eval"
	"github.com/spf13/cobra"
)

func newPPL() *cobra.Command {
	var mf modelFlags
	var file string
	var ctx, maxBytes int
	var asJSON bool
	c := &cobra.Command{
		Use:   "ppl -m MODEL -f FILE --ctx N",
		Short: "Perplexity of a text: encode with BOS, feed the first N tokens, score the N-1 predictions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("no text given: use -f FILE")
			}
			if ctx < 2 {
				return fmt.Errorf("--ctx must be at least 2, got %d", ctx)
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
			if ctx > m.CtxLen {
				return fmt.Errorf("--ctx %d is longer than the model's context length %d", ctx, m.CtxLen)
			}
			ids := tok.Encode(string(data), tok.BOS() >= 0, false)
			if len(ids) < ctx {
				return fmt.Errorf("%s encodes to %d tokens, fewer than --ctx %d", file, len(ids), ctx)
			}
			seq, err := mf.sequence(m)
			if err != nil {
				return err
			}
			r, err := eval.Perplexity(seq, ids[:ctx])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), r)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tokens %d  predictions %d  mean NLL %.6f nats  perplexity %.4f\n", r.Tokens, r.Predictions, r.MeanNLL, r.PPL)
			return nil
		},
	}
	mf.register(c)
	c.Flags().StringVarP(&file, "file", "f", "", "text file")
	c.Flags().IntVar(&ctx, "ctx", 512, "tokens to feed (BOS included)")
	c.Flags().IntVar(&maxBytes, "bytes", 0, "use only the first N bytes of the file (0 = all)")
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return c
}
