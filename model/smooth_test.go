package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// shiftLogits runs tokens through m over a fresh pool of codecs k/v with an
// optional key shift and returns every position's logits.
func shiftLogits(t *testing.T, m *Model, k, v codec.Codec, shift [][]float32, tokens []int) []float32 {
	t.Helper()
	pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: m.KVLayout(), BlockTokens: 16, K: k, V: v, Tokens: len(tokens), KeyShift: shift})
	if err != nil {
		t.Fatal(err)
	}
	seq, err := m.NewSequence(pool.NewSequence())
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	seq.Chunk = 32
	logits, err := seq.Forward(tokens, true)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(logits)
}

// meanKL is the mean over positions of KL(softmax(ref) ‖ softmax(got)).
func meanKL(ref, got []float32, vocab int) float64 {
	logsm := func(x []float32) []float64 {
		mx := math.Inf(-1)
		for _, v := range x {
			mx = math.Max(mx, float64(v))
		}
		var s float64
		for _, v := range x {
			s += math.Exp(float64(v) - mx)
		}
		out := make([]float64, len(x))
		for i, v := range x {
			out[i] = float64(v) - mx - math.Log(s)
		}
		return out
	}
	n := len(ref) / vocab
	var kl float64
	for p := 0; p < n; p++ {
		a, b := logsm(ref[p*vocab:(p+1)*vocab]), logsm(got[p*vocab:(p+1)*vocab])
		for i := range a {
			kl += math.Exp(a[i]) * (a[i] - b[i])
		}
	}
	return kl / float64(n)
}

func TestKeyMeans(t *testing.T) {
	m := loadStories(t)
	a, err := m.KeyMeans([]int{1}, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.KeyMeans([]int{1}, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != m.Config.Layers*m.KVHeads {
		t.Fatalf("%d vectors, want %d", len(a), m.Config.Layers*m.KVHeads)
	}
	var big float64
	for i := range a {
		if len(a[i]) != m.HeadDim || !slices.Equal(a[i], b[i]) {
			t.Fatalf("vector %d: %v then %v (same seed must give the same means)", i, a[i], b[i])
		}
		for _, v := range a[i] {
			big = max(big, math.Abs(float64(v)))
		}
	}
	// stories260K's keys carry a large offset in the lowest-frequency RoPE
	// pair (|mean| > 5 in most heads): what the shift is for.
	if big < 5 {
		t.Errorf("largest |key mean| %.2f, expected the known offset above 5", big)
	}
	if _, err := m.KeyMeans(nil, 8, 1); err == nil {
		t.Error("empty prompt accepted")
	}
	if _, err := m.KeyMeans(make([]int, m.CtxLen+1), 8, 1); err == nil {
		t.Error("prompt longer than the context accepted")
	}
}

// TestKeyShiftReads checks what a key shift changes: nothing for the float
// caches (bit-identical logits), and for q8/q4 keys only the quantization
// error, which it must not increase on a random-weight GGUF and must shrink
// on stories260K.
func TestKeyShiftReads(t *testing.T) {
	spec := tinySpec{arch: "llama", dim: 64, layers: 2, heads: 8, kvHeads: 2, hidden: 128, ctx: 256, theta: 10000, eps: 1e-5,
		vocab: 280, tok: spmTok(280), seed: 11}
	path, _ := spec.build(t)
	rnd, _, err := LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rnd.Close()
	for _, c := range []struct {
		name string
		m    *Model
		// largest KL(f32 ‖ shifted) / KL(f32 ‖ plain) allowed for q8 and q4
		ratio float64
	}{{"random-gguf", rnd, 1.2}, {"stories260K", loadStories(t), 0.8}} {
		t.Run(c.name, func(t *testing.T) {
			m := c.m
			r := rand.New(rand.NewPCG(3, 4))
			tokens := make([]int, 200)
			for i := range tokens {
				tokens[i] = 3 + r.IntN(m.Vocab-3)
			}
			tokens[0] = 1
			shift, err := m.KeyMeans([]int{1}, 128, 1)
			if err != nil {
				t.Fatal(err)
			}
			ref := shiftLogits(t, m, codec.F32, codec.F32, nil, tokens)
			for _, name := range []string{"f32", "f16", "bf16", "kivi4"} {
				k, _ := codec.Parse(name, codec.Keys)
				v, _ := codec.Parse(name, codec.Values)
				plain := shiftLogits(t, m, k, v, nil, tokens)
				shifted := shiftLogits(t, m, k, v, shift, tokens)
				if !slices.Equal(plain, shifted) {
					t.Errorf("%s: a key shift changed the logits of a codec that ignores it", name)
				}
			}
			for _, name := range []string{"q8", "q4"} {
				k, _ := codec.Parse(name, codec.Keys)
				plain := meanKL(ref, shiftLogits(t, m, k, codec.F32, nil, tokens), m.Vocab)
				shifted := meanKL(ref, shiftLogits(t, m, k, codec.F32, shift, tokens), m.Vocab)
				t.Logf("%s keys: mean KL to f32 %.3g plain, %.3g shifted (×%.2f)", name, plain, shifted, shifted/plain)
				if shifted > c.ratio*plain {
					t.Errorf("%s keys: shifted KL %.3g is more than %.1f× the plain %.3g", name, shifted, c.ratio, plain)
				}
			}
		})
	}
}
