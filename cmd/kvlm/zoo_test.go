package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tokenizer"
)

// zoo tolerances (issue 27): kvlm against the PyTorch trainer.
const (
	zooLogitTol = 1e-4              // max |logit difference| on the fixed prompt
	zooNLLTol   = eval.ZooRecordTol // |mean held-out NLL difference|, nats
)

// zooRecord is what train/train.py writes next to model.gguf (record.json).
type zooRecord struct {
	Arch   string `json:"arch"`
	Tokens int64  `json:"tokens_seen"`
	Data   struct {
		File    string `json:"file"`
		Train   [2]int `json:"train_bytes"`
		Heldout [2]int `json:"heldout_bytes"`
	} `json:"data"`
	Heldout struct {
		Windows [][]int `json:"windows"`
		MeanNLL float64 `json:"mean_nll"`
	} `json:"heldout"`
	Prompt struct {
		Text   string      `json:"text"`
		IDs    []int       `json:"ids"`
		Logits [][]float64 `json:"logits"` // [len(IDs)][vocab]
	} `json:"prompt"`
	Recipe struct {
		Seed int `json:"seed"`
	} `json:"recipe"`
}

// zooDir is the folder of trained models: $KVLM_ZOO (the CI smoke's micro
// models) or the committed train/zoo.
func zooDir() string {
	if d := os.Getenv("KVLM_ZOO"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "train", "zoo")
}

// TestZoo checks every model the trainer exported (zooDir()/*/model.gguf
// with its record.json): kvlm reads the tok512 vocabulary and tokenizes the
// held-out text to the trainer's ids; kvlm's logits on the trainer's fixed
// prompt, as one prefill and token by token, equal PyTorch's within 1e-4;
// kvlm's mean NLL over the trainer's held-out windows equals the trainer's
// within 1e-3; the recipe metadata is the record's.
func TestZoo(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(zooDir(), "*", "model.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		if os.Getenv("KVLM_ZOO") != "" {
			t.Fatalf("KVLM_ZOO=%s holds no */model.gguf", zooDir())
		}
		t.Skipf("no trained models in %s", zooDir())
	}
	checkZooSize(t, paths)
	tok512, err := tokenizer.LoadLlama2C(shared.Path(t, "models/stories260K/tok512.bin"), 512)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(filepath.Dir(path)), func(t *testing.T) {
			rec := readZooRecord(t, filepath.Join(filepath.Dir(path), "record.json"))
			m, tok := loadZooModel(t, path)
			defer m.Close()
			checkZooVocab(t, tok, tok512)
			checkZooData(t, rec, tok512)
			checkZooRecipe(t, path, rec)
			checkZooLogits(t, m, rec)
			checkZooNLL(t, m, rec)
		})
	}
}

// checkZooSize: the committed zoo's limits (issue 27): each file ≤ 5 MB,
// all of it ≤ 40 MB.
func checkZooSize(t *testing.T, paths []string) {
	t.Helper()
	const fileMax, zooMax = 5 << 20, 40 << 20
	var total int64
	for _, p := range paths {
		files, err := filepath.Glob(filepath.Join(filepath.Dir(p), "*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			st, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(f) == "ckpt.pt" { // the trainer's checkpoint, not committed
				continue
			}
			if st.Size() > fileMax {
				t.Errorf("%s is %d bytes, over the zoo's %d per file", f, st.Size(), fileMax)
			}
			total += st.Size()
		}
	}
	if total > zooMax {
		t.Errorf("the zoo is %d bytes, over its %d", total, zooMax)
	}
}

func readZooRecord(t *testing.T, path string) zooRecord {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r zooRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(r.Prompt.IDs) == 0 || len(r.Prompt.Logits) != len(r.Prompt.IDs) || len(r.Heldout.Windows) == 0 {
		t.Fatalf("%s: incomplete record (%d prompt ids, %d logit rows, %d windows)", path, len(r.Prompt.IDs), len(r.Prompt.Logits), len(r.Heldout.Windows))
	}
	return r
}

// loadZooModel loads a zoo GGUF; its KV source map must reach the config.
func loadZooModel(t *testing.T, path string) (*model.Model, tokenizer.Tokenizer) {
	t.Helper()
	m, tok, err := model.LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for key, applied := range map[string]bool{model.KeyKVSource: m.KVSource != nil, model.KeyLayerWindow: m.LayerWindows != nil} {
		if _, ok := f.Lookup("llama." + key); ok && !applied {
			t.Fatalf("the file has llama.%s but the loaded model's config does not", key)
		}
	}
	return m, tok
}

// checkZooVocab: the exported vocabulary is tok512's, as convert writes it.
func checkZooVocab(t *testing.T, tok tokenizer.Tokenizer, tok512 *tokenizer.SentencePiece) {
	t.Helper()
	sp, ok := tok.(*tokenizer.SentencePiece)
	if !ok {
		t.Fatalf("tokenizer is %T, want SentencePiece (tok512)", tok)
	}
	p1, s1, ty1 := sp.Export()
	p2, s2, ty2 := tok512.Export()
	if !slices.Equal(p1, p2) || !slices.Equal(s1, s2) || !slices.Equal(ty1, ty2) {
		t.Fatalf("vocabulary differs from tok512's (%d pieces against %d)", len(p1), len(p2))
	}
}

