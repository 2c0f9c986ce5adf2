package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
)

// Golden stdout of run.c for the prompt "Once upon a time": 60 and 64 new
// tokens (../shared/models/README.md).
const (
	golden60 = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily\n"
	golden64 = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said\n"
)

func kvlm(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return o.String(), e.String(), code
}

type stories struct{ bin, tok, gguf string }

func storiesFiles(t *testing.T) stories {
	t.Helper()
	s := stories{
		bin: shared.Path(t, "models/stories260K/stories260K.bin"),
		tok: shared.Path(t, "models/stories260K/tok512.bin"),
	}
	s.gguf = filepath.Join(t.TempDir(), "stories260K.gguf")
	if out, errOut, code := kvlm(t, "convert", "llama2c", "--model", s.bin, "--tokenizer", s.tok, "-o", s.gguf); code != 0 {
		t.Fatalf("convert failed: %s %s", out, errOut)
	}
	return s
}

func TestGenerateGolden(t *testing.T) {
	s := storiesFiles(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"llama2c 60", []string{"-m", s.bin, "--tokenizer", s.tok, "-n", "60"}, golden60},
		{"llama2c 64", []string{"-m", s.bin, "--tokenizer", s.tok, "-n", "64"}, golden64},
		{"gguf 60", []string{"-m", s.gguf, "-n", "60"}, golden60},
		{"gguf 64", []string{"-m", s.gguf, "-n", "64"}, golden64},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"generate", "-p", "Once upon a time", "--temp", "0"}, c.args...)
			out, errOut, code := kvlm(t, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if out != c.want {
				t.Fatalf("stdout differs from run.c's golden\ngot:  %q\nwant: %q", out, c.want)
			}
		})
	}
}

