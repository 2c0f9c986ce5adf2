package eval

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/kvcalc"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/tokenizer"
)

// TextSpec is one text of a sweep.
type TextSpec struct {
	Name      string `json:"name"`   // short name for tables and legends
	Path      string `json:"-"`      // where it is read from
	File      string `json:"file"`   // its base name
	Domain    string `json:"domain"` // "in-domain" or "out-of-domain"
	Gutenberg bool   `json:"gutenberg_stripped,omitempty"`
	Bytes     int    `json:"bytes"`  // bytes used (after stripping)
	Tokens    int    `json:"tokens"` // tokens those bytes encode to, BOS included
}

// SweepConfig chooses what a sweep measures. DefaultSweep fills it.
type SweepConfig struct {
	Model     string     `json:"model"`         // model path, for the record
	Tokenizer string     `json:"tokenizer"`     // tokenizer path ("" when the model carries one)
	Text      TextSpec   `json:"text"`          // held-out in-domain text: contexts are drawn from it and it is streamed
	OOD       []TextSpec `json:"out_of_domain"` // streamed only
	Seed      uint64     `json:"seed"`          // seeds the choice of contexts
	Quick     bool       `json:"quick"`

	// Compress-then-continue.
	Contexts   int       `json:"contexts"`    // contexts drawn from the text (one per equal slice of it)
	MinContext int       `json:"min_context"` // prompt tokens, BOS included
	MaxContext int       `json:"max_context"`
	Continue   int       `json:"continue"` // teacher-forced continuation tokens (Continue−1 predictions scored)
	Greedy     int       `json:"greedy"`   // greedy tokens compared with the full cache's
	Ratios     []float64 `json:"ratios"`
	Codecs     []string  `json:"codecs"`  // storage codecs, keys and values alike
	Methods    []string  `json:"methods"` // nil: every policy.Methods entry but full

	// Streaming perplexity.
	StreamTokens int   `json:"stream_tokens"` // tokens streamed through each bounded cache
	DenseTokens  int   `json:"dense_tokens"`  // tokens through the dense cache (O(n²): fewer)
	StreamBudget int   `json:"stream_budget"` // cache size of the bounded methods: sinks + window
	StreamEvery  int   `json:"stream_every"`  // predictions averaged per point of the curves
	Sinks        []int `json:"sinks"`         // streaming's sink counts
	LMInfSinks   int   `json:"lminfinite_sinks"`

	KeptRatio float64 `json:"kept_ratio"` // the kept-token picture's ratio
	Workers   int     `json:"-"`          // trials run at once

	Seeds    []SeedTable `json:"-"` // kvcalc tables for the report, made by the CLI
	Progress Progress    `json:"-"` // may be nil
}

// SeedTable is a `kvlm kvcalc` table for the report.
type SeedTable struct {
	Title   string `json:"title"`
	Command string `json:"command"`
	Output  string `json:"output"`
}

// Progress follows a sweep: Start with the total work, then Add as jobs end.
type Progress interface {
	Start(total int64)
	Add(n int64, what string)
}

// DefaultSweep is the documented sweep; quick is the small one the tests run.
func DefaultSweep(quick bool) SweepConfig {
	c := SweepConfig{
		Seed: 1, Quick: quick,
		Contexts: 16, MinContext: 256, MaxContext: 449, Continue: 32, Greedy: 32,
		Ratios:       []float64{0.5, 0.25, 0.125, 0.0625},
		Codecs:       []string{"f16", "q8", "q4", "kivi2"},
		StreamTokens: 20000, DenseTokens: 4096, StreamBudget: 128, StreamEvery: 250,
		Sinks: []int{1, 2, 4, 8}, LMInfSinks: 4, KeptRatio: 0.25, Workers: 2,
	}
	if quick {
		c.Contexts = 2
		c.Ratios = []float64{0.5, 0.125}
		c.Codecs = []string{"f16", "kivi2"}
		c.StreamTokens, c.DenseTokens, c.StreamEvery = 1200, 1200, 100
		c.Sinks = []int{4}
	}
	return c
}

