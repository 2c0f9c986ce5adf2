package model

import (
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
	qkNorm bool // per-head RMSNorm of queries and keys before RoPE (qwen3)
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
}

// refArchForward is the forward pass in float64, token after token, every
// layer attending all earlier tokens' keys and values (no cache, no
// kernels): RMSNorm, Q/K/V projections, per-head RMSNorm of Q and K with
// their [head dim] weights (st.qkNorm: Qwen 3's q_norm / k_norm, before
// RoPE), NEOX RoPE (pairs (j, j + d/2)), softmax(q·k/√d), the output
// projection, RMSNorm, SwiGLU. It returns every position's logits.
func refArchForward(s tinySpec, w *tinyWeights, tokens []int, st archStep) [][]float64 {
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
	rotate := func(v []float64, pos int) {
		for j := 0; j < half; j++ {
			a := float64(pos) * math.Pow(float64(s.theta), -float64(2*j)/float64(hd))
			x0, x1 := v[j], v[j+half]
			v[j] = x0*math.Cos(a) - x1*math.Sin(a)
			v[j+half] = x0*math.Sin(a) + x1*math.Cos(a)
		}
	}
	// heads normalises and rotates each head of x ([heads][hd]) in place.
	heads := func(x []float64, nh int, g []float64, pos int) {
		for h := 0; h < nh; h++ {
			v := x[h*hd : (h+1)*hd]
			if st.qkNorm {
				copy(v, rms(v, g))
			}
			rotate(v, pos)
		}
	}
	keys := make([][][]float64, L) // [layer][token] rotated keys
	vals := make([][][]float64, L)
	group := s.heads / s.kvHeads
	logits := make([][]float64, n)
	for t, id := range tokens {
		x := slices.Clone(w.emb[id])
		for i, Ly := range w.layers {
			xb := rms(x, Ly.attnNorm)
			q, k, v := matvec(Ly.wq, xb), matvec(Ly.wk, xb), matvec(Ly.wv, xb)
			heads(q, s.heads, Ly.qNorm, t)
			heads(k, s.kvHeads, Ly.kNorm, t)
			keys[i], vals[i] = append(keys[i], k), append(vals[i], v)
			att := make([]float64, s.heads*hd)
			for h := 0; h < s.heads; h++ {
				kh := h / group
				logit := make([]float64, t+1)
				mx := math.Inf(-1)
				for u := 0; u <= t; u++ {
					var d float64
					for c := 0; c < hd; c++ {
						d += q[h*hd+c] * keys[i][u][kh*hd+c]
					}
					logit[u] = d / math.Sqrt(float64(hd))
					mx = math.Max(mx, logit[u])
				}
				var sum float64
				for u := range logit {
					logit[u] = math.Exp(logit[u] - mx)
					sum += logit[u]
				}
				for u := range logit {
					for c := 0; c < hd; c++ {
						att[h*hd+c] += logit[u] / sum * vals[i][u][kh*hd+c]
					}
				}
			}
			o := matvec(Ly.wo, att)
			for c := 0; c < D; c++ {
				x[c] += o[c]
			}
			xb = rms(x, Ly.ffnNorm)
			g, up := matvec(Ly.wGate, xb), matvec(Ly.wUp, xb)
			for c := range g {
				g[c] = g[c] / (1 + math.Exp(-g[c])) * up[c]
			}
			d := matvec(Ly.wDown, g)
			for c := 0; c < D; c++ {
				x[c] += d[c]
			}
		}
		logits[t] = matvec(w.out, rms(x, w.outNorm))
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
			V := m.Vocab
			newSeq := func(t *testing.T) *Sequence {
				seq, err := m.NewStandaloneSequence(KVOptions{K: fk, V: fv, BlockTokens: 16})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(seq.Close)
				return seq
			}
			for _, chunk := range []int{128, 17, 5} {
				t.Run("prefill chunk "+itoa(chunk), func(t *testing.T) {
					seq := newSeq(t)
					seq.Chunk = chunk
					logits, err := seq.Forward(prompt, true)
					if err != nil {
						t.Fatal(err)
					}
					for p := range prompt {
						compareLogits(t, "pos "+itoa(p), logits[p*V:(p+1)*V], ref[p], 1e-4)
					}
				})
			}
			t.Run("token by token", func(t *testing.T) {
				seq := newSeq(t)
				for p := range prompt {
					logits, err := seq.Forward(prompt[p:p+1], false)
					if err != nil {
						t.Fatal(err)
					}
					compareLogits(t, "pos "+itoa(p), logits, ref[p], 1e-4)
				}
			})
			t.Run("decode batch", func(t *testing.T) {
				seqs := make([]*Sequence, 3)
				for i, pre := range []int{1, 20, 45} {
					seqs[i] = newSeq(t)
					if _, err := seqs[i].Forward(prompts[i][:pre], false); err != nil {
						t.Fatal(err)
					}
				}
				for {
					var batch []*Sequence
					var toks, who, pos []int
					for i, s := range seqs {
						if s.Pos() < T {
							batch, toks, who, pos = append(batch, s), append(toks, prompts[i][s.Pos()]), append(who, i), append(pos, s.Pos())
						}
					}
					if len(batch) == 0 {
						break
					}
					out, err := m.DecodeBatch(batch, toks)
					if err != nil {
						t.Fatal(err)
					}
					for j, i := range who {
						compareLogits(t, "sequence "+itoa(i)+" pos "+itoa(pos[j]), out[j], refs[i][pos[j]], 1e-4)
					}
				}
			})
		})
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
