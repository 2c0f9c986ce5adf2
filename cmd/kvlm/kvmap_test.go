package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
)

// kvMapShapes are gen-model's shapes that share KV across layers or window
// layers one by one (docs/ARCHITECTURES.md).
var kvMapShapes = []string{"cla2", "cla3", "cla2-mqa", "yoco", "lckv", "local-global"}

// TestGenModelKVMapShapes: each KV-sharing shape writes its map under
// llama.attention.kv_source / layer_window, leaves the K/V projections out
// of the layers that do not own KV, loads with that map, is described by
// inspect layer by layer, and runs in generate and ppl (and, for LCKV,
// with --lckv-passes, which a model without such layers refuses).
func TestGenModelKVMapShapes(t *testing.T) {
	tok := shared.Path(t, "models/llama2-tokenizer/tokenizer.bin")
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	dir := t.TempDir()
	paths := map[string]string{}
	for _, shape := range kvMapShapes {
		t.Run(shape, func(t *testing.T) {
			sh := genShapes[shape]
			out := filepath.Join(dir, shape+".gguf")
			paths[shape] = out
			if o, e, code := kvlm(t, "gen-model", "--shape", shape, "--type", "Q8_0", "--ctx", "256", "--tokenizer", tok, "-o", out); code != 0 {
				t.Fatalf("gen-model: exit %d: %s %s", code, o, e)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			m, _, err := model.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(m.KVSource, sh.KVSource) || !slices.Equal(m.LayerWindows, sh.LayerWindows) {
				t.Fatalf("map %v windows %v, want %v %v", m.KVSource, m.LayerWindows, sh.KVSource, sh.LayerWindows)
			}
			for i := 0; i < sh.Layers; i++ {
				_, hasK := f.Tensor(fmt.Sprintf("blk.%d.attn_k.weight", i))
				_, hasV := f.Tensor(fmt.Sprintf("blk.%d.attn_v.weight", i))
				if own := m.Owns(i); hasK != own || hasV != own {
					t.Errorf("layer %d owns KV %v, has attn_k %v attn_v %v", i, own, hasK, hasV)
				}
			}
			o, e, code := kvlm(t, "inspect", out)
			if code != 0 {
				t.Fatalf("inspect: exit %d: %s", code, e)
			}
			if !strings.Contains(o, "KV source map") {
				t.Errorf("inspect does not print the map:\n%s", o)
			}
			for i := 0; i < sh.Layers; i++ {
				if m.Source(i) != i && !strings.Contains(o, "reads ") {
					t.Errorf("inspect does not say layer %d reads layer %d", i, m.Source(i))
				}
			}
			if o, e, code := kvlm(t, "generate", "-m", out, "-p", "Once upon a time", "-n", "4", "--temp", "0"); code != 0 || o == "" {
				t.Fatalf("generate: exit %d: %s %s", code, o, e)
			}
			if o, e, code := kvlm(t, "ppl", "-m", out, "-f", text, "--ctx", "40"); code != 0 || !strings.Contains(o, "mean NLL") {
				t.Fatalf("ppl: exit %d: %s %s", code, o, e)
			}
		})
	}
	t.Run("lckv-passes", func(t *testing.T) {
		// As many passes as the prompt has tokens: the same greedy tokens
		// as sequential encoding.
		args := []string{"generate", "-m", paths["lckv"], "-p", "Once upon a time", "-n", "4", "--temp", "0"}
		seqOut, e, code := kvlm(t, args...)
		if code != 0 {
			t.Fatalf("generate: exit %d: %s", code, e)
		}
		parOut, e, code := kvlm(t, append(args, "--lckv-passes", "16")...)
		if code != 0 || parOut != seqOut {
			t.Fatalf("--lckv-passes 16: exit %d, %q, sequential %q: %s", code, parOut, seqOut, e)
		}
		if o, e, code := kvlm(t, "ppl", "-m", paths["lckv"], "-f", text, "--ctx", "40", "--lckv-passes", "7"); code != 0 || !strings.Contains(o, "mean NLL") {
			t.Fatalf("ppl --lckv-passes 7: exit %d: %s %s", code, o, e)
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"generate", "-m", paths["cla2"], "-p", "x", "-n", "1", "--lckv-passes", "7"}, "is not a Layer-Condensed KV model"},
			{[]string{"ppl", "-m", paths["yoco"], "-f", text, "--ctx", "40", "--lckv-passes", "0"}, "is not a Layer-Condensed KV model"},
			{[]string{"generate", "-m", paths["lckv"], "-p", "x", "-n", "1", "--lckv-passes", "-2"}, "--lckv-passes must be 0"},
		} {
			if _, e, code := kvlm(t, c.args...); code == 0 || !strings.Contains(e, c.want) {
				t.Errorf("%v: exit %d, stderr %q, want %q", c.args, code, e, c.want)
			}
		}
	})
}
