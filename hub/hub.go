// Package hub downloads model files into the local model directory: from
// the Hugging Face hub (hf://OWNER/REPO/FILE) or any http(s) URL, resumably,
// checking the size and the sha256 the hub publishes for LFS files.
package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DefaultEndpoint is the Hugging Face hub.
const DefaultEndpoint = "https://huggingface.co"

// Endpoint is the hub's base URL: $KVLM_HF_ENDPOINT, else $HF_ENDPOINT, else
// DefaultEndpoint.
func Endpoint() string {
	for _, k := range []string{"KVLM_HF_ENDPOINT", "HF_ENDPOINT"} {
		if v := os.Getenv(k); v != "" {
			return strings.TrimRight(v, "/")
		}
	}
	return DefaultEndpoint
}

// Dir is the model directory: $KVLM_MODELS, else kvlm/models under the
// user's cache directory.
func Dir() (string, error) {
	if d := os.Getenv("KVLM_MODELS"); d != "" {
		return d, nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("hub: no model directory: set KVLM_MODELS (%v)", err)
	}
	return filepath.Join(c, "kvlm", "models"), nil
}

// Ref is a file to download.
type Ref struct {
	URL string // where to GET it
	// Rel is where it goes, relative to the model directory (slash
	// separated): OWNER/REPO/FILE for the hub, HOST/NAME for a URL.
	Rel string
	// Hub: the file is on the Hugging Face hub, which publishes the sha256
	// of LFS files in X-Linked-Etag.
	Hub                    bool
	Owner, Repo, Rev, File string // Hub only
}

// Parse reads hf://OWNER/REPO/FILE (FILE may contain slashes; REPO@REV
// picks a revision, default main), a hub page or file URL
// (https://huggingface.co/OWNER/REPO/{blob,resolve}/REV/FILE), or another
// http(s) URL.
func Parse(s string) (Ref, error) {
	if rest, ok := strings.CutPrefix(s, "hf://"); ok {
		parts := strings.SplitN(rest, "/", 3)
		if len(parts) < 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			return Ref{}, fmt.Errorf("hub: %q: want hf://OWNER/REPO/FILE", s)
		}
		repo, rev, _ := strings.Cut(parts[1], "@")
		if rev == "" {
			rev = "main"
		}
		return hubRef(parts[0], repo, rev, parts[2], Endpoint())
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return Ref{}, fmt.Errorf("hub: %q is neither hf://OWNER/REPO/FILE nor an http(s) URL", s)
	}
	// A hub URL: OWNER/REPO/{resolve,blob}/REV/FILE on the hub's host.
	if ep, err := url.Parse(Endpoint()); err == nil && u.Host == ep.Host {
		p := strings.TrimPrefix(strings.TrimPrefix(u.Path, strings.TrimRight(ep.Path, "/")), "/")
		parts := strings.SplitN(p, "/", 5)
		if len(parts) == 5 && (parts[2] == "resolve" || parts[2] == "blob") {
			return hubRef(parts[0], parts[1], parts[3], parts[4], Endpoint())
		}
	}
	name := path.Base(u.Path)
	if name == "/" || name == "." || name == "" {
		return Ref{}, fmt.Errorf("hub: %q names no file", s)
	}
	r := Ref{URL: u.String(), Rel: u.Hostname() + "/" + name}
	if err := checkRel(r.Rel); err != nil {
		return Ref{}, err
	}
	return r, nil
}

func hubRef(owner, repo, rev, file, endpoint string) (Ref, error) {
	r := Ref{Hub: true, Owner: owner, Repo: repo, Rev: rev, File: file, Rel: owner + "/" + repo + "/" + file}
	if err := checkRel(r.Rel); err != nil {
		return Ref{}, err
	}
	segs := []string{owner, repo, "resolve", rev}
	segs = append(segs, strings.Split(file, "/")...)
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	r.URL = endpoint + "/" + strings.Join(segs, "/")
	return r, nil
}

// checkRel refuses paths that would leave the model directory.
func checkRel(rel string) error {
	for _, p := range strings.Split(rel, "/") {
		if p == "" || p == "." || p == ".." || strings.ContainsAny(p, "\\\x00") {
			return fmt.Errorf("hub: %q is not a valid file path", rel)
		}
	}
	return nil
}

