package model

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The architectures beyond the llama shape (qwen3, …): each one's tiny
// random-weight GGUF against a float64 reference written from the
// architecture's definition (Hugging Face's modeling code, llama.cpp's
// src/models/*.cpp).

// archStep is one architecture-specific step the reference can switch off,
// to show that the match is that step's doing.
type archStep struct {
	qkNorm    bool      // per-head RMSNorm of queries and keys before RoPE (qwen3, gemma3)
	embScale  float64   // the embedding times this (gemma3: √dim); 0: 1
	postNorms bool      // RMSNorm of the attention and FFN outputs before their residual adds (gemma3)
	gelu      bool      // GeGLU (tanh GELU) instead of SwiGLU (gemma3)
	attnScale float64   // q·k times this; 0: 1/√head dim
	win       []int     // each layer's window (0 or nil: full attention)
	local     float64   // the RoPE base of the windowed layers (gemma3); 0: theta
	softcap   float64   // final logits c·tanh(x/c); 0: none
	attnCap   float64   // scaled attention scores c·tanh(s/c); 0: none (gemma2)
	swapGU    bool      // gate and up exchanged: the halves of a fused ffn_up read the wrong way round
	factors   []float32 // each RoPE pair's frequency divided by factors[j] (phi3 LongRoPE); nil: 1
	mscale    float64   // rotated queries and keys times this (rope.scaling.attn_factor); 0: 1
}

// newArch is an architecture's tiny model and its special steps.
type newArch struct {
	name  string
	spec  tinySpec
	steps archStep
	// off are the steps switched off one at a time: the reference without
	// each must be far (> 1e-2) from kvlm's logits.
	off map[string]archStep
}

var newArchs = []newArch{
	{name: "qwen3",
		// Qwen 3's layout: head dim (32) not dim/heads (16), so the Q width
		// 128 differs from the embedding width 64, as Qwen3-0.6B's 2048
		// against 1024; NEOX RoPE, θ 1e6, eps 1e-6, untied classifier.
		spec: tinySpec{arch: "qwen3", dim: 64, layers: 2, heads: 4, kvHeads: 2, headDim: 32, hidden: 96, ctx: 256,
			theta: 1e6, eps: 1e-6, qkNorm: true, vocab: 300, tok: spmTok(300), seed: 53},
		steps: archStep{qkNorm: true},
		off:   map[string]archStep{"Q/K norm": {}}},
	{name: "gemma3",
		// Gemma 3's layout on 6 layers: layers 0-4 local (window 8, RoPE
		// base 10000 from rope.freq_base_swa), layer 5 global (θ 1e6), as
		// the default sliding_window_pattern 6; embedding × √64, Q/K norms,
		// post-norms, GeGLU, tied classifier.
		spec: tinySpec{arch: "gemma3", dim: 64, layers: 6, heads: 4, kvHeads: 2, headDim: 32, hidden: 96, ctx: 256,
			theta: 1e6, eps: 1e-6, qkNorm: true, postNorms: true, tied: true, vocab: 300, tok: spmTok(300), seed: 59,
			meta: map[string]any{"attention.sliding_window": uint32(8), "rope.freq_base_swa": float32(10000)}},
		steps: gemma3Steps(nil),
		off: map[string]archStep{
			"Q/K norm": gemma3Steps(func(s *archStep) { s.qkNorm = false }), "embedding scale": gemma3Steps(func(s *archStep) { s.embScale = 0 }),
			"post-norms": gemma3Steps(func(s *archStep) { s.postNorms = false }), "GeGLU": gemma3Steps(func(s *archStep) { s.gelu = false }),
			"local RoPE base": gemma3Steps(func(s *archStep) { s.local = 0 }), "windows": gemma3Steps(func(s *archStep) { s.win = nil }),
		}},
}

