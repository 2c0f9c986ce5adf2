package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/convert"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
)

// llamaRun is llama.cpp's greedy run of a file as recorded in
// testdata/llamacpp/*.txt: the prompt's token ids, and per step the token
// it chose and its largest logits (id → logit).
type llamaRun struct {
	prompt []int
	steps  []llamaStep
}

type llamaStep struct {
	next int
	top  []int // ids, largest logit first
	lg   map[int]float32
}

func readLlamaRun(t *testing.T, path string) llamaRun {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r llamaRun
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) == 0 || strings.HasPrefix(fs[0], "#"):
		case fs[0] == "prompt":
			for _, s := range fs[1:] {
				id, err := strconv.Atoi(s)
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				r.prompt = append(r.prompt, id)
			}
		case fs[0] == "step" && len(fs) > 5 && fs[2] == "next" && fs[4] == "top":
			st := llamaStep{lg: map[int]float32{}}
			st.next, err = strconv.Atoi(fs[3])
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			for _, p := range fs[5:] {
				id, v, ok := strings.Cut(p, ":")
				i, err1 := strconv.Atoi(id)
				x, err2 := strconv.ParseFloat(v, 32)
				if !ok || err1 != nil || err2 != nil {
					t.Fatalf("%s: bad logit %q", path, p)
				}
				st.top = append(st.top, i)
				st.lg[i] = float32(x)
			}
			r.steps = append(r.steps, st)
		default:
			t.Fatalf("%s: bad line %q", path, sc.Text())
		}
	}
	if len(r.prompt) == 0 || len(r.steps) == 0 {
		t.Fatalf("%s: no prompt or steps", path)
	}
	return r
}

