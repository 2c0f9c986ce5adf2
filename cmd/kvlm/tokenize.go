package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
)

func newTokenize() *cobra.Command {
	var modelPath, tokPath string
	var asJSON, bos, eos, noSpecial bool
	c := &cobra.Command{
		Use:   "tokenize [-m MODEL] [--tokenizer T] TEXT",
		Short: "Print the token ids of a text (TEXT \"-\" reads standard input)",
		Long: "Print the token ids of TEXT under a model's vocabulary (a GGUF's, or a llama2.c tokenizer.bin given\n" +
			"with --tokenizer). The text of special tokens such as <|begin_of_text|> becomes those tokens unless\n" +
			"--no-special. BOS is added only with --bos.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			text := args[0]
			if text == "-" {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return err
				}
				text = string(b)
			}
			tok, err := loadTokenizer(modelPath, tokPath)
			if err != nil {
				return err
			}
			var ids []int
			switch t := tok.(type) {
			case *tokenizer.BPE:
				ids = t.EncodeSpecial(text, bos, eos, !noSpecial)
			default:
				if noSpecial {
					ids = tok.Encode(text, bos, eos)
				} else {
					ids = tokenizer.EncodeSpecial(tok, text, bos, eos)
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if ids == nil {
					ids = []int{}
				}
				b, err := json.Marshal(struct {
					IDs []int `json:"ids"`
				}{ids})
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(out, "%s\n", b)
				return err
			}
			s := make([]string, len(ids))
			for i, id := range ids {
				s[i] = fmt.Sprint(id)
			}
			_, err = fmt.Fprintln(out, strings.Join(s, " "))
			return err
		},
	}
	c.Flags().StringVarP(&modelPath, "model", "m", "", "model file (GGUF), or its name in the model directory")
	c.Flags().StringVar(&tokPath, "tokenizer", "", "tokenizer: a llama2.c tokenizer.bin or a GGUF (overrides the model's)")
	c.Flags().BoolVar(&asJSON, "json", false, `print {"ids":[...]}`)
	c.Flags().BoolVar(&bos, "bos", false, "add BOS first")
	c.Flags().BoolVar(&eos, "eos", false, "add EOS last")
	c.Flags().BoolVar(&noSpecial, "no-special", false, "encode the text of special tokens as plain text")
	return c
}

// loadTokenizer reads only the vocabulary: from tokPath (a GGUF or a
// llama2.c tokenizer.bin) if given, else from the GGUF model.
func loadTokenizer(modelPath, tokPath string) (tokenizer.Tokenizer, error) {
	path := tokPath
	if path == "" {
		if modelPath == "" {
			return nil, errors.New("no model given: use -m MODEL or --tokenizer T")
		}
		p, err := resolveModel(modelPath)
		if err != nil {
			return nil, err
		}
		path = p
	}
	isGGUF, err := engine.IsGGUF(path)
	if err != nil {
		return nil, err
	}
	if !isGGUF {
		if tokPath == "" {
			return nil, fmt.Errorf("%s is not a GGUF file: give a llama2.c checkpoint's tokenizer with --tokenizer", path)
		}
		return tokenizer.LoadLlama2C(path, 0)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tok, err := model.TokenizerFromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return tok, nil
}