// Options control a download.
type Options struct {
	Dir      string       // model directory; "": Dir()
	Client   *http.Client // nil: http.DefaultClient
	Progress io.Writer    // a progress bar is drawn here; nil: none
	Token    string       // bearer token for the hub (gated models)
	SHA256   string       // expected sha256 (hex), overriding the hub's
	Force    bool         // download even if the file is present
}

// Result says what Pull did.
type Result struct {
	Path     string // the complete file
	Size     int64
	SHA256   string // of the file, when it was hashed ("" when skipped)
	Verified bool   // the sha256 matched a published or given one
	Resumed  int64  // bytes of an earlier partial download kept
	Skipped  bool   // the file was already present
}

// remote is what a HEAD request says of a file.
type remote struct {
	size int64  // -1: unknown
	sha  string // "" unknown
}

// PartSuffix marks a partial download.
const PartSuffix = ".part"

// Pull downloads ref into the model directory. An interrupted download
// leaves DEST.part, which the next Pull resumes with a Range request. When a
// size or sha256 is known (published by the hub, or in opt.SHA256) the
// result is checked; on a mismatch the partial file is deleted.
func Pull(ctx context.Context, ref Ref, opt Options) (Result, error) {
	var res Result
	dir := opt.Dir
	if dir == "" {
		d, err := Dir()
		if err != nil {
			return res, err
		}
		dir = d
	}
	if err := checkRel(ref.Rel); err != nil {
		return res, err
	}
	client := opt.Client
	if client == nil {
		client = http.DefaultClient
	}
	dest := filepath.Join(dir, filepath.FromSlash(ref.Rel))
	part := dest + PartSuffix
	res.Path = dest

	rem, err := head(ctx, client, ref, opt.Token)
	if err != nil {
		return res, err
	}
	want := strings.ToLower(opt.SHA256)
	if want != "" && !isSHA256(want) {
		return res, fmt.Errorf("hub: --sha256 %q is not 64 hex digits", opt.SHA256)
	}
	if want == "" {
		want = rem.sha
	}
	if st, err := os.Stat(dest); err == nil && !opt.Force && (rem.size < 0 || st.Size() == rem.size) {
		res.Size, res.Skipped = st.Size(), true
		return res, nil
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return res, fmt.Errorf("hub: %w", err)
	}
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return res, fmt.Errorf("hub: %w", err)
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return res, fmt.Errorf("hub: %w", err)
	}
	if rem.size >= 0 && have > rem.size {
		have = 0 // not a prefix of this file
	}
	h := sha256.New()
	if have > 0 {
		// Hash what is kept.
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return res, fmt.Errorf("hub: %w", err)
		}
		if _, err := io.CopyN(h, f, have); err != nil {
			return res, fmt.Errorf("hub: reading %s: %w", part, err)
		}
	}
	total := rem.size
	if rem.size < 0 || have != rem.size {
		from, t, err := fetch(ctx, client, ref, opt, f, h, have, rem.size)
		if err != nil {
			return res, err
		}
		total, res.Resumed = t, from
	} else {
		res.Resumed = have // complete already: only verify
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return res, fmt.Errorf("hub: %w", err)
	}
	if total >= 0 && size != total {
		f.Close()
		f = nil
		os.Remove(part)
		return res, fmt.Errorf("hub: %s: received %d bytes, the server announced %d; deleted the partial download %s", ref.Rel, size, total, part)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	res.Size, res.SHA256 = size, sum
	if want != "" {
		if sum != want {
			f.Close()
			f = nil
			os.Remove(part)
			return res, fmt.Errorf("hub: %s: sha256 mismatch: got %s, want %s; deleted the partial download %s", ref.Rel, sum, want, part)
		}
		res.Verified = true
	}
	if err := f.Sync(); err != nil {
		return res, fmt.Errorf("hub: %w", err)
	}
	if err := f.Close(); err != nil {
		f = nil
		return res, fmt.Errorf("hub: %w", err)
	}
	f = nil
	if err := os.Rename(part, dest); err != nil {
		return res, fmt.Errorf("hub: %w", err)
	}
	return res, nil
}

