package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/tensor"
)

// TestConvertReportsTypes: convert says which types it wrote (stories260K's
// rows of 64 and 172 values fit no 256-value K-quant block, and 172 no
// 32-value block), and the file says the same.
func TestConvertReportsTypes(t *testing.T) {
	s := storiesFiles(t)
	cases := []struct {
		typ      string
		stdout   string // the summary after "wrote FILE: "
		note     string // substring of stderr ("" = none)
		fileType uint64 // general.file_type
		quantVer bool   // general.quantization_version present
	}{
		{"F32", "47 tensors: 47 F32; file type F32", "", 0, false},
		{"F16", "47 tensors: 36 F16, 11 F32; file type F16", "", 1, false},
		{"Q8_0", "47 tensors: 31 Q8_0, 11 F32, 5 F16; file type Q8_0", "5 matrices have rows that do not fit Q8_0's 32-value blocks", 7, true},
		{"Q4_K", "47 tensors: 36 F16, 11 F32; file type F16", "no matrix has rows that fit Q4_K's 256-value blocks: every matrix is written as F16", 1, false},
		{"Q6_K", "47 tensors: 36 F16, 11 F32; file type F16", "no matrix has rows that fit Q6_K's 256-value blocks", 1, false},
	}
	for _, c := range cases {
		t.Run(c.typ, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "x.gguf")
			stdout, stderr, code := kvlm(t, "convert", "llama2c", "--model", s.bin, "--tokenizer", s.tok, "-o", out, "--type", c.typ)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if want := "wrote " + out + ": " + c.stdout + "\n"; stdout != want {
				t.Errorf("stdout %q, want %q", stdout, want)
			}
			if c.note == "" && stderr != "" || !strings.Contains(stderr, c.note) {
				t.Errorf("stderr %q, want %q", stderr, c.note)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			counts := map[tensor.DType]int{}
			for _, ti := range f.Tensors {
				counts[ti.Type]++
			}
			if got := typeCounts(counts); !strings.HasPrefix(c.stdout, "47 tensors: "+got+";") {
				t.Errorf("the file holds %s; convert said %q", got, c.stdout)
			}
			if ft, err := f.Uint("general.file_type"); err != nil || ft != c.fileType {
				t.Errorf("general.file_type %d (%v), want %d", ft, err, c.fileType)
			}
			if _, ok := f.Lookup("general.quantization_version"); ok != c.quantVer {
				t.Errorf("general.quantization_version present: %v, want %v", ok, c.quantVer)
			}
		})
	}
}

// TestConvertKVHeads: convert kv-heads takes a llama2.c checkpoint or a
// GGUF file (the same bytes come out of both), says what it pooled, and
// kvcalc sizes the result's KV cache at N/4 of the 4-KV-head original's.
func TestConvertKVHeads(t *testing.T) {
	s := storiesFiles(t)
	dir := t.TempDir()
	bytesPerToken := func(path string) float64 {
		t.Helper()
		stdout, stderr, code := kvlm(t, "kvcalc", "-m", path, "--json")
		if code != 0 {
			t.Fatalf("kvcalc: exit %d: %s", code, stderr)
		}
		var r struct {
			BytesPerToken float64 `json:"bytes_per_token"`
		}
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatal(err)
		}
		return r.BytesPerToken
	}
	full := bytesPerToken(s.gguf)
	for _, c := range []struct {
		n      int
		stdout string // after "wrote OUT: "
	}{
		{4, "4 KV heads already: nothing pooled, 47 tensors copied"},
		{2, "4 → 2 KV heads (4 query heads each), 10 tensors pooled (10 F32), 37 copied"},
		{1, "4 → 1 KV heads (8 query heads each), 10 tensors pooled (10 F32), 37 copied"},
	} {
		t.Run(fmt.Sprint(c.n), func(t *testing.T) {
			fromBin := filepath.Join(dir, fmt.Sprintf("bin%d.gguf", c.n))
			stdout, stderr, code := kvlm(t, "convert", "kv-heads", s.bin, "--tokenizer", s.tok, "--kv-heads", fmt.Sprint(c.n), "-o", fromBin)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if want := "wrote " + fromBin + ": " + c.stdout + "\n"; stdout != want {
				t.Errorf("stdout %q, want %q", stdout, want)
			}
			fromGGUF := filepath.Join(dir, fmt.Sprintf("gguf%d.gguf", c.n))
			if _, stderr, code := kvlm(t, "convert", "kv-heads", s.gguf, "--kv-heads", fmt.Sprint(c.n), "-o", fromGGUF); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			a, err := os.ReadFile(fromBin)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(fromGGUF)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Error("the llama2.c checkpoint and its GGUF convert to different files")
			}
			if got, want := bytesPerToken(fromBin), full*float64(c.n)/4; got != want {
				t.Errorf("kvcalc: %g B/token, want %g", got, want)
			}
		})
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no count", []string{s.gguf, "-o", filepath.Join(dir, "x.gguf")}, "needs --kv-heads N"},
		{"no output", []string{s.gguf, "--kv-heads", "2"}, "needs -o OUT.gguf"},
		{"not a divisor", []string{s.gguf, "--kv-heads", "3", "-o", filepath.Join(dir, "x.gguf")}, "does not divide the model's 4 KV heads"},
		{"unknown model", []string{"no-such-model-anywhere", "--kv-heads", "2", "-o", filepath.Join(dir, "x.gguf")}, "no-such-model-anywhere"},
		{"two models", []string{s.gguf, s.bin, "--kv-heads", "2", "-o", filepath.Join(dir, "x.gguf")}, "accepts 1 arg"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, code := kvlm(t, append([]string{"convert", "kv-heads"}, c.args...)...)
			if code == 0 || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q, want an error mentioning %q", code, stderr, c.want)
			}
		})
	}
}
