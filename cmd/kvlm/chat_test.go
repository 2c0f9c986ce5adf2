package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
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
