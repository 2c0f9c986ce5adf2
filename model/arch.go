package model

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/tensor"
)

// Arch describes a GGUF general.architecture the loader runs. Every one is
// llama-shaped (RMSNorm, RoPE attention with GQA, SwiGLU FFN); they differ
// in the RoPE convention and in optional tensors.
type Arch struct {
	Name string
	// Rope is the pair layout llama.cpp uses for the architecture
	// (LLAMA_ROPE_TYPE_NORM: interleaved; LLAMA_ROPE_TYPE_NEOX: halves).
	Rope RopeStyle
	// Biases: the architecture has Q/K/V biases (blk.N.attn_{q,k,v}.bias).
	Biases bool
	// Window: {arch}.attention.sliding_window, when present, is the
	// attention window of every layer (Config.SlidingWindow). Without it
	// the key is read but not applied (Config.IgnoredSlidingWindow).
	Window bool
	// QKNorm: every query and key head is RMS-normalised (weights
	// blk.N.attn_q_norm / attn_k_norm, [HeadDim] each) after its projection
	// and before RoPE (Qwen 3).
	QKNorm bool
	// Gemma: Gemma's steps (Config.EmbedScale, PostNorms, GELU), its
	// query scale, an optional final_logit_softcapping, and local/global
	// layers: attention.sliding_window (SWADefault when absent; 0: no
	// local layers) on the layers attention.sliding_window_pattern
	// (SWAPattern when absent) leaves local, i % pattern < pattern − 1,
	// with RoPE base rope.freq_base_swa (LocalTheta when absent; 0: the
	// global base), all as llama.cpp reads them.
	Gemma      bool
	SWADefault int
	SWAPattern int
	LocalTheta float32
	// BigLayers is the layer count of the model whose query scale is
	// 1/√(Dim/Heads) instead of 1/√HeadDim (the 27B's query_pre_attn_scalar,
	// which GGUF does not carry; llama.cpp tells it by its layer count).
	BigLayers int
	// Softcaps: attention logits are soft-capped by attn_logit_softcapping
	// (default 50) and the final logits by final_logit_softcapping
	// (default 30), always (Gemma 2).
	Softcaps bool
	// Fused: the Q, K and V projections are one matrix (blk.N.attn_qkv,
	// rows Q then K then V) and the FFN's gate and up one (blk.N.ffn_up,
	// 2·HiddenDim rows, gate first), as Phi-3.
	Fused bool
}

// Archs are the supported architectures. SmolLM, TinyLlama and Mistral
// 7B GGUFs are written as "llama"; "mistral" is accepted as its alias.
//
// A sliding window is applied where the file states one for every layer:
// "mistral" (Mistral 7B v0.1's 4096) and "llama" (a Mistral written as
// llama with the key; llama.cpp's converter leaves it out). Qwen2 is
// not windowed: its Hugging Face config carries sliding_window even when
// use_sliding_window is false (the released models), and when true windows
// only the layers from max_window_layers on; GGUF has neither key, and
// llama.cpp runs qwen2 with full attention, as kvlm does.
//
// Phi-3's attention.sliding_window (2047 in Phi-3-mini) is read but not
// applied, as llama.cpp does.
var Archs = map[string]Arch{
	"llama":   {Name: "llama", Rope: RopeInterleaved, Window: true},
	"mistral": {Name: "mistral", Rope: RopeInterleaved, Window: true},
	"qwen2":   {Name: "qwen2", Rope: RopeNeoX, Biases: true},
	"qwen3":   {Name: "qwen3", Rope: RopeNeoX, QKNorm: true},
	"phi3":    {Name: "phi3", Rope: RopeNeoX, Fused: true},
	"gemma2":  {Name: "gemma2", Rope: RopeNeoX, Gemma: true, SWADefault: 4096, SWAPattern: 2, BigLayers: 46, Softcaps: true},
	"gemma3":  {Name: "gemma3", Rope: RopeNeoX, QKNorm: true, Gemma: true, SWAPattern: 6, LocalTheta: 10000, BigLayers: 62},
}

