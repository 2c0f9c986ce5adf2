package main

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
)

// genShape is the architecture of a generated model (GGUF "llama").
type genShape struct {
	Dim, Layers, Heads, KVHeads, Hidden, Ctx int
	RopeTheta                                float32
	Tied                                     bool // no output.weight: the classifier is the embedding
}

// genShapes are the shapes gen-model knows: real models' dimensions with
// random weights, for benchmarks.
var genShapes = map[string]genShape{
	// For tests: small, every dimension a multiple of 256 (K-quants).
	"tiny": {Dim: 256, Layers: 2, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 512, RopeTheta: 10000},
	// llama2.c's stories110M.
	"llama-110m": {Dim: 768, Layers: 12, Heads: 12, KVHeads: 12, Hidden: 2048, Ctx: 1024, RopeTheta: 10000},
	// TinyLlama-1.1B.
	"tinyllama-1.1b": {Dim: 2048, Layers: 22, Heads: 32, KVHeads: 4, Hidden: 5632, Ctx: 2048, RopeTheta: 10000},
	// Llama 3.2 1B's dimensions (tied classifier), with the 32,000-token
	// llama2 vocabulary instead of its 128,256 tokens.
	"llama3.2-1b": {Dim: 2048, Layers: 16, Heads: 32, KVHeads: 8, Hidden: 8192, Ctx: 4096, RopeTheta: 500000, Tied: true},
}

// genTypes are the weight types gen-model writes: every type the loader
// computes with, plus llama.cpp's Q4_K_M mix.
var genTypes = []string{"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "Q4_K_M"}

// genFileType is llama.cpp's general.file_type (llama_ftype) of a mix.
func genFileType(mix string) uint32 {
	return map[string]uint32{"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q4_K": 14, "Q4_K_M": 15, "Q6_K": 18, "BF16": 32}[mix]
}

// genTensorType is the type of a 2-D weight in a mix. Q4_K_M follows
// llama.cpp's llama_tensor_get_type: Q6_K for output.weight, and for
// attn_v and ffn_down of the first and last eighth of the layers and of
// every third layer in between; Q4_K elsewhere.
func genTensorType(mix, name string, layer, layers int) tensor.DType {
	if mix != "Q4_K_M" {
		t, _ := tensor.ParseDType(mix)
		return t
	}
	if name == "output.weight" {
		return tensor.Q6_K
	}
	if strings.HasSuffix(name, "attn_v.weight") || strings.HasSuffix(name, "ffn_down.weight") {
		if layer < layers/8 || layer >= 7*layers/8 || (layer-layers/8)%3 == 2 {
			return tensor.Q6_K
		}
	}
	return tensor.Q4_K
}

type genOptions struct {
	shape, typ, out, tokPath string
	seed                     uint64
	ctx                      int
}

func newGenModel() *cobra.Command {
	var o genOptions
	names := make([]string, 0, len(genShapes))
	for n := range genShapes {
		names = append(names, n)
	}
	sort.Strings(names)
	c := &cobra.Command{
		Use:   "gen-model --shape NAME --type T -o X.gguf",
		Short: "Write a random-weight llama GGUF of a real model's shape (for benchmarks)",
		Long: "gen-model writes a llama GGUF with the dimensions of a known model, random weights\n" +
			"(drawn so that activations stay finite) quantized with kvlm's own quantizers, and\n" +
			"the 32,000-token llama2 vocabulary. Shapes: " + strings.Join(names, ", ") + ".\n" +
			"Types: " + strings.Join(genTypes, ", ") + " (norms stay F32).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := genModel(o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s, %s, %s\n", o.out, o.shape, o.typ, human(n))
			return nil
		},
	}
	c.Flags().StringVar(&o.shape, "shape", "", "model shape: "+strings.Join(names, ", "))
	c.Flags().StringVar(&o.typ, "type", "F16", "weight type: "+strings.Join(genTypes, ", "))
	c.Flags().StringVarP(&o.out, "out", "o", "", "output GGUF file")
	c.Flags().StringVar(&o.tokPath, "tokenizer", "", "llama2.c tokenizer.bin (default: the shared llama2 tokenizer)")
	c.Flags().Uint64Var(&o.seed, "seed", 1, "random seed")
	c.Flags().IntVar(&o.ctx, "ctx", 0, "context length (default: the shape's)")
	return c
}

// genModel writes the file and returns its size.
func genModel(o genOptions) (int64, error) {
	sh, ok := genShapes[o.shape]
	if !ok {
		return 0, fmt.Errorf("unknown shape %q (try kvlm gen-model --help)", o.shape)
	}
	mix := ""
	for _, t := range genTypes {
		if strings.EqualFold(t, o.typ) {
			mix = t
		}
	}
	if mix == "" {
		return 0, fmt.Errorf("unknown type %q (one of %s)", o.typ, strings.Join(genTypes, ", "))
	}
	if o.out == "" {
		return 0, errors.New("no output file: use -o X.gguf")
	}
	if o.ctx < 0 {
		return 0, errors.New("--ctx must be positive")
	}
	if o.ctx > 0 {
		sh.Ctx = o.ctx
	}
	if o.tokPath == "" {
		d := shared.Dir()
		if d == "" {
			return 0, errors.New("shared folder not found: give --tokenizer llama2 tokenizer.bin (or set KVLM_SHARED)")
		}
		o.tokPath = filepath.Join(d, "models", "llama2-tokenizer", "tokenizer.bin")
	}
	tok, err := tokenizer.LoadLlama2C(o.tokPath, 0)
	if err != nil {
		return 0, err
	}
	w, err := genWriter(sh, mix, o.shape, tok, o.seed)
	if err != nil {
		return 0, err
	}
	if err := w.WriteFile(o.out); err != nil {
		return 0, err
	}
	var n int64
	for _, t := range w.Tensors() {
		n = max(n, int64(t.Offset+t.Size))
	}
	return n, nil
}

