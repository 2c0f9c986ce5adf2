package engine

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tokenizer"
)

// Load opens a model and its tokenizer. path is a GGUF file (whose metadata
// holds the vocabulary; tokPath may override it), read into memory, or a
// llama2.c checkpoint (tokPath, a llama2.c tokenizer.bin, is then required).
func Load(path, tokPath string) (*model.Model, tokenizer.Tokenizer, error) {
	return load(path, tokPath, model.LoadGGUF)
}

// LoadMapped is Load with a GGUF file memory-mapped (model.MapGGUF).
func LoadMapped(path, tokPath string) (*model.Model, tokenizer.Tokenizer, error) {
	return load(path, tokPath, model.MapGGUF)
}

func load(path, tokPath string, loadGGUF func(string) (*model.Model, tokenizer.Tokenizer, error)) (*model.Model, tokenizer.Tokenizer, error) {
	gguf, err := IsGGUF(path)
	if err != nil {
		return nil, nil, err
	}
	var m *model.Model
	var tok tokenizer.Tokenizer
	if gguf {
		m, tok, err = loadGGUF(path)
		if err != nil {
			return nil, nil, err
		}
	} else {
		if m, err = model.LoadLlama2C(path); err != nil {
			return nil, nil, fmt.Errorf("not a GGUF file (no GGUF magic) and not a llama2.c checkpoint: %w", err)
		}
		if tokPath == "" {
			m.Close()
			return nil, nil, fmt.Errorf("%s is a llama2.c checkpoint: give its tokenizer with --tokenizer", path)
		}
	}
	if tokPath != "" {
		sp, err := tokenizer.LoadLlama2C(tokPath, 0)
		if err != nil {
			m.Close()
			return nil, nil, err
		}
		tok = sp
	}
	if tok.VocabSize() != m.Vocab {
		m.Close()
		return nil, nil, fmt.Errorf("tokenizer has %d tokens, model has %d", tok.VocabSize(), m.Vocab)
	}
	return m, tok, nil
}

// IsGGUF reports whether the file at path starts with the GGUF magic.
func IsGGUF(path string) (bool, error) {
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
