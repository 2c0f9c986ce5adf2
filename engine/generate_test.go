package engine

import (
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/sample"
)

// The two samples of llama2.c's doc/stories260K.md, produced by run.c with
// no prompt (just BOS) and the default 256 steps. run.c stops early when it
// samples BOS (id 1).
const (
	docGreedy = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n" +
		"Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, \"I want to play with your ball, but I can't find it.\"\n" +
		"Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\n" +
		"Lily didn't want to help her mom, so she said, \"I'm sorry, mom. I didn't know what to do.\" Her mom said, \"Don't worry, Lily. We can help you."
	docTopP = "Once upon a time, there was a little boy named Timmy. Timmy loved to play with his toys and eat sandwiches. One day, Timmy's mom told him it was time to rest for a while. Timmy's friend Billy came over and took him a down.\n" +
		"Timmy's mom saw that Timmy was sad, but Timmy said, \"I didn't understand what is it! We need to find some leafs.\" Timmy thought about it and took a deep breath on a spoon. He hoped it was important to be kind and continued to find its image next time.\n" +
		"After they finished getting, Timmy's dad came up to his house and promised to help Timmy."
)

func TestRunCDocSamples(t *testing.T) {
	m, tok, err := Load(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/stories260K/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cases := []struct {
		name   string
		params sample.Params
		want   string
	}{
		{"greedy", sample.Params{}, docGreedy},
		{"top-p", sample.Params{Temperature: 1, TopP: 0.9, Seed: 133742}, docTopP},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := sample.New(c.params)
			if err != nil {
				t.Fatal(err)
			}
			seq, err := m.NewStandaloneSequence(model.KVOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// run.c: 256 steps from BOS = 256 sampled tokens; it stops on BOS.
			res, err := Generate(seq, Request{Prompt: []int{tok.BOS()}, MaxTokens: 256, EOS: tok.BOS(), Sampler: s})
			if err != nil {
				t.Fatal(err)
			}
			got := tok.DecodeAll(append([]int{tok.BOS()}, res.Tokens...))
			if got != c.want {
				t.Fatalf("stop %s after %d tokens\ngot:\n%s\nwant:\n%s", res.Stop, len(res.Tokens), got, c.want)
			}
		})
	}
}

func TestGenerateStops(t *testing.T) {
	m, tok, err := Load(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/stories260K/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompt := tok.Encode("Once upon a time", true, false)
	seq, _ := m.NewStandaloneSequence(model.KVOptions{})
	res, err := Generate(seq, Request{Prompt: prompt, MaxTokens: 1000, EOS: -1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stop != StopContext || seq.Pos() != m.CtxLen || len(res.Tokens) != m.CtxLen-len(prompt)+1 {
		t.Fatalf("stop %s at pos %d with %d tokens; want context stop at %d", res.Stop, seq.Pos(), len(res.Tokens), m.CtxLen)
	}
	for _, bad := range []Request{{Prompt: nil, MaxTokens: 1}, {Prompt: prompt, MaxTokens: 0}, {Prompt: make([]int, m.CtxLen+1), MaxTokens: 1}} {
		seq, _ := m.NewStandaloneSequence(model.KVOptions{})
		if _, err := Generate(seq, bad); err == nil {
			t.Errorf("request with %d prompt tokens and max %d accepted", len(bad.Prompt), bad.MaxTokens)
		}
	}
	if _, _, err := Load(shared.Path(t, "models/stories260K/stories260K.bin"), ""); err == nil {
		t.Error("llama2.c checkpoint without a tokenizer accepted")
	}
	if _, _, err := Load(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/llama2-tokenizer/tokenizer.bin")); err == nil {
		t.Error("a 32000-token tokenizer for a 512-token model accepted")
	}
}
