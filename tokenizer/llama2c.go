package tokenizer

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strings"
)

// llama2.c tokenizer.bin fixed ids.
const (
	llama2CUnk = 0
	llama2CBOS = 1
	llama2CEOS = 2
)

// LoadLlama2C reads a llama2.c tokenizer.bin file; see ParseLlama2C.
func LoadLlama2C(path string, vocabSize int) (*SentencePiece, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := ParseLlama2C(data, vocabSize)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %s", path, strings.TrimPrefix(err.Error(), "tokenizer: "))
	}
	return t, nil
}

// ParseLlama2C parses the llama2.c tokenizer.bin format (little-endian):
// int32 max_token_length, then vocabSize records {float32 score, int32 len,
// len bytes}. vocabSize <= 0 reads records until the end of data; otherwise
// bytes after the last record are ignored. Ids 0, 1 and 2 are <unk>, BOS and
// EOS; pieces of the form <0xNN> are byte tokens; the "▁" of SentencePiece
// is already a space in this format.
func ParseLlama2C(data []byte, vocabSize int) (*SentencePiece, error) {
	if len(data) < 4 {
		return nil, fmt.Errorf("tokenizer: llama2.c tokenizer truncated: %d bytes, want at least a 4-byte header", len(data))
	}
	maxLen := int32(binary.LittleEndian.Uint32(data))
	if maxLen < 0 {
		return nil, fmt.Errorf("tokenizer: llama2.c tokenizer: negative max_token_length %d", maxLen)
	}
	off := 4
	capacity := (len(data) - off) / 8
	if vocabSize > 0 {
		capacity = min(capacity, vocabSize)
	}
	pieces := make([]string, 0, capacity)
	scores := make([]float32, 0, capacity)
	for i := 0; vocabSize <= 0 || i < vocabSize; i++ {
		if vocabSize <= 0 && off == len(data) {
			break
		}
		if len(data)-off < 8 {
			return nil, fmt.Errorf("tokenizer: llama2.c tokenizer truncated in token %d at offset %d (want %d tokens)", i, off, vocabSize)
		}
		score := math.Float32frombits(binary.LittleEndian.Uint32(data[off:]))
		n := int32(binary.LittleEndian.Uint32(data[off+4:]))
		off += 8
		switch {
		case n < 0:
			return nil, fmt.Errorf("tokenizer: llama2.c tokenizer: token %d has negative length %d", i, n)
		case n > maxLen:
			return nil, fmt.Errorf("tokenizer: llama2.c tokenizer: token %d has length %d, above max_token_length %d", i, n, maxLen)
		case int(n) > len(data)-off:
			return nil, fmt.Errorf("tokenizer: llama2.c tokenizer truncated in token %d at offset %d: length %d, %d bytes left", i, off-8, n, len(data)-off)
		}
		pieces = append(pieces, string(data[off:off+int(n)]))
		scores = append(scores, score)
		off += int(n)
	}
	if len(pieces) <= llama2CEOS {
		return nil, fmt.Errorf("tokenizer: llama2.c tokenizer has %d tokens, want at least 3 (<unk>, BOS, EOS)", len(pieces))
	}
	return newSentencePiece(pieces, scores, nil, llama2CBOS, llama2CEOS, llama2CUnk)
}