// compareLlamaRun runs the model in file along llama.cpp's recorded run
// (its prompt, then each token it chose, so that one near-tie does not
// send the two down different paths) and checks, at every step, that
// kvlm's logits of llama.cpp's top ids are within tol of llama.cpp's and
// that kvlm's greedy choice is llama.cpp's wherever llama.cpp's first two
// logits are more than 2·tol apart. It returns the largest logit
// difference and the steps whose greedy tokens were compared.
func compareLlamaRun(t *testing.T, file string, run llamaRun, tol float64) (maxDiff float64, decided int) {
	t.Helper()
	f, err := gguf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, _, err := model.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	seq, err := m.NewStandaloneSequence(model.KVOptions{Tokens: len(run.prompt) + len(run.steps) + 1})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	in := run.prompt
	for s, st := range run.steps {
		logits, err := seq.Forward(in, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range st.top {
			d := math.Abs(float64(logits[id] - st.lg[id]))
			maxDiff = max(maxDiff, d)
			if d > tol {
				t.Errorf("step %d: logit of %d = %.6g, llama.cpp %.6g (diff %.3g > %.3g)", s, id, logits[id], st.lg[id], d, tol)
			}
		}
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		if len(st.top) > 1 && float64(st.lg[st.top[0]]-st.lg[st.top[1]]) > 2*tol {
			decided++
			if best != st.next {
				t.Errorf("step %d: greedy token %d, llama.cpp %d", s, best, st.next)
			}
		}
		in = []int{st.next}
	}
	return maxDiff, decided
}

// llamaCases are the recorded runs of kvlm-written files: gen-model's
// quant-tiny shape (stories260K's vocabulary, seed 1) in each type, and the
// logit tolerance of each (testdata/llamacpp/README.md: the measured
// differences and how they were recorded).
var llamaCases = []struct {
	typ string
	tol float64
}{
	{"F32", 1e-4},
	{"Q8_0", 0.02}, {"Q4_0", 0.02}, {"Q4_1", 0.02}, {"Q5_0", 0.02}, {"Q5_1", 0.02}, {"IQ4_NL", 0.02},
	{"Q3_K", 0.02}, {"Q4_K", 0.02}, {"Q5_K", 0.02}, {"Q6_K", 0.02},
	{"Q2_K", 0.02}, {"Q3_K_M", 0.02}, {"Q4_K_M", 0.02}, {"Q5_K_M", 0.02}, {"IQ4_XS", 0.02},
}

// TestMatchesLlamaCppKvlmFiles: on files kvlm writes (gen-model, written
// again here from the seed: the bytes llama.cpp ran are these), kvlm's
// logits and greedy tokens over 32 steps are llama.cpp's recorded ones.
func TestMatchesLlamaCppKvlmFiles(t *testing.T) {
	tok := shared.Path(t, "models/stories260K/tok512.bin")
	dir := t.TempDir()
	for _, c := range llamaCases {
		t.Run(c.typ, func(t *testing.T) {
			out := filepath.Join(dir, c.typ+".gguf")
			if o, e, code := kvlm(t, "gen-model", "--shape", "quant-tiny", "--type", c.typ, "--tokenizer", tok, "-o", out); code != 0 {
				t.Fatalf("gen-model: exit %d: %s %s", code, o, e)
			}
			run := readLlamaRun(t, filepath.Join("testdata", "llamacpp", "quant-tiny-"+c.typ+".txt"))
			d, n := compareLlamaRun(t, out, run, c.tol)
			t.Logf("%s: largest logit difference %.3g (tolerance %.3g), greedy tokens compared at %d of %d steps", c.typ, d, c.tol, n, len(run.steps))
		})
	}
}

// llamaArchCases are the recorded runs of kvlm-written files of the
// architectures beyond llama (gen-model's SHAPE-tiny shapes, stories260K's
// vocabulary, seed 1): testdata/llamacpp/SHAPE-TYPE.txt, with the logit
// tolerance of each (README.md: the measured differences).
var llamaArchCases = []struct {
	shape, typ string
	tol        float64
}{
	{"qwen3-tiny", "F32", 1e-4}, {"qwen3-tiny", "Q8_0", 0.02}, {"qwen3-tiny", "Q4_K_M", 0.02},
	// gemma2, gemma3: llama.cpp's GELU is a table of float16 values (ggml's
	// GGML_GELU_FP16), kvlm's the exact tanh formula: F32 within 2e-3, the
	// quantized files within 0.04 (README.md).
	{"gemma2-tiny", "F32", 2e-3}, {"gemma2-tiny", "Q8_0", 0.04}, {"gemma2-tiny", "Q4_K_M", 0.04},
	{"gemma2-cap-tiny", "F32", 2e-3},
	{"phi3-tiny", "F32", 1e-4}, {"phi3-tiny", "Q8_0", 0.02}, {"phi3-tiny", "Q4_K_M", 0.02},
	// Phi-3 LongRoPE: the long factor set and attention factor (context
	// above the original), and the short set.
	{"phi3-long-tiny", "F32", 1e-4}, {"phi3-long-tiny", "Q8_0", 0.02},
	{"phi3-short-tiny", "F32", 1e-4}, {"phi3-short-tiny", "Q8_0", 0.02},
	{"gemma3-tiny", "F32", 2e-3}, {"gemma3-tiny", "Q8_0", 0.04}, {"gemma3-tiny", "Q4_K_M", 0.04},
}

// archInspect is what kvlm inspect must print of each architecture's
// shape: its settings.
var archInspect = map[string][]string{
	"qwen3-tiny":      {"architecture qwen3:", "head dim 128", "rope neox θ=1e+06", "Q/K norm"},
	"gemma2-tiny":     {"architecture gemma2:", "embedding ×16", "post-norms", "GeGLU", "attention soft-cap 50", "final logit soft-cap 30"},
	"phi3-tiny":       {"architecture phi3:", "rope neox", "fused QKV and gate/up matrices"},
	"gemma2-cap-tiny": {"attention soft-cap 1", "final logit soft-cap 1"},
	"phi3-long-tiny":  {"architecture phi3:", "LongRoPE: the long factor set (context 256 against the original 64)", "RoPE attention factor 1.1547"},
	"phi3-short-tiny": {"architecture phi3:", "LongRoPE: the short factor set (context 256 against the original 256)"},
	"gemma3-tiny":     {"architecture gemma3:", "Q/K norm", "embedding ×16", "post-norms", "GeGLU", "local layers 0-1 (window 16, rope θ=10000; the others global)"},
}

// TestMatchesLlamaCppArchs: on files kvlm writes of each architecture
// (written again here from the seed), kvlm's logits and greedy tokens over
// 32 steps are llama.cpp's recorded ones; kvlm inspect prints the
// architecture's settings.
func TestMatchesLlamaCppArchs(t *testing.T) {
	tok := shared.Path(t, "models/stories260K/tok512.bin")
	dir := t.TempDir()
	for _, c := range llamaArchCases {
		t.Run(c.shape+"/"+c.typ, func(t *testing.T) {
			out := filepath.Join(dir, c.shape+"-"+c.typ+".gguf")
			if o, e, code := kvlm(t, "gen-model", "--shape", c.shape, "--type", c.typ, "--tokenizer", tok, "-o", out); code != 0 {
				t.Fatalf("gen-model: exit %d: %s %s", code, o, e)
			}
			o, e, code := kvlm(t, "inspect", out)
			if code != 0 {
				t.Fatalf("inspect: exit %d: %s", code, e)
			}
			for _, want := range archInspect[c.shape] {
				if !strings.Contains(o, want) {
					t.Errorf("inspect does not say %q:\n%s", want, o)
				}
			}
			run := readLlamaRun(t, filepath.Join("testdata", "llamacpp", c.shape+"-"+c.typ+".txt"))
			d, n := compareLlamaRun(t, out, run, c.tol)
			if n < len(run.steps)/2 {
				t.Errorf("greedy tokens compared at only %d of %d steps", n, len(run.steps))
			}
			t.Logf("%s %s: largest logit difference %.3g (tolerance %.3g), greedy tokens compared at %d of %d steps", c.shape, c.typ, d, c.tol, n, len(run.steps))
		})
	}
}

// TestMatchesLlamaCppQuantizeFile: a file llama-quantize wrote (from
// gen-model's F32 quant-tiny, each matrix in another of the types kvlm
// reads: testdata/llamacpp/README.md) loads with llama.cpp's types and
// runs to llama.cpp's logits and greedy tokens.
func TestMatchesLlamaCppQuantizeFile(t *testing.T) {
	file := filepath.Join("testdata", "llamacpp", "quant-tiny-alltypes.gguf")
	f, err := gguf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[tensor.DType]bool{}
	for _, ti := range f.Tensors {
		seen[ti.Type] = true
	}
	f.Close()
	for _, typ := range []tensor.DType{tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.IQ4_NL, tensor.Q2_K, tensor.Q3_K, tensor.Q5_K, tensor.IQ4_XS} {
		if !seen[typ] {
			t.Errorf("the file holds no %s matrix", typ)
		}
	}
	run := readLlamaRun(t, filepath.Join("testdata", "llamacpp", "quant-tiny-alltypes.txt"))
	d, n := compareLlamaRun(t, file, run, 0.02)
	t.Logf("largest logit difference %.3g, greedy tokens compared at %d of %d steps", d, n, len(run.steps))
}

// TestMixesMatchLlamaQuantize: the type of every matrix in gen-model's
// mixes is the one llama-quantize chose for the same mix from the F32
// file of the same shape (testdata/llamacpp/types-*.txt: its tensor
// types, recorded), fallbacks included (llama3-tiny and qwen2-tiny: rows
// of 64 and 128 values).
func TestMixesMatchLlamaQuantize(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "llamacpp", "types-*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no recorded type tables (%v)", err)
	}
	for _, path := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "types-"), ".txt")
		var shape, mixName string
		for n := range genShapes {
			if rest, ok := strings.CutPrefix(name, n+"-"); ok && len(n) > len(shape) {
				shape, mixName = n, rest
			}
		}
		sh, known := genShapes[shape]
		if !known {
			t.Fatalf("%s: no shape %q", path, shape)
		}
		t.Run(name, func(t *testing.T) {
			mix, err := convert.ParseMix(mixName)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, line := range strings.Split(string(data), "\n") {
				fs := strings.Fields(line)
				if len(fs) != 3 || strings.HasPrefix(fs[0], "#") {
					continue
				}
				tname, cols := fs[0], 0
				want, err := tensor.ParseDType(fs[2])
				if _, err2 := fmt.Sscanf(fs[1], "%d", &cols); err != nil || err2 != nil {
					t.Fatalf("bad line %q", line)
				}
				if cols == 0 || !strings.HasSuffix(tname, ".weight") || want == tensor.F32 {
					continue // vectors
				}
				layer := sh.Layers
				fmt.Sscanf(tname, "blk.%d.", &layer)
				if tname == "token_embd.weight" {
					layer = 0
				}
				_, got := genTensorType(mix, sh, tname, layer, cols)
				if got != want {
					t.Errorf("%s: %s, llama-quantize %s", tname, got, want)
				}
				n++
			}
			if n == 0 {
				t.Fatal("no matrices in the table")
			}
		})
	}
}
