package kvcalc

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/model"
)

// FromFile reads a model's shape and weight size from a GGUF file or, when
// the file lacks the GGUF magic, a llama2.c checkpoint.
func FromFile(path string) (Model, error) {
	isGGUF, err := hasGGUFMagic(path)
	if err != nil {
		return Model{}, err
	}
	if isGGUF {
		return FromGGUF(path)
	}
	m, err := FromLlama2C(path)
	if err != nil {
		return Model{}, fmt.Errorf("not a GGUF file (no GGUF magic) and not a llama2.c checkpoint: %w", err)
	}
	return m, nil
}

// FromGGUF reads the shape with model.ConfigFromGGUF; the stored weights are
// the sum of the tensors' sizes and the parameters the sum of their element
// counts.
func FromGGUF(path string) (Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return Model{}, err
	}
	defer f.Close()
	cfg, err := model.ConfigFromGGUF(f)
	if err != nil {
		return Model{}, fmt.Errorf("%s: %w", path, err)
	}
	m := fromConfig(path, cfg)
	for i := range f.Tensors {
		m.StoredBytes += int64(f.Tensors[i].Size)
		m.Params += int64(f.Tensors[i].Elements())
	}
	return m, nil
}

// FromLlama2C reads a llama2.c checkpoint (all weights f32).
func FromLlama2C(path string) (Model, error) {
	lm, err := model.LoadLlama2C(path)
	if err != nil {
		return Model{}, err
	}
	defer lm.Close()
	m := fromConfig(path, lm.Config)
	m.StoredBytes = lm.WeightsBytes()
	m.Params = m.StoredBytes / 4
	return m, nil
}

// FromConfig is the shape of a model's config, its KV source map and
// windows included; name is its file.
func FromConfig(name string, c model.Config) Model { return fromConfig(name, c) }

func fromConfig(path string, c model.Config) Model {
	return Model{
		Name: filepath.Base(path), Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, Context: c.CtxLen, Dim: c.Dim, HiddenDim: c.HiddenDim, Vocab: c.Vocab,
		Source: path, KVSource: c.KVSource, LayerWindows: c.LayerWindows, SlidingWindow: c.SlidingWindow,
	}
}

func hasGGUFMagic(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return false, fmt.Errorf("%s: too short to be a model file", path)
	}
	return bytes.Equal(magic[:], []byte("GGUF")), nil
}
