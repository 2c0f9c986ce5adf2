package convert

// MHA → GQA/MQA conversion of a checkpoint (Ainslie et al. 2023, "GQA:
// Training Generalized Multi-Query Transformer Models from Multi-Head
// Checkpoints", arXiv 2305.13245, §2.1): the key and value projection heads
// of each group are replaced by their mean, and everything else is kept.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
)

// KVHeadsReport says what a KV-head conversion did.
type KVHeadsReport struct {
	From, To int                  // KV heads before and after
	Heads    int                  // query heads (unchanged)
	Pooled   []string             // tensors whose heads were pooled, in file order
	Types    map[tensor.DType]int // the pooled tensors' types (each kept from the input)
	Copied   int                  // tensors copied byte for byte
}

// KVHeads lays out the GGUF file f with n KV heads instead of its
// head_count_kv H: new KV head g (0 ≤ g < n) is the mean of the old heads
// g·H/n … (g+1)·H/n − 1, in the rows of every blk.*.attn_k.weight,
// attn_v.weight and their biases. Query head q then reads new KV head
// q / (heads/n), the group its old KV head q / (heads/H) belongs to, so Q
// and O are kept as they are. Every other tensor is copied byte for byte
// and every metadata key kept, but {arch}.attention.head_count_kv.
//
// Rows are pooled in the file's layout: GGUF stores head h of a K or V
// projection as rows h·head_dim … (h+1)·head_dim − 1 (GGML shape
// [dim, kv_heads·head_dim]). For architecture llama, llama.cpp's converter
// permutes the Q and K rows from Hugging Face's halves layout to
// interleaved pairs within each head, by the same permutation in every
// head: heads stay whole blocks of rows, and the mean of permuted heads is
// the permuted mean. Quantized tensors are dequantized, averaged in
// float64, and quantized back to their own type (every type kvlm reads,
// it also writes); n = H copies the file with nothing pooled.
//
// The returned writer refers to f's tensor bytes: f must stay open until
// the writer has written.
func KVHeads(f *gguf.File, n int) (*gguf.Writer, KVHeadsReport, error) {
	rep := KVHeadsReport{Types: map[tensor.DType]int{}}
	c, err := model.ConfigFromGGUF(f)
	if err != nil {
		return nil, rep, err
	}
	rep.From, rep.To, rep.Heads = c.KVHeads, n, c.Heads
	if err := checkKVHeads(c.KVHeads, n); err != nil {
		return nil, rep, err
	}
	w := gguf.NewWriter()
	countKey := c.Arch + ".attention.head_count_kv"
	for _, kv := range f.KVs {
		v := kv.Value
		if kv.Key == countKey {
			v = uint32(n)
		}
		if err := w.Set(kv.Key, v); err != nil {
			return nil, rep, err
		}
	}
	if _, ok := f.Lookup(countKey); !ok {
		// Absent, head_count_kv is head_count: it is now stated.
		if err := w.Set(countKey, uint32(n)); err != nil {
			return nil, rep, err
		}
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		data := f.TensorData(t)
		if !isKVProjection(t.Name) || n == c.KVHeads {
			if err := w.AddTensor(t.Name, t.Type, t.Shape, data); err != nil {
				return nil, rep, err
			}
			rep.Copied++
			continue
		}
		shape, pooled, err := poolHeads(t, data, c.KVHeads, n, c.HeadDim)
		if err != nil {
			return nil, rep, fmt.Errorf("convert: %s: %w", t.Name, err)
		}
		if err := w.AddTensor(t.Name, t.Type, shape, pooled); err != nil {
			return nil, rep, err
		}
		rep.Pooled = append(rep.Pooled, t.Name)
		rep.Types[t.Type]++
	}
	return w, rep, nil
}

// checkKVHeads refuses a KV head count n that a model with from KV heads
// cannot be pooled to.
func checkKVHeads(from, n int) error {
	switch {
	case n <= 0:
		return fmt.Errorf("convert: --kv-heads %d: the number of KV heads must be positive", n)
	case n > from:
		return fmt.Errorf("convert: --kv-heads %d: the model has %d KV heads; pooling can only reduce them", n, from)
	case from%n != 0:
		return fmt.Errorf("convert: --kv-heads %d does not divide the model's %d KV heads into equal groups (try one of %s)", n, from, divisors(from))
	}
	return nil
}

// divisors lists d's divisors below d: "1, 2".
func divisors(d int) string {
	var s []string
	for k := 1; k < d; k++ {
		if d%k == 0 {
			s = append(s, fmt.Sprint(k))
		}
	}
	return strings.Join(s, ", ")
}