func init() {
	// Phi-3's layout: fused attn_qkv and ffn_up (gate rows, then up), NEOX
	// RoPE, GQA (Phi-3-medium's 40 heads on 10 KV heads).
	newArchs = append(newArchs, newArch{name: "phi3",
		spec: tinySpec{arch: "phi3", dim: 64, layers: 2, heads: 4, kvHeads: 2, hidden: 96, ctx: 256,
			theta: 10000, eps: 1e-5, fused: true, vocab: 300, tok: spmTok(300), seed: 67},
		off: map[string]archStep{"fused gate/up order": {swapGU: true}}})
	// Gemma 2 on 6 layers: local (window 8) and global layers alternate
	// (the default sliding_window_pattern 2), one RoPE base; embedding ×
	// √64, post-norms, GeGLU, attention and final soft-capping (small caps,
	// 2 and 3, so that they bend these scores and logits).
	newArchs = append(newArchs, newArch{name: "gemma2",
		spec: tinySpec{arch: "gemma2", dim: 64, layers: 6, heads: 4, kvHeads: 2, headDim: 32, hidden: 96, ctx: 256,
			theta: 10000, eps: 1e-6, postNorms: true, tied: true, vocab: 300, tok: spmTok(300), seed: 61,
			meta: map[string]any{"attention.sliding_window": uint32(8), "attn_logit_softcapping": float32(2), "final_logit_softcapping": float32(3)}},
		steps: gemma2Steps(nil),
		off: map[string]archStep{
			"attention soft-cap": gemma2Steps(func(s *archStep) { s.attnCap = 0 }), "final soft-cap": gemma2Steps(func(s *archStep) { s.softcap = 0 }),
			"embedding scale": gemma2Steps(func(s *archStep) { s.embScale = 0 }), "post-norms": gemma2Steps(func(s *archStep) { s.postNorms = false }),
			"GeGLU": gemma2Steps(func(s *archStep) { s.gelu = false }), "windows": gemma2Steps(func(s *archStep) { s.win = nil }),
		}})
	// Phi-3 LongRoPE (the 128K models): two sets of frequency divisors and
	// the attention factor llama.cpp's converter writes,
	// √(1 + ln(ctx/orig)/ln orig). Context 256 over an original 64: the
	// long set (llama.cpp's choice for a context above the original); an
	// original of 256: the short set, attention factor 1.
	long, short := make([]float32, 8), make([]float32, 8)
	for j := range long {
		long[j], short[j] = 1.5+3*float32(j), 1+0.25*float32(j)
	}
	af := float32(math.Sqrt(1 + math.Log(256.0/64)/math.Log(64)))
	p := newArchs[len(newArchs)-2]
	p.name = "phi3 longrope"
	p.spec.ropeLong, p.spec.ropeShort, p.spec.seed = long, short, 71
	p.spec.meta = map[string]any{"rope.scaling.original_context_length": uint32(64), "rope.scaling.attn_factor": af}
	p.steps = archStep{factors: long, mscale: float64(af)}
	p.off = map[string]archStep{"the long set": {factors: short, mscale: float64(af)}, "the attention factor": {factors: long}}
	newArchs = append(newArchs, p)
	p.name = "phi3 longrope short"
	p.spec.meta = map[string]any{"rope.scaling.original_context_length": uint32(256), "rope.scaling.attn_factor": float32(1)}
	p.steps = archStep{factors: short}
	p.off = map[string]archStep{"the short set": {factors: long}}
	newArchs = append(newArchs, p)
	// gemma3 with final_logit_softcapping (llama.cpp reads it when present).
	g := newArchs[1]
	g.name = "gemma3 softcap"
	g.spec.meta = map[string]any{"attention.sliding_window": uint32(8), "rope.freq_base_swa": float32(10000), "final_logit_softcapping": float32(3)}
	g.steps = gemma3Steps(func(s *archStep) { s.softcap = 3 })
	g.off = map[string]archStep{"soft-capping": gemma3Steps(nil)}
	newArchs = append(newArchs, g)
}

