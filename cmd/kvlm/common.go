package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
)

// modelFlags are the flags every command that loads a model takes.
type modelFlags struct {
	model     string
	tokenizer string
	chunk     int
	kvBlock   int
	kvType    string
	kvTypeK   string
	kvTypeV   string
	kvMem     string
	keyShift  bool
	mmap      bool

	tok      tokenizer.Tokenizer // set by load, for the key means
	keyMeans [][]float32         // computed once, for q8/q4 keys

	lckvPasses int            // --lckv-passes (registerLCKV)
	lckvCmd    *cobra.Command // where it was registered; nil: the command takes none

	pol     policy.Config  // --kv-policy (registerPolicy)
	polVals map[string]any // parameter name → its flag's *int, *float64 or *string
	polCmd  *cobra.Command // where they were registered; nil: the command takes no policy
}

func (f *modelFlags) register(c *cobra.Command) {
	c.Flags().StringVarP(&f.model, "model", "m", "", "model file: GGUF, or a llama2.c checkpoint (then --tokenizer)")
	c.Flags().StringVar(&f.tokenizer, "tokenizer", "", "llama2.c tokenizer.bin (required for llama2.c checkpoints, overrides a GGUF's)")
	c.Flags().BoolVar(&f.mmap, "mmap", false, mmapUsage)
	c.Flags().IntVar(&f.chunk, "chunk", model.DefaultChunk, "prefill chunk: prompt tokens run as one matrix")
	c.Flags().IntVar(&f.kvBlock, "kv-block", kvcache.DefaultBlockTokens, "KV cache block size in tokens")
	c.Flags().StringVar(&f.kvType, "kv-type", "f32", "KV storage codec for keys and values: "+strings.Join(codec.Names, " "))
	c.Flags().StringVar(&f.kvTypeK, "kv-type-k", "", "codec of the keys (overrides --kv-type)")
	c.Flags().StringVar(&f.kvTypeV, "kv-type-v", "", "codec of the values (overrides --kv-type)")
	c.Flags().StringVar(&f.kvMem, "kv-mem", "", "KV block pool size, e.g. 64MiB or 2GiB (default: room for the whole context)")
	c.Flags().BoolVar(&f.keyShift, "kv-key-shift", true, "store q8/q4 keys around the model's mean keys (estimated once from a text the model writes from BOS; see docs/KVCACHE.md)")
}

// registerLCKV adds --lckv-passes, how a Layer-Condensed KV model encodes a
// prompt (model.Sequence.LCKVPasses), for generate and ppl.
func (f *modelFlags) registerLCKV(c *cobra.Command) {
	c.Flags().IntVar(&f.lckvPasses, "lckv-passes", 0, fmt.Sprintf("Layer-Condensed KV models only: encode a prompt chunk (--chunk) in this many parallel passes, the paper's iterative encoding (it uses %d; exact once it reaches the chunk's length), instead of token by token (0: sequential, exact); see docs/ARCHITECTURES.md", model.DefaultLCKVPasses))
	f.lckvCmd = c
}

// lckvGiven reports whether --lckv-passes was given.
func (f *modelFlags) lckvGiven() bool {
	return f.lckvCmd != nil && f.lckvCmd.Flags().Changed("lckv-passes")
}

// registerPolicy adds --kv-policy and one --kv-NAME flag per parameter of
// the policy methods (policy.AllParams: their help and types come from the
// parameter descriptors), for the commands that apply a policy (generate,
// ppl).
func (f *modelFlags) registerPolicy(c *cobra.Command) {
	fl := c.Flags()
	f.polCmd = c
	fl.StringVar(&f.pol.Method, "kv-policy", "full", "KV compression: "+strings.Join(policy.Methods, ", "))
	f.polVals = map[string]any{}
	for _, p := range policy.AllParams() {
		name := strings.TrimPrefix(policy.Flag(p.Name), "--")
		switch p.Kind {
		case policy.IntParam:
			f.polVals[p.Name] = fl.Int(name, 0, p.Help())
		case policy.FloatParam:
			f.polVals[p.Name] = fl.Float64(name, 0, p.Help())
		default:
			f.polVals[p.Name] = fl.String(name, "", p.Help())
		}
	}
}

// policyConfig is the --kv-policy configuration, normalized. A parameter
// flag given that the method does not use is refused (policy.NormalizeGiven).
func (f *modelFlags) policyConfig() (policy.Config, error) {
	c := f.pol
	if f.polCmd == nil {
		return c.Normalize()
	}
	var given []string
	for _, p := range policy.AllParams() {
		if !f.polCmd.Flags().Changed(strings.TrimPrefix(policy.Flag(p.Name), "--")) {
			continue
		}
		var v any
		switch x := f.polVals[p.Name].(type) {
		case *int:
			v = *x
		case *float64:
			v = *x
		case *string:
			v = *x
		}
		if err := p.Set(&c, v); err != nil {
			return c, err
		}
		given = append(given, p.Name)
	}
	return c.NormalizeGiven(given...)
}

