// Package kvcalc sizes KV caches: the bytes a model's cache takes per token
// and for a batch of sequences, in any of the kvcache codecs (keys and
// values each in their own), under a token budget, and against the size of
// the model's weights. Models come from built-in presets or from a GGUF or
// llama2.c file.
//
// Two sizes are given. The pool's bytes are the source of truth: what a
// kvlm block pool of those codecs holds (kvcache.Footprint, by which
// kvcache.NewPool allocates and --kv-mem is divided into blocks):
//
//	per_token = layers · kv_heads · block_bytes / block_tokens
//	block_bytes = keys + values (codec metadata included) + 4 · block_tokens (positions)
//	total     = batch · layers · kv_heads · (⌈kept / block_tokens⌉ · block_bytes)
//
// with KIVI's sealing instead of the ceiling (see kvcache.Footprint.Table).
// layers are the KV owners of the model's KV source map (kvmap.go: CLA,
// YOCO, LCKV, …); a window-bounded one holds what its window sees (blocks
// freed as they slide out, kvcache.Footprint.WindowTable) and adds nothing
// per token once full.
// The formula is the textbook count, without positions or blocks:
//
//	formula_per_token = 2 · layers · kv_heads · head_dim · b/8 bytes
//	formula_total     = formula_per_token · tokens · batch
//
// with b counting the codec's metadata (scales, zero points), and K and V
// each at their own b. The formula counts KIVI's f16 residual as the last
// min(tokens, 128) tokens of every sequence.
package kvcalc

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
)

// Model is what the calculation needs to know of a model.
type Model struct {
	Name    string `json:"name"`
	Layers  int    `json:"layers"`
	Heads   int    `json:"heads"`    // query heads
	KVHeads int    `json:"kv_heads"` // key/value heads
	HeadDim int    `json:"head_dim"`
	Context int    `json:"context,omitempty"` // trained context length (0: unknown)

	// Shape of the rest of the model (informative).
	Dim       int  `json:"dim,omitempty"`
	HiddenDim int  `json:"hidden_dim,omitempty"`
	Vocab     int  `json:"vocab,omitempty"`
	QKVBias   bool `json:"-"`

	// Params is the number of weight parameters.
	Params int64 `json:"params"`
	// StoredBytes is the size of the weights as stored in the file the
	// model was read from (the sum of its tensors' sizes); 0 for presets.
	StoredBytes int64 `json:"stored_bytes,omitempty"`
	// Source says where the shape comes from: a paper and config, or a path.
	Source string `json:"source,omitempty"`

	// The KV source map (kvmap.go), as a GGUF stores it: KVSource[i] is
	// the layer whose KV layer i attends (nil: its own), LayerWindows[i]
	// layer i's attention window (nil: SlidingWindow in every layer; 0:
	// full attention). Only the layers some layer reads are cached, and
	// those read only by windows keep only what the windows see.
	KVSource      []int `json:"kv_source,omitempty"`
	LayerWindows  []int `json:"layer_window,omitempty"`
	SlidingWindow int   `json:"sliding_window,omitempty"`
}

// Validate rejects a shape the formula cannot use.
func (m Model) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", m.Layers}, {"kv_heads", m.KVHeads}, {"head_dim", m.HeadDim}} {
		if f.v <= 0 {
			return fmt.Errorf("kvcalc: model %s: %s must be positive, got %d", m.Name, f.name, f.v)
		}
	}
	return m.validateMap()
}

// Weights is a weight storage type: a GGML tensor type, all parameters
// stored in it.
type Weights struct {
	Name string       // as the user wrote it, lower case
	Type tensor.DType // GGML type
}

// ParseWeights reads a weight type: any GGML type name (f32, f16, bf16,
// q8_0, q4_0, q4_k, q6_k, ...), with fp32 and fp16 as aliases.
func ParseWeights(name string) (Weights, error) {
	n := strings.ToLower(name)
	switch n {
	case "fp32":
		n = "f32"
	case "fp16":
		n = "f16"
	}
	t, err := tensor.ParseDType(n)
	if err != nil || t.BitsPerValue() == 0 {
		return Weights{}, fmt.Errorf("unknown weights type %q (e.g. f32, f16, bf16, q8_0, q4_0, q4_k, q6_k)", name)
	}
	return Weights{Name: n, Type: t}, nil
}

