package main

import (
	"bytes"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/chat"
	"github.com/kvlm/kvlm/server"
	"github.com/kvlm/kvlm/tokenizer"
)

func chatRun(t *testing.T, input string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	root := newRoot(&o, &e)
	root.SetIn(strings.NewReader(input))
	root.SetArgs(append([]string{"chat"}, args...))
	err = root.Execute()
	return o.String(), e.String(), err
}

func TestChatTruncate(t *testing.T) {
	s := storiesFiles(t)
	in := "Once upon a time\nThe dog ran to the park\n/kv\nLily was sad\nTom had a red ball\n/reset\nHello\n/quit\n"
	out, errOut, err := chatRun(t, in, "-m", s.bin, "--tokenizer", s.tok, "-n", "40", "--context", "128", "--temp", "0")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "> ") < 6 || len(out) < 100 {
		t.Errorf("stdout %q", out)
	}
	// Turn 2 reuses turn 1 from the prefix cache; later turns drop old
	// turns to fit 128 tokens.
	cached := regexp.MustCompile(`prompt (\d+) tokens, (\d+) from the prefix cache`).FindAllStringSubmatch(errOut, -1)
	if len(cached) < 4 || atoi(cached[1][2]) == 0 {
		t.Errorf("prefix reuse: %v\n%s", cached, errOut)
	}
	for _, c := range cached {
		if atoi(c[1]) > 128 {
			t.Errorf("prompt of %s tokens over the 128-token context", c[1])
		}
	}
	if !regexp.MustCompile(`[1-9]\d* old turns dropped`).MatchString(errOut) {
		t.Errorf("no turn dropped:\n%s", errOut)
	}
	if !strings.Contains(errOut, "[conversation reset]") {
		t.Errorf("no reset:\n%s", errOut)
	}
}

