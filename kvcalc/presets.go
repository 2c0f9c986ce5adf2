package kvcalc

import (
	"fmt"
	"strings"
)

// The presets: published shapes of well-known models.
//
// Parameter counts of the Llama-family presets are exact: they are what the
// architecture gives (embedding + untied classifier + per layer Wq, Wk, Wv,
// Wo, the three SwiGLU matrices and two RMSNorm weights, plus biases where
// the model has them, + the final norm), and TestPresetParams recomputes
// them from Dim, HiddenDim and Vocab. They agree with the rounded counts the
// model cards give. GPT-3 uses the paper's nominal 175.0B, the number every
// "350 GB of fp16 weights" comparison starts from.
var presets = []Model{
	{
		// Llama 2 (arXiv 2307.09288); meta-llama/Llama-2-7b-hf config.json:
		// hidden 4096, intermediate 11008, 32 layers, 32 heads, 32 KV heads,
		// vocab 32000, 4096 positions. 6,738,415,616 parameters ("6.74B").
		Name: "llama2-7b", Layers: 32, Heads: 32, KVHeads: 32, HeadDim: 128,
		Dim: 4096, HiddenDim: 11008, Vocab: 32000, Context: 4096,
		Params: 6_738_415_616, Source: "Llama 2 (arXiv 2307.09288), meta-llama/Llama-2-7b-hf config",
	},
	{
		// meta-llama/Llama-2-13b-hf: hidden 5120, intermediate 13824, 40
		// layers, 40 heads (MHA), vocab 32000. 13,015,864,320 ("13.0B").
		Name: "llama2-13b", Layers: 40, Heads: 40, KVHeads: 40, HeadDim: 128,
		Dim: 5120, HiddenDim: 13824, Vocab: 32000, Context: 4096,
		Params: 13_015_864_320, Source: "Llama 2 (arXiv 2307.09288), meta-llama/Llama-2-13b-hf config",
	},
	{
		// meta-llama/Llama-2-70b-hf: hidden 8192, intermediate 28672, 80
		// layers, 64 heads, 8 KV heads (GQA), vocab 32000.
		// 68,976,648,192 ("69.0B"; Meta calls it 70B).
		Name: "llama2-70b", Layers: 80, Heads: 64, KVHeads: 8, HeadDim: 128,
		Dim: 8192, HiddenDim: 28672, Vocab: 32000, Context: 4096,
		Params: 68_976_648_192, Source: "Llama 2 (arXiv 2307.09288), meta-llama/Llama-2-70b-hf config",
	},
	{
		// meta-llama/Meta-Llama-3-8B: hidden 4096, intermediate 14336, 32
		// layers, 32 heads, 8 KV heads, vocab 128256, 8192 positions.
		// 8,030,261,248 ("8.03B").
		Name: "llama3-8b", Layers: 32, Heads: 32, KVHeads: 8, HeadDim: 128,
		Dim: 4096, HiddenDim: 14336, Vocab: 128256, Context: 8192,
		Params: 8_030_261_248, Source: "Llama 3 (arXiv 2407.21783), meta-llama/Meta-Llama-3-8B config",
	},
	{
		// meta-llama/Meta-Llama-3-70B: hidden 8192, intermediate 28672, 80
		// layers, 64 heads, 8 KV heads, vocab 128256.
		// 70,553,706,496 ("70.6B").
		Name: "llama3-70b", Layers: 80, Heads: 64, KVHeads: 8, HeadDim: 128,
		Dim: 8192, HiddenDim: 28672, Vocab: 128256, Context: 8192,
		Params: 70_553_706_496, Source: "Llama 3 (arXiv 2407.21783), meta-llama/Meta-Llama-3-70B config",
	},
	{
		// Mistral 7B v0.1 (arXiv 2310.06825, table 1): dim 4096, 32 layers,
		// head dim 128, hidden 14336, 32 heads, 8 KV heads, vocab 32000,
		// context 8192. 7,241,732,096 parameters ("7.24B"; v0.3's 32768-token
		// vocabulary adds 6.3M). Counted as full attention: v0.1's 4096-token
		// sliding window with a rolling cache keeps at most 4096 tokens per
		// sequence, which --kv-budget 4096 models.
		Name: "mistral-7b", Layers: 32, Heads: 32, KVHeads: 8, HeadDim: 128,
		Dim: 4096, HiddenDim: 14336, Vocab: 32000, Context: 8192,
		Params: 7_241_732_096, Source: "Mistral 7B (arXiv 2310.06825), table 1",
	},
	{
		// Qwen/Qwen2.5-7B config.json: hidden 3584, intermediate 18944, 28
		// layers, 28 heads, 4 KV heads, vocab 152064, Q/K/V biases, untied
		// classifier. 7,615,616,512 parameters: "7.62B" rounded (the model
		// card truncates to 7.61B). Native context 32768 (131072 with YaRN).
		Name: "qwen2.5-7b", Layers: 28, Heads: 28, KVHeads: 4, HeadDim: 128,
		Dim: 3584, HiddenDim: 18944, Vocab: 152064, Context: 32768, QKVBias: true,
		Params: 7_615_616_512, Source: "Qwen2.5 (arXiv 2412.15115), Qwen/Qwen2.5-7B config",
	},
	{
		// TinyLlama/TinyLlama-1.1B (arXiv 2401.02385): hidden 2048,
		// intermediate 5632, 22 layers, 32 heads, 4 KV heads, head dim 64,
		// vocab 32000, 2048 positions. 1,100,048,384 ("1.10B").
		Name: "tinyllama-1.1b", Layers: 22, Heads: 32, KVHeads: 4, HeadDim: 64,
		Dim: 2048, HiddenDim: 5632, Vocab: 32000, Context: 2048,
		Params: 1_100_048_384, Source: "TinyLlama (arXiv 2401.02385), TinyLlama-1.1B config",
	},
	{
		// GPT-3 175B (arXiv 2005.14165, table 2.1): 96 layers, d_model 12288,
		// 96 heads of d_head 128 (MHA), context 2048, vocab 50257, FFN 4·d.
		// Params is the paper's 175.0B; counting the architecture (12·d² per
		// layer plus biases, layer norms and the embeddings) gives ≈174.6B.
		Name: "gpt3-175b", Layers: 96, Heads: 96, KVHeads: 96, HeadDim: 128,
		Dim: 12288, HiddenDim: 4 * 12288, Vocab: 50257, Context: 2048,
		Params: 175_000_000_000, Source: "GPT-3 (arXiv 2005.14165), table 2.1",
	},
}

// Presets returns the built-in model shapes.
func Presets() []Model { return append([]Model(nil), presets...) }

// PresetNames lists the presets' names.
func PresetNames() []string {
	names := make([]string, len(presets))
	for i, p := range presets {
		names[i] = p.Name
	}
	return names
}

// Preset returns the preset called name (case-insensitive).
func Preset(name string) (Model, error) {
	for _, p := range presets {
		if strings.EqualFold(p.Name, name) {
			return p, nil
		}
	}
	return Model{}, fmt.Errorf("unknown preset %q (known: %s)", name, strings.Join(PresetNames(), ", "))
}
