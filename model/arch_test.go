package model

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
)

// tinySpec is a random-weight model for the architecture tests.
type tinySpec struct {
	arch                                string
	dim, layers, heads, kvHeads, hidden int
	headDim                             int // 0: dim/heads; else written as attention.key_length
	ctx                                 int
	theta, eps                          float32
	tied, biases                        bool
	qkNorm                              bool           // attn_q_norm / attn_k_norm ([head dim]) in every layer
	postNorms                           bool           // post_attention_norm / post_ffw_norm ([dim]) in every layer
	fused                               bool           // attn_qkv (Q, K, V rows) and ffn_up (gate, up rows) instead of the separate matrices (phi3)
	ropeFreqs                           []float32      // written as rope_freqs.weight
	ropeLong, ropeShort                 []float32      // written as rope_factors_long.weight / rope_factors_short.weight (phi3 LongRoPE)
	meta                                map[string]any // extra keys, without the arch prefix
	tok                                 map[string]any // tokenizer.ggml.* keys (full names)
	vocab                               int
	skip                                []string // tensors left out (error tests)
	seed                                uint64
}

func (s tinySpec) hd() int {
	if s.headDim > 0 {
		return s.headDim
	}
	return s.dim / s.heads
}

// tinyWeights are the weights, kept in float64 for the reference.
type tinyWeights struct {
	emb, out  [][]float64 // [vocab][dim]; out == emb when tied
	outNorm   []float64
	layers    []tinyLayer
	ropeFreqs []float64
}

type tinyLayer struct {
	attnNorm, ffnNorm []float64
	wq, wk, wv, wo    [][]float64
	bq, bk, bv        []float64
	qNorm, kNorm      []float64 // [head dim] or nil
	attnPost, ffnPost []float64 // [dim] or nil
	wGate, wUp, wDown [][]float64
}

func randMat(r *rand.Rand, rows, cols int, scale float64) [][]float64 {
	m := make([][]float64, rows)
	for i := range m {
		m[i] = make([]float64, cols)
		for j := range m[i] {
			// Stored as float32: round here so the reference sees the
			// same numbers.
			m[i][j] = float64(float32(r.NormFloat64() * scale))
		}
	}
	return m
}

func randVec(r *rand.Rand, n int, mean, scale float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(float32(mean + r.NormFloat64()*scale))
	}
	return v
}

func f32bytes(v []float64) []byte {
	f := make([]float32, len(v))
	for i, x := range v {
		f[i] = float32(x)
	}
	b := make([]byte, 4*len(f))
	if err := tensor.Quantize(tensor.F32, f, b); err != nil {
		panic(err)
	}
	return b
}

