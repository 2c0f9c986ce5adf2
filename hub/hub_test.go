package hub

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeHub mimics the Hugging Face hub's layout: /OWNER/REPO/resolve/REV/FILE
// answers with a 302 to /cdn/FILE carrying X-Linked-Size, X-Linked-Etag (the
// sha256 of LFS files) and X-Repo-Commit; the CDN serves Range requests.
type fakeHub struct {
	files map[string][]byte // "OWNER/REPO/FILE" -> content
	mu    sync.Mutex
	// cutAfter, when > 0, makes the next CDN response stop after that many
	// body bytes (the connection is dropped).
	cutAfter int
	// badSHA advertises a wrong sha256.
	badSHA bool
	// noRange ignores Range headers (answers 200 with the whole file).
	noRange bool
	// needToken requires "Authorization: Bearer secret" on resolve.
	needToken bool
	ranges    []string // Range headers the CDN saw
	srv       *httptest.Server
}

func newFakeHub(t *testing.T) *fakeHub {
	h := &fakeHub{files: map[string][]byte{}}
	h.srv = httptest.NewServer(h)
	t.Cleanup(h.srv.Close)
	t.Setenv("KVLM_HF_ENDPOINT", h.srv.URL)
	return h
}

func (h *fakeHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rest, ok := strings.CutPrefix(r.URL.Path, "/cdn/"); ok {
		data, ok := h.files[rest]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method == http.MethodGet {
			h.ranges = append(h.ranges, r.Header.Get("Range"))
		}
		if h.noRange {
			r.Header.Del("Range")
		}
		if h.cutAfter > 0 && r.Method == http.MethodGet {
			cut := h.cutAfter
			h.cutAfter = 0
			w.Header().Set("Content-Length", fmt.Sprint(len(data)))
			w.WriteHeader(http.StatusOK)
			w.Write(data[:cut])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
		return
	}
	// /OWNER/REPO/resolve/REV/FILE
	parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 5)
	if len(parts) != 5 || parts[2] != "resolve" {
		http.NotFound(w, r)
		return
	}
	if h.needToken && r.Header.Get("Authorization") != "Bearer secret" {
		http.Error(w, "gated", http.StatusUnauthorized)
		return
	}
	key := parts[0] + "/" + parts[1] + "/" + parts[4]
	data, ok := h.files[key]
	if !ok {
		http.Error(w, "Entry not found", http.StatusNotFound)
		return
	}
	sum := sha256.Sum256(data)
	etag := hex.EncodeToString(sum[:])
	if h.badSHA {
		etag = strings.Repeat("ab", 32)
	}
	w.Header().Set("X-Linked-Size", fmt.Sprint(len(data)))
	w.Header().Set("X-Linked-Etag", `"`+etag+`"`)
	w.Header().Set("X-Repo-Commit", "0123456789abcdef")
	w.Header().Set("ETag", `W/"git-blob-oid"`)
	http.Redirect(w, r, "/cdn/"+key, http.StatusFound)
}

