package main

import (
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

	// Decode at several context lengths (tokens already in the cache).
	DecodeAt []benchDecodeAt `json:"decode_at,omitempty"`
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

type benchDecodeAt struct {
	Context int     `json:"context"`
	TokS    float64 `json:"tok_s"`
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
			if err := tensor.SetKernels(f.kernels); err != nil {
				return err
			}
			defer tensor.SetKernels("auto")
			m, _, err := mf.load()
			if err != nil {
				return err
			}
			defer m.Close()
			if f.promptN+f.genN > m.CtxLen {
				return fmt.Errorf("--prompt %d + --gen %d exceed the context length %d", f.promptN, f.genN, m.CtxLen)
			}
			if cmp != nil && f.promptN+f.genN+compareWarmup > m.CtxLen {
				return fmt.Errorf("--compare-kv: --prompt %d + --gen %d + %d warm-up tokens exceed the context length %d", f.promptN, f.genN, compareWarmup, m.CtxLen)
			}
			res, err := runBench(&mf, &f, m, contexts, batches)
			if err != nil {
				return err
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
	mf.register(c)
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
		Model: mf.model, PromptTokens: f.promptN, GenTokens: f.genN, Reps: f.reps, Threads: threads(),
		WeightsBytes: m.WeightsBytes(), Kernels: tensor.Kernels(),
		KVType: opt.K.Name() + "/" + opt.V.Name(), KVBytesPerToken: kvBytesPerToken(m, opt),
	}
	prompt := benchPrompt(f.promptN, m.Vocab, 1)
	var pre, dec []float64
	for r := 0; r < f.reps; r++ {
		seq, err := mf.sequence(m)
		if err != nil {
			return res, err
		}
		t0 := time.Now()
		logits, err := seq.Forward(prompt, false)
		if err != nil {
			return res, err
		}
		t1 := time.Now()
		for i := 0; i < f.genN; i++ {
			if logits, err = seq.Forward([]int{argmaxF(logits)}, false); err != nil {
				return res, err
			}
		}
		t2 := time.Now()
		seq.Close()
		pre = append(pre, float64(f.promptN)/t1.Sub(t0).Seconds())
		dec = append(dec, float64(f.genN)/t2.Sub(t1).Seconds())
	}
	res.PrefillTokS, res.DecodeTokS = median(pre), median(dec)
	res.PrefillBestTokS, res.DecodeBestTokS = slices.Max(pre), slices.Max(dec)
	// Peak memory of the runs above (the batched sequences and the
	// bandwidth buffer below would add theirs).
	res.PeakRSSBytes = peakRSS()

	// Decode at growing contexts, in one sequence: fill (untimed) up to each
	// context, then time ctxGen decode steps.
	if len(contexts) > 0 {
		seq, err := mf.sequence(m)
		if err != nil {
			return res, err
		}
		fill := benchPrompt(m.CtxLen, m.Vocab, 3)
		slices.Sort(contexts)
		for _, c := range contexts {
			if c+f.ctxGen > m.CtxLen {
				break
			}
			if c > seq.Pos() {
				if _, err := seq.Forward(fill[seq.Pos():c], false); err != nil {
					return res, err
				}
			}
			if c < seq.Pos() {
				continue
			}
			t0 := time.Now()
			for i := 0; i < f.ctxGen; i++ {
				if _, err := seq.Forward([]int{fill[c+i]}, false); err != nil {
					return res, err
				}
			}
			res.DecodeAt = append(res.DecodeAt, benchDecodeAt{Context: c, TokS: float64(f.ctxGen) / time.Since(t0).Seconds()})
		}
		seq.Close()
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
	for _, d := range res.DecodeAt {
		fmt.Fprintf(w, "decode @%-7d   %.1f tok/s  (%d tokens)\n", d.Context, d.TokS, f.ctxGen)
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
	if c := res.CompareKV; c != nil {
		fmt.Fprintf(w, "compare KV       %s %.1f tok/s, %s %.1f tok/s: %s/%s token time %.3f (quartiles %.3f–%.3f; %d rounds from %d tokens of context, in turns; KV per token %d B, %d B)\n",
			c.CodecA, c.ATokS, c.CodecB, c.BTokS, c.CodecA, c.CodecB, c.TimeRatio, c.RatioQ1, c.RatioQ3, c.Rounds, c.Context, c.KVBytesA, c.KVBytesB)
	}
}

// kvBytesPerToken is the cache bytes one token takes in the codecs of opt
// (blocks of opt.BlockTokens; metadata and positions included): the pool's
// kvcache.Footprint, as kvcalc and inspect report it.
func kvBytesPerToken(m *model.Model, opt model.KVOptions) int64 {
	B := max(opt.BlockTokens, 1)
	f, err := kvcache.FootprintOf(kvcache.PoolConfig{Layout: m.KVLayout(), BlockTokens: B, K: opt.K, V: opt.V})
	if err != nil {
		return 0 // the pool itself refuses these options, with the error
	}
	return int64(f.BlockBytes) * int64(m.KVLayout().Layers*m.KVHeads) / int64(B) // the cache layers: the KV owners
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

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
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
