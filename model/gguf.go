package model

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
)

// LoadGGUF loads a model and its tokenizer from a GGUF file read into
// memory (gguf.Load): weights are used in place, in their stored type.
func LoadGGUF(path string) (*Model, tokenizer.Tokenizer, error) { return loadGGUF(path, gguf.Load) }

// MapGGUF is LoadGGUF over a memory mapping of the file (gguf.Open): it
// starts sooner and shares the page cache, and decodes more slowly.
func MapGGUF(path string) (*Model, tokenizer.Tokenizer, error) { return loadGGUF(path, gguf.Open) }

func loadGGUF(path string, open func(string) (*gguf.File, error)) (*Model, tokenizer.Tokenizer, error) {
	f, err := open(path)
	if err != nil {
		return nil, nil, err
	}
	m, tok, err := FromGGUF(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	m.closer = f.Close
	return m, tok, nil
}

// FromGGUF builds a model over an open GGUF file (which must stay open while
// the model is used).
func FromGGUF(f *gguf.File) (*Model, tokenizer.Tokenizer, error) {
	cfg, err := ConfigFromGGUF(f)
	if err != nil {
		return nil, nil, err
	}
	m := &Model{Config: cfg, Layers: make([]Layer, cfg.Layers)}
	// The embeddings are read a row at a time unless tied to the output
	// matrix: then they are a matrix product's weights too.
	_, untied := f.Tensor("output.weight")
	if m.TokEmb, err = ggufMatrix(f, "token_embd.weight", -1, cfg.Dim, !untied); err != nil {
		return nil, nil, err
	}
	m.Vocab = m.TokEmb.Rows
	m.Config.Vocab = m.Vocab
	if m.OutNorm, err = ggufVector(f, "output_norm.weight", cfg.Dim, false); err != nil {
		return nil, nil, err
	}
	if untied {
		if m.Output, err = ggufMatrix(f, "output.weight", m.Vocab, cfg.Dim, true); err != nil {
			return nil, nil, err
		}
	} else {
		m.Output = m.TokEmb
	}
	for i := range m.Layers {
		L := &m.Layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		own := cfg.Owns(i)
		if !own {
			// A layer that reads another's KV has no K/V projection: a file
			// that has one anyway is refused rather than half ignored.
			for _, name := range []string{"attn_k.weight", "attn_v.weight", "attn_k.bias", "attn_v.bias", "attn_k_norm.weight"} {
				if _, ok := f.Tensor(p + name); ok {
					return nil, nil, fmt.Errorf("model: tensor %s%s present, but layer %d reads layer %d's KV (%s.%s), so it has no K/V projection",
						p, name, i, cfg.Source(i), cfg.Arch, KeyKVSource)
				}
			}
		}
		mats := []struct {
			dst        **tensor.Matrix
			name       string
			rows, cols int
			kv         bool
		}{
			{&L.Wq, "attn_q.weight", cfg.QDim(), cfg.Dim, false},
			{&L.Wk, "attn_k.weight", cfg.KVDim(), cfg.Dim, true},
			{&L.Wv, "attn_v.weight", cfg.KVDim(), cfg.Dim, true},
			{&L.Wo, "attn_output.weight", cfg.Dim, cfg.QDim(), false},
			{&L.WGate, "ffn_gate.weight", cfg.HiddenDim, cfg.Dim, false},
			{&L.WUp, "ffn_up.weight", cfg.HiddenDim, cfg.Dim, false},
			{&L.WDown, "ffn_down.weight", cfg.Dim, cfg.HiddenDim, false},
		}
		fused := Archs[cfg.Arch].Fused
		if fused {
			if !own {
				return nil, nil, fmt.Errorf("model: %s has fused Q/K/V projections; a KV source map (%s.%s) is not supported", cfg.Arch, cfg.Arch, KeyKVSource)
			}
			// Q, K, V as row ranges of attn_qkv; gate and up of ffn_up.
			qkv, err := ggufSplit(f, p+"attn_qkv.weight", cfg.Dim, cfg.QDim(), cfg.KVDim(), cfg.KVDim())
			if err != nil {
				return nil, nil, err
			}
			L.Wq, L.Wk, L.Wv = qkv[0], qkv[1], qkv[2]
			gu, err := ggufSplit(f, p+"ffn_up.weight", cfg.Dim, cfg.HiddenDim, cfg.HiddenDim)
			if err != nil {
				return nil, nil, err
			}
			L.WGate, L.WUp = gu[0], gu[1]
			for _, name := range []string{"attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight"} {
				if _, ok := f.Tensor(p + name); ok {
					return nil, nil, fmt.Errorf("model: tensor %s%s present, but %s has fused projections (attn_qkv, ffn_up)", p, name, cfg.Arch)
				}
			}
		}
		for _, t := range mats {
			if t.kv && !own {
				continue
			}
			if fused && t.name != "attn_output.weight" && t.name != "ffn_down.weight" {
				continue
			}
			if *t.dst, err = ggufMatrix(f, p+t.name, t.rows, t.cols, true); err != nil {
				return nil, nil, err
			}
		}
		vecs := []struct {
			dst      *[]float32
			name     string
			n        int
			optional bool
			kv       bool
		}{
			{&L.AttnNorm, "attn_norm.weight", cfg.Dim, false, false},
			{&L.FFNNorm, "ffn_norm.weight", cfg.Dim, false, false},
			{&L.Bq, "attn_q.bias", cfg.QDim(), !Archs[cfg.Arch].Biases, false},
			{&L.Bk, "attn_k.bias", cfg.KVDim(), !Archs[cfg.Arch].Biases, true},
			{&L.Bv, "attn_v.bias", cfg.KVDim(), !Archs[cfg.Arch].Biases, true},
		}
		if cfg.QKNorm {
			vecs = append(vecs, []struct {
				dst      *[]float32
				name     string
				n        int
				optional bool
				kv       bool
			}{{&L.QNorm, "attn_q_norm.weight", cfg.HeadDim, false, false}, {&L.KNorm, "attn_k_norm.weight", cfg.HeadDim, false, true}}...)
		}
		if cfg.PostNorms {
			vecs = append(vecs, []struct {
				dst      *[]float32
				name     string
				n        int
				optional bool
				kv       bool
			}{{&L.AttnPost, "post_attention_norm.weight", cfg.Dim, false, false}, {&L.FFNPost, "post_ffw_norm.weight", cfg.Dim, false, false}}...)
		}
		for _, v := range vecs {
			if v.kv && !own {
				continue
			}
			if *v.dst, err = ggufVector(f, p+v.name, v.n, v.optional); err != nil {
				return nil, nil, err
			}
		}
	}
	if err := m.check(); err != nil {
		return nil, nil, err
	}
	tok, err := TokenizerFromGGUF(f)
	if err != nil {
		return nil, nil, err
	}
	return m, tok, nil
}

// ConfigFromGGUF reads the model shape from GGUF metadata.
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	var c Config
	arch, err := f.String("general.architecture")
	if err != nil {
		return c, err
	}
	a, ok := Archs[arch]
	if !ok {
		return c, fmt.Errorf("model: architecture %q is not supported (supported: %s)", arch, strings.Join(ArchNames(), ", "))
	}
	c.Arch = arch
	k := func(s string) string { return arch + "." + s }
	req := func(key string) (int, error) {
		v, err := f.Uint(k(key))
		if err != nil {
			return 0, err
		}
		if v == 0 || v > 1<<24 {
			return 0, fmt.Errorf("model: %s = %d is out of range", k(key), v)
		}
		return int(v), nil
	}
	opt := func(key string, def int) (int, error) {
		if _, ok := f.Lookup(k(key)); !ok {
			return def, nil
		}
		return req(key)
	}
	if c.Dim, err = req("embedding_length"); err != nil {
		return c, err
	}
	if c.HiddenDim, err = req("feed_forward_length"); err != nil {
		return c, err
	}
	if c.Layers, err = req("block_count"); err != nil {
		return c, err
	}
	if c.Heads, err = req("attention.head_count"); err != nil {
		return c, err
	}
	if c.KVHeads, err = opt("attention.head_count_kv", c.Heads); err != nil {
		return c, err
	}
	if c.CtxLen, err = req("context_length"); err != nil {
		return c, err
	}
	if c.Dim%c.Heads != 0 {
		if _, ok := f.Lookup(k("attention.key_length")); !ok {
			return c, fmt.Errorf("model: embedding length %d is not a multiple of %d heads", c.Dim, c.Heads)
		}
	}
	if c.HeadDim, err = opt("attention.key_length", c.Dim/max(c.Heads, 1)); err != nil {
		return c, err
	}
	if vl, err := opt("attention.value_length", c.HeadDim); err != nil {
		return c, err
	} else if vl != c.HeadDim {
		return c, fmt.Errorf("model: value length %d differs from key length %d: not supported", vl, c.HeadDim)
	}
	if rd, err := opt("rope.dimension_count", c.HeadDim); err != nil {
		return c, err
	} else if rd != c.HeadDim {
		return c, fmt.Errorf("model: partial RoPE (%d of %d dims) is not supported", rd, c.HeadDim)
	}
	c.NormEps, c.RopeTheta = 1e-5, 10000
	if _, ok := f.Lookup(k("attention.layer_norm_rms_epsilon")); ok {
		v, err := f.Float(k("attention.layer_norm_rms_epsilon"))
		if err != nil {
			return c, err
		}
		c.NormEps = float32(v)
	}
	if _, ok := f.Lookup(k("rope.freq_base")); ok {
		v, err := f.Float(k("rope.freq_base"))
		if err != nil {
			return c, err
		}
		c.RopeTheta = float32(v)
	}
	if err := archFromGGUF(f, a, &c); err != nil {
		return c, err
	}
	if err := kvMapFromGGUF(f, arch, &c); err != nil {
		return c, err
	}
	// The vocabulary size comes from the embedding tensor; validate the rest now.
	t, ok := f.Tensor("token_embd.weight")
	if !ok {
		return c, errors.New("model: missing tensor token_embd.weight")
	}
	if len(t.Shape) != 2 || t.Shape[1] == 0 || t.Shape[1] > 1<<24 {
		return c, fmt.Errorf("model: tensor token_embd.weight has shape %v, want [dim, vocab]", t.Shape)
	}
	c.Vocab = int(t.Shape[1])
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// kvMapFromGGUF reads the KV source map and the per-layer windows
// ({arch}.attention.kv_source, {arch}.attention.layer_window), when present;
// Validate checks them.
func kvMapFromGGUF(f *gguf.File, arch string, c *Config) error {
	read := func(key string) ([]int, error) {
		if _, ok := f.Lookup(arch + "." + key); !ok {
			return nil, nil
		}
		v, err := f.Int32s(arch + "." + key)
		if err != nil {
			return nil, err
		}
		if len(v) == 0 {
			return nil, fmt.Errorf("model: %s.%s is empty", arch, key)
		}
		out := make([]int, len(v))
		for i, x := range v {
			out[i] = int(x)
		}
		return out, nil
	}
	var err error
	if c.KVSource, err = read(KeyKVSource); err != nil {
		return err
	}
	// An explicit layer_window takes precedence over the windows an
	// architecture derives (gemma3's sliding_window_pattern).
	win, err := read(KeyLayerWindow)
	if err != nil {
		return err
	}
	if win != nil {
		c.LayerWindows = win
	}
	return nil
}

// ggufMatrix wraps a 2-D tensor (GGML shape [cols, rows]) as a matrix,
// checking its shape (rows < 0: any). The weights of matrix products
// (product) in a file read into memory (gguf.Load) are rearranged into
// panels where that helps decode (tensor.NewPanelMatrix).
func ggufMatrix(f *gguf.File, name string, rows, cols int, product bool) (*tensor.Matrix, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("model: missing tensor %s", name)
	}
	if len(t.Shape) != 2 || int(t.Shape[0]) != cols || (rows >= 0 && int(t.Shape[1]) != rows) {
		want := fmt.Sprintf("[%d %d]", cols, rows)
		if rows < 0 {
			want = fmt.Sprintf("[%d N]", cols)
		}
		return nil, fmt.Errorf("model: tensor %s has shape %v, config implies %s", name, t.Shape, want)
	}
	if !t.Type.Supported() {
		return nil, fmt.Errorf("model: tensor %s has type %s, which is not supported", name, t.Type)
	}
	wrap := tensor.NewMatrix
	if product && f.Writable() {
		wrap = tensor.NewPanelMatrix
	}
	m, err := wrap(t.Type, int(t.Shape[1]), int(t.Shape[0]), f.TensorData(t))
	if err != nil {
		return nil, fmt.Errorf("model: tensor %s: %w", name, err)
	}
	return m, nil
}

