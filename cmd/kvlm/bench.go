package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tensor"
	"github.com/spf13/cobra"
)

type benchJSON struct {
	Model           string  `json:"model"`
	PromptTokens    int     `json:"prompt_tokens"`
	GenTokens       int     `json:"gen_tokens"`
	Reps            int     `json:"reps"`
	Threads         int     `json:"threads"`
	PrefillTokS     float64 `json:"prefill_tok_s"`
	DecodeTokS      float64 `json:"decode_tok_s"`
	WeightsBytes    int64   `json:"weights_bytes"`
	KVType          string  `json:"kv_type"`            // codecs of keys/values, e.g. "f32/f32"
	KVBytesPerToken int64   `json:"kv_bytes_per_token"` // in those codecs, per cached token
	PeakRSSBytes    int64   `json:"peak_rss_bytes"`     // the process's resident high-water mark after the prefill and decode runs (weights, runtime, one sequence): before the batched runs and the bandwidth buffer

	Kernels string `json:"kernels"` // the tensor kernel set: go, avx2, avx512(+vnni)

	// The best of the --reps runs (on a shared machine the median mixes in
	// other processes' load).
	PrefillBestTokS float64 `json:"prefill_best_tok_s"`
	DecodeBestTokS  float64 `json:"decode_best_tok_s"`

	// Decode at several context lengths (tokens already in the cache),
	// CtxGen steps at each.
	DecodeAt []benchDecodeAt `json:"decode_at,omitempty"`
	CtxGen   int             `json:"ctx_gen"`
	// Batched decode: see benchBatch.
	Batch []benchBatch `json:"batch,omitempty"`

	// Memory: read bandwidth of the machine (SIMD streaming reads on every
	// thread; the scalar figure reads 8 bytes at a time in plain Go), the
	// bytes a decode step reads (weight matrices and the KV cache at the
	// mean decode context), the decode speed that bandwidth allows and the
	// fraction of it reached.
	//
	// On a shared machine both decode speed and bandwidth drift with the
	// neighbours' load, so the ceiling is measured in pairs: each of
	// CeilingRounds decodes ceilingTokens tokens (one sequence after the
	// prompt) and then measures the bandwidth (best of 3 reads); a round's
	// fraction is its decode speed over the ceiling of its own bandwidth.
	// BandwidthGBs and CeilingTokS are the rounds' medians, CeilingFraction
	// the median of their fractions.
	BandwidthGBs       float64        `json:"bandwidth_gb_s,omitempty"`
	BandwidthScalarGBs float64        `json:"bandwidth_scalar_gb_s,omitempty"`
	BytesPerToken      int64          `json:"bytes_per_token"`
	CeilingTokS        float64        `json:"ceiling_tok_s,omitempty"`
	CeilingFraction    float64        `json:"ceiling_fraction,omitempty"`
	CeilingRounds      []benchCeiling `json:"ceiling_rounds,omitempty"`

	// CompareKV: decode under two KV codecs in one process (--compare-kv).
	CompareKV *benchCompareKV `json:"compare_kv,omitempty"`

	// Policy is the KV policy of the prefill and decode runs (--kv-policy,
	// normalized; "full": none). The --contexts, --batch, ceiling and
	// --compare-kv runs use the cache without it.
	Policy string `json:"kv_policy"`
	// Compression: the prefill and decode runs against the full cache
	// (--kv-policy other than full, or --vs-kv-type given).
	Compression *benchCompression `json:"compression,omitempty"`

	// Context: the positions the sequences may run to, and the model's
	// trained context length; PastTrained when --max-context raised the
	// first past the second (positions beyond it are extrapolated by RoPE:
	// speed only, the text means nothing).
	Context     int  `json:"context"`
	TrainedCtx  int  `json:"trained_context"`
	PastTrained bool `json:"past_trained_context,omitempty"`
	// DecodeBaseMS is a decode step's time after DecodeBaseCtx
	// (--weights-ctx) tokens, in the --contexts sequence before it grows:
	// the base of each context's ContextShare (0: not measured, when the
	// first context is too short).
	DecodeBaseCtx int     `json:"decode_base_context,omitempty"`
	DecodeBaseMS  float64 `json:"decode_base_ms,omitempty"`
	// ContextsSkipped are the --contexts that do not fit Context.
	ContextsSkipped []int `json:"contexts_skipped,omitempty"`

	// Sweep: throughput through the engine at fixed KV memory
	// (--sweep-batch).
	Sweep *benchSweep `json:"sweep,omitempty"`
}

