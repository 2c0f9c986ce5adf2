package main

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/kvlm/kvlm/convert"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
)

// genShape is the architecture of a generated model.
type genShape struct {
	Arch                                     string // general.architecture; "" is llama
	Dim, Layers, Heads, KVHeads, Hidden, Ctx int
	RopeTheta                                float32
	Eps                                      float32 // RMSNorm epsilon; 0 is 1e-5
	Tied                                     bool    // no output.weight: the classifier is the embedding
	Biases                                   bool    // Q/K/V biases (qwen2), drawn N(0, 0.5²)
	// HeadDim, if set, is the head width (written as attention.key_length
	// and value_length); 0 is Dim/Heads.
	HeadDim int
	// QKNorm: per-head RMSNorm weights of queries and keys (qwen3's
	// attn_q_norm / attn_k_norm, [head dim]), drawn N(1, 0.3²).
	QKNorm bool
	// PostNorms: post_attention_norm / post_ffw_norm ([dim], drawn N(1,
	// 0.3²)) in every layer (gemma3).
	PostNorms bool
	// Window, Pattern and LocalTheta, if set, are written as
	// attention.sliding_window, attention.sliding_window_pattern and
	// rope.freq_base_swa (gemma3's local layers).
	Window, Pattern int
	LocalTheta      float32
	// AttnSoftcap and FinalSoftcap, if set, are written as
	// attn_logit_softcapping and final_logit_softcapping (gemma2).
	AttnSoftcap, FinalSoftcap float32
	// Name, if set, replaces the shape's name in general.name: llama.cpp
	// looks for "phi3" or "phi-3" in general.name (lowercased) and then requires Phi-3's special
	// tokens (<|endoftext|>) in the vocabulary, which stories260K's lacks.
	Name string
	// Fused: one attn_qkv matrix (Q, K, V rows) and one ffn_up (gate rows,
	// then up) instead of the separate ones (phi3).
	Fused bool
	// EmbStd is the embedding's standard deviation (0: 1); gemma3's 1/√Dim
	// makes the scaled embedding (×√Dim) of unit size, as Gemma's are;
	// gemma2's 1/(4√Dim) keeps the tied classifier from repeating the last
	// token at every step.
	EmbStd float64
	// Llama3Rope, if set, is Llama 3.1's rope_scaling (type llama3), written
	// as the rope_freqs.weight tensor llama.cpp's converter stores.
	Llama3Rope *genLlama3Rope
	// LongRope, if set, is Phi-3's LongRoPE as llama.cpp's converter writes
	// it: rope.scaling.original_context_length, rope.scaling.attn_factor
	// √(1 + ln(Ctx/orig)/ln orig) (1 when Ctx ≤ orig), and the
	// rope_factors_long / rope_factors_short tensors ([head dim/2]: long
	// 1 … 64 and short 1 … 3, growing with the pair, as Phi-3-mini-128k's).
	LongRope *genLongRope
	// KVSource and LayerWindows, if set ([Layers] each), are the KV source
	// map and the per-layer windows (model.Config, docs/ARCHITECTURES.md),
	// written as {arch}.attention.kv_source / layer_window; the layers that
	// do not own KV get no attn_k / attn_v tensors.
	KVSource, LayerWindows []int
	// Vocab is the vocabulary written: "" (the 32,000-token llama2
	// SentencePiece vocabulary), "llama3" (Llama 3's 128,256-token
	// byte-level BPE, pre-tokenizer llama-bpe, the Llama 3.1 chat
	// template) or "qwen2" (Llama 3's 128,000 regular tokens with Qwen 2's
	// pre-tokenizer name and ChatML special tokens and template).
	Vocab string
}

// genLlama3Rope are rope_scaling's parameters (factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings).
type genLlama3Rope struct {
	Factor, Low, High float64
	OrigCtx           int
}

// genLongRope is LongRoPE's original_max_position_embeddings.
type genLongRope struct{ OrigCtx int }

// factors are the long and short sets of half pairs.
func (r genLongRope) factors(half int) (long, short []float32) {
	long, short = make([]float32, half), make([]float32, half)
	for j := range long {
		x := float64(j) / float64(max(half-1, 1))
		long[j], short[j] = float32(1+63*x*x), float32(1+2*x)
	}
	return long, short
}

