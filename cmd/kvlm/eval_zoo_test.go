package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/kvcalc"
)

// committedZoo is the zoo in the repository (the tests below name its
// models; $KVLM_ZOO's micro models are TestZoo's alone).
var committedZoo = filepath.Join("..", "..", "train", "zoo")

// zooSubset is a zoo folder of links to some of committedZoo's models
// (their model.gguf and record.json); edit, if set, rewrites a record
// first.
func zooSubset(t *testing.T, names []string, edit func(name string, rec map[string]any)) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		src := filepath.Join(committedZoo, n)
		if _, err := os.Stat(filepath.Join(src, "model.gguf")); err != nil {
			t.Fatalf("no %s in %s: %v", n, committedZoo, err)
		}
		abs, err := filepath.Abs(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(abs, "model.gguf"), filepath.Join(dir, n, "model.gguf")); err != nil {
			t.Fatal(err)
		}
		if edit == nil {
			if err := os.Symlink(filepath.Join(abs, "record.json"), filepath.Join(dir, n, "record.json")); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := os.ReadFile(filepath.Join(abs, "record.json"))
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatal(err)
		}
		edit(n, rec)
		if rec == nil {
			continue
		}
		if b, err = json.Marshal(rec); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n, "record.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestEvalZooQuick runs `kvlm eval --suite zoo --quick` on four zoo
