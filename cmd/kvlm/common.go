package main

import (
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
)

// modelFlags are the flags every command that loads a model takes.
type modelFlags struct {
	model     string
	tokenizer string
	chunk     int
}

func (f *modelFlags) register(c *cobra.Command) {
	c.Flags().StringVarP(&f.model, "model", "m", "", "model file: GGUF, or a llama2.c checkpoint (then --tokenizer)")
	c.Flags().StringVar(&f.tokenizer, "tokenizer", "", "llama2.c tokenizer.bin (required for llama2.c checkpoints, overrides a GGUF's)")
	c.Flags().IntVar(&f.chunk, "chunk", model.DefaultChunk, "prefill chunk: prompt tokens run as one matrix")
}

func (f *modelFlags) load() (*model.Model, tokenizer.Tokenizer, error) {
	if f.model == "" {
		return nil, nil, errors.New("no model given: use -m MODEL")
	}
	if f.chunk <= 0 {
		return nil, nil, errors.New("--chunk must be positive")
	}
	return engine.Load(f.model, f.tokenizer)
}

func (f *modelFlags) sequence(m *model.Model) (*model.Sequence, error) {
	seq, err := m.NewContiguousSequence()
	if err != nil {
		return nil, err
	}
	seq.Chunk = f.chunk
	return seq, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
