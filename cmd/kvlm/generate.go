package main

import (
	"errors"
	"fmt"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/sample"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
)

type generateJSON struct {
	Prompt       string  `json:"prompt"`
	Text         string  `json:"text"`
	PromptTokens []int   `json:"prompt_tokens"`
	Tokens       []int   `json:"tokens"`
	Stop         string  `json:"stop"`
	PrefillMS    float64 `json:"prefill_ms"`
	DecodeMS     float64 `json:"decode_ms"`
	PrefillTokS  float64 `json:"prefill_tok_s"`
	DecodeTokS   float64 `json:"decode_tok_s"`
	KVBytes      int64   `json:"kv_bytes"`
	KVBytesPeak  int64   `json:"kv_bytes_peak"`
	KeptPerLayer []int   `json:"kept_per_layer,omitempty"`
	Seed         uint64  `json:"seed"`
}

func newGenerate() *cobra.Command {
	var mf modelFlags
	var prompt string
	var n int
	var p sample.Params
	var asJSON bool
	c := &cobra.Command{
		Use:   "generate -m MODEL -p TEXT -n N",
		Short: "Generate text from a prompt, printing each token as it comes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("prompt") {
				return errors.New("no prompt: give text with -p (-p \"\" starts from BOS alone)")
			}
			if n <= 0 {
				return fmt.Errorf("-n must be at least 1, got %d", n)
			}
			if !cmd.Flags().Changed("seed") {
				p.Seed = sample.RandomSeed()
			}
			sampler, err := sample.New(p)
			if err != nil {
				return err
			}
			m, tok, err := mf.load()
			if err != nil {
				return err
			}
			defer m.Close()
			ids := tok.Encode(prompt, tokenizer.AddsBOS(tok), false)
			if len(ids) == 0 {
				return errors.New("empty prompt: this model's tokenizer adds no BOS, so give text with -p")
			}
			if len(ids) > m.CtxLen {
				return fmt.Errorf("prompt is %d tokens, longer than the context length %d", len(ids), m.CtxLen)
			}
			if len(ids) == m.CtxLen {
				return fmt.Errorf("prompt is %d tokens and fills the context length %d: no room to generate", len(ids), m.CtxLen)
			}
			seq, err := mf.sequence(m)
			if err != nil {
				return err
			}
			defer seq.Close()
			pol, err := mf.attachPolicy(seq)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			promptText := tok.DecodeAll(ids)
			if !asJSON {
				fmt.Fprint(out, promptText)
			}
			prev := ids[len(ids)-1]
			var text []byte
			res, err := engine.Generate(seq, engine.Request{
				Prompt: ids, MaxTokens: n, EOS: tok.EOS(), Sampler: sampler, Policy: pol,
				OnToken: func(id int) error {
					piece := tok.Decode(prev, id)
					prev = id
					text = append(text, piece...)
					if !asJSON {
						_, err := fmt.Fprint(out, piece)
						return err
					}
					return nil
				},
			})
			if err != nil {
				return err
			}
			if res.Stop == engine.StopContext {
				fmt.Fprintf(cmd.ErrOrStderr(), "kvlm: stopped after %d tokens: the context length %d is reached\n", len(res.Tokens), m.CtxLen)
			}
			if asJSON {
				return writeJSON(out, generateJSON{
					Prompt: promptText, Text: string(text), PromptTokens: ids, Tokens: nonNil(res.Tokens), Stop: string(res.Stop),
					PrefillMS: ms(res.PrefillTime), DecodeMS: ms(res.DecodeTime),
					PrefillTokS: res.PrefillTokS(), DecodeTokS: res.DecodeTokS(), KVBytes: seq.Cache().Bytes(),
					KVBytesPeak: res.PeakKVBytes, KeptPerLayer: keptPerLayer(pol), Seed: p.Seed,
				})
			}
			fmt.Fprintln(out)
			seed := ""
			if p.Temperature > 0 {
				seed = fmt.Sprintf(", seed %d", p.Seed)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "prefill %d tokens %.1f tok/s, decode %d tokens %.1f tok/s, stop: %s%s\n",
				res.PromptN, res.PrefillTokS(), len(res.Tokens), res.DecodeTokS(), res.Stop, seed)
			return nil
		},
	}
	mf.register(c)
	mf.registerLCKV(c)
	mf.registerPolicy(c)
	f := c.Flags()
	f.StringVarP(&prompt, "prompt", "p", "", `prompt text ("" = start from BOS alone, as run.c without -i)`)
	f.IntVarP(&n, "n", "n", 128, "new tokens to generate")
	f.Float32Var(&p.Temperature, "temp", 0.8, "temperature (0 = greedy)")
	f.IntVar(&p.TopK, "top-k", 0, "keep the k most likely tokens (0 = off)")
	f.Float32Var(&p.TopP, "top-p", 0.9, "nucleus sampling threshold (1 = off)")
	f.Float32Var(&p.MinP, "min-p", 0, "drop tokens below min-p × the top probability (0 = off)")
	f.Float32Var(&p.RepeatPenalty, "repeat-penalty", 1, "repetition penalty (1 = off)")
	f.IntVar(&p.RepeatLastN, "repeat-last-n", sample.DefaultRepeatLastN, "tokens the penalty looks back over")
	f.Uint64Var(&p.Seed, "seed", 0, "random seed (default: a fresh one each run, printed on stderr and in --json)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of streaming text")
	return c
}

func nonNil(x []int) []int {
	if x == nil {
		return []int{}
	}
	return x
}

func keptPerLayer(p *policy.State) []int {
	if p == nil {
		return nil
	}
	return p.KeptPerLayer()
}
