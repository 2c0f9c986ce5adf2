// Package model holds the Llama-family transformer: its configuration, its
// weights and the forward pass (prefill of a chunk of tokens as a matrix,
// decode of one token) over a kvcache.
package model

import (
	"fmt"
	"math"
)

// RopeStyle says which pairs of a head's dimensions RoPE rotates together.
type RopeStyle int

const (
	// RopeInterleaved rotates adjacent pairs (x[2i], x[2i+1]): Meta's
	// original Llama layout, llama2.c, and GGUF architecture "llama".
	RopeInterleaved RopeStyle = iota
	// RopeNeoX rotates (x[i], x[i+d/2]): the Hugging Face layout, used by
	// GGUF architecture "qwen2".
	RopeNeoX
)

func (s RopeStyle) String() string {
	if s == RopeNeoX {
		return "neox"
	}
	return "interleaved"
}

// Config is the shape of a Llama-family model.
type Config struct {
	Arch      string    // GGUF general.architecture, e.g. "llama"
	Dim       int       // embedding width
	HiddenDim int       // SwiGLU inner width
	Layers    int       // transformer blocks
	Heads     int       // query heads
	KVHeads   int       // key/value heads (GQA: Heads is a multiple)
	HeadDim   int       // values per head
	Vocab     int       // token embedding rows
	CtxLen    int       // trained context length
	NormEps   float32   // RMSNorm epsilon
	RopeTheta float32   // RoPE base frequency
	Rope      RopeStyle // which dimension pairs RoPE rotates
	// QKNorm: each query and key head is RMS-normalised by its layer's
	// QNorm / KNorm ([HeadDim]) before RoPE (qwen3; Arch.QKNorm).
	QKNorm bool `json:",omitempty"`
	// Gemma's steps (gemma2, gemma3; Arch.Gemma): EmbedScale multiplies every
	// token's embedding (√Dim; 0: none); PostNorms RMS-normalises the
	// attention output and the FFN output by the layer's AttnPostNorm /
	// FFNPostNorm before each residual add; GELU makes the FFN GeGLU
	// (tanh-approximated GELU of the gate times up) instead of SwiGLU.
	EmbedScale float32 `json:",omitempty"`
	PostNorms  bool    `json:",omitempty"`
	GELU       bool    `json:",omitempty"`
	// AttnScale multiplies every query·key (0: 1/√HeadDim).
	AttnScale float32 `json:",omitempty"`
	// LocalRopeTheta is the RoPE base of the windowed layers (Window(i) >
	// 0), 0 for RopeTheta in every layer (gemma3's rope.freq_base_swa).
	LocalRopeTheta float32 `json:",omitempty"`
	// AttnSoftcap caps every scaled attention score s: c·tanh(s/c) before
	// the softmax (0: none; gemma2's attn_logit_softcapping).
	AttnSoftcap float32 `json:",omitempty"`
	// FinalSoftcap caps the logits: c·tanh(logit/c) (0: none;
	// {arch}.final_logit_softcapping).
	FinalSoftcap float32 `json:",omitempty"`

	// RoPE scaling (see RopeFreqs): Llama 3.1's per-pair frequency divisors
	// (GGUF tensor rope_freqs.weight, or rope.scaling.type "llama3"), nil
	// for none; and linear position scaling (rope.scaling.type "linear"),
	// positions divided by RopeScale (0 or 1: none).
	RopeFreqFactors []float32 `json:",omitempty"`
	RopeScale       float32   `json:",omitempty"`
	// LongRope is the Phi-3 LongRoPE factor set RopeFreqFactors holds,
	// "long" (rope_factors_long: CtxLen > RopeOrigCtx) or "short"
	// (rope_factors_short), chosen at load as llama.cpp chooses for its
	// context; "" for no LongRoPE. RopeOrigCtx is
	// rope.scaling.original_context_length (default CtxLen).
	LongRope    string `json:",omitempty"`
	RopeOrigCtx int    `json:",omitempty"`
	// RopeAttnFactor multiplies RoPE's cosines and sines, so every rotated
	// query and key (rope.scaling.attn_factor, Phi-3 LongRoPE's
	// √(1 + ln(CtxLen/RopeOrigCtx)/ln RopeOrigCtx); 0: 1), as llama.cpp's
	// ggml_rope_ext with its attn_factor.
	RopeAttnFactor float32 `json:",omitempty"`
	// SlidingWindow is the attention window of {arch}.attention.sliding_window
	// (0: none), applied in every layer by prefill, decode and DecodeBatch:
	// the query at position p sees the keys at positions p−W+1 … p, i.e. a
	// key at position j is visible iff 0 ≤ p − j < W (Hugging Face
	// Mistral's mask and llama.cpp's LLAMA_SWA_TYPE_STANDARD). W counts the
	// query's own position: W = 1 sees only itself. Positions are those the
	// cache stores (re-indexed ones after a PosReindex policy).
	SlidingWindow int `json:",omitempty"`
	// IgnoredSlidingWindow is a sliding_window key the architecture does
	// not apply (qwen2; see Archs), kept so that inspect can say so.
	IgnoredSlidingWindow int `json:",omitempty"`

	// KVSource is the KV source map ([Layers], model/kvmap.go): layer i
	// attends the KV of layer KVSource[i]. nil: every layer its own.
	KVSource []int `json:",omitempty"`
	// LayerWindows is each layer's attention window ([Layers], 0: full
	// causal attention). nil: SlidingWindow in every layer.
	LayerWindows []int `json:",omitempty"`
}

// GroupSize is the number of query heads that share one KV head.
func (c Config) GroupSize() int { return c.Heads / c.KVHeads }

// QDim is the width of all query heads together.
func (c Config) QDim() int { return c.Heads * c.HeadDim }

// KVDim is the width of all key (or value) heads together.
func (c Config) KVDim() int { return c.KVHeads * c.HeadDim }

// Validate rejects shapes the forward pass cannot run.
func (c Config) Validate() error {
	pos := []struct {
		name string
		v    int
	}{{"dim", c.Dim}, {"hidden_dim", c.HiddenDim}, {"layers", c.Layers}, {"heads", c.Heads},
		{"kv_heads", c.KVHeads}, {"head_dim", c.HeadDim}, {"vocab", c.Vocab}, {"context", c.CtxLen}}
	for _, p := range pos {
		if p.v <= 0 {
			return fmt.Errorf("model: %s must be positive, got %d", p.name, p.v)
		}
		if p.v > 1<<24 {
			return fmt.Errorf("model: %s = %d is implausibly large", p.name, p.v)
		}
	}
	if c.Heads%c.KVHeads != 0 {
		return fmt.Errorf("model: %d query heads are not a multiple of %d KV heads", c.Heads, c.KVHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("model: head dim %d is odd; RoPE needs pairs", c.HeadDim)
	}
	if !(c.NormEps > 0) || math.IsInf(float64(c.NormEps), 0) {
		return fmt.Errorf("model: RMSNorm epsilon %g must be positive", c.NormEps)
	}
	if !(c.RopeTheta > 1) || math.IsInf(float64(c.RopeTheta), 0) {
		return fmt.Errorf("model: RoPE theta %g must be > 1", c.RopeTheta)
	}
	if err := c.validateRopeScaling(); err != nil {
		return err
	}
	return c.validateKVMap()
}