// genWriter lays out the model; the tensors are drawn, quantized and
// written row block by row block when the file is written.
func genWriter(sh genShape, mix, name string, tok *tokenizer.SentencePiece, seed uint64) (*gguf.Writer, error) {
	vocab := tok.VocabSize()
	hd := sh.Dim / sh.Heads
	w := gguf.NewWriter()
	pieces, scores, types := tok.Export()
	kvs := []struct {
		key string
		val any
	}{
		{"general.architecture", "llama"},
		{"general.name", fmt.Sprintf("kvlm random %s %s", name, mix)},
		{"general.file_type", genFileType(mix)},
		{"llama.vocab_size", uint32(vocab)},
		{"llama.context_length", uint32(sh.Ctx)},
		{"llama.embedding_length", uint32(sh.Dim)},
		{"llama.block_count", uint32(sh.Layers)},
		{"llama.feed_forward_length", uint32(sh.Hidden)},
		{"llama.rope.dimension_count", uint32(hd)},
		{"llama.attention.head_count", uint32(sh.Heads)},
		{"llama.attention.head_count_kv", uint32(sh.KVHeads)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.rope.freq_base", sh.RopeTheta},
		{"general.quantization_version", uint32(2)},
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
	for _, kv := range kvs {
		if err := w.Set(kv.key, kv.val); err != nil {
			return nil, err
		}
	}
	// Weights: N(0, σ²) with σ = 0.5/√cols for the matrices, so that each
	// product keeps its input's scale (RMSNorm resets the residual stream's
	// scale before every block), σ = 1 for the embedding; norms are 1.
	mat := func(name string, layer, rows, cols int, std float64) error {
		typ := genTensorType(mix, name, layer, sh.Layers)
		return w.AddTensorFunc(name, typ, []uint64{uint64(cols), uint64(rows)}, func(out io.Writer) error {
			return genMatrix(out, typ, rows, cols, std, seed, name)
		})
	}
	vec := func(name string, n int) error {
		data := make([]byte, 4*n)
		ones := make([]float32, n)
		for i := range ones {
			ones[i] = 1
		}
		if err := tensor.Quantize(tensor.F32, ones, data); err != nil {
			return err
		}
		return w.AddTensor(name, tensor.F32, []uint64{uint64(n)}, data)
	}
	qdim, kvdim := sh.Heads*hd, sh.KVHeads*hd
	if err := mat("token_embd.weight", 0, vocab, sh.Dim, 1); err != nil {
		return nil, err
	}
	for i := 0; i < sh.Layers; i++ {
		p := fmt.Sprintf("blk.%d.", i)
		for _, err := range []error{
			vec(p+"attn_norm.weight", sh.Dim),
			mat(p+"attn_q.weight", i, qdim, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim))),
			mat(p+"attn_k.weight", i, kvdim, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim))),
			mat(p+"attn_v.weight", i, kvdim, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim))),
			mat(p+"attn_output.weight", i, sh.Dim, qdim, 0.5/math.Sqrt(float64(qdim))),
			vec(p+"ffn_norm.weight", sh.Dim),
			mat(p+"ffn_gate.weight", i, sh.Hidden, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim))),
			mat(p+"ffn_down.weight", i, sh.Dim, sh.Hidden, 0.5/math.Sqrt(float64(sh.Hidden))),
			mat(p+"ffn_up.weight", i, sh.Hidden, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim))),
		} {
			if err != nil {
				return nil, err
			}
		}
	}
	if err := vec("output_norm.weight", sh.Dim); err != nil {
		return nil, err
	}
	if !sh.Tied {
		if err := mat("output.weight", sh.Layers, vocab, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim))); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// genMatrix draws a rows×cols matrix of N(0, std²) values, quantizes it to
// typ and writes it to out, a block of rows at a time (blocks drawn and
// quantized in parallel, each from its own seeded generator, so the bytes
// depend only on the seed and the tensor's name).
func genMatrix(out io.Writer, typ tensor.DType, rows, cols int, std float64, seed uint64, name string) error {
	rb, err := typ.RowBytes(cols)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	stream := h.Sum64()
	const blockRows = 64
	workers := max(1, tensor.Threads)
	nblocks := (rows + blockRows - 1) / blockRows
	bufs := make([][]byte, workers)
	vals := make([][]float32, workers)
	for i := range bufs {
		bufs[i] = make([]byte, blockRows*rb)
		vals[i] = make([]float32, blockRows*cols)
	}
	for b0 := 0; b0 < nblocks; b0 += workers {
		nb := min(workers, nblocks-b0)
		errs := make([]error, nb)
		var wg sync.WaitGroup
		for i := 0; i < nb; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				blk := b0 + i
				r0 := blk * blockRows
				nr := min(blockRows, rows-r0)
				rng := rand.New(rand.NewPCG(seed, stream^uint64(blk)*0x9E3779B97F4A7C15))
				v := vals[i][:nr*cols]
				for j := range v {
					v[j] = float32(rng.NormFloat64() * std)
				}
				errs[i] = tensor.Quantize(typ, v, bufs[i][:nr*rb])
			}(i)
		}
		wg.Wait()
		for i := 0; i < nb; i++ {
			if errs[i] != nil {
				return fmt.Errorf("%s: %w", name, errs[i])
			}
			nr := min(blockRows, rows-(b0+i)*blockRows)
			if _, err := out.Write(bufs[i][:nr*rb]); err != nil {
				return err
			}
		}
	}
	return nil
}
