package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// hubServer mimics the Hugging Face hub: /OWNER/REPO/resolve/main/FILE
// redirects to /cdn/FILE with X-Linked-Size and X-Linked-Etag; the CDN
// honours Range requests and can drop the connection part-way once.
type hubServer struct {
	mu     sync.Mutex
	files  map[string][]byte
	cut    int
	badSHA bool
	ranges []string
}

func (h *hubServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if key, ok := strings.CutPrefix(r.URL.Path, "/cdn/"); ok {
		data := h.files[key]
		if r.Method == http.MethodGet {
			h.ranges = append(h.ranges, r.Header.Get("Range"))
			if h.cut > 0 {
				w.Header().Set("Content-Length", fmt.Sprint(len(data)))
				w.Write(data[:h.cut])
				h.cut = 0
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
		return
	}
	p := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 5)
	if len(p) != 5 || p[2] != "resolve" {
		http.NotFound(w, r)
		return
	}
	key := p[0] + "/" + p[1] + "/" + p[4]
	data, ok := h.files[key]
	if !ok {
		http.Error(w, "Entry not found", http.StatusNotFound)
		return
	}
	sum := sha256.Sum256(data)
	etag := hex.EncodeToString(sum[:])
	if h.badSHA {
		etag = strings.Repeat("0", 64)
	}
	w.Header().Set("X-Linked-Size", fmt.Sprint(len(data)))
	w.Header().Set("X-Linked-Etag", `"`+etag+`"`)
	http.Redirect(w, r, "/cdn/"+key, http.StatusFound)
}

func TestPullAndList(t *testing.T) {
	model, err := os.ReadFile(writeGGUF(t, "m.gguf", map[string]any{
		"general.architecture": "qwen2", "general.name": "Tiny Qwen", "pad": strings.Repeat("x", 200_000)}))
	if err != nil {
		t.Fatal(err)
	}
	h := &hubServer{files: map[string][]byte{"acme/Tiny-GGUF/tiny-q8_0.gguf": model}, cut: 80_000}
	srv := httptest.NewServer(h)
	defer srv.Close()
	t.Setenv("KVLM_HF_ENDPOINT", srv.URL)
	dir := t.TempDir()
	t.Setenv("KVLM_MODELS", dir)

	// Cut mid-way: the error says so and the partial file stays.
	_, errOut, code := kvlm(t, "pull", "hf://acme/Tiny-GGUF/tiny-q8_0.gguf")
	if code != 1 || !strings.Contains(errOut, "interrupted") || !strings.Contains(errOut, "pull again to resume") {
		t.Fatalf("cut pull: code %d, %q", code, errOut)
	}
	out, _, _ := kvlm(t, "list")
	if !strings.Contains(out, "hf/acme/Tiny-GGUF/main/tiny-q8_0.gguf") || !strings.Contains(out, "(partial download)") {
		t.Errorf("list during a partial download:\n%s", out)
	}
	// Resume.
	out, errOut, code = kvlm(t, "pull", "hf://acme/Tiny-GGUF/tiny-q8_0.gguf")
	want := filepath.Join(dir, "hf", "acme", "Tiny-GGUF", "main", "tiny-q8_0.gguf")
	if code != 0 || strings.TrimSpace(out) != want || !strings.Contains(errOut, "verified") || !strings.Contains(errOut, "resumed after") {
		t.Fatalf("resumed pull: code %d, out %q, stderr %q", code, out, errOut)
	}
	if r := h.ranges[len(h.ranges)-1]; !strings.HasPrefix(r, "bytes=") || r == "bytes=0-" {
		t.Errorf("resume sent Range %q", r)
	}
	got, _ := os.ReadFile(want)
	if !bytes.Equal(got, model) {
		t.Fatal("pulled file differs")
	}
	out, _, code = kvlm(t, "list")
	if code != 0 || !strings.Contains(out, "hf/acme/Tiny-GGUF/main/tiny-q8_0.gguf") || !strings.Contains(out, "qwen2") || !strings.Contains(out, "Tiny Qwen") || strings.Contains(out, "partial") {
		t.Errorf("list:\n%s", out)
	}
	out, _, _ = kvlm(t, "list", "--json")
	var entries []listEntry
	if err := json.Unmarshal([]byte(out), &entries); err != nil || len(entries) != 1 || entries[0].Arch != "qwen2" || entries[0].Bytes != int64(len(model)) {
		t.Errorf("list --json: %v %+v", err, entries)
	}
	// A name in the model directory works as -m.
	if _, errOut, code := kvlm(t, "tokenize", "-m", "acme/Tiny-GGUF/tiny-q8_0.gguf", "x"); code != 1 || !strings.Contains(errOut, "tokenizer.ggml.model") {
		t.Errorf("tokenize by name: %d %q", code, errOut)
	}
	// Present: skipped.
	_, errOut, code = kvlm(t, "pull", "-q", "hf://acme/Tiny-GGUF/tiny-q8_0.gguf")
	if code != 0 || !strings.Contains(errOut, "already present") || !strings.Contains(errOut, "verified") {
		t.Errorf("second pull: %d %q", code, errOut)
	}
}

func TestPullChecksumMismatch(t *testing.T) {
	h := &hubServer{files: map[string][]byte{"a/b/c.gguf": bytes.Repeat([]byte("GGUF"), 1000)}, badSHA: true}
	srv := httptest.NewServer(h)
	defer srv.Close()
	t.Setenv("KVLM_HF_ENDPOINT", srv.URL)
	dir := t.TempDir()
	_, errOut, code := kvlm(t, "pull", "--dir", dir, "-q", "hf://a/b/c.gguf")
	if code != 1 || !strings.Contains(errOut, "sha256 mismatch") || !strings.Contains(errOut, "deleted the partial download") {
		t.Fatalf("code %d, %q", code, errOut)
	}
	if out, _, _ := kvlm(t, "list", "--dir", dir); !strings.Contains(out, "no models") {
		t.Errorf("files left after a mismatch:\n%s", out)
	}
	for _, bad := range []string{"hf://a/b", "ftp://x/y.gguf"} {
		if _, errOut, code := kvlm(t, "pull", "--dir", dir, bad); code != 1 || !strings.Contains(errOut, "hf://OWNER/REPO/FILE") {
			t.Errorf("pull %s: %d %q", bad, code, errOut)
		}
	}
}

// TestPullStalledServer: --timeout bounds a server that stops sending, and
// must be positive.
func TestPullStalledServer(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5000")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			w.Write(make([]byte, 1000))
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}))
	defer srv.Close()
	defer close(release)
	dir := t.TempDir()
	start := time.Now()
	_, errOut, code := kvlm(t, "pull", "--dir", dir, "--timeout", "300ms", srv.URL+"/m.gguf")
	if code != 1 || !strings.Contains(errOut, "no data for 300ms") || !strings.Contains(errOut, "pull again to resume") {
		t.Errorf("stalled body: code %d, %q", code, errOut)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("took %v with --timeout 300ms", el)
	}
	for _, bad := range []string{"0s", "-1s"} {
		if _, errOut, code := kvlm(t, "pull", "--dir", dir, "--timeout", bad, srv.URL+"/m.gguf"); code != 1 || !strings.Contains(errOut, "--timeout must be positive") {
			t.Errorf("--timeout %s: code %d, %q", bad, code, errOut)
		}
	}
}

