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
	"net/url"
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
		rest, _ = url.PathUnescape(rest)
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
	// "OWNER/REPO@REV/FILE" first (a file at one revision), then
	// "OWNER/REPO/FILE" (the same at every revision).
	key := parts[0] + "/" + parts[1] + "@" + parts[3] + "/" + parts[4]
	data, ok := h.files[key]
	if !ok {
		key = parts[0] + "/" + parts[1] + "/" + parts[4]
		data, ok = h.files[key]
	}
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
	http.Redirect(w, r, "/cdn/"+url.PathEscape(key), http.StatusFound)
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
			"hf/bartowski/Llama-3.2-1B-Instruct-GGUF/main/Llama-3.2-1B-Instruct-Q4_K_M.gguf", true},
		{"hf://o/r@v1.0/sub dir/f.gguf", "https://hub.example/o/r/resolve/v1.0/sub%20dir/f.gguf", "hf/o/r/v1.0/sub dir/f.gguf", true},
		{"https://hub.example/o/r/blob/main/f.gguf", "https://hub.example/o/r/resolve/main/f.gguf", "hf/o/r/main/f.gguf", true},
		{"https://hub.example/o/r/resolve/refs%2Fpr%2F1/f.gguf", "https://hub.example/o/r/resolve/refs%2Fpr%2F1/f.gguf", "hf/o/r/refs%2Fpr%2F1/f.gguf", true},
		{"https://files.example.org/models/x.gguf", "https://files.example.org/models/x.gguf", "url/files.example.org/models/x.gguf", false},
		{"http://127.0.0.1:8080/x.gguf", "http://127.0.0.1:8080/x.gguf", "url/127.0.0.1_8080/x.gguf", false},
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
	// Files that differ in owner, repository, revision, host, port, folder
	// or query string go to different places.
	distinct := []string{
		"hf://a/r/x.gguf", "hf://b/r/x.gguf", "hf://a/s/x.gguf", "hf://a/r@v2/x.gguf", "hf://a/r@0123abc/x.gguf", "hf://a/r/sub/x.gguf",
		"https://files.example.org/a/x.gguf", "https://files.example.org/b/x.gguf", "https://mirror.example.org/a/x.gguf",
		"https://files.example.org:8443/a/x.gguf", "https://files.example.org/a/x.gguf?v=1", "https://files.example.org/a/x.gguf?v=2",
		"https://hf/r/main/x.gguf", // a host that looks like a hub owner
	}
	seen := map[string]string{}
	for _, in := range distinct {
		r, err := Parse(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if prev, ok := seen[r.Rel]; ok {
			t.Errorf("%s and %s both go to %s", prev, in, r.Rel)
		}
		seen[r.Rel] = in
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
	got, err := os.ReadFile(filepath.Join(dir, "hf", "me", "tiny-GGUF", "main", "tiny.Q8_0.gguf"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file differs (%v)", err)
	}
	if !res.Verified || res.Size != int64(len(data)) || res.Resumed != 0 || res.Skipped {
		t.Errorf("result %+v", res)
	}
	if prog.Len() != 0 {
		t.Errorf("progress drawn on a buffer, not a terminal: %q", prog.String())
	}
	// Again: already present, and its sha256 checked.
	res, err = Pull(context.Background(), ref, Options{Dir: dir})
	if err != nil || !res.Skipped || !res.Verified || res.Replaced != "" {
		t.Errorf("second pull: %+v %v", res, err)
	}
	entries, err := List(dir)
	if err != nil || len(entries) != 1 || entries[0].Rel != "hf/me/tiny-GGUF/main/tiny.Q8_0.gguf" || entries[0].Partial {
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
	part := filepath.Join(dir, "hf", "me", "m", "main", "m.gguf"+PartSuffix)
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
		if _, err := os.Stat(filepath.Join(dir, "hf", "me", "m", "main", p)); !os.IsNotExist(err) {
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
	t.Setenv("KVLM_HF_ENDPOINT", "https://hub.example")
	put := func(rel string) string {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("GGUF"), 0o644)
		return p
	}
	x := put("hf/o/r/main/x.gguf")
	y1 := put("hf/o/r/main/y.gguf")
	y2 := put("hf/o/r/v2/y.gguf")
	old := put("p/q/old.gguf") // the layout before revisions
	u := put("url/files.example.org/m/z.gguf")
	put("hf/o/r/main/w.gguf" + PartSuffix)
	outside := filepath.Join(t.TempDir(), "y.gguf")
	os.WriteFile(outside, []byte("GGUF"), 0o644)
	for _, c := range []struct{ name, want string }{
		{"hf/o/r/main/x.gguf", x}, // as kvlm list shows it
		{"hf://o/r/x.gguf", x},
		{"hf://o/r@main/x.gguf", x},
		{"https://hub.example/o/r/blob/main/x.gguf", x},
		{"o/r/x.gguf", x}, // OWNER/REPO/FILE: at main
		{"x.gguf", x},     // a unique file name
		{"main/x.gguf", x},
		{"hf://o/r@v2/y.gguf", y2},
		{"hf/o/r/v2/y.gguf", y2},
		{"o/r/y.gguf", y1},
		{"p/q/old.gguf", old},
		{"old.gguf", old},
		{"https://files.example.org/m/z.gguf", u},
		{"url/files.example.org/m/z.gguf", u},
		{x, x},
		{outside, outside}, // a path that exists wins
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Resolve(c.name)
			if err != nil || got != c.want {
				t.Errorf("Resolve(%s) = %s, %v; want %s", c.name, got, err, c.want)
			}
		})
	}
	for _, c := range []struct{ name, want string }{
		{"nope.gguf", "kvlm list shows the models"},
		{"y.gguf", "several models match"},
		{"w.gguf", "partial download"},
		{"hf://o/r@v3/x.gguf", "kvlm pull"},
		{"", "no model given"},
	} {
		t.Run("bad "+c.name, func(t *testing.T) {
			if _, err := Resolve(c.name); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Resolve(%q): %v, want an error with %q", c.name, err, c.want)
			}
		})
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestPullLayout: files of one name in two repositories, and one file at two
// revisions, are kept apart.
func TestPullLayout(t *testing.T) {
	h := newFakeHub(t)
	h.files["a/r/x.gguf"] = randomData(1000)
	h.files["b/r/x.gguf"] = randomData(2000)
	h.files["a/r@v2/x.gguf"] = randomData(3000)
	dir := t.TempDir()
	names := []string{"hf://a/r/x.gguf", "hf://b/r/x.gguf", "hf://a/r@v2/x.gguf"}
	keys := []string{"a/r/x.gguf", "b/r/x.gguf", "a/r@v2/x.gguf"}
	paths := map[string]bool{}
	for _, n := range names {
		ref, err := Parse(n)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Pull(context.Background(), ref, Options{Dir: dir})
		if err != nil || res.Skipped {
			t.Fatalf("%s: %+v %v", n, res, err)
		}
		paths[res.Path] = true
	}
	if len(paths) != 3 {
		t.Fatalf("three files went to %d places", len(paths))
	}
	for i, n := range names {
		ref, _ := Parse(n)
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(ref.Rel)))
		if err != nil || !bytes.Equal(got, h.files[keys[i]]) {
			t.Errorf("%s: the file at %s is not its own (%v)", n, ref.Rel, err)
		}
	}
}

