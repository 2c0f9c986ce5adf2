package main

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/kvlm/kvlm/convert"
	"github.com/kvlm/kvlm/tensor"
	"github.com/spf13/cobra"
)

func newConvert() *cobra.Command {
	c := &cobra.Command{
		Use:   "convert",
		Short: "Convert model files to GGUF",
	}
	var modelPath, tokPath, out, typ, name string
	l2c := &cobra.Command{
		Use:   "llama2c --model X.bin --tokenizer T.bin -o X.gguf",
		Short: "Convert a llama2.c checkpoint and tokenizer into a llama GGUF",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if modelPath == "" || tokPath == "" || out == "" {
				return errors.New("convert llama2c needs --model, --tokenizer and -o")
			}
			t, err := tensor.ParseDType(typ)
			if err != nil {
				return err
			}
			rep, err := convert.Llama2C(modelPath, tokPath, out, convert.Options{Type: t, Name: name})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d tensors: %s; file type %s\n", out, rep.Tensors, typeCounts(rep.Types), rep.FileType)
			if n := len(rep.Fallbacks); n > 0 {
				if rep.Types[t] == 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: no matrix has rows that fit %s's %d-value blocks: every matrix is written as F16\n", t, t.BlockSize())
				} else {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: %d matrices have rows that do not fit %s's %d-value blocks and are written as F16: %s\n",
						n, t, t.BlockSize(), strings.Join(rep.Fallbacks, ", "))
				}
			}
			return nil
		},
	}
	l2c.Flags().StringVar(&modelPath, "model", "", "llama2.c checkpoint")
	l2c.Flags().StringVar(&tokPath, "tokenizer", "", "llama2.c tokenizer.bin")
	l2c.Flags().StringVarP(&out, "out", "o", "", "output GGUF file")
	l2c.Flags().StringVar(&typ, "type", "F32", "type of the weight matrices: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS")
	l2c.Flags().StringVar(&name, "name", "", "general.name (default: the checkpoint's base name)")
	c.AddCommand(l2c, newConvertKVHeads())
	return c
}

// newConvertKVHeads is convert kv-heads: MHA → GQA/MQA by mean-pooling the
// K and V heads of each group (convert.KVHeads).
func newConvertKVHeads() *cobra.Command {
	var tokPath, out string
	var n int
	c := &cobra.Command{
		Use:   "kv-heads MODEL --kv-heads N -o OUT.gguf",
		Short: "Convert a model to N KV heads (MHA → GQA/MQA) by mean-pooling the K and V heads of each group",
		Long: `Convert a model to N KV heads (GQA, arXiv 2305.13245): new KV head g is the mean
of the old heads g·H/N … (g+1)·H/N − 1 in the K and V projections (weights and
biases); query heads, the output projection, every other tensor and the metadata
are kept, and head_count_kv becomes N. Quantized K/V weights are dequantized,
averaged and quantized back to their type. MODEL is anything -m takes: a GGUF
file, or a llama2.c checkpoint (then --tokenizer; its GGUF is F32). N must
divide the model's KV heads. The pooled model is not uptrained: see
docs/CONVERT.md for what it costs.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("kv-heads") {
				return errors.New("convert kv-heads needs --kv-heads N")
			}
			if out == "" {
				return errors.New("convert kv-heads needs -o OUT.gguf")
			}
			in, err := resolveModel(args[0])
			if err != nil {
				return err
			}
			rep, err := convert.KVHeadsFile(in, tokPath, out, n)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if rep.From == rep.To {
				fmt.Fprintf(w, "wrote %s: %d KV heads already: nothing pooled, %d tensors copied\n", out, rep.From, rep.Copied)
				return nil
			}
			fmt.Fprintf(w, "wrote %s: %d → %d KV heads (%d query heads each), %d tensors pooled (%s), %d copied\n",
				out, rep.From, rep.To, rep.Heads/rep.To, len(rep.Pooled), typeCounts(rep.Types), rep.Copied)
			return nil
		},
	}
	c.Flags().IntVar(&n, "kv-heads", 0, "KV heads of the converted model (a divisor of the model's; 1: MQA)")
	c.Flags().StringVar(&tokPath, "tokenizer", "", "llama2.c tokenizer.bin (required for llama2.c checkpoints)")
	c.Flags().StringVarP(&out, "out", "o", "", "output GGUF file")
	return c
}

// typeCounts lists how many tensors each type has, most first: "35 F16, 11 F32".
func typeCounts(types map[tensor.DType]int) string {
	ts := make([]tensor.DType, 0, len(types))
	for t := range types {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool {
		if types[ts[i]] != types[ts[j]] {
			return types[ts[i]] > types[ts[j]]
		}
		return ts[i].String() < ts[j].String()
	})
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = fmt.Sprintf("%d %s", types[t], t)
	}
	return strings.Join(parts, ", ")
}
