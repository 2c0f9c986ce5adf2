// Package convert turns llama2.c checkpoints into standard llama GGUF files
// (the metadata keys and tensor names llama.cpp uses), optionally
// quantizing the weight matrices.
package convert

import (
	"cmp"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
)

// Options controls a conversion.
type Options struct {
	Type tensor.DType // type of the 2-D weight matrices (norms stay F32)
	Name string       // general.name; default: the model file's base name
}

// Report says what a conversion wrote.
type Report struct {
	Tensors   int                  // tensors written
	Types     map[tensor.DType]int // tensors written in each type (norms are F32)
	Fallbacks []string             // matrices whose rows do not fit Type's blocks, written as F16 instead
	FileType  tensor.DType         // what general.file_type names: Type, or F16 when every matrix fell back
}

// Llama2C converts a llama2.c checkpoint and its tokenizer.bin into a GGUF
// file at out. The llama2.c layout already uses interleaved-pair RoPE, the
// convention of GGUF architecture "llama", so Q and K rows are written
// without permutation.
func Llama2C(modelPath, tokPath, out string, opt Options) (Report, error) {
	m, err := model.LoadLlama2C(modelPath)
	if err != nil {
		return Report{}, err
	}
	defer m.Close()
	tok, err := tokenizer.LoadLlama2C(tokPath, 0)
	if err != nil {
		return Report{}, err
	}
	if tok.VocabSize() != m.Vocab {
		return Report{}, fmt.Errorf("convert: tokenizer has %d tokens, model has %d", tok.VocabSize(), m.Vocab)
	}
	if opt.Name == "" {
		opt.Name = strings.TrimSuffix(filepath.Base(modelPath), filepath.Ext(modelPath))
	}
	w, rep, err := Build(m, tok, opt)
	if err != nil {
		return rep, err
	}
	return rep, w.WriteFile(out)
}

// Build lays out a model and its SentencePiece tokenizer as a GGUF writer.
func Build(m *model.Model, tok *tokenizer.SentencePiece, opt Options) (*gguf.Writer, Report, error) {
	rep := Report{Types: map[tensor.DType]int{}}
	if opt.Type == 0 && !opt.Type.Supported() {
		opt.Type = tensor.F32
	}
	if !opt.Type.Supported() {
		return nil, rep, fmt.Errorf("convert: weight type %s is not supported", opt.Type)
	}
	c := m.Config
	w := gguf.NewWriter()
	kv := []struct {
		key string
		val any
	}{
		{"general.architecture", "llama"},
		{"general.name", opt.Name},
		{"llama.vocab_size", uint32(c.Vocab)},
		{"llama.context_length", uint32(c.CtxLen)},
		{"llama.embedding_length", uint32(c.Dim)},
		{"llama.block_count", uint32(c.Layers)},
		{"llama.feed_forward_length", uint32(c.HiddenDim)},
		{"llama.rope.dimension_count", uint32(c.HeadDim)},
		{"llama.attention.head_count", uint32(c.Heads)},
		{"llama.attention.head_count_kv", uint32(c.KVHeads)},
		{"llama.attention.layer_norm_rms_epsilon", c.NormEps},
		{"llama.rope.freq_base", c.RopeTheta},
	}
	for _, m := range append(KVMapMetadata("llama", c), VocabMetadata(tok)...) {
		kv = append(kv, struct {
			key string
			val any
		}{m.Key, m.Val})
	}
	// llama2.c models were never trained to chat: the plain template, as a
	// checkpoint gets, rather than the Llama 2 one an unmarked llama GGUF
	// would.
	kv = append(kv, struct {
		key string
		val any
	}{"tokenizer.chat_template", chat.PlainTemplate})
	for _, e := range kv {
		if err := w.Set(e.key, e.val); err != nil {
			return nil, rep, err
		}
	}
	addMat := func(name string, t *tensor.Matrix) error {
		typ := opt.Type
		if t.Cols%typ.BlockSize() != 0 {
			typ = tensor.F16
			rep.Fallbacks = append(rep.Fallbacks, name)
		}
		data, err := encode(t, typ)
		if err != nil {
			return fmt.Errorf("convert: %s: %w", name, err)
		}
		rep.Tensors++
		rep.Types[typ]++
		return w.AddTensor(name, typ, []uint64{uint64(t.Cols), uint64(t.Rows)}, data)
	}
	addVec := func(name string, v []float32) error {
		data := make([]byte, 4*len(v))
		if err := tensor.Quantize(tensor.F32, v, data); err != nil {
			return err
		}
		rep.Tensors++
		rep.Types[tensor.F32]++
		return w.AddTensor(name, tensor.F32, []uint64{uint64(len(v))}, data)
	}
	if err := addMat("token_embd.weight", m.TokEmb); err != nil {
		return nil, rep, err
	}
	for i, L := range m.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		kvMat := func(name string, t *tensor.Matrix) error {
			if !c.Owns(i) {
				return nil // a layer that reads another's KV has no K/V projection
			}
			return addMat(name, t)
		}
		steps := []error{
			addVec(p+"attn_norm.weight", L.AttnNorm),
			addMat(p+"attn_q.weight", L.Wq),
			kvMat(p+"attn_k.weight", L.Wk),
			kvMat(p+"attn_v.weight", L.Wv),
			addMat(p+"attn_output.weight", L.Wo),
			addVec(p+"ffn_norm.weight", L.FFNNorm),
			addMat(p+"ffn_gate.weight", L.WGate),
			addMat(p+"ffn_down.weight", L.WDown),
			addMat(p+"ffn_up.weight", L.WUp),
		}
		for _, err := range steps {
			if err != nil {
				return nil, rep, err
			}
		}
	}
	if err := addVec("output_norm.weight", m.OutNorm); err != nil {
		return nil, rep, err
	}
	if m.Output != m.TokEmb {
		if err := addMat("output.weight", m.Output); err != nil {
			return nil, rep, err
		}
	}
	// general.file_type names the matrices' type as written ("mostly" that
	// type, in llama.cpp's sense): when none fits opt.Type, F16.
	rep.FileType = opt.Type
	if rep.Types[opt.Type] == 0 {
		rep.FileType = tensor.F16
	}
	if err := w.Set("general.file_type", uint32(fileType(rep.FileType))); err != nil {
		return nil, rep, err
	}
	if q := rep.FileType; q != tensor.F32 && q != tensor.F16 && q != tensor.BF16 {
		if err := w.Set("general.quantization_version", uint32(2)); err != nil {
			return nil, rep, err
		}
	}
	return w, rep, nil
}