// attnFactor is the converter's rope.scaling.attn_factor for context ctx.
func (r genLongRope) attnFactor(ctx int) float32 {
	scale := float64(ctx) / float64(r.OrigCtx)
	if scale <= 1 {
		return 1
	}
	return float32(math.Sqrt(1 + math.Log(scale)/math.Log(float64(r.OrigCtx))))
}

func (sh genShape) arch() string {
	if sh.Arch == "" {
		return "llama"
	}
	return sh.Arch
}

// genShapes are the shapes gen-model knows: real models' dimensions with
// random weights, for benchmarks, and tiny ones for tests.
var genShapes = map[string]genShape{
	// For tests: small, every dimension a multiple of 256 (K-quants).
	"tiny": {Dim: 256, Layers: 2, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 512, RopeTheta: 10000},
	// For tests against llama.cpp: the smallest llama whose matrices are
	// whole K-quant blocks, with 4 query heads per KV head (the threshold of
	// llama.cpp's GQA rules); with stories260K's 512-token vocabulary its
	// quantized files are about half a megabyte.
	"quant-tiny": {Dim: 256, Layers: 2, Heads: 4, KVHeads: 1, Hidden: 256, Ctx: 256, RopeTheta: 10000},
	// For tests: Llama 3.2's format at width 64 (head dim 16): tied
	// classifier, theta 500000, Llama 3.2's rope_scaling as rope_freqs, the
	// 128K vocabulary, EOS <|eot_id|>, the Llama 3.1 chat template.
	"llama3-tiny": {Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, Hidden: 128, Ctx: 512, RopeTheta: 500000, Tied: true,
		Llama3Rope: &genLlama3Rope{Factor: 32, Low: 1, High: 4, OrigCtx: 8192}, Vocab: "llama3"},
	// For tests: a qwen2 model at width 64: Q/K/V biases, NEOX RoPE,
	// theta 1e6, eps 1e-6, an untied classifier (as Qwen 2 7B), the ChatML
	// template.
	"qwen2-tiny": {Arch: "qwen2", Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, Hidden: 128, Ctx: 512, RopeTheta: 1e6, Eps: 1e-6,
		Biases: true, Vocab: "qwen2"},
	// For tests against llama.cpp: a qwen3 model whose matrices are whole
	// K-quant blocks: Q/K norms, head dim 128 (Q width 512 against the
	// embedding's 256, as Qwen3-0.6B's 2048 against 1024), NEOX RoPE, θ 1e6,
	// eps 1e-6, untied classifier; with stories260K's vocabulary.
	"qwen3-tiny": {Arch: "qwen3", Dim: 256, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 128, Hidden: 512, Ctx: 256, RopeTheta: 1e6, Eps: 1e-6,
		QKNorm: true},
	// For tests against llama.cpp: a gemma3 model of 3 layers, local
	// (window 16, RoPE base 10000) and global (θ 1e6) as sliding_window_pattern 3
	// makes them (layers 0-1 local, 2 global); Q/K norms and post-norms,
	// GeGLU, the embedding times √256; an untied classifier (Gemma ties it: tied, these random weights make every step repeat the last token).
	"gemma3-tiny": {Arch: "gemma3", Dim: 256, Layers: 3, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 256, RopeTheta: 1e6, Eps: 1e-6,
		QKNorm: true, PostNorms: true, Window: 16, Pattern: 3, LocalTheta: 10000, EmbStd: 1.0 / 16},
	// For tests against llama.cpp: a gemma2 model of 4 layers, local
	// (window 16) and global alternating (layers 0 and 2 local, the default
	// pattern 2), one RoPE base; post-norms, GeGLU, the embedding times
	// √256, Gemma 2's soft-caps 50 (attention) and 30 (final), the tied
	// classifier llama.cpp requires of gemma2.
	"gemma2-tiny": {Arch: "gemma2", Dim: 256, Layers: 4, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 256, RopeTheta: 10000, Eps: 1e-6,
		Tied: true, PostNorms: true, Window: 16, AttnSoftcap: 50, FinalSoftcap: 30, EmbStd: 1.0 / 64},
	// gemma2-tiny with caps small enough to bend its scores and logits
	// (attention 1, final 1), so that llama.cpp's soft-capping is checked.
	"gemma2-cap-tiny": {Arch: "gemma2", Dim: 256, Layers: 4, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 256, RopeTheta: 10000, Eps: 1e-6,
		Tied: true, PostNorms: true, Window: 16, AttnSoftcap: 1, FinalSoftcap: 1, EmbStd: 1.0 / 64},
	// For tests against llama.cpp: a phi3 model (fused attn_qkv and
	// ffn_up, NEOX RoPE) whose matrices are whole K-quant blocks, GQA 4:2.
	"phi3-tiny": {Arch: "phi3", Dim: 256, Layers: 2, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 256, RopeTheta: 10000, Fused: true, Name: "tiny (fused QKV)"},
	// phi3-tiny with Phi-3's LongRoPE (the 128K models): context 256 over
	// an original 64 (llama.cpp, and kvlm, use the long factors, and the
	// attention factor 1.155), or over an original 256 (the short ones,
	// attention factor 1).
	"phi3-long-tiny": {Arch: "phi3", Dim: 256, Layers: 2, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 256, RopeTheta: 10000, Fused: true, Name: "tiny (fused QKV, LongRoPE)",
		LongRope: &genLongRope{OrigCtx: 64}},
	"phi3-short-tiny": {Arch: "phi3", Dim: 256, Layers: 2, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 256, RopeTheta: 10000, Fused: true, Name: "tiny (fused QKV, LongRoPE)",
		LongRope: &genLongRope{OrigCtx: 256}},
	// Architectures that share KV across layers (docs/ARCHITECTURES.md),
	// for tests and benchmarks: width 256 (head dim 64), GQA 4:2 unless
	// named otherwise, context 4096, the llama2 vocabulary.
	// CLA2: pairs of layers, the first of each owning KV.
	"cla2": {Dim: 256, Layers: 8, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 4096, RopeTheta: 10000,
		KVSource: []int{0, 0, 2, 2, 4, 4, 6, 6}},
	// CLA3: triples of layers.
	"cla3": {Dim: 256, Layers: 9, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 4096, RopeTheta: 10000,
		KVSource: []int{0, 0, 0, 3, 3, 3, 6, 6, 6}},
	// CLA2 on MQA (one KV head).
	"cla2-mqa": {Dim: 256, Layers: 8, Heads: 4, KVHeads: 1, Hidden: 512, Ctx: 4096, RopeTheta: 10000,
		KVSource: []int{0, 0, 2, 2, 4, 4, 6, 6}},
	// YOCO: a self-decoder of 4 sliding-window layers (window 64, each its
	// own KV), then a cross-decoder whose first layer owns the one global
	// KV every later layer reads.
	"yoco": {Dim: 256, Layers: 8, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 4096, RopeTheta: 10000,
		KVSource: []int{0, 1, 2, 3, 4, 4, 4, 4}, LayerWindows: []int{64, 64, 64, 64, 0, 0, 0, 0}},
	// Layer-Condensed KV: 2 warmup layers at the bottom; every other layer
	// reads the top layer's KV (masked diagonal, dummy KV).
	"lckv": {Dim: 256, Layers: 8, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 4096, RopeTheta: 10000,
		KVSource: []int{0, 1, 7, 7, 7, 7, 7, 7}},
	// Interleaved local (sliding window 64) and global layers, 5:1 as
	// Gemma 3; every layer its own KV.
	"local-global": {Dim: 256, Layers: 12, Heads: 4, KVHeads: 2, Hidden: 512, Ctx: 4096, RopeTheta: 10000,
		LayerWindows: []int{64, 64, 64, 64, 64, 0, 64, 64, 64, 64, 64, 0}},
	// llama2.c's stories110M.
	"llama-110m": {Dim: 768, Layers: 12, Heads: 12, KVHeads: 12, Hidden: 2048, Ctx: 1024, RopeTheta: 10000},
	// TinyLlama-1.1B.
	"tinyllama-1.1b": {Dim: 2048, Layers: 22, Heads: 32, KVHeads: 4, Hidden: 5632, Ctx: 2048, RopeTheta: 10000},
	// Llama 3.2 1B's dimensions (tied classifier), with the 32,000-token
	// llama2 vocabulary instead of its 128,256 tokens.
	"llama3.2-1b": {Dim: 2048, Layers: 16, Heads: 32, KVHeads: 8, Hidden: 8192, Ctx: 4096, RopeTheta: 500000, Tied: true},
}

