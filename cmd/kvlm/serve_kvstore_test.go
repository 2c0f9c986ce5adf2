package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvlm/kvlm/internal/redistest"
	"github.com/kvlm/kvlm/internal/shared"
)

// TestServeKVStoreFlags: --kv-store-* without --kv-store, bad URLs and
// bad values are refused with one line saying what is wrong.
func TestServeKVStoreFlags(t *testing.T) {
	s := storiesFiles(t)
	base := []string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--addr", "127.0.0.1:0"}
	ca := t.TempDir() + "/ca.pem"
	os.WriteFile(ca, []byte("junk"), 0o644)
	for _, c := range []struct {
		name string
		args []string
		env  string
		msg  string
	}{
		{"password alone", []string{"--kv-store-password", "x"}, "", "--kv-store-password needs --kv-store"},
		{"CA alone", []string{"--kv-store-tls-ca", ca}, "", "--kv-store-tls-ca needs --kv-store"},
		{"server name alone", []string{"--kv-store-tls-server-name", "x"}, "", "--kv-store-tls-server-name needs --kv-store"},
		{"timeout alone", []string{"--kv-store-timeout", "1s"}, "", "--kv-store-timeout needs --kv-store"},
		{"queue alone", []string{"--kv-store-queue", "1MiB"}, "", "--kv-store-queue needs --kv-store"},
		{"http URL", []string{"--kv-store", "http://127.0.0.1:6379"}, "", "must be redis://host:port or rediss://"},
		{"no port", []string{"--kv-store", "redis://127.0.0.1"}, "", "must name a host and a port"},
		{"bad db", []string{"--kv-store", "redis://127.0.0.1:6379/zero"}, "", "bad URL"},
		{"zero timeout", []string{"--kv-store", "redis://127.0.0.1:6379", "--kv-store-timeout", "0s"}, "", "--kv-store-timeout must be positive"},
		{"bad queue", []string{"--kv-store", "redis://127.0.0.1:6379", "--kv-store-queue", "lots"}, "", "--kv-store-queue"},
		{"fetch bound alone", []string{"--kv-store-fetch-mem", "1MiB"}, "", "--kv-store-fetch-mem needs --kv-store"},
		{"bad fetch bound", []string{"--kv-store", "redis://127.0.0.1:6379", "--kv-store-fetch-mem", "0"}, "", "--kv-store-fetch-mem"},
		{"CA without TLS", []string{"--kv-store", "redis://127.0.0.1:6379", "--kv-store-tls-ca", ca}, "", "needs a rediss:// URL"},
		{"CA not PEM", []string{"--kv-store", "rediss://127.0.0.1:6379", "--kv-store-tls-ca", ca}, "", "holds no PEM certificate"},
		{"two passwords", []string{"--kv-store", "redis://:a@127.0.0.1:6379", "--kv-store-password", "b"}, "", "password is given both"},
		{"URL and env passwords", []string{"--kv-store", "redis://:a@127.0.0.1:6379"}, "b", "password is given both"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("KVLM_KV_STORE_PASSWORD", c.env)
			_, errOut, code := kvlm(t, append(base, c.args...)...)
			if code == 0 || !strings.Contains(errOut, c.msg) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Fatalf("code %d, %q; want one line saying %q", code, errOut, c.msg)
			}
		})
	}
}

// serveStore runs kvlm serve with args until the test ends and returns
// its URL.
func serveStore(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut syncBuffer
	root := newRoot(&out, &errOut)
	root.SetArgs(append([]string{"serve", "--addr", "127.0.0.1:0"}, args...))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop")
		}
	})
	re := regexp.MustCompile(`listening on (http://\S+)`)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m := re.FindStringSubmatch(errOut.String()); m != nil {
			if !strings.Contains(errOut.String(), "KV store connected") {
				t.Fatalf("no connection to the store: %s", errOut.String())
			}
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address in %q", errOut.String())
		}
	}
}

type storeCompletion struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage struct {
		KV struct {
			CachedTokens   int `json:"cached_tokens"`
			StoreTokens    int `json:"store_tokens"`
			ComputedTokens int `json:"computed_tokens"`
		} `json:"kv"`
	} `json:"usage"`
}

func complete(t *testing.T, url, prompt string) storeCompletion {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 16, "temperature": 0})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var c storeCompletion
	if err := json.Unmarshal(raw, &c); err != nil || resp.StatusCode != 200 || len(c.Choices) != 1 {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	return c
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return string(raw)
}

// TestServeKVStore: two kvlm serve replicas (store timeouts of seconds:
// a loaded 2-core machine exceeds the default 50ms on loopback) share a
// password-protected
// redis-server (one given the password by flag, the other by
// $KVLM_KV_STORE_PASSWORD): the second answers the first's long prompt
// from the blocks the first wrote, with the same text; usage.kv and
// /metrics count it.
func TestServeKVStore(t *testing.T) {
	s := storiesFiles(t)
	srv := redistest.Start(t, "--requirepass", "pw")
	text, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	prompt := string(text[:700])
	t.Setenv("KVLM_KV_STORE_PASSWORD", "")
	one := serveStore(t, "-m", s.bin, "--tokenizer", s.tok, "--kv-store", srv.URL(), "--kv-store-password", "pw", "--kv-store-timeout", "10s")
	t.Setenv("KVLM_KV_STORE_PASSWORD", "pw")
	two := serveStore(t, "-m", s.bin, "--tokenizer", s.tok, "--kv-store", srv.URL(), "--kv-store-timeout", "5s", "--kv-store-queue", "8MiB")
	a := complete(t, one, prompt)
	if a.Usage.KV.StoreTokens != 0 || a.Usage.KV.ComputedTokens < 200 {
		t.Fatalf("replica one: %+v", a.Usage.KV)
	}
	m1 := regexp.MustCompile(`(?m)^kvlm_kv_store_written_blocks_total (\d+)$`)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if m := m1.FindStringSubmatch(scrape(t, one)); m != nil && m[1] != "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica one wrote nothing: %s", scrape(t, one))
		}
	}
	time.Sleep(100 * time.Millisecond) // the last pipeline
	b := complete(t, two, prompt)
	if b.Usage.KV.StoreTokens < 200 || b.Usage.KV.CachedTokens != 0 || b.Usage.KV.ComputedTokens > 16 {
		t.Fatalf("replica two: %+v; want the prompt from the store", b.Usage.KV)
	}
	if b.Choices[0].Text != a.Choices[0].Text {
		t.Fatalf("replica two: %q, replica one %q", b.Choices[0].Text, a.Choices[0].Text)
	}
	met := scrape(t, two)
	for _, want := range []string{
		"kvlm_kv_store_hit_blocks_total " + strconv.Itoa(b.Usage.KV.StoreTokens/16),
		"kvlm_kv_store_miss_blocks_total 0",
		`kvlm_kv_store_errors_total{op="get"} 0`,
		`kvlm_kv_store_errors_total{op="set"} 0`,
		"kvlm_kv_store_corrupt_total 0",
		"kvlm_kv_store_dropped_writes_total 0",
		"kvlm_kv_store_loaded_bytes_total ",
		"kvlm_kv_store_written_bytes_total ",
	} {
		if !strings.Contains(met, want) {
			t.Errorf("replica two's /metrics lacks %q", want)
		}
	}
}
