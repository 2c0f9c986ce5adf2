// Package hub downloads model files into the local model directory: from
// the Hugging Face hub (hf://OWNER/REPO/FILE) or any http(s) URL, resumably,
// checking the size and the sha256 the hub publishes for LFS files, with
// timeouts on every stage of a request so that a stalled server gives an
// error, never a hang.
//
// Layout of the model directory: a hub file goes to
// hf/OWNER/REPO/REV/FILE (REV as asked for, path-escaped: main, v1.0, a
// commit), a URL to url/HOST/PATH (HOST_PORT with a port; a query string
// adds a q-HASH folder before the file name), so that files of the same name
// in different repositories, revisions or places never collide.
package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvlm/kvlm/internal/progress"
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
	// separated): hf/OWNER/REPO/REV/FILE for the hub, url/HOST/PATH for a
	// URL.
	Rel string
	// Legacy is where the layout before revisions were kept put it
	// (OWNER/REPO/FILE, HOST/NAME): Pull moves a file found there into Rel
	// when it matches a known sha256.
	Legacy string
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
	// A hub URL: OWNER/REPO/{resolve,blob}/REV/FILE on the hub's host. The
	// escaped path is split, so that a revision such as refs%2Fpr%2F1
	// stays one segment.
	if ep, err := url.Parse(Endpoint()); err == nil && u.Host == ep.Host {
		p := strings.TrimPrefix(strings.TrimPrefix(u.EscapedPath(), strings.TrimRight(ep.EscapedPath(), "/")), "/")
		parts := strings.SplitN(p, "/", 5)
		if len(parts) == 5 && (parts[2] == "resolve" || parts[2] == "blob") {
			segs := make([]string, 4)
			for i, e := range []string{parts[0], parts[1], parts[3]} {
				if segs[i], err = url.PathUnescape(e); err != nil {
					return Ref{}, fmt.Errorf("hub: %q: %v", s, err)
				}
			}
			var file []string
			for _, e := range strings.Split(parts[4], "/") {
				d, err := url.PathUnescape(e)
				if err != nil {
					return Ref{}, fmt.Errorf("hub: %q: %v", s, err)
				}
				file = append(file, d)
			}
			return hubRef(segs[0], segs[1], segs[2], strings.Join(file, "/"), Endpoint())
		}
	}
	name := path.Base(u.Path)
	if name == "/" || name == "." || name == "" {
		return Ref{}, fmt.Errorf("hub: %q names no file", s)
	}
	host := u.Hostname()
	if p := u.Port(); p != "" {
		host += "_" + p
	}
	rel := "url/" + host + "/" + strings.TrimPrefix(path.Clean("/"+u.Path), "/")
	if u.RawQuery != "" {
		q := sha256.Sum256([]byte(u.RawQuery))
		rel = path.Dir(rel) + "/q-" + hex.EncodeToString(q[:6]) + "/" + name
	}
	r := Ref{URL: u.String(), Rel: rel, Legacy: u.Hostname() + "/" + name}
	if err := checkRel(r.Rel); err != nil {
		return Ref{}, err
	}
	if checkRel(r.Legacy) != nil {
		r.Legacy = ""
	}
	return r, nil
}