// genTypes are the weight types gen-model writes: every type the loader
// computes with, plus llama.cpp's mixes (convert.MixNames).
var genTypes = convert.MixNames()

// genMixModel is what the mixes' rules look at of a shape.
func genMixModel(sh genShape) convert.MixModel {
	return convert.MixModel{Layers: sh.Layers, GQA: sh.Heads / sh.KVHeads, Tied: sh.Tied}
}

// genTensorType is the type of the 2-D weight name (layer: its block)
// with rows of cols values in mix (rule: before llama.cpp's fallback for
// rows that are not whole blocks, convert.Fallback).
func genTensorType(mix convert.Mix, sh genShape, name string, layer, cols int) (rule, typ tensor.DType) {
	rule = mix.RuleType(name, layer, cols, genMixModel(sh))
	return rule, convert.Fallback(rule, cols)
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
		Short: "Write a random-weight GGUF of a real model's shape (for benchmarks and tests)",
		Long: "gen-model writes a GGUF with the dimensions of a known model, random weights\n" +
			"(drawn so that activations stay finite) quantized with kvlm's own quantizers, and\n" +
			"a real vocabulary: the 32,000-token llama2 one, or for llama3-tiny and qwen2-tiny\n" +
			"the 128K Llama 3 one (qwen2-tiny: a qwen2 model with Q/K/V biases, NEOX RoPE and\n" +
			"ChatML). cla2, cla3, cla2-mqa, yoco, lckv and local-global share KV across layers or\n" +
			"window layers one by one (a KV source map, docs/ARCHITECTURES.md).\n" +
			"Shapes: " + strings.Join(names, ", ") + ".\n" +
			"Types: " + strings.Join(genTypes, ", ") + " (norms and biases stay F32):\n" +
			"a plain type writes every matrix in it; Q4_K_M, Q5_K_M, Q3_K_M, Q2_K and IQ4_XS are\n" +
			"llama.cpp's mixes, with llama-quantize's per-tensor choices (docs/QUANTIZATION.md).\n" +
			"A matrix whose rows the type's blocks do not divide takes llama.cpp's fallback\n" +
			"(Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K and Q3_K → Q4_0, IQ4_XS → IQ4_NL),\n" +
			"or F16 where that does not divide them either.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, fb, err := genModel(o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s, %s, %s\n", o.out, o.shape, o.typ, human(n))
			if len(fb) > 0 {
				count := map[tensor.DType]int{}
				for _, t := range fb {
					count[t]++
				}
				var parts []string
				for t, k := range count {
					parts = append(parts, fmt.Sprintf("%s for %d", t, k))
				}
				sort.Strings(parts)
				fmt.Fprintf(cmd.ErrOrStderr(), "gen-model: %s: %s matrices, whose rows are not whole blocks of the type (see --help)\n",
					strings.ToUpper(o.typ), strings.Join(parts, ", "))
			}
			return nil
		},
	}
	c.Flags().StringVar(&o.shape, "shape", "", "model shape: "+strings.Join(names, ", "))
	c.Flags().StringVar(&o.typ, "type", "F16", "weight type: "+strings.Join(genTypes, ", "))
	c.Flags().StringVarP(&o.out, "out", "o", "", "output GGUF file")
	c.Flags().StringVar(&o.tokPath, "tokenizer", "", "vocabulary: a llama2.c tokenizer.bin, or for llama3-tiny and qwen2-tiny a folder\n"+
		"holding encoder.json and vocab.bpe (default: the shared llama2-tokenizer or llama3-tokenizer)")
	c.Flags().Uint64Var(&o.seed, "seed", 1, "random seed")
	c.Flags().IntVar(&o.ctx, "ctx", 0, "context length (default: the shape's)")
	return c
}

