package kvstore

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvlm/kvlm/internal/redistest"
)

// TestRedisOptions: bad URLs and option combinations are refused with a
// one-line error saying what is wrong; good ones set what they say.
func TestRedisOptions(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o644)
	bad := []struct {
		name string
		o    Options
		want string
	}{
		{"http scheme", Options{URL: "http://127.0.0.1:6379"}, "must be redis://host:port or rediss://"},
		{"no scheme", Options{URL: "127.0.0.1:6379"}, "must be redis://host:port"},
		{"empty", Options{URL: ""}, "must be redis://host:port"},
		{"no port", Options{URL: "redis://127.0.0.1"}, "must name a host and a port"},
		{"no host", Options{URL: "redis://:6379"}, "must name a host and a port"},
		{"bad db", Options{URL: "redis://127.0.0.1:6379/x"}, "bad URL"},
		{"query", Options{URL: "redis://127.0.0.1:6379?dial_timeout=1s"}, "must not carry a query"},
		{"bad escape", Options{URL: "redis://127.0.0.1:6379/%zz"}, "bad URL"},
		{"two passwords", Options{URL: "redis://u:secret@127.0.0.1:6379", Password: "other"}, "password is given both"},
		{"CA without TLS", Options{URL: "redis://127.0.0.1:6379", TLSCAFile: notPEM}, "needs a rediss:// URL"},
		{"server name without TLS", Options{URL: "redis://127.0.0.1:6379", TLSServerName: "x"}, "needs a rediss:// URL"},
		{"missing CA file", Options{URL: "rediss://127.0.0.1:6379", TLSCAFile: filepath.Join(dir, "none.pem")}, "TLS CA file"},
		{"CA not PEM", Options{URL: "rediss://127.0.0.1:6379", TLSCAFile: notPEM}, "holds no PEM certificate"},
		{"negative timeout", Options{URL: "redis://127.0.0.1:6379", Timeout: -time.Second}, "must not be negative"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			_, err := OpenRedis(c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%v, want one line saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
	good := []struct {
		name                 string
		o                    Options
		password, serverName string
		db                   int
		tls                  bool
	}{
		{"plain", Options{URL: "redis://127.0.0.1:6379"}, "", "", 0, false},
		{"db and URL password", Options{URL: "redis://u:pw@127.0.0.1:6379/3"}, "pw", "", 3, false},
		{"password option", Options{URL: "redis://127.0.0.1:6379", Password: "pw2"}, "pw2", "", 0, false},
		{"TLS", Options{URL: "rediss://cache.example:6380"}, "", "cache.example", 0, true},
		{"TLS server name", Options{URL: "rediss://10.0.0.1:6380", TLSServerName: "cache.example"}, "", "cache.example", 0, true},
	}
	for _, c := range good {
		t.Run(c.name, func(t *testing.T) {
			ro, err := redisOptions(c.o)
			if err != nil {
				t.Fatal(err)
			}
			if ro.Password != c.password || ro.DB != c.db || (ro.TLSConfig != nil) != c.tls {
				t.Fatalf("password %q db %d TLS %v; want %q %d %v", ro.Password, ro.DB, ro.TLSConfig != nil, c.password, c.db, c.tls)
			}
			if c.tls && ro.TLSConfig.ServerName != c.serverName {
				t.Fatalf("server name %q, want %q", ro.TLSConfig.ServerName, c.serverName)
			}
			if ro.ReadTimeout != DefaultTimeout || ro.MaxRetries != -1 || ro.DialerRetries != 1 || !ro.ContextTimeoutEnabled {
				t.Fatalf("timeouts %s, retries %d, context timeouts %v", ro.ReadTimeout, ro.MaxRetries, ro.ContextTimeoutEnabled)
			}
		})
	}
}

func openRedis(t *testing.T, o Options) *Redis {
	t.Helper()
	r, err := OpenRedis(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func checkGetPut(t *testing.T, r *Redis) {
	t.Helper()
	ctx := context.Background()
	if err := r.Put(ctx, []string{"k1", "k2"}, [][]byte{[]byte("one"), {0, 1, 2, 255}}); err != nil {
		t.Fatal(err)
	}
	got, err := r.Get(ctx, []string{"k1", "missing", "k2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got[0]) != "one" || got[1] != nil || !bytes.Equal(got[2], []byte{0, 1, 2, 255}) {
		t.Fatalf("got %q", got)
	}
}

// TestRedisGetPut: values round-trip through a real redis-server, a
// missing key reads nil; with the server killed, Get and Put fail within
// the timeout; restarted, they work again.
func TestRedisGetPut(t *testing.T) {
	srv := redistest.Start(t)
	r := openRedis(t, Options{URL: srv.URL(), Timeout: 200 * time.Millisecond})
	if err := r.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkGetPut(t, r)
	srv.Kill()
	t0 := time.Now()
	if _, err := r.Get(context.Background(), []string{"k1"}); err == nil {
		t.Fatal("Get with the server killed: no error")
	}
	if err := r.Put(context.Background(), []string{"k1"}, [][]byte{nil}); err == nil {
		t.Fatal("Put with the server killed: no error")
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("Get and Put with the server killed took %s", d)
	}
	srv.Restart()
	checkGetPut(t, r)
}

// TestRedisPassword: a server with requirepass refuses a client without
// the password and takes one with it in the URL or in Options.Password.
func TestRedisPassword(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret")
	if err := openRedis(t, Options{URL: srv.URL()}).Ping(context.Background()); err == nil {
		t.Fatal("no password: no error")
	}
	if err := openRedis(t, Options{URL: srv.URL(), Password: "wrong"}).Ping(context.Background()); err == nil {
		t.Fatal("a wrong password: no error")
	}
	checkGetPut(t, openRedis(t, Options{URL: "redis://:s3cret@" + srv.Addr()}))
	checkGetPut(t, openRedis(t, Options{URL: srv.URL(), Password: "s3cret"}))
}

// TestRedisTLS: redis-server on a TLS port with a certificate of a CA made
// here; the client reaches it with rediss://, the CA file and the
// certificate's name, and not without the CA or with another name.
func TestRedisTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeCerts(t, dir, "kv.test")
	port := redistest.FreePort(t)
	srv := redistest.Start(t, "--port", "0", "--tls-port", strconv.Itoa(port), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	url := "rediss://" + srv.Addr()
	checkGetPut(t, openRedis(t, Options{URL: url, TLSCAFile: caFile, TLSServerName: "kv.test", Timeout: time.Second}))
	for _, c := range []struct {
		name string
		o    Options
	}{
		{"system CAs", Options{URL: url, TLSServerName: "kv.test", Timeout: time.Second}},
		{"another name", Options{URL: url, TLSCAFile: caFile, TLSServerName: "other.test", Timeout: time.Second}},
		{"plain client on the TLS port", Options{URL: "redis://" + srv.Addr(), Timeout: time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := openRedis(t, c.o).Ping(context.Background()); err == nil {
				t.Fatal("connected")
			}
		})
	}
}

// writeCerts writes a CA and a server certificate for name (and
// 127.0.0.1) signed by it, PEM, and returns their paths.
func writeCerts(t *testing.T, dir, name string) (ca, cert, key string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvlm test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(file, kind string, der []byte) string {
		p := filepath.Join(dir, file)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}
