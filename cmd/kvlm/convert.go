package main

import (
	"errors"
	"fmt"

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
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d tensors, matrices in %s\n", out, rep.Tensors, t)
			for _, f := range rep.Fallbacks {
				fmt.Fprintf(cmd.ErrOrStderr(), "note: %s rows do not fit %s blocks; written as F16\n", f, t)
			}
			return nil
		},
	}
	l2c.Flags().StringVar(&modelPath, "model", "", "llama2.c checkpoint")
	l2c.Flags().StringVar(&tokPath, "tokenizer", "", "llama2.c tokenizer.bin")
	l2c.Flags().StringVarP(&out, "out", "o", "", "output GGUF file")
	l2c.Flags().StringVar(&typ, "type", "F32", "type of the weight matrices: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K")
	l2c.Flags().StringVar(&name, "name", "", "general.name (default: the checkpoint's base name)")
	c.AddCommand(l2c)
	return c
}