// ArchNames lists the supported architectures, sorted.
func ArchNames() []string {
	names := make([]string, 0, len(Archs))
	for n := range Archs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// RopeFreqs returns the RoPE frequency of each of the HeadDim/2 dimension
// pairs: run.c's 1/theta^(2j/head_dim) in float32, divided by the pair's
// frequency factor (Llama 3.1) and by the linear scale. The angle of pair j
// at position p is p·RopeFreqs()[j].
func (c Config) RopeFreqs() []float32 {
	half := c.HeadDim / 2
	freq := make([]float32, half)
	for j := range freq {
		freq[j] = 1 / float32(math.Pow(float64(c.RopeTheta), float64(float32(2*j)/float32(c.HeadDim))))
		if c.RopeFreqFactors != nil {
			freq[j] /= c.RopeFreqFactors[j]
		}
		if c.RopeScale > 0 && c.RopeScale != 1 {
			freq[j] /= c.RopeScale
		}
	}
	return freq
}

func (c Config) validateRopeScaling() error {
	if c.RopeFreqFactors != nil {
		if len(c.RopeFreqFactors) != c.HeadDim/2 {
			return fmt.Errorf("model: %d RoPE frequency factors for head dim %d (want %d)", len(c.RopeFreqFactors), c.HeadDim, c.HeadDim/2)
		}
		for j, f := range c.RopeFreqFactors {
			if !(f > 0) || math.IsInf(float64(f), 0) {
				return fmt.Errorf("model: RoPE frequency factor %d is %g; factors must be positive", j, f)
			}
		}
	}
	if c.RopeAttnFactor < 0 || math.IsNaN(float64(c.RopeAttnFactor)) || math.IsInf(float64(c.RopeAttnFactor), 0) {
		return fmt.Errorf("model: RoPE attention factor %g must be positive", c.RopeAttnFactor)
	}
	if c.RopeScale < 0 || math.IsNaN(float64(c.RopeScale)) || math.IsInf(float64(c.RopeScale), 0) {
		return fmt.Errorf("model: RoPE linear scale %g must be positive", c.RopeScale)
	}
	if c.SlidingWindow < 0 || c.SlidingWindow > 1<<30 {
		return fmt.Errorf("model: sliding window %d is out of range [0, 2^30]", c.SlidingWindow)
	}
	return nil
}

// Llama3RopeFactors computes Llama 3.1's per-pair frequency divisors from
// its rope_scaling (type "llama3"): pairs of short wavelength keep their
// frequency, long ones are divided by factor, and those between are
// interpolated smoothly. This is what converters store as rope_freqs.weight.
func Llama3RopeFactors(headDim int, theta, factor, lowFreq, highFreq float64, origCtx int) []float32 {
	half := headDim / 2
	out := make([]float32, half)
	lowWave := float64(origCtx) / lowFreq
	highWave := float64(origCtx) / highFreq
	for j := range out {
		freq := 1 / math.Pow(theta, float64(2*j)/float64(headDim))
		wave := 2 * math.Pi / freq
		switch {
		case wave < highWave:
			out[j] = 1
		case wave > lowWave:
			out[j] = float32(factor)
		default:
			smooth := (float64(origCtx)/wave - lowFreq) / (highFreq - lowFreq)
			out[j] = float32(1 / ((1-smooth)/factor + smooth))
		}
	}
	return out
}

// gemmaLayers sets Gemma's local/global layers from its window w (0:
// every layer global): layer i is local (window w, RoPE base
// rope.freq_base_swa) when i % pattern < pattern − 1, as llama.cpp's
// set_swa_pattern; pattern is attention.sliding_window_pattern, default
// a.SWAPattern.
func gemmaLayers(f *gguf.File, a Arch, c *Config, w int) error {
	if w == 0 {
		return nil
	}
	key := a.Name + ".attention.sliding_window_pattern"
	pattern := a.SWAPattern
	if kv, ok := f.Lookup(key); ok {
		if _, arr := kv.Value.(gguf.Array); arr {
			// gemma3n's converter writes a per-layer bool array; llama.cpp
			// (get_key_or_arr into one uint32) reads only a number for
			// gemma2 and gemma3 and on an array keeps the default period
			// silently, so no file it runs needs one: refused.
			return fmt.Errorf("model: %s is an array (per-layer, as gemma3n's); %s takes a number, the period of the global layers (llama.cpp ignores an array here)", key, a.Name)
		}
		v, err := f.Uint(key)
		if err != nil {
			return fmt.Errorf("model: %s: %w", key, err)
		}
		if v > 1<<20 {
			return fmt.Errorf("model: %s = %d is out of range", key, v)
		}
		pattern = int(v)
	}
	c.LayerWindows = make([]int, c.Layers)
	for i := range c.LayerWindows {
		if pattern == 0 || i%pattern < pattern-1 {
			c.LayerWindows[i] = w
		}
	}
	c.LocalRopeTheta = a.LocalTheta
	if key := a.Name + ".rope.freq_base_swa"; hasKey(f, key) {
		v, err := f.Float(key)
		if err != nil {
			return err
		}
		if !(v > 1) || math.IsInf(v, 0) {
			return fmt.Errorf("model: %s = %g must be > 1", key, v)
		}
		c.LocalRopeTheta = float32(v)
	}
	return nil
}

func hasKey(f *gguf.File, key string) bool { _, ok := f.Lookup(key); return ok }

// longRope reads Phi-3's LongRoPE (the 128K-context models): two sets of
// per-pair frequency divisors, rope_factors_long and rope_factors_short
// ([HeadDim/2] each), of which llama.cpp uses the long one when its
// context exceeds rope.scaling.original_context_length (default: the
// trained context) and the short one otherwise, choosing once for the
// context it is created with (llama_model::get_rope_factors), not per
// token as Hugging Face does. kvlm's context is the trained one
// (context_length), so it picks the set for that at load: the long one for
// a real 128K file, as llama.cpp at its default context. Config.LongRope
// says which.
func longRope(f *gguf.File, a Arch, c *Config, long, short *gguf.TensorInfo) error {
	if a.Name != "phi3" {
		return fmt.Errorf("model: tensor rope_factors_long/short.weight (LongRoPE): llama.cpp reads them for phi3 only, not %s", a.Name)
	}
	if long == nil || short == nil {
		return errors.New("model: LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight; the file has one")
	}
	if _, ok := f.Tensor("rope_freqs.weight"); ok {
		return errors.New("model: tensor rope_freqs.weight beside LongRoPE's rope_factors_long/short.weight: a phi3 file has one kind of RoPE factors")
	}
	key := a.Name + ".rope.scaling.original_context_length"
	orig := c.CtxLen
	if hasKey(f, key) {
		v, err := f.Uint(key)
		if err != nil {
			return err
		}
		if v == 0 || v > 1<<30 {
			return fmt.Errorf("model: %s = %d is out of range", key, v)
		}
		orig = int(v)
	}
	t, name := short, "short"
	if c.CtxLen > orig {
		t, name = long, "long"
	}
	tn := "rope_factors_" + name + ".weight"
	if len(t.Shape) != 1 || int(t.Shape[0]) != c.HeadDim/2 {
		return fmt.Errorf("model: tensor %s has shape %v, want [%d]", tn, t.Shape, c.HeadDim/2)
	}
	if !t.Type.Supported() {
		return fmt.Errorf("model: tensor %s has type %s, which is not supported", tn, t.Type)
	}
	v := make([]float32, c.HeadDim/2)
	if err := tensor.Dequantize(t.Type, f.TensorData(t), v); err != nil {
		return fmt.Errorf("model: tensor %s: %w", tn, err)
	}
	c.RopeFreqFactors, c.LongRope, c.RopeOrigCtx = v, name, orig
	return nil
}

// archFromGGUF reads the architecture-dependent settings: the RoPE style,
// RoPE scaling and the sliding window. c.HeadDim and c.RopeTheta must be set.
func archFromGGUF(f *gguf.File, a Arch, c *Config) error {
	c.Rope = a.Rope
	c.QKNorm = a.QKNorm
	k := func(s string) string { return a.Name + "." + s }
	has := func(key string) bool { _, ok := f.Lookup(k(key)); return ok }
	float := func(key string, def float64) (float64, error) {
		if !has(key) {
			return def, nil
		}
		v, err := f.Float(k(key))
		if err != nil {
			return 0, err
		}
		if !(v > 0) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("model: %s = %g must be positive", k(key), v)
		}
		return v, nil
	}
	window := a.SWADefault
	if has("attention.sliding_window") {
		w, err := f.Uint(k("attention.sliding_window"))
		if err != nil {
			return err
		}
		if w > 1<<30 {
			return fmt.Errorf("model: %s = %d is out of range", k("attention.sliding_window"), w)
		}
		if a.Gemma {
			window = int(w)
		} else if a.Window {
			c.SlidingWindow = int(w)
		} else {
			c.IgnoredSlidingWindow = int(w)
		}
	}
	if a.Gemma {
		if err := gemmaLayers(f, a, c, window); err != nil {
			return err
		}
		c.EmbedScale = float32(math.Sqrt(float64(c.Dim)))
		c.PostNorms, c.GELU = true, true
		// llama.cpp's (and gemma_pytorch's) query scale: 1/√(Dim/Heads) for
		// the 27B (query_pre_attn_scalar 144 / 168), 1/√HeadDim otherwise.
		if c.Layers == a.BigLayers {
			c.AttnScale = float32(1 / math.Sqrt(float64(c.Dim/c.Heads)))
		}
		def := 0.0
		if a.Softcaps {
			def = 30
			v, err := float("attn_logit_softcapping", 50)
			if err != nil {
				return err
			}
			c.AttnSoftcap = float32(v)
		}
		v, err := float("final_logit_softcapping", def)
		if err != nil {
			return err
		}
		c.FinalSoftcap = float32(v)
	}
	typ := ""
	if has("rope.scaling.type") {
		s, err := f.String(k("rope.scaling.type"))
		if err != nil {
			return err
		}
		typ = strings.ToLower(s)
	}
	switch typ {
	case "", "none":
		// The older key of linear scaling.
		v, err := float("rope.scale_linear", 1)
		if err != nil {
			return err
		}
		c.RopeScale = float32(v)
	case "linear":
		v, err := float("rope.scaling.factor", 1)
		if err != nil {
			return err
		}
		c.RopeScale = float32(v)
	case "llama3":
		factor, err := float("rope.scaling.factor", 8)
		if err != nil {
			return err
		}
		low, err := float("rope.scaling.low_freq_factor", 1)
		if err != nil {
			return err
		}
		high, err := float("rope.scaling.high_freq_factor", 4)
		if err != nil {
			return err
		}
		if high <= low {
			return fmt.Errorf("model: %s %g must exceed %s %g", k("rope.scaling.high_freq_factor"), high, k("rope.scaling.low_freq_factor"), low)
		}
		orig := 8192
		if has("rope.scaling.original_context_length") {
			v, err := f.Uint(k("rope.scaling.original_context_length"))
			if err != nil {
				return err
			}
			if v == 0 || v > 1<<30 {
				return fmt.Errorf("model: %s = %d is out of range", k("rope.scaling.original_context_length"), v)
			}
			orig = int(v)
		}
		c.RopeFreqFactors = Llama3RopeFactors(c.HeadDim, float64(c.RopeTheta), factor, low, high, orig)
	default:
		return fmt.Errorf("model: %s = %q is not supported (supported: none, linear, llama3)", k("rope.scaling.type"), typ)
	}
	// rope.scaling.attn_factor multiplies RoPE's cosines and sines (llama.cpp
	// reads it for every architecture; Phi-3's 128K models carry it).
	af, err := float("rope.scaling.attn_factor", 1)
	if err != nil {
		return err
	}
	if af != 1 {
		c.RopeAttnFactor = float32(af)
	}
	long, _ := f.Tensor("rope_factors_long.weight")
	short, _ := f.Tensor("rope_factors_short.weight")
	if long != nil || short != nil {
		return longRope(f, a, c, long, short)
	}
	// Precomputed factors, as llama.cpp's converter writes them for Llama
	// 3.1 and later, take precedence.
	if t, ok := f.Tensor("rope_freqs.weight"); ok {
		if len(t.Shape) != 1 || int(t.Shape[0]) != c.HeadDim/2 {
			return fmt.Errorf("model: tensor rope_freqs.weight has shape %v, want [%d]", t.Shape, c.HeadDim/2)
		}
		if !t.Type.Supported() {
			return fmt.Errorf("model: tensor rope_freqs.weight has type %s, which is not supported", t.Type)
		}
		v := make([]float32, c.HeadDim/2)
		if err := tensor.Dequantize(t.Type, f.TensorData(t), v); err != nil {
			return fmt.Errorf("model: tensor rope_freqs.weight: %w", err)
		}
		c.RopeFreqFactors = v
	}
	return nil
}
