package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/kvstore"
	"github.com/spf13/cobra"
)

// storeFlags are kvlm serve's shared KV tier flags (docs/KVSTORE.md).
type storeFlags struct {
	url, password, ca, serverName string
	timeout                       time.Duration
	queue, fetch                  string
}

// storeFlagNames are the flags that mean nothing without --kv-store.
var storeFlagNames = []string{"kv-store-password", "kv-store-tls-ca", "kv-store-tls-server-name", "kv-store-timeout", "kv-store-queue", "kv-store-fetch-mem"}

func (f *storeFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.url, "kv-store", "", "shared KV tier: redis://[user:password@]host:port[/db], or rediss://… for TLS; full prefix blocks are written there and read back by every replica sharing it (docs/KVSTORE.md; default: none)")
	fl.StringVar(&f.password, "kv-store-password", "", "password of the --kv-store server when its URL has none (default: $KVLM_KV_STORE_PASSWORD)")
	fl.StringVar(&f.ca, "kv-store-tls-ca", "", "PEM file of the CAs that sign the --kv-store server's certificate (rediss:// only; default: the system's)")
	fl.StringVar(&f.serverName, "kv-store-tls-server-name", "", "name the --kv-store server's certificate must hold (rediss:// only; default: the URL's host)")
	fl.DurationVar(&f.timeout, "kv-store-timeout", kvstore.DefaultTimeout, "longest time one --kv-store operation may take (a lookup's round trip, a batch of writes); past it: a miss, counted")
	fl.StringVar(&f.queue, "kv-store-queue", "64MiB", "bytes of --kv-store writes queued at most; more are dropped and counted, never waited for")
	fl.StringVar(&f.fetch, "kv-store-fetch-mem", "64MiB", "bytes of blocks read from --kv-store that queued requests may hold until they start, all together; past it a lookup stops and the rest of its prompt is computed")
}

// open checks the flags and, with --kv-store, makes the store and sets
// cfg's store fields; nil without --kv-store.
func (f *storeFlags) open(cmd *cobra.Command, cfg *engine.Config) (*kvstore.Redis, error) {
	if f.url == "" {
		for _, n := range storeFlagNames {
			if cmd.Flags().Changed(n) {
				return nil, fmt.Errorf("--%s needs --kv-store", n)
			}
		}
		return nil, nil
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("--kv-store-timeout must be positive, got %s", f.timeout)
	}
	q, err := parseBytes(f.queue)
	if err != nil {
		return nil, fmt.Errorf("--kv-store-queue: %w", err)
	}
	if q <= 0 {
		return nil, fmt.Errorf("--kv-store-queue must be positive, got %s", f.queue)
	}
	fm, err := parseBytes(f.fetch)
	if err != nil {
		return nil, fmt.Errorf("--kv-store-fetch-mem: %w", err)
	}
	if fm <= 0 {
		return nil, fmt.Errorf("--kv-store-fetch-mem must be positive, got %s", f.fetch)
	}
	pw := f.password
	if !cmd.Flags().Changed("kv-store-password") {
		pw = os.Getenv("KVLM_KV_STORE_PASSWORD")
	}
	st, err := kvstore.OpenRedis(kvstore.Options{URL: f.url, Password: pw, TLSCAFile: f.ca, TLSServerName: f.serverName, Timeout: f.timeout})
	if err != nil {
		return nil, fmt.Errorf("--kv-store: %w", err)
	}
	cfg.Store, cfg.StoreTimeout, cfg.StoreQueue, cfg.StoreFetchBytes = st, f.timeout, q, fm
	return st, nil
}

// ping says at start whether the store answers; one that does not is not
// an error (every lookup is a miss until it does).
func pingStore(st *kvstore.Redis, w io.Writer) {
	if st == nil {
		return
	}
	if err := st.Ping(context.Background()); err != nil {
		fmt.Fprintf(w, "kvlm: warning: the KV store does not answer (%v): prompts are computed until it does\n", err)
		return
	}
	fmt.Fprintln(w, "kvlm: KV store connected")
}