// ggufSplit wraps consecutive row ranges (of rows[i] rows each, of cols
// values) of one 2-D tensor as matrices: the parts of a fused projection.
func ggufSplit(f *gguf.File, name string, cols int, rows ...int) ([]*tensor.Matrix, error) {
	total := 0
	for _, r := range rows {
		total += r
	}
	t, ok := f.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("model: missing tensor %s", name)
	}
	if len(t.Shape) != 2 || int(t.Shape[0]) != cols || int(t.Shape[1]) != total {
		return nil, fmt.Errorf("model: tensor %s has shape %v, config implies [%d %d]", name, t.Shape, cols, total)
	}
	if !t.Type.Supported() {
		return nil, fmt.Errorf("model: tensor %s has type %s, which is not supported", name, t.Type)
	}
	rb, err := t.Type.RowBytes(cols)
	if err != nil {
		return nil, fmt.Errorf("model: tensor %s: %w", name, err)
	}
	wrap := tensor.NewMatrix
	if f.Writable() {
		wrap = tensor.NewPanelMatrix
	}
	data := f.TensorData(t)
	out := make([]*tensor.Matrix, len(rows))
	r0 := 0
	for i, r := range rows {
		if out[i], err = wrap(t.Type, r, cols, data[r0*rb:(r0+r)*rb]); err != nil {
			return nil, fmt.Errorf("model: tensor %s: %w", name, err)
		}
		r0 += r
	}
	return out, nil
}

