package convert

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
)

// tinyModel is the shape of a random-weight GGUF written by writeTiny.
type tinyModel struct {
	arch            string       // "llama" (interleaved RoPE) or "qwen2" (halves RoPE, Q/K/V biases)
	typ             tensor.DType // type of every matrix (norms and biases F32)
	dim, heads, kvh int          // head dim = dim/heads
	// same > 1 makes the K and V heads (weights and biases) identical
	// within each run of same consecutive KV heads, different across runs.
	same int
}

const tinyLayers, tinyVocab = 2, 64

// writeTiny writes a random-weight model of shape s to a GGUF file and
// returns its path.
func writeTiny(t *testing.T, s tinyModel) string {
	t.Helper()
	r := rand.New(rand.NewPCG(7, uint64(s.dim*100+s.kvh)))
	hd := s.dim / s.heads
	w := gguf.NewWriter()
	pieces := []string{"<unk>", "<s>", "</s>"}
	for i := len(pieces); i < tinyVocab; i++ {
		pieces = append(pieces, fmt.Sprintf("▁w%d", i))
	}
	tok, err := tokenizer.NewSentencePiece(pieces, nil, nil, 1, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	a := s.arch
	meta := []Meta{
		{"general.architecture", a},
		{"general.name", "tiny"},
		{a + ".context_length", uint32(128)},
		{a + ".embedding_length", uint32(s.dim)},
		{a + ".block_count", uint32(tinyLayers)},
		{a + ".feed_forward_length", uint32(s.dim)},
		{a + ".attention.head_count", uint32(s.heads)},
		{a + ".attention.head_count_kv", uint32(s.kvh)},
		{a + ".attention.layer_norm_rms_epsilon", float32(1e-5)},
		{a + ".rope.freq_base", float32(10000)},
		{"tokenizer.chat_template", "{{ messages }}"},
	}
	for _, m := range append(meta, VocabMetadata(tok)...) {
		if err := w.Set(m.Key, m.Val); err != nil {
			t.Fatal(err)
		}
	}
	randn := func(n int, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * scale)
		}
		return v
	}
	add := func(name string, typ tensor.DType, shape []uint64, v []float32) {
		rb, err := typ.RowBytes(int(shape[0]))
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, rb*len(v)/int(shape[0]))
		if err := tensor.Quantize(typ, v, b); err != nil {
			t.Fatal(err)
		}
		if err := w.AddTensor(name, typ, shape, b); err != nil {
			t.Fatal(err)
		}
	}
	mat := func(name string, rows, cols int, v []float32) {
		add(name, s.typ, []uint64{uint64(cols), uint64(rows)}, v)
	}
	vec := func(name string, v []float32) { add(name, tensor.F32, []uint64{uint64(len(v))}, v) }
	ones := func(n int) []float32 {
		v := randn(n, 0.1)
		for i := range v {
			v[i]++
		}
		return v
	}
	// sameHeads copies head g·same's rows (of cols values) over the other
	// heads of its run.
	sameHeads := func(v []float32, cols int) []float32 {
		for h := 0; s.same > 1 && h < s.kvh; h++ {
			if src := h - h%s.same; src != h {
				copy(v[h*hd*cols:(h+1)*hd*cols], v[src*hd*cols:(src+1)*hd*cols])
			}
		}
		return v
	}
	mat("token_embd.weight", tinyVocab, s.dim, randn(tinyVocab*s.dim, 1))
	scale := 1 / math.Sqrt(float64(s.dim))
	for l := 0; l < tinyLayers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		vec(p+"attn_norm.weight", ones(s.dim))
		mat(p+"attn_q.weight", s.dim, s.dim, randn(s.dim*s.dim, 3*scale))
		mat(p+"attn_k.weight", s.kvh*hd, s.dim, sameHeads(randn(s.kvh*hd*s.dim, 3*scale), s.dim))
		mat(p+"attn_v.weight", s.kvh*hd, s.dim, sameHeads(randn(s.kvh*hd*s.dim, scale), s.dim))
		if s.arch == "qwen2" {
			vec(p+"attn_q.bias", randn(s.dim, 0.5))
			vec(p+"attn_k.bias", sameHeads(randn(s.kvh*hd, 0.5), 1))
			vec(p+"attn_v.bias", sameHeads(randn(s.kvh*hd, 0.5), 1))
		}
		mat(p+"attn_output.weight", s.dim, s.dim, randn(s.dim*s.dim, scale))
		vec(p+"ffn_norm.weight", ones(s.dim))
		mat(p+"ffn_gate.weight", s.dim, s.dim, randn(s.dim*s.dim, scale))
		mat(p+"ffn_up.weight", s.dim, s.dim, randn(s.dim*s.dim, scale))
		mat(p+"ffn_down.weight", s.dim, s.dim, randn(s.dim*s.dim, 1/math.Sqrt(float64(s.dim))))
	}
	vec("output_norm.weight", ones(s.dim))
	mat("output.weight", tinyVocab, s.dim, randn(tinyVocab*s.dim, 2*scale))
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// convertTo runs KVHeadsFile into a temporary file and returns its path.
func convertTo(t *testing.T, in, tokPath string, n int) (string, KVHeadsReport) {
	t.Helper()
	out := filepath.Join(t.TempDir(), fmt.Sprintf("kv%d.gguf", n))
	rep, err := KVHeadsFile(in, tokPath, out, n)
	if err != nil {
		t.Fatal(err)
	}
	return out, rep
}

