package engine

import (
	"bytes"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvlm/kvlm/convert"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
)

// The fingerprint covers every byte of every tensor: one weight changed
// anywhere gives another fingerprint, and a slot saved from the model is
// refused by the changed one.
func TestFingerprintCoversEveryWeight(t *testing.T) {
	orig, tok := loadStories(t)
	fp := Fingerprint(orig)
	if again, _ := loadStories(t); Fingerprint(again) != fp {
		t.Fatalf("the same model loaded twice: fingerprints %s and %s", Fingerprint(again), fp)
	}
	// A slot of the original model.
	e := newEngine(t, orig, Config{})
	slot := 0
	collect(t, must(e.Submit(GenRequest{Prompt: prompts(tok)[0], MaxTokens: 4, Slot: &slot})))
	var file bytes.Buffer
	if _, err := e.SaveSlot(0, &file); err != nil {
		t.Fatal(err)
	}
	// The weights are mapped read-only: a changed tensor is a copy.
	negated := func(w *tensor.Matrix, idx ...int) *tensor.Matrix {
		if w.F32() == nil {
			t.Fatalf("stories260K's %dx%d matrix is %s, not F32", w.Rows, w.Cols, w.Type)
		}
		f := slices.Clone(w.F32())
		for _, i := range idx {
			f[i] = -f[i]
		}
		return tensor.MatrixF32(w.Rows, w.Cols, f)
	}
	cases := []struct {
		name   string
		change func(m *model.Model)
	}{
		{"one embedding row negated", func(m *model.Model) {
			var row []int
			for c := range m.Dim {
				row = append(row, 7*m.Dim+c)
			}
			tied := m.Output == m.TokEmb
			m.TokEmb = negated(m.TokEmb, row...)
			if tied {
				m.Output = m.TokEmb
			}
		}},
		{"one weight of the last layer's FFN", func(m *model.Model) {
			l := &m.Layers[len(m.Layers)-1]
			l.WUp = negated(l.WUp, 5*m.Dim+3)
		}},
		{"one weight of a middle row of Wk", func(m *model.Model) {
			l := &m.Layers[1]
			l.Wk = negated(l.Wk, (l.Wk.Rows/2+1)*m.Dim+2)
		}},
		{"the output norm", func(m *model.Model) {
			m.OutNorm = slices.Clone(m.OutNorm)
			m.OutNorm[3] = -m.OutNorm[3]
		}},
		{"an attention norm", func(m *model.Model) {
			l := &m.Layers[2]
			l.AttnNorm = slices.Clone(l.AttnNorm)
			l.AttnNorm[0] *= 2
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, _ := loadStories(t)
			c.change(m)
			if got := Fingerprint(m); got == fp {
				t.Fatalf("fingerprint %s unchanged", got)
			}
			e2 := newEngine(t, m, Config{})
			_, err := e2.RestoreSlot(0, bytes.NewReader(file.Bytes()))
			var ie *InvalidError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), "another model") {
				t.Fatalf("restore into the changed model: %v, want refused as another model's", err)
			}
		})
	}
	// The original still restores it.
	e3 := newEngine(t, orig, Config{})
	if _, err := e3.RestoreSlot(0, bytes.NewReader(file.Bytes())); err != nil {
		t.Fatalf("restore into the same model: %v", err)
	}
}

// The layout the weights are kept in does not count: a GGUF read into
// memory (panels where this CPU has panel kernels) and mapped (rows) have
// the same fingerprint.
func TestFingerprintLayout(t *testing.T) {
	for _, typ := range []tensor.DType{tensor.F16, tensor.Q8_0} {
		t.Run(typ.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.gguf")
			if _, err := convert.Llama2C(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/stories260K/tok512.bin"), path, convert.Options{Type: typ}); err != nil {
				t.Fatal(err)
			}
			read, _, err := Load(path, "")
			if err != nil {
				t.Fatal(err)
			}
			defer read.Close()
			mapped, _, err := LoadMapped(path, "")
			if err != nil {
				t.Fatal(err)
			}
			defer mapped.Close()
			t.Logf("%s: Wq in %d panels read, %d mapped", typ, read.Layers[0].Wq.Panels(), mapped.Layers[0].Wq.Panels())
			if a, b := Fingerprint(read), Fingerprint(mapped); a != b {
				t.Fatalf("read %s, mapped %s", a, b)
			}
		})
	}
}

// A fingerprint given up (the engine closed while it ran) is not cached as
// a result: the next call computes it.
func TestFingerprintStop(t *testing.T) {
	m, _ := loadStories(t)
	var stop atomic.Bool
	stop.Store(true)
	if fp, err := fingerprint(m, &stop); !errors.Is(err, errFingerprintStopped) || fp != "" {
		t.Fatalf("stopped: %q %v", fp, err)
	}
	if fp := Fingerprint(m); len(fp) != 32 {
		t.Fatalf("after a stopped one: %q", fp)
	}
}
