package kvcalc

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/convert"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tensor"
)

func mustPreset(t *testing.T, name string) Model {
	t.Helper()
	m, err := Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustRow(t *testing.T, m Model, o Options, batch, seq int) Row {
	t.Helper()
	r, err := Compute(m, o, batch, seq)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// TestPresetBytesPerToken: the formula's 2 · layers · kv_heads · head_dim ·
// 2 bytes in f16 for every preset; the pool adds 4 bytes of position per
// (layer, KV head), and one token takes a whole block of 16.
func TestPresetBytesPerToken(t *testing.T) {
	want := map[string]float64{
		"llama2-7b":      524_288, // 0.5 MiB
		"llama2-13b":     819_200,
		"llama2-70b":     327_680,
		"llama3-8b":      131_072,
		"llama3-70b":     327_680,
		"mistral-7b":     131_072,
		"qwen2.5-7b":     57_344,
		"tinyllama-1.1b": 22_528,
		"gpt3-175b":      4_718_592, // 4.5 MiB
	}
	if len(want) != len(Presets()) {
		t.Fatalf("%d presets, %d expectations", len(Presets()), len(want))
	}
	for _, p := range Presets() {
		r := mustRow(t, p, Options{}, 1, 1)
		if r.FormulaBytesPerToken != want[p.Name] || r.FormulaTotalBytes != int64(want[p.Name]) {
			t.Errorf("%s: formula %v B per token (total %d), want %v", p.Name, r.FormulaBytesPerToken, r.FormulaTotalBytes, want[p.Name])
		}
		pool := want[p.Name] + float64(4*p.Layers*p.KVHeads)
		if r.BytesPerToken != pool || r.TotalBytes != int64(16*pool) || r.Blocks != int64(p.Layers*p.KVHeads) {
			t.Errorf("%s: pool %v B per token (total %d, %d blocks), want %v (a block of 16: %v)", p.Name, r.BytesPerToken, r.TotalBytes, r.Blocks, pool, 16*pool)
		}
		if p.Heads%p.KVHeads != 0 || p.Dim != p.Heads*p.HeadDim {
			t.Errorf("%s: inconsistent heads %d/%d, dim %d, head dim %d", p.Name, p.Heads, p.KVHeads, p.Dim, p.HeadDim)
		}
	}
	if r := mustRow(t, mustPreset(t, "llama2-7b"), Options{}, 1, 1); r.FormulaBytesPerToken != 0.5*(1<<20) {
		t.Errorf("LLaMA2-7B: %v B per token, want 0.5 MiB", r.FormulaBytesPerToken)
	}
}

// TestPresetParams recomputes the Llama-family parameter counts from the
// architecture, and checks the rounded counts the model cards cite.
func TestPresetParams(t *testing.T) {
	cited := map[string]float64{
		"llama2-7b": 6.74, "llama2-13b": 13.0, "llama2-70b": 69.0, "llama3-8b": 8.03, "llama3-70b": 70.6,
		"mistral-7b": 7.24, "qwen2.5-7b": 7.62, "tinyllama-1.1b": 1.10, "gpt3-175b": 175,
	}
	for _, p := range Presets() {
		if got := float64(p.Params) / 1e9; round(got, 2) != cited[p.Name] && round(got, 1) != cited[p.Name] {
			t.Errorf("%s: %d params, cited %vB", p.Name, p.Params, cited[p.Name])
		}
		if p.Name == "gpt3-175b" {
			continue // GPT-3 uses the paper's nominal count
		}
		d, h, kv := int64(p.Dim), int64(p.HiddenDim), int64(p.KVHeads*p.HeadDim)
		layer := 2*d*d + 2*d*kv + 3*d*h + 2*d
		if p.QKVBias {
			layer += d + 2*kv
		}
		n := int64(p.Layers)*layer + 2*int64(p.Vocab)*d + d
		if n != p.Params {
			t.Errorf("%s: architecture gives %d params, preset says %d", p.Name, n, p.Params)
		}
	}
}

// TestGPT3 checks the honest GPT-3 175B numbers of the formula: 4.5 MiB per
// token; at 4096 tokens and batch 4, 16, 64: 77.3, 309.2, 1237.0 GB
// (decimal), 0.22, 0.88, 3.53 of 350 GB of fp16 weights. It also pins down
// the widely copied table (81 / 324 / 1297 GB, 0.23 / 0.93 / 3.71): those
// are these totals times 2^20/10^6, i.e. a per-token size in decimal MB read
// as MiB. A kvlm pool adds 4 B of position per (layer, KV head) and token:
// 4,755,456 B per token.
func TestGPT3(t *testing.T) {
	m := mustPreset(t, "gpt3-175b")
	cases := []struct {
		batch       int
		bytes       int64
		gb, ratio   float64
		copiedGB    float64
		copiedRatio float64
	}{
		{4, 77_309_411_328, 77.3, 0.22, 81, 0.23},
		{16, 309_237_645_312, 309.2, 0.88, 324, 0.93},
		{64, 1_236_950_581_248, 1237.0, 3.53, 1297, 3.71},
	}
	for _, c := range cases {
		r := mustRow(t, m, Options{}, c.batch, 4096)
		if r.FormulaBytesPerToken != 4.5*(1<<20) { // 4,718,592 B
			t.Errorf("per token %v, want 4,718,592 B = 4.5 MiB", r.FormulaBytesPerToken)
		}
		if r.BytesPerToken != 4_755_456 || r.TotalBytes != int64(c.batch)*4096*4_755_456 {
			t.Errorf("pool: %v B per token, total %d; want 4,755,456 and %d", r.BytesPerToken, r.TotalBytes, int64(c.batch)*4096*4_755_456)
		}
		if r.WeightsBytes != 350e9 {
			t.Errorf("weights %d, want 350 GB", r.WeightsBytes)
		}
		gb, ratio := float64(r.FormulaTotalBytes)/1e9, float64(r.FormulaTotalBytes)/float64(r.WeightsBytes)
		if r.FormulaTotalBytes != c.bytes || round(gb, 1) != c.gb || round(ratio, 2) != c.ratio {
			t.Errorf("batch %d: %d B = %.2f GB, KV/weights %.4f; want %d B, %.1f GB, %.2f", c.batch, r.FormulaTotalBytes, gb, ratio, c.bytes, c.gb, c.ratio)
		}
		if gib := float64(r.FormulaTotalBytes) / (1 << 30); gib != float64(c.batch)*18 {
			t.Errorf("batch %d: %v GiB, want %d", c.batch, gib, c.batch*18)
		}
		// The copied table: the same bytes scaled by 2^20/10^6 (+4.86%).
		copied := gb * (1 << 20) / 1e6
		if math.Round(copied) != c.copiedGB || round(copied/350, 2) != c.copiedRatio {
			t.Errorf("batch %d: scaled %.2f GB (%.3f), copied table says %v (%v)", c.batch, copied, copied/350, c.copiedGB, c.copiedRatio)
		}
	}
}

func TestCodecBits(t *testing.T) {
	cases := []struct {
		c          Codec
		headDim    int
		k, v       float64
		residual   int
		kTok, vTok int64 // bits of one token of one head
	}{
		{F32, 128, 32, 32, 0, 4096, 4096},
		{F16, 128, 16, 16, 0, 2048, 2048},
		{BF16, 128, 16, 16, 0, 2048, 2048},
		{Q8, 128, 8.25, 8.25, 0, 1056, 1056},
		{Q4, 128, 4.25, 4.25, 0, 544, 544},
		{Q8, 64, 8.5, 8.5, 0, 544, 544},
		{Q4, 64, 4.5, 4.5, 0, 288, 288},
		{KIVI2, 128, 3, 3, 128, 384, 384}, // 2 + 32/32 for both
		{KIVI4, 128, 5, 5, 128, 640, 640},
		{KIVI2, 64, 3, 3, 128, 192, 192},
		{KIVI2, 8, 3, 6, 128, 24, 48}, // values: one group of 8 channels
		{KIVI4, 16, 5, 6, 128, 80, 96},
		{KIVI2, 48, 3, 2 + 64.0/48, 128, 144, 160}, // ⌈48/32⌉ = 2 value groups
		{KIVI2, 10, 3.4, 5.6, 128, 34, 56},         // 20 code bits padded to 24
	}
	for _, c := range cases {
		k, v, err := BitsPerValue(c.c, c.c, c.headDim)
		if err != nil {
			t.Fatal(err)
		}
		if k != c.k || v != c.v || c.c.Residual() != c.residual {
			t.Errorf("%s at head dim %d: K %v V %v residual %d, want %v %v %d", c.c, c.headDim, k, v, c.c.Residual(), c.k, c.v, c.residual)
		}
		kt, _ := c.c.keyBitsPerToken(c.headDim)
		vt, _ := c.c.valueBitsPerToken(c.headDim)
		if kt != c.kTok || vt != c.vTok {
			t.Errorf("%s at head dim %d: %d/%d bits per token-head, want %d/%d", c.c, c.headDim, kt, vt, c.kTok, c.vTok)
		}
	}
	if len(Codecs()) != 7 {
		t.Errorf("codecs %v", Codecs())
	}
	for _, c := range Codecs() {
		if got, err := ParseCodec(string(c)); err != nil || got != c {
			t.Errorf("ParseCodec(%s) = %v, %v", c, got, err)
		}
	}
	// Every kvcache codec is sized: q8dot and q4dot store q8's and q4's
	// blocks.
	for _, n := range codec.Names {
		if _, err := ParseCodec(n); err != nil {
			t.Errorf("kvcache codec %s: %v", n, err)
		}
	}
	if a, _ := ParseCodec("q8dot"); a != Q8 {
		t.Errorf("q8dot sized as %s", a)
	}
	if a, _ := ParseCodec("q4dot"); a != Q4 {
		t.Errorf("q4dot sized as %s", a)
	}
	for _, bad := range []string{"", "fp16", "F16", "int8", "q2", "kivi"} {
		if _, err := ParseCodec(bad); err == nil || !strings.Contains(err.Error(), "f32, f16, bf16, q8, q4, kivi2, kivi4") {
			t.Errorf("ParseCodec(%q): %v", bad, err)
		}
	}
	if _, _, err := BitsPerValue(F16, "int3", 128); err == nil {
		t.Error("unknown value codec accepted")
	}
}

// TestCodecTotals: the formula's totals for codecs, K and V in different
// codecs, KIVI's f16 residual (residual_tokens is the pool's count, which
// agrees here).
func TestCodecTotals(t *testing.T) {
	l27 := mustPreset(t, "llama2-7b") // 32 layers · 32 KV heads = 1024 heads of 128
	const heads = 32 * 32
	cases := []struct {
		name          string
		k, v          Codec
		batch, seq    int
		bytesPerToken float64
		total         int64
		residual      int
	}{
		{"f32", F32, F32, 1, 4096, 1 << 20, 4096 << 20, 0},
		{"f16", F16, F16, 2, 4096, 1 << 19, 2 * 4096 << 19, 0},
		{"bf16", BF16, BF16, 1, 100, 1 << 19, 100 << 19, 0},
		{"q8", Q8, Q8, 1, 4096, heads * 2 * 132, 4096 * heads * 2 * 132, 0},
		{"q4", Q4, Q4, 3, 1000, heads * 2 * 68, 3 * 1000 * heads * 2 * 68, 0},
		{"K q8 V q4", Q8, Q4, 1, 4096, heads * (132 + 68), 4096 * heads * (132 + 68), 0},
		{"K f16 V q4", F16, Q4, 1, 10, heads * (256 + 68), 10 * heads * (256 + 68), 0},
		// KIVI-2: 128 residual tokens at 2·256 B per head, the rest at 2·48 B.
		{"kivi2", KIVI2, KIVI2, 1, 4096, heads * 96, heads * (128*512 + 3968*96), 128},
		{"kivi4", KIVI4, KIVI4, 2, 4096, heads * 160, 2 * heads * (128*512 + 3968*160), 128},
		{"kivi2 short", KIVI2, KIVI2, 1, 100, heads * 96, heads * 100 * 512, 100},
		// Only K in KIVI: V stays f16 throughout.
		{"K kivi2 V f16", KIVI2, F16, 1, 4096, heads * (48 + 256), heads * (128*512 + 3968*(48+256)), 128},
		// The pool seals values a block at a time: 864 sealed, 136 waiting.
		{"K q4 V kivi4", Q4, KIVI4, 1, 1000, heads * (68 + 80), heads * (128*(68+256) + 872*(68+80)), 136},
	}
	for _, c := range cases {
		r := mustRow(t, l27, Options{K: c.k, V: c.v}, c.batch, c.seq)
		if r.FormulaBytesPerToken != c.bytesPerToken || r.FormulaTotalBytes != c.total || r.Residual != c.residual {
			t.Errorf("%s: %v B/token, total %d, residual %d; want %v, %d, %d", c.name, r.FormulaBytesPerToken, r.FormulaTotalBytes, r.Residual, c.bytesPerToken, c.total, c.residual)
		}
	}
	// The quantized rate times the tokens, plus the residual's extra.
	r := mustRow(t, l27, Options{K: KIVI2, V: KIVI2}, 1, 4096)
	if r.FormulaResidualBytesPerToken != 1<<19 || float64(r.FormulaTotalBytes) != 3968*r.FormulaBytesPerToken+128*r.FormulaResidualBytesPerToken {
		t.Errorf("kivi2 row %+v", r)
	}
	// The pool: KIVI keys keep their per-channel scales in every block of
	// 16 (2 + 32/16 bits), values 2 + 32/128, positions 32 bits: 116 B per
	// sealed token per head; 3968 sealed tokens in 248 blocks, and a
	// residual buffer of 160 f16 tokens with positions (4·128 + 4 B each).
	if r.BytesPerToken != heads*116 || r.ResidualBytesPerToken != heads*516 || r.TotalBytes != heads*(248*16*116+160*516) || r.Blocks != heads*248 {
		t.Errorf("kivi2 pool: %v B/token, residual %v, total %d, %d blocks", r.BytesPerToken, r.ResidualBytesPerToken, r.TotalBytes, r.Blocks)
	}
}

func TestBudgets(t *testing.T) {
	m := mustPreset(t, "llama3-8b") // 131,072 B per token in f16
	const perTok = 131_072
	cases := []struct {
		name       string
		opt        Options
		seq, kept  int
		totalBytes int64
	}{
		{"none", Options{}, 4096, 4096, 4096 * perTok},
		{"ratio 0.25", Options{Ratio: 0.25}, 4096, 1024, 1024 * perTok},
		{"ratio 1", Options{Ratio: 1}, 4096, 4096, 4096 * perTok},
		{"ratio rounds up", Options{Ratio: 0.3}, 10, 3, 3 * perTok},
		{"ratio 0.125 of 1001", Options{Ratio: 0.125}, 1001, 126, 126 * perTok},
		{"ratio tiny keeps one", Options{Ratio: 1e-9}, 10, 1, perTok},
		{"budget below seq", Options{Budget: 1000}, 4096, 1000, 1000 * perTok},
		{"budget above seq", Options{Budget: 1000}, 512, 512, 512 * perTok},
		{"budget with kivi2", Options{Budget: 1000, K: KIVI2, V: KIVI2}, 4096, 1000, 32 * 8 * (128*512 + 872*96)},
	}
	for _, c := range cases {
		r := mustRow(t, m, c.opt, 2, c.seq)
		if r.Kept != c.kept || r.FormulaTotalBytes != 2*c.totalBytes {
			t.Errorf("%s: kept %d, total %d; want %d, %d", c.name, r.Kept, r.FormulaTotalBytes, c.kept, 2*c.totalBytes)
		}
	}
	// The pool rounds the kept tokens up to whole blocks: 1000 → 63 blocks
	// of 16 per (layer, KV head), 32 · 8 of them, (16·2·128·2 + 64) B each.
	if r := mustRow(t, m, Options{Budget: 1000}, 2, 4096); r.Blocks != 63*256 || r.TotalBytes != 2*63*256*(16*512+64) {
		t.Errorf("pool under a budget: %d blocks, %d B", r.Blocks, r.TotalBytes)
	}
}

func TestWeights(t *testing.T) {
	m := mustPreset(t, "llama2-7b")
	cases := []struct {
		typ  string
		want int64
	}{
		{"", 2 * 6_738_415_616},
		{"f16", 2 * 6_738_415_616},
		{"fp16", 2 * 6_738_415_616},
		{"BF16", 2 * 6_738_415_616},
		{"f32", 4 * 6_738_415_616},
		{"q8_0", 6_738_415_616 / 32 * 34},
		{"q4_0", 6_738_415_616 / 32 * 18},
		{"q4_k", 6_738_415_616 / 256 * 144},
	}
	for _, c := range cases {
		var o Options
		if c.typ != "" {
			w, err := ParseWeights(c.typ)
			if err != nil {
				t.Fatal(err)
			}
			o.Weights = w
		}
		calc, err := New(m, o)
		if err != nil {
			t.Fatal(err)
		}
		if calc.WeightsBytes != c.want {
			t.Errorf("%q: %d weight bytes, want %d", c.typ, calc.WeightsBytes, c.want)
		}
	}
	for _, bad := range []string{"q9", "f8", ""} {
		if _, err := ParseWeights(bad); err == nil {
			t.Errorf("weights type %q accepted", bad)
		}
	}
}

func TestErrors(t *testing.T) {
	m := mustPreset(t, "llama2-7b")
	cases := []struct {
		name  string
		m     Model
		opt   Options
		batch int
		seq   int
		want  string
	}{
		{"batch 0", m, Options{}, 0, 10, "batch"},
		{"batch negative", m, Options{}, -1, 10, "batch"},
		{"seq 0", m, Options{}, 1, 0, "sequence length"},
		{"unknown K codec", m, Options{K: "int8"}, 1, 1, "unknown KV codec"},
		{"unknown V codec", m, Options{V: "q3"}, 1, 1, "unknown KV codec"},
		{"ratio above 1", m, Options{Ratio: 1.5}, 1, 1, "(0, 1]"},
		{"ratio negative", m, Options{Ratio: -0.5}, 1, 1, "(0, 1]"},
		{"ratio NaN", m, Options{Ratio: math.NaN()}, 1, 1, "(0, 1]"},
		{"budget negative", m, Options{Budget: -3}, 1, 1, "budget"},
		{"ratio and budget", m, Options{Ratio: 0.5, Budget: 3}, 1, 1, "not both"},
		{"no layers", Model{Name: "x", KVHeads: 1, HeadDim: 8}, Options{}, 1, 1, "layers"},
		{"overflow", m, Options{K: F32, V: F32}, 1 << 30, 1 << 30, "overflows"},
	}
	for _, c := range cases {
		if _, err := Compute(c.m, c.opt, c.batch, c.seq); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.want)
		}
	}
	_, err := Preset("llama4-9000b")
	if err == nil || !strings.Contains(err.Error(), "llama2-7b") || !strings.Contains(err.Error(), "gpt3-175b") {
		t.Errorf("unknown preset: %v", err)
	}
	if p, err := Preset("LLaMA2-7B"); err != nil || p.Name != "llama2-7b" {
		t.Errorf("preset names are case-insensitive: %v %v", p.Name, err)
	}
}