// attachPolicy puts the --kv-policy on a sequence (nil for full).
func (f *modelFlags) attachPolicy(seq *model.Sequence) (*policy.State, error) {
	c, err := f.policyConfig()
	if err != nil {
		return nil, err
	}
	if c.Method == "full" {
		return nil, nil
	}
	return policy.New(c, seq)
}

// kvOptions turns the KV flags into cache options.
func (f *modelFlags) kvOptions() (model.KVOptions, error) {
	if f.kvBlock <= 0 {
		return model.KVOptions{}, fmt.Errorf("--kv-block must be positive, got %d", f.kvBlock)
	}
	kn, vn := f.kvType, f.kvType
	if f.kvTypeK != "" {
		kn = f.kvTypeK
	}
	if f.kvTypeV != "" {
		vn = f.kvTypeV
	}
	k, err := codec.Parse(kn, codec.Keys)
	if err != nil {
		return model.KVOptions{}, err
	}
	v, err := codec.Parse(vn, codec.Values)
	if err != nil {
		return model.KVOptions{}, err
	}
	if f.lckvPasses < 0 {
		return model.KVOptions{}, fmt.Errorf("--lckv-passes must be 0 (sequential) or more, got %d", f.lckvPasses)
	}
	opt := model.KVOptions{BlockTokens: f.kvBlock, K: k, V: v, LCKVPasses: f.lckvPasses}
	if f.kvMem != "" {
		if opt.MemBytes, err = parseBytes(f.kvMem); err != nil {
			return opt, fmt.Errorf("--kv-mem: %w", err)
		}
	}
	return opt, nil
}

func (f *modelFlags) load() (*model.Model, tokenizer.Tokenizer, error) {
	if f.model == "" {
		return nil, nil, errors.New("no model given: use -m MODEL")
	}
	if f.chunk <= 0 {
		return nil, nil, errors.New("--chunk must be positive")
	}
	if _, err := f.kvOptions(); err != nil {
		return nil, nil, err
	}
	if _, err := f.policyConfig(); err != nil {
		return nil, nil, err
	}
	p, err := resolveModel(f.model)
	if err != nil {
		return nil, nil, err
	}
	f.model = p
	m, tok, err := loadModel(f.model, f.tokenizer, f.mmap)
	if err == nil && f.lckvGiven() && !m.Condensed() {
		m.Close()
		return nil, nil, fmt.Errorf("--lckv-passes: %s is not a Layer-Condensed KV model (no layer reads a later layer's KV)", f.model)
	}
	f.tok = tok
	return m, tok, err
}

const mmapUsage = "memory-map a GGUF model instead of reading it into memory: starts sooner and shares the page cache, but its weights stay row by row (not in 16-row panels) and decode runs 5-20% slower (docs/PERFORMANCE.md)"

// loadModel opens a model: a GGUF file read into memory, or with mmap
// mapped (--mmap).
func loadModel(path, tokPath string, mmap bool) (*model.Model, tokenizer.Tokenizer, error) {
	if mmap {
		return engine.LoadMapped(path, tokPath)
	}
	return engine.Load(path, tokPath)
}

// withKeyShift adds the model's key means to opt when its key codec
// quantizes per token (q8, q4) and --kv-key-shift is on; they are computed
// once per command.
func (f *modelFlags) withKeyShift(m *model.Model, opt model.KVOptions) (model.KVOptions, error) {
	if opt.K == nil || f.tok == nil || !opt.K.Shiftable() {
		return opt, nil
	}
	prompt := keyShiftPrompt(f.keyShift, f.tok)
	if prompt == nil {
		return opt, nil
	}
	if f.keyMeans == nil {
		km, err := m.KeyMeans(prompt, 0, 1)
		if err != nil {
			return opt, fmt.Errorf("key means for %s keys: %w", opt.K.Name(), err)
		}
		f.keyMeans = km
	}
	opt.KeyShift = f.keyMeans
	return opt, nil
}

func (f *modelFlags) sequence(m *model.Model) (*model.Sequence, error) {
	opt, err := f.kvOptions()
	if err != nil {
		return nil, err
	}
	return f.sequenceWith(m, opt)
}

// sequenceWith starts a standalone sequence with the cache options opt
// (key means added where its key codec wants them) and the --chunk.
func (f *modelFlags) sequenceWith(m *model.Model, opt model.KVOptions) (*model.Sequence, error) {
	opt, err := f.withKeyShift(m, opt)
	if err != nil {
		return nil, err
	}
	seq, err := m.NewStandaloneSequence(opt)
	if err != nil {
		return nil, err
	}
	seq.Chunk = f.chunk
	return seq, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// parseBytes reads a size such as 1048576, 512KiB, 64MiB, 2GiB or 1.5GB.
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	num, mult := strings.TrimSpace(s), 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToLower(num), strings.ToLower(u.suffix)) {
			num, mult = strings.TrimSpace(num[:len(num)-len(u.suffix)]), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || v*mult > 1<<50 {
		return 0, fmt.Errorf("invalid size %q (want e.g. 64MiB or 2GiB)", s)
	}
	return int64(v * mult), nil
}
