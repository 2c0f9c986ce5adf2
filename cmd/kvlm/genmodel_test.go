package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/convert"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/server"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
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
	for _, typ := range genTestTypes() {
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
				mix, err := convert.ParseMix(typ)
				if err != nil {
					t.Fatal(err)
				}
				_, want := genTensorType(mix, sh, c.name, c.layer, int(ti.Shape[0]))
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
			checkLogits(t, logits)
		})
	}
}

// genTestTypes are the types the tests of the 32,000- and 128,000-token
// shapes write: every type but the plain ones whose products are still
// plain Go (their 32000×256 classifier alone would take most of the
// package's time); TestMatchesLlamaCppKvlmFiles writes and runs every type
// on quant-tiny, and TestMixesMatchLlamaQuantize checks the fallbacks.
func genTestTypes() []string {
	var ts []string
	for _, t := range genTypes {
		switch t {
		case "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q3_K", "Q5_K":
			continue
		}
		ts = append(ts, t)
	}
	return ts
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
		{"gen-model", "--shape", "llama3-tiny", "--type", "F16", "--tokenizer", t.TempDir(), "-o", out},
	} {
		if _, e, code := kvlm(t, args...); code != 1 || e == "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, e)
		} else if args[2] == "llama3-tiny" && !strings.Contains(e, "a folder holding encoder.json and vocab.bpe") {
			t.Errorf("%v: stderr %q", args, e)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a failed gen-model left a file")
	}
}

// genTiny writes shape (llama3-tiny or qwen2-tiny) as typ with the shared
// Llama 3 vocabulary and returns the file and gen-model's stderr.
func genTiny(t *testing.T, dir, shape, typ string) (string, string) {
	t.Helper()
	voc := shared.Path(t, "models/llama3-tokenizer")
	out := filepath.Join(dir, shape+"-"+typ+".gguf")
	o, e, code := kvlm(t, "gen-model", "--shape", shape, "--type", typ, "--tokenizer", voc, "-o", out)
	if code != 0 {
		t.Fatalf("gen-model %s %s: exit %d: %s %s", shape, typ, code, o, e)
	}
	return out, e
}

