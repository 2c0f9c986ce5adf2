package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/tokenizer"
)

// TestServeStreamingMatchesPPLStream: a 3,000-token prompt through
// /v1/chat/completions with kv {policy: "streaming"} (no window: the
// method's default, sinks 4 + window 508) on stories260K succeeds, and its
// answer is `kvlm ppl --stream --greedy`'s greedy path after the same
// tokens (the plain template renders the message's content and a newline,
// which ppl reads from a file).
func TestServeStreamingMatchesPPLStream(t *testing.T) {
	s := storiesFiles(t)
	raw, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadLlama2C(s.tok, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The content: whole lines, about 3,000 tokens with the newline.
	lines := strings.SplitAfter(string(raw), "\n")
	content := ""
	for _, l := range lines {
		if len(tok.Encode(content+"\n", true, false)) >= 3000 {
			break
		}
		content += l
	}
	content = strings.TrimRight(content, "\n")
	prompt := tok.Encode(content+"\n", true, false)
	if len(prompt) < 3000 {
		t.Fatalf("%d prompt tokens, want 3000 or more", len(prompt))
	}
	const gen = 24
	file := filepath.Join(t.TempDir(), "prompt.txt")
	if err := os.WriteFile(file, []byte(content+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := kvlm(t, "ppl", "-m", s.bin, "--tokenizer", s.tok, "-f", file, "--stream", "--kv-policy", "streaming",
		"--greedy", "24", "--json")
	if code != 0 {
		t.Fatalf("ppl: %s", errOut)
	}
	var p struct {
		Tokens int    `json:"tokens"`
		Policy string `json:"policy"`
		Argmax []int  `json:"argmax"`
		Greedy []int  `json:"greedy"`
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatal(err)
	}
	if p.Tokens != len(prompt) || len(p.Argmax) != len(prompt)-1 || len(p.Greedy) != gen {
		t.Fatalf("ppl: %d tokens, %d argmax, %d greedy; want %d, %d, %d", p.Tokens, len(p.Argmax), len(p.Greedy), len(prompt), len(prompt)-1, gen)
	}
	if !strings.Contains(p.Policy, "budget=512 sinks=4 window=508") {
		t.Errorf("ppl policy %q, want streaming's default budget 512, sinks 4, window 508", p.Policy)
	}

	var sout, serr syncBuffer
	root := newRoot(&sout, &serr)
	root.SetArgs([]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--addr", "127.0.0.1:0", "--kv-mem", "8MiB"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve returned %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop")
		}
	}()
	re := regexp.MustCompile(`listening on (http://\S+)`)
	var url string
	for deadline := time.Now().Add(30 * time.Second); url == ""; {
		if m := re.FindStringSubmatch(serr.String()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no address in %q", serr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	req, _ := json.Marshal(map[string]any{"messages": []map[string]any{{"role": "user", "content": content}},
		"max_tokens": gen, "temperature": 0, "kv": map[string]any{"policy": "streaming"}})
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var r struct {
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &r); err != nil || resp.StatusCode != 200 || len(r.Choices) != 1 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if r.Usage.PromptTokens != len(prompt) {
		t.Fatalf("prompt_tokens %d, want %d (ppl's tokens of the same text)", r.Usage.PromptTokens, len(prompt))
	}
	// The CLI's greedy path as text, up to the end of text token.
	want, prev := "", prompt[len(prompt)-1]
	n := 0
	for _, id := range p.Greedy {
		if id == 2 { // EOS
			break
		}
		want, prev = want+tok.Decode(prev, id), id
		n++
	}
	got := r.Choices[0].Message.Content
	if got == "" || (r.Choices[0].FinishReason == "length" && got != want) || !strings.HasPrefix(want, got) {
		t.Errorf("server answer %q (%s)\nwant %q (kvlm ppl --stream --greedy)", got, r.Choices[0].FinishReason, want)
	}
	t.Logf("%d prompt tokens, answer %q (%s), %d of the CLI's %d greedy tokens", len(prompt), got, r.Choices[0].FinishReason, n, gen)
}

// TestPPLStreamGreedyRefused: --greedy continues a streamed run only.
func TestPPLStreamGreedyRefused(t *testing.T) {
	s := storiesFiles(t)
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--greedy", "4"}, "give --stream"},
		{[]string{"--stream", "--greedy", "-1"}, "0 or more"},
	} {
		_, errOut, code := kvlm(t, append([]string{"ppl", "-m", s.bin, "--tokenizer", s.tok, "-f", text, "--ctx", "64"}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: code %d, %q; want an error with %q", c.args, code, errOut, c.want)
		}
	}
}