// Bytes is the storage of n parameters of this type, block metadata
// included (rounded to whole bytes; real files keep norms in f32, which is
// ignored).
func (w Weights) Bytes(n int64) int64 {
	return int64(math.Round(float64(n) * w.Type.BitsPerValue() / 8))
}

// Options choose the cache's codecs, the weights' type and a token budget.
type Options struct {
	K, V Codec // codecs of keys and values ("" = f16)
	// Weights is the weight type to size the weights with. The zero value
	// means the file's stored size for a model read from a file, f16 for a
	// preset.
	Weights Weights
	// At most one of Ratio and Budget: the fraction of tokens each sequence
	// keeps (0 < Ratio ≤ 1; kept = ⌈Ratio·seq⌉), or the tokens it keeps
	// (kept = min(Budget, seq)). Zero means all tokens.
	Ratio  float64
	Budget int
	// BlockTokens is the pool's block size (0: kvcache.DefaultBlockTokens,
	// as --kv-block).
	BlockTokens int
	// Chunk is the most tokens one append brings (a prefill chunk, as
	// generate/serve --chunk; 0: model.DefaultChunk): a window-bounded
	// layer holds at most its window, a chunk and a block.
	Chunk int
}

func (o Options) codecs() (Codec, Codec) {
	k, v := o.K, o.V
	if k == "" {
		k = F16
	}
	if v == "" {
		v = F16
	}
	return k, v
}

// Validate checks the codecs and the budget.
func (o Options) Validate() error {
	k, v := o.codecs()
	if _, err := ParseCodec(string(k)); err != nil {
		return err
	}
	if _, err := ParseCodec(string(v)); err != nil {
		return err
	}
	if o.Ratio != 0 && o.Budget != 0 {
		return errors.New("give a ratio or a token budget, not both")
	}
	if o.Ratio != 0 && !(o.Ratio > 0 && o.Ratio <= 1) { // also rejects NaN
		return fmt.Errorf("KV ratio %g is outside (0, 1]", o.Ratio)
	}
	if o.Budget < 0 {
		return fmt.Errorf("KV budget %d must be positive", o.Budget)
	}
	if o.BlockTokens < 0 {
		return fmt.Errorf("KV block size %d must be positive", o.BlockTokens)
	}
	if o.Chunk < 0 {
		return fmt.Errorf("chunk %d must be positive", o.Chunk)
	}
	return nil
}

// Row is the cache of one batch of sequences of one length.
type Row struct {
	Batch int `json:"batch"`
	Seq   int `json:"seq"` // tokens per sequence
	// Kept is the tokens each sequence caches after the budget (= Seq
	// without one); Residual of them wait in a KIVI codec's f16 residual
	// (the pool's count: those not yet sealed into blocks).
	Kept     int `json:"kept_tokens"`
	Residual int `json:"residual_tokens"`
	// Blocks is the pool blocks one sequence takes, over all its (layer,
	// KV head) tables (KV owners only; window-bounded ones hold what
	// their window sees).
	Blocks int64 `json:"blocks"`
	// BytesPerToken is the pool's cache of one token over all layers, K
	// and V and its positions, in full blocks (for KIVI, sealed tokens;
	// tokens in the residual cost ResidualBytesPerToken).
	BytesPerToken         float64 `json:"bytes_per_token"`
	ResidualBytesPerToken float64 `json:"residual_bytes_per_token,omitempty"`
	// KVMemBytes is the --kv-mem (block arena) that admits the batch
	// however its tokens arrive: ⌈kept / block_tokens⌉ blocks per (layer, KV
	// head) of every sequence (kvcache.Footprint.AdmitBlocks). TotalBytes
	// without KIVI; with KIVI more than its blocks, since it counts the
	// residual's tokens as if in blocks (a bound: the engine admits by the
	// cache's exact kvcache.Pool.AdmitBytes), and the residual buffers are
	// allocated beside the arena.
	KVMemBytes int64 `json:"kv_mem_bytes"`
	// TotalBytes is the whole batch's cache in the pool: whole blocks and
	// KIVI residual buffers, once each sequence's kept tokens were
	// appended a chunk at a time. WindowBytes is the part of it in
	// window-bounded layers.
	TotalBytes   int64   `json:"total_bytes"`
	WindowBytes  int64   `json:"window_bytes,omitempty"`
	TotalGB      float64 `json:"total_gb"`  // 10^9 bytes
	TotalGiB     float64 `json:"total_gib"` // 2^30 bytes
	WeightsBytes int64   `json:"weights_bytes"`
	KVToWeights  float64 `json:"kv_to_weights"`
	// KVPlusWeightsBytes is the cache and the weights together.
	KVPlusWeightsBytes int64 `json:"kv_plus_weights_bytes"`

	// The formula (package doc): per token at the codecs' rates, without
	// positions or blocks; its total rounded up to a byte, KIVI's last
	// min(kept, 128) tokens at 16 bits.
	FormulaBytesPerToken         float64 `json:"formula_bytes_per_token"`
	FormulaResidualBytesPerToken float64 `json:"formula_residual_bytes_per_token,omitempty"`
	FormulaTotalBytes            int64   `json:"formula_total_bytes"`
}