// TestGenModelTinyArchs writes llama3-tiny and qwen2-tiny in every type and
// checks that each loads with its architecture and vocabulary, stores each
// matrix in the type asked for or llama.cpp's fallback (said on stderr),
// has its chat template (tokenizer.chat_template) rendered by the Jinja
// engine, and runs a rendered chat prompt to finite logits.
func TestGenModelTinyArchs(t *testing.T) {
	dir := t.TempDir()
	for _, shape := range []string{"llama3-tiny", "qwen2-tiny"} {
		sh := genShapes[shape]
		for _, typ := range genTestTypes() {
			if testing.Short() && typ != "F16" && typ != "Q4_K_M" {
				continue // -short: one plain type and the fallback mix
			}
			t.Run(shape+"/"+typ, func(t *testing.T) {
				path, errOut := genTiny(t, dir, shape, typ)
				f, err := gguf.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				m, tok, err := model.FromGGUF(f)
				if err != nil {
					t.Fatal(err)
				}
				c := m.Config
				if c.Arch != sh.arch() || c.Dim != sh.Dim || c.Layers != sh.Layers || c.Heads != sh.Heads || c.KVHeads != sh.KVHeads ||
					c.HiddenDim != sh.Hidden || c.RopeTheta != sh.RopeTheta {
					t.Fatalf("config %+v", c)
				}
				if _, ok := tok.(*tokenizer.BPE); !ok {
					t.Fatalf("tokenizer %T", tok)
				}
				wantPrompt := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
				switch shape {
				case "llama3-tiny":
					if m.Vocab != 128256 || tok.BOS() != 128000 || tok.EOS() != 128009 || !tokenizer.AddsBOS(tok) ||
						m.Output != m.TokEmb || m.Rope != model.RopeInterleaved || len(m.RopeFreqFactors) != 8 || m.Layers[0].Bq != nil {
						t.Fatalf("llama3-tiny: vocab %d, BOS %d, EOS %d, rope %s, factors %v", m.Vocab, tok.BOS(), tok.EOS(), m.Rope, m.RopeFreqFactors)
					}
				case "qwen2-tiny":
					wantPrompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello there!"
					if m.Vocab != 128003 || tok.BOS() != 128000 || tok.EOS() != 128002 || tokenizer.AddsBOS(tok) ||
						m.Output == m.TokEmb || m.Rope != model.RopeNeoX || m.Layers[1].Bv == nil || m.RopeFreqFactors != nil || c.NormEps != 1e-6 {
						t.Fatalf("qwen2-tiny: vocab %d, BOS %d, EOS %d, rope %s, eps %g", m.Vocab, tok.BOS(), tok.EOS(), m.Rope, c.NormEps)
					}
				}
				// Types: the mix's, or the fallback where the rows are
				// not whole blocks; the bytes are the quantized draw.
				fellBack := false
				for _, ti := range f.Tensors {
					if len(ti.Shape) != 2 {
						if ti.Type != tensor.F32 {
							t.Errorf("%s is %s", ti.Name, ti.Type)
						}
						continue
					}
					layer := sh.Layers
					fmt.Sscanf(ti.Name, "blk.%d.", &layer)
					if ti.Name == "token_embd.weight" {
						layer = 0
					}
					mix, err := convert.ParseMix(typ)
					if err != nil {
						t.Fatal(err)
					}
					mixType, want := genTensorType(mix, sh, ti.Name, layer, int(ti.Shape[0]))
					fellBack = fellBack || want != mixType
					if ti.Type != want {
						t.Errorf("%s is %s, want %s", ti.Name, ti.Type, want)
					}
				}
				if fellBack != strings.Contains(errOut, "gen-model: "+typ+": ") || fellBack && !strings.Contains(errOut, "whose rows are not whole blocks") {
					t.Errorf("fallback %v, stderr %q", fellBack, errOut)
				}
				ti, _ := f.Tensor("blk.1.ffn_down.weight")
				var buf bytes.Buffer
				if err := genMatrix(&buf, ti.Type, sh.Dim, sh.Hidden, 0.5/math.Sqrt(float64(sh.Hidden)), 1, ti.Name); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf.Bytes(), f.TensorData(ti)) {
					t.Error("blk.1.ffn_down.weight: stored bytes differ from the quantized draw")
				}
				tm, how, err := chat.FromGGUF(f, tok, "")
				if err != nil || tm.Name != chat.JinjaName || how != "chat_template" {
					t.Fatalf("chat template %v by %s (%v), want the file's", tm, how, err)
				}
				if p, err := tm.Render([]chat.Message{{Role: "user", Content: "Hello there!"}}, true); err != nil || !strings.HasPrefix(p, wantPrompt) {
					t.Fatalf("prompt %q (%v), want it to start %q", p, err, wantPrompt)
				}
				ids, err := tm.Encode(tok, []chat.Message{{Role: "user", Content: "Hello there!"}}, true)
				if err != nil {
					t.Fatal(err)
				}
				seq, err := m.NewStandaloneSequence(model.KVOptions{Tokens: 64})
				if err != nil {
					t.Fatal(err)
				}
				defer seq.Close()
				logits, err := seq.Forward(ids, false)
				if err != nil {
					t.Fatal(err)
				}
				checkLogits(t, logits)
			})
		}
	}
}