// genModel writes the file and returns its size and the matrices written
// in a fallback type (name → type).
func genModel(o genOptions) (int64, map[string]tensor.DType, error) {
	sh, ok := genShapes[o.shape]
	if !ok {
		return 0, nil, fmt.Errorf("unknown shape %q (try kvlm gen-model --help)", o.shape)
	}
	mix, err := convert.ParseMix(o.typ)
	if err != nil {
		return 0, nil, err
	}
	if o.out == "" {
		return 0, nil, errors.New("no output file: use -o X.gguf")
	}
	if o.ctx < 0 {
		return 0, nil, errors.New("--ctx must be positive")
	}
	if o.ctx > 0 {
		sh.Ctx = o.ctx
	}
	voc, err := genLoadVocab(sh.Vocab, o.tokPath)
	if err != nil {
		return 0, nil, err
	}
	w, fb, err := genWriter(sh, mix, o.shape, voc, o.seed)
	if err != nil {
		return 0, nil, err
	}
	if err := w.WriteFile(o.out); err != nil {
		return 0, nil, err
	}
	var n int64
	for _, t := range w.Tensors() {
		n = max(n, int64(t.Offset+t.Size))
	}
	return n, fb, nil
}

// genKV is one metadata key and its value.
type genKV struct {
	key string
	val any
}