// encode converts a matrix to type typ, row by row.
func encode(t *tensor.Matrix, typ tensor.DType) ([]byte, error) {
	rb, err := typ.RowBytes(t.Cols)
	if err != nil {
		return nil, err
	}
	out := make([]byte, t.Rows*rb)
	// Rows are independent: quantized on tensor.Threads threads (the
	// K-quant and IQ4 scale searches run at 5–20 MB/s of float32 a core).
	var mu sync.Mutex
	var first error
	tensor.Parallel(t.Rows, max(1, 1<<16/max(t.Cols, 1)), func(lo, hi int) {
		row := make([]float32, t.Cols)
		for r := lo; r < hi; r++ {
			t.Row(r, row)
			if err := tensor.Quantize(typ, row, out[r*rb:(r+1)*rb]); err != nil {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
				return
			}
		}
	})
	if first != nil {
		return nil, first
	}
	return out, nil
}

// fileType is llama.cpp's general.file_type for files whose matrices are
// all of type t (llama_ftype; plainFileType).
func fileType(t tensor.DType) int { return int(plainFileType[t]) }

// Meta is one GGUF metadata key and its value.
type Meta struct {
	Key string
	Val any
}

// KVMapMetadata is the KV source map and per-layer windows of c as GGUF
// metadata under architecture arch (docs/ARCHITECTURES.md):
// {arch}.attention.kv_source (int32 [layers]) when some layer reads another
// layer's KV, {arch}.attention.layer_window (uint32 [layers]) when the
// windows differ per layer. None for an ordinary model.
func KVMapMetadata(arch string, c model.Config) []Meta {
	var out []Meta
	if c.KVSource != nil && c.Shared() {
		src := make([]int32, c.Layers)
		for i := range src {
			src[i] = int32(c.Source(i))
		}
		out = append(out, Meta{arch + "." + model.KeyKVSource, src})
	}
	if c.LayerWindows != nil {
		win := make([]uint32, c.Layers)
		for i := range win {
			win[i] = uint32(c.Window(i))
		}
		out = append(out, Meta{arch + "." + model.KeyLayerWindow, win})
	}
	return out
}

// VocabMetadata is the tokenizer.ggml.* metadata of a SentencePiece
// vocabulary as llama.cpp's converter writes it (model "llama", pieces,
// scores, token types, BOS/EOS/UNK ids, BOS added, EOS not).
func VocabMetadata(tok *tokenizer.SentencePiece) []Meta {
	pieces, scores, types := tok.Export()
	return []Meta{
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", pieces},
		{"tokenizer.ggml.scores", scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.bos_token_id", uint32(tok.BOS())},
		{"tokenizer.ggml.eos_token_id", uint32(tok.EOS())},
		{"tokenizer.ggml.unknown_token_id", uint32(tok.Unk())},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.ggml.add_eos_token", false},
	}
}
