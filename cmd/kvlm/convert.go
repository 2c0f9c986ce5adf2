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
	c.AddCommand(l2c)
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
