package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
)

// TestGenModel writes the tiny shape in every type and checks that the
// file loads with the shape asked for, carries the llama2 vocabulary,
// stores each matrix in the type asked for (exactly what the project's
// quantizer makes of the drawn values, which are reproducible from the
// seed), and runs to finite logits.
func TestGenModel(t *testing.T) {
	tok := shared.Path(t, "models/llama2-tokenizer/tokenizer.bin")
	dir := t.TempDir()
	sh := genShapes["tiny"]
	for _, typ := range genTypes {
		t.Run(typ, func(t *testing.T) {
			out := filepath.Join(dir, typ+".gguf")
			if o, e, code := kvlm(t, "gen-model", "--shape", "tiny", "--type", typ, "--tokenizer", tok, "-o", out); code != 0 {
				t.Fatalf("exit %d: %s %s", code, o, e)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			m, tk, err := model.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			if m.Dim != sh.Dim || m.Config.Layers != sh.Layers || m.Heads != sh.Heads || m.KVHeads != sh.KVHeads ||
				m.HiddenDim != sh.Hidden || m.Vocab != 32000 || tk.VocabSize() != 32000 {
				t.Fatalf("config %+v, vocab %d", m.Config, tk.VocabSize())
			}
			if ids := tk.Encode("Hello world", true, false); len(ids) < 3 || ids[0] != 1 {
				t.Errorf("encode: %v", ids)
			}
			for _, c := range []struct {
				name  string
				layer int
			}{{"blk.0.attn_q.weight", 0}, {"blk.1.ffn_down.weight", 1}, {"blk.0.ffn_up.weight", 0}, {"output.weight", sh.Layers}} {
				ti, ok := f.Tensor(c.name)
				if !ok {
					t.Fatalf("no %s", c.name)
				}
				want := genTensorType(typ, c.name, c.layer, sh.Layers)
				if ti.Type != want {
					t.Errorf("%s is %s, want %s", c.name, ti.Type, want)
				}
				// The bytes are the project's quantization of the values
				// drawn for this tensor.
				rows, cols := int(ti.Shape[1]), int(ti.Shape[0])
				var buf bytes.Buffer
				std := 0.5 / math.Sqrt(float64(cols))
				if err := genMatrix(&buf, want, rows, cols, std, 1, c.name); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf.Bytes(), f.TensorData(ti)) {
					t.Errorf("%s: stored bytes differ from the quantized draw", c.name)
				}
			}
			seq, err := m.NewStandaloneSequence(model.KVOptions{Tokens: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			logits, err := seq.Forward([]int{1, 15043, 3186, 29892}, false)
			if err != nil {
				t.Fatal(err)
			}
			var s float64
			for _, v := range logits {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("logit %g", v)
				}
				s += float64(v) * float64(v)
			}
			if rms := math.Sqrt(s / float64(len(logits))); rms < 0.01 || rms > 100 {
				t.Errorf("logits RMS %g", rms)
			}
		})
	}
}

// TestGenModelQuantizes: a matrix written as Q8_0 dequantizes to within
// Q8_0's error of the drawn values (drawn again as F32).
func TestGenModelQuantizes(t *testing.T) {
	rows, cols := 3, 256
	var f32, q8 bytes.Buffer
	if err := genMatrix(&f32, tensor.F32, rows, cols, 0.1, 7, "x"); err != nil {
		t.Fatal(err)
	}
	if err := genMatrix(&q8, tensor.Q8_0, rows, cols, 0.1, 7, "x"); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, rows*cols)
	got := make([]float32, rows*cols)
	if err := tensor.Dequantize(tensor.F32, f32.Bytes(), want); err != nil {
		t.Fatal(err)
	}
	if err := tensor.Dequantize(tensor.Q8_0, q8.Bytes(), got); err != nil {
		t.Fatal(err)
	}
	for b := 0; b < rows*cols; b += 32 {
		var amax float64
		for _, v := range want[b : b+32] {
			amax = max(amax, math.Abs(float64(v)))
		}
		for i := b; i < b+32; i++ {
			// half a step of amax/127, plus the f16 rounding of the scale
			if d := math.Abs(float64(got[i] - want[i])); d > 0.51*amax/127+amax/1000 {
				t.Fatalf("[%d] = %g, drawn %g", i, got[i], want[i])
			}
		}
	}
}

func TestGenModelErrors(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.gguf")
	for _, args := range [][]string{
		{"gen-model", "--shape", "nope", "--type", "F16", "-o", out},
		{"gen-model", "--shape", "tiny", "--type", "Q9", "-o", out},
		{"gen-model", "--shape", "tiny", "--type", "F16"},
	} {
		if _, e, code := kvlm(t, args...); code != 1 || e == "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, e)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a failed gen-model left a file")
	}
}
