package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/server"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
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
	fl.StringVarP(&f.model, "model", "m", "", "model file: GGUF, or a llama2.c checkpoint (then --tokenizer)")
	fl.StringVar(&f.tokenizer, "tokenizer", "", "llama2.c tokenizer.bin (required for llama2.c checkpoints, overrides a GGUF's)")
	fl.BoolVar(&f.mmap, "mmap", false, mmapUsage)
	fl.StringVar(&f.kvMem, "kv-mem", "", "KV byte budget of all sequences together, e.g. 256MiB (default: --max-running full contexts, at most 4GiB)")
	fl.StringVar(&f.kvType, "kv-type", "f32", "default KV codec for keys and values (a request's kv.type_k/type_v may choose others)")
	fl.StringVar(&f.kvTypeK, "kv-type-k", "", "default codec of the keys (overrides --kv-type)")
	fl.StringVar(&f.kvTypeV, "kv-type-v", "", "default codec of the values (overrides --kv-type)")
	fl.IntVar(&f.kvBlock, "kv-block", kvcache.DefaultBlockTokens, "KV cache block size in tokens")
	fl.BoolVar(&f.keyShift, "kv-key-shift", true, "store q8/q4 keys around the model's mean keys (estimated once from a text the model writes from BOS; see docs/KVCACHE.md)")
	fl.IntVar(&f.maxRunning, "max-running", 32, "sequences decoded together at most (the batch)")
	fl.IntVar(&f.maxQueue, "max-queue", 256, "requests waiting at most; more are refused with 429")
	fl.IntVar(&f.chunk, "chunk", model.DefaultChunk, "prompt tokens prefilled per scheduler step, between decode steps")
	fl.StringVar(&f.template, "chat-template", "", "chat template: "+strings.Join(server.TemplateNames(), ", ")+" (default: from the GGUF metadata; plain for llama2.c checkpoints)")
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
	var addr, name, slotDir, maxBody string
	c := &cobra.Command{
		Use:   "serve -m MODEL [--addr 127.0.0.1:8080]",
		Short: "Serve an OpenAI-compatible API with continuous batching and per-request KV policies",
		Long: `Serve the model over HTTP: POST /v1/completions and /v1/chat/completions
(stream: true for server-sent events), GET /v1/models, /health, /metrics
(Prometheus, with the vllm:* names gateways scrape) and slot files
(POST /v1/slots/{id}?action=save|restore|erase with --slot-dir).

A request may choose its KV cache with a "kv" object, e.g.
  {"kv": {"policy": "snapkv", "ratio": 0.25, "type_k": "q8", "type_v": "q8"}}
(policy, budget, ratio, window, sinks, every, positions, agg, pool, kernel,
type, type_k, type_v, slot, cache_prompt). A field the policy does not use
is refused with 400, as is a policy that could not run; every: 0 prunes
only after the prompt.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.model == "" {
				return errors.New("no model given: use -m MODEL")
			}
			cfg, err := f.engineConfig()
			if err != nil {
				return err
			}
			limit, err := parseBytes(maxBody)
			if err != nil {
				return fmt.Errorf("--max-body: %w", err)
			}
			if slotDir != "" {
				if st, err := os.Stat(slotDir); err != nil || !st.IsDir() {
					return fmt.Errorf("--slot-dir %s is not a directory", slotDir)
				}
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
			srv, err := server.New(m, tok, cfg, server.Options{ModelName: name, MaxBody: limit, SlotDir: slotDir, Format: format,
				Logger: log.New(stderr, "", log.LstdFlags)})
			if err != nil {
				return err
			}
			defer srv.Close()
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
				ErrorLog: log.New(stderr, "kvlm http: ", log.LstdFlags)}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			done := make(chan error, 1)
			go func() { done <- hs.Serve(ln) }()
			ec := srv.Engine().Config()
			fmt.Fprintf(stderr, "kvlm: serving %s (chat template %s, by %s; KV budget %s, %s/%s, batch %d, queue %d)\n",
				name, format.Name(), how, humanBytes(srv.Engine().Budget()), ec.K, ec.V, ec.MaxRunning, ec.MaxQueue)
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
	fl := c.Flags()
	fl.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on (port 0: any free port)")
	fl.StringVar(&name, "served-model-name", "", "model name in the API (default: the file name without extension)")
	fl.StringVar(&slotDir, "slot-dir", "", "directory of slot files for /v1/slots/{id}?action=save|restore (default: disabled)")
	fl.StringVar(&maxBody, "max-body", "1MiB", "largest request body accepted")
	return c
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