// TestGenModelTinyTemplates: the templates the tiny models carry render
// the prompts of their formats, with the special tokens becoming tokens.
func TestGenModelTinyTemplates(t *testing.T) {
	dir := t.TempDir()
	msgs := []chat.Message{{Role: "user", Content: "hi"}}
	for _, c := range []struct{ shape, text string }{
		{"llama3-tiny", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"qwen2-tiny", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"},
	} {
		path, _ := genTiny(t, dir, c.shape, "Q8_0")
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := model.TokenizerFromGGUF(f)
		if err != nil {
			t.Fatal(err)
		}
		tm, _, err := chat.FromGGUF(f, tok, "")
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		got, err := tm.Render(msgs, true)
		if err != nil || got != c.text {
			t.Errorf("%s: rendered %q (%v), want %q", c.shape, got, err, c.text)
		}
		ids, err := tm.Encode(tok, msgs, true)
		if err != nil {
			t.Fatal(err)
		}
		// Llama 3: <|begin_of_text|> <|start_header_id|> system
		// <|end_header_id|> … <|start_header_id|> assistant
		// <|end_header_id|> "\n\n"; ChatML: <|im_start|> system "\n" …
		// <|im_start|> assistant "\n", no BOS.
		head, tail := []int{128000, 128006, 9125, 128007}, []int{128006, 78191, 128007, 271}
		if c.shape == "qwen2-tiny" {
			head, tail = []int{128001, 9125, 198}, []int{128001, 78191, 198}
		}
		if len(ids) < len(head)+len(tail) || !slices.Equal(ids[:len(head)], head) || !slices.Equal(ids[len(ids)-len(tail):], tail) ||
			slices.Contains(ids[1:], 128000) {
			t.Errorf("%s: ids %v, want them to start %v and end %v, with no second BOS", c.shape, ids, head, tail)
		}
	}
}

// TestGenModelTinyCLI: kvlm tokenize gives the Llama 3 goldens of
// ../shared/models/llama3-tokenizer/README.md on llama3-tiny; kvlm
// generate runs on both tiny models, adding BOS only where the vocabulary
// asks; kvlm chat picks each file's template, or the one --chat-template
// names.
func TestGenModelTinyCLI(t *testing.T) {
	dir := t.TempDir()
	l3, _ := genTiny(t, dir, "llama3-tiny", "Q8_0")
	q2, _ := genTiny(t, dir, "qwen2-tiny", "F16")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"hello world"}, "15339 1917"},
		{[]string{"hello <|end_of_text|>"}, "15339 220 128001"},
		{[]string{"0"}, "15"},
		{[]string{"00"}, "410"},
		{[]string{"000"}, "931"},
		{[]string{"0000"}, "931 15"},
		{[]string{"00000"}, "931 410"},
		{[]string{"000000"}, "931 931"},
		{[]string{strings.Repeat("0", 17)}, "931 931 931 931 931 410"},
		{[]string{"<|begin_of_text|>A B!"}, "128000 32 426 0"},
		{[]string{"<|begin_of_text|>A<|end_of_text|>B!"}, "128000 32 128001 33 0"},
		{[]string{"--bos", "hello world"}, "128000 15339 1917"},
		{[]string{"--json", "hello world"}, `{"ids":[15339,1917]}`},
	} {
		out, e, code := kvlm(t, append([]string{"tokenize", "-m", l3}, c.args...)...)
		if code != 0 || out != c.want+"\n" {
			t.Errorf("tokenize %q: %q (exit %d, %s), want %q", c.args, out, code, e, c.want)
		}
	}
	// qwen2-tiny's vocabulary (pre-tokenizer qwen2, ChatML specials)
	// round-trips the README's texts and makes ChatML's markers tokens.
	tok, err := loadTokenizer(q2, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"Hello World!", "I'm don't won't", "In 2024 there are 366 days", "Hello!! ...world", "Hello    World", "Hello\nWorld", "请考试我的软件！12345"} {
		if got := tok.DecodeAll(tok.Encode(text, false, false)); got != text {
			t.Errorf("qwen2-tiny round trip %q: %q", text, got)
		}
	}
	out, _, code := kvlm(t, "tokenize", "-m", q2, "<|im_start|>user\nhello world<|im_end|>")
	if want := "128001 882 198 15339 1917 128002\n"; code != 0 || out != want {
		t.Errorf("qwen2-tiny tokenize: %q, want %q", out, want)
	}
	for _, c := range []struct {
		path   string
		prompt []int
	}{{l3, []int{128000, 15339, 1917}}, {q2, []int{15339, 1917}}} {
		out, e, code := kvlm(t, "generate", "-m", c.path, "-p", "hello world", "-n", "6", "--temp", "0", "--json")
		if code != 0 {
			t.Fatalf("generate %s: exit %d: %s", c.path, code, e)
		}
		var r generateJSON
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if !slices.Equal(r.PromptTokens, c.prompt) || len(r.Tokens) == 0 || len(r.Tokens) > 6 || r.Prompt != "hello world" {
			t.Errorf("generate %s: %+v", filepath.Base(c.path), r)
		}
	}
	type chatCase struct {
		path     string
		args     []string
		template string
	}
	cases := []chatCase{{l3, nil, chat.JinjaName}, {q2, nil, chat.JinjaName}, {l3, []string{"--chat-template", "llama3.2"}, "llama3.1"},
		{q2, []string{"--chat-template", "mistral-v3-tekken"}, "mistral-v3-tekken"}}
	for _, c := range cases {
		_, errOut, err := chatRun(t, "hello\n/quit\n", append([]string{"-m", c.path, "-n", "3", "--temp", "0"}, c.args...)...)
		if err != nil || !strings.Contains(errOut, "template "+c.template+" (by ") {
			t.Errorf("chat %s %v: %v\n%s", filepath.Base(c.path), c.args, err, errOut)
		}
	}
	// Every built-in template can be chosen by name for a GGUF model (as
	// kvlm chat and kvlm serve choose with --chat-template).
	for _, n := range chat.Names() {
		f, how, err := server.ChooseFormat(q2, tok, n)
		if err != nil || f.Name() != n || how != "override" {
			t.Errorf("--chat-template %s: %v by %s (%v)", n, f, how, err)
		}
	}
}

