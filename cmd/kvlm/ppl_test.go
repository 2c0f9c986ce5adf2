package main

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/tokenizer"
)

// TestPPLStreamLength: --stream scores the whole file unless --ctx is
// given, and a --ctx past the file's end means all of it.
func TestPPLStreamLength(t *testing.T) {
	s := storiesFiles(t)
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	const nBytes = 1500
	data, err := os.ReadFile(text)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadLlama2C(s.tok, 0)
	if err != nil {
		t.Fatal(err)
	}
	all := len(tok.Encode(string(data[:nBytes]), true, false))
	if all <= 512 {
		t.Fatalf("the first %d bytes are %d tokens: the test needs more than 512", nBytes, all)
	}
	stream := []string{"--stream", "--kv-policy", "streaming", "--kv-window", "128", "--kv-sinks", "4"}
	cases := []struct {
		name       string
		args       []string
		wantTokens int
		wantErr    string
	}{
		{"stream, no --ctx", stream, all, ""},
		{"stream, --ctx past the end", append([]string{"--ctx", "100000"}, stream...), all, ""},
		{"stream, --ctx 300", append([]string{"--ctx", "300"}, stream...), 300, ""},
		{"stream full, no --ctx", []string{"--stream"}, all, ""},
		{"no stream, default --ctx", nil, 512, ""},
		{"no stream, --ctx past the end", []string{"--ctx", "1000"}, 0, "context length"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"ppl", "-m", s.gguf, "-f", text, "--bytes", strconv.Itoa(nBytes), "--json"}, c.args...)
			out, errOut, code := kvlm(t, args...)
			if c.wantErr != "" {
				if code != 1 || !strings.Contains(errOut, c.wantErr) {
					t.Fatalf("exit %d, stderr %q: want an error about %q", code, errOut, c.wantErr)
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var r pplJSON
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			if r.Tokens != c.wantTokens || r.Predictions != c.wantTokens-1 {
				t.Fatalf("%d tokens, %d predictions; want %d tokens of %d", r.Tokens, r.Predictions, c.wantTokens, all)
			}
		})
	}
}

// TestPPLShowsCodec: the text output names the KV codecs (and the key
// shift), as --json does.
func TestPPLShowsCodec(t *testing.T) {
	s := storiesFiles(t)
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	cases := []struct {
		args []string
		want string
		json string
	}{
		{nil, "kv f32/f32, peak", "f32/f32"},
		{[]string{"--kv-type", "q8"}, "kv q8/q8, key shift, peak", "q8/q8"},
		{[]string{"--kv-type", "q8", "--kv-key-shift=false"}, "kv q8/q8, peak", "q8/q8"},
		{[]string{"--kv-type-k", "f16", "--kv-type-v", "q4"}, "kv f16/q4, peak", "f16/q4"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			args := append([]string{"ppl", "-m", s.gguf, "-f", text, "--bytes", "4096", "--ctx", "64"}, c.args...)
			out, errOut, code := kvlm(t, args...)
			if code != 0 || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d %s: %q does not name %q", code, errOut, out, c.want)
			}
			out, _, _ = kvlm(t, append(args, "--json")...)
			var r pplJSON
			if err := json.Unmarshal([]byte(out), &r); err != nil || r.KVType != c.json {
				t.Fatalf("--json kv_type %q (%v), want %q", r.KVType, err, c.json)
			}
		})
	}
}