// genVocab is a vocabulary as GGUF metadata: its tokenizer.* keys.
type genVocab struct {
	size int
	kvs  []genKV
}

// The chat templates written with the BPE vocabularies.
const (
	// genLlama31Template is Llama 3.1 Instruct's chat template with its
	// tool-calling branches left out (kvlm's chat package recognises it
	// as llama3.1 by its "Cutting Knowledge Date" header).
	genLlama31Template = `{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
`
	// genQwen2Template is Qwen 2 Instruct's ChatML template.
	genQwen2Template = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}" +
		"{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}" +
		"{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}" +
		"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

// genChatMLSpecials are Qwen 2's special tokens, in its order.
var genChatMLSpecials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// genLoadVocab reads the vocabulary of kind (see genShape.Vocab) from path,
// or from the shared folder when path is "".
func genLoadVocab(kind, path string) (genVocab, error) {
	if path == "" {
		d := shared.Dir()
		if d == "" {
			return genVocab{}, errors.New("shared folder not found: give --tokenizer (or set KVLM_SHARED)")
		}
		if kind == "" {
			path = filepath.Join(d, "models", "llama2-tokenizer", "tokenizer.bin")
		} else {
			path = filepath.Join(d, "models", "llama3-tokenizer")
		}
	}
	if kind == "" {
		tok, err := tokenizer.LoadLlama2C(path, 0)
		if err != nil {
			return genVocab{}, err
		}
		v := genVocab{size: tok.VocabSize()}
		for _, m := range convert.VocabMetadata(tok) {
			v.kvs = append(v.kvs, genKV{m.Key, m.Val})
		}
		return v, nil
	}
	specials, pre, tmpl := tokenizer.Llama3Specials(), "llama-bpe", genLlama31Template
	if kind == "qwen2" {
		specials, pre, tmpl = genChatMLSpecials, "qwen2", genQwen2Template
	}
	tokens, types, merges, err := tokenizer.ReadGPT2VocabDir(path, specials)
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return genVocab{}, fmt.Errorf("--tokenizer for a Llama 3 vocabulary is a folder holding encoder.json and vocab.bpe: %w", err)
	}
	if err != nil {
		return genVocab{}, err
	}
	first := len(tokens) - len(specials)
	id := func(s string) uint32 { return uint32(first + slices.Index(specials, s)) }
	kvs := []genKV{
		{"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.pre", pre},
		{"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.merges", merges},
	}
	if kind == "qwen2" {
		// As Qwen 2 Instruct GGUFs: BOS and padding <|endoftext|>, EOS
		// <|im_end|>, no BOS added.
		kvs = append(kvs, genKV{"tokenizer.ggml.bos_token_id", id("<|endoftext|>")}, genKV{"tokenizer.ggml.eos_token_id", id("<|im_end|>")},
			genKV{"tokenizer.ggml.padding_token_id", id("<|endoftext|>")}, genKV{"tokenizer.ggml.add_bos_token", false})
	} else {
		// As Llama 3.x Instruct GGUFs: EOS <|eot_id|>, BOS added.
		kvs = append(kvs, genKV{"tokenizer.ggml.bos_token_id", id("<|begin_of_text|>")}, genKV{"tokenizer.ggml.eos_token_id", id("<|eot_id|>")},
			genKV{"tokenizer.ggml.add_bos_token", true})
	}
	kvs = append(kvs, genKV{"tokenizer.chat_template", tmpl})
	return genVocab{size: len(tokens), kvs: kvs}, nil
}