// benchCompareKV compares decode speed under two KV codecs, A and B (each
// for keys and values), in one process: two sequences take the same
// prompt, then decode their own greedy continuations in turns, a token of
// each (a round; A first in even rounds, B first in odd ones), so that both
// see the machine in the same state to within a token. TimeRatio is the
// median over the rounds of A's token time over B's (above 1: A slower),
// Q1 and Q3 its quartiles; the speeds are the medians of each side's token
// times; the first compareWarmup rounds are not counted.
type benchCompareKV struct {
	CodecA    string  `json:"a"`
	CodecB    string  `json:"b"`
	Rounds    int     `json:"rounds"`
	Context   int     `json:"context"` // tokens in each cache when the rounds begin
	ATokS     float64 `json:"a_tok_s"`
	BTokS     float64 `json:"b_tok_s"`
	TimeRatio float64 `json:"time_ratio"`
	RatioQ1   float64 `json:"time_ratio_q1"`
	RatioQ3   float64 `json:"time_ratio_q3"`
	KVBytesA  int64   `json:"kv_bytes_per_token_a"`
	KVBytesB  int64   `json:"kv_bytes_per_token_b"`
}

// compareWarmup is the rounds --compare-kv runs before it counts.
const compareWarmup = 4

// benchCeiling is one round of the paired ceiling measurement.
type benchCeiling struct {
	DecodeTokS   float64 `json:"decode_tok_s"`
	BandwidthGBs float64 `json:"bandwidth_gb_s"`
	Fraction     float64 `json:"fraction"`
}

// ceilingTokens is the decode tokens of one ceiling round (fewer where the
// model's context has no room for max(3, reps) of them after a token).
const ceilingTokens = 32

// benchDecodeAt is decode at one of --contexts: its speed, and where a
// step's time goes (see benchAttnShare).
type benchDecodeAt struct {
	Context int     `json:"context"`
	TokS    float64 `json:"tok_s"`
	benchAttnShare
}

// benchBatch is decode throughput with Batch sequences decoding together,
// one model.DecodeBatch call per step (each weight matrix read once per
// step for all of them), measured in Rounds rounds (--reps) that run every
// batch size in turn: DecodeTokS counts every sequence's tokens (median of
// the rounds); VsBatch1 is the median of the rounds' ratios to batch 1's
// speed in the same round (when --batch includes 1).
type benchBatch struct {
	Batch      int     `json:"batch"`
	Steps      int     `json:"steps"`
	Rounds     int     `json:"rounds"`
	DecodeTokS float64 `json:"decode_tok_s"`
	VsBatch1   float64 `json:"vs_batch1,omitempty"`
}

type benchFlags struct {
	promptN, genN, reps int
	asJSON              bool
	contexts, batches   string
	ctxGen              int
	bandwidthMiB        int
	kernels             string
	compareKV           string
	compress            bool   // measure compression: a policy, or --vs-kv-type given
	vsKV                string // --vs-kv-type
	weightsCtx          int
	maxCtx              int
	sweep               string
	sweepRequests       int
	compare             bool // --compare
}