// gemma2Steps are the gemma2 case's steps, changed by f.
func gemma2Steps(f func(*archStep)) archStep {
	s := archStep{embScale: 8, postNorms: true, gelu: true, win: []int{8, 0, 8, 0, 8, 0}, attnCap: 2, softcap: 3}
	if f != nil {
		f(&s)
	}
	return s
}

// gemma3Steps are the gemma3 case's steps, changed by f.
func gemma3Steps(f func(*archStep)) archStep {
	s := archStep{qkNorm: true, embScale: 8, postNorms: true, gelu: true, win: []int{8, 8, 8, 8, 8, 0}, local: 10000}
	if f != nil {
		f(&s)
	}
	return s
}

// refArchForward is the forward pass in float64, token after token, every
// layer attending all earlier tokens' keys and values (no cache, no
// kernels): RMSNorm, Q/K/V projections, per-head RMSNorm of Q and K with
// their [head dim] weights (st.qkNorm: Qwen 3's q_norm / k_norm, before
// RoPE), NEOX RoPE (pairs (j, j + d/2)), softmax(q·k/√d), the output
// projection, RMSNorm, SwiGLU. It returns every position's logits.
func refArchForward(s tinySpec, w *tinyWeights, tokens []int, st archStep) [][]float64 {
	return refArchRun(s, w, tokens, st, nil)
}

// refCache says, for token t at layer i, which earlier tokens' keys and
// values it attends (idx, indices into the tokens, ascending), at which
// positions (pos[r] the position of token idx[r]), and token t's own
// position qpos: the cache a policy left, re-indexed positions included.
type refCache func(t, i int) (idx, pos []int, qpos int)