// ggufVector reads a 1-D tensor of n values as float32 (a copy).
func ggufVector(f *gguf.File, name string, n int, optional bool) ([]float32, error) {
	t, ok := f.Tensor(name)
	if !ok {
		if optional {
			return nil, nil
		}
		return nil, fmt.Errorf("model: missing tensor %s", name)
	}
	if len(t.Shape) != 1 || int(t.Shape[0]) != n {
		return nil, fmt.Errorf("model: tensor %s has shape %v, config implies [%d]", name, t.Shape, n)
	}
	if !t.Type.Supported() {
		return nil, fmt.Errorf("model: tensor %s has type %s, which is not supported", name, t.Type)
	}
	v := make([]float32, n)
	if err := tensor.Dequantize(t.Type, f.TensorData(t), v); err != nil {
		return nil, fmt.Errorf("model: tensor %s: %w", name, err)
	}
	return v, nil
}

// TokenizerFromGGUF builds the tokenizer the GGUF metadata describes.
func TokenizerFromGGUF(f *gguf.File) (tokenizer.Tokenizer, error) {
	kind, err := f.String("tokenizer.ggml.model")
	if err != nil {
		return nil, err
	}
	switch kind {
	case "llama":
	case "gpt2":
		return bpeFromGGUF(f)
	default:
		return nil, fmt.Errorf("model: tokenizer.ggml.model %q is not supported (supported: llama, gpt2)", kind)
	}
	pieces, err := f.Strings("tokenizer.ggml.tokens")
	if err != nil {
		return nil, err
	}
	var scores []float32
	if _, ok := f.Lookup("tokenizer.ggml.scores"); ok {
		if scores, err = f.Float32s("tokenizer.ggml.scores"); err != nil {
			return nil, err
		}
	}
	var types []int32
	if _, ok := f.Lookup("tokenizer.ggml.token_type"); ok {
		if types, err = f.Int32s("tokenizer.ggml.token_type"); err != nil {
			return nil, err
		}
	}
	id := func(key string, def int) (int, error) {
		if _, ok := f.Lookup(key); !ok {
			return def, nil
		}
		v, err := f.Uint(key)
		if err != nil {
			return 0, err
		}
		if v >= uint64(len(pieces)) {
			return 0, fmt.Errorf("model: %s = %d is outside the vocabulary of %d", key, v, len(pieces))
		}
		return int(v), nil
	}
	bos, err := id("tokenizer.ggml.bos_token_id", 1)
	if err != nil {
		return nil, err
	}
	eos, err := id("tokenizer.ggml.eos_token_id", 2)
	if err != nil {
		return nil, err
	}
	unk, err := id("tokenizer.ggml.unknown_token_id", 0)
	if err != nil {
		return nil, err
	}
	return tokenizer.NewSentencePiece(pieces, scores, types, bos, eos, unk)
}