// checkZooData: the held-out windows are tok512's ids of the held-out byte
// range (BOS, then consecutive runs), which lies after the training range.
func checkZooData(t *testing.T, rec zooRecord, tok512 *tokenizer.SentencePiece) {
	t.Helper()
	d := rec.Data
	if d.Train[0] != 0 || d.Train[1] > d.Heldout[0] || d.Heldout[0] >= d.Heldout[1] {
		t.Fatalf("byte ranges train %v and held-out %v overlap or are empty", d.Train, d.Heldout)
	}
	text, err := os.ReadFile(shared.Path(t, d.File))
	if err != nil {
		t.Fatal(err)
	}
	if d.Heldout[1] > len(text) {
		t.Fatalf("held-out range %v past the end of %s (%d bytes)", d.Heldout, d.File, len(text))
	}
	stream := tok512.Encode(string(text[d.Heldout[0]:d.Heldout[1]]), false, false)
	off := 0
	for k, w := range rec.Heldout.Windows {
		n := len(w) - 1
		if w[0] != tok512.BOS() || off+n > len(stream) || !slices.Equal(w[1:], stream[off:off+n]) {
			t.Fatalf("held-out window %d is not BOS + tok512 ids %d…%d of the held-out text", k, off, off+n)
		}
		off += n
	}
	// The prompt's ids: its encoding with BOS, cut at the model's context.
	want := tok512.Encode(rec.Prompt.Text, true, false)
	if n := len(rec.Prompt.IDs); n > len(want) || !slices.Equal(rec.Prompt.IDs, want[:n]) {
		t.Fatalf("prompt ids %v are not a prefix of kvlm's encoding %v", rec.Prompt.IDs, want)
	}
}

// checkZooRecipe: the GGUF carries the record's recipe.
func checkZooRecipe(t *testing.T, path string, rec zooRecord) {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	nll, err := f.Float("kvlm.train.heldout_nll")
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := f.Uint("kvlm.train.tokens")
	if err != nil {
		t.Fatal(err)
	}
	seed, err := f.Uint("kvlm.train.seed")
	if err != nil {
		t.Fatal(err)
	}
	if float32(nll) != float32(rec.Heldout.MeanNLL) || int64(tokens) != rec.Tokens || int(seed) != rec.Recipe.Seed {
		t.Fatalf("recipe metadata: NLL %g tokens %d seed %d; record: %g, %d, %d", nll, tokens, seed, rec.Heldout.MeanNLL, rec.Tokens, rec.Recipe.Seed)
	}
}

// checkZooLogits: kvlm's logits on the prompt, as one prefill and token by
// token, equal the trainer's.
func checkZooLogits(t *testing.T, m *model.Model, rec zooRecord) {
	t.Helper()
	ids, V := rec.Prompt.IDs, m.Vocab
	for _, mode := range []string{"prefill", "decode"} {
		seq, err := m.NewStandaloneSequence(model.KVOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got []float32
		if mode == "prefill" {
			got, err = seq.Forward(ids, true)
		} else {
			for _, id := range ids {
				var l []float32
				if l, err = seq.Forward([]int{id}, false); err != nil {
					break
				}
				got = append(got, l...)
			}
		}
		seq.Close()
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		worst, at := 0.0, ""
		for p, row := range rec.Prompt.Logits {
			if len(row) != V {
				t.Fatalf("record has %d logits at position %d, model vocabulary %d", len(row), p, V)
			}
			for j, want := range row {
				if d := math.Abs(float64(got[p*V+j]) - want); d > worst || math.IsNaN(d) {
					worst, at = d, fmt.Sprintf("position %d token %d: kvlm %g, PyTorch %g", p, j, got[p*V+j], want)
				}
			}
		}
		if !(worst <= zooLogitTol) {
			t.Errorf("%s logits differ from PyTorch's by %.3g > %g (%s)", mode, worst, zooLogitTol, at)
		}
		t.Logf("%s: %d positions, max |logit difference| %.3g", mode, len(ids), worst)
	}
}

// checkZooNLL: kvlm's mean NLL over the held-out windows equals the trainer's.
func checkZooNLL(t *testing.T, m *model.Model, rec zooRecord) {
	t.Helper()
	got, n, err := eval.HeldoutNLL(m, rec.Heldout.Windows, model.KVOptions{}) // what kvlm eval --suite zoo checks
	if err != nil {
		t.Fatal(err)
	}
	if d := math.Abs(got - rec.Heldout.MeanNLL); !(d <= zooNLLTol) {
		t.Errorf("held-out NLL: kvlm %.6f, trainer %.6f (difference %.3g > %g)", got, rec.Heldout.MeanNLL, d, zooNLLTol)
	}
	t.Logf("%s: held-out NLL kvlm %.6f, trainer %.6f over %d predictions", rec.Arch, got, rec.Heldout.MeanNLL, n)
}
