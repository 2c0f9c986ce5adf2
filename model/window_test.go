package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// windowSpec is a tiny random-weight Mistral whose GGUF asks for a sliding
// window of w tokens (GQA: 2 query heads per KV head).
func windowSpec(w int) tinySpec {
	return tinySpec{arch: "mistral", dim: 64, layers: 2, heads: 4, kvHeads: 2, hidden: 96, ctx: 256, theta: 10000, eps: 1e-5,
		vocab: 300, tok: spmTok(300), seed: 21, meta: map[string]any{"attention.sliding_window": uint32(w)}}
}

func f32Codecs(t *testing.T) (k, v codec.Codec) {
	t.Helper()
	k, err := codec.Parse("f32", codec.Keys)
	if err != nil {
		t.Fatal(err)
	}
	v, err = codec.Parse("f32", codec.Values)
	if err != nil {
		t.Fatal(err)
	}
	return k, v
}

// TestSlidingWindowMatchesReference: a Mistral GGUF with a sliding window
// shorter than the prompt gives the logits of the plain float64 reference
// with that window (HF Mistral's mask: key j visible to query i iff
// 0 ≤ i − j < W) at every position: the whole prompt as one matrix, in
// chunks that straddle the window's edge, token by token, a prefill then
// decode, and in DecodeBatch beside sequences at other positions.
func TestSlidingWindowMatchesReference(t *testing.T) {
	const T = 64
	fk, fv := f32Codecs(t)
	for _, W := range []int{1, 7, 16, 24, 63, 64, 200} {
		t.Run("W="+itoa(W), func(t *testing.T) {
			spec := windowSpec(W)
			path, w := spec.build(t)
			m, _, err := LoadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.SlidingWindow != W {
				t.Fatalf("sliding window %d, want %d", m.SlidingWindow, W)
			}
			r := rand.New(rand.NewPCG(uint64(W), 5))
			prompts := make([][]int, 3)
			refs := make([][][]float64, 3)
			for i := range prompts {
				prompts[i] = make([]int, T)
				for j := range prompts[i] {
					prompts[i][j] = r.IntN(spec.vocab)
				}
				refs[i] = refForward(spec, w, refRope{theta: 10000}, prompts[i], W)
			}
			checkForwardPaths(t, m, KVOptions{K: fk, V: fv}, prompts, refs, refPaths{prefillDecode: true})
		})
	}
}

// capture records each layer's queries and attention mass (MassHook) and
// attention output (AttnTap) of one forward step.
type capture struct {
	slots func(layer, head int) int
	req   map[int]*attention.MassRequest
	q     map[int][]float32
	pos   map[int][]int32
	out   map[int][]float32
}

func (c *capture) Request(layer, start, n int) *attention.MassRequest {
	r := &attention.MassRequest{Agg: attention.AggSum, Out: make([][]float32, 2)}
	for h := range r.Out {
		r.Out[h] = make([]float32, c.slots(layer, h))
	}
	return r
}

func (c *capture) Done(layer int, req *attention.MassRequest, q []float32, pos []int32) {
	c.req[layer], c.q[layer], c.pos[layer] = req, append([]float32(nil), q...), append([]int32(nil), pos...)
}

// TestSlidingWindowAttentionNaive: each layer's attention output, for a
// prefill of several window lengths and for a decode step, equals a naive
// windowed attention over the keys and values the cache holds (read back
// slot by slot), and the attention mass the policies see is exactly zero
// outside the window.
func TestSlidingWindowAttentionNaive(t *testing.T) {
	const W = 13
	fk, fv := f32Codecs(t)
	spec := windowSpec(W)
	path, _ := spec.build(t)
	m, _, err := LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seq, err := m.NewStandaloneSequence(KVOptions{K: fk, V: fv, BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	r := rand.New(rand.NewPCG(3, 4))
	tokens := make([]int, 51)
	for i := range tokens {
		tokens[i] = r.IntN(spec.vocab)
	}
	hd, G, H := m.HeadDim, m.GroupSize(), m.KVHeads
	for _, step := range []struct {
		name   string
		tokens []int
	}{{"prefill", tokens[:50]}, {"decode", tokens[50:]}} {
		t.Run(step.name, func(t *testing.T) {
			c := &capture{req: map[int]*attention.MassRequest{}, q: map[int][]float32{}, pos: map[int][]int32{}, out: map[int][]float32{},
				slots: func(l, h int) int {
					n := 0
					for _, s := range seq.cache.Segments(l, h) {
						n += s.N
					}
					return n
				}}
			seq.Mass = c
			seq.AttnTap = func(l int, out []float32) { c.out[l] = append([]float32(nil), out...) }
			defer func() { seq.Mass, seq.AttnTap = nil, nil }()
			if _, err := seq.Forward(step.tokens, false); err != nil {
				t.Fatal(err)
			}
			for l := range m.Layers {
				q, qpos, out, req := c.q[l], c.pos[l], c.out[l], c.req[l]
				for h := range H {
					// The cache's keys and values of (l, h), slot by slot.
					var keys, vals [][]float64
					var kpos []int32
					for _, s := range seq.cache.Segments(l, h) {
						for i := 0; i < s.N; i++ {
							k, v := make([]float32, hd), make([]float32, hd)
							s.KC.Get(s.K, s.Cap, hd, i, k)
							s.VC.Get(s.V, s.Cap, hd, i, v)
							keys, vals, kpos = append(keys, f64(k)), append(vals, f64(v)), append(kpos, s.Pos[i])
						}
					}
					mass := make([]float64, len(keys))
					for ti, p := range qpos {
						for g := range G {
							off := ti*m.QDim() + (h*G+g)*hd
							qv := f64(q[off : off+hd])
							w := make([]float64, len(keys))
							mx, sum := math.Inf(-1), 0.0
							for i := range keys {
								if kpos[i] > p || p-kpos[i] >= W {
									continue
								}
								for ch := range hd {
									w[i] += qv[ch] * keys[i][ch]
								}
								w[i] /= math.Sqrt(float64(hd))
								mx = max(mx, w[i])
							}
							for i := range keys {
								if kpos[i] > p || p-kpos[i] >= W {
									w[i] = 0
									continue
								}
								w[i] = math.Exp(w[i] - mx)
								sum += w[i]
							}
							for ch := range hd {
								var want float64
								for i := range keys {
									want += w[i] / sum * vals[i][ch]
								}
								if d := math.Abs(want - float64(out[off+ch])); !(d <= 1e-5) {
									t.Fatalf("layer %d head %d query pos %d: output %d is %g, naive %g", l, h*G+g, p, ch, out[off+ch], want)
								}
							}
							for i := range keys {
								mass[i] += w[i] / sum
							}
						}
					}
					for i, want := range mass {
						got := float64(req.Out[h][i])
						if want == 0 && got != 0 {
							t.Fatalf("layer %d KV head %d: slot at position %d outside every query's window has mass %g", l, h, kpos[i], got)
						}
						if d := math.Abs(got - want); !(d <= 1e-4) {
							t.Fatalf("layer %d KV head %d: slot at position %d has mass %g, naive %g", l, h, kpos[i], got, want)
						}
					}
				}
			}
		})
	}
}

func f64(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}
