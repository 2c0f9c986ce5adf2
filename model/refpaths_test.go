package model

import "testing"

// refPaths says which ways of running a prompt checkForwardPaths compares
// with a reference; prefill in chunks of 128, 17 and 5 and DecodeBatch
// always run.
type refPaths struct {
	tokenByToken  bool // every token a forward step of its own
	prefillDecode bool // 30 tokens prefilled, the rest decoded one by one
	decodeChunk   int  // the prefill chunk before that decode (0: the default)
	fork          bool // decode a fork of a sequence prefilled to 40 tokens
}

// checkForwardPaths runs m over prompts[0] (and, for DecodeBatch, all
// three prompts, prefilled to 1, 20 and 45 tokens then decoded together,
// each leaving the batch at its end) along the ways paths names, and
// compares every step's logits with refs[i][pos] within 1e-4. Sequences
// take their caches from KVOptions{K: opt.K, V: opt.V, BlockTokens: 16}.
func checkForwardPaths(t *testing.T, m *Model, opt KVOptions, prompts [][]int, refs [][][]float64, paths refPaths) {
	t.Helper()
	prompt, ref := prompts[0], refs[0]
	T, V := len(prompt), m.Vocab
	newSeq := func(t *testing.T) *Sequence {
		seq, err := m.NewStandaloneSequence(KVOptions{K: opt.K, V: opt.V, BlockTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(seq.Close)
		return seq
	}
	for _, chunk := range []int{128, 17, 5} {
		t.Run("prefill chunk "+itoa(chunk), func(t *testing.T) {
			seq := newSeq(t)
			seq.Chunk = chunk
			logits, err := seq.Forward(prompt, true)
			if err != nil {
				t.Fatal(err)
			}
			for p := range prompt {
				compareLogits(t, "pos "+itoa(p), logits[p*V:(p+1)*V], ref[p], 1e-4)
			}
		})
	}
	if paths.tokenByToken {
		t.Run("token by token", func(t *testing.T) {
			seq := newSeq(t)
			for p := range prompt {
				logits, err := seq.Forward(prompt[p:p+1], false)
				if err != nil {
					t.Fatal(err)
				}
				compareLogits(t, "pos "+itoa(p), logits, ref[p], 1e-4)
			}
		})
	}
	if paths.prefillDecode {
		t.Run("prefill then decode", func(t *testing.T) {
			seq := newSeq(t)
			if paths.decodeChunk > 0 {
				seq.Chunk = paths.decodeChunk
			}
			const pre = 30
			logits, err := seq.Forward(prompt[:pre], false)
			if err != nil {
				t.Fatal(err)
			}
			compareLogits(t, "prefill", logits, ref[pre-1], 1e-4)
			for p := pre; p < T; p++ {
				logits, err := seq.Forward(prompt[p:p+1], false)
				if err != nil {
					t.Fatal(err)
				}
				compareLogits(t, "decode pos "+itoa(p), logits, ref[p], 1e-4)
			}
		})
	}
	t.Run("decode batch", func(t *testing.T) {
		seqs := make([]*Sequence, 3)
		for i, pre := range []int{1, 20, 45} {
			seqs[i] = newSeq(t)
			if _, err := seqs[i].Forward(prompts[i][:pre], false); err != nil {
				t.Fatal(err)
			}
		}
		for {
			var batch []*Sequence
			var toks, who, pos []int
			for i, s := range seqs {
				if s.Pos() < T {
					batch, toks, who, pos = append(batch, s), append(toks, prompts[i][s.Pos()]), append(who, i), append(pos, s.Pos())
				}
			}
			if len(batch) == 0 {
				break
			}
			out, err := m.DecodeBatch(batch, toks)
			if err != nil {
				t.Fatal(err)
			}
			for j, i := range who {
				compareLogits(t, "sequence "+itoa(i)+" pos "+itoa(pos[j]), out[j], refs[i][pos[j]], 1e-4)
			}
		}
	})
	if paths.fork {
		t.Run("fork", func(t *testing.T) {
			seq := newSeq(t)
			if _, err := seq.Forward(prompt[:40], false); err != nil {
				t.Fatal(err)
			}
			f, err := seq.Fork()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for p := 40; p < T; p++ {
				logits, err := f.Forward(prompt[p:p+1], false)
				if err != nil {
					t.Fatal(err)
				}
				compareLogits(t, "fork pos "+itoa(p), logits, ref[p], 1e-4)
			}
		})
	}
}