func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// etagSHA returns the sha256 an ETag carries, or "".
func etagSHA(v string) string {
	v = strings.Trim(strings.TrimPrefix(strings.TrimSpace(v), "W/"), `"`)
	v = strings.ToLower(v)
	if isSHA256(v) {
		return v
	}
	return ""
}

func newRequest(ctx context.Context, method string, ref Ref, token string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, ref.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	req.Header.Set("User-Agent", "kvlm")
	if token != "" && ref.Hub {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req, nil
}

// statusError explains an HTTP failure.
func statusError(ref Ref, resp *http.Response) error {
	msg := resp.Status
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		if ref.Hub {
			msg += " (a gated or private repository? accept its license on the hub and set HF_TOKEN)"
		}
	case http.StatusNotFound:
		msg += " (no such file"
		if ref.Hub {
			msg += fmt.Sprintf(" in %s/%s at revision %s", ref.Owner, ref.Repo, ref.Rev)
		}
		msg += ")"
	}
	return fmt.Errorf("hub: %s: %s", ref.URL, msg)
}

// head asks for the size and sha256 without following the hub's redirect to
// its CDN (the redirect carries X-Linked-Size and X-Linked-Etag).
func head(ctx context.Context, client *http.Client, ref Ref, token string) (remote, error) {
	rem := remote{size: -1}
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	req, err := newRequest(ctx, http.MethodHead, ref, token)
	if err != nil {
		return rem, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return rem, fmt.Errorf("hub: %w", err)
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		if resp.ContentLength >= 0 {
			rem.size = resp.ContentLength
		}
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
	case resp.StatusCode == http.StatusMethodNotAllowed && !ref.Hub:
		return rem, nil // servers without HEAD: no size known in advance
	default:
		return rem, statusError(ref, resp)
	}
	if v := resp.Header.Get("X-Linked-Size"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			rem.size = n
		}
	}
	if ref.Hub {
		if s := etagSHA(resp.Header.Get("X-Linked-Etag")); s != "" {
			rem.sha = s
		} else if s := etagSHA(resp.Header.Get("ETag")); s != "" {
			rem.sha = s
		}
	}
	return rem, nil
}

// fetch GETs the file into f (positioned at its end, have bytes long),
// resuming with a Range request. It returns the offset the body was written
// from and the file's total size (-1 if unknown).
func fetch(ctx context.Context, client *http.Client, ref Ref, opt Options, f *os.File, h hashWriter, have, size int64) (from, total int64, err error) {
	req, err := newRequest(ctx, http.MethodGet, ref, opt.Token)
	if err != nil {
		return 0, -1, err
	}
	if have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, -1, fmt.Errorf("hub: %w", err)
	}
	defer resp.Body.Close()
	total = size
	switch resp.StatusCode {
	case http.StatusPartialContent:
		start, _, all, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || start != have {
			return 0, -1, fmt.Errorf("hub: %s: bad Content-Range %q for a resume at %d", ref.URL, resp.Header.Get("Content-Range"), have)
		}
		from = have
		if all >= 0 {
			total = all
		}
	case http.StatusOK:
		// Sent whole: start over.
		if have > 0 {
			if err := restart(f, h); err != nil {
				return 0, -1, err
			}
		}
		from = 0
		if resp.ContentLength >= 0 {
			total = resp.ContentLength
		}
	case http.StatusRequestedRangeNotSatisfiable:
		// Nothing after have: the part may be complete already.
		return have, total, nil
	default:
		return 0, -1, statusError(ref, resp)
	}
	if size >= 0 && total >= 0 && total != size {
		return 0, -1, fmt.Errorf("hub: %s: the server sends %d bytes, the hub announced %d", ref.URL, total, size)
	}
	bar := newProgress(opt.Progress, path.Base(ref.Rel), from, total)
	w := io.MultiWriter(f, h, bar)
	n, err := io.Copy(w, resp.Body)
	bar.done(err == nil)
	if err != nil {
		got := from + n
		of := "?"
		if total >= 0 {
			of = strconv.FormatInt(total, 10)
		}
		return from, total, fmt.Errorf("hub: %s: download interrupted after %d of %s bytes (%v); the partial file is kept: pull again to resume", ref.Rel, got, of, err)
	}
	return from, total, nil
}

type hashWriter interface {
	io.Writer
	Reset()
}

func restart(f *os.File, h hashWriter) error {
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	h.Reset()
	return nil
}

