package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvevents"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/server"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// serveFlags are the flags of kvlm serve (and the engine part of kvlm chat).
type serveFlags struct {
	model, tokenizer string
	kvMem            string
	kvType           string
	kvTypeK, kvTypeV string
	kvBlock          int
	maxRunning       int
	maxQueue         int
	chunk            int
	template         string
	keyShift         bool
	mmap             bool
}

func (f *serveFlags) register(c *cobra.Command) {
	fl := c.Flags()
	f.registerShared(c)
	fl.StringVar(&f.kvMem, "kv-mem", "", "KV memory of all sequences and codec pools together, cached prefixes included, e.g. 256MiB (default: --max-running full contexts, at most 4GiB)")
	fl.StringVar(&f.kvType, "kv-type", "f32", "default KV codec for keys and values (a request's kv.type_k/type_v may choose others)")
	fl.StringVar(&f.kvTypeK, "kv-type-k", "", "default codec of the keys (overrides --kv-type)")
	fl.StringVar(&f.kvTypeV, "kv-type-v", "", "default codec of the values (overrides --kv-type)")
	fl.IntVar(&f.maxRunning, "max-running", 32, "sequences decoded together at most (the batch; each sample of an n > 1 request counts)")
	fl.IntVar(&f.maxQueue, "max-queue", 256, "requests waiting at most; more are refused with 429 and Retry-After")
	fl.IntVar(&f.chunk, "chunk", model.DefaultChunk, "prompt tokens prefilled per scheduler step, between decode steps")
}

// registerShared registers the flags kvlm serve and kvlm chat take in the
// same words: the model, its KV block size and key shift, the template.
func (f *serveFlags) registerShared(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVarP(&f.model, "model", "m", "", "model file: GGUF, or a llama2.c checkpoint (then --tokenizer)")
	fl.StringVar(&f.tokenizer, "tokenizer", "", "llama2.c tokenizer.bin (required for llama2.c checkpoints, overrides a GGUF's)")
	fl.BoolVar(&f.mmap, "mmap", false, mmapUsage)
	fl.IntVar(&f.kvBlock, "kv-block", kvcache.DefaultBlockTokens, "KV cache block size in tokens")
	fl.BoolVar(&f.keyShift, "kv-key-shift", true, "store q8/q4 keys around the model's mean keys (estimated once from a text the model writes from BOS; see docs/KVCACHE.md)")
	fl.StringVar(&f.template, "chat-template", "", "built-in chat format to use instead of the model's: "+strings.Join(server.TemplateNames(), ", ")+" (default: the GGUF's tokenizer.chat_template, rendered by a Jinja engine as Hugging Face does; for a GGUF without one, a built-in format chosen by architecture; plain for llama2.c checkpoints and GGUFs converted from them)")
}

func (f *serveFlags) engineConfig() (engine.Config, error) {
	cfg := engine.Config{BlockTokens: f.kvBlock, K: f.kvType, V: f.kvType, MaxRunning: f.maxRunning, MaxQueue: f.maxQueue, PrefillChunk: f.chunk}
	if f.kvTypeK != "" {
		cfg.K = f.kvTypeK
	}
	if f.kvTypeV != "" {
		cfg.V = f.kvTypeV
	}
	switch {
	case f.kvBlock <= 0:
		return cfg, fmt.Errorf("--kv-block must be positive, got %d", f.kvBlock)
	case f.maxRunning <= 0:
		return cfg, fmt.Errorf("--max-running must be positive, got %d", f.maxRunning)
	case f.maxQueue <= 0:
		return cfg, fmt.Errorf("--max-queue must be positive, got %d", f.maxQueue)
	case f.chunk <= 0:
		return cfg, fmt.Errorf("--chunk must be positive, got %d", f.chunk)
	}
	if f.kvMem != "" {
		n, err := parseBytes(f.kvMem)
		if err != nil {
			return cfg, fmt.Errorf("--kv-mem: %w", err)
		}
		cfg.KVMem = n
	}
	return cfg, nil
}