// build writes the spec as a GGUF file and returns its path and weights.
func (s tinySpec) build(t testing.TB) (string, *tinyWeights) {
	t.Helper()
	r := rand.New(rand.NewPCG(s.seed, 99))
	hd := s.hd()
	qd, kvd := s.heads*hd, s.kvHeads*hd
	w := &tinyWeights{emb: randMat(r, s.vocab, s.dim, 1), outNorm: randVec(r, s.dim, 1, 0.1)}
	if s.tied {
		w.out = w.emb
	} else {
		w.out = randMat(r, s.vocab, s.dim, 1/math.Sqrt(float64(s.dim)))
	}
	for range s.layers {
		L := tinyLayer{
			attnNorm: randVec(r, s.dim, 1, 0.1), ffnNorm: randVec(r, s.dim, 1, 0.1),
			wq: randMat(r, qd, s.dim, 2/math.Sqrt(float64(s.dim))), wk: randMat(r, kvd, s.dim, 2/math.Sqrt(float64(s.dim))),
			wv: randMat(r, kvd, s.dim, 1/math.Sqrt(float64(s.dim))), wo: randMat(r, s.dim, qd, 1/math.Sqrt(float64(qd))),
			wGate: randMat(r, s.hidden, s.dim, 1/math.Sqrt(float64(s.dim))), wUp: randMat(r, s.hidden, s.dim, 1/math.Sqrt(float64(s.dim))),
			wDown: randMat(r, s.dim, s.hidden, 1/math.Sqrt(float64(s.hidden))),
		}
		if s.biases {
			L.bq, L.bk, L.bv = randVec(r, qd, 0, 0.5), randVec(r, kvd, 0, 0.5), randVec(r, kvd, 0, 0.5)
		}
		if s.qkNorm {
			L.qNorm, L.kNorm = randVec(r, hd, 1, 0.3), randVec(r, hd, 1, 0.3)
		}
		if s.postNorms {
			L.attnPost, L.ffnPost = randVec(r, s.dim, 1, 0.3), randVec(r, s.dim, 1, 0.3)
		}
		w.layers = append(w.layers, L)
	}
	for _, f := range s.ropeFreqs {
		w.ropeFreqs = append(w.ropeFreqs, float64(f))
	}

	gw := gguf.NewWriter()
	set := func(k string, v any) {
		if err := gw.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	a := s.arch
	set("general.architecture", a)
	set("general.name", "tiny-"+a)
	set(a+".context_length", uint32(s.ctx))
	set(a+".embedding_length", uint32(s.dim))
	set(a+".block_count", uint32(s.layers))
	set(a+".feed_forward_length", uint32(s.hidden))
	set(a+".attention.head_count", uint32(s.heads))
	set(a+".attention.head_count_kv", uint32(s.kvHeads))
	set(a+".rope.dimension_count", uint32(hd))
	set(a+".attention.layer_norm_rms_epsilon", s.eps)
	set(a+".rope.freq_base", s.theta)
	if s.headDim > 0 {
		set(a+".attention.key_length", uint32(hd))
		set(a+".attention.value_length", uint32(hd))
	}
	for k, v := range s.meta {
		set(a+"."+k, v)
	}
	for k, v := range s.tok {
		set(k, v)
	}
	skip := func(name string) bool { return slices.Contains(s.skip, name) }
	mat := func(name string, m [][]float64) {
		if skip(name) {
			return
		}
		var flat []float64
		for _, row := range m {
			flat = append(flat, row...)
		}
		if err := gw.AddTensor(name, tensor.F32, []uint64{uint64(len(m[0])), uint64(len(m))}, f32bytes(flat)); err != nil {
			t.Fatal(err)
		}
	}
	vec := func(name string, v []float64) {
		if v == nil || skip(name) {
			return
		}
		if err := gw.AddTensor(name, tensor.F32, []uint64{uint64(len(v))}, f32bytes(v)); err != nil {
			t.Fatal(err)
		}
	}
	mat("token_embd.weight", w.emb)
	vec("rope_freqs.weight", w.ropeFreqs)
	for name, f := range map[string][]float32{"rope_factors_long.weight": s.ropeLong, "rope_factors_short.weight": s.ropeShort} {
		if f != nil && !skip(name) {
			if err := gw.AddTensor(name, tensor.F32, []uint64{uint64(len(f))}, f32bytes(f64s(f))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, L := range w.layers {
		p := "blk." + itoa(i) + "."
		vec(p+"attn_norm.weight", L.attnNorm)
		if s.fused {
			mat(p+"attn_qkv.weight", slices.Concat(L.wq, L.wk, L.wv))
			mat(p+"ffn_up.weight", slices.Concat(L.wGate, L.wUp))
		} else {
			mat(p+"attn_q.weight", L.wq)
			mat(p+"attn_k.weight", L.wk)
			mat(p+"attn_v.weight", L.wv)
		}
		vec(p+"attn_q.bias", L.bq)
		vec(p+"attn_k.bias", L.bk)
		vec(p+"attn_v.bias", L.bv)
		vec(p+"attn_q_norm.weight", L.qNorm)
		vec(p+"attn_k_norm.weight", L.kNorm)
		vec(p+"post_attention_norm.weight", L.attnPost)
		vec(p+"post_ffw_norm.weight", L.ffnPost)
		mat(p+"attn_output.weight", L.wo)
		vec(p+"ffn_norm.weight", L.ffnNorm)
		if !s.fused {
			mat(p+"ffn_gate.weight", L.wGate)
			mat(p+"ffn_up.weight", L.wUp)
		}
		mat(p+"ffn_down.weight", L.wDown)
	}
	vec("output_norm.weight", w.outNorm)
	if !s.tied {
		mat("output.weight", w.out)
	}
	path := filepath.Join(t.TempDir(), "tiny-"+a+".gguf")
	if err := gw.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path, w
}

func itoa(i int) string { return strconv.Itoa(i) }

// f64s widens v.
func f64s(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// refRope says how the reference rotates: the layout and the per-pair
// frequencies, written from the definitions (Llama: pairs (2j, 2j+1);
// NeoX: (j, j+d/2); angle p / (theta^(2j/d) · factor_j · scale)).
type refRope struct {
	neox    bool
	theta   float64
	factors []float64 // nil: 1
	scale   float64   // 0: 1
}

// refForward is the plain forward pass in float64: no kernels, no cache,
// every token's attention over all earlier tokens recomputed. It returns the
// logits of every position. window > 0 is a sliding window written from HF
// Mistral's definition: the query at position t sees the key at position u
// iff u ≤ t and t − u < window.
func refForward(s tinySpec, w *tinyWeights, rope refRope, tokens []int, window int) [][]float64 {
	n, D, hd := len(tokens), s.dim, s.hd()
	half := hd / 2
	eps := float64(s.eps)
	rms := func(x, g []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
		out := make([]float64, len(x))
		for i := range x {
			out[i] = x[i] * inv * g[i]
		}
		return out
	}
	matvec := func(m [][]float64, x, b []float64) []float64 {
		out := make([]float64, len(m))
		for i, row := range m {
			var acc float64
			for j, v := range row {
				acc += v * x[j]
			}
			if b != nil {
				acc += b[i]
			}
			out[i] = acc
		}
		return out
	}
	rotate := func(v []float64, pos int) {
		for j := 0; j < half; j++ {
			inv := math.Pow(rope.theta, -float64(2*j)/float64(hd))
			if rope.factors != nil {
				inv /= rope.factors[j]
			}
			if rope.scale > 0 {
				inv /= rope.scale
			}
			a := float64(pos) * inv
			i0, i1 := 2*j, 2*j+1
			if rope.neox {
				i0, i1 = j, j+half
			}
			x0, x1 := v[i0], v[i1]
			v[i0] = x0*math.Cos(a) - x1*math.Sin(a)
			v[i1] = x0*math.Sin(a) + x1*math.Cos(a)
		}
	}
	x := make([][]float64, n)
	for t, id := range tokens {
		x[t] = slices.Clone(w.emb[id])
	}
	group := s.heads / s.kvHeads
	for _, L := range w.layers {
		q := make([][]float64, n)
		k := make([][]float64, n)
		v := make([][]float64, n)
		for t := range n {
			xb := rms(x[t], L.attnNorm)
			q[t], k[t], v[t] = matvec(L.wq, xb, L.bq), matvec(L.wk, xb, L.bk), matvec(L.wv, xb, L.bv)
			for h := 0; h < s.heads; h++ {
				rotate(q[t][h*hd:(h+1)*hd], t)
			}
			for h := 0; h < s.kvHeads; h++ {
				rotate(k[t][h*hd:(h+1)*hd], t)
			}
		}
		for t := range n {
			att := make([]float64, s.heads*hd)
			for h := 0; h < s.heads; h++ {
				kh := h / group
				qv := q[t][h*hd : (h+1)*hd]
				first := 0 // the first key the query sees
				if window > 0 && t-window+1 > 0 {
					first = t - window + 1
				}
				scores := make([]float64, t+1-first) // scores[u-first]: key u
				mx := math.Inf(-1)
				for u := first; u <= t; u++ {
					var d float64
					for i := range hd {
						d += qv[i] * k[u][kh*hd+i]
					}
					scores[u-first] = d / math.Sqrt(float64(hd))
					mx = max(mx, scores[u-first])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - mx)
					sum += scores[j]
				}
				for j := range scores {
					p := scores[j] / sum
					for i := range hd {
						att[h*hd+i] += p * v[first+j][kh*hd+i]
					}
				}
			}
			o := matvec(L.wo, att, nil)
			for i := range D {
				x[t][i] += o[i]
			}
		}
		for t := range n {
			xb := rms(x[t], L.ffnNorm)
			g, u := matvec(L.wGate, xb, nil), matvec(L.wUp, xb, nil)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			d := matvec(L.wDown, g, nil)
			for i := range D {
				x[t][i] += d[i]
			}
		}
	}
	logits := make([][]float64, n)
	for t := range n {
		logits[t] = matvec(w.out, rms(x[t], w.outNorm), nil)
	}
	return logits
}

// Tokenizer metadata for the tests.

// spmTok is a small SentencePiece vocabulary of size n (≥ 259).
func spmTok(n int) map[string]any {
	tokens := []string{"<unk>", "<s>", "</s>"}
	for b := range 256 {
		tokens = append(tokens, "<0x"+strings.ToUpper(hex2(b))+">")
	}
	for i := len(tokens); i < n; i++ {
		tokens = append(tokens, "▁w"+itoa(i))
	}
	return map[string]any{"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
		"tokenizer.ggml.bos_token_id": uint32(1), "tokenizer.ggml.eos_token_id": uint32(2)}
}

func hex2(b int) string {
	const d = "0123456789abcdef"
	return string([]byte{d[b>>4], d[b&15]})
}

// bpeTok is a small byte-level BPE vocabulary of size n (≥ 262): the 256
// byte tokens, a few merges, then the given specials at the end.
func bpeTok(n int, pre string, specials []string, bos, eos int) map[string]any {
	var tokens []string
	for b := range 256 {
		tokens = append(tokens, tokenizer.ByteLevelEncode(string([]byte{byte(b)})))
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w"}
	for _, m := range merges {
		tokens = append(tokens, strings.ReplaceAll(m, " ", ""))
	}
	for len(tokens) < n-len(specials) {
		tokens = append(tokens, "tok"+itoa(len(tokens)))
	}
	types := make([]int32, len(tokens))
	for i := range types {
		types[i] = tokenizer.TypeNormal
	}
	for _, s := range specials {
		tokens = append(tokens, s)
		types = append(types, tokenizer.TypeControl)
	}
	m := map[string]any{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
		"tokenizer.ggml.merges": merges, "tokenizer.ggml.pre": pre}
	if bos >= 0 {
		m["tokenizer.ggml.bos_token_id"] = uint32(bos)
	}
	if eos >= 0 {
		m["tokenizer.ggml.eos_token_id"] = uint32(eos)
	}
	return m
}

// llama3Tok is the Llama 3 vocabulary of ../shared as GGUF metadata.
func llama3Tok(t testing.TB) map[string]any {
	tokens, types, merges, err := tokenizer.ReadGPT2VocabDir(shared.Path(t, "models/llama3-tokenizer"), tokenizer.Llama3Specials())
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
		"tokenizer.ggml.merges": merges, "tokenizer.ggml.pre": "llama-bpe",
		"tokenizer.ggml.bos_token_id": uint32(128000), "tokenizer.ggml.eos_token_id": uint32(128009),
		"tokenizer.ggml.add_bos_token": true}
}

var qwenSpecials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// archCase is one architecture of the logits test.
type archCase struct {
	name string
	spec tinySpec
	rope refRope
	// window is the sliding window the reference applies (0: none).
	window int
	// check inspects the loaded model and tokenizer.
	check func(t *testing.T, m *Model, tok tokenizer.Tokenizer)
}

func archCases(t *testing.T) []archCase {
	llama31 := Llama3RopeFactors(16, 500000, 8, 1, 4, 64)
	var ref31 []float64
	for _, f := range llama31 {
		ref31 = append(ref31, float64(f))
	}
	// Pure-definition factors for the key-derived case, computed here
	// in float64 (Llama 3.1's published formula with a short original
	// context so every branch occurs at head dim 16).
	refLlama3Factors := func(hd int, theta, factor, low, high, orig float64) []float64 {
		var out []float64
		for j := 0; j < hd/2; j++ {
			wave := 2 * math.Pi * math.Pow(theta, float64(2*j)/float64(hd))
			switch {
			case wave < orig/high:
				out = append(out, 1)
			case wave > orig/low:
				out = append(out, factor)
			default:
				sm := (orig/wave - low) / (high - low)
				out = append(out, 1/((1-sm)/factor+sm))
			}
		}
		return out
	}
	cases := []archCase{
		{
			name: "llama",
			spec: tinySpec{arch: "llama", dim: 64, layers: 2, heads: 4, kvHeads: 2, hidden: 96, ctx: 256, theta: 10000, eps: 1e-5, vocab: 300, tok: spmTok(300), seed: 1},
			rope: refRope{theta: 10000},
		},
		{
			name: "tinyllama-shape", // GQA 8:1-style grouping, untied
			spec: tinySpec{arch: "llama", dim: 64, layers: 3, heads: 8, kvHeads: 1, hidden: 128, ctx: 128, theta: 10000, eps: 1e-5, vocab: 280, tok: spmTok(280), seed: 2},
			rope: refRope{theta: 10000},
		},
		{
			name: "smollm-shape", // 3 query heads per KV head, tied, head dim 16, smollm pre-tokenizer
			spec: tinySpec{arch: "llama", dim: 48, layers: 2, heads: 3, kvHeads: 1, hidden: 64, ctx: 128, theta: 10000, eps: 1e-5, tied: true,
				vocab: 300, tok: bpeTok(300, "smollm", []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 297, 297), seed: 3},
			rope: refRope{theta: 10000},
			check: func(t *testing.T, m *Model, tok tokenizer.Tokenizer) {
				if m.Output != m.TokEmb {
					t.Error("tied classifier not shared")
				}
				if got := tok.Encode("hello 42", false, false); !slices.Equal(got, []int{259, ' ', '4', '2'}) {
					t.Errorf("smollm encode: %v", got)
				}
			},
		},
		{
			name: "llama3.1-rope_freqs",
			spec: tinySpec{arch: "llama", dim: 64, layers: 2, heads: 4, kvHeads: 2, hidden: 96, ctx: 256, theta: 500000, eps: 1e-5, tied: true,
				vocab: 300, tok: spmTok(300), ropeFreqs: llama31, seed: 4},
			rope: refRope{theta: 500000, factors: ref31},
			check: func(t *testing.T, m *Model, tok tokenizer.Tokenizer) {
				if len(m.RopeFreqFactors) != 8 {
					t.Errorf("rope factors %v", m.RopeFreqFactors)
				}
			},
		},
		{
			name: "llama3-scaling-keys",
			spec: tinySpec{arch: "llama", dim: 64, layers: 2, heads: 4, kvHeads: 4, hidden: 96, ctx: 256, theta: 500000, eps: 1e-5,
				vocab: 300, tok: spmTok(300), seed: 5, meta: map[string]any{
					"rope.scaling.type": "llama3", "rope.scaling.factor": float32(8), "rope.scaling.low_freq_factor": float32(1),
					"rope.scaling.high_freq_factor": float32(4), "rope.scaling.original_context_length": uint32(64)}},
			rope: refRope{theta: 500000, factors: refLlama3Factors(16, 500000, 8, 1, 4, 64)},
		},
		{
			name: "linear-scaling",
			spec: tinySpec{arch: "llama", dim: 64, layers: 2, heads: 4, kvHeads: 2, hidden: 96, ctx: 256, theta: 10000, eps: 1e-5,
				vocab: 300, tok: spmTok(300), seed: 6, meta: map[string]any{"rope.scaling.type": "linear", "rope.scaling.factor": float32(4)}},
			rope: refRope{theta: 10000, scale: 4},
		},
		{
			name: "mistral-sliding-window",
			spec: tinySpec{arch: "mistral", dim: 64, layers: 2, heads: 4, kvHeads: 1, hidden: 112, ctx: 256, theta: 1e6, eps: 1e-5,
				vocab: 300, tok: spmTok(300), seed: 7, meta: map[string]any{"attention.sliding_window": uint32(4096)}},
			rope: refRope{theta: 1e6},
			check: func(t *testing.T, m *Model, tok tokenizer.Tokenizer) {
				if m.SlidingWindow != 4096 || m.Rope != RopeInterleaved {
					t.Errorf("sliding window %d, rope %s", m.SlidingWindow, m.Rope)
				}
			},
		},
		{
			// A llama-arch file that states a window gets it.
			name: "llama-sliding-window",
			spec: tinySpec{arch: "llama", dim: 64, layers: 2, heads: 4, kvHeads: 2, hidden: 96, ctx: 256, theta: 10000, eps: 1e-5,
				vocab: 300, tok: spmTok(300), seed: 10, meta: map[string]any{"attention.sliding_window": uint32(10)}},
			rope: refRope{theta: 10000}, window: 10,
			check: func(t *testing.T, m *Model, tok tokenizer.Tokenizer) {
				if m.SlidingWindow != 10 || m.IgnoredSlidingWindow != 0 {
					t.Errorf("sliding window %d, ignored %d", m.SlidingWindow, m.IgnoredSlidingWindow)
				}
			},
		},
		{
			// Qwen2's sliding_window is not applied (use_sliding_window is
			// not in GGUF and false in the released models): full attention.
			name: "qwen2-sliding-window-ignored",
			spec: tinySpec{arch: "qwen2", dim: 64, layers: 2, heads: 4, kvHeads: 2, hidden: 96, ctx: 256, theta: 1e6, eps: 1e-6, tied: true, biases: true,
				vocab: 300, tok: bpeTok(300, "qwen2", qwenSpecials, 297, 299), seed: 11, meta: map[string]any{"attention.sliding_window": uint32(8)}},
			rope: refRope{neox: true, theta: 1e6},
			check: func(t *testing.T, m *Model, tok tokenizer.Tokenizer) {
				if m.SlidingWindow != 0 || m.IgnoredSlidingWindow != 8 {
					t.Errorf("sliding window %d, ignored %d", m.SlidingWindow, m.IgnoredSlidingWindow)
				}
			},
		},
		{
			name: "qwen2",
			spec: tinySpec{arch: "qwen2", dim: 64, layers: 2, heads: 4, kvHeads: 2, hidden: 96, ctx: 256, theta: 1e6, eps: 1e-6, tied: true, biases: true,
				vocab: 300, tok: bpeTok(300, "qwen2", qwenSpecials, 297, 299), seed: 8},
			rope: refRope{neox: true, theta: 1e6},
			check: func(t *testing.T, m *Model, tok tokenizer.Tokenizer) {
				if m.Rope != RopeNeoX || m.Layers[0].Bq == nil {
					t.Errorf("qwen2: rope %s, bias %v", m.Rope, m.Layers[0].Bq != nil)
				}
				if tokenizer.AddsBOS(tok) {
					t.Error("qwen2 without add_bos_token must not add BOS")
				}
				got := tok.Encode("<|im_start|>hello world<|im_end|>", false, false)
				if want := []int{298, 259, 260, 'o', 'r', 'l', 'd', 299}; !slices.Equal(got, want) {
					t.Errorf("qwen2 encode: %v, want %v", got, want)
				}
			},
		},
		{
			name: "head-dim-key", // attention.key_length differs from dim/heads
			spec: tinySpec{arch: "llama", dim: 48, headDim: 32, layers: 2, heads: 4, kvHeads: 2, hidden: 64, ctx: 128, theta: 10000, eps: 1e-5,
				vocab: 300, tok: spmTok(300), seed: 9},
			rope: refRope{theta: 10000},
		},
	}
	return cases
}

func compareLogits(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	var worst float64
	at := 0
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d > worst || math.IsNaN(d) {
			worst, at = d, i
			if math.IsNaN(d) {
				break
			}
		}
	}
	if !(worst <= tol) {
		t.Errorf("%s: logit %d is %g, reference %g (|Δ| %.3g > %g)", what, at, got[at], want[at], worst, tol)
	}
}

// TestArchLogitsMatchReference: for each architecture, a random-weight
// GGUF's logits from the forward pass (KV cache at f32) equal the plain
// float64 reference within 1e-4 on every position of a 64-token prompt, in
// one prefill, in chunks, and token by token.
func TestArchLogitsMatchReference(t *testing.T) {
	f32k, err := codec.Parse("f32", codec.Keys)
	if err != nil {
		t.Fatal(err)
	}
	f32v, err := codec.Parse("f32", codec.Values)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range archCases(t) {
		t.Run(c.name, func(t *testing.T) {
			path, w := c.spec.build(t)
			m, tok, err := LoadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if tok.VocabSize() != m.Vocab {
				t.Fatalf("tokenizer %d tokens, model %d", tok.VocabSize(), m.Vocab)
			}
			if c.check != nil {
				c.check(t, m, tok)
			}
			r := rand.New(rand.NewPCG(c.spec.seed, 7))
			prompt := make([]int, 64)
			for i := range prompt {
				prompt[i] = r.IntN(c.spec.vocab)
			}
			ref := refForward(c.spec, w, c.rope, prompt, c.window)
			V := m.Vocab
			for _, chunk := range []int{128, 17} {
				seq, err := m.NewStandaloneSequence(KVOptions{K: f32k, V: f32v, BlockTokens: 16})
				if err != nil {
					t.Fatal(err)
				}
				seq.Chunk = chunk
				logits, err := seq.Forward(prompt, true)
				if err != nil {
					t.Fatal(err)
				}
				for p := range prompt {
					compareLogits(t, "prefill chunk "+itoa(chunk)+" pos "+itoa(p), logits[p*V:(p+1)*V], ref[p], 1e-4)
				}
				seq.Close()
			}
			seq, err := m.NewStandaloneSequence(KVOptions{K: f32k, V: f32v})
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			for p, id := range prompt {
				logits, err := seq.Forward([]int{id}, false)
				if err != nil {
					t.Fatal(err)
				}
				compareLogits(t, "decode pos "+itoa(p), logits, ref[p], 1e-4)
			}
		})
	}
}

// TestLlama3Tiny: a llama3-tiny model (width 64, the 128K Llama 3
// vocabulary of ../shared, rope_freqs) loads with its BPE tokenizer, encodes
// the known strings, and its logits match the reference.
func TestLlama3Tiny(t *testing.T) {
	if testing.Short() {
		t.Skip("128K-vocabulary model")
	}
	tokMeta := llama3Tok(t)
	factors := Llama3RopeFactors(16, 500000, 32, 1, 4, 8192)
	var ref []float64
	for _, f := range factors {
		ref = append(ref, float64(f))
	}
	spec := tinySpec{arch: "llama", dim: 64, layers: 2, heads: 4, kvHeads: 2, hidden: 128, ctx: 512, theta: 500000, eps: 1e-5,
		tied: true, vocab: 128256, tok: tokMeta, ropeFreqs: factors, seed: 31}
	path, w := spec.build(t)
	m, tok, err := LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, ok := tok.(*tokenizer.BPE); !ok {
		t.Fatalf("tokenizer is %T, want *tokenizer.BPE", tok)
	}
	if got := tok.Encode("<|begin_of_text|>A<|end_of_text|>B!", false, false); !slices.Equal(got, []int{128000, 32, 128001, 33, 0}) {
		t.Errorf("encode: %v", got)
	}
	if got := tok.Encode("hello world", tokenizer.AddsBOS(tok), false); !slices.Equal(got, []int{128000, 15339, 1917}) {
		t.Errorf("encode with BOS: %v", got)
	}
	text := "The quick brown fox jumps over the lazy dog. In 2024 there are 366 days; I'm sure it's fine!!"
	prompt := tok.Encode(strings.Repeat(text+" ", 4), true, false)[:64]
	want := refForward(spec, w, refRope{theta: 500000, factors: ref}, prompt, 0)
	seq, err := m.NewStandaloneSequence(KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	logits, err := seq.Forward(prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	for p := range prompt {
		compareLogits(t, "pos "+itoa(p), logits[p*m.Vocab:(p+1)*m.Vocab], want[p], 1e-4)
	}
}

func TestArchErrors(t *testing.T) {
	base := tinySpec{arch: "llama", dim: 32, layers: 1, heads: 2, kvHeads: 1, hidden: 48, ctx: 64, theta: 10000, eps: 1e-5, vocab: 270, tok: spmTok(270), seed: 1}
	cases := []struct {
		name   string
		mod    func(s *tinySpec)
		substr string
	}{
		{"unknown arch", func(s *tinySpec) { s.arch = "gpt-neox" }, `architecture "gpt-neox" is not supported (supported: gemma2, gemma3, llama, mistral, phi3, qwen2, qwen3)`},
		{"unknown pre-tokenizer", func(s *tinySpec) { s.tok = bpeTok(270, "tekken", nil, -1, -1) }, `tokenizer.ggml.pre "tekken" is not supported`},
		{"unknown tokenizer model", func(s *tinySpec) {
			s.tok = map[string]any{"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": []string{"a"}}
		}, `tokenizer.ggml.model "bert" is not supported`},
		{"yarn", func(s *tinySpec) { s.meta = map[string]any{"rope.scaling.type": "yarn"} }, `llama.rope.scaling.type = "yarn" is not supported`},
		{"rope_freqs shape", func(s *tinySpec) { s.ropeFreqs = []float32{1, 2, 3} }, "rope_freqs.weight has shape [3], want [8]"},
		{"rope_freqs zero", func(s *tinySpec) { s.ropeFreqs = make([]float32, 8) }, "RoPE frequency factor 0 is 0"},
		{"qwen2 without biases", func(s *tinySpec) { s.arch = "qwen2" }, "missing tensor blk.0.attn_q.bias"},
		{"bad scaling factor", func(s *tinySpec) {
			s.meta = map[string]any{"rope.scaling.type": "linear", "rope.scaling.factor": float32(-1)}
		}, "llama.rope.scaling.factor = -1 must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := base
			c.mod(&s)
			path, _ := s.build(t)
			_, _, err := LoadGGUF(path)
			if err == nil || !strings.Contains(err.Error(), c.substr) {
				t.Fatalf("error %v, want it to contain %q", err, c.substr)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("multi-line error %q", err)
			}
		})
	}
}

// TestRopeFreqsDefault: without scaling, RopeFreqs is run.c's formula
// bit for bit (the llama2.c goldens depend on it).
func TestRopeFreqsDefault(t *testing.T) {
	c := Config{HeadDim: 48, RopeTheta: 10000}
	for j, f := range c.RopeFreqs() {
		want := 1 / float32(math.Pow(10000, float64(float32(2*j)/float32(48))))
		if f != want {
			t.Fatalf("freq %d = %g, want %g", j, f, want)
		}
	}
}