// Results is what a sweep measured: results.json.
type Results struct {
	Setup    Setup          `json:"setup"`
	Stream   []StreamRun    `json:"stream"`
	Compress []CompressCell `json:"compress"`
	Kept     KeptPicture    `json:"kept"`
	Seeds    []SeedTable    `json:"kvcalc_tables"`
	Timing   Timing         `json:"timing"` // wall seconds: they vary from run to run
}

// Setup records how to reproduce the sweep.
type Setup struct {
	SweepConfig
	ModelConfig ModelInfo     `json:"model_config"`
	MethodModes []MethodInfo  `json:"method_modes"`
	Samples     []ContextInfo `json:"samples"`
}

// ModelInfo is the model's shape.
type ModelInfo struct {
	Dim      int   `json:"dim"`
	Layers   int   `json:"layers"`
	Heads    int   `json:"heads"`
	KVHeads  int   `json:"kv_heads"`
	HeadDim  int   `json:"head_dim"`
	Vocab    int   `json:"vocab"`
	Context  int   `json:"context"`
	Params   int64 `json:"params"`
	KVPerTok int64 `json:"kv_bytes_per_token_f32"`
}

// MethodInfo says how a method's budget is set in the sweep.
type MethodInfo struct {
	Method string `json:"method"`
	// Mode is "ratio" (policy.Config.Ratio), "budget" (a window method:
	// Budget = ⌈ratio · prompt⌉ tokens) or "schedule" (the method sets
	// its own sizes and takes no budget: one run per codec).
	Mode  string `json:"mode"`
	Error string `json:"error,omitempty"` // why it could not be run at all
}

// ContextInfo is one compress-then-continue sample.
type ContextInfo struct {
	Start  int `json:"start"`  // index of its first token after BOS in the text's tokens
	Length int `json:"length"` // prompt tokens, BOS included
}

// Timing is wall time, in seconds.
type Timing struct {
	Total    float64 `json:"total_s"`
	Compress float64 `json:"compress_s"`
	Stream   float64 `json:"stream_s"`
	Workers  int     `json:"workers"`
}

// StreamRun is one streaming-perplexity curve.
type StreamRun struct {
	Text        string    `json:"text"`
	Label       string    `json:"label"` // "dense", "window", "streaming s=4", "lminfinite"
	Method      string    `json:"method"`
	Policy      string    `json:"policy"`
	Sinks       int       `json:"sinks"`
	Budget      int       `json:"budget"` // tokens kept (0: all)
	Tokens      int       `json:"tokens"`
	Every       int       `json:"every"`
	MeanNLL     float64   `json:"mean_nll"`
	PPL         float64   `json:"ppl"`
	NLLByWindow []float64 `json:"nll_by_window"`
	// TailNLL is the mean NLL of the predictions past the first 1024
	// tokens (where every bounded cache is evicting and dense attention is
	// past its trained positions).
	TailNLL     float64 `json:"tail_nll"`
	KVBytesPeak int64   `json:"kv_bytes_peak"`
	KVCalcBytes int64   `json:"kvcalc_bytes"` // kvcalc's size of the same number of tokens
	TokS        float64 `json:"tok_s"`
	Error       string  `json:"error,omitempty"`
}