// Calc holds a model and options once validated, and computes rows.
type Calc struct {
	Model        Model
	K, V         Codec
	KBits, VBits float64 // bits per value, metadata included (KIVI: quantized)
	Weights      string  // the weight type the weights were sized with, or "stored"
	WeightsBytes int64
	opt          Options
	kTok, vTok   int64 // bits of one token in one (layer, KV head), quantized
	// Pool is what one (layer, KV head) table of a kvlm pool stores in
	// these codecs and blocks.
	Pool kvcache.Footprint
	// Layout is the cache the pool keeps: one layer per KV owner, with
	// the windows that bound them; Chunk the tokens of one append.
	Layout kvcache.Layout
	Chunk  int
}

// New validates a model and options.
func New(m Model, o Options) (*Calc, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	c := &Calc{Model: m, opt: o, Layout: m.Layout(), Chunk: o.Chunk}
	if c.Chunk == 0 {
		c.Chunk = model.DefaultChunk
	}
	c.K, c.V = o.codecs()
	var err error
	if c.kTok, err = c.K.keyBitsPerToken(m.HeadDim); err != nil {
		return nil, err
	}
	if c.vTok, err = c.V.valueBitsPerToken(m.HeadDim); err != nil {
		return nil, err
	}
	c.KBits = float64(c.kTok) / float64(m.HeadDim)
	c.VBits = float64(c.vTok) / float64(m.HeadDim)
	if c.Pool, err = PoolFootprint(c.K, c.V, o.BlockTokens, m.HeadDim); err != nil {
		return nil, err
	}
	switch {
	case o.Weights.Name != "":
		c.Weights, c.WeightsBytes = o.Weights.Name, o.Weights.Bytes(m.Params)
	case m.StoredBytes > 0:
		c.Weights, c.WeightsBytes = "stored", m.StoredBytes
	default:
		w, _ := ParseWeights("f16")
		c.Weights, c.WeightsBytes = w.Name, w.Bytes(m.Params)
	}
	return c, nil
}

// PoolFootprint is one (layer, KV head) table of a kvlm pool with keys in
// k, values in v, blocks of blockTokens (0: kvcache.DefaultBlockTokens)
// and heads of headDim values.
func PoolFootprint(k, v Codec, blockTokens, headDim int) (kvcache.Footprint, error) {
	kc, err := codec.Parse(string(k), codec.Keys)
	if err != nil {
		return kvcache.Footprint{}, err
	}
	vc, err := codec.Parse(string(v), codec.Values)
	if err != nil {
		return kvcache.Footprint{}, err
	}
	if blockTokens == 0 {
		blockTokens = kvcache.DefaultBlockTokens
	}
	return kvcache.FootprintOf(kvcache.PoolConfig{Layout: kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: headDim}, BlockTokens: blockTokens, K: kc, V: vc})
}

// tables is the number of (layer, KV head) tables of the cache: KV
// owners only.
func (c *Calc) tables() float64 { return float64(c.Layout.Layers) * float64(c.Model.KVHeads) }

// window is cache layer l's bound (0: none).
func (c *Calc) window(l int) int {
	if c.Layout.Windows == nil {
		return 0
	}
	return c.Layout.Windows[l]
}

