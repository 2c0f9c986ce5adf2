package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvlm/kvlm/internal/shared"
)

// TestModelByName: a model that kvlm list shows is usable by that name in
// every command that takes a model, and an unknown name is an error that
// says how to find models.
func TestModelByName(t *testing.T) {
	s := storiesFiles(t)
	text := shared.Path(t, "data/tinystories_valid_head.txt")
	dir := t.TempDir()
	t.Setenv("KVLM_MODELS", dir)
	dest := filepath.Join(dir, "hf", "acme", "stories-GGUF", "main", "stories260K.gguf")
	os.MkdirAll(filepath.Dir(dest), 0o755)
	data, err := os.ReadFile(s.gguf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dest, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// The name as kvlm list prints it.
	out, errOut, code := kvlm(t, "list")
	if code != 0 {
		t.Fatalf("list: %d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("list:\n%s", out)
	}
	listed := strings.Fields(lines[1])[0]
	if listed != "hf/acme/stories-GGUF/main/stories260K.gguf" {
		t.Fatalf("list shows %q", listed)
	}
	evalOut := t.TempDir()

	cases := []struct {
		name string
		run  func(t *testing.T, model string) (stdout, stderr string, err error)
		want string // in stdout on success
	}{
		{"generate", cli("generate", "-m", "{}", "-p", "Once upon a time", "-n", "4", "--temp", "0"), "Once upon a time"},
		{"ppl", cli("ppl", "-m", "{}", "-f", text, "--ctx", "32"), "perplexity"},
		{"bench", cli("bench", "-m", "{}", "--prompt", "8", "--gen", "4", "--reps", "1", "--contexts", "16", "--batch", "1"), "decode"},
		{"inspect", cli("inspect", "{}"), "llama"},
		{"tokenize", cli("tokenize", "-m", "{}", "Once upon a time"), " "},
		{"kvcalc", cli("kvcalc", "-m", "{}"), "KV"},
		{"eval", cli("eval", "-m", "{}", "--out", evalOut, "--text", text, "--quick", "--contexts", "1", "--stream-tokens", "64", "--dense-tokens", "64", "--jobs", "1"), "wrote"},
		{"chat", func(t *testing.T, model string) (string, string, error) {
			return chatRun(t, "Once upon a time\n/quit\n", "-m", model, "-n", "4", "--temp", "0")
		}, "> "},
		{"serve", serveHealth, "listening on"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, err := c.run(t, listed)
			if err != nil {
				t.Fatalf("-m %s: %v\n%s", listed, err, errOut)
			}
			if !strings.Contains(out+errOut, c.want) {
				t.Errorf("-m %s: output lacks %q:\n%s\n%s", listed, c.want, out, errOut)
			}
			_, errOut, err = c.run(t, "acme/no-such-model.gguf")
			if err == nil || !strings.Contains(errOut+err.Error(), "kvlm list") || !strings.Contains(errOut+err.Error(), "kvlm pull") {
				t.Errorf("unknown name: %v %q, want an error pointing at kvlm list and kvlm pull", err, errOut)
			}
		})
	}
}

// cli runs kvlm with args, "{}" replaced by the model.
func cli(args ...string) func(t *testing.T, model string) (string, string, error) {
	return func(t *testing.T, model string) (string, string, error) {
		a := make([]string, len(args))
		for i, s := range args {
			if s == "{}" {
				s = model
			}
			a[i] = s
		}
		out, errOut, code := kvlm(t, a...)
		if code != 0 {
			return out, errOut, &exitError{code, errOut}
		}
		return out, errOut, nil
	}
}

type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return strings.TrimSpace(e.msg) }

// serveHealth starts kvlm serve, waits until it listens and stops it.
func serveHealth(t *testing.T, model string) (string, string, error) {
	var out, errOut syncBuffer
	root := newRoot(&out, &errOut)
	root.SetArgs([]string{"serve", "-m", model, "--addr", "127.0.0.1:0", "--kv-mem", "4MiB"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	re := regexp.MustCompile(`listening on \S+`)
	for deadline := time.Now().Add(30 * time.Second); !re.MatchString(errOut.String()); {
		select {
		case err := <-done:
			return out.String(), errOut.String(), err
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve does not listen: %q", errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
	return out.String(), errOut.String(), nil
}