// genRefOpts are the architecture choices of the reference forward pass.
type genRefOpts struct {
	neox    bool      // RoPE pairs (j, j+d/2); else (2j, 2j+1)
	biases  bool      // add attn_{q,k,v}.bias
	factors []float64 // per-pair frequency divisors (rope_freqs); nil: 1
}

// genRefForward is a plain float64 forward pass over the weights of a
// generated F32 GGUF, written from the definitions (RMSNorm, RoPE, causal
// GQA attention recomputed over every earlier token, SwiGLU), with nothing
// from the model package: it returns the logits of every position.
func genRefForward(t *testing.T, f *gguf.File, sh genShape, o genRefOpts, tokens []int) [][]float64 {
	t.Helper()
	type loaded struct {
		v    []float64
		cols int
	}
	cache := map[string]loaded{}
	load := func(name string) ([]float64, int) {
		if l, ok := cache[name]; ok {
			return l.v, l.cols
		}
		ti, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("no %s", name)
		}
		if ti.Type != tensor.F32 {
			t.Fatalf("%s is %s: the reference reads F32 files", name, ti.Type)
		}
		n := 1
		for _, d := range ti.Shape {
			n *= int(d)
		}
		v := make([]float32, n)
		if err := tensor.Dequantize(tensor.F32, f.TensorData(ti), v); err != nil {
			t.Fatal(err)
		}
		out := make([]float64, n)
		for i, x := range v {
			out[i] = float64(x)
		}
		cache[name] = loaded{out, int(ti.Shape[0])}
		return out, int(ti.Shape[0])
	}
	eps := float64(sh.Eps)
	if eps == 0 {
		eps = 1e-5
	}
	D, hd := sh.Dim, sh.Dim/sh.Heads
	rms := func(x []float64, name string) []float64 {
		g, _ := load(name)
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
	matvec := func(name string, x []float64, bias string) []float64 {
		w, cols := load(name)
		out := make([]float64, len(w)/cols)
		for r := range out {
			var acc float64
			for j, v := range w[r*cols : (r+1)*cols] {
				acc += v * x[j]
			}
			out[r] = acc
		}
		if o.biases && bias != "" {
			b, _ := load(bias)
			for r := range out {
				out[r] += b[r]
			}
		}
		return out
	}
	rotate := func(v []float64, pos int) {
		for j := 0; j < hd/2; j++ {
			inv := math.Pow(float64(sh.RopeTheta), -float64(2*j)/float64(hd))
			if o.factors != nil {
				inv /= o.factors[j]
			}
			a := float64(pos) * inv
			i0, i1 := 2*j, 2*j+1
			if o.neox {
				i0, i1 = j, j+hd/2
			}
			x0, x1 := v[i0], v[i1]
			v[i0] = x0*math.Cos(a) - x1*math.Sin(a)
			v[i1] = x0*math.Sin(a) + x1*math.Cos(a)
		}
	}
	emb, _ := load("token_embd.weight")
	n := len(tokens)
	x := make([][]float64, n)
	for p, id := range tokens {
		x[p] = slices.Clone(emb[id*D : (id+1)*D])
	}
	group := sh.Heads / sh.KVHeads
	for l := 0; l < sh.Layers; l++ {
		b := fmt.Sprintf("blk.%d.", l)
		q, k, v := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for p := range n {
			xb := rms(x[p], b+"attn_norm.weight")
			q[p], k[p], v[p] = matvec(b+"attn_q.weight", xb, b+"attn_q.bias"), matvec(b+"attn_k.weight", xb, b+"attn_k.bias"), matvec(b+"attn_v.weight", xb, b+"attn_v.bias")
			for h := 0; h < sh.Heads; h++ {
				rotate(q[p][h*hd:(h+1)*hd], p)
			}
			for h := 0; h < sh.KVHeads; h++ {
				rotate(k[p][h*hd:(h+1)*hd], p)
			}
		}
		for p := range n {
			att := make([]float64, sh.Heads*hd)
			for h := 0; h < sh.Heads; h++ {
				kh := h / group
				s := make([]float64, p+1)
				mx := math.Inf(-1)
				for u := 0; u <= p; u++ {
					for i := range hd {
						s[u] += q[p][h*hd+i] * k[u][kh*hd+i]
					}
					s[u] /= math.Sqrt(float64(hd))
					mx = max(mx, s[u])
				}
				var sum float64
				for u := range s {
					s[u] = math.Exp(s[u] - mx)
					sum += s[u]
				}
				for u := range s {
					for i := range hd {
						att[h*hd+i] += s[u] / sum * v[u][kh*hd+i]
					}
				}
			}
			out := matvec(b+"attn_output.weight", att, "")
			for i := range D {
				x[p][i] += out[i]
			}
		}
		for p := range n {
			xb := rms(x[p], b+"ffn_norm.weight")
			g, u := matvec(b+"ffn_gate.weight", xb, ""), matvec(b+"ffn_up.weight", xb, "")
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			d := matvec(b+"ffn_down.weight", g, "")
			for i := range D {
				x[p][i] += d[i]
			}
		}
	}
	out := "output.weight"
	if sh.Tied {
		out = "token_embd.weight"
	}
	logits := make([][]float64, n)
	for p := range n {
		logits[p] = matvec(out, rms(x[p], "output_norm.weight"), "")
	}
	return logits
}