func randomData(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestParse(t *testing.T) {
	t.Setenv("KVLM_HF_ENDPOINT", "https://hub.example")
	cases := []struct {
		in       string
		url, rel string
		hub      bool
	}{
		{"hf://bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q4_K_M.gguf",
			"https://hub.example/bartowski/Llama-3.2-1B-Instruct-GGUF/resolve/main/Llama-3.2-1B-Instruct-Q4_K_M.gguf",
			"bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q4_K_M.gguf", true},
		{"hf://o/r@v1.0/sub dir/f.gguf", "https://hub.example/o/r/resolve/v1.0/sub%20dir/f.gguf", "o/r/sub dir/f.gguf", true},
		{"https://hub.example/o/r/blob/main/f.gguf", "https://hub.example/o/r/resolve/main/f.gguf", "o/r/f.gguf", true},
		{"https://files.example.org/models/x.gguf?download=1", "https://files.example.org/models/x.gguf?download=1", "files.example.org/x.gguf", false},
	}
	for _, c := range cases {
		r, err := Parse(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if r.URL != c.url || r.Rel != c.rel || r.Hub != c.hub {
			t.Errorf("%s: %+v", c.in, r)
		}
	}
	for _, bad := range []string{"hf://o/r", "hf://o//f", "ftp://x/y", "hf://o/r/../../etc/passwd", "https://x.org/", "model.gguf"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestPullVerifies(t *testing.T) {
	h := newFakeHub(t)
	data := randomData(300_000)
	h.files["me/tiny-GGUF/tiny.Q8_0.gguf"] = data
	ref, err := Parse("hf://me/tiny-GGUF/tiny.Q8_0.gguf")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var prog bytes.Buffer
	res, err := Pull(context.Background(), ref, Options{Dir: dir, Progress: &prog})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "me", "tiny-GGUF", "tiny.Q8_0.gguf"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file differs (%v)", err)
	}
	if !res.Verified || res.Size != int64(len(data)) || res.Resumed != 0 || res.Skipped {
		t.Errorf("result %+v", res)
	}
	if !strings.Contains(prog.String(), "100%") || !strings.Contains(prog.String(), "tiny.Q8_0.gguf") {
		t.Errorf("progress %q", prog.String())
	}
	// Again: already present.
	res, err = Pull(context.Background(), ref, Options{Dir: dir})
	if err != nil || !res.Skipped {
		t.Errorf("second pull: %+v %v", res, err)
	}
	entries, err := List(dir)
	if err != nil || len(entries) != 1 || entries[0].Rel != "me/tiny-GGUF/tiny.Q8_0.gguf" || entries[0].Partial {
		t.Errorf("List: %+v %v", entries, err)
	}
}

// TestPullResumes: a download cut mid-way keeps the partial file, and the
// next pull asks only for the rest and verifies the whole.
func TestPullResumes(t *testing.T) {
	h := newFakeHub(t)
	data := randomData(1 << 20)
	h.files["me/m/m.gguf"] = data
	h.cutAfter = 400_000
	ref, _ := Parse("hf://me/m/m.gguf")
	dir := t.TempDir()
	_, err := Pull(context.Background(), ref, Options{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "interrupted") || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("cut download: error %v", err)
	}
	part := filepath.Join(dir, "me", "m", "m.gguf"+PartSuffix)
	st, err := os.Stat(part)
	if err != nil || st.Size() == 0 || st.Size() > 400_000 {
		t.Fatalf("partial file: %v %v", st, err)
	}
	entries, _ := List(dir)
	if len(entries) != 1 || !entries[0].Partial {
		t.Errorf("List: %+v", entries)
	}
	res, err := Pull(context.Background(), ref, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != st.Size() || !res.Verified {
		t.Errorf("result %+v, want resumed from %d", res, st.Size())
	}
	if last := h.ranges[len(h.ranges)-1]; last != fmt.Sprintf("bytes=%d-", st.Size()) {
		t.Errorf("Range %q", last)
	}
	got, _ := os.ReadFile(res.Path)
	if !bytes.Equal(got, data) {
		t.Fatal("resumed file differs")
	}
	if _, err := os.Stat(part); !os.IsNotExist(err) {
		t.Error("partial file left behind")
	}
}

// TestPullRangeIgnored: a server that answers a resume with the whole
// file gets it written from the start.
func TestPullRangeIgnored(t *testing.T) {
	h := newFakeHub(t)
	data := randomData(200_000)
	h.files["me/m/m.gguf"] = data
	h.cutAfter = 50_000
	ref, _ := Parse("hf://me/m/m.gguf")
	dir := t.TempDir()
	if _, err := Pull(context.Background(), ref, Options{Dir: dir}); err == nil {
		t.Fatal("cut download succeeded")
	}
	h.noRange = true
	res, err := Pull(context.Background(), ref, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(res.Path)
	if !bytes.Equal(got, data) || res.Resumed != 0 || !res.Verified {
		t.Fatalf("result %+v, equal %v", res, bytes.Equal(got, data))
	}
}

// TestPullChecksumMismatch deletes the partial file and says so.
func TestPullChecksumMismatch(t *testing.T) {
	h := newFakeHub(t)
	h.files["me/m/m.gguf"] = randomData(100_000)
	h.badSHA = true
	ref, _ := Parse("hf://me/m/m.gguf")
	dir := t.TempDir()
	_, err := Pull(context.Background(), ref, Options{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "sha256 mismatch") || !strings.Contains(err.Error(), "deleted the partial download") {
		t.Fatalf("error %v", err)
	}
	for _, p := range []string{"m.gguf", "m.gguf" + PartSuffix} {
		if _, err := os.Stat(filepath.Join(dir, "me", "m", p)); !os.IsNotExist(err) {
			t.Errorf("%s exists after a mismatch", p)
		}
	}
	// A given --sha256 overrides the hub's.
	h.badSHA = false
	if _, err := Pull(context.Background(), ref, Options{Dir: dir, SHA256: strings.Repeat("0", 64)}); err == nil || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Errorf("given sha256 not checked: %v", err)
	}
}

func TestPullErrors(t *testing.T) {
	h := newFakeHub(t)
	h.files["me/m/m.gguf"] = randomData(1000)
	dir := t.TempDir()
	ref, _ := Parse("hf://me/m/missing.gguf")
	if _, err := Pull(context.Background(), ref, Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "no such file in me/m at revision main") {
		t.Errorf("missing file: %v", err)
	}
	h.needToken = true
	ref, _ = Parse("hf://me/m/m.gguf")
	if _, err := Pull(context.Background(), ref, Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Errorf("gated: %v", err)
	}
	if _, err := Pull(context.Background(), ref, Options{Dir: dir, Token: "secret"}); err != nil {
		t.Errorf("with token: %v", err)
	}
}

// TestPullPlainURL: a plain URL downloads without a published sha256.
func TestPullPlainURL(t *testing.T) {
	data := randomData(70_000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	defer srv.Close()
	ref, err := Parse(srv.URL + "/files/plain.gguf")
	if err != nil {
		t.Fatal(err)
	}
	if ref.Hub {
		t.Fatal("plain URL taken for the hub")
	}
	dir := t.TempDir()
	res, err := Pull(context.Background(), ref, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(res.Path)
	if !bytes.Equal(got, data) || res.Verified || !strings.HasSuffix(res.Path, "plain.gguf") {
		t.Errorf("result %+v", res)
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KVLM_MODELS", dir)
	p := filepath.Join(dir, "o", "r", "x.gguf")
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte("GGUF"), 0o644)
	for _, name := range []string{"o/r/x.gguf", "hf://o/r/x.gguf", "x.gguf", p} {
		got, err := Resolve(name)
		if err != nil || got != p {
			t.Errorf("Resolve(%s) = %s, %v", name, got, err)
		}
	}
	if _, err := Resolve("nope.gguf"); err == nil {
		t.Error("missing model resolved")
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