// parseContentRange reads "bytes START-END/TOTAL" (TOTAL may be "*": -1).
func parseContentRange(v string) (start, end, total int64, ok bool) {
	rest, found := strings.CutPrefix(v, "bytes ")
	if !found {
		return 0, 0, 0, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, 0, false
	}
	a, b, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, 0, false
	}
	var err1, err2 error
	start, err1 = strconv.ParseInt(a, 10, 64)
	end, err2 = strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || start < 0 || end < start {
		return 0, 0, 0, false
	}
	total = -1
	if tot != "*" {
		t, err := strconv.ParseInt(tot, 10, 64)
		if err != nil || t <= end {
			return 0, 0, 0, false
		}
		total = t
	}
	return start, end, total, true
}

// progress draws a one-line progress bar, at most every 100 ms.
type progress struct {
	w           io.Writer
	name        string
	n, total    int64
	start, last time.Time
	from        int64
}

func newProgress(w io.Writer, name string, from, total int64) *progress {
	now := time.Now()
	return &progress{w: w, name: name, n: from, from: from, total: total, start: now}
}

func (p *progress) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	if p.w != nil && time.Since(p.last) >= 100*time.Millisecond {
		p.draw()
	}
	return len(b), nil
}

func (p *progress) draw() {
	p.last = time.Now()
	rate := float64(p.n-p.from) / max(time.Since(p.start).Seconds(), 1e-3)
	if p.total > 0 {
		const width = 30
		frac := float64(p.n) / float64(p.total)
		fill := int(frac * width)
		bar := strings.Repeat("=", fill) + strings.Repeat(" ", width-fill)
		if fill > 0 && fill < width {
			bar = strings.Repeat("=", fill-1) + ">" + strings.Repeat(" ", width-fill)
		}
		fmt.Fprintf(p.w, "\r%s %3d%% [%s] %s / %s  %s/s ", p.name, int(frac*100), bar, HumanBytes(p.n), HumanBytes(p.total), HumanBytes(int64(rate)))
		return
	}
	fmt.Fprintf(p.w, "\r%s %s  %s/s ", p.name, HumanBytes(p.n), HumanBytes(int64(rate)))
}

func (p *progress) done(ok bool) {
	if p.w == nil {
		return
	}
	p.draw()
	fmt.Fprintln(p.w)
}

// HumanBytes formats a byte count: 512 B, 1.5 KiB, 4.2 GiB.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), 0
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	for v /= unit; v >= unit && i < len(units)-1; i++ {
		v /= unit
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// Entry is a file in the model directory.
type Entry struct {
	Rel     string // slash-separated path under the directory
	Path    string
	Size    int64
	Partial bool // an unfinished download (.part)
}

// List returns the model files (*.gguf and other non-hidden files, and
// partial downloads) under dir, sorted by path. A missing dir is empty.
func List(dir string) ([]Entry, error) {
	var out []Entry
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == dir {
				return fs.SkipAll
			}
			return err
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		e := Entry{Rel: filepath.ToSlash(rel), Path: p, Size: info.Size()}
		if strings.HasSuffix(e.Rel, PartSuffix) {
			e.Partial = true
			e.Rel = strings.TrimSuffix(e.Rel, PartSuffix)
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rel < out[j].Rel })
	return out, nil
}

// Resolve finds a model given as a path or as a name under the model
// directory (OWNER/REPO/FILE, hf://OWNER/REPO/FILE or a file name that is
// unique there). A path that exists is returned as is.
func Resolve(name string) (string, error) {
	if _, err := os.Stat(name); err == nil {
		return name, nil
	}
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	rel := strings.TrimPrefix(name, "hf://")
	if r, err := Parse(name); err == nil {
		rel = r.Rel
	}
	if checkRel(rel) == nil {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	entries, err := List(dir)
	if err != nil {
		return "", err
	}
	var found []string
	for _, e := range entries {
		if !e.Partial && (path.Base(e.Rel) == name || strings.HasSuffix(e.Rel, "/"+name)) {
			found = append(found, e.Path)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("%s: no such file, nor a model of that name in %s", name, dir)
	}
	return "", fmt.Errorf("%s: several models match in %s: %s", name, dir, strings.Join(found, ", "))
}
