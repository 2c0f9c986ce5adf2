package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tokenizer"
)

// recallModelDir is the recall model's folder: $KVLM_RECALL, or the
// committed train/recall (train/recall.sh).
func recallModelDir() string {
	if d := os.Getenv("KVLM_RECALL"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "train", "recall")
}

// recallRecord is record.json's recall part: a held-out recall prompt (the
// suite's niah_multikey sample of seed 0), PyTorch's logits at its last
// Tail positions and its greedy answer.
type recallRecord struct {
	Recall struct {
		Prompt struct {
			Task    string      `json:"task"`
			Context int         `json:"context"`
			Seed    uint64      `json:"seed"`
			IDs     []int       `json:"ids"`
			Answer  []int       `json:"answer"`
			Tail    int         `json:"tail"`
			Logits  [][]float64 `json:"logits_tail"` // [Tail][vocab]
			Greedy  []int       `json:"greedy"`
		} `json:"prompt"`
	} `json:"recall"`
}

// TestRecallModel checks the recall model as TestZoo checks the zoo (the
// vocabulary, the data split, the recipe metadata, logits within 1e-4 on
// the fixed prompt, held-out NLL within 1e-3), and on a held-out recall
// prompt: the prompt is the suite's own sample, kvlm's logits at its last
// positions equal PyTorch's within 1e-4, and kvlm's greedy answer is
// PyTorch's. The GGUF's recall metadata names training seeds ≥ 2^32 and the
// train haystack.
func TestRecallModel(t *testing.T) {
	dirs := []string{recallModelDir()}
	if os.Getenv("KVLM_RECALL") == "" {
		// docs/ZOO.md, "Phase 4" to "Phase 10"
		for _, p := range []string{"phase4", "phase5", "phase6", "phase7", "phase9", "phase10"} {
			dirs = append(dirs, filepath.Join(dirs[0], p))
		}
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) { checkRecallModel(t, dir) })
	}
}

// checkRecallModel is TestRecallModel on the model in dir.
func checkRecallModel(t *testing.T, dir string) {
	path := filepath.Join(dir, "model.gguf")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the recall model: %v", err)
	}
	checkZooSize(t, []string{path})
	tok512, err := tokenizer.LoadLlama2C(shared.Path(t, "models/stories260K/tok512.bin"), 512)
	if err != nil {
		t.Fatal(err)
	}
	recPath := filepath.Join(dir, "record.json")
	rec := readZooRecord(t, recPath)
	m, tok := loadZooModel(t, path)
	defer m.Close()
	checkZooVocab(t, tok, tok512)
	checkZooData(t, rec, tok512)
	checkZooRecipe(t, path, rec)
	checkZooLogits(t, m, rec)
	checkZooNLL(t, m, rec)

	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	mix, err := f.String("kvlm.train.recall")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Seed     uint64  `json:"recall_seed"`
		Haystack string  `json:"recall_haystack"`
		Share    float64 `json:"recall"`
	}
	if err := json.Unmarshal([]byte(mix), &meta); err != nil {
		t.Fatalf("kvlm.train.recall: %v", err)
	}
	if meta.Seed < eval.TrainSeedStart || meta.Haystack != eval.HaystackTrain || !(meta.Share > 0) {
		t.Fatalf("kvlm.train.recall %s: want seeds ≥ %d, haystack %q", mix, eval.TrainSeedStart, eval.HaystackTrain)
	}

	b, err := os.ReadFile(recPath)
	if err != nil {
		t.Fatal(err)
	}
	var rr recallRecord
	if err := json.Unmarshal(b, &rr); err != nil {
		t.Fatal(err)
	}
	p := rr.Recall.Prompt
	if len(p.IDs) == 0 || p.Tail != len(p.Logits) || p.Tail > len(p.IDs) || len(p.Greedy) != len(p.Answer) {
		t.Fatalf("incomplete recall prompt: %d ids, tail %d, %d logit rows, greedy %d of %d", len(p.IDs), p.Tail, len(p.Logits), len(p.Greedy), len(p.Answer))
	}
	v, err := eval.NewRecallVocab(tok, filepath.Dir(shared.Path(t, "data/"+eval.HeldOutFile)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := v.Sample(eval.DefaultRecallSpec(), p.Task, p.Context, -1, p.Seed)
	if err != nil {
		t.Fatal(err)
	}
	if p.Seed >= eval.EvalSeedEnd || !slices.Equal(s.Prompt, p.IDs) || !slices.Equal(s.Answer, p.Answer) {
		t.Fatalf("the recorded recall prompt is not the suite's %s sample of seed %d", p.Task, p.Seed)
	}

	seq, err := m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	logits, err := seq.Forward(p.IDs, true)
	if err != nil {
		t.Fatal(err)
	}
	V, n := m.Vocab, len(p.IDs)
	worst := 0.0
	for r, row := range p.Logits {
		pos := n - p.Tail + r
		for j, want := range row {
			if d := math.Abs(float64(logits[pos*V+j]) - want); d > worst || math.IsNaN(d) {
				worst = d
			}
		}
	}
	if !(worst <= zooLogitTol) {
		t.Errorf("recall prompt: logits at the last %d positions differ from PyTorch's by %.3g > %g", p.Tail, worst, zooLogitTol)
	}
	last := logits[(n-1)*V : n*V]
	var got []int
	for range p.Answer {
		next := argmaxF(last)
		got = append(got, next)
		if last, err = seq.Forward([]int{next}, false); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, p.Greedy) {
		t.Errorf("greedy answer: kvlm %v (%q), PyTorch %v (%q)", got, tok.DecodeAll(got), p.Greedy, tok.DecodeAll(p.Greedy))
	}
	t.Logf("recall prompt (%s seed %d, %d tokens): max |logit difference| %.3g; greedy %q, answer %q", p.Task, p.Seed, n, worst,
		strings.TrimSpace(tok.DecodeAll(got)), strings.TrimSpace(tok.DecodeAll(p.Answer)))
}