// bpeFromGGUF builds a byte-level BPE tokenizer (tokenizer.ggml.model
// "gpt2") from tokens, token_type, merges and pre.
func bpeFromGGUF(f *gguf.File) (tokenizer.Tokenizer, error) {
	var c tokenizer.BPEConfig
	var err error
	if c.Tokens, err = f.Strings("tokenizer.ggml.tokens"); err != nil {
		return nil, err
	}
	if _, ok := f.Lookup("tokenizer.ggml.token_type"); ok {
		if c.Types, err = f.Int32s("tokenizer.ggml.token_type"); err != nil {
			return nil, err
		}
	}
	if c.Merges, err = f.Strings("tokenizer.ggml.merges"); err != nil {
		return nil, err
	}
	c.Pre = "default"
	if _, ok := f.Lookup("tokenizer.ggml.pre"); ok {
		if c.Pre, err = f.String("tokenizer.ggml.pre"); err != nil {
			return nil, err
		}
	}
	id := func(key string) (int, error) {
		if _, ok := f.Lookup(key); !ok {
			return -1, nil
		}
		v, err := f.Uint(key)
		if err != nil {
			return 0, err
		}
		if v >= uint64(len(c.Tokens)) {
			return 0, fmt.Errorf("model: %s = %d is outside the vocabulary of %d", key, v, len(c.Tokens))
		}
		return int(v), nil
	}
	if c.BOS, err = id("tokenizer.ggml.bos_token_id"); err != nil {
		return nil, err
	}
	if c.EOS, err = id("tokenizer.ggml.eos_token_id"); err != nil {
		return nil, err
	}
	flag := func(key string, def bool) (bool, error) {
		if _, ok := f.Lookup(key); !ok {
			return def, nil
		}
		return f.Bool(key)
	}
	if c.AddBOS, err = flag("tokenizer.ggml.add_bos_token", c.Pre == "llama-bpe" || c.Pre == "llama3" || c.Pre == "llama-v3"); err != nil {
		return nil, err
	}
	if c.AddEOS, err = flag("tokenizer.ggml.add_eos_token", false); err != nil {
		return nil, err
	}
	tok, err := tokenizer.NewBPE(c)
	if err != nil {
		if strings.Contains(err.Error(), "pre-tokenizer") {
			return nil, fmt.Errorf("model: tokenizer.ggml.pre %q is not supported (supported: %s)", c.Pre, strings.Join(tokenizer.Pretokenizers, ", "))
		}
		return nil, err
	}
	return tok, nil
}