func TestGenerateJSON(t *testing.T) {
	s := storiesFiles(t)
	out, errOut, code := kvlm(t, "generate", "-m", s.gguf, "-p", "Once upon a time", "-n", "64", "--temp", "0", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r generateJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if r.Prompt+r.Text+"\n" != golden64 || len(r.Tokens) != 64 || r.Stop != "length" || r.DecodeTokS <= 0 {
		t.Fatalf("unexpected result %+v", r)
	}
	if want := []int{1, 403, 407, 261, 378}; !equalInts(r.PromptTokens, want) {
		t.Fatalf("prompt tokens %v, want %v", r.PromptTokens, want)
	}
}

func equalInts(a, b []int) bool {
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

// TestPPLGolden follows the README's protocol: the first 4096 bytes, BOS,
// the first 512 tokens, 511 predictions.
func TestPPLGolden(t *testing.T) {
	s := storiesFiles(t)
	cases := []struct {
		file string
		nll  float64
	}{
		{"data/tinystories_valid_head.txt", 1.311214},
		{"data/sherlock_holmes_pg1661.txt", 5.256755},
	}
	for _, c := range cases {
		for _, m := range [][]string{{"-m", s.bin, "--tokenizer", s.tok}, {"-m", s.gguf}} {
			args := append([]string{"ppl", "-f", shared.Path(t, c.file), "--ctx", "512", "--bytes", "4096", "--json"}, m...)
			out, errOut, code := kvlm(t, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var r struct {
				Tokens      int     `json:"tokens"`
				Predictions int     `json:"predictions"`
				MeanNLL     float64 `json:"mean_nll"`
				PPL         float64 `json:"ppl"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			if r.Tokens != 512 || r.Predictions != 511 || math.Abs(r.MeanNLL-c.nll) > 1e-4 || math.Abs(r.PPL-math.Exp(r.MeanNLL)) > 1e-9 {
				t.Errorf("%s %v: %+v, want mean NLL %.6f", c.file, m, r, c.nll)
			}
		}
	}
}

func TestBenchAndInspect(t *testing.T) {
	s := storiesFiles(t)
	out, errOut, code := kvlm(t, "bench", "-m", s.gguf, "--prompt", "32", "--gen", "8", "--reps", "1", "--json")
	if code != 0 {
		t.Fatalf("bench exit %d: %s", code, errOut)
	}
	var b benchJSON
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	if b.PrefillTokS <= 0 || b.DecodeTokS <= 0 || b.PeakRSSBytes <= 0 || b.KVBytesPerToken != 1360 || b.WeightsBytes < 1000000 {
		t.Fatalf("bench result %+v", b)
	}
	// the paired ceiling rounds: each fraction is its decode speed over the
	// ceiling of its bandwidth; the reported fraction is their median
	if len(b.CeilingRounds) != 3 || b.CeilingFraction <= 0 || b.BandwidthGBs <= 0 {
		t.Fatalf("bench ceiling %+v", b)
	}
	var fr []float64
	for _, c := range b.CeilingRounds {
		want := c.DecodeTokS * float64(b.BytesPerToken) / (c.BandwidthGBs * 1e9)
		if math.Abs(c.Fraction-want) > 1e-9*want {
			t.Fatalf("ceiling round %+v: fraction, want %g", c, want)
		}
		fr = append(fr, c.Fraction)
	}
	if slices.Sort(fr); b.CeilingFraction != fr[1] {
		t.Fatalf("ceiling fraction %g, want the median of %v", b.CeilingFraction, fr)
	}
	for _, path := range []string{s.gguf, s.bin} {
		out, errOut, code = kvlm(t, "inspect", path, "--json")
		if code != 0 {
			t.Fatalf("inspect %s exit %d: %s", path, code, errOut)
		}
		var in inspectJSON
		if err := json.Unmarshal([]byte(out), &in); err != nil {
			t.Fatal(err)
		}
		if in.KVBytesPerToken["f32"] != 1360 || in.KVFormulaBytesPerToken["f32"] != 1280 || in.Config.KVHeads != 4 || in.Config.Layers != 5 {
			t.Fatalf("inspect %s: %+v", path, in)
		}
	}
	if out, _, code = kvlm(t, "inspect", s.gguf); code != 0 || !strings.Contains(out, "blk.4.ffn_down.weight") {
		t.Fatalf("inspect table lacks the tensors:\n%s", out)
	}
	// --cpuprofile writes a profile pprof reads (gzipped protobuf)
	prof := filepath.Join(t.TempDir(), "cpu.prof")
	if _, errOut, code = kvlm(t, "--cpuprofile", prof, "bench", "-m", s.gguf, "--prompt", "8", "--gen", "4", "--reps", "1", "--batch", "", "--contexts", "", "--bandwidth-mib", "0"); code != 0 {
		t.Fatalf("bench --cpuprofile exit %d: %s", code, errOut)
	}
	if b, err := os.ReadFile(prof); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("--cpuprofile wrote %d bytes (%v), want a gzipped profile", len(b), err)
	}
}

// TestBadInput: each mistake is a one-line error and exit status 1, never a
// panic.
func TestBadInput(t *testing.T) {
	s := storiesFiles(t)
	dir := t.TempDir()
	gg, err := os.ReadFile(s.gguf)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	truncated := write("trunc.gguf", gg[:len(gg)/2])
	badMagic := write("magic.gguf", append([]byte("GGUX"), gg[4:]...))
	unknownType := append([]byte{}, gg...)
	// The first tensor's type field: find "token_embd.weight" in the index.
	i := bytes.Index(unknownType, []byte("token_embd.weight"))
	typeAt := i + len("token_embd.weight") + 4 + 2*8
	unknownType[typeAt] = 99
	unknown := write("unknown.gguf", unknownType)
	long := strings.Repeat("Once upon a time there was a dog. ", 200)
	gen := func(extra ...string) []string {
		return append([]string{"generate", "-m", s.gguf, "--temp", "0"}, extra...)
	}
	cases := []struct {
		name string
		args []string
		want string // a word the error must contain
	}{
		{"missing file", []string{"generate", "-m", filepath.Join(dir, "nope.gguf"), "-p", "x"}, "no such file"},
		{"no model", []string{"generate", "-p", "x"}, "-m"},
		{"truncated gguf", []string{"generate", "-m", truncated, "-p", "x"}, "truncated"},
		{"wrong magic", []string{"generate", "-m", badMagic, "-p", "x"}, "not a GGUF file"},
		{"unknown tensor type", []string{"generate", "-m", unknown, "-p", "x"}, "type 99"},
		{"no prompt", gen(), "no prompt"},
		{"n zero", gen("-p", "x", "-n", "0"), "-n"},
		{"prompt too long", gen("-p", long), "context length"},
		{"bad temperature", gen("-p", "x", "--temp", "-1"), "temperature"},
		{"llama2c without tokenizer", []string{"generate", "-m", s.bin, "-p", "x"}, "--tokenizer"},
		{"ppl ctx too long", []string{"ppl", "-m", s.gguf, "-f", shared.Path(t, "data/tinystories_valid_head.txt"), "--ctx", "4096"}, "context length"},
		{"ppl missing text", []string{"ppl", "-m", s.gguf, "-f", filepath.Join(dir, "none.txt")}, "no such file"},
		{"bench too long", []string{"bench", "-m", s.gguf, "--prompt", "500", "--gen", "100"}, "context length"},
		{"inspect truncated", []string{"inspect", truncated}, "truncated"},
		{"convert bad type", []string{"convert", "llama2c", "--model", s.bin, "--tokenizer", s.tok, "-o", filepath.Join(dir, "x.gguf"), "--type", "Q9"}, "unknown"},
		{"unknown flag", []string{"generate", "--frobnicate"}, "unknown flag"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := kvlm(t, c.args...)
			if code != 1 {
				t.Fatalf("exit %d, want 1; stdout %q stderr %q", code, out, errOut)
			}
			if strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "kvlm: ") {
				t.Fatalf("error is not one line: %q", errOut)
			}
			if !strings.Contains(errOut, c.want) {
				t.Fatalf("error %q does not mention %q", errOut, c.want)
			}
		})
	}
}

// TestContextStop: asking for more tokens than the context holds stops at
// the context with a message, not a wrap-around.
func TestContextStop(t *testing.T) {
	s := storiesFiles(t)
	out, errOut, code := kvlm(t, "generate", "-m", s.gguf, "-p", "Once upon a time", "-n", "600", "--temp", "0", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r generateJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Stop != "context" || len(r.PromptTokens)+len(r.Tokens) != 513 || !strings.Contains(errOut, "context length 512") {
		t.Fatalf("stop %q with %d+%d tokens, stderr %q", r.Stop, len(r.PromptTokens), len(r.Tokens), errOut)
	}
}

func TestKVFlags(t *testing.T) {
	s := storiesFiles(t)
	for _, typ := range []string{"f16", "bf16", "q8", "kivi4"} {
		out, errOut, code := kvlm(t, "ppl", "-m", s.gguf, "-f", shared.Path(t, "data/tinystories_valid_head.txt"), "--bytes", "4096", "--kv-type", typ, "--json")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", typ, code, errOut)
		}
		var r struct {
			MeanNLL float64 `json:"mean_nll"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || math.Abs(r.MeanNLL-1.311214) > 0.01 {
			t.Fatalf("%s: %s", typ, out)
		}
	}
	bad := []struct {
		args []string
		want string
	}{
		{[]string{"--kv-type", "q3"}, "unknown codec"},
		{[]string{"--kv-type-k", "int8"}, "unknown codec"},
		{[]string{"--kv-block", "0"}, "--kv-block"},
		{[]string{"--kv-mem", "1KB"}, "fewer than one per"},
		{[]string{"--kv-mem", "lots"}, "--kv-mem"},
		{[]string{"--kv-mem", "64KiB", "-n", "300"}, "pool is full"},
		{[]string{"--kv-type-k", "kivi2", "--kv-block", "64"}, "multiple of the block size"},
	}
	for _, c := range bad {
		args := append([]string{"generate", "-m", s.gguf, "-p", "Once upon a time", "--temp", "0"}, c.args...)
		_, errOut, code := kvlm(t, args...)
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error mentioning %q", c.args, code, errOut, c.want)
		}
	}
}
