package convert

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
)

// TestLlama2CToGGUF: the converted file carries llama.cpp's keys and names,
// and runs to the same logits as the checkpoint it came from; quantized
// conversions stay close in perplexity.
func TestLlama2CToGGUF(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tokPath := shared.Path(t, "models/stories260K/tok512.bin")
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	ref, refTok, err := engine.Load(bin, tokPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	ids := refTok.Encode(textHead(t, text, 4096), true, false)[:256]
	refNLL := nll(t, ref, ids)

	cases := []struct {
		typ      tensor.DType
		maxDelta float64 // |Δ mean NLL| allowed against the f32 checkpoint
		logits   float64 // max |Δ logit| on the prompt
	}{
		{tensor.F32, 0, 0},
		{tensor.F16, 0.01, 0.05},
		{tensor.BF16, 0.05, 0.5},
		{tensor.Q8_0, 0.02, 0.3},
		{tensor.Q4_0, 0.5, 5},
	}
	for _, c := range cases {
		t.Run(c.typ.String(), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "s.gguf")
			rep, err := Llama2C(bin, tokPath, out, Options{Type: c.typ})
			if err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, key := range []string{"general.architecture", "llama.embedding_length", "llama.attention.head_count_kv", "tokenizer.ggml.tokens"} {
				if _, ok := f.Lookup(key); !ok {
					t.Errorf("key %s missing", key)
				}
			}
			if ti, ok := f.Tensor("blk.0.attn_q.weight"); !ok || ti.Shape[0] != 64 || ti.Shape[1] != 64 {
				t.Errorf("blk.0.attn_q.weight: %v", ti)
			}
			if _, ok := f.Tensor("output.weight"); ok {
				t.Error("stories260K shares its classifier: no output.weight expected")
			}
			// ffn_down has 172 columns, not a multiple of 32: it falls back.
			wantFallback := c.typ.BlockSize() > 1
			if got := len(rep.Fallbacks) > 0; got != wantFallback {
				t.Errorf("fallbacks %v", rep.Fallbacks)
			}
			m, tok, err := model.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			if got := tok.Encode("Once upon a time", true, false); !equal(got, []int{1, 403, 407, 261, 378}) {
				t.Errorf("GGUF tokenizer encodes %v", got)
			}
			if tok.DecodeAll(ids) != refTok.DecodeAll(ids) {
				t.Error("GGUF tokenizer decodes differently")
			}
			// The engine's two ways in, the file read into memory and
			// mapped, run to the same logits as the model over f.
			for name, load := range map[string]func(string, string) (*model.Model, tokenizer.Tokenizer, error){"Load": engine.Load, "LoadMapped": engine.LoadMapped} {
				em, _, err := load(out, "")
				if err != nil {
					t.Fatalf("engine.%s: %v", name, err)
				}
				// Read into memory, weights are rearranged into 16-row
				// panels (64 rows: 4) where the CPU has the one-token
				// kernel for their type; mapped, they stay.
				wantPanels := 0
				if name == "Load" && tensor.PanelMatrices(em.Layers[0].Wq.Type) {
					wantPanels = 4
				}
				if got := em.Layers[0].Wq.Panels(); got != wantPanels {
					t.Errorf("engine.%s: Wq in %d panels, want %d", name, got, wantPanels)
				}
				if d := maxLogitDelta(t, m, em, ids[:16]); d != 0 {
					t.Errorf("engine.%s: logits differ from the model over gguf.Open by %g", name, d)
				}
				em.Close()
			}
			d := maxLogitDelta(t, ref, m, ids[:32])
			if d > c.logits {
				t.Errorf("max |Δlogit| %.3g > %.3g", d, c.logits)
			}
			got := nll(t, m, ids)
			t.Logf("%s: mean NLL %.6f (f32 checkpoint %.6f, Δ %+.2g), max |Δlogit| %.3g", c.typ, got, refNLL, got-refNLL, d)
			if math.Abs(got-refNLL) > c.maxDelta {
				t.Errorf("mean NLL %.6f vs %.6f", got, refNLL)
			}
		})
	}
}

func TestConvertErrors(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tokPath := shared.Path(t, "models/stories260K/tok512.bin")
	dir := t.TempDir()
	if _, err := Llama2C(bin, tokPath, filepath.Join(dir, "x.gguf"), Options{Type: tensor.IQ2_XXS}); err == nil {
		t.Error("unsupported weight type accepted")
	}
	if _, err := Llama2C(filepath.Join(dir, "none.bin"), tokPath, filepath.Join(dir, "x.gguf"), Options{}); err == nil {
		t.Error("missing checkpoint accepted")
	}
	if _, err := Llama2C(bin, shared.Path(t, "models/llama2-tokenizer/tokenizer.bin"), filepath.Join(dir, "x.gguf"), Options{}); err == nil {
		t.Error("a 32000-token vocabulary for a 512-token model accepted")
	}
}

func textHead(t *testing.T, path string, n int) string {
	t.Helper()
	b, err := readFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}

func nll(t *testing.T, m *model.Model, ids []int) float64 {
	t.Helper()
	seq, err := m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := eval.Perplexity(seq, ids)
	if err != nil {
		t.Fatal(err)
	}
	return r.MeanNLL
}

func maxLogitDelta(t *testing.T, a, b *model.Model, ids []int) float64 {
	t.Helper()
	sa, _ := a.NewStandaloneSequence(model.KVOptions{})
	sb, _ := b.NewStandaloneSequence(model.KVOptions{})
	la, err := sa.Forward(ids, true)
	if err != nil {
		t.Fatal(err)
	}
	la = append([]float32(nil), la...)
	lb, err := sb.Forward(ids, true)
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for i := range la {
		worst = math.Max(worst, math.Abs(float64(la[i]-lb[i])))
	}
	return worst
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var _ tokenizer.Tokenizer = (*tokenizer.SentencePiece)(nil)

func readFile(p string) ([]byte, error) { return os.ReadFile(p) }

// TestInconsistentGGUF: metadata that disagrees with the tensors, or names
// what kvlm cannot run, is refused with an error naming the problem.
func TestInconsistentGGUF(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tokPath := shared.Path(t, "models/stories260K/tok512.bin")
	m, err := model.LoadLlama2C(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := tokenizer.LoadLlama2C(tokPath, 0)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		key  string
		val  any
		want string
	}{
		{"llama.embedding_length", uint32(96), "8 of 12 dims"},
		{"llama.context_length", uint32(0), "out of range"},
		{"llama.feed_forward_length", uint32(100), "ffn_gate"},
		{"llama.attention.head_count_kv", uint32(3), "not a multiple"},
		{"llama.attention.head_count_kv", uint32(2), "attn_k"},
		{"llama.block_count", uint32(6), "blk.5"},
		{"llama.block_count", uint32(0), "out of range"},
		{"general.architecture", "mamba", `"mamba"`},
		{"tokenizer.ggml.model", "bert", `"bert"`},
		{"llama.rope.dimension_count", uint32(4), "partial RoPE"},
		{"llama.attention.layer_norm_rms_epsilon", "tiny", "epsilon"},
		{"tokenizer.ggml.bos_token_id", uint32(9999), "outside the vocabulary"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s=%v", c.key, c.val), func(t *testing.T) {
			w, _, err := Build(m, tok, Options{Type: tensor.F32, Name: "x"})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Set(c.key, c.val); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if _, err := w.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Parse(alignedCopy(buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = model.FromGGUF(f)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
		})
	}
}

func alignedCopy(b []byte) []byte {
	f := make([]float64, (len(b)+7)/8)
	out := unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(b))
	copy(out, b)
	return out
}