func hubRef(owner, repo, rev, file, endpoint string) (Ref, error) {
	r := Ref{Hub: true, Owner: owner, Repo: repo, Rev: rev, File: file,
		Rel:    "hf/" + owner + "/" + repo + "/" + url.PathEscape(rev) + "/" + file,
		Legacy: owner + "/" + repo + "/" + file}
	if err := checkRel(r.Rel); err != nil {
		return Ref{}, err
	}
	if checkRel(r.Legacy) != nil {
		r.Legacy = ""
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

// Timeouts bound each stage of a request, so that a stalled server gives an
// error instead of a hang. A zero field takes DefaultTimeouts' value; a
// negative one means no limit.
type Timeouts struct {
	Connect        time.Duration // TCP connection
	TLSHandshake   time.Duration // TLS handshake
	ResponseHeader time.Duration // from the request sent to the response's headers
	// Idle is the longest wait for the next byte of a body: not a deadline
	// on the whole download, which may legitimately take an hour.
	Idle time.Duration
}

// DefaultTimeouts are the limits Pull uses when none are given.
var DefaultTimeouts = Timeouts{Connect: 30 * time.Second, TLSHandshake: 30 * time.Second, ResponseHeader: 60 * time.Second, Idle: 60 * time.Second}

// withDefaults fills zero fields from DefaultTimeouts and turns negative
// ones into 0 (net/http's "no limit").
func (t Timeouts) withDefaults() Timeouts {
	fill := func(v, d time.Duration) time.Duration {
		switch {
		case v == 0:
			return d
		case v < 0:
			return 0
		}
		return v
	}
	return Timeouts{
		Connect:        fill(t.Connect, DefaultTimeouts.Connect),
		TLSHandshake:   fill(t.TLSHandshake, DefaultTimeouts.TLSHandshake),
		ResponseHeader: fill(t.ResponseHeader, DefaultTimeouts.ResponseHeader),
		Idle:           fill(t.Idle, DefaultTimeouts.Idle),
	}
}

// NewClient is an HTTP client whose connections, TLS handshakes and
// response headers are bounded by t (zero fields: DefaultTimeouts). Idle
// bodies are bounded by Pull itself (Timeouts.Idle). Proxies come from the
// environment, as with http.DefaultTransport.
func NewClient(t Timeouts) *http.Client {
	t = t.withDefaults()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: t.Connect, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = t.TLSHandshake
	tr.ResponseHeaderTimeout = t.ResponseHeader
	return &http.Client{Transport: tr}
}

// Options control a download.
type Options struct {
	Dir string // model directory; "": Dir()
	// Client makes the requests; nil: NewClient(Timeouts). A client given
	// here brings its own connect, TLS and header limits; Timeouts.Idle
	// applies either way.
	Client   *http.Client
	Timeouts Timeouts
	// Progress gets a progress bar when it is a terminal; other writers
	// (logs, pipes) get nothing.
	Progress io.Writer
	Token    string // bearer token for the hub (gated models)
	SHA256   string // expected sha256 (hex), overriding the hub's
	Force    bool   // download even if the file is present
}

// Result says what Pull did.
type Result struct {
	Path     string // the complete file
	Size     int64
	SHA256   string // of the file, when it was hashed ("" when not)
	Verified bool   // the sha256 matched a published or given one
	Resumed  int64  // bytes of an earlier partial download kept
	Skipped  bool   // the file was already present (and matched its sha256 when one is known)
	// Replaced says why a file already present was downloaded again (its
	// size or sha256 differed from the published one); "" when it was not.
	Replaced string
	// Adopted is the old-layout path (OWNER/REPO/FILE, HOST/NAME) the file
	// was moved from, after its sha256 matched, or the old-layout partial
	// download (.part) that was resumed, when a sha256 checks the result;
	// "" when none.
	Adopted string
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
// result is checked; on a mismatch the partial file is deleted. A file
// already present is kept only if it has the published size and, when a
// sha256 is known, that sha256 (it is hashed again each time); otherwise it
// is downloaded again and replaced once the new copy is verified. A file
// found where the old layout put it is moved into place when it matches a
// known sha256.
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
	want := strings.ToLower(opt.SHA256)
	if want != "" && !isSHA256(want) {
		return res, fmt.Errorf("hub: --sha256 %q is not 64 hex digits", opt.SHA256)
	}
	tmo := opt.Timeouts.withDefaults()
	client := opt.Client
	if client == nil {
		client = NewClient(opt.Timeouts)
	}
	dest := filepath.Join(dir, filepath.FromSlash(ref.Rel))
	part := dest + PartSuffix
	res.Path = dest

	rem, err := head(ctx, client, ref, opt.Token)
	if err != nil {
		return res, err
	}
	if want == "" {
		want = rem.sha
	}
	if !opt.Force {
		if st, err := os.Stat(dest); err == nil {
			ok, sum, why, err := present(ctx, dest, st, rem.size, want, opt.Progress)
			if err != nil {
				return res, err
			}
			if ok {
				res.Size, res.Skipped, res.SHA256, res.Verified = st.Size(), true, sum, sum != ""
				return res, nil
			}
			res.Replaced = why
		} else if ok, err := adopt(ctx, dir, ref, dest, rem.size, want, opt.Progress); err != nil {
			return res, err
		} else if ok != "" {
			res.Size, res.Skipped, res.SHA256, res.Verified, res.Adopted = rem.size, true, want, true, ok
			if st, err := os.Stat(dest); err == nil {
				res.Size = st.Size()
			}
			return res, nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return res, fmt.Errorf("hub: %w", err)
	}
	// A partial download the old layout left is resumed here when the
	// result will be checked against a sha256 (the old layout could mix up
	// files of one name, so an unchecked resume could join two files).
	if _, err := os.Stat(part); errors.Is(err, fs.ErrNotExist) && want != "" && ref.Legacy != "" && ref.Legacy != ref.Rel {
		old := filepath.Join(dir, filepath.FromSlash(ref.Legacy)) + PartSuffix
		if st, err := os.Stat(old); err == nil && st.Mode().IsRegular() {
			if err := os.Rename(old, part); err != nil {
				return res, fmt.Errorf("hub: %w", err)
			}
			res.Adopted = old
		}
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
		from, t, err := fetch(ctx, client, ref, opt, tmo.Idle, f, h, have, rem.size)
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

// present says whether the file at p (st) is the one published: the same
// size when the size is known and the same sha256 when want is known. sum
// is its sha256 when it was hashed and matched; why says what differs.
func present(ctx context.Context, p string, st fs.FileInfo, size int64, want string, prog io.Writer) (ok bool, sum, why string, err error) {
	if size >= 0 && st.Size() != size {
		return false, "", fmt.Sprintf("the file present has %d bytes, the server announces %d", st.Size(), size), nil
	}
	if want == "" {
		return true, "", "", nil // nothing to hash it against
	}
	got, err := hashFile(ctx, p, st.Size(), prog)
	if err != nil {
		return false, "", "", err
	}
	if got != want {
		return false, "", fmt.Sprintf("the file present has sha256 %s, want %s", got, want), nil
	}
	return true, got, "", nil
}

// adopt moves a file from the old layout (ref.Legacy) to dest when a sha256
// is known and the file matches it, and returns the path it came from. A
// file that cannot be checked, or does not match, is left where it is.
func adopt(ctx context.Context, dir string, ref Ref, dest string, size int64, want string, prog io.Writer) (string, error) {
	if want == "" || ref.Legacy == "" || ref.Legacy == ref.Rel {
		return "", nil
	}
	old := filepath.Join(dir, filepath.FromSlash(ref.Legacy))
	st, err := os.Stat(old)
	if err != nil || !st.Mode().IsRegular() {
		return "", nil
	}
	ok, _, _, err := present(ctx, old, st, size, want, prog)
	if err != nil || !ok {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return "", fmt.Errorf("hub: %w", err)
	}
	if err := os.Rename(old, dest); err != nil {
		return "", fmt.Errorf("hub: %w", err)
	}
	return old, nil
}

// hashFile is the sha256 of the file at p, with a progress bar on a
// terminal.
func hashFile(ctx context.Context, p string, size int64, prog io.Writer) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("hub: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	bar := progress.New(prog, size, "checking "+filepath.Base(p), true)
	_, err = io.Copy(io.MultiWriter(h, bar), ctxReader{ctx, f})
	bar.Finish(err == nil)
	if err != nil {
		return "", fmt.Errorf("hub: hashing %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ctxReader stops reading once ctx is done (an interrupt while hashing).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
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
		return rem, requestError(ref, http.MethodHead, err)
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
// from and the file's total size (-1 if unknown). The body is abandoned when
// no byte arrives for idle (0: no limit).
func fetch(ctx context.Context, client *http.Client, ref Ref, opt Options, idle time.Duration, f *os.File, h hashWriter, have, size int64) (from, total int64, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := newRequest(ctx, http.MethodGet, ref, opt.Token)
	if err != nil {
		return 0, -1, err
	}
	if have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, -1, requestError(ref, http.MethodGet, err)
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
	bar := progress.New(opt.Progress, total, path.Base(ref.Rel), true)
	bar.Set64(from)
	body := newIdleReader(resp.Body, idle, cancel)
	n, err := io.Copy(io.MultiWriter(f, h, bar), body)
	body.stop()
	bar.Finish(err == nil)
	if err != nil {
		if body.fired.Load() {
			err = fmt.Errorf("no data for %v", idle)
		} else if ctx.Err() != nil && !errors.Is(err, context.Canceled) {
			err = ctx.Err()
		}
		got := from + n
		of := "?"
		if total >= 0 {
			of = strconv.FormatInt(total, 10)
		}
		return from, total, fmt.Errorf("hub: %s: download interrupted after %d of %s bytes (%v); the partial file is kept: pull again to resume", ref.Rel, got, of, err)
	}
	return from, total, nil
}

// idleReader cancels its request when no byte has come for d: a bound on a
// stalled body, not on a long one.
type idleReader struct {
	r     io.Reader
	d     time.Duration
	t     *time.Timer
	fired atomic.Bool
}

func newIdleReader(r io.Reader, d time.Duration, cancel context.CancelFunc) *idleReader {
	ir := &idleReader{r: r, d: d}
	if d > 0 {
		ir.t = time.AfterFunc(d, func() {
			ir.fired.Store(true)
			cancel()
		})
	}
	return ir
}

func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 && r.t != nil && !r.fired.Load() {
		r.t.Reset(r.d)
	}
	return n, err
}

func (r *idleReader) stop() {
	if r.t != nil {
		r.t.Stop()
	}
}

// requestError explains a request that got no response: a timeout names
// the limit that ran out.
func requestError(ref Ref, method string, err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("hub: %s %s: the server did not answer in time (%v)", method, ref.URL, err)
	}
	return fmt.Errorf("hub: %s %s: %w", method, ref.URL, err)
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

// Resolve finds a model given as a path or as a name in the model
// directory. A path that exists wins. Otherwise name is looked for there:
// as a name kvlm list shows (hf/OWNER/REPO/REV/FILE, url/HOST/PATH, or an
// older layout's OWNER/REPO/FILE), as hf://OWNER/REPO[@REV]/FILE or a URL
// (where kvlm pull puts it), as OWNER/REPO/FILE (that file at revision
// main), or as a file name, or the end of a name, that only one model has.
// An unknown name is an error that says how to list and pull models.
func Resolve(name string) (string, error) {
	if name == "" {
		return "", errors.New("no model given")
	}
	if _, err := os.Stat(name); err == nil {
		return name, nil
	}
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	var rels []string
	if checkRel(name) == nil {
		rels = append(rels, name)
	}
	if r, err := Parse(name); err == nil {
		rels = append(rels, r.Rel)
	} else if r, err := Parse("hf://" + name); err == nil {
		rels = append(rels, r.Rel)
	}
	for _, rel := range rels {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	entries, err := List(dir)
	if err != nil {
		return "", err
	}
	var found, partial []string
	for _, e := range entries {
		if e.Rel == name || path.Base(e.Rel) == name || strings.HasSuffix(e.Rel, "/"+name) || slices.Contains(rels, e.Rel) {
			if e.Partial {
				partial = append(partial, e.Path)
			} else {
				found = append(found, e.Path)
			}
		}
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		return "", fmt.Errorf("%s: several models match in %s: %s (give the whole name kvlm list shows)", name, dir, strings.Join(found, ", "))
	case len(partial) > 0:
		return "", fmt.Errorf("%s: only a partial download in %s (%s): kvlm pull it again to finish it", name, dir, strings.Join(partial, ", "))
	}
	return "", fmt.Errorf("%s: no such file, nor a model of that name in %s (kvlm list shows the models there; kvlm pull hf://OWNER/REPO/FILE.gguf downloads one; $KVLM_MODELS moves the directory)", name, dir)
}