// genWriter lays out the model; the tensors are drawn, quantized and
// written row block by row block when the file is written. It returns the
// matrices that a fallback type (genFallback) holds.
func genWriter(sh genShape, mix convert.Mix, name string, voc genVocab, seed uint64) (*gguf.Writer, map[string]tensor.DType, error) {
	vocab := voc.size
	hd := sh.Dim / sh.Heads
	if sh.HeadDim > 0 {
		hd = sh.HeadDim
	}
	a := sh.arch()
	eps := sh.Eps
	if eps == 0 {
		eps = 1e-5
	}
	w := gguf.NewWriter()
	kvs := []genKV{
		{"general.architecture", a},
		{"general.name", fmt.Sprintf("kvlm random %s %s", cmp.Or(sh.Name, name), mix.Name)},
		{"general.file_type", mix.FileType},
		{a + ".vocab_size", uint32(vocab)},
		{a + ".context_length", uint32(sh.Ctx)},
		{a + ".embedding_length", uint32(sh.Dim)},
		{a + ".block_count", uint32(sh.Layers)},
		{a + ".feed_forward_length", uint32(sh.Hidden)},
		{a + ".rope.dimension_count", uint32(hd)},
		{a + ".attention.head_count", uint32(sh.Heads)},
		{a + ".attention.head_count_kv", uint32(sh.KVHeads)},
		{a + ".attention.layer_norm_rms_epsilon", eps},
		{a + ".rope.freq_base", sh.RopeTheta},
		{"general.quantization_version", uint32(2)},
	}
	if sh.HeadDim > 0 {
		kvs = append(kvs, genKV{a + ".attention.key_length", uint32(hd)}, genKV{a + ".attention.value_length", uint32(hd)})
	}
	if sh.Window > 0 {
		kvs = append(kvs, genKV{a + ".attention.sliding_window", uint32(sh.Window)})
	}
	if sh.Pattern > 0 {
		kvs = append(kvs, genKV{a + ".attention.sliding_window_pattern", uint32(sh.Pattern)})
	}
	if sh.AttnSoftcap > 0 {
		kvs = append(kvs, genKV{a + ".attn_logit_softcapping", sh.AttnSoftcap})
	}
	if sh.FinalSoftcap > 0 {
		kvs = append(kvs, genKV{a + ".final_logit_softcapping", sh.FinalSoftcap})
	}
	if sh.LocalTheta > 0 {
		kvs = append(kvs, genKV{a + ".rope.freq_base_swa", sh.LocalTheta})
	}
	if r := sh.LongRope; r != nil {
		kvs = append(kvs, genKV{a + ".rope.scaling.original_context_length", uint32(r.OrigCtx)},
			genKV{a + ".rope.scaling.attn_factor", r.attnFactor(sh.Ctx)})
	}
	kvmap := model.Config{Layers: sh.Layers, KVSource: sh.KVSource, LayerWindows: sh.LayerWindows}
	for _, m := range convert.KVMapMetadata(a, kvmap) {
		kvs = append(kvs, genKV{m.Key, m.Val})
	}
	for _, kv := range append(kvs, voc.kvs...) {
		if err := w.Set(kv.key, kv.val); err != nil {
			return nil, nil, err
		}
	}
	fallbacks := map[string]tensor.DType{}
	// Weights: N(0, σ²) with σ = 0.5/√cols for the matrices, so that each
	// product keeps its input's scale (RMSNorm resets the residual stream's
	// scale before every block), σ = 1 for the embedding; norms are 1;
	// biases N(0, 0.5²), large enough to change every attention score.
	mat := func(name string, layer, rows, cols int, std float64) error {
		rule, typ := genTensorType(mix, sh, name, layer, cols)
		if typ != rule {
			fallbacks[name] = typ
		}
		return w.AddTensorFunc(name, typ, []uint64{uint64(cols), uint64(rows)}, func(out io.Writer) error {
			return genMatrix(out, typ, rows, cols, std, seed, name)
		})
	}
	f32vec := func(name string, v []float32) error {
		data := make([]byte, 4*len(v))
		if err := tensor.Quantize(tensor.F32, v, data); err != nil {
			return err
		}
		return w.AddTensor(name, tensor.F32, []uint64{uint64(len(v))}, data)
	}
	vec := func(name string, n int) error {
		ones := make([]float32, n)
		for i := range ones {
			ones[i] = 1
		}
		return f32vec(name, ones)
	}
	// norm is a norm weight of n values drawn N(1, 0.3²), for the norms an
	// architecture adds (so that a reader that skips one is seen).
	norm := func(name string, n int) error {
		return w.AddTensorFunc(name, tensor.F32, []uint64{uint64(n)}, func(out io.Writer) error {
			h := fnv.New64a()
			h.Write([]byte(name))
			rng := rand.New(rand.NewPCG(seed, h.Sum64()))
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(1 + 0.3*rng.NormFloat64())
			}
			data := make([]byte, 4*n)
			if err := tensor.Quantize(tensor.F32, v, data); err != nil {
				return err
			}
			_, err := out.Write(data)
			return err
		})
	}
	bias := func(name string, n int) error {
		if !sh.Biases {
			return nil
		}
		return w.AddTensorFunc(name, tensor.F32, []uint64{uint64(n)}, func(out io.Writer) error {
			return genMatrix(out, tensor.F32, 1, n, 0.5, seed, name)
		})
	}
	qdim, kvdim := sh.Heads*hd, sh.KVHeads*hd
	embStd := 1.0
	if sh.EmbStd > 0 {
		embStd = sh.EmbStd
	}
	if err := mat("token_embd.weight", 0, vocab, sh.Dim, embStd); err != nil {
		return nil, nil, err
	}
	if r := sh.Llama3Rope; r != nil {
		f := model.Llama3RopeFactors(hd, float64(sh.RopeTheta), r.Factor, r.Low, r.High, r.OrigCtx)
		if err := f32vec("rope_freqs.weight", f); err != nil {
			return nil, nil, err
		}
	}
	if r := sh.LongRope; r != nil {
		long, short := r.factors(hd / 2)
		if err := f32vec("rope_factors_long.weight", long); err != nil {
			return nil, nil, err
		}
		if err := f32vec("rope_factors_short.weight", short); err != nil {
			return nil, nil, err
		}
	}
	for i := 0; i < sh.Layers; i++ {
		p := fmt.Sprintf("blk.%d.", i)
		own := kvmap.Owns(i) // a layer that reads another's KV has no K/V projection
		kvMat := func(name string, rows int) error {
			if !own || sh.Fused {
				return nil
			}
			return mat(name, i, rows, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim)))
		}
		kvBias := func(name string, n int) error {
			if !own {
				return nil
			}
			return bias(name, n)
		}
		qkNorm := func(name string, kv bool) error {
			if !sh.QKNorm || (kv && !own) {
				return nil
			}
			return norm(name, hd)
		}
		// sep writes a matrix of rows×Dim unless the projections are fused,
		// fused one only if they are.
		sep := func(name string, layer, rows int) error {
			if sh.Fused {
				return nil
			}
			return mat(name, layer, rows, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim)))
		}
		fused := func(name string, layer, rows int) error {
			if !sh.Fused {
				return nil
			}
			return mat(name, layer, rows, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim)))
		}
		postNorm := func(name string) error {
			if !sh.PostNorms {
				return nil
			}
			return norm(name, sh.Dim)
		}
		for _, err := range []error{
			vec(p+"attn_norm.weight", sh.Dim),
			sep(p+"attn_q.weight", i, qdim),
			fused(p+"attn_qkv.weight", i, qdim+2*kvdim),
			bias(p+"attn_q.bias", qdim),
			kvMat(p+"attn_k.weight", kvdim),
			kvBias(p+"attn_k.bias", kvdim),
			kvMat(p+"attn_v.weight", kvdim),
			kvBias(p+"attn_v.bias", kvdim),
			qkNorm(p+"attn_q_norm.weight", false),
			qkNorm(p+"attn_k_norm.weight", true),
			mat(p+"attn_output.weight", i, sh.Dim, qdim, 0.5/math.Sqrt(float64(qdim))),
			postNorm(p + "post_attention_norm.weight"),
			vec(p+"ffn_norm.weight", sh.Dim),
			postNorm(p + "post_ffw_norm.weight"),
			sep(p+"ffn_gate.weight", i, sh.Hidden),
			mat(p+"ffn_down.weight", i, sh.Dim, sh.Hidden, 0.5/math.Sqrt(float64(sh.Hidden))),
			sep(p+"ffn_up.weight", i, sh.Hidden),
			fused(p+"ffn_up.weight", i, 2*sh.Hidden),
		} {
			if err != nil {
				return nil, nil, err
			}
		}
	}
	if err := vec("output_norm.weight", sh.Dim); err != nil {
		return nil, nil, err
	}
	if !sh.Tied {
		if err := mat("output.weight", sh.Layers, vocab, sh.Dim, 0.5/math.Sqrt(float64(sh.Dim))); err != nil {
			return nil, nil, err
		}
	}
	return w, fallbacks, nil
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
