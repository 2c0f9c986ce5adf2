// Package tokenizer turns text into token ids and back.
//
// Tokenizer is the interface the model runner and the CLI use; it says
// nothing about how a vocabulary is built. SentencePiece implements it for
// SentencePiece-style BPE vocabularies with byte fallback (Llama 2, the
// llama2.c tok512 vocabulary, GGUF tokenizer.ggml.model = "llama"). Other
// schemes (GPT-2 byte-level BPE for Llama 3 and Qwen 2) are meant to be
// further implementations of the same interface.
package tokenizer

// Tokenizer encodes text to token ids and decodes ids back to bytes.
// Implementations are safe for concurrent use.
type Tokenizer interface {
	// Encode returns the ids of text, optionally preceded by BOS and
	// followed by EOS.
	Encode(text string, addBOS, addEOS bool) []int
	// Decode returns the bytes of token tok as it follows token prev
	// (prev = -1 at the start of a sequence). The result may be part of a
	// UTF-8 sequence; concatenate before interpreting it as text.
	Decode(prev, tok int) string
	// DecodeAll is the concatenation of Decode over ids, the first prev
	// being -1.
	DecodeAll(ids []int) string
	// VocabSize is the number of token ids; valid ids are 0..VocabSize()-1.
	VocabSize() int
	// BOS and EOS are the beginning- and end-of-sequence ids, or -1 when
	// the vocabulary has none.
	BOS() int
	EOS() int
	// Piece is the stored text of token id, for display ("" when out of
	// range).
	Piece(id int) string
}

// Token types, as stored in GGUF tokenizer.ggml.token_type (llama.cpp's
// llama_token_type, which mirrors SentencePiece's piece types).
const (
	TypeUndefined   int32 = 0 // treated like TypeNormal
	TypeNormal      int32 = 1
	TypeUnknown     int32 = 2
	TypeControl     int32 = 3
	TypeUserDefined int32 = 4
	TypeUnused      int32 = 5
	TypeByte        int32 = 6
)
