package eval

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/internal/shared"
)

func TestMethodMode(t *testing.T) {
	for m, want := range map[string]string{"snapkv": modeRatio, "h2o": modeRatio, "window": modeBudget, "streaming": modeBudget, "pyramidinfer": modeSchedule} {
		got, err := MethodMode(m)
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", m, got, err, want)
		}
	}
	if _, err := MethodMode("nope"); err == nil {
		t.Error("unknown method accepted")
	}
}

func TestFrontier(t *testing.T) {
	cells := []CompressCell{
		{Method: "a", KVBytes: 100, Greedy: 0.5, NLL: 2, Contexts: 1},
		{Method: "b", KVBytes: 200, Greedy: 0.4, NLL: 1.5, Contexts: 1}, // dominated in greedy
		{Method: "c", KVBytes: 300, Greedy: 0.9, NLL: 1.6, Contexts: 1},
		{Method: "d", KVBytes: 50, Greedy: 0.1, NLL: 3, Contexts: 1},
		{Method: "e", KVBytes: 10, Greedy: 1, NLL: 1, Contexts: 0}, // failed: ignored
	}
	var got []string
	for _, c := range Frontier(cells, "greedy") {
		got = append(got, c.Method)
	}
	if strings.Join(got, "") != "dac" {
		t.Errorf("greedy frontier %v, want d a c", got)
	}
	got = nil
	for _, c := range Frontier(cells, "nll") {
		got = append(got, c.Method)
	}
	if strings.Join(got, "") != "dab" {
		t.Errorf("nll frontier %v, want d a b", got)
	}
}

// TestSweepDeterministic runs a small sweep twice: apart from timings the
// results are identical; the full cache agrees with itself; the figures
// and the report are written.
func TestSweepDeterministic(t *testing.T) {
	m, tok, err := engine.Load(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/stories260K/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cfg := DefaultSweep(true)
	cfg.Contexts, cfg.Ratios, cfg.Codecs = 1, []float64{0.5, 0.25}, []string{"q8"}
	cfg.Methods = []string{"snapkv", "window", "tova"}
	cfg.StreamTokens, cfg.DenseTokens, cfg.StreamEvery = 300, 300, 50
	cfg.Text = TextSpec{Name: "tiny", Path: shared.Path(t, "data/tinystories_valid_head.txt")}
	cfg.OOD = []TextSpec{{Name: "sherlock", Path: shared.Path(t, "data/sherlock_holmes_pg1661.txt")}}
	sweep := func() (*Results, []byte) {
		r, err := Sweep(m, tok, cfg)
		if err != nil {
			t.Fatal(err)
		}
		c := *r
		c.Timing = Timing{}
		c.Compress = append([]CompressCell(nil), r.Compress...)
		for i := range c.Compress {
			c.Compress[i].TokS = 0
		}
		c.Stream = append([]StreamRun(nil), r.Stream...)
		for i := range c.Stream {
			c.Stream[i].TokS = 0
		}
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return r, b
	}
	r, a := sweep()
	_, b := sweep()
	if !bytes.Equal(a, b) {
		t.Fatal("two runs of the same sweep differ")
	}
	if !r.Setup.OOD[0].Gutenberg {
		t.Error("the Gutenberg header was not stripped")
	}
	full := findCell(r, "full", "f32", 1)
	if full == nil || full.Top1 != 1 || full.Greedy != 1 || full.AttnMean != 0 {
		t.Fatalf("full cache vs itself: %+v", full)
	}
	if len(r.Stream) != 2*(3+len(cfg.Sinks)) {
		t.Fatalf("%d stream runs", len(r.Stream))
	}
	dir := t.TempDir()
	figs, err := PlotAll(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteResults(filepath.Join(dir, "results.json"), r); err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	if err := WriteReport(&md, r, figs, ReportInfo{Command: "kvlm eval test", Commit: "abc", ImgDir: "."}); err != nil {
		t.Fatal(err)
	}
	for _, f := range figs {
		for _, ext := range []string{".png", ".svg"} {
			if st, err := os.Stat(filepath.Join(dir, f.Name+ext)); err != nil || st.Size() == 0 {
				t.Errorf("%s%s: %v", f.Name, ext, err)
			}
		}
		if !strings.Contains(md.String(), f.Name+".png") {
			t.Errorf("report lacks %s", f.Name)
		}
	}
}