// refArchRun is refArchForward over the cache kept describes (nil: every
// earlier token at its own position). The keys are kept before RoPE and
// rotated at their current positions with their layer's base at every
// step: what re-indexing the cached keys must give.
func refArchRun(s tinySpec, w *tinyWeights, tokens []int, st archStep, kept refCache) [][]float64 {
	n, D, hd, L := len(tokens), s.dim, s.hd(), s.layers
	half := hd / 2
	rms := func(x, g []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+float64(s.eps))
		out := make([]float64, len(x))
		for i := range x {
			out[i] = x[i] * inv * g[i]
		}
		return out
	}
	matvec := func(m [][]float64, x []float64) []float64 {
		out := make([]float64, len(m))
		for i, row := range m {
			for j, v := range row {
				out[i] += v * x[j]
			}
		}
		return out
	}
	window := func(i int) int {
		if st.win == nil {
			return 0
		}
		return st.win[i]
	}
	theta := float64(s.theta)
	mscale := 1.0
	if st.mscale != 0 {
		mscale = st.mscale
	}
	rotate := func(v []float64, pos int) {
		for j := 0; j < half; j++ {
			a := float64(pos) * math.Pow(theta, -float64(2*j)/float64(hd))
			if st.factors != nil {
				a /= float64(st.factors[j])
			}
			x0, x1 := v[j], v[j+half]
			v[j] = mscale * (x0*math.Cos(a) - x1*math.Sin(a))
			v[j+half] = mscale * (x0*math.Sin(a) + x1*math.Cos(a))
		}
	}
	// heads normalises each head of x ([heads][hd]) in place, and rotates
	// it to pos unless pos < 0.
	heads := func(x []float64, nh int, g []float64, pos int) {
		for h := 0; h < nh; h++ {
			v := x[h*hd : (h+1)*hd]
			if st.qkNorm {
				copy(v, rms(v, g))
			}
			if pos >= 0 {
				rotate(v, pos)
			}
		}
	}
	keys := make([][][]float64, L) // [layer][token] keys before RoPE
	vals := make([][][]float64, L)
	group := s.heads / s.kvHeads
	logits := make([][]float64, n)
	scale := 1 / math.Sqrt(float64(hd))
	if st.attnScale != 0 {
		scale = st.attnScale
	}
	for t, id := range tokens {
		x := slices.Clone(w.emb[id])
		if st.embScale != 0 {
			for c := range x {
				x[c] *= st.embScale
			}
		}
		for i, Ly := range w.layers {
			theta = float64(s.theta)
			if st.local != 0 && window(i) > 0 {
				theta = st.local
			}
			xb := rms(x, Ly.attnNorm)
			q, k, v := matvec(Ly.wq, xb), matvec(Ly.wk, xb), matvec(Ly.wv, xb)
			var seen, pos []int // the tokens attended and their positions, token t last
			p := t              // token t's position
			if kept == nil {
				for u := range t {
					seen, pos = append(seen, u), append(pos, u)
				}
			} else {
				seen, pos, p = kept(t, i)
				seen, pos = slices.Clone(seen), slices.Clone(pos)
			}
			seen, pos = append(seen, t), append(pos, p)
			heads(q, s.heads, Ly.qNorm, p)
			heads(k, s.kvHeads, Ly.kNorm, -1)
			keys[i], vals[i] = append(keys[i], k), append(vals[i], v)
			rk := make([][]float64, len(seen)) // the keys at their positions
			for r, u := range seen {
				rk[r] = slices.Clone(keys[i][u])
				for h := 0; h < s.kvHeads; h++ {
					rotate(rk[r][h*hd:(h+1)*hd], pos[r])
				}
			}
			att := make([]float64, s.heads*hd)
			for h := 0; h < s.heads; h++ {
				kh := h / group
				logit := make([]float64, len(seen))
				mx := math.Inf(-1)
				for r := range seen {
					if w := window(i); w > 0 && p-pos[r] >= w {
						logit[r] = math.Inf(-1) // outside the window
						continue
					}
					var d float64
					for c := 0; c < hd; c++ {
						d += q[h*hd+c] * rk[r][kh*hd+c]
					}
					logit[r] = d * scale
					if st.attnCap != 0 {
						logit[r] = st.attnCap * math.Tanh(logit[r]/st.attnCap)
					}
					mx = math.Max(mx, logit[r])
				}
				var sum float64
				for r := range logit {
					logit[r] = math.Exp(logit[r] - mx)
					sum += logit[r]
				}
				for r, u := range seen {
					for c := 0; c < hd; c++ {
						att[h*hd+c] += logit[r] / sum * vals[i][u][kh*hd+c]
					}
				}
			}
			o := matvec(Ly.wo, att)
			if st.postNorms {
				o = rms(o, Ly.attnPost)
			}
			for c := 0; c < D; c++ {
				x[c] += o[c]
			}
			xb = rms(x, Ly.ffnNorm)
			g, up := matvec(Ly.wGate, xb), matvec(Ly.wUp, xb)
			if st.swapGU {
				g, up = up, g
			}
			for c := range g {
				if st.gelu {
					z := g[c]
					g[c] = 0.5 * z * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(z+0.044715*z*z*z))) * up[c]
				} else {
					g[c] = g[c] / (1 + math.Exp(-g[c])) * up[c]
				}
			}
			d := matvec(Ly.wDown, g)
			if st.postNorms {
				d = rms(d, Ly.ffnPost)
			}
			for c := 0; c < D; c++ {
				x[c] += d[c]
			}
		}
		logits[t] = matvec(w.out, rms(x, w.outNorm))
		if st.softcap != 0 {
			for c := range logits[t] {
				logits[t][c] = st.softcap * math.Tanh(logits[t][c]/st.softcap)
			}
		}
	}
	return logits
}