// isKVProjection reports whether a tensor holds per-KV-head rows: the
// weights and biases of a layer's K and V projections.
func isKVProjection(name string) bool {
	if !strings.HasPrefix(name, "blk.") {
		return false
	}
	for _, s := range []string{".attn_k.weight", ".attn_v.weight", ".attn_k.bias", ".attn_v.bias"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// poolHeads mean-pools the KV heads of a K or V projection tensor t (GGML
// shape [cols, from·headDim] for a weight, [from·headDim] for a bias), its
// bytes data in t.Type, into to heads: output row g·headDim + d is the mean
// of input rows (g·k + j)·headDim + d over j < k = from/to. It returns the
// new shape and bytes, in t.Type.
func poolHeads(t *gguf.TensorInfo, data []byte, from, to, headDim int) ([]uint64, []byte, error) {
	rows := from * headDim
	var cols int
	var shape []uint64
	switch {
	case len(t.Shape) == 2 && int(t.Shape[1]) == rows:
		cols = int(t.Shape[0])
		shape = []uint64{t.Shape[0], uint64(to * headDim)}
	case len(t.Shape) == 1 && int(t.Shape[0]) == rows:
		cols = 1 // a bias: one value per row
		shape = []uint64{uint64(to * headDim)}
	default:
		return nil, nil, fmt.Errorf("shape %v is not %d KV heads of %d rows", t.Shape, from, headDim)
	}
	if !t.Type.Supported() {
		return nil, nil, fmt.Errorf("type %s cannot be read, so its heads cannot be pooled", t.Type)
	}
	in := make([]float32, rows*cols)
	if err := tensor.Dequantize(t.Type, data, in); err != nil {
		return nil, nil, err
	}
	k := from / to
	out := make([]float32, to*headDim*cols)
	sum := make([]float64, cols)
	for g := 0; g < to; g++ {
		for d := 0; d < headDim; d++ {
			clear(sum)
			for j := 0; j < k; j++ {
				src := in[((g*k+j)*headDim+d)*cols:][:cols]
				for x, v := range src {
					sum[x] += float64(v)
				}
			}
			dst := out[(g*headDim+d)*cols:][:cols]
			for x, s := range sum {
				dst[x] = float32(s / float64(k))
			}
		}
	}
	b := make([]byte, t.Size/uint64(from)*uint64(to))
	if err := tensor.Quantize(t.Type, out, b); err != nil {
		return nil, nil, fmt.Errorf("writing the pooled heads back as %s: %w", t.Type, err)
	}
	return shape, b, nil
}

// KVHeadsFile converts the model at in to n KV heads and writes the GGUF
// file out. in is a GGUF file (tokPath must be empty: the file carries its
// vocabulary) or a llama2.c checkpoint with its tokenizer.bin at tokPath,
// which is first laid out as the F32 GGUF that Llama2C writes.
func KVHeadsFile(in, tokPath, out string, n int) (KVHeadsReport, error) {
	isGGUF, err := ggufMagic(in)
	if err != nil {
		return KVHeadsReport{}, err
	}
	var f *gguf.File
	if isGGUF {
		if tokPath != "" {
			return KVHeadsReport{}, fmt.Errorf("convert: %s is a GGUF file, which carries its vocabulary: --tokenizer is for llama2.c checkpoints", in)
		}
		if f, err = gguf.Open(in); err != nil {
			return KVHeadsReport{}, err
		}
	} else if f, err = llama2CAsGGUF(in, tokPath); err != nil {
		return KVHeadsReport{}, err
	}
	defer f.Close()
	w, rep, err := KVHeads(f, n)
	if err != nil {
		return rep, err
	}
	return rep, w.WriteFile(out)
}

// llama2CAsGGUF is the F32 GGUF file Llama2C would write for a llama2.c
// checkpoint, parsed in memory.
func llama2CAsGGUF(path, tokPath string) (*gguf.File, error) {
	m, err := model.LoadLlama2C(path)
	if err != nil {
		return nil, fmt.Errorf("convert: %s is not a GGUF file (no GGUF magic) and not a llama2.c checkpoint: %w", path, err)
	}
	defer m.Close()
	if tokPath == "" {
		return nil, fmt.Errorf("convert: %s is a llama2.c checkpoint: give its tokenizer with --tokenizer", path)
	}
	tok, err := tokenizer.LoadLlama2C(tokPath, 0)
	if err != nil {
		return nil, err
	}
	if tok.VocabSize() != m.Vocab {
		return nil, fmt.Errorf("convert: tokenizer has %d tokens, model has %d", tok.VocabSize(), m.Vocab)
	}
	name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	w, _, err := Build(m, tok, Options{Type: tensor.F32, Name: name})
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return nil, err
	}
	return gguf.Parse(buf.Bytes())
}

// ggufMagic reports whether the file at path starts with the GGUF magic.
func ggufMagic(path string) (bool, error) {
	fh, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("convert: %w", err)
	}
	defer fh.Close()
	var magic [4]byte
	if _, err := io.ReadFull(fh, magic[:]); err != nil {
		return false, fmt.Errorf("convert: %s: too short to be a model file", path)
	}
	return string(magic[:]) == "GGUF", nil
}