func newServe() *cobra.Command {
	var f serveFlags
	var sf storeFlags
	var addr, name, slotDir, maxBody, apiKey string
	var allowedHosts []string
	var headerTimeout, bodyTimeout, idleTimeout, writeTimeout time.Duration
	var maxConns int
	var ev kvEventFlags
	c := &cobra.Command{
		Use:   "serve -m MODEL [--addr 127.0.0.1:8080]",
		Short: "Serve an OpenAI-compatible API with continuous batching and per-request KV policies",
		Long: `Serve the model over HTTP: POST /v1/completions and /v1/chat/completions
(stream: true for server-sent events), GET /v1/models, /health, /metrics
(Prometheus, with the vllm:* names gateways scrape), POST
/reset_prefix_cache and slot files (POST /v1/slots/{id}?action=save|restore|erase
with --slot-dir). --kv-events publishes the prefix cache's blocks as vLLM's
KV events (docs/KVEVENTS.md).

A request may choose its KV cache with a "kv" object, e.g.
  {"kv": {"policy": "snapkv", "ratio": 0.25, "type_k": "q8", "type_v": "q8"}}
(policy, budget, ratio, window, sinks, every, positions, agg, pool, kernel,
type, type_k, type_v, slot, cache_prompt, prefix, prefix_tokens, truncate).
A field the policy does not use is refused with 400, as is a policy that
could not run; every: 0 prunes only after the prompt. kv.prefix (text the prompt
begins with) or kv.prefix_tokens compresses that document on its own, once
for every question that follows it; a window method (window, streaming,
lminfinite) reads a prompt longer than the context token by token; a chat
with kv.truncate drops its oldest whole turns, the system message kept,
to fit (docs/PREFIX.md).

With --api-key (or $KVLM_API_KEY) every endpoint but /health needs
"Authorization: Bearer KEY". Requests that are not GET must be
Content-Type: application/json, and the Host header must name the server:
localhost or a loopback IP on a loopback address; on other addresses also
any IP, and the names of --allowed-hosts ("*": any).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.model == "" {
				return errors.New("no model given: use -m MODEL")
			}
			cfg, err := f.engineConfig()
			if err != nil {
				return err
			}
			store, err := sf.open(cmd, &cfg)
			if err != nil {
				return err
			}
			if store != nil {
				defer store.Close() // after the engine flushed its writes (srv.Close)
			}
			// The KV event sockets first: a bad or busy address fails
			// before the model loads.
			pub, err := ev.start(cmd.Flags(), cfg.BlockTokens)
			if err != nil {
				return err
			}
			if pub != nil {
				defer pub.Close() // after srv.Close (deferred later, run first)
			}
			limit, err := parseBytes(maxBody)
			if err != nil {
				return fmt.Errorf("--max-body: %w", err)
			}
			for _, t := range []struct {
				name string
				v    *time.Duration
			}{{"--header-timeout", &headerTimeout}, {"--body-timeout", &bodyTimeout}, {"--idle-timeout", &idleTimeout}, {"--write-timeout", &writeTimeout}} {
				switch {
				case *t.v < 0:
					return fmt.Errorf("%s must not be negative, got %s", t.name, *t.v)
				case *t.v == 0:
					*t.v = -1 // none
				}
			}
			if maxConns < 0 {
				return fmt.Errorf("--max-conns must not be negative, got %d", maxConns)
			}
			if !cmd.Flags().Changed("api-key") {
				apiKey = os.Getenv("KVLM_API_KEY")
			}
			if strings.TrimSpace(apiKey) != apiKey || strings.ContainsAny(apiKey, "\r\n") {
				return errors.New("--api-key must not start or end with spaces, nor hold line breaks")
			}
			if slotDir != "" {
				if st, err := os.Stat(slotDir); err != nil || !st.IsDir() {
					return fmt.Errorf("--slot-dir %s is not a directory", slotDir)
				}
			}
			if f.model, err = resolveModel(f.model); err != nil {
				return err
			}
			m, tok, err := loadModel(f.model, f.tokenizer, f.mmap)
			if err != nil {
				return err
			}
			defer m.Close()
			cfg.KeyShiftPrompt = f.keyShiftPrompt(tok)
			format, how, err := server.ChooseFormat(f.model, tok, f.template)
			if err != nil {
				return err
			}
			if name == "" {
				name = strings.TrimSuffix(filepath.Base(f.model), filepath.Ext(f.model))
			}
			stderr := cmd.ErrOrStderr()
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			ln = server.LimitListener(ln, maxConns)
			defer ln.Close()
			srv, err := server.New(m, tok, cfg, server.Options{ModelName: name, MaxBody: limit, SlotDir: slotDir, Format: format,
				Logger: log.New(stderr, "", log.LstdFlags), APIKey: apiKey, ListenAddr: ln.Addr().String(), AllowedHosts: allowedHosts,
				HeaderTimeout: headerTimeout, BodyTimeout: bodyTimeout, IdleTimeout: idleTimeout, WriteTimeout: writeTimeout,
				KVEvents: pub})
			if err != nil {
				return err
			}
			defer srv.Close()
			pingStore(store, stderr)
			hs := srv.HTTPServer(log.New(stderr, "kvlm http: ", log.LstdFlags))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			done := make(chan error, 1)
			go func() { done <- hs.Serve(ln) }()
			ec := srv.Engine().Config()
			fmt.Fprintf(stderr, "kvlm: serving %s (chat template %s, by %s; KV budget %s, %s/%s, batch %d, queue %d)\n",
				name, format.Name(), how, humanBytes(srv.Engine().Budget()), ec.K, ec.V, ec.MaxRunning, ec.MaxQueue)
			if apiKey == "" && !server.Loopback(ln.Addr().String()) {
				fmt.Fprintf(stderr, "kvlm: warning: listening on %s, not loopback, without --api-key: anyone who reaches it can use it\n", ln.Addr())
			}
			if pub != nil {
				where := fmt.Sprintf("on %s", pub.Addr())
				if pub.Config().Connect {
					where = "to " + pub.Config().Endpoint
				}
				fmt.Fprintf(stderr, "kvlm: KV events (%s) %s, topic %q", pub.Config().Format, where, pub.Config().Topic)
				if a := pub.ReplayAddr(); a != nil {
					fmt.Fprintf(stderr, ", replay on %s", a)
				}
				fmt.Fprintln(stderr)
			}
			fmt.Fprintf(stderr, "kvlm: listening on http://%s\n", ln.Addr())
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
			}
			fmt.Fprintln(stderr, "kvlm: shutting down")
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			srv.Close() // ends streams in flight, so Shutdown does not wait on them
			return hs.Shutdown(sctx)
		},
	}
	f.register(c)
	sf.register(c)
	fl := c.Flags()
	fl.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on (port 0: any free port)")
	fl.StringVar(&name, "served-model-name", "", "model name in the API (default: the file name without extension)")
	fl.StringVar(&slotDir, "slot-dir", "", "directory of slot files for /v1/slots/{id}?action=save|restore (default: disabled)")
	fl.StringVar(&maxBody, "max-body", "1MiB", "largest request body accepted")
	fl.StringVar(&apiKey, "api-key", "", "API key every request but /health must send as \"Authorization: Bearer KEY\" (default: $KVLM_API_KEY; none: no key)")
	fl.StringSliceVar(&allowedHosts, "allowed-hosts", nil, "host names accepted in the Host header besides localhost and IP literals (loopback ones only on a loopback --addr), comma-separated (\"*\": any)")
	fl.DurationVar(&headerTimeout, "header-timeout", server.DefaultHeaderTimeout, "longest time to read a request's line and headers (0: none)")
	fl.DurationVar(&bodyTimeout, "body-timeout", server.DefaultBodyTimeout, "longest time to read a request body, after its headers (0: none)")
	fl.DurationVar(&idleTimeout, "idle-timeout", server.DefaultIdleTimeout, "longest time a kept-alive connection waits for its next request (0: none)")
	fl.DurationVar(&writeTimeout, "write-timeout", server.DefaultWriteTimeout, "longest time one write to a client may block (a stream's events one by one; a stream read on is never cut) (0: none)")
	fl.IntVar(&maxConns, "max-conns", server.DefaultMaxConns, "connections served at once; more wait to be accepted (0: no limit)")
	ev.register(c)
	return c
}

// kvEventFlags are kvlm serve's KV event flags (docs/KVEVENTS.md).
type kvEventFlags struct {
	endpoint, replay, topic, format string
	connect                         bool
}

func (f *kvEventFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.endpoint, "kv-events", "", "publish KV cache events as vLLM does (ZeroMQ PUB socket bound at tcp://HOST:PORT, HOST * for every interface; docs/KVEVENTS.md) (default: none)")
	fl.StringVar(&f.topic, "kv-events-topic", kvevents.DefaultTopic, "topic of the KV event messages (llm-d's KV indexer wants kv@POD@MODEL)")
	fl.StringVar(&f.replay, "kv-events-replay", "", "ZeroMQ ROUTER socket bound at tcp://HOST:PORT that replays the last 10000 event batches from a sequence number, as vLLM's replay_endpoint (default: none)")
	fl.BoolVar(&f.connect, "kv-events-connect", false, "connect the PUB socket to --kv-events, where a subscriber binds (llm-d's KV indexer), instead of binding it; retried every second in the background")
	fl.StringVar(&f.format, "kv-events-format", "array", "encoding of each event: array (msgspec array_like, vLLM before PR 42892 and llm-d-kv-cache-manager) or map (field names, vLLM after it)")
}

// start starts the publisher the flags ask for; nil without --kv-events.
// A KV event flag given without --kv-events is an error, not ignored.
func (f *kvEventFlags) start(fl *pflag.FlagSet, blockSize int) (*kvevents.Publisher, error) {
	if f.endpoint == "" {
		for _, name := range []string{"kv-events-replay", "kv-events-topic", "kv-events-format", "kv-events-connect"} {
			if fl.Changed(name) {
				return nil, fmt.Errorf("--%s needs --kv-events", name)
			}
		}
		return nil, nil
	}
	format, err := kvevents.ParseFormat(f.format)
	if err != nil {
		return nil, fmt.Errorf("--kv-events-format: %w", err)
	}
	return kvevents.Start(kvevents.Config{Endpoint: f.endpoint, Connect: f.connect, Replay: f.replay, Topic: f.topic, Format: format, BlockSize: blockSize})
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// keyShiftPrompt is the engine's KeyShiftPrompt: the BOS token (else EOS)
// when --kv-key-shift is on, nil otherwise or when the vocabulary has neither.
func (f *serveFlags) keyShiftPrompt(tok tokenizer.Tokenizer) []int {
	return keyShiftPrompt(f.keyShift, tok)
}

func keyShiftPrompt(on bool, tok tokenizer.Tokenizer) []int {
	if !on {
		return nil
	}
	if b := tok.BOS(); b >= 0 {
		return []int{b}
	}
	if e := tok.EOS(); e >= 0 {
		return []int{e}
	}
	return nil
}
