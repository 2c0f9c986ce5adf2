package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestServe(t *testing.T) {
	s := storiesFiles(t)
	var out, errOut syncBuffer
	root := newRoot(&out, &errOut)
	root.SetArgs([]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--addr", "127.0.0.1:0", "--kv-mem", "4MiB", "--max-running", "4"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	re := regexp.MustCompile(`listening on (http://\S+)`)
	var url string
	for deadline := time.Now().Add(30 * time.Second); url == ""; {
		if m := re.FindStringSubmatch(errOut.String()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no address in %q", errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":60,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(raw, &body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	// The golden run.c text, after the prompt.
	if want := strings.TrimPrefix(strings.TrimSuffix(golden60, "\n"), "Once upon a time"); body.Choices[0].Text != want {
		t.Errorf("text %q\nwant %q", body.Choices[0].Text, want)
	}
	if !strings.Contains(errOut.String(), "chat template plain") {
		t.Errorf("banner: %s", errOut.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func TestServeFlags(t *testing.T) {
	s := storiesFiles(t)
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"serve"}, "no model"},
		{[]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--kv-mem", "lots"}, "--kv-mem"},
		{[]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--max-running", "0"}, "--max-running"},
		{[]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--slot-dir", "/nonexistent/dir"}, "--slot-dir"},
		{[]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--kv-type", "q3"}, "unknown codec"},
		{[]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--chat-template", "klingon"}, "unknown template"},
		{[]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--addr", "256.0.0.1:1"}, "256.0.0.1"},
	} {
		_, errOut, code := kvlm(t, c.args...)
		if code == 0 || !strings.Contains(errOut, c.msg) {
			t.Errorf("%v: code %d, %q", c.args, code, errOut)
		}
	}
}
