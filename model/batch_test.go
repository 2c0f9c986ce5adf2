package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tensor"
)

// TestDecodeBatchMatchesForward runs sequences of different lengths, in
// different pools and codecs, one sharing a pool with another, through
// DecodeBatch and through per-sequence Forward: the logits must agree to
// 1e-5 at every step.
func TestDecodeBatchMatchesForward(t *testing.T) {
	m := loadStories(t)
	q8k, _ := codec.Parse("q8", codec.Keys)
	q8v, _ := codec.Parse("q8", codec.Values)
	shared, err := kvcache.NewPool(kvcache.PoolConfig{Layout: m.KVLayout(), BlockTokens: 16, Tokens: 4 * m.CtxLen})
	if err != nil {
		t.Fatal(err)
	}
	newSeq := func(i int) *Sequence {
		var s *Sequence
		var err error
		switch i % 3 {
		case 0:
			s, err = m.NewSequence(shared.NewSequence())
		case 1:
			s, err = m.NewStandaloneSequence(KVOptions{K: q8k, V: q8v, BlockTokens: 8})
		default:
			s, err = m.NewStandaloneSequence(KVOptions{BlockTokens: 1})
		}
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	const nseq = 7
	rng := rand.New(rand.NewPCG(1, 2))
	batch, ref := make([]*Sequence, nseq), make([]*Sequence, nseq)
	next := make([]int, nseq)
	for i := range batch {
		prompt := make([]int, 1+rng.IntN(40))
		for j := range prompt {
			prompt[j] = rng.IntN(m.Vocab)
		}
		batch[i], ref[i] = newSeq(i), newSeq(i)
		a, err := batch[i].Forward(prompt, false)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ref[i].Forward(prompt, false); err != nil {
			t.Fatal(err)
		}
		next[i] = argmax(a)
	}
	for step := 0; step < 40; step++ {
		got, err := m.DecodeBatch(batch, next)
		if err != nil {
			t.Fatal(err)
		}
		for i := range batch {
			want, err := ref[i].Forward([]int{next[i]}, false)
			if err != nil {
				t.Fatal(err)
			}
			var worst float64
			for j := range want {
				worst = max(worst, math.Abs(float64(got[i][j]-want[j])))
			}
			if worst > 1e-5 {
				t.Fatalf("step %d sequence %d: logits differ by %g", step, i, worst)
			}
			if batch[i].Pos() != ref[i].Pos() || batch[i].Cache().Len() != ref[i].Cache().Len() {
				t.Fatalf("step %d sequence %d: position %d / cache %d, want %d / %d", step, i,
					batch[i].Pos(), batch[i].Cache().Len(), ref[i].Pos(), ref[i].Cache().Len())
			}
			next[i] = argmax(want)
		}
	}
}

func TestDecodeBatchErrors(t *testing.T) {
	m := loadStories(t)
	a, _ := m.NewStandaloneSequence(KVOptions{})
	b, _ := m.NewStandaloneSequence(KVOptions{})
	if _, err := a.Forward([]int{1, 2, 3}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := m.DecodeBatch(nil, nil); err == nil {
		t.Error("empty batch accepted")
	}
	if _, err := m.DecodeBatch([]*Sequence{a, b}, []int{1}); err == nil {
		t.Error("token count mismatch accepted")
	}
	if _, err := m.DecodeBatch([]*Sequence{a, a}, []int{1, 1}); err == nil {
		t.Error("duplicate sequence accepted")
	}
	if _, err := m.DecodeBatch([]*Sequence{a, b}, []int{1, m.Vocab}); err == nil {
		t.Error("bad token accepted")
	}
	b.MaxPos = 0
	if _, err := m.DecodeBatch([]*Sequence{a, b}, []int{1, 1}); !errors.Is(err, ErrContextFull) {
		t.Errorf("full context: %v", err)
	}
	// A pool with no room left.
	tiny, _ := m.NewStandaloneSequence(KVOptions{Tokens: 1, BlockTokens: 1})
	if _, err := tiny.Forward([]int{1}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := m.DecodeBatch([]*Sequence{a, tiny}, []int{1, 1}); !errors.Is(err, kvcache.ErrNoBlocks) {
		t.Errorf("full pool: %v", err)
	}
	// Nothing changed on error.
	if a.Pos() != 3 || a.Cache().Len() != 3 || tiny.Pos() != 1 {
		t.Errorf("a failed batch changed state: pos %d len %d, tiny pos %d", a.Pos(), a.Cache().Len(), tiny.Pos())
	}
}

// synthModel is a model of the given shape with random F32 weights: for
// benchmarks where weights do not fit in the CPU caches.
func synthModel(tb testing.TB, dim, hidden, layers, heads, kvHeads, vocab, ctx int) *Model {
	tb.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	mat := func(r, c int) *tensor.Matrix {
		d := make([]float32, r*c)
		s := float32(1 / math.Sqrt(float64(c)))
		for i := range d {
			d[i] = (rng.Float32()*2 - 1) * s
		}
		return tensor.MatrixF32(r, c, d)
	}
	ones := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = 1
		}
		return v
	}
	hd := dim / heads
	cfg := Config{Arch: "llama", Dim: dim, HiddenDim: hidden, Layers: layers, Heads: heads, KVHeads: kvHeads, HeadDim: hd,
		Vocab: vocab, CtxLen: ctx, NormEps: 1e-5, RopeTheta: 10000}
	m := &Model{Config: cfg, TokEmb: mat(vocab, dim), OutNorm: ones(dim)}
	m.Output = m.TokEmb
	for range layers {
		m.Layers = append(m.Layers, Layer{AttnNorm: ones(dim), FFNNorm: ones(dim),
			Wq: mat(heads*hd, dim), Wk: mat(kvHeads*hd, dim), Wv: mat(kvHeads*hd, dim), Wo: mat(dim, heads*hd),
			WGate: mat(hidden, dim), WUp: mat(hidden, dim), WDown: mat(dim, hidden)})
	}
	if err := m.check(); err != nil {
		tb.Fatal(err)
	}
	return m
}

// BenchmarkDecodeBatch compares one decode step of B sequences batched
// against B one-token Forward calls, each sequence 64 tokens in. tok/s is
// total new tokens per second.
//
//	go test -run X -bench DecodeBatch -benchtime 2s ./model/
func BenchmarkDecodeBatch(b *testing.B) {
	models := []struct {
		name string
		m    func(testing.TB) *Model
	}{
		{"stories260K", func(tb testing.TB) *Model { return loadStories(tb) }},
		// llama2.c stories15M's shape (6 layers of dim 288) and a 110M-like
		// layer width: weights well outside the L2 cache.
		{"synth-dim768x4", func(tb testing.TB) *Model { return synthModel(tb, 768, 2048, 4, 12, 12, 4096, 1024) }},
	}
	// KVLM_BENCH_GGUF names a GGUF file to add (a real model's shape, e.g.
	// one from kvlm gen-model), for profiling batched decode at full size.
	if path := os.Getenv("KVLM_BENCH_GGUF"); path != "" {
		models = append(models, struct {
			name string
			m    func(testing.TB) *Model
		}{filepath.Base(path), func(tb testing.TB) *Model {
			m, _, err := LoadGGUF(path)
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { m.Close() })
			return m
		}})
	}
	for _, mc := range models {
		m := mc.m(b)
		for _, B := range []int{1, 4, 16} {
			seqs := make([]*Sequence, B)
			toks := make([]int, B)
			for i := range seqs {
				s, err := m.NewStandaloneSequence(KVOptions{Tokens: 1024})
				if err != nil {
					b.Fatal(err)
				}
				prompt := make([]int, 64)
				for j := range prompt {
					prompt[j] = (i*31 + j*7) % m.Vocab
				}
				if _, err := s.Forward(prompt, false); err != nil {
					b.Fatal(err)
				}
				seqs[i], toks[i] = s, i%m.Vocab
			}
			reset := func() {
				for _, s := range seqs {
					if s.Pos() >= m.CtxLen/2 {
						if err := s.Truncate(64); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.Run(fmt.Sprintf("%s/batched/B=%d", mc.name, B), func(b *testing.B) {
				for b.Loop() {
					reset()
					if _, err := m.DecodeBatch(seqs, toks); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*B)/b.Elapsed().Seconds(), "tok/s")
			})
			b.Run(fmt.Sprintf("%s/sequential/B=%d", mc.name, B), func(b *testing.B) {
				for b.Loop() {
					reset()
					for i, s := range seqs {
						if _, err := s.Forward(toks[i:i+1], false); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.N*B)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}

// quantizeMatrix converts an F32 matrix to type typ.
func quantizeMatrix(tb testing.TB, w *tensor.Matrix, typ tensor.DType) *tensor.Matrix {
	tb.Helper()
	rb, err := typ.RowBytes(w.Cols)
	if err != nil {
		tb.Fatal(err)
	}
	data := make([]byte, w.Rows*rb)
	if err := tensor.Quantize(typ, w.F32(), data); err != nil {
		tb.Fatal(err)
	}
	q, err := tensor.NewMatrix(typ, w.Rows, w.Cols, data)
	if err != nil {
		tb.Fatal(err)
	}
	return q
}

// TestDecodeBatchMixedTypes runs a model whose layers mix weight types
// (Wq, Wk Q4_K with Wv Q6_K as Q4_K_M does; W_gate Q8_0 with W_up Q4_0;
// and a layer of F16 beside Q8_0), so that tensor.MatMulMany quantizes
// the shared activations once per format: DecodeBatch agrees with
// per-sequence Forward, and chunked prefill with token-by-token decode.
//
// Q8_0 and Q4_0 matrices times 4 tokens or more run the 8-row kernels,
// whose activations carry one scale per 32 values instead of one per 4
// (tensor/qmm_p8.go), so prefill chunks and batched steps differ from
// single-token decode by the activation quantization (~1e-2 here); the
// mix without those two types must agree within 1e-4.
func TestDecodeBatchMixedTypes(t *testing.T) {
	for _, c := range []struct {
		name      string
		q80, q40  tensor.DType // what stands for Q8_0 and Q4_0
		tolerance float64
	}{
		{"kquants-floats", tensor.Q6_K, tensor.Q4_K, 1e-4},
		{"with-q8_0-q4_0", tensor.Q8_0, tensor.Q4_0, 0.05},
	} {
		t.Run(c.name, func(t *testing.T) { testDecodeBatchMixed(t, c.q80, c.q40, c.tolerance) })
	}
}

func testDecodeBatchMixed(t *testing.T, q80, q40 tensor.DType, tol float64) {
	m := synthModel(t, 256, 512, 2, 4, 2, 300, 64)
	q := func(w *tensor.Matrix, typ tensor.DType) *tensor.Matrix { return quantizeMatrix(t, w, typ) }
	L := &m.Layers[0]
	L.Wq, L.Wk, L.Wv = q(L.Wq, tensor.Q4_K), q(L.Wk, tensor.Q4_K), q(L.Wv, tensor.Q6_K)
	L.WGate, L.WUp, L.Wo, L.WDown = q(L.WGate, q80), q(L.WUp, q40), q(L.Wo, tensor.Q6_K), q(L.WDown, tensor.Q4_K)
	L = &m.Layers[1]
	L.Wq, L.Wk, L.Wv = q(L.Wq, tensor.F16), q(L.Wk, q80), q(L.Wv, tensor.BF16)
	L.WGate, L.WUp = q(L.WGate, tensor.Q4_K), q(L.WUp, tensor.F16)
	const nseq = 5
	batch, ref := make([]*Sequence, nseq), make([]*Sequence, nseq)
	next := make([]int, nseq)
	for i := range batch {
		prompt := make([]int, 3+5*i)
		for j := range prompt {
			prompt[j] = (i*37 + j*11) % m.Vocab
		}
		var err error
		if batch[i], err = m.NewStandaloneSequence(KVOptions{}); err != nil {
			t.Fatal(err)
		}
		if ref[i], err = m.NewStandaloneSequence(KVOptions{}); err != nil {
			t.Fatal(err)
		}
		a, err := batch[i].Forward(prompt, false)
		if err != nil {
			t.Fatal(err)
		}
		// The reference runs its prompt token by token.
		var b []float32
		for _, tok := range prompt {
			if b, err = ref[i].Forward([]int{tok}, false); err != nil {
				t.Fatal(err)
			}
		}
		if d := maxDiff(a, b); d > tol {
			t.Fatalf("sequence %d: prefill and decode logits differ by %g", i, d)
		}
		next[i] = argmax(b)
	}
	for step := 0; step < 6; step++ {
		got, err := m.DecodeBatch(batch, next)
		if err != nil {
			t.Fatal(err)
		}
		for i := range batch {
			want, err := ref[i].Forward([]int{next[i]}, false)
			if err != nil {
				t.Fatal(err)
			}
			if d := maxDiff(got[i], want); d > tol {
				t.Fatalf("step %d sequence %d: logits differ by %g", step, i, d)
			}
			next[i] = argmax(want)
		}
	}
}

func maxDiff(a, b []float32) float64 {
	var worst float64
	for j := range a {
		worst = max(worst, math.Abs(float64(a[j]-b[j])))
	}
	return worst
}