func TestChatStream(t *testing.T) {
	s := storiesFiles(t)
	in := strings.Repeat("Once upon a time\nThe dog ran to the park\nLily was sad\n", 3)
	_, errOut, err := chatRun(t, in, "-m", s.bin, "--tokenizer", s.tok, "-n", "40", "--strategy", "stream", "--window", "48", "--sinks", "4")
	if err != nil {
		t.Fatal(err)
	}
	st := regexp.MustCompile(`\[kv: (\d+) tokens in the cache \(sinks 4 \+ window 48\) of (\d+) run over (\d+) turns`).FindAllStringSubmatch(errOut, -1)
	if len(st) != 9 {
		t.Fatalf("status lines: %v\n%s", st, errOut)
	}
	last := st[len(st)-1]
	if kept, run := atoi(last[1]), atoi(last[2]); kept > 52 || run < 300 {
		t.Errorf("after 9 turns: %d tokens kept of %d run", kept, run)
	}
	if _, _, err := chatRun(t, "", "-m", s.bin, "--tokenizer", s.tok, "--strategy", "sideways"); err == nil {
		t.Error("unknown strategy accepted")
	}
	if _, _, err := chatRun(t, "", "-m", s.bin, "--tokenizer", s.tok, "--strategy", "stream", "--window", "600"); err == nil {
		t.Error("window over the context accepted")
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// TestChatSeed: without --seed each chat draws a fresh seed, named in the
// first line; giving it back reproduces the conversation.
func TestChatSeed(t *testing.T) {
	s := storiesFiles(t)
	in := "Once upon a time\nThe dog ran\n"
	seedRe := regexp.MustCompile(`, seed (\d+)\. `)
	for _, strategy := range []string{"truncate", "stream"} {
		t.Run(strategy, func(t *testing.T) {
			args := []string{"-m", s.bin, "--tokenizer", s.tok, "-n", "30", "--strategy", strategy}
			outs, seeds := map[string]bool{}, map[string]bool{}
			var firstOut, firstSeed string
			for i := range 4 {
				out, errOut, err := chatRun(t, in, args...)
				if err != nil {
					t.Fatal(err)
				}
				m := seedRe.FindStringSubmatch(errOut)
				if m == nil {
					t.Fatalf("no seed in %q", errOut)
				}
				outs[out], seeds[m[1]] = true, true
				if i == 0 {
					firstOut, firstSeed = out, m[1]
				}
			}
			if len(seeds) != 4 || len(outs) < 2 {
				t.Fatalf("4 chats without --seed: %d distinct seeds, %d distinct conversations", len(seeds), len(outs))
			}
			again, errOut, err := chatRun(t, in, append(args, "--seed", firstSeed)...)
			if err != nil {
				t.Fatal(err)
			}
			if again != firstOut || !strings.Contains(errOut, ", seed "+firstSeed+".") {
				t.Fatalf("--seed %s did not reproduce the chat:\n%q\n%q", firstSeed, firstOut, again)
			}
		})
	}
}

// TestChatResetCounters: after /reset, /kv counts from zero.
func TestChatResetCounters(t *testing.T) {
	s := storiesFiles(t)
	in := "Once upon a time\nThe dog ran to the park\n/reset\n/kv\n"
	cases := []struct {
		strategy string
		args     []string
		want     *regexp.Regexp // the /kv line after the reset
	}{
		{"truncate", []string{"--context", "64"}, regexp.MustCompile(`^\[kv: prompt 0 tokens, 0 from the prefix cache, 0 generated; 0 B peak; .* 0 old turns dropped`)},
		{"stream", []string{"--window", "48"}, regexp.MustCompile(`^\[kv: 0 tokens in the cache \(sinks 4 \+ window 48\) of 0 run over 0 turns`)},
	}
	for _, c := range cases {
		t.Run(c.strategy, func(t *testing.T) {
			args := append([]string{"-m", s.bin, "--tokenizer", s.tok, "-n", "30", "--temp", "0", "--strategy", c.strategy}, c.args...)
			_, errOut, err := chatRun(t, in, args...)
			if err != nil {
				t.Fatal(err)
			}
			_, after, ok := strings.Cut(errOut, "[conversation reset]\n")
			if !ok {
				t.Fatalf("no reset in %q", errOut)
			}
			if line, _, _ := strings.Cut(after, "\n"); !c.want.MatchString(line) {
				t.Fatalf("/kv after /reset: %q, want %v", line, c.want)
			}
		})
	}
}

// TestChatFlags: chat's help speaks of chat, and flags it would ignore are
// refused.
func TestChatFlags(t *testing.T) {
	s := storiesFiles(t)
	var o, e bytes.Buffer
	root := newRoot(&o, &e)
	root.SetArgs([]string{"chat", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	help := o.String()
	for _, serveOnly := range []string{"--max-running", "--max-queue", "429", "request", "all sequences"} {
		if strings.Contains(help, serveOnly) {
			t.Errorf("chat --help mentions %q, which is kvlm serve's", serveOnly)
		}
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-running", "4"}, "unknown flag"},
		{[]string{"--strategy", "stream", "--context", "64"}, "--context applies to --strategy truncate only"},
		{[]string{"--strategy", "stream", "--kv-mem", "1MiB"}, "--kv-mem applies to --strategy truncate only"},
		{[]string{"--window", "64"}, "--window applies to --strategy stream only"},
		{[]string{"--sinks", "2"}, "--sinks applies to --strategy stream only"},
	} {
		_, _, err := chatRun(t, "", append([]string{"-m", s.bin, "--tokenizer", s.tok}, bad.args...)...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("chat %v: error %v, want %q", bad.args, err, bad.want)
		}
	}
}

// TestConvertedChatsLikeBin: a GGUF converted from stories260K chats with
// the template its llama2.c checkpoint gets (plain), token for token.
func TestConvertedChatsLikeBin(t *testing.T) {
	s := storiesFiles(t)
	type pick struct {
		name   string
		format server.ChatFormat
		tok    tokenizer.Tokenizer
	}
	var picks []pick
	for _, p := range []struct{ name, model, tok string }{{"bin", s.bin, s.tok}, {"gguf", s.gguf, ""}} {
		m, tok, err := loadModel(p.model, p.tok, false)
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
		f, _, err := server.ChooseFormat(p.model, tok, "")
		if err != nil {
			t.Fatal(err)
		}
		picks = append(picks, pick{p.name, f, tok})
	}
	convs := [][]chat.Message{
		{{Role: "user", Content: "Once upon a time"}},
		{{Role: "system", Content: "Tell a story."}, {Role: "user", Content: "The dog ran"}, {Role: "assistant", Content: "to the park."}, {Role: "user", Content: "Lily was sad"}},
	}
	bin, gg := picks[0], picks[1]
	if bin.format.Name() != server.PlainName || gg.format.Name() != bin.format.Name() {
		t.Fatalf("templates: bin %s, converted gguf %s; want both %s", bin.format.Name(), gg.format.Name(), server.PlainName)
	}
	for i, msgs := range convs {
		rb, err1 := bin.format.Render(msgs)
		rg, err2 := gg.format.Render(msgs)
		eb, err3 := bin.format.Encode(bin.tok, msgs)
		eg, err4 := gg.format.Encode(gg.tok, msgs)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			t.Fatal(err)
		}
		if rb != rg || !slices.Equal(eb, eg) {
			t.Errorf("conversation %d: bin renders %q %v, gguf %q %v", i, rb, eb, rg, eg)
		}
	}
	// And the chat itself.
	in := "Once upon a time\nThe dog ran\n"
	outBin, errBin, err := chatRun(t, in, "-m", s.bin, "--tokenizer", s.tok, "-n", "30", "--temp", "0")
	if err != nil {
		t.Fatal(err)
	}
	outGG, errGG, err := chatRun(t, in, "-m", s.gguf, "-n", "30", "--temp", "0")
	if err != nil {
		t.Fatal(err)
	}
	// The first line, less the rule that chose the template (the
	// checkpoint's, the GGUF's chat_template).
	first := func(s string) string {
		l, _, _ := strings.Cut(s, "\n")
		return regexp.MustCompile(` \(by [^)]*\)`).ReplaceAllString(l, "")
	}
	if outBin != outGG || first(errBin) != first(errGG) {
		t.Fatalf("bin:\n%s%s\ngguf:\n%s%s", first(errBin), outBin, first(errGG), outGG)
	}
}