// GrowingLayers is the number of cache layers that grow with every token
// (KV owners without a window).
func (c *Calc) GrowingLayers() int {
	n := 0
	for l := range c.Layout.Layers {
		if c.window(l) == 0 {
			n++
		}
	}
	return n
}

// growing is the number of tables that grow with every token.
func (c *Calc) growing() float64 { return float64(c.GrowingLayers()) * float64(c.Model.KVHeads) }

// BytesPerToken is the pool's cache of one more token in full blocks,
// positions included (KIVI: sealed tokens): layers · kv_heads ·
// block_bytes / block_tokens over the KV owners without a window (a
// window-bounded layer's bytes stop growing at its bound, BoundBytes). The
// source of truth; FormulaBytesPerToken is the textbook count.
func (c *Calc) BytesPerToken() float64 { return c.growing() * c.Pool.BytesPerToken() }

// FormulaBytesPerToken is the cache of one more token at the codecs'
// (quantized) rates, without positions: 2 · layers · kv_heads · head_dim ·
// bits/8 with K and V at their own bits, over the KV owners without a
// window.
func (c *Calc) FormulaBytesPerToken() float64 {
	return c.growing() * float64(c.kTok+c.vTok) / 8
}

// BoundBytes is the most bytes one sequence's window-bounded layers ever
// hold, however long it runs (appends of at most Chunk tokens):
// kvcache.Footprint.AdmitWindowBlocks blocks per table and, with KIVI, its
// residual buffer; a never-sealed KIVI table (Footprint.Unsealed: window
// W ≤ residual) holds no blocks and at most W − 1 + Chunk residual slots.
func (c *Calc) BoundBytes() int64 {
	var b int64
	for l := range c.Layout.Layers {
		w := c.window(l)
		switch {
		case w <= 0:
		case c.Pool.Unsealed(w):
			b += int64(max(w, w-1+c.Chunk)) * int64(c.Pool.ResidualSlotBytes)
		default:
			b += int64(c.Pool.AdmitWindowBlocks(1<<40, w, c.Chunk))*int64(c.Pool.BlockBytes) +
				int64(c.Pool.Residual+c.Pool.SealTokens)*int64(c.Pool.ResidualSlotBytes)
		}
	}
	return b * int64(c.Model.KVHeads)
}

// Kept is the tokens a sequence of seq tokens caches under the budget.
func (c *Calc) Kept(seq int) int {
	switch {
	case c.opt.Budget > 0:
		return min(c.opt.Budget, seq)
	case c.opt.Ratio > 0:
		return max(1, min(seq, int(math.Ceil(c.opt.Ratio*float64(seq)-1e-9))))
	}
	return seq
}

