package convert

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
)

// TestBuildKVMap: Build writes a model's KV source map and per-layer
// windows under llama.attention.kv_source / layer_window and no K/V
// tensors for the layers that do not own KV; the file loads back with the
// same map and runs. An ordinary model gets neither key.
func TestBuildKVMap(t *testing.T) {
	bin := shared.Path(t, "models/stories260K/stories260K.bin")
	tok, err := tokenizer.LoadLlama2C(shared.Path(t, "models/stories260K/tok512.bin"), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		src, win []int
	}{
		{"plain", nil, nil},
		{"cla2", []int{0, 0, 2, 2, 4}, nil},
		{"windows", nil, []int{8, 0, 8, 0, 8}},
		{"lckv", []int{0, 4, 4, 4, 4}, []int{0, 0, 0, 16, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := model.LoadLlama2C(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.Config.Layers != 5 {
				t.Fatalf("stories260K has %d layers, the cases assume 5", m.Config.Layers)
			}
			m.KVSource, m.LayerWindows = c.src, c.win
			for i := range m.Layers {
				if !m.Owns(i) {
					m.Layers[i].Wk, m.Layers[i].Wv = nil, nil
				}
			}
			w, _, err := Build(m, tok, Options{Type: tensor.F32, Name: c.name})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), c.name+".gguf")
			if err := w.WriteFile(path); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, hasSrc := f.Lookup("llama." + model.KeyKVSource)
			_, hasWin := f.Lookup("llama." + model.KeyLayerWindow)
			if hasSrc != (c.src != nil) || hasWin != (c.win != nil) {
				t.Errorf("keys kv_source %v layer_window %v, want %v %v", hasSrc, hasWin, c.src != nil, c.win != nil)
			}
			for i := range m.Layers {
				_, hasK := f.Tensor(fmt.Sprintf("blk.%d.attn_k.weight", i))
				if hasK != m.Owns(i) {
					t.Errorf("layer %d: attn_k written %v, owns KV %v", i, hasK, m.Owns(i))
				}
			}
			back, _, err := model.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(back.KVSource, c.src) || !slices.Equal(back.LayerWindows, c.win) {
				t.Fatalf("loaded map %v windows %v, want %v %v", back.KVSource, back.LayerWindows, c.src, c.win)
			}
			seq, err := back.NewStandaloneSequence(model.KVOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			if _, err := seq.Forward([]int{1, 20, 30, 40}, false); err != nil {
				t.Fatal(err)
			}
		})
	}
}