// CompressCell is one (method, ratio, codec) of compress-then-continue,
// averaged over the contexts.
type CompressCell struct {
	Method string  `json:"method"`
	Mode   string  `json:"mode"`
	Ratio  float64 `json:"ratio"` // 1: full cache; 0: the method's own schedule
	Codec  string  `json:"codec"`
	Policy string  `json:"policy"` // the normalized configuration on the first context

	Contexts int       `json:"contexts"` // contexts measured
	NLL      float64   `json:"nll"`      // mean continuation NLL (over contexts)
	PPL      float64   `json:"ppl"`      // exp(NLL)
	RefNLL   float64   `json:"ref_nll"`  // the full f32 cache's on the same contexts
	Top1     float64   `json:"top1_agreement"`
	Greedy   float64   `json:"greedy_agreement"`
	Top1SE   float64   `json:"top1_se"`   // standard error over contexts
	GreedySE float64   `json:"greedy_se"` // standard error over contexts
	NLLSE    float64   `json:"nll_se"`
	AttnErr  []float64 `json:"attn_rel_error"` // per layer, mean over contexts
	AttnMean float64   `json:"attn_rel_error_mean"`

	KeptFrac    float64 `json:"kept_fraction"`  // tokens kept / prompt tokens, over all (layer, head)
	KVBytes     float64 `json:"kv_bytes"`       // pool bytes right after compression (mean)
	KVBytesPeak float64 `json:"kv_bytes_peak"`  // the most pool bytes the sequence held (mean)
	KVCalcBytes float64 `json:"kvcalc_bytes"`   // kvcalc's size of the kept tokens (mean)
	FullBytes   float64 `json:"full_f32_bytes"` // the full f32 cache's pool bytes (mean)
	TokS        float64 `json:"tok_s"`          // continuation tokens per second (mean)

	PerContext PerContext `json:"per_context"`
	Error      string     `json:"error,omitempty"`
}

// PerContext holds a cell's per-context values, in context order.
type PerContext struct {
	NLL    []float64 `json:"nll"`
	Top1   []float64 `json:"top1"`
	Greedy []float64 `json:"greedy"`
}

// KeptPicture is which positions each (layer, KV head) keeps after one
// compression of one prompt, per method.
type KeptPicture struct {
	Text    string       `json:"text"`
	Start   int          `json:"start"`
	Length  int          `json:"length"`
	Ratio   float64      `json:"ratio"`
	Codec   string       `json:"codec"`
	Methods []KeptMethod `json:"methods"`
}

// KeptMethod is one method's kept positions: [layer][KV head][]position.
type KeptMethod struct {
	Method string      `json:"method"`
	Policy string      `json:"policy"`
	Kept   [][][]int32 `json:"kept"`
	Error  string      `json:"error,omitempty"`
}

// method modes
const (
	modeRatio    = "ratio"
	modeBudget   = "budget"
	modeSchedule = "schedule"
)

// MethodMode says how the sweep sizes a method: with a ratio, with a token
// budget (window methods), or not at all (a method with its own schedule).
func MethodMode(method string) (string, error) {
	if _, err := (policy.Config{Method: method, Ratio: 0.5}).Normalize(); err == nil {
		return modeRatio, nil
	}
	if _, err := (policy.Config{Method: method, Budget: 64}).Normalize(); err == nil {
		return modeBudget, nil
	}
	_, err := (policy.Config{Method: method}).Normalize()
	if err == nil {
		return modeSchedule, nil
	}
	return "", err
}

// methodConfig is the policy of a method at a ratio on a prompt of n tokens.
func methodConfig(method, mode string, ratio float64, n int) policy.Config {
	switch mode {
	case modeRatio:
		return policy.Config{Method: method, Ratio: ratio}
	case modeBudget:
		return policy.Config{Method: method, Budget: max(8, int(math.Ceil(ratio*float64(n)-1e-9)))}
	}
	return policy.Config{Method: method}
}

// kvCodec is the cache's options with keys and values both in the codec
// named (a codec.Parse name).
func kvCodec(name string) (model.KVOptions, error) {
	k, err := codec.Parse(name, codec.Keys)
	if err != nil {
		return model.KVOptions{}, err
	}
	v, err := codec.Parse(name, codec.Values)
	if err != nil {
		return model.KVOptions{}, err
	}
	return model.KVOptions{K: k, V: v}, nil
}