// TestArchsMatchReference: each architecture's tiny GGUF gives the
// reference's logits within 1e-4 at every one of 64 positions (the prompt
// as one Forward, in chunks of 17 and 5, token by token, and in
// DecodeBatch beside sequences at other positions), and the reference with
// any of the architecture's special steps switched off is far from them.
func TestArchsMatchReference(t *testing.T) {
	const T = 64
	fk, fv := f32Codecs(t)
	for _, a := range newArchs {
		t.Run(a.name, func(t *testing.T) {
			path, w := a.spec.build(t)
			m, _, err := LoadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			// Local layers are per-layer windows, so the cache bounds them.
			if a.steps.win != nil && (!slices.Equal(m.LayerWindows, a.steps.win) || m.CacheWindows() == nil) {
				t.Fatalf("layer windows %v (cache windows %v), want %v", m.LayerWindows, m.CacheWindows(), a.steps.win)
			}
			r := rand.New(rand.NewPCG(11, uint64(len(a.name))))
			prompts := make([][]int, 3)
			refs := make([][][]float64, 3)
			for i := range prompts {
				prompts[i] = make([]int, T)
				for j := range prompts[i] {
					prompts[i][j] = r.IntN(a.spec.vocab)
				}
				refs[i] = refArchForward(a.spec, w, prompts[i], a.steps)
			}
			prompt, ref := prompts[0], refs[0]
			for name, st := range a.off {
				if d := maxLogitDiff(ref, refArchForward(a.spec, w, prompt, st)); d < 1e-2 {
					t.Fatalf("switching off %s changes the reference's logits by only %.3g", name, d)
				}
			}
			checkForwardPaths(t, m, KVOptions{K: fk, V: fv}, prompts, refs, refPaths{tokenByToken: true})
		})
	}
}

// TestGemmaDefaults: without the keys, a gemma2 file gets llama.cpp's
// defaults (window 4096 on every other layer from layer 0, attention
// soft-cap 50, final 30, one RoPE base) and a gemma3 file no local layers
// and no soft-capping; a 27B-shaped layer count takes the query scale
// 1/√(dim/heads).
func TestGemmaDefaults(t *testing.T) {
	g2 := tinySpec{arch: "gemma2", dim: 64, layers: 4, heads: 4, kvHeads: 2, headDim: 32, hidden: 96, ctx: 256,
		theta: 10000, eps: 1e-6, postNorms: true, tied: true, vocab: 300, tok: spmTok(300), seed: 3}
	path, _ := g2.build(t)
	m, _, err := LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config
	m.Close()
	if !slices.Equal(c.LayerWindows, []int{4096, 0, 4096, 0}) || c.AttnSoftcap != 50 || c.FinalSoftcap != 30 || c.LocalRopeTheta != 0 || c.AttnScale != 0 {
		t.Errorf("gemma2 defaults: windows %v, soft-caps %g %g, local θ %g, scale %g", c.LayerWindows, c.AttnSoftcap, c.FinalSoftcap, c.LocalRopeTheta, c.AttnScale)
	}
	g3 := g2
	g3.arch, g3.qkNorm = "gemma3", true
	path, _ = g3.build(t)
	if m, _, err = LoadGGUF(path); err != nil {
		t.Fatal(err)
	}
	c = m.Config
	m.Close()
	if c.LayerWindows != nil || c.AttnSoftcap != 0 || c.FinalSoftcap != 0 || c.EmbedScale != 8 {
		t.Errorf("gemma3 defaults: windows %v, soft-caps %g %g, embedding ×%g", c.LayerWindows, c.AttnSoftcap, c.FinalSoftcap, c.EmbedScale)
	}
	big := g2
	big.layers = 46 // Gemma 2 27B's count: dim/heads = 16, head dim 32
	path, _ = big.build(t)
	if m, _, err = LoadGGUF(path); err != nil {
		t.Fatal(err)
	}
	c = m.Config
	m.Close()
	if c.AttnScale != 0.25 {
		t.Errorf("46-layer gemma2: query scale %g, want 1/√16", c.AttnScale)
	}
}