func openGGUF(t *testing.T, path string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// dequant reads a tensor as float32 values.
func dequant(t *testing.T, f *gguf.File, ti *gguf.TensorInfo) []float32 {
	t.Helper()
	v := make([]float32, ti.Elements())
	if err := tensor.Dequantize(ti.Type, f.TensorData(ti), v); err != nil {
		t.Fatal(err)
	}
	return v
}

// groupMeans is the pooling the conversion should do, written out: for a
// tensor of from·hd rows of cols values, row g·hd + d of the result is the
// float64 mean of rows (g·k + j)·hd + d, j < k = from/to.
func groupMeans(v []float32, from, to, hd, cols int) []float64 {
	k := from / to
	out := make([]float64, to*hd*cols)
	for g := 0; g < to; g++ {
		for j := 0; j < k; j++ {
			old := g*k + j // the old head
			for d := 0; d < hd; d++ {
				for x := 0; x < cols; x++ {
					out[(g*hd+d)*cols+x] += float64(v[(old*hd+d)*cols+x])
				}
			}
		}
	}
	for i := range out {
		out[i] /= float64(k)
	}
	return out
}

// TestKVHeadsGroupMeans: every K and V tensor (weights and biases) of the
// converted file holds the float64 group means of the input's heads,
// rounded to the input's type (for a quantized type: the mean quantized);
// every other tensor is the input's bytes, every metadata key is kept but
// head_count_kv, which says N.
func TestKVHeadsGroupMeans(t *testing.T) {
	cases := []tinyModel{
		{arch: "llama", typ: tensor.F32, dim: 64, heads: 8, kvh: 4},
		{arch: "llama", typ: tensor.F32, dim: 64, heads: 8, kvh: 8}, // MHA
		{arch: "qwen2", typ: tensor.F32, dim: 64, heads: 8, kvh: 4},
		{arch: "llama", typ: tensor.F16, dim: 64, heads: 8, kvh: 4},
		{arch: "llama", typ: tensor.BF16, dim: 64, heads: 8, kvh: 4},
		{arch: "llama", typ: tensor.Q8_0, dim: 64, heads: 8, kvh: 4},
		{arch: "qwen2", typ: tensor.Q4_0, dim: 64, heads: 8, kvh: 4},
		{arch: "llama", typ: tensor.Q4_K, dim: 256, heads: 8, kvh: 4},
		{arch: "llama", typ: tensor.Q6_K, dim: 256, heads: 8, kvh: 4},
	}
	for _, s := range cases {
		in := writeTiny(t, s)
		for n := s.kvh / 2; n >= 1; n /= 2 {
			t.Run(fmt.Sprintf("%s/%s/%d->%d", s.arch, s.typ, s.kvh, n), func(t *testing.T) {
				out, rep := convertTo(t, in, "", n)
				fi, fo := openGGUF(t, in), openGGUF(t, out)
				pooled := 0
				for i := range fi.Tensors {
					ti := &fi.Tensors[i]
					to, ok := fo.Tensor(ti.Name)
					if !ok {
						t.Fatalf("%s missing from the output", ti.Name)
					}
					if to.Type != ti.Type {
						t.Errorf("%s: type %s, input %s", ti.Name, to.Type, ti.Type)
					}
					kv := strings.Contains(ti.Name, ".attn_k.") || strings.Contains(ti.Name, ".attn_v.")
					if !kv {
						if !reflect.DeepEqual(to.Shape, ti.Shape) || string(fo.TensorData(to)) != string(fi.TensorData(ti)) {
							t.Errorf("%s changed", ti.Name)
						}
						continue
					}
					pooled++
					hd := s.dim / s.heads
					cols := 1
					if len(ti.Shape) == 2 {
						cols = int(ti.Shape[0])
					}
					want := groupMeans(dequant(t, fi, ti), s.kvh, n, hd, cols)
					if got := int(to.Elements()); got != len(want) {
						t.Fatalf("%s: %d values, want %d (shape %v)", ti.Name, got, len(want), to.Shape)
					}
					want32 := make([]float32, len(want))
					for i, v := range want {
						want32[i] = float32(v)
					}
					if ti.Type != tensor.F32 {
						b := make([]byte, to.Size)
						if err := tensor.Quantize(ti.Type, want32, b); err != nil {
							t.Fatal(err)
						}
						if err := tensor.Dequantize(ti.Type, b, want32); err != nil {
							t.Fatal(err)
						}
					}
					got := dequant(t, fo, to)
					worst := 0.0
					for i := range got {
						worst = math.Max(worst, math.Abs(float64(got[i]-want32[i])))
					}
					if worst != 0 {
						t.Errorf("%s: max |Δ| %g from the group means", ti.Name, worst)
					}
				}
				if pooled != len(rep.Pooled) || pooled == 0 {
					t.Errorf("%d K/V tensors, report says %d pooled", pooled, len(rep.Pooled))
				}
				for _, kv := range fi.KVs {
					o, ok := fo.Lookup(kv.Key)
					switch {
					case !ok:
						t.Errorf("key %s missing", kv.Key)
					case kv.Key == s.arch+".attention.head_count_kv":
						if v, err := fo.Uint(kv.Key); err != nil || v != uint64(n) {
							t.Errorf("%s = %v (%v), want %d", kv.Key, o.Value, err, n)
						}
					case !reflect.DeepEqual(o, kv):
						t.Errorf("key %s: %v, input %v", kv.Key, o.Value, kv.Value)
					}
				}
				if len(fo.KVs) != len(fi.KVs) || len(fo.Tensors) != len(fi.Tensors) {
					t.Errorf("%d keys and %d tensors, input %d and %d", len(fo.KVs), len(fo.Tensors), len(fi.KVs), len(fi.Tensors))
				}
				// The result loads and runs.
				m, _, err := model.LoadGGUF(out)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if m.KVHeads != n {
					t.Errorf("loaded with %d KV heads, want %d", m.KVHeads, n)
				}
			})
		}
	}
}

// TestKVHeadsSameCount: converting to the KV heads a model has copies it:
// its logits are bit-identical, quantized or not.
func TestKVHeadsSameCount(t *testing.T) {
	for _, s := range []tinyModel{
		{arch: "llama", typ: tensor.F32, dim: 64, heads: 8, kvh: 4},
		{arch: "qwen2", typ: tensor.Q8_0, dim: 64, heads: 8, kvh: 4},
		{arch: "llama", typ: tensor.Q4_K, dim: 256, heads: 8, kvh: 2},
	} {
		t.Run(fmt.Sprintf("%s/%s", s.arch, s.typ), func(t *testing.T) {
			in := writeTiny(t, s)
			out, rep := convertTo(t, in, "", s.kvh)
			if len(rep.Pooled) != 0 {
				t.Errorf("pooled %v", rep.Pooled)
			}
			if d := fileLogitDelta(t, in, "", out, tinyIDs); d != 0 {
				t.Errorf("logits differ by %g", d)
			}
		})
	}
}

var tinyIDs = []int{1, 5, 9, 33, 12, 12, 40, 7, 63, 3, 20, 21, 22, 50, 8, 2, 17, 30, 31, 44, 45, 6, 10, 11}

// fileLogitDelta is the largest |Δ logit| between two model files over ids.
func fileLogitDelta(t *testing.T, a, aTok, b string, ids []int) float64 {
	t.Helper()
	ma, _, err := engine.Load(a, aTok)
	if err != nil {
		t.Fatal(err)
	}
	defer ma.Close()
	mb, _, err := engine.Load(b, "")
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	return maxLogitDelta(t, ma, mb, ids)
}

// TestKVHeadsLossless: when the K and V heads are already identical within
// each group, pooling loses nothing: the converted model's logits are the
// original's within 1e-5. The heads differ across groups, so pooling the
// wrong rows (other heads, or rows across heads) changes the logits.
func TestKVHeadsLossless(t *testing.T) {
	for _, c := range []struct {
		s tinyModel
		n int
	}{
		{tinyModel{arch: "llama", typ: tensor.F32, dim: 64, heads: 8, kvh: 4, same: 2}, 2},
		{tinyModel{arch: "llama", typ: tensor.F32, dim: 64, heads: 8, kvh: 4, same: 4}, 1},
		{tinyModel{arch: "llama", typ: tensor.F32, dim: 64, heads: 8, kvh: 8, same: 4}, 2},
		{tinyModel{arch: "qwen2", typ: tensor.F32, dim: 64, heads: 8, kvh: 4, same: 2}, 2},
		{tinyModel{arch: "llama", typ: tensor.F16, dim: 64, heads: 8, kvh: 4, same: 2}, 2},
	} {
		t.Run(fmt.Sprintf("%s/%s/%d->%d", c.s.arch, c.s.typ, c.s.kvh, c.n), func(t *testing.T) {
			in := writeTiny(t, c.s)
			out, _ := convertTo(t, in, "", c.n)
			if d := fileLogitDelta(t, in, "", out, tinyIDs); d > 1e-5 {
				t.Errorf("logits differ by %g", d)
			}
			// The identical heads matter: without them the same
			// conversion is lossy, which shows the test can fail.
			lossy := c.s
			lossy.same = 0
			in = writeTiny(t, lossy)
			out, _ = convertTo(t, in, "", c.n)
			if d := fileLogitDelta(t, in, "", out, tinyIDs); d < 1e-3 {
				t.Errorf("pooling distinct heads changed the logits by only %g", d)
			}
		})
	}
}

// TestKVHeadsLlama2C: a llama2.c checkpoint (stories260K, 4 KV heads)
// converts through its F32 GGUF: the pooled K/V rows are the group means of
// the checkpoint's own matrices, the vocabulary and chat template come
// along, and N = 4 runs to the checkpoint's logits bit for bit.
func TestKVHeadsLlama2C(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tokPath := shared.Path(t, "models/stories260K/tok512.bin")
	ref, err := model.LoadLlama2C(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	ids := []int{1, 403, 407, 261, 378, 9, 100, 200, 300, 400, 500, 2, 17}
	t.Run("4", func(t *testing.T) {
		out, _ := convertTo(t, bin, tokPath, 4)
		if d := fileLogitDelta(t, bin, tokPath, out, ids); d != 0 {
			t.Errorf("logits differ by %g", d)
		}
	})
	for _, n := range []int{2, 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			out, rep := convertTo(t, bin, tokPath, n)
			if rep.From != 4 || rep.To != n || len(rep.Pooled) != 2*ref.Config.Layers {
				t.Errorf("report %+v", rep)
			}
			f := openGGUF(t, out)
			for _, key := range []string{"tokenizer.ggml.tokens", "tokenizer.chat_template", "llama.rope.freq_base"} {
				if _, ok := f.Lookup(key); !ok {
					t.Errorf("key %s missing", key)
				}
			}
			for l, L := range ref.Layers {
				for _, m := range []struct {
					name string
					w    *tensor.Matrix
				}{{"attn_k", L.Wk}, {"attn_v", L.Wv}} {
					v := make([]float32, m.w.Rows*m.w.Cols)
					for r := 0; r < m.w.Rows; r++ {
						m.w.Row(r, v[r*m.w.Cols:(r+1)*m.w.Cols])
					}
					want := groupMeans(v, 4, n, ref.HeadDim, ref.Dim)
					ti, ok := f.Tensor(fmt.Sprintf("blk.%d.%s.weight", l, m.name))
					if !ok {
						t.Fatalf("blk.%d.%s.weight missing", l, m.name)
					}
					got := dequant(t, f, ti)
					if len(got) != len(want) {
						t.Fatalf("blk.%d.%s: %d values, want %d", l, m.name, len(got), len(want))
					}
					for i := range got {
						if got[i] != float32(want[i]) {
							t.Fatalf("blk.%d.%s[%d] = %g, group mean %g", l, m.name, i, got[i], want[i])
						}
					}
				}
			}
		})
	}
}