// TestPullReplacesCorrupted: a same-size corrupted file is downloaded again;
// progress bars stay off a stderr that is not a terminal.
func TestPullReplacesCorrupted(t *testing.T) {
	data := bytes.Repeat([]byte("GGUF-abc"), 20_000)
	h := &hubServer{files: map[string][]byte{"a/b/c.gguf": data}}
	srv := httptest.NewServer(h)
	defer srv.Close()
	t.Setenv("KVLM_HF_ENDPOINT", srv.URL)
	dir := t.TempDir()
	out, errOut, code := kvlm(t, "pull", "--dir", dir, "hf://a/b/c.gguf")
	if code != 0 {
		t.Fatalf("pull: %d %q", code, errOut)
	}
	if strings.Contains(errOut, "\r") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("stderr (not a terminal) got more than the final line: %q", errOut)
	}
	path := strings.TrimSpace(out)
	bad := bytes.Clone(data)
	bad[100] ^= 0xff
	os.WriteFile(path, bad, 0o644)
	_, errOut, code = kvlm(t, "pull", "--dir", dir, "hf://a/b/c.gguf")
	if code != 0 || !strings.Contains(errOut, "downloaded again: the file present has sha256") || !strings.Contains(errOut, "verified") {
		t.Errorf("pull over a corrupted file: %d %q", code, errOut)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, data) {
		t.Error("the corrupted file was kept")
	}
}