// writeTinyGGUF writes a llama GGUF with 3 layers, 4 heads, 2 KV heads,
// head dim 16 (dim 64) and a few tensors.
func writeTinyGGUF(t *testing.T) (path string, storedBytes, params int64) {
	t.Helper()
	w := gguf.NewWriter()
	for _, kv := range []struct {
		key string
		val any
	}{
		{"general.architecture", "llama"},
		{"llama.embedding_length", uint32(64)},
		{"llama.feed_forward_length", uint32(128)},
		{"llama.block_count", uint32(3)},
		{"llama.attention.head_count", uint32(4)},
		{"llama.attention.head_count_kv", uint32(2)},
		{"llama.context_length", uint32(256)},
	} {
		if err := w.Set(kv.key, kv.val); err != nil {
			t.Fatal(err)
		}
	}
	add := func(name string, typ tensor.DType, shape ...uint64) {
		n := uint64(1)
		for _, d := range shape {
			n *= d
		}
		size := int(n) / typ.BlockSize() * typ.BlockBytes()
		if err := w.AddTensor(name, typ, shape, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		storedBytes += int64(size)
		params += int64(n)
	}
	add("token_embd.weight", tensor.F16, 64, 100)
	add("output_norm.weight", tensor.F32, 64)
	add("blk.0.attn_k.weight", tensor.Q8_0, 64, 32)
	path = filepath.Join(t.TempDir(), "tiny.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path, storedBytes, params
}

func TestFromGGUF(t *testing.T) {
	path, stored, params := writeTinyGGUF(t)
	m, err := FromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if m.Layers != 3 || m.Heads != 4 || m.KVHeads != 2 || m.HeadDim != 16 || m.Context != 256 {
		t.Fatalf("shape %+v", m)
	}
	wantStored := int64(64*100*2 + 64*4 + 64*32/32*34)
	if m.StoredBytes != stored || stored != wantStored || m.Params != params || params != 64*100+64+64*32 {
		t.Fatalf("stored %d params %d, want %d %d", m.StoredBytes, m.Params, stored, params)
	}
	// 2 · 3 · 2 · 16 · 2 B = 384 B per token in f16.
	r := mustRow(t, m, Options{}, 2, 100)
	if r.FormulaBytesPerToken != 384 || r.FormulaTotalBytes != 2*100*384 || r.WeightsBytes != stored {
		t.Fatalf("row %+v", r)
	}
	// --weights-type resizes the file's parameters.
	w, _ := ParseWeights("f32")
	if r := mustRow(t, m, Options{Weights: w}, 1, 1); r.WeightsBytes != 4*params {
		t.Fatalf("f32 weights %d, want %d", r.WeightsBytes, 4*params)
	}
}

// TestStories260K: the real stories260K (5 layers, 4 KV heads, head dim 8)
// as a llama2.c checkpoint and converted to GGUF: 1,280 B per token in f32
// by the formula, 1,360 B in the pool (positions: 5 · 4 · 4 B).
func TestStories260K(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tok := shared.Path(t, "models/stories260K/tok512.bin")
	ggufPath := filepath.Join(t.TempDir(), "s.gguf")
	if _, err := convert.Llama2C(bin, tok, ggufPath, convert.Options{Type: tensor.F32}); err != nil {
		t.Fatal(err)
	}
	var models []Model
	for _, p := range []string{bin, ggufPath} {
		m, err := FromFile(p)
		if err != nil {
			t.Fatal(err)
		}
		models = append(models, m)
	}
	for _, m := range models {
		if m.Layers != 5 || m.KVHeads != 4 || m.HeadDim != 8 || m.Context != 512 {
			t.Fatalf("%s: shape %+v", m.Name, m)
		}
		r := mustRow(t, m, Options{K: F32, V: F32}, 1, 512)
		if r.FormulaBytesPerToken != 1280 || r.FormulaTotalBytes != 512*1280 || r.BytesPerToken != 1360 || r.TotalBytes != 512*1360 {
			t.Errorf("%s: %v B per token (formula %v), total %d (formula %d)", m.Name, r.BytesPerToken, r.FormulaBytesPerToken, r.TotalBytes, r.FormulaTotalBytes)
		}
		if r.WeightsBytes != m.StoredBytes || m.StoredBytes != 4*m.Params {
			t.Errorf("%s: weights %d, stored %d, params %d", m.Name, r.WeightsBytes, m.StoredBytes, m.Params)
		}
		// KIVI-2 at head dim 8: keys 3 bits, values 2 + 32/8 = 6 bits.
		r = mustRow(t, m, Options{K: KIVI2, V: KIVI2}, 1, 512)
		if want := int64(20 * (128*2*16*8 + 384*(24+48)) / 8); r.FormulaTotalBytes != want {
			t.Errorf("%s kivi2: %d, want %d", m.Name, r.FormulaTotalBytes, want)
		}
		// The pool: 384 tokens sealed in 24 blocks of 16 · (2 + 2) + 32 +
		// 16 · 6 + 64 = 224 B, and 160 residual slots of 4·8 + 4 B.
		if want := int64(20 * (24*224 + 160*36)); r.TotalBytes != want {
			t.Errorf("%s kivi2 pool: %d, want %d", m.Name, r.TotalBytes, want)
		}
	}
	if models[0].Params != models[1].Params {
		t.Errorf("checkpoint has %d params, its GGUF %d", models[0].Params, models[1].Params)
	}
	if _, err := FromFile(tok); err == nil {
		t.Error("a tokenizer file read as a model")
	}
}