// TestArchLoadErrors: a qwen3 file without its Q/K norm weights, or with
// one of the wrong length, is refused with the tensor's name.
func TestArchLoadErrors(t *testing.T) {
	base := newArchs[0].spec
	cases := []struct {
		name string
		skip []string
		want string
	}{
		{"no q norm", []string{"blk.1.attn_q_norm.weight"}, "missing tensor blk.1.attn_q_norm.weight"},
		{"no k norm", []string{"blk.0.attn_k_norm.weight"}, "missing tensor blk.0.attn_k_norm.weight"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := base
			s.skip = c.skip
			path, _ := s.build(t)
			_, _, err := LoadGGUF(path)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

// TestSlidingWindowPatternArray: a per-layer sliding_window_pattern (an
// array, as gemma3n's converter writes) is refused on gemma2 and gemma3
// with the reason, and a number other than the default is read.
// llama.cpp reads only a number for these architectures (an array is
// ignored there, the default period kept), so kvlm does not guess.
func TestSlidingWindowPatternArray(t *testing.T) {
	for _, c := range []struct {
		arch    string
		pattern any
		want    string // the error; "" for none
		windows []int  // else the layer windows
	}{
		{"gemma3", []bool{true, true, false, true, true, false}, "gemma3.attention.sliding_window_pattern is an array (per-layer, as gemma3n's); gemma3 takes a number", nil},
		{"gemma3", []uint32{6, 6, 6, 6, 6, 6}, "is an array", nil},
		{"gemma2", []bool{true, false, true, false, true, false}, "gemma2.attention.sliding_window_pattern is an array", nil},
		{"gemma3", uint32(3), "", []int{8, 8, 0, 8, 8, 0}},
		{"gemma3", "3", "sliding_window_pattern", nil},
	} {
		t.Run(fmt.Sprintf("%s %T", c.arch, c.pattern), func(t *testing.T) {
			var s tinySpec
			for _, a := range newArchs {
				if a.name == c.arch {
					s = a.spec
				}
			}
			s.meta = maps.Clone(s.meta)
			s.meta["attention.sliding_window_pattern"] = c.pattern
			path, _ := s.build(t)
			m, _, err := LoadGGUF(path)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if !slices.Equal(m.LayerWindows, c.windows) {
					t.Fatalf("layer windows %v, want %v", m.LayerWindows, c.windows)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

// TestLongRopeErrors: LongRoPE files kvlm cannot run as llama.cpp does are
// refused with the reason: one factor set of the two, factors of the wrong
// length, rope_freqs beside them, the tensors on another architecture, a
// non-positive attention factor or original context.
func TestLongRopeErrors(t *testing.T) {
	var phi tinySpec
	for _, a := range newArchs {
		if a.name == "phi3 longrope" {
			phi = a.spec
		}
	}
	f := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	for _, c := range []struct {
		name string
		edit func(s *tinySpec)
		want string
	}{
		{"long only", func(s *tinySpec) { s.skip = []string{"rope_factors_short.weight"} }, "needs both rope_factors_long.weight and rope_factors_short.weight"},
		{"short only", func(s *tinySpec) { s.skip = []string{"rope_factors_long.weight"} }, "needs both"},
		{"long factors too short", func(s *tinySpec) { s.ropeLong = f[:4] }, "tensor rope_factors_long.weight has shape [4], want [8]"},
		{"short set chosen, wrong length", func(s *tinySpec) {
			s.ropeShort = f[:5]
			s.meta = map[string]any{"rope.scaling.original_context_length": uint32(256)}
		}, "tensor rope_factors_short.weight has shape [5], want [8]"},
		{"rope_freqs beside", func(s *tinySpec) { s.ropeFreqs = f }, "rope_freqs.weight beside LongRoPE"},
		{"not phi3", func(s *tinySpec) { s.arch, s.fused = "llama", false }, "llama.cpp reads them for phi3 only, not llama"},
		{"attention factor 0", func(s *tinySpec) { s.meta = map[string]any{"rope.scaling.attn_factor": float32(0)} }, "rope.scaling.attn_factor = 0 must be positive"},
		{"original context 0", func(s *tinySpec) { s.meta = map[string]any{"rope.scaling.original_context_length": uint32(0)} }, "original_context_length = 0 is out of range"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := phi
			s.meta = maps.Clone(phi.meta)
			c.edit(&s)
			path, _ := s.build(t)
			_, _, err := LoadGGUF(path)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}
