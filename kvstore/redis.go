package kvstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultTimeout bounds one store operation (a lookup's round trip, a
// batch of writes) when Options.Timeout is zero.
const DefaultTimeout = 50 * time.Millisecond

// Options says how to reach a Redis server.
type Options struct {
	// URL is redis://[user:password@]host:port[/db], or rediss://… for
	// TLS.
	URL string
	// Password, if set, is the password (AUTH) when the URL carries none;
	// a URL with a password and Password set both is an error.
	Password string
	// TLSCAFile, if set, is a PEM file of the certificate authorities
	// that sign the server's certificate (default: the system's); only
	// with rediss://.
	TLSCAFile string
	// TLSServerName, if set, is the name the server's certificate must
	// hold (default: the URL's host); only with rediss://.
	TLSServerName string
	// Timeout bounds each operation: connecting, one pipelined read, one
	// pipelined write (DefaultTimeout when zero).
	Timeout time.Duration
}

// Redis is a Store on a Redis server (go-redis). Values are written with
// SET and no expiry: the server's maxmemory and maxmemory-policy
// allkeys-lru bound the tier (docs/KVSTORE.md).
type Redis struct {
	c       *redis.Client
	timeout time.Duration
}

var _ Store = (*Redis)(nil)

// redisOptions checks o and turns it into go-redis options.
func redisOptions(o Options) (*redis.Options, error) {
	if o.Timeout < 0 {
		return nil, fmt.Errorf("kv store: the timeout must not be negative, got %s", o.Timeout)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if !strings.HasPrefix(o.URL, "redis://") && !strings.HasPrefix(o.URL, "rediss://") {
		return nil, fmt.Errorf("kv store: the URL must be redis://host:port or rediss://host:port (TLS), got %q", redact(o.URL))
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("kv store: bad URL %q: %v", redact(o.URL), errors.Unwrap(err))
	}
	if u.Hostname() == "" || u.Port() == "" {
		return nil, fmt.Errorf("kv store: the URL %q must name a host and a port", redact(o.URL))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("kv store: the URL %q must not carry a query or a fragment (use the --kv-store-* flags)", redact(o.URL))
	}
	ro, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("kv store: bad URL %q: %v", redact(o.URL), err)
	}
	if o.Password != "" {
		if ro.Password != "" {
			return nil, errors.New("kv store: a password is given both in the URL and as --kv-store-password (or $KVLM_KV_STORE_PASSWORD): give one")
		}
		ro.Password = o.Password
	}
	tlsOn := u.Scheme == "rediss"
	if !tlsOn && (o.TLSCAFile != "" || o.TLSServerName != "") {
		return nil, errors.New("kv store: a TLS CA file or server name needs a rediss:// URL")
	}
	if tlsOn {
		if ro.TLSConfig == nil {
			ro.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()}
		}
		if o.TLSServerName != "" {
			ro.TLSConfig.ServerName = o.TLSServerName
		}
		if o.TLSCAFile != "" {
			pem, err := os.ReadFile(o.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("kv store: TLS CA file: %v", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("kv store: TLS CA file %s holds no PEM certificate", o.TLSCAFile)
			}
			ro.TLSConfig.RootCAs = pool
		}
	}
	ro.DialTimeout, ro.ReadTimeout, ro.WriteTimeout = o.Timeout, o.Timeout, o.Timeout
	ro.ContextTimeoutEnabled = true // a lookup's deadline bounds its socket reads and writes
	ro.MaxRetries = -1              // no retries: a failed operation is a miss, counted
	ro.DialerRetries = 1            // one dial, no 5 attempts 100ms apart
	ro.PoolTimeout = o.Timeout
	return ro, nil
}

// redact hides a URL's password in messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if i := strings.LastIndex(s, "@"); i >= 0 {
			if j := strings.Index(s, "://"); j >= 0 && j < i {
				return s[:j+3] + "…@" + s[i+1:]
			}
		}
		return s
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// OpenRedis checks o and makes a client. It does not connect: a server
// down now is a miss at each lookup until it is up, not an error here.
func OpenRedis(o Options) (*Redis, error) {
	ro, err := redisOptions(o)
	if err != nil {
		return nil, err
	}
	quietOnce.Do(func() { redis.SetLogger(&quietLogger{}) })
	return &Redis{c: redis.NewClient(ro), timeout: ro.ReadTimeout}, nil
}

// Ping checks the server answers (kvlm serve logs it at start).
func (r *Redis) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	return r.c.Ping(ctx).Err()
}

// Get reads keys in one pipeline (one round trip).
func (r *Redis) Get(ctx context.Context, keys []string) ([][]byte, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := r.c.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([][]byte, len(keys))
	for i, c := range cmds {
		b, err := c.Bytes()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, err
		default:
			out[i] = b
		}
	}
	return out, nil
}

// Put writes vals under keys in one pipeline of SETs, with no expiry.
func (r *Redis) Put(ctx context.Context, keys []string, vals [][]byte) error {
	if len(keys) != len(vals) {
		return fmt.Errorf("kv store: %d keys and %d values", len(keys), len(vals))
	}
	if len(keys) == 0 {
		return nil
	}
	pipe := r.c.Pipeline()
	for i, k := range keys {
		pipe.Set(ctx, k, vals[i], 0)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// quietLogger is go-redis's logger: a server down makes its connection
// pool log every failed dial; the failures are counted
// (kvlm_kv_store_errors_total), so one line every ten seconds at most is
// printed.
type quietLogger struct {
	mu   sync.Mutex
	last time.Time
}

var quietOnce sync.Once

func (l *quietLogger) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Since(l.last) < 10*time.Second {
		return
	}
	l.last = time.Now()
	log.Printf("kvlm kv store: "+format+" (more such messages in the next 10s are not shown)", v...)
}

// Close closes the client's connections.
func (r *Redis) Close() error { return r.c.Close() }