// models (a plain GQA one, YOCO with its windowed layers, and the MHA→GQA
// uptraining trio) and checks what it writes: each model's rows; every
// full-cache row's bytes are the arena's, exactly kvcalc's count, and a
// lossy codec's are the f32 cache's times the ratio of their block sizes;
// q8, q4 and KIVI-2 change the NLL; SnapKV at 0.25 holds kvcalc's count of
// 48 tokens a table, under half the f16 cache (a quarter, but for YOCO's
// windowed layers), and changes the NLL; the uptraining table with the converted model; the
// report's section after the file's earlier content, and the figure.
func TestEvalZooQuick(t *testing.T) {
	zoo := zooSubset(t, []string{"gqa", "mha", "mha-to-gqa", "yoco"}, nil)
	out := t.TempDir()
	report := filepath.Join(out, "RESULTS.md")
	const before = "# Results\n\nEarlier sections.\n"
	if err := os.WriteFile(report, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, errOut, code := kvlm(t, "eval", "--suite", "zoo", "--quick", "--zoo", zoo, "--out", out, "--report", report)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(stdout, "wrote ") {
		t.Errorf("stdout %q", stdout)
	}
	b, err := os.ReadFile(filepath.Join(out, "zoo.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r eval.ZooResults
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, m := range r.Models {
		names[m.Name] = m.Role
	}
	want := map[string]string{"gqa": eval.ZooRoleScratch, "mha": eval.ZooRoleSource, "mha-to-gqa": eval.ZooRoleUptrained, "mha converted": eval.ZooRoleConverted, "yoco": ""}
	if len(names) != len(want) {
		t.Fatalf("models %v, want %v", names, want)
	}
	for n, role := range want {
		if got, ok := names[n]; !ok || got != role {
			t.Errorf("model %s: role %q (present %v), want %q", n, got, ok, role)
		}
	}
	block := func(c string) int64 {
		cc, err := kvcalc.ParseCodec(c)
		if err != nil {
			t.Fatal(err)
		}
		fp, err := kvcalc.PoolFootprint(cc, cc, 0, 16)
		if err != nil {
			t.Fatal(err)
		}
		return int64(fp.BlockBytes)
	}
	for _, m := range r.Models {
		t.Run(m.Name, func(t *testing.T) {
			if m.Role == eval.ZooRoleConverted {
				if len(m.Rows) != 0 || m.KVHeads != 2 {
					t.Errorf("converted model: %d rows, %d KV heads", len(m.Rows), m.KVHeads)
				}
				return
			}
			f32, f16 := m.Row("f32"), m.Row("f16")
			if f32 == nil || f16 == nil || len(m.Rows) != len(eval.ZooVariants) {
				t.Fatalf("rows %+v", m.Rows)
			}
			for _, row := range m.Rows {
				if row.Windows != 4 || row.Predictions != 4*(256-192-1) || !(row.KVBytes > 0) || row.KVBytesPerToken != row.KVBytes/192 {
					t.Errorf("%s: %d windows, %d predictions, %g bytes, %g per token", row.Variant, row.Windows, row.Predictions, row.KVBytes, row.KVBytesPerToken)
				}
				if row.Method != "full" {
					continue
				}
				if row.KVBytes != float64(row.KVCalcBytes) {
					t.Errorf("%s: the arena holds %g bytes, kvcalc counts %d", row.Variant, row.KVBytes, row.KVCalcBytes)
				}
				if row.Codec == "f32" {
					continue
				}
				if row.Codec != "kivi2" && row.KVBytes*float64(block("f32")) != f32.KVBytes*float64(block(row.Codec)) {
					t.Errorf("%s: %g bytes, f32 %g: not the ratio of their blocks %d / %d", row.Variant, row.KVBytes, f32.KVBytes, block(row.Codec), block("f32"))
				}
				if row.Codec != "f16" && row.NLL == f32.NLL {
					t.Errorf("%s: NLL %g equals f32's", row.Variant, row.NLL)
				}
				if row.Codec != "f16" && !(row.KVBytes < f16.KVBytes) && m.LayerWindows == nil {
					t.Errorf("%s holds %g bytes, f16 %g", row.Variant, row.KVBytes, f16.KVBytes)
				}
			}
			snap := m.Row("snapkv 0.25 f16")
			if snap == nil || !(snap.KVBytes < f16.KVBytes/2) || snap.KVBytes != float64(snap.KVCalcBytes) || snap.NLL == f16.NLL || snap.Top1 >= 1 {
				t.Errorf("snapkv 0.25: %+v; f16 %+v", snap, f16)
			}
		})
	}
	md, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	s := string(md)
	if !strings.HasPrefix(s, before) || strings.Count(s, eval.ZooSectionBegin) != 1 || strings.Count(s, eval.ZooSectionEnd) != 1 {
		t.Errorf("report:\n%.600s", s)
	}
	for _, w := range []string{"--quick", "| yoco |", "snapkv 0.25 q8", "### MHA → GQA uptraining", "| mha converted |", "zoo_pareto.png"} {
		if !strings.Contains(s, w) {
			t.Errorf("report lacks %q", w)
		}
	}
	if st, err := os.Stat(filepath.Join(out, eval.ZooFigure+".png")); err != nil || st.Size() == 0 || st.Size() > 200<<10 {
		t.Errorf("figure: %v (%v)", st, err)
	}
}

// TestEvalZooErrors: what the zoo suite refuses, each with a clear error.
func TestEvalZooErrors(t *testing.T) {
	empty := t.TempDir()
	for _, c := range []struct {
		name string
		args func(t *testing.T) []string
		want string
	}{
		{"no --zoo", func(t *testing.T) []string { return []string{"--out", t.TempDir()} }, "--suite zoo needs --zoo DIR"},
		{"no models", func(t *testing.T) []string { return []string{"--zoo", empty, "--out", t.TempDir()} }, "no DIR/*/model.gguf"},
		{"compress flag", func(t *testing.T) []string {
			return []string{"--zoo", empty, "--out", t.TempDir(), "--contexts", "3"}
		}, "--contexts is not read by --suite zoo"},
		{"model flag", func(t *testing.T) []string {
			return []string{"--zoo", empty, "--out", t.TempDir(), "-m", "x.gguf"}
		}, "--model is not read by --suite zoo"},
		{"recall flag", func(t *testing.T) []string {
			return []string{"--zoo", empty, "--out", t.TempDir(), "--codecs", "q8"}
		}, "--codecs is not read by --suite zoo"},
		{"no record", func(t *testing.T) []string {
			return []string{"--zoo", zooSubset(t, []string{"gqa"}, func(_ string, rec map[string]any) { clear(rec) }), "--out", t.TempDir()}
		}, "no held-out windows"},
		{"record missing", func(t *testing.T) []string {
			z := zooSubset(t, []string{"gqa"}, nil)
			if err := os.Remove(filepath.Join(z, "gqa", "record.json")); err != nil {
				t.Fatal(err)
			}
			return []string{"--zoo", z, "--out", t.TempDir()}
		}, "has no record.json"},
		{"record not reproduced", func(t *testing.T) []string {
			return []string{"--zoo", zooSubset(t, []string{"gqa"}, func(_ string, rec map[string]any) {
				rec["heldout"].(map[string]any)["mean_nll"] = rec["heldout"].(map[string]any)["mean_nll"].(float64) + 0.002
			}), "--out", t.TempDir(), "--quick"}
		}, "is not the trainer's"},
		{"uptrained without its source", func(t *testing.T) []string {
			return []string{"--zoo", zooSubset(t, []string{"mha-to-gqa"}, nil), "--out", t.TempDir(), "--quick"}
		}, "source"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"eval", "--suite", "zoo"}, c.args(t)...)
			_, errOut, code := kvlm(t, args...)
			if code == 0 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
				t.Errorf("%v: exit %d, stderr %q, want one line with %q", args, code, errOut, c.want)
			}
		})
	}
	// The compress suite refuses the zoo suite's --zoo.
	_, errOut, code := kvlm(t, "eval", "-m", "x.gguf", "--out", t.TempDir(), "--zoo", empty)
	if code == 0 || !strings.Contains(errOut, "--zoo belongs to --suite recall and --suite zoo") {
		t.Errorf("--suite compress --zoo: exit %d, %q", code, errOut)
	}
}