// TestPullPresentChecked: a file already present is kept only when it has
// the published sha256; a same-size corrupted copy is downloaded again.
func TestPullPresentChecked(t *testing.T) {
	h := newFakeHub(t)
	data := randomData(50_000)
	h.files["me/m/m.gguf"] = data
	ref, _ := Parse("hf://me/m/m.gguf")
	dir := t.TempDir()
	res, err := Pull(context.Background(), ref, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		corrupt func([]byte) []byte
		why     string
	}{
		{"same size, one byte flipped", func(b []byte) []byte { b[len(b)/2] ^= 1; return b }, "sha256"},
		{"shorter", func(b []byte) []byte { return b[:len(b)-1] }, "bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(res.Path, c.corrupt(bytes.Clone(data)), 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := Pull(context.Background(), ref, Options{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if r.Skipped || !r.Verified || !strings.Contains(r.Replaced, c.why) {
				t.Errorf("result %+v: want a verified download replacing a file whose %s differs", r, c.why)
			}
			if got, _ := os.ReadFile(res.Path); !bytes.Equal(got, data) {
				t.Error("the corrupted file was kept")
			}
		})
	}
}

// TestPullPresentGivenSHA: without a published sha256 a file of the right
// size is kept unverified; with --sha256 it is checked.
func TestPullPresentGivenSHA(t *testing.T) {
	data := randomData(20_000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	defer srv.Close()
	ref, _ := Parse(srv.URL + "/m.gguf")
	dir := t.TempDir()
	res, err := Pull(context.Background(), ref, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(data)
	bad[0] ^= 1
	os.WriteFile(res.Path, bad, 0o644)
	r, err := Pull(context.Background(), ref, Options{Dir: dir})
	if err != nil || !r.Skipped || r.Verified {
		t.Errorf("no sha256 known: %+v %v, want kept unverified", r, err)
	}
	sum := sha256.Sum256(data)
	r, err = Pull(context.Background(), ref, Options{Dir: dir, SHA256: hex.EncodeToString(sum[:])})
	if err != nil || r.Skipped || !r.Verified || r.Replaced == "" {
		t.Errorf("--sha256 given: %+v %v, want downloaded again", r, err)
	}
	if got, _ := os.ReadFile(res.Path); !bytes.Equal(got, data) {
		t.Error("the corrupted file was kept")
	}
}

// TestPullAdoptsOldLayout: a file where the layout without revisions put
// it (OWNER/REPO/FILE) is moved into place when it matches the published
// sha256, and left alone otherwise.
func TestPullAdoptsOldLayout(t *testing.T) {
	h := newFakeHub(t)
	data := randomData(40_000)
	h.files["me/m/m.gguf"] = data
	ref, _ := Parse("hf://me/m/m.gguf")
	for _, c := range []struct {
		name  string
		old   []byte
		adopt bool
	}{
		{"matches", data, true},
		{"differs", append(bytes.Clone(data[:len(data)-1]), data[len(data)-1]^1), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			old := filepath.Join(dir, "me", "m", "m.gguf")
			os.MkdirAll(filepath.Dir(old), 0o755)
			os.WriteFile(old, c.old, 0o644)
			h.ranges = nil
			res, err := Pull(context.Background(), ref, Options{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(res.Path); !bytes.Equal(got, data) || !res.Verified {
				t.Fatalf("result %+v: file not in place", res)
			}
			_, errOld := os.Stat(old)
			if c.adopt {
				if res.Adopted != old || !res.Skipped || len(h.ranges) != 0 || !os.IsNotExist(errOld) {
					t.Errorf("result %+v, %d GETs, old file: %v; want it moved, nothing downloaded", res, len(h.ranges), errOld)
				}
			} else if res.Adopted != "" || res.Skipped || len(h.ranges) != 1 || errOld != nil {
				t.Errorf("result %+v, %d GETs, old file: %v; want a download and the old file left", res, len(h.ranges), errOld)
			}
		})
	}
}

// TestPullResumesOldPart: a partial download the old layout left is resumed
// when a sha256 will check the result, and left alone otherwise.
func TestPullResumesOldPart(t *testing.T) {
	h := newFakeHub(t)
	data := randomData(60_000)
	h.files["me/m/m.gguf"] = data
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	defer plain.Close()
	for _, c := range []struct {
		name   string
		url    string
		old    []byte // the old partial file
		resume bool
	}{
		{"hub, sha256 published", "hf://me/m/m.gguf", data[:25_000], true},
		{"plain URL, no sha256", plain.URL + "/a/m.gguf", randomData(25_000), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref, err := Parse(c.url)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			old := filepath.Join(dir, filepath.FromSlash(ref.Legacy)) + PartSuffix
			os.MkdirAll(filepath.Dir(old), 0o755)
			os.WriteFile(old, c.old, 0o644)
			res, err := Pull(context.Background(), ref, Options{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(res.Path); !bytes.Equal(got, data) {
				t.Fatal("file differs")
			}
			_, errOld := os.Stat(old)
			if c.resume {
				if !res.Verified || res.Resumed != int64(len(c.old)) || res.Adopted != old || !os.IsNotExist(errOld) {
					t.Errorf("result %+v, old part: %v; want it resumed", res, errOld)
				}
			} else if res.Resumed != 0 || res.Adopted != "" || errOld != nil {
				t.Errorf("result %+v, old part: %v; want it left alone", res, errOld)
			}
		})
	}
}