// TestKVHeadsErrors: a count that cannot be pooled to, or input that is not
// a model, is refused with an error naming the problem.
func TestKVHeadsErrors(t *testing.T) {
	in := writeTiny(t, tinyModel{arch: "llama", typ: tensor.F32, dim: 64, heads: 8, kvh: 4})
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.bin")
	if err := os.WriteFile(junk, []byte("not a model at all, not even close"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, in, tok string
		n             int
		want          string
	}{
		{"zero", in, "", 0, "must be positive"},
		{"negative", in, "", -2, "must be positive"},
		{"more", in, "", 8, "has 4 KV heads; pooling can only reduce them"},
		{"not a divisor", in, "", 3, "does not divide the model's 4 KV heads into equal groups (try one of 1, 2)"},
		{"gguf with tokenizer", in, "tok.bin", 2, "--tokenizer is for llama2.c checkpoints"},
		{"missing", filepath.Join(dir, "none.gguf"), "", 2, "no such file"},
		{"junk", junk, "", 2, "not a GGUF file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(dir, "out.gguf")
			_, err := KVHeadsFile(c.in, c.tok, out, c.n)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
			if _, err := os.Stat(out); err == nil {
				t.Error("an output file was written")
			}
		})
	}
	t.Run("llama2c without tokenizer", func(t *testing.T) {
		bin := shared.Path(t, "models/stories260K/stories260K.bin")
		_, err := KVHeadsFile(bin, "", filepath.Join(dir, "out.gguf"), 2)
		if err == nil || !strings.Contains(err.Error(), "give its tokenizer with --tokenizer") {
			t.Fatalf("error %v", err)
		}
	})
}