func newBench() *cobra.Command {
	var mf modelFlags
	var f benchFlags
	c := &cobra.Command{
		Use:   "bench -m MODEL --prompt N --gen N",
		Short: "Measure prefill and decode speed (median of --reps runs), batched decode, memory bandwidth and peak memory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.promptN < 1 || f.genN < 1 || f.reps < 1 || f.ctxGen < 1 {
				return fmt.Errorf("--prompt, --gen, --ctx-gen and --reps must be at least 1")
			}
			contexts, err := parseInts("--contexts", f.contexts)
			if err != nil {
				return err
			}
			batches, err := parseInts("--batch", f.batches)
			if err != nil {
				return err
			}
			var cmp []string
			if f.compareKV != "" {
				cmp = strings.Split(f.compareKV, ",")
				if len(cmp) != 2 {
					return fmt.Errorf("--compare-kv wants two codecs, A,B, got %q", f.compareKV)
				}
				for i, name := range cmp {
					cmp[i] = strings.TrimSpace(name)
					if _, err := codec.Parse(cmp[i], codec.Keys); err != nil {
						return fmt.Errorf("--compare-kv: %w", err)
					}
				}
			}
			f.compress = f.compare && (mf.pol.Method != "full" || f.vsKV != "")
			if !f.compare && f.vsKV != "" {
				return errors.New("--vs-kv-type names the full cache of the comparison that --compare=false turns off")
			}
			if f.weightsCtx < 1 || (f.compress && f.weightsCtx >= f.promptN) {
				return fmt.Errorf("--weights-ctx must be at least 1 and below --prompt %d, got %d", f.promptN, f.weightsCtx)
			}
			sweep, err := parseInts("--sweep-batch", f.sweep)
			if err != nil {
				return err
			}
			// Flags whose measurement is not asked for are refused, not ignored.
			switch fl := cmd.Flags(); {
			case fl.Changed("weights-ctx") && !f.compress && len(contexts) == 0:
				return errors.New("--weights-ctx is the base of a comparison (--kv-policy, --vs-kv-type) or of --contexts' shares: neither runs")
			case fl.Changed("compare") && mf.pol.Method == "full" && f.vsKV == "":
				return errors.New("--compare: there is no comparison without --kv-policy or --vs-kv-type")
			case fl.Changed("sweep-requests") && len(sweep) == 0:
				return errors.New("--sweep-requests needs --sweep-batch")
			}
			if f.maxCtx < 0 {
				return fmt.Errorf("--max-context must be positive, got %d", f.maxCtx)
			}
			if err := tensor.SetKernels(f.kernels); err != nil {
				return err
			}
			defer tensor.SetKernels("auto")
			m, _, err := mf.load()
			if err != nil {
				return err
			}
			defer m.Close()
			trained := m.CtxLen
			if f.maxCtx > 0 {
				if f.maxCtx < m.CtxLen {
					return fmt.Errorf("--max-context %d is below the model's context length %d: it only raises it", f.maxCtx, m.CtxLen)
				}
				// Only this process's copy of the model: sequences and
				// pools are sized by it.
				m.CtxLen = f.maxCtx
			}
			if f.promptN+f.genN > m.CtxLen {
				return fmt.Errorf("--prompt %d + --gen %d exceed the context length %d (--max-context runs past a model's trained length, for speed only)", f.promptN, f.genN, m.CtxLen)
			}
			if cmp != nil && f.promptN+f.genN+compareWarmup > m.CtxLen {
				return fmt.Errorf("--compare-kv: --prompt %d + --gen %d + %d warm-up tokens exceed the context length %d", f.promptN, f.genN, compareWarmup, m.CtxLen)
			}
			res, err := runBench(&mf, &f, m, contexts, batches)
			if err != nil {
				return err
			}
			res.Context, res.TrainedCtx, res.PastTrained = m.CtxLen, trained, m.CtxLen > trained
			if len(sweep) > 0 {
				if res.Sweep, err = benchSweepBatch(&mf, &f, m, sweep); err != nil {
					return err
				}
			}
			if cmp != nil {
				if res.CompareKV, err = benchCompare(&mf, &f, m, cmp[0], cmp[1]); err != nil {
					return err
				}
			}
			if f.asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			printBench(cmd, &f, res)
			return nil
		},
	}
	c.AddCommand(newBenchReport())
	mf.register(c)
	mf.registerPolicy(c)
	c.Flags().StringVar(&f.vsKV, "vs-kv-type", "", "codec (keys and values) of the full cache a compressed run is compared with (default: the run's --kv-type); given, a run without --kv-policy is compared too (a codec alone, e.g. --kv-type q4 --vs-kv-type f16)")
	c.Flags().IntVar(&f.weightsCtx, "weights-ctx", 16, "prompt tokens of the full-cache run that measures a decode step's weights-only time (compression runs)")
	c.Flags().IntVar(&f.maxCtx, "max-context", 0, "let sequences run to this many positions, past the model's trained context length if it is larger (random-weight speed measurements; the output says so)")
	c.Flags().StringVar(&f.sweep, "sweep-batch", "", "batch sizes, e.g. 1,2,4,8,16,32,64: generated tokens/s through the engine (continuous batching in --kv-mem, --kv-policy and --kv-type) with that many --prompt-token requests of --gen tokens each, at most that many running")
	c.Flags().BoolVar(&f.compare, "compare", true, "with --kv-policy (or --vs-kv-type), also run the full cache and predict the speed-up; --compare=false times the policy's runs alone (e.g. for kvlm --cpuprofile FILE bench …)")
	c.Flags().IntVar(&f.sweepRequests, "sweep-requests", 0, "requests per --sweep-batch point (0: the batch size)")
	c.Flags().IntVar(&f.promptN, "prompt", 128, "prompt tokens")
	c.Flags().IntVar(&f.genN, "gen", 64, "generated tokens")
	c.Flags().IntVar(&f.reps, "reps", 3, "repetitions of prefill and decode, and rounds of batched decode (medians are reported)")
	c.Flags().BoolVar(&f.asJSON, "json", false, "print one JSON object")
	c.Flags().StringVar(&f.contexts, "contexts", "128,512,1024", "context lengths to time decode at (those that fit the model's context)")
	c.Flags().IntVar(&f.ctxGen, "ctx-gen", 16, "tokens decoded at each of --contexts, and steps of each batched-decode measurement")
	c.Flags().StringVar(&f.batches, "batch", "1,4,16", "batch sizes for batched decode (model.DecodeBatch; ratios against batch 1 when listed)")
	c.Flags().IntVar(&f.bandwidthMiB, "bandwidth-mib", 512, "buffer for the memory bandwidth measurement (0: skip it)")
	c.Flags().StringVar(&f.kernels, "kernels", "auto", "tensor kernels: auto, avx512, avx2 or go (the plain Go twins)")
	c.Flags().StringVar(&f.compareKV, "compare-kv", "", "A,B: also decode --gen tokens under KV codecs A and B (keys and values, e.g. f32,f16) in turns, token by token after the same --prompt, and report the ratio of their token times")
	return c
}

