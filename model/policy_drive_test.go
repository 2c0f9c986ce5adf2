package model_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// TestInstalledPolicyMatchesHandDriven: a policy installed on the sequence
// (SetPolicy, Prompt) and driven by the forward pass gives, bit for bit,
// the logits and kept positions of the same policy driven by hand
// (BeginPrefill, Forward, Compress; Before, Forward), with the prompt
// prefilled over several Forward calls and decode steps run by Forward and
// by DecodeBatch.
func TestInstalledPolicyMatchesHandDriven(t *testing.T) {
	const total = 200
	prompt := []int{30, 50, 40} // prefilled in three calls
	m, err := model.LoadLlama2C(shared.Path(t, "models/stories260K/stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r := rand.New(rand.NewPCG(3, 4))
	tokens := make([]int, total)
	for i := range tokens {
		tokens[i] = r.IntN(m.Vocab)
	}
	n := 0
	for _, k := range prompt {
		n += k
	}
	cases := []struct {
		name string
		cfg  policy.Config
	}{
		{"streaming", policy.Config{Method: "streaming", Sinks: 4, Window: 40}},
		{"h2o every 4", policy.Config{Method: "h2o", Budget: 64, Every: 4}},
		{"snapkv", policy.Config{Method: "snapkv", Ratio: 0.3}},
		{"lminfinite", policy.Config{Method: "lminfinite", Sinks: 4, Window: 48}},
		{"tova re-indexed", policy.Config{Method: "tova", Budget: 60, Positions: policy.PosReindex}},
		{"pyramidinfer", policy.Config{Method: "pyramidinfer"}},
		{"minicache", policy.Config{Method: "minicache"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// batch: decode steps through DecodeBatch (else Forward).
			run := func(installed, batch bool) ([][]float32, [][][]int32) {
				seq, err := m.NewStandaloneSequence(model.KVOptions{BlockTokens: 16})
				if err != nil {
					t.Fatal(err)
				}
				defer seq.Close()
				st, err := policy.New(c.cfg, seq)
				if err != nil {
					t.Fatal(err)
				}
				if installed {
					seq.SetPolicy(st)
					seq.Prompt(n)
				} else {
					st.BeginPrefill(n)
				}
				var out [][]float32
				at := 0
				for _, k := range prompt {
					logits, err := seq.Forward(tokens[at:at+k], false)
					if err != nil {
						t.Fatal(err)
					}
					at += k
					out = append(out, slices.Clone(logits))
				}
				if !installed {
					if err := st.Compress(); err != nil {
						t.Fatal(err)
					}
				}
				kept := st.Kept()
				for _, id := range tokens[n:] {
					if !installed {
						if err := st.Before(1); err != nil {
							t.Fatal(err)
						}
					}
					var logits []float32
					if batch {
						var l [][]float32
						l, err = m.DecodeBatch([]*model.Sequence{seq}, []int{id})
						if err == nil {
							logits = l[0]
						}
					} else {
						logits, err = seq.Forward([]int{id}, false)
					}
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, slices.Clone(logits))
				}
				return out, append(kept, st.Kept()...)
			}
			for _, batch := range []bool{false, true} {
				want, wantKept := run(false, batch)
				got, gotKept := run(true, batch)
				for i := range want {
					if !slices.Equal(got[i], want[i]) {
						t.Fatalf("batch %v: step %d: logits differ", batch, i)
					}
				}
				for i := range wantKept {
					for h := range wantKept[i] {
						if !slices.Equal(gotKept[i][h], wantKept[i][h]) {
							t.Fatalf("batch %v: kept positions of table %d/%d differ", batch, i, h)
						}
					}
				}
			}
		})
	}
}
