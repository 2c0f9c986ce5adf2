package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docTopP is the top-p sample of llama2.c's doc/stories260K.md: run.c with
// no prompt, -t 1.0 -p 0.9 -s 133742, 256 steps.
const docTopP = "Once upon a time, there was a little boy named Timmy. Timmy loved to play with his toys and eat sandwiches. One day, Timmy's mom told him it was time to rest for a while. Timmy's friend Billy came over and took him a down.\n" +
	"Timmy's mom saw that Timmy was sad, but Timmy said, \"I didn't understand what is it! We need to find some leafs.\" Timmy thought about it and took a deep breath on a spoon. He hoped it was important to be kind and continued to find its image next time.\n" +
	"After they finished getting, Timmy's dad came up to his house and promised to help Timmy.\n"

// TestGenerateFromBOS: -p "" starts from BOS alone, so the CLI reproduces
// run.c without a prompt: the greedy run of ../shared/models/README.md
// (566 bytes, sha256 a3213f9e…6cef) and the doc's seeded top-p sample.
func TestGenerateFromBOS(t *testing.T) {
	s := storiesFiles(t)
	cases := []struct {
		name  string
		args  []string
		check func(t *testing.T, out string)
	}{
		{"greedy", []string{"--temp", "0"}, func(t *testing.T, out string) {
			sum := sha256.Sum256([]byte(out))
			h := hex.EncodeToString(sum[:])
			if len(out) != 566 || !strings.HasPrefix(h, "a3213f9e") || !strings.HasSuffix(h, "6cef") {
				t.Fatalf("%d bytes, sha256 %s; run.c prints 566 bytes, sha256 a3213f9e…6cef:\n%s", len(out), h, out)
			}
		}},
		{"top-p", []string{"--temp", "1", "--top-p", "0.9", "--seed", "133742"}, func(t *testing.T, out string) {
			if out != docTopP {
				t.Fatalf("got:\n%s\nwant:\n%s", out, docTopP)
			}
		}},
	}
	for _, c := range cases {
		for _, m := range []struct{ name, model, tok string }{{"llama2c", s.bin, s.tok}, {"gguf", s.gguf, ""}} {
			t.Run(c.name+" "+m.name, func(t *testing.T) {
				args := []string{"generate", "-m", m.model, "-p", "", "-n", "256"}
				if m.tok != "" {
					args = append(args, "--tokenizer", m.tok)
				}
				out, errOut, code := kvlm(t, append(args, c.args...)...)
				if code != 0 {
					t.Fatalf("exit %d: %s", code, errOut)
				}
				c.check(t, out)
			})
		}
	}
}

// TestGenerateSeed: without --seed every run draws a fresh seed (printed
// in --json and on stderr); giving that seed back reproduces the run.
func TestGenerateSeed(t *testing.T) {
	s := storiesFiles(t)
	gen := func(t *testing.T, extra ...string) generateJSON {
		t.Helper()
		args := append([]string{"generate", "-m", s.gguf, "-p", "Once upon a time", "-n", "40", "--json"}, extra...)
		out, errOut, code := kvlm(t, args...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var r generateJSON
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		return r
	}
	t.Run("fresh seed each run", func(t *testing.T) {
		texts, seeds := map[string]bool{}, map[uint64]bool{}
		for range 4 {
			r := gen(t)
			texts[r.Text], seeds[r.Seed] = true, true
		}
		if len(seeds) != 4 || len(texts) < 2 {
			t.Fatalf("4 runs without --seed: %d distinct seeds, %d distinct texts", len(seeds), len(texts))
		}
	})
	t.Run("printed seed reproduces", func(t *testing.T) {
		first := gen(t)
		again := gen(t, "--seed", strconv.FormatUint(first.Seed, 10))
		if again.Text != first.Text || again.Seed != first.Seed {
			t.Fatalf("seed %d: %q, then with --seed %d: %q", first.Seed, first.Text, again.Seed, again.Text)
		}
	})
	t.Run("given seed", func(t *testing.T) {
		if r := gen(t, "--seed", "7"); r.Seed != 7 {
			t.Fatalf("--seed 7 reported as seed %d", r.Seed)
		}
	})
	t.Run("seed on stderr", func(t *testing.T) {
		_, errOut, code := kvlm(t, "generate", "-m", s.gguf, "-p", "Once", "-n", "4")
		if code != 0 || !regexp.MustCompile(`, seed [1-9][0-9]*\n$`).MatchString(errOut) {
			t.Fatalf("exit %d, stderr %q: want the seed at the end of the timings", code, errOut)
		}
		_, errOut, _ = kvlm(t, "generate", "-m", s.gguf, "-p", "Once", "-n", "4", "--temp", "0")
		if strings.Contains(errOut, "seed") {
			t.Fatalf("greedy run names a seed: %q", errOut)
		}
	})
}
