package main

import (
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