// TestGenModelTinyReference: the F32 llama3-tiny and qwen2-tiny files'
// logits from kvlm (KV cache at f32) equal the plain reference over the
// file's weights within 1e-4 on every position of a 32-token prompt; the
// reference with llama's interleaved RoPE or without the biases (for
// qwen2-tiny), or without the rope_freqs factors or with NEOX RoPE (for
// llama3-tiny), is off by over 1e-3: the files really exercise their
// architectures. llama3-tiny's rope_freqs holds Llama 3.2's factors.
func TestGenModelTinyReference(t *testing.T) {
	dir := t.TempDir()
	for _, shape := range []string{"llama3-tiny", "qwen2-tiny"} {
		t.Run(shape, func(t *testing.T) {
			sh := genShapes[shape]
			path, _ := genTiny(t, dir, shape, "F32")
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			m, tok, err := model.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			text := "The quick brown fox jumps over the lazy dog. In 2024 there are 366 days; I'm sure it's fine!! 请考试我的软件"
			prompt := tok.Encode(text+" "+text, tokenizer.AddsBOS(tok), false)[:32]
			opts := genRefOpts{neox: sh.Arch == "qwen2", biases: sh.Biases}
			if shape == "llama3-tiny" {
				ti, ok := f.Tensor("rope_freqs.weight")
				if !ok {
					t.Fatal("no rope_freqs.weight")
				}
				got := make([]float32, 8)
				if err := tensor.Dequantize(tensor.F32, f.TensorData(ti), got); err != nil {
					t.Fatal(err)
				}
				// Llama 3.2: factor 32, low 1, high 4, original context
				// 8192; at head dim 16 with θ 500000 the pairs span all
				// three cases (kept, interpolated, divided by 32).
				for j, g := range got {
					wave := 2 * math.Pi * math.Pow(500000, float64(2*j)/16)
					want := 32.0
					switch {
					case wave < 8192/4.0:
						want = 1
					case wave <= 8192/1.0:
						sm := (8192/wave - 1) / (4 - 1)
						want = 1 / ((1-sm)/32 + sm)
					}
					if math.Abs(float64(g)-want) > 1e-5*want {
						t.Errorf("rope factor %d = %g, want %g", j, g, want)
					}
					opts.factors = append(opts.factors, float64(g))
				}
			}
			seq, err := m.NewStandaloneSequence(model.KVOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			logits, err := seq.Forward(prompt, true)
			if err != nil {
				t.Fatal(err)
			}
			V := m.Vocab
			worst := func(ref [][]float64) float64 {
				var w float64
				for p := range ref {
					for i, r := range ref[p] {
						d := math.Abs(float64(logits[p*V+i]) - r)
						if math.IsNaN(d) {
							return math.Inf(1)
						}
						w = max(w, d)
					}
				}
				return w
			}
			d := worst(genRefForward(t, f, sh, opts, prompt))
			t.Logf("reference: %g off", d)
			if !(d <= 1e-4) {
				t.Errorf("logits differ from the reference by %g", d)
			}
			// The architecture is really exercised: the reference
			// without it is off by far more than the tolerance.
			others := map[string]genRefOpts{"interleaved RoPE": {biases: true}, "no biases": {neox: true}}
			if shape == "llama3-tiny" {
				others = map[string]genRefOpts{"no rope_freqs": {}, "NEOX RoPE": {neox: true, factors: opts.factors}}
			}
			for what, o := range others {
				d := worst(genRefForward(t, f, sh, o, prompt))
				t.Logf("reference with %s: %g off", what, d)
				if d < 1e-3 {
					t.Errorf("the reference with %s is within %g of kvlm", what, d)
				}
			}
		})
	}
}

// checkLogits fails on a NaN or infinite logit and on logits whose RMS is
// outside [0.01, 100] (a random-weight model that is dead or exploding).
func checkLogits(t *testing.T, logits []float32) {
	t.Helper()
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
}

// TestGenModelHelpFallback: the help names the fallbacks gen-model
// writes (llama.cpp's, else F16) and the llama.cpp mixes.
func TestGenModelHelpFallback(t *testing.T) {
	out, errOut, code := kvlm(t, "gen-model", "--help")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	help := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"takes llama.cpp's fallback (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K and Q3_K → Q4_0, IQ4_XS → IQ4_NL), or F16",
		"Q4_K_M, Q5_K_M, Q3_K_M, Q2_K and IQ4_XS are llama.cpp's mixes"} {
		if !strings.Contains(help, want) {
			t.Errorf("gen-model --help does not say %q:\n%s", want, out)
		}
	}
}