// Row computes the cache of batch sequences of seq tokens.
func (c *Calc) Row(batch, seq int) (Row, error) {
	if batch <= 0 {
		return Row{}, fmt.Errorf("batch %d must be positive", batch)
	}
	if seq <= 0 {
		return Row{}, fmt.Errorf("sequence length %d must be positive", seq)
	}
	r := Row{Batch: batch, Seq: seq, Kept: c.Kept(seq), WeightsBytes: c.WeightsBytes}
	// K and V residuals may differ when only one of them is KIVI.
	kRes, vRes := min(r.Kept, c.K.Residual()), min(r.Kept, c.V.Residual())
	r.Residual = max(kRes, vRes)
	d := int64(c.Model.HeadDim)
	f16Tok := 16 * d
	// Bits of the formula for one sequence in one (layer, KV head) that
	// keeps t tokens: the last min(t, residual) in f16 on a KIVI side.
	headBits := func(t int) (int64, bool) {
		kr, vr := min(t, c.K.Residual()), min(t, c.V.Residual())
		var bits int64
		for _, x := range [][2]int64{
			{int64(t - kr), c.kTok}, {int64(kr), f16Tok},
			{int64(t - vr), c.vTok}, {int64(vr), f16Tok},
		} {
			p, ok1 := mul(x[0], x[1])
			s, ok2 := add(bits, p)
			if !ok1 || !ok2 {
				return 0, false
			}
			bits = s
		}
		return bits, true
	}
	heads := int64(c.Model.KVHeads)
	var layerBits, blocks, perSeq, window, admit int64 // over the cache layers, one sequence
	for l := range c.Layout.Layers {
		w := c.window(l)
		t := r.Kept // the formula counts the tokens a window sees
		if w > 0 {
			t = min(t, w)
		}
		hb, ok := headBits(t)
		if !ok {
			return Row{}, errTooLarge
		}
		b, _, slots := c.Pool.WindowTable(r.Kept, w, c.Chunk)
		lb, ok1 := mul(hb, heads)
		bb, ok2 := mul(int64(b), int64(c.Pool.BlockBytes))
		rb, ok3 := mul(int64(slots), int64(c.Pool.ResidualSlotBytes))
		bb, ok4 := add(bb, rb)
		tb, ok5 := mul(bb, heads)
		ab, ok6 := product(int64(c.Pool.AdmitWindowBlocks(r.Kept, w, c.Chunk)), int64(c.Pool.BlockBytes), heads)
		var ok7, ok8, ok9 bool
		layerBits, ok7 = add(layerBits, lb)
		perSeq, ok8 = add(perSeq, tb)
		admit, ok9 = add(admit, ab)
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 || !ok8 || !ok9 {
			return Row{}, errTooLarge
		}
		blocks += int64(b) * heads
		if w > 0 {
			window += tb
		}
	}
	totalBits, ok := mul(layerBits, int64(batch))
	if !ok || totalBits > math.MaxInt64-7 {
		return Row{}, errTooLarge
	}
	r.FormulaTotalBytes = (totalBits + 7) / 8
	r.FormulaBytesPerToken = c.FormulaBytesPerToken()
	if r.Residual > 0 {
		// Residual tokens: f16 on the KIVI side, the other side at its rate.
		kt, vt := c.kTok, c.vTok
		if c.K.Residual() > 0 {
			kt = f16Tok
		}
		if c.V.Residual() > 0 {
			vt = f16Tok
		}
		r.FormulaResidualBytesPerToken = c.tables() * float64(kt+vt) / 8
	}
	// The pool: whole blocks and residual buffers of every table.
	_, r.Residual, _ = c.Pool.Table(r.Kept)
	if r.TotalBytes, ok = mul(perSeq, int64(batch)); !ok {
		return Row{}, errTooLarge
	}
	r.WindowBytes = window * int64(batch)
	r.Blocks = blocks
	if r.KVMemBytes, ok = mul(admit, int64(batch)); !ok {
		return Row{}, errTooLarge
	}
	r.BytesPerToken = c.BytesPerToken()
	if c.Pool.ResidualSlotBytes > 0 {
		r.ResidualBytesPerToken = c.tables() * float64(c.Pool.ResidualSlotBytes)
	}
	r.TotalGB = float64(r.TotalBytes) / 1e9
	r.TotalGiB = float64(r.TotalBytes) / (1 << 30)
	if r.WeightsBytes > 0 {
		r.KVToWeights = float64(r.TotalBytes) / float64(r.WeightsBytes)
	}
	if r.KVPlusWeightsBytes, ok = add(r.TotalBytes, r.WeightsBytes); !ok {
		return Row{}, errTooLarge
	}
	return r, nil
}

// Grid computes a row for every batch size and sequence length, batch sizes
// outermost.
func (c *Calc) Grid(batches, seqs []int) ([]Row, error) {
	if len(batches) == 0 || len(seqs) == 0 {
		return nil, errors.New("no batch sizes or no sequence lengths")
	}
	rows := make([]Row, 0, len(batches)*len(seqs))
	for _, b := range batches {
		for _, s := range seqs {
			r, err := c.Row(b, s)
			if err != nil {
				return nil, err
			}
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// Compute is New followed by Row.
func Compute(m Model, o Options, batch, seq int) (Row, error) {
	c, err := New(m, o)
	if err != nil {
		return Row{}, err
	}
	return c.Row(batch, seq)
}

var errTooLarge = errors.New("the cache size overflows 2^63 bytes: lower --batch or --seq")

// mul multiplies non-negative numbers, reporting overflow.
func mul(a, b int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if a < 0 || b < 0 || hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

func product(xs ...int64) (int64, bool) {
	p := int64(1)
	for _, x := range xs {
		var ok bool
		if p, ok = mul(p, x); !ok {
			return 0, false
		}
	}
	return p, true
}

// add adds non-negative numbers, reporting overflow.
func add(a, b int64) (int64, bool) {
	if a < 0 || b < 0 || a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}
