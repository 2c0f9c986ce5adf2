package server

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"
)

// The guard runs before any endpoint, in this order:
//
//  1. Host: the Host header must name this server (DNS rebinding). When
//     the server listens on a loopback address: localhost (and
//     *.localhost) or a loopback IP. Otherwise: localhost, any IP literal
//     except the unspecified 0.0.0.0 and [::]. Other names only when
//     listed in Options.AllowedHosts ("*" allows any). A rebinding attack
//     always sends the attacker's domain name, which none of these rules
//     allows.
//  2. Authorization: with Options.APIKey set, every endpoint except
//     /health needs "Authorization: Bearer KEY" (401 otherwise).
//  3. Content-Type: every request other than GET, HEAD and OPTIONS must
//     carry Content-Type: application/json (415 otherwise), so a browser
//     cannot send one without a CORS preflight, which this server never
//     grants: no HTML form or no-cors fetch reaches an endpoint that acts.
//  4. The body is read whole (at most Options.MaxBody bytes) within
//     Options.BodyTimeout (408 past it), before the endpoint runs.

// guard wraps next with the checks above.
func (s *Server) guard(next http.Handler) http.Handler {
	var keySum [sha256.Size]byte
	if s.opt.APIKey != "" {
		keySum = sha256.Sum256([]byte(s.opt.APIKey))
	}
	allowed := map[string]bool{}
	anyHost := false
	for _, h := range s.opt.AllowedHosts {
		h = normalHost(h)
		if h == "*" {
			anyHost = true
		}
		if h != "" {
			allowed[h] = true
		}
	}
	loopback := listensOnLoopback(s.opt.ListenAddr)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.opt.WriteTimeout > 0 {
			dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: s.opt.WriteTimeout}
			defer dw.done()
			w = dw
		}
		rc := http.NewResponseController(w)
		hasBody := r.ContentLength != 0 // -1: unknown length (chunked)
		if hasBody && s.opt.BodyTimeout > 0 {
			// Bounds the reading of the body, here or when the server
			// discards what a handler left unread. Not every ResponseWriter
			// supports it (httptest's recorder): then there is no
			// connection to guard.
			_ = rc.SetReadDeadline(time.Now().Add(s.opt.BodyTimeout))
		}
		refuse := func(aerr *apiError) {
			if hasBody {
				// Do not wait for a body that will not be used.
				_ = rc.SetReadDeadline(time.Now())
				w.Header().Set("Connection", "close")
			}
			writeError(w, aerr)
		}
		if !anyHost && !hostAllowed(r.Host, loopback, allowed) {
			refuse(&apiError{status: http.StatusForbidden, typ: "permission_error", code: "host_not_allowed",
				msg: fmt.Sprintf("Host %q is not allowed; start the server with --allowed-hosts %s to allow it", r.Host, normalHost(r.Host))})
			return
		}
		if s.opt.APIKey != "" && r.URL.Path != "/health" {
			if aerr := checkKey(r.Header.Get("Authorization"), &keySum); aerr != nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="kvlm"`)
				refuse(aerr)
				return
			}
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			next.ServeHTTP(w, r)
			return
		}
		if ct := r.Header.Get("Content-Type"); !isJSON(ct) {
			msg := "Content-Type must be application/json"
			if ct == "" {
				msg += ", got none"
			} else {
				msg += fmt.Sprintf(", got %q", ct)
			}
			refuse(&apiError{status: http.StatusUnsupportedMediaType, msg: msg, typ: "invalid_request_error"})
			return
		}
		body, aerr := s.readBody(w, r)
		if hasBody {
			// Generation may take long: no read deadline past the body.
			// (net/http clears it too when it starts its background read
			// at the body's end; this does not rely on that.)
			_ = rc.SetReadDeadline(time.Time{})
		}
		if aerr != nil {
			refuse(aerr)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// deadlineWriter gives every write and flush of a response WriteTimeout to
// complete: a client that stops reading (a stream it no longer wants, a
// full window it never drains) loses the connection, and its request ends
// and frees its KV memory, instead of holding both forever. A stream that
// the client reads is never cut, however long it runs.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) arm() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) }

func (w *deadlineWriter) Write(b []byte) (int, error) {
	w.arm()
	return w.ResponseWriter.Write(b)
}

func (w *deadlineWriter) Flush() {
	w.arm()
	_ = w.rc.Flush()
}

// done gives what the handler left buffered the deadline for the server's
// last flush (net/http clears the deadline once the response is done).
func (w *deadlineWriter) done() { w.arm() }

func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// isJSON reports whether a Content-Type is application/json (with any
// parameters, such as charset).
func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// checkKey compares a bearer token with the key in constant time (over
// SHA-256 digests, so the key's length does not show either).
func checkKey(header string, keySum *[sha256.Size]byte) *apiError {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if header == "" || !ok || !strings.EqualFold(scheme, "Bearer") {
		return &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
			msg: "You didn't provide an API key. Send it as \"Authorization: Bearer KEY\"."}
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if subtle.ConstantTimeCompare(got[:], keySum[:]) != 1 {
		return &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
			msg: "Incorrect API key provided."}
	}
	return nil
}

// readBody reads the whole body (within the deadline the guard set).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opt.MaxBody))
	if err == nil {
		return b, nil
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, jsonError(err, s.opt.MaxBody)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, &apiError{status: http.StatusRequestTimeout, typ: "invalid_request_error",
			msg: fmt.Sprintf("the request body was not received within %s", s.opt.BodyTimeout)}
	}
	return nil, badRequest("", "cannot read the request body")
}

// normalHost is a Host header or allow-list entry without its port, in
// lower case, without brackets or a trailing dot.
func normalHost(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(h, ".")
}

// hostAllowed applies the Host rule (see the guard's comment).
func hostAllowed(host string, loopback bool, allowed map[string]bool) bool {
	h := normalHost(host)
	switch {
	case h == "":
		return false
	case allowed[h]:
		return true
	case h == "localhost" || strings.HasSuffix(h, ".localhost"):
		return true
	}
	ip, err := netip.ParseAddr(h)
	if err != nil {
		return false
	}
	if loopback {
		return ip.IsLoopback()
	}
	return !ip.IsUnspecified()
}

// listensOnLoopback reports whether addr (host:port, as a listener reports
// it) is a loopback address; "" counts as loopback, the strictest rule.
func listensOnLoopback(addr string) bool {
	if addr == "" {
		return true
	}
	h := normalHost(addr)
	if h == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.IsLoopback()
}

// Loopback reports whether a listen address (host:port) is on loopback;
// an empty host or 0.0.0.0 is not.
func Loopback(addr string) bool {
	if h := normalHost(addr); h == "" {
		return false
	}
	return listensOnLoopback(addr)
}
