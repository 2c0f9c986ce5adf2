package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/tokenizer"
)

// writeGGUF writes a GGUF holding only metadata.
func writeGGUF(t *testing.T, name string, kv map[string]any) string {
	t.Helper()
	w := gguf.NewWriter()
	for k, v := range kv {
		if err := w.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(t.TempDir(), name)
	if err := w.WriteFile(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// llama3VocabGGUF is a GGUF with the Llama 3 vocabulary of ../shared.
func llama3VocabGGUF(t *testing.T, pre string) string {
	t.Helper()
	tokens, types, merges, err := tokenizer.ReadGPT2VocabDir(shared.Path(t, "models/llama3-tokenizer"), tokenizer.Llama3Specials())
	if err != nil {
		t.Fatal(err)
	}
	return writeGGUF(t, "llama3-vocab.gguf", map[string]any{
		"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
		"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
		"tokenizer.ggml.bos_token_id": uint32(128000), "tokenizer.ggml.eos_token_id": uint32(128001),
		"tokenizer.ggml.add_bos_token": true,
	})
}

func TestTokenize(t *testing.T) {
	g := llama3VocabGGUF(t, "llama-bpe")
	tok512 := shared.Path(t, "models/stories260K/tok512.bin")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"-m", g, "hello world"}, "15339 1917\n"},
		{[]string{"-m", g, "hello world", "--json"}, `{"ids":[15339,1917]}` + "\n"},
		{[]string{"-m", g, "--bos", "hello world"}, "128000 15339 1917\n"},
		{[]string{"-m", g, "hello <|end_of_text|>"}, "15339 220 128001\n"},
		{[]string{"-m", g, "<|begin_of_text|>A<|end_of_text|>B!"}, "128000 32 128001 33 0\n"},
		{[]string{"-m", g, strings.Repeat("0", 17)}, "931 931 931 931 931 410\n"},
		{[]string{"--tokenizer", g, "", "--json"}, `{"ids":[]}` + "\n"},
		{[]string{"--tokenizer", tok512, "--bos", "Once upon a time"}, "1 403 407 261 378\n"},
	}
	for _, c := range cases {
		out, errOut, code := kvlm(t, append([]string{"tokenize"}, c.args...)...)
		if code != 0 || out != c.want {
			t.Errorf("tokenize %q: %q (stderr %q, code %d), want %q", c.args, out, errOut, code, c.want)
		}
	}
	// --no-special: the marker is text.
	out, _, _ := kvlm(t, "tokenize", "-m", g, "--no-special", "<|end_of_text|>")
	if strings.Contains(out, "128001") {
		t.Errorf("--no-special: %q", out)
	}
}

func TestTokenizeErrors(t *testing.T) {
	bad := llama3VocabGGUF(t, "tekken")
	noTok := writeGGUF(t, "x.gguf", map[string]any{"general.architecture": "llama", "tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": []string{"a"}})
	junk := filepath.Join(t.TempDir(), "junk.bin")
	os.WriteFile(junk, []byte("not a model at all"), 0o644)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"x"}, "no model given"},
		{[]string{"-m", bad, "x"}, `tokenizer.ggml.pre "tekken" is not supported`},
		{[]string{"-m", noTok, "x"}, `tokenizer.ggml.model "bert" is not supported`},
		{[]string{"-m", junk, "x"}, "not a GGUF file"},
	}
	for _, c := range cases {
		_, errOut, code := kvlm(t, append([]string{"tokenize"}, c.args...)...)
		if code != 1 || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("tokenize %q: code %d, stderr %q, want %q", c.args, code, errOut, c.want)
		}
	}
}