func parseInts(flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%s: %q is not a positive integer", flag, f)
		}
		out = append(out, v)
	}
	return out, nil
}

// benchPrompt is a fixed pseudo-random prompt: speed does not depend on the
// text.
func benchPrompt(n, vocab int, seed uint64) []int {
	rng := rand.New(rand.NewPCG(seed, 2))
	p := make([]int, n)
	for i := range p {
		p[i] = rng.IntN(vocab)
	}
	return p
}

func argmaxF(x []float32) int {
	best := 0
	for j, v := range x {
		if v > x[best] {
			best = j
		}
	}
	return best
}

func runBench(mf *modelFlags, f *benchFlags, m *model.Model, contexts, batches []int) (benchJSON, error) {
	opt, err := mf.kvOptions()
	if err != nil {
		return benchJSON{}, err
	}
	res := benchJSON{
		Model: mf.model, PromptTokens: f.promptN, GenTokens: f.genN, CtxGen: f.ctxGen, Reps: f.reps, Threads: threads(),
		WeightsBytes: m.WeightsBytes(), Kernels: tensor.Kernels(),
		KVType: opt.K.Name() + "/" + opt.V.Name(), KVBytesPerToken: kvBytesPerToken(m, opt),
	}
	prompt := benchPrompt(f.promptN, m.Vocab, 1)
	pc, err := mf.policyConfig()
	if err != nil {
		return res, err
	}
	res.Policy = pc.String()
	var vsOpt model.KVOptions
	if f.compress {
		vsOpt = opt // the full cache in the run's codecs, unless --vs-kv-type
		if f.vsKV != "" {
			if vsOpt.K, err = codec.Parse(f.vsKV, codec.Keys); err != nil {
				return res, fmt.Errorf("--vs-kv-type: %w", err)
			}
			if vsOpt.V, err = codec.Parse(f.vsKV, codec.Values); err != nil {
				return res, fmt.Errorf("--vs-kv-type: %w", err)
			}
		}
	}
	// --reps rounds, each running in turn the run of the flags and, when
	// compression is measured, the full cache after the same prompt and
	// after --weights-ctx tokens (see benchCompression).
	var rr benchRounds
	var pre, dec []float64
	for r := 0; r < f.reps; r++ {
		run, err := benchRunSeq(mf, m, opt, &pc, prompt, f.genN)
		if err != nil {
			return res, err
		}
		rr.run = append(rr.run, run)
		pre = append(pre, float64(f.promptN)/run.prefill.Seconds())
		dec = append(dec, float64(f.genN)/run.decode.Seconds())
		if !f.compress {
			continue
		}
		full, err := benchRunSeq(mf, m, vsOpt, nil, prompt, f.genN)
		if err != nil {
			return res, err
		}
		w, err := benchRunSeq(mf, m, vsOpt, nil, prompt[:f.weightsCtx], f.genN)
		if err != nil {
			return res, err
		}
		rr.full, rr.weights = append(rr.full, full), append(rr.weights, w)
	}
	if f.compress {
		if res.Compression, err = rr.compression(pc.String(), res.KVType, vsOpt.K.Name()+"/"+vsOpt.V.Name(), f.genN, f.weightsCtx); err != nil {
			return res, err
		}
	}
	res.PrefillTokS, res.DecodeTokS = median(pre), median(dec)
	res.PrefillBestTokS, res.DecodeBestTokS = slices.Max(pre), slices.Max(dec)
	// Peak memory of the runs above (the batched sequences and the
	// bandwidth buffer below would add theirs).
	res.PeakRSSBytes = peakRSS()

	// Decode at growing contexts, in one sequence: fill (untimed) up to each
	// context, then time ctxGen decode steps, and attention alone.
	if len(contexts) > 0 {
		slices.Sort(contexts)
		var err error
		if res.DecodeAt, res.DecodeBaseMS, res.ContextsSkipped, err = benchContexts(mf, m, contexts, f.ctxGen, f.weightsCtx); err != nil {
			return res, err
		}
		if res.DecodeBaseMS > 0 {
			res.DecodeBaseCtx = f.weightsCtx
		}
	}

	// Batched decode in --reps rounds, every batch size once per round, so
	// that each round's ratios to batch 1 compare runs seconds apart.
	if len(batches) > 0 {
		toks := make([][]float64, len(batches))
		ratios := make([][]float64, len(batches))
		steps := make([]int, len(batches))
		for r := 0; r < max(1, f.reps); r++ {
			one := 0.0
			for i, b := range batches {
				bb, err := benchBatched(mf, m, b, f.ctxGen)
				if err != nil {
					return res, err
				}
				toks[i], steps[i] = append(toks[i], bb.DecodeTokS), bb.Steps
				if b == 1 {
					one = bb.DecodeTokS
				}
			}
			if one > 0 {
				for i := range batches {
					ratios[i] = append(ratios[i], toks[i][r]/one)
				}
			}
		}
		for i, b := range batches {
			bb := benchBatch{Batch: b, Steps: steps[i], Rounds: len(toks[i]), DecodeTokS: median(toks[i])}
			if len(ratios[i]) > 0 {
				bb.VsBatch1 = median(ratios[i])
			}
			res.Batch = append(res.Batch, bb)
		}
	}

	res.BytesPerToken = decodeBytes(m) + res.KVBytesPerToken*int64(f.promptN+f.genN/2)
	if f.bandwidthMiB > 0 {
		if err := benchCeilingRounds(mf, m, f, prompt, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// benchCeilingRounds measures the decode ceiling in max(3, reps) paired
// rounds (see benchJSON): one sequence after the prompt, each round
// decoding ceilingTokens tokens then reading the bandwidth buffer.
func benchCeilingRounds(mf *modelFlags, m *model.Model, f *benchFlags, prompt []int, res *benchJSON) error {
	rounds := max(3, f.reps)
	// tokens per round: ceilingTokens, fewer where the context is short
	n := min(ceilingTokens, (m.CtxLen-1)/rounds)
	if n < 1 {
		return nil // no room: no ceiling
	}
	prompt = prompt[:max(1, min(len(prompt), m.CtxLen-rounds*n))]
	seq, err := mf.sequence(m)
	if err != nil {
		return err
	}
	defer seq.Close()
	logits, err := seq.Forward(prompt, false)
	if err != nil {
		return err
	}
	buf, free, err := bandwidthBuffer(f.bandwidthMiB)
	if err != nil {
		return err
	}
	defer free()
	var bws, fracs []float64
	for r := 0; r < rounds; r++ {
		t0 := time.Now()
		for i := 0; i < n; i++ {
			if logits, err = seq.Forward([]int{argmaxF(logits)}, false); err != nil {
				return err
			}
		}
		dec := float64(n) / time.Since(t0).Seconds()
		cur := tensor.Kernels()
		tensor.SetKernels("auto") // the machine's bandwidth, whatever --kernels says
		bw := tensor.MeasureBandwidth(buf, threads(), 3)
		tensor.SetKernels(cur)
		frac := dec / (bw / float64(res.BytesPerToken))
		bws, fracs = append(bws, bw), append(fracs, frac)
		res.CeilingRounds = append(res.CeilingRounds, benchCeiling{DecodeTokS: dec, BandwidthGBs: bw / 1e9, Fraction: frac})
	}
	cur := tensor.Kernels()
	tensor.SetKernels("go")
	scalar := tensor.MeasureBandwidth(buf, threads(), 3)
	tensor.SetKernels(cur)
	res.BandwidthGBs, res.BandwidthScalarGBs = median(bws)/1e9, scalar/1e9
	res.CeilingTokS = median(bws) / float64(res.BytesPerToken)
	res.CeilingFraction = median(fracs)
	return nil
}

// decodeBytes is the weight bytes one decode step reads: every matrix
// except the token embedding (one row of it), the norms, and the
// classifier (the embedding itself when tied).
func decodeBytes(m *model.Model) int64 {
	n := m.WeightsBytes()
	if m.Output != m.TokEmb {
		n -= int64(len(m.TokEmb.Data))
	}
	return n
}

// benchBatched times b sequences (each after an 8-token prompt, run on its
// own) decoding steps tokens each together: one model.DecodeBatch per step,
// every weight matrix multiplied by b rows at once, attention per sequence.
// One untimed step comes first.
// benchBatchPrompt is the prompt each batched sequence prefills.
const benchBatchPrompt = 8

func benchBatched(mf *modelFlags, m *model.Model, b, steps int) (benchBatch, error) {
	res := benchBatch{Batch: b}
	const promptN = benchBatchPrompt
	seqs := make([]*model.Sequence, b)
	defer func() {
		for _, s := range seqs {
			if s != nil {
				s.Close()
			}
		}
	}()
	if promptN+1+steps > m.CtxLen {
		steps = m.CtxLen - promptN - 1
	}
	if steps < 1 {
		return res, fmt.Errorf("batched decode: the context length %d is too short", m.CtxLen)
	}
	opt, err := mf.kvOptions()
	if err != nil {
		return res, err
	}
	if opt, err = mf.withKeyShift(m, opt); err != nil {
		return res, err
	}
	if opt.MemBytes == 0 {
		opt.Tokens = promptN + 1 + steps // a pool per sequence sized for what it runs
	}
	next := make([]int, b)
	for i := range seqs {
		s, err := m.NewStandaloneSequence(opt)
		if err != nil {
			return res, err
		}
		s.Chunk = mf.chunk
		seqs[i] = s
		l, err := s.Forward(benchPrompt(promptN, m.Vocab, uint64(10+i)), false)
		if err != nil {
			return res, err
		}
		next[i] = argmaxF(l)
	}
	step := func() error {
		out, err := m.DecodeBatch(seqs, next)
		if err != nil {
			return err
		}
		for i, l := range out {
			next[i] = argmaxF(l)
		}
		return nil
	}
	if err := step(); err != nil { // warm-up: scratch buffers, caches
		return res, err
	}
	t0 := time.Now()
	for st := 0; st < steps; st++ {
		if err := step(); err != nil {
			return res, err
		}
	}
	res.DecodeTokS = float64(b*steps) / time.Since(t0).Seconds()
	res.Steps = steps
	return res, nil
}

// bandwidthBuffer is the buffer of mib MiB the bandwidth measurement
// reads, its pages touched: memory of the kind the weights are read into
// (tensor.AllocHuge, as gguf.Load), so that the ceiling is the one the
// weights could reach.
func bandwidthBuffer(mib int) ([]byte, func() error, error) {
	buf, free, err := tensor.AllocHuge(mib << 20)
	if err != nil {
		return nil, nil, err
	}
	for i := range buf {
		buf[i] = byte(i)
	}
	return buf, free, nil
}

func printBench(cmd *cobra.Command, f *benchFlags, res benchJSON) {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "model            %s\n", res.Model)
	fmt.Fprintf(w, "weights          %s\n", human(res.WeightsBytes))
	fmt.Fprintf(w, "KV per token     %d B (%s)\n", res.KVBytesPerToken, res.KVType)
	fmt.Fprintf(w, "threads          %d (kernels %s)\n", res.Threads, res.Kernels)
	fmt.Fprintf(w, "prefill          %.1f tok/s  (%d tokens, median of %d; best %.1f)\n", res.PrefillTokS, f.promptN, f.reps, res.PrefillBestTokS)
	fmt.Fprintf(w, "decode           %.1f tok/s  (%d tokens after the %d-token prompt, median of %d; best %.1f)\n", res.DecodeTokS, f.genN, f.promptN, f.reps, res.DecodeBestTokS)
	if res.PastTrained {
		fmt.Fprintf(w, "context          %d positions, past the model's trained %d (--max-context): positions beyond it are extrapolated; speed only\n", res.Context, res.TrainedCtx)
	}
	if res.Policy != "full" {
		fmt.Fprintf(w, "KV policy        %s (prefill and decode runs; the other measurements use the cache without it)\n", res.Policy)
	}
	if c := res.Compression; c != nil {
		printCompression(w, c, f.promptN, f.genN)
	}
	if res.DecodeBaseMS > 0 {
		fmt.Fprintf(w, "decode @%-7d   %.1f tok/s  (%.2f ms a step: the base of the context shares below)\n", res.DecodeBaseCtx, 1e3/res.DecodeBaseMS, res.DecodeBaseMS)
	}
	for _, d := range res.DecodeAt {
		above := ""
		if res.DecodeBaseMS > 0 {
			above = fmt.Sprintf(", the part above the base step %.0f%%", 100*d.ContextShare)
		}
		fmt.Fprintf(w, "decode @%-7d   %.1f tok/s  (%d tokens; %.2f ms a step, attention kernels alone %.2f ms = %.0f%%%s; KV %s)\n",
			d.Context, d.TokS, f.ctxGen, d.StepMS, d.AttnMS, 100*d.AttnShare, above, human(d.KVBytes))
	}
	if len(res.ContextsSkipped) > 0 {
		fmt.Fprintf(w, "contexts skipped %v: no room for %d tokens after them in the context of %d (--max-context raises it)\n", res.ContextsSkipped, f.ctxGen, res.Context)
	}
	for _, b := range res.Batch {
		ratio := ""
		if b.VsBatch1 > 0 {
			ratio = fmt.Sprintf("; vs batch 1: %.2f×, the median of each round's ratio", b.VsBatch1)
		}
		seqs := "1 sequence"
		if b.Batch > 1 {
			seqs = fmt.Sprintf("%d sequences' tokens summed", b.Batch)
		}
		fmt.Fprintf(w, "batch %-4d       %.1f tok/s  (%s; %d steps of model.DecodeBatch after %d-token prompts, median of %d rounds%s)\n",
			b.Batch, b.DecodeTokS, seqs, b.Steps, benchBatchPrompt, b.Rounds, ratio)
	}
	fmt.Fprintf(w, "peak RSS         %s  (the process after the prefill and decode runs: weights, runtime, one sequence's KV cache; not the batched runs or the bandwidth buffer)\n", human(res.PeakRSSBytes))
	if res.BandwidthGBs > 0 {
		fmt.Fprintf(w, "bandwidth        %.1f GB/s read (median of %d rounds; %.1f GB/s with scalar reads)\n", res.BandwidthGBs, len(res.CeilingRounds), res.BandwidthScalarGBs)
		fmt.Fprintf(w, "decode ceiling   %.1f tok/s (%s read per token); reached %.0f%% (median of the rounds'",
			res.CeilingTokS, human(res.BytesPerToken), 100*res.CeilingFraction)
		for _, c := range res.CeilingRounds {
			fmt.Fprintf(w, " %.1f tok/s at %.1f GB/s,", c.DecodeTokS, c.BandwidthGBs)
		}
		fmt.Fprintf(w, " each decode then its bandwidth)\n")
	}
	if res.Sweep != nil {
		printSweep(w, res.Sweep)
	}
	if c := res.CompareKV; c != nil {
		fmt.Fprintf(w, "compare KV       %s %.1f tok/s, %s %.1f tok/s: %s/%s token time %.3f (quartiles %.3f–%.3f; %d rounds from %d tokens of context, in turns; KV per token %d B, %d B)\n",
			c.CodecA, c.ATokS, c.CodecB, c.BTokS, c.CodecA, c.CodecB, c.TimeRatio, c.RatioQ1, c.RatioQ3, c.Rounds, c.Context, c.KVBytesA, c.KVBytesB)
	}
}

// kvBytesPerToken is the cache bytes one token takes in the codecs of opt
// (blocks of opt.BlockTokens; metadata and positions included): the pool's
// kvcache.Footprint, as kvcalc and inspect report it. Only the cache layers
// that grow with every token count: the KV owners that are not
// window-bounded (a window-bounded layer holds a fixed amount once past its
// window, kvcalc's window_bound_bytes).
func kvBytesPerToken(m *model.Model, opt model.KVOptions) int64 {
	B := max(opt.BlockTokens, 1)
	f, err := kvcache.FootprintOf(kvcache.PoolConfig{Layout: m.KVLayout(), BlockTokens: B, K: opt.K, V: opt.V})
	if err != nil {
		return 0 // the pool itself refuses these options, with the error
	}
	l := m.KVLayout()
	growing := 0
	for c := 0; c < l.Layers; c++ {
		if l.Windows == nil || l.Windows[c] == 0 {
			growing++
		}
	}
	return int64(f.BlockBytes) * int64(growing*m.KVHeads) / int64(B)
}

// benchCompare runs --compare-kv: see benchCompareKV.
// The caller checked that the context has room for --prompt, --gen and
// the warm-up.
func benchCompare(mf *modelFlags, f *benchFlags, m *model.Model, a, b string) (*benchCompareKV, error) {
	base, err := mf.kvOptions()
	if err != nil {
		return nil, err
	}
	res := &benchCompareKV{CodecA: a, CodecB: b, Context: f.promptN + compareWarmup}
	var seqs [2]*model.Sequence
	var kvBytes [2]int64
	for i, name := range []string{a, b} {
		opt := base
		if opt.K, err = codec.Parse(name, codec.Keys); err != nil {
			return nil, err
		}
		if opt.V, err = codec.Parse(name, codec.Values); err != nil {
			return nil, err
		}
		seq, err := mf.sequenceWith(m, opt)
		if err != nil {
			return nil, err
		}
		defer seq.Close()
		seqs[i], kvBytes[i] = seq, kvBytesPerToken(m, opt)
	}
	res.KVBytesA, res.KVBytesB = kvBytes[0], kvBytes[1]
	prompt := benchPrompt(f.promptN, m.Vocab, 5)
	var next [2]int
	for i, seq := range seqs {
		logits, err := seq.Forward(prompt, false)
		if err != nil {
			return nil, err
		}
		next[i] = argmaxF(logits)
	}
	var times [2][]float64
	var ratios []float64
	for r := 0; r < compareWarmup+f.genN; r++ {
		var d [2]float64
		for k := range seqs {
			i := k ^ r&1 // A first in even rounds, B first in odd ones
			seq := seqs[i]
			t0 := time.Now()
			logits, err := seq.Forward([]int{next[i]}, false)
			if err != nil {
				return nil, err
			}
			d[i] = time.Since(t0).Seconds()
			next[i] = argmaxF(logits)
		}
		if r >= compareWarmup {
			times[0], times[1] = append(times[0], d[0]), append(times[1], d[1])
			ratios = append(ratios, d[0]/d[1])
		}
	}
	slices.Sort(ratios)
	n := len(ratios)
	res.Rounds = n
	res.TimeRatio, res.RatioQ1, res.RatioQ3 = ratios[n/2], ratios[n/4], ratios[(3*n)/4]
	res.ATokS, res.BTokS = 1/median(times[0]), 1/median(times[1])
	return res, nil
}

// median is the middle of x, the mean of the two middle values when x
// has an even count (two rounds: their mean, not the faster one).
func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	n := len(s)
	if n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}

func peakRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Maxrss * 1024 // KiB on Linux
}

func human(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}