// ReadText reads a text; Gutenberg texts lose their header and licence.
func ReadText(spec *TextSpec) (string, error) {
	data, err := os.ReadFile(spec.Path)
	if err != nil {
		return "", err
	}
	s := strings.TrimPrefix(string(data), "\ufeff")
	if i := strings.Index(s, "*** START OF"); i >= 0 {
		if j := strings.Index(s[i:], "\n"); j >= 0 {
			s = s[i+j+1:]
			spec.Gutenberg = true
		}
	}
	if i := strings.Index(s, "*** END OF"); i >= 0 {
		s = s[:i]
		spec.Gutenberg = true
	}
	spec.File = filepath.Base(spec.Path)
	spec.Bytes = len(s)
	return s, nil
}

// job is one unit of a sweep's work.
type job struct {
	weight int64
	what   string
	run    func() error
}

// runJobs runs jobs on workers goroutines, heaviest first, and returns the
// first error.
func runJobs(jobs []job, workers int, prog Progress) error {
	slices.SortStableFunc(jobs, func(a, b job) int {
		switch {
		case a.weight > b.weight:
			return -1
		case a.weight < b.weight:
			return 1
		}
		return 0
	})
	ch := make(chan job)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range max(1, workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range ch {
				err := j.run()
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("%s: %w", j.what, err)
				}
				if prog != nil {
					prog.Add(j.weight, j.what)
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		mu.Lock()
		stop := first != nil
		mu.Unlock()
		if stop {
			break
		}
		ch <- j
	}
	close(ch)
	wg.Wait()
	return first
}

// Sweep runs every measurement of cfg on m.
func Sweep(m *model.Model, tok tokenizer.Tokenizer, cfg SweepConfig) (*Results, error) {
	t0 := time.Now()
	if cfg.Methods == nil {
		for _, name := range policy.Methods {
			if name != "full" {
				cfg.Methods = append(cfg.Methods, name)
			}
		}
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	L, H := m.Config.Layers, m.KVHeads
	if cfg.MaxContext+cfg.Continue+cfg.Greedy-1 > m.CtxLen {
		return nil, fmt.Errorf("eval: prompts of %d tokens + %d continuation + %d greedy tokens do not fit the model's %d positions",
			cfg.MaxContext, cfg.Continue, cfg.Greedy, m.CtxLen)
	}
	if cfg.MinContext < 16 || cfg.MinContext > cfg.MaxContext || cfg.Continue < 2 || cfg.Contexts < 1 {
		return nil, fmt.Errorf("eval: bad context settings %d–%d, continue %d, %d contexts", cfg.MinContext, cfg.MaxContext, cfg.Continue, cfg.Contexts)
	}
	kvModel := kvcalc.Model{Name: "model", Layers: L, Heads: m.Heads, KVHeads: H, HeadDim: m.HeadDim, Context: m.CtxLen, Params: 1}
	res := &Results{Seeds: cfg.Seeds}
	res.Setup.ModelConfig = ModelInfo{Dim: m.Dim, Layers: L, Heads: m.Heads, KVHeads: H, HeadDim: m.HeadDim,
		Vocab: m.Vocab, Context: m.CtxLen, Params: modelParams(m), KVPerTok: int64(2 * L * H * m.HeadDim * 4)}

	// Texts.
	text, err := ReadText(&cfg.Text)
	if err != nil {
		return nil, err
	}
	ids := tok.Encode(text, true, false)
	cfg.Text.Tokens = len(ids)
	if cfg.Text.Domain == "" {
		cfg.Text.Domain = "in-domain"
	}
	streamIDs := [][]int{ids}
	for i := range cfg.OOD {
		s, err := ReadText(&cfg.OOD[i])
		if err != nil {
			return nil, err
		}
		if cfg.OOD[i].Domain == "" {
			cfg.OOD[i].Domain = "out-of-domain"
		}
		need := max(cfg.StreamTokens, cfg.DenseTokens) + 1
		cut := min(len(s), 16*need) // ≥ 1 byte per token: plenty
		oid := tok.Encode(s[:cut], true, false)
		cfg.OOD[i].Tokens = len(tok.Encode(s, true, false))
		streamIDs = append(streamIDs, oid)
	}
	texts := append([]TextSpec{cfg.Text}, cfg.OOD...)
	for i, s := range streamIDs {
		if len(s) < max(cfg.StreamTokens, cfg.DenseTokens)+1 {
			return nil, fmt.Errorf("eval: %s has %d tokens, fewer than the %d streamed", texts[i].Name, len(s), max(cfg.StreamTokens, cfg.DenseTokens)+1)
		}
	}

	// Methods.
	var methods []MethodInfo
	for _, name := range cfg.Methods {
		mode, err := MethodMode(name)
		mi := MethodInfo{Method: name, Mode: mode}
		if err != nil {
			mi.Error = err.Error()
		}
		methods = append(methods, mi)
	}
	res.Setup.MethodModes = methods

	// Contexts: one per equal slice of the text, at a seeded place and length.
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b766c6d))
	need := cfg.MaxContext + cfg.Continue
	span := (len(ids) - 1 - need) / cfg.Contexts
	if span < 1 {
		return nil, fmt.Errorf("eval: %s is too short for %d contexts", cfg.Text.Name, cfg.Contexts)
	}
	trials := make([]Trial, cfg.Contexts)
	for i := range trials {
		n := cfg.MinContext + rng.IntN(cfg.MaxContext-cfg.MinContext+1)
		start := 1 + i*span + rng.IntN(span)
		ctx := append([]int{ids[0]}, ids[start:start+n-1]...)
		trials[i] = Trial{Context: ctx, Continue: ids[start+n-1 : start+n-1+cfg.Continue], Greedy: cfg.Greedy}
		res.Setup.Samples = append(res.Setup.Samples, ContextInfo{Start: start, Length: n})
	}
	res.Setup.SweepConfig = cfg

	// Cells: the full f32 reference, full × codec, then method × ratio × codec.
	type cellSpec struct {
		method, mode, codec string
		ratio               float64
	}
	var specs []cellSpec
	specs = append(specs, cellSpec{"full", "full", "f32", 1})
	for _, c := range cfg.Codecs {
		specs = append(specs, cellSpec{"full", "full", c, 1})
	}
	for _, mi := range methods {
		if mi.Error != "" {
			continue
		}
		for _, c := range cfg.Codecs {
			if mi.Mode == modeSchedule {
				specs = append(specs, cellSpec{mi.Method, mi.Mode, c, 0})
				continue
			}
			for _, r := range cfg.Ratios {
				specs = append(specs, cellSpec{mi.Method, mi.Mode, c, r})
			}
		}
	}
	outs := make([][]TrialResult, len(specs))
	errs := make([][]error, len(specs))
	cfgs := make([]string, len(specs))
	for i := range specs {
		outs[i] = make([]TrialResult, len(trials))
		errs[i] = make([]error, len(trials))
	}
	refs := make([]*Reference, len(trials))

	// Streaming runs.
	type streamSpec struct {
		text   int
		label  string
		cfg    policy.Config
		tokens int
	}
	var sspecs []streamSpec
	for ti := range texts {
		sspecs = append(sspecs, streamSpec{ti, "dense", policy.Config{Method: "full"}, cfg.DenseTokens})
		sspecs = append(sspecs, streamSpec{ti, "window", policy.Config{Method: "window", Window: cfg.StreamBudget}, cfg.StreamTokens})
		for _, s := range cfg.Sinks {
			sspecs = append(sspecs, streamSpec{ti, fmt.Sprintf("streaming s=%d", s),
				policy.Config{Method: "streaming", Sinks: s, Window: cfg.StreamBudget - s}, cfg.StreamTokens})
		}
		sspecs = append(sspecs, streamSpec{ti, "lminfinite", policy.Config{Method: "lminfinite", Sinks: cfg.LMInfSinks,
			Window: cfg.StreamBudget - cfg.LMInfSinks}, cfg.StreamTokens})
	}
	res.Stream = make([]StreamRun, len(sspecs))

	// Kept picture.
	kept := KeptPicture{Text: cfg.Text.Name, Start: res.Setup.Samples[0].Start, Length: res.Setup.Samples[0].Length, Ratio: cfg.KeptRatio, Codec: "f32"}
	var keptMethods []MethodInfo
	for _, mi := range methods {
		if mi.Error == "" {
			keptMethods = append(keptMethods, mi)
		}
	}
	kept.Methods = make([]KeptMethod, len(keptMethods))

	trialWeight := func(tr Trial, method string) int64 {
		w := int64(len(tr.Context) + 2*len(tr.Continue) + tr.Greedy)
		if method == "h2o" {
			w *= 3
		}
		return w
	}
	var tStream, tCompress time.Duration
	var tmu sync.Mutex
	timed := func(d *time.Duration, f func() error) func() error {
		return func() error {
			s := time.Now()
			err := f()
			tmu.Lock()
			*d += time.Since(s)
			tmu.Unlock()
			return err
		}
	}

	// Phase 1: references, streams and kept pictures.
	var jobs []job
	for i := range trials {
		jobs = append(jobs, job{trialWeight(trials[i], "full"), fmt.Sprintf("reference %d", i), timed(&tCompress, func() error {
			r, err := NewReference(m, trials[i])
			refs[i] = r
			return err
		})})
	}
	for si, sp := range sspecs {
		// Rough costs in the trials' unit (a token of a trial).
		w := int64(sp.tokens)
		switch sp.cfg.Method {
		case "full":
			w = int64(sp.tokens) * int64(sp.tokens) / 1250
		case "streaming": // re-indexes the cache at every step
			w += w * int64(cfg.StreamBudget) / 128
		case "lminfinite":
			w += w / 2
		}
		jobs = append(jobs, job{w, fmt.Sprintf("stream %s %s", texts[sp.text].Name, sp.label), timed(&tStream, func() error {
			r := streamOne(m, sp.cfg, streamIDs[sp.text][:sp.tokens+1], cfg.StreamEvery)
			r.Text, r.Label = texts[sp.text].Name, sp.label
			if r.Error == "" {
				if row, err := kvcalc.Compute(kvModel, kvcalc.Options{K: kvcalc.F32, V: kvcalc.F32, Budget: r.Budget}, 1, sp.tokens); err == nil {
					r.KVCalcBytes = row.FormulaTotalBytes
				}
			}
			res.Stream[si] = r
			return nil
		})})
	}
	for ki, mi := range keptMethods {
		jobs = append(jobs, job{int64(kept.Length), "kept " + mi.Method, func() error {
			pc := methodConfig(mi.Method, mi.Mode, cfg.KeptRatio, kept.Length)
			km := KeptMethod{Method: mi.Method}
			if n, err := pc.Normalize(); err == nil {
				km.Policy = n.String()
			}
			k, err := KeptPositions(m, pc, model.KVOptions{}, trials[0].Context)
			if err != nil {
				km.Error = err.Error()
			}
			km.Kept = k
			kept.Methods[ki] = km
			return nil
		}})
	}
	// Phase 2: the trials (they need the references).
	var jobs2 []job
	for ci, sp := range specs {
		for ti := range trials {
			jobs2 = append(jobs2, job{trialWeight(trials[ti], sp.method), fmt.Sprintf("%s %g %s #%d", sp.method, sp.ratio, sp.codec, ti), timed(&tCompress, func() error {
				tr := trials[ti]
				if sp.method != "full" {
					tr.Policy = methodConfig(sp.method, sp.mode, sp.ratio, len(tr.Context))
				}
				if ti == 0 {
					if n, err := tr.Policy.Normalize(); err == nil {
						cfgs[ci] = n.String()
					}
				}
				kv, err := kvCodec(sp.codec)
				if err != nil {
					return err
				}
				// Twice the context's f32 bytes: the pool's size is not what is
				// measured, and methods that compact while decoding (PyramidInfer)
				// can need a few blocks more than the context holds.
				kv.MemBytes = poolHeadroom(m)
				tr.KV = kv
				outs[ci][ti], errs[ci][ti] = Run(m, tr, refs[ti])
				return nil
			})})
		}
	}
	if cfg.Progress != nil {
		var total int64
		for _, j := range append(append([]job(nil), jobs...), jobs2...) {
			total += j.weight
		}
		cfg.Progress.Start(total)
	}
	if err := runJobs(jobs, cfg.Workers, cfg.Progress); err != nil {
		return nil, err
	}
	if err := runJobs(jobs2, cfg.Workers, cfg.Progress); err != nil {
		return nil, err
	}
	res.Kept = kept

	// Aggregate the cells.
	for ci, sp := range specs {
		cell := CompressCell{Method: sp.method, Mode: sp.mode, Ratio: sp.ratio, Codec: sp.codec, Policy: cfgs[ci]}
		var nll, top1, greedy, keptFr, kvb, peak, calc, full, toks, refnll []float64
		cell.AttnErr = make([]float64, L)
		var firstErr error
		for ti, r := range outs[ci] {
			if errs[ci][ti] != nil {
				if firstErr == nil {
					firstErr = errs[ci][ti]
				}
				continue
			}
			tr := trials[ti]
			nll = append(nll, r.NLL)
			top1 = append(top1, r.Top1)
			greedy = append(greedy, r.Greedy)
			refnll = append(refnll, refs[ti].NLL())
			full = append(full, float64(refs[ti].KVBytes()))
			k := len(tr.Context) * L * H
			if r.KeptPerLayer != nil {
				k = 0
				for _, v := range r.KeptPerLayer {
					k += v
				}
			}
			keptFr = append(keptFr, float64(k)/float64(len(tr.Context)*L*H))
			kvb = append(kvb, float64(r.KVBytes))
			peak = append(peak, float64(r.PeakKVBytes))
			toks = append(toks, r.TokS)
			for l, e := range r.AttnErr {
				cell.AttnErr[l] += e
			}
			cc, _ := kvcalc.ParseCodec(sp.codec)
			perTable := (k + L*H - 1) / (L * H)
			if row, err := kvcalc.Compute(kvModel, kvcalc.Options{K: cc, V: cc}, 1, perTable); err == nil {
				calc = append(calc, float64(row.FormulaTotalBytes))
			}
		}
		// A cell that failed on any context is left out: an average over
		// fewer contexts would not compare with the others.
		if len(nll) < len(trials) {
			if firstErr == nil {
				firstErr = errors.New("no context measured")
			}
			cell.Error = firstErr.Error()
			if len(nll) > 0 {
				cell.Error = fmt.Sprintf("failed on %d of %d contexts: %v", len(trials)-len(nll), len(trials), firstErr)
			}
			cell.AttnErr = nil
			res.Compress = append(res.Compress, cell)
			continue
		}
		cell.Contexts = len(nll)
		n := float64(cell.Contexts)
		for l := range cell.AttnErr {
			cell.AttnErr[l] /= n
			cell.AttnMean += cell.AttnErr[l] / float64(L)
		}
		cell.NLL, cell.NLLSE = meanSE(nll)
		cell.PPL = math.Exp(cell.NLL)
		cell.RefNLL, _ = meanSE(refnll)
		cell.Top1, cell.Top1SE = meanSE(top1)
		cell.Greedy, cell.GreedySE = meanSE(greedy)
		cell.KeptFrac, _ = meanSE(keptFr)
		cell.KVBytes, _ = meanSE(kvb)
		cell.KVBytesPeak, _ = meanSE(peak)
		cell.KVCalcBytes, _ = meanSE(calc)
		cell.FullBytes, _ = meanSE(full)
		cell.TokS, _ = meanSE(toks)
		cell.PerContext = PerContext{NLL: nll, Top1: top1, Greedy: greedy}
		res.Compress = append(res.Compress, cell)
	}
	res.Timing = Timing{Total: time.Since(t0).Seconds(), Compress: tCompress.Seconds(), Stream: tStream.Seconds(), Workers: cfg.Workers}
	return res, nil
}

// poolHeadroom is a trial's pool size: twice the model's context in f32
// (keys, values and each slot's position).
func poolHeadroom(m *model.Model) int64 {
	return 2 * int64(m.CtxLen) * int64(m.Config.Layers) * int64(m.KVHeads) * int64(8*m.HeadDim+4)
}

func modelParams(m *model.Model) int64 {
	c := m.Config
	per := int64(c.Dim)*int64(c.QDim())*2 + 2*int64(c.Dim)*int64(c.KVDim()) + 3*int64(c.Dim)*int64(c.HiddenDim) + 2*int64(c.Dim)
	return int64(c.Vocab)*int64(c.Dim) + int64(c.Layers)*per + int64(c.Dim)
}

// meanSE is the mean and its standard error.
func meanSE(x []float64) (float64, float64) {
	if len(x) == 0 {
		return 0, 0
	}
	var s float64
	for _, v := range x {
		s += v
	}
	mean := s / float64(len(x))
	if len(x) < 2 {
		return mean, 0
	}
	var ss float64
	for _, v := range x {
		ss += (v - mean) * (v - mean)
	}
	return mean, math.Sqrt(ss / float64(len(x)-1) / float64(len(x)))
}

// streamOne streams ids through a cache bounded by pc (dense for full).
func streamOne(m *model.Model, pc policy.Config, ids []int, every int) StreamRun {
	out := StreamRun{Method: pc.Method, Tokens: len(ids) - 1, Every: every}
	n, err := pc.Normalize()
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.Policy, out.Sinks, out.Budget = n.String(), n.Sinks, n.Budget
	opt := model.KVOptions{}
	if pc.Method == "full" {
		opt.Tokens = len(ids)
	}
	seq, err := m.NewStandaloneSequence(opt)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	defer seq.Close()
	var st *policy.State
	if pc.Method == "full" {
		seq.MaxPos = math.MaxInt32 // dense attention runs past the trained positions
	} else if st, err = policy.New(pc, seq); err != nil {
		out.Error = err.Error()
		return out
	}
	start := time.Now()
	r, err := Stream(seq, st, ids, every)
	out.TokS = float64(len(ids)-1) / time.Since(start).Seconds()
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.MeanNLL, out.PPL, out.NLLByWindow, out.KVBytesPeak = r.MeanNLL, r.PPL, r.NLLByWindow, r.KVBytesPeak
	// Tail: windows wholly past the first 1024 predictions.
	var tail float64
	cnt := 0
	for i, v := range r.NLLByWindow {
		if i*every >= 1024 && (i+1)*every <= r.Predictions {
			tail += v
			cnt++
		}
	}
	if cnt > 0 {
		out.TailNLL = tail / float64(cnt)
	}
	return out
}

// KeptPositions prefills ids under a policy, compresses once, and returns
// for each layer and KV head the sorted original positions it keeps.
func KeptPositions(m *model.Model, pc policy.Config, kv model.KVOptions, ids []int) ([][][]int32, error) {
	seq, err := m.NewStandaloneSequence(kv)
	if err != nil {
		return nil, err
	}
	defer seq.Close()
	st, err := policy.New(pc, seq)
	if err != nil {
		return nil, err
	}
	seq.SetPolicy(st) // the forward pass drives it
	seq.Prompt(len(ids))
	if _, err := seq.Forward(ids, false); err != nil {
		return nil, err
	}
	return st.Kept(), nil
}
