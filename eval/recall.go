package eval

import (
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// Z95 is the normal quantile of a two-sided 95% interval.
const Z95 = 1.959963984540054

// Wilson is the Wilson score interval of k successes in n trials.
func Wilson(k, n int, z float64) (lo, hi float64) {
	if n <= 0 {
		return 0, 1
	}
	return wilsonP(float64(k)/float64(n), float64(n), z)
}

// wilsonP is the Wilson score interval of a rate p measured on N trials
// (N > 0; not necessarily whole: an effective sample size).
func wilsonP(p, N, z float64) (lo, hi float64) {
	d := 1 + z*z/N
	c := (p + z*z/(2*N)) / d
	h := z / d * math.Sqrt(p*(1-p)/N+z*z/(4*N*N))
	return math.Max(0, c-h), math.Min(1, c+h)
}

// WilsonSamples is the fewest trials whose Wilson interval is at most ±half
// whatever the measured rate (the widest is at p̂ = ½: z/(2√(n+z²))).
func WilsonSamples(half, z float64) int {
	n := int(math.Ceil((z/(2*half))*(z/(2*half)) - z*z))
	for n > 1 {
		if lo, hi := Wilson((n-1)/2, n-1, z); (hi-lo)/2 > half {
			break
		}
		n--
	}
	return n
}

// RecallLook is the first look of a sweep with a margin: a cell may stop
// after RecallLook samples, twice that, four times, …, and at N.
const RecallLook = 40

// recallStop says whether a cell of a sweep with margin (cfg.Margin; 0:
// never) stops after n samples, correct of them right, of at most max: at
// max, or at a look (RecallLook·2^k) where the Wilson 95% interval is
// within ±margin. Looking at a few fixed points only, not after every
// sample, keeps the stopping rule from chasing the noise.
func recallStop(correct, n, max int, margin float64) bool {
	if n >= max {
		return true
	}
	if margin <= 0 || n < RecallLook || n%RecallLook != 0 || (n/RecallLook)&(n/RecallLook-1) != 0 {
		return false
	}
	lo, hi := Wilson(correct, n, Z95)
	return (hi-lo)/2 <= margin
}

// Score compares a generated answer with s's: all parts right (exact
// match of each scored span), and the number right.
func Score(s RecallSample, got []int) (all bool, right int) {
	for _, p := range s.Parts {
		if p[1] <= len(got) && slices.Equal(got[p[0]:p[1]], s.Answer[p[0]:p[1]]) {
			right++
		}
	}
	return right == len(s.Parts), right
}

// Confused is how many parts of got are wrong yet copy another value of
// the context: a value no part asks for (s.Others: another key's or
// chain's) or another part's (multi-value, multi-query: the right value
// in the wrong place). The other wrong parts match no value of the
// context: the needle was lost, not confused with another. 0 for cwe
// (every word of its list is in the context).
func Confused(s RecallSample, got []int) int {
	if s.Task == TaskCWE {
		return 0
	}
	n := 0
	for i, p := range s.Parts {
		if p[1] > len(got) {
			continue
		}
		g := got[p[0]:p[1]]
		if slices.Equal(g, s.Answer[p[0]:p[1]]) {
			continue
		}
		other := slices.ContainsFunc(s.Others, func(o []int) bool { return slices.Equal(g, o) })
		for j, q := range s.Parts {
			other = other || (j != i && slices.Equal(g, s.Answer[q[0]:q[1]]))
		}
		if other {
			n++
		}
	}
	return n
}

// The protocols.
const (
	ProtoAware    = "query-aware"    // the question is part of the compressed prompt
	ProtoAgnostic = "query-agnostic" // the context is compressed, then the question appended
)

// The compression schedules.
const (
	SchedPrefill = "prefill" // once, after the prompt (policy every=0)
	SchedDecode  = "decode"  // after the prompt and at every later step (every=1)
	SchedOwn     = "own"     // a method with its own schedule (pyramidinfer): measured once, shown under both
)

// RecallAnswer runs s through m under pc and kv with protocol proto and
// decodes len(s.Answer) tokens greedily, the whole prompt computed in a
// pool of its own. It returns them and the cache's bytes after the
// compression.
func RecallAnswer(m *model.Model, s RecallSample, pc policy.Config, kv model.KVOptions, proto string) ([]int, int64, error) {
	opt := kv
	opt.Tokens = max(len(s.Prompt)+len(s.Answer), 1)
	seq, err := m.NewStandaloneSequence(opt)
	if err != nil {
		return nil, 0, err
	}
	defer seq.Close()
	return recallRun(seq, s, pc, proto)
}

// protoPrompt is the part of s's prompt that is compressed under proto.
func protoPrompt(s RecallSample, proto string) ([]int, error) {
	switch proto {
	case ProtoAware:
		return s.Prompt, nil
	case ProtoAgnostic:
		return s.Prompt[:s.Question], nil
	}
	return nil, fmt.Errorf("recall: unknown protocol %q", proto)
}

// recallRun is RecallAnswer on seq, which holds the first seq.Pos()
// tokens of the prompt already (taken from a prefix cache): it runs the
// rest of the compressed part under pc as the prompt the policy sees, then
// the rest of the prompt and the answer.
func recallRun(seq *model.Sequence, s RecallSample, pc policy.Config, proto string) ([]int, int64, error) {
	pre, err := protoPrompt(s, proto)
	if err != nil {
		return nil, 0, err
	}
	from := seq.Pos()
	if from >= len(pre) {
		return nil, 0, fmt.Errorf("recall: %d of the %d prompt tokens to compress are cached: the last must run", from, len(pre))
	}
	if pc.Method != "" && pc.Method != "full" {
		st, err := policy.New(pc, seq)
		if err != nil {
			return nil, 0, err
		}
		seq.SetPolicy(st)
		seq.Prompt(len(pre) - from)
	}
	logits, err := seq.Forward(pre[from:], false)
	if err != nil {
		return nil, 0, err
	}
	kvb := seq.Cache().Bytes()
	for _, t := range s.Prompt[len(pre):] {
		if logits, err = seq.Forward([]int{t}, false); err != nil {
			return nil, 0, err
		}
	}
	out := make([]int, 0, len(s.Answer))
	for i := range s.Answer {
		next := argmax(logits)
		out = append(out, next)
		if i+1 < len(s.Answer) {
			if logits, err = seq.Forward([]int{next}, false); err != nil {
				return nil, 0, err
			}
		}
	}
	return out, kvb, nil
}

// recallPrefix is one sample's whole prompt computed once, without a
// policy, in a pool of its own, its full blocks registered for reuse.
// Each method's run then starts from the cached blocks it may take
// (policy.Config.ComputedTail: none for a method that reads every prompt
// query or changes the prefill — h2o, expected, pyramidinfer —, the
// blocks before the observation window for SnapKV's family, all but the
// last block for the rest and the full cache) and computes the rest, as
// the engine's prefix cache does. The query-agnostic protocol reuses the
// same blocks: its compressed part is a prefix of the prompt. Pools whose
// keys wait in a KIVI residual keep no prefix: every run there computes
// its whole prompt. TestComputedTail shows a method's compressed result
// is then a whole prefill's; TestRecallShared that a sweep's cells are.
type recallPrefix struct {
	m      *model.Model
	pool   *kvcache.Pool
	kv     model.KVOptions
	reused int // prompt tokens the runs took from the cache
	ran    int // prompt tokens the runs computed
}

// newRecallPrefix computes s's prompt in a pool of codec kv with room for
// it and one run beside it.
func newRecallPrefix(m *model.Model, s RecallSample, kv model.KVOptions) (*recallPrefix, error) {
	opt := kv
	opt.Tokens, opt.MemBytes = 0, 2*poolHeadroom(m)
	pool, err := m.NewPool(opt)
	if err != nil {
		return nil, err
	}
	c := pool.NewSequence()
	defer c.Free()
	seq, err := m.NewSequence(c)
	if err != nil {
		return nil, err
	}
	seq.LCKVPasses = kv.LCKVPasses
	if _, err := seq.Forward(s.Prompt, false); err != nil {
		return nil, err
	}
	c.RegisterPrefix(s.Prompt, 0)
	return &recallPrefix{m: m, pool: pool, kv: kv}, nil
}

// answer is RecallAnswer's result for s under pc and proto, from the
// cached blocks pc's method may reuse.
func (p *recallPrefix) answer(s RecallSample, pc policy.Config, proto string) ([]int, int64, error) {
	pre, err := protoPrompt(s, proto)
	if err != nil {
		return nil, 0, err
	}
	tail := 1 // the full cache: any prefix
	if pc.Method != "" && pc.Method != "full" {
		nc, err := pc.Normalize()
		if err != nil {
			return nil, 0, err
		}
		tail = nc.ComputedTail(len(pre))
	}
	c := p.pool.NewSequence()
	k := c.MatchPrefix(pre[:len(pre)-tail+1], 0)
	p.reused += k
	p.ran += len(s.Prompt) - k
	seq, err := p.m.NewSequence(c)
	if err != nil {
		c.Free()
		return nil, 0, err
	}
	defer seq.Close()
	seq.LCKVPasses = p.kv.LCKVPasses
	return recallRun(seq, s, pc, proto)
}

// RecallConfig chooses what a recall sweep measures.
type RecallConfig struct {
	Model    string    `json:"model"`
	Tasks    []string  `json:"tasks"`
	Contexts []int     `json:"contexts"`         // nil: RecallContexts(model)
	Depths   []float64 `json:"depths"`           // niah_single's
	N        int       `json:"samples_per_cell"` // the most with Margin
	// Margin > 0 stops a cell at the first look (RecallLooks) where its
	// Wilson 95% interval is within ±Margin; 0 runs N samples in every cell.
	Margin    float64    `json:"margin,omitempty"`
	Methods   []string   `json:"methods"` // "full" is the uncompressed cache; nil: full and every registered method
	Ratios    []float64  `json:"ratios"`
	Codecs    []string   `json:"codecs"`
	Schedules []string   `json:"schedules"`
	Protocols []string   `json:"protocols"`
	Spec      RecallSpec `json:"spec"`
	Quick     bool       `json:"quick"`
	Workers   int        `json:"workers,omitempty"` // cells at a time
	Progress  Progress   `json:"-"`
	// whole computes every run's whole prompt in a pool of its own
	// (RecallAnswer) instead of from a prompt computed once per sample
	// (recallPrefix): the reference TestRecallShared holds the shared
	// runs to.
	whole bool
}

// DefaultRecall is the full suite; quick is CI's: the full cache and one
// method, a few cells, few samples.
func DefaultRecall(quick bool) RecallConfig {
	c := RecallConfig{
		Tasks: RecallTasks, Depths: NeedleDepths, N: WilsonSamples(0.05, Z95),
		Ratios: []float64{0.5, 0.25, 0.125, 0.0625}, Codecs: []string{"f16", "q8", "q4", "kivi2"},
		Schedules: []string{SchedPrefill, SchedDecode}, Protocols: []string{ProtoAware, ProtoAgnostic},
		Spec: DefaultRecallSpec(), Quick: quick, Workers: 2,
	}
	if quick {
		c.Contexts = []int{256}
		c.Depths = []float64{0, 0.5, 1}
		c.N = 8
		c.Methods = []string{"full", "snapkv"}
		c.Ratios = []float64{0.25}
		c.Codecs = []string{"f16"}
		c.Schedules = []string{SchedPrefill}
	}
	return c
}

// RecallContexts are the suite's context lengths a model fits: 512, 1,024
// and 2,048 up to its context, or its own context when it is shorter.
func RecallContexts(ctxLen int) []int {
	var out []int
	for _, c := range []int{512, 1024, 2048} {
		if c <= ctxLen {
			out = append(out, c)
		}
	}
	if out == nil {
		out = []int{ctxLen}
	}
	return out
}

// RecallCell is one (model, method, ratio, codec, schedule, protocol,
// task, context, depth) cell.
type RecallCell struct {
	Model    string  `json:"model"`
	Method   string  `json:"method"`
	Policy   string  `json:"policy,omitempty"` // the normalized configuration
	Ratio    float64 `json:"ratio"`            // 1 for the full cache
	Codec    string  `json:"codec"`
	Schedule string  `json:"schedule"`
	Protocol string  `json:"protocol"`
	Task     string  `json:"task"`
	Context  int     `json:"context"`
	Depth    float64 `json:"depth"` // −1 but for niah_single
	N        int     `json:"n"`
	Correct  int     `json:"correct"` // samples with every part right
	Parts    int     `json:"parts"`   // parts scored
	PartsOK  int     `json:"parts_correct"`
	// PartsConfused is the wrong parts that copy another value of the
	// context (Confused): the others lost their needle.
	PartsConfused int     `json:"parts_confused"`
	Acc           float64 `json:"accuracy"` // Correct / N
	Lo            float64 `json:"lo"`       // Wilson 95% interval of Acc
	Hi            float64 `json:"hi"`
	Chance        float64 `json:"chance"`   // a constant answer's all-correct rate
	KVBytes       float64 `json:"kv_bytes"` // mean cache bytes after the compression
	Seconds       float64 `json:"seconds"`
	Error         string  `json:"error,omitempty"`
}

// RecallResults is what a recall sweep measured.
type RecallResults struct {
	Config RecallConfig `json:"config"`
	Cells  []RecallCell `json:"cells"`
	Wall   float64      `json:"wall_seconds"`
	// The run's command line and git commit (kvlm eval sets them; --from
	// renders a saved run's report with them).
	Command string `json:"command,omitempty"`
	Commit  string `json:"commit,omitempty"`
	Dirty   bool   `json:"dirty,omitempty"`
	// PromptReuse is the share of the runs' prompt tokens taken from the
	// sample's prompt computed once (recallPrefix); 0 in runs saved
	// before that.
	PromptReuse float64 `json:"prompt_reuse,omitempty"`
	// Confusion says the cells count their confused parts
	// (PartsConfused); runs saved before that have none.
	Confusion bool `json:"confusion,omitempty"`
}

// recallConfig is a method's policy at a ratio on a prompt of n tokens
// under a schedule.
func recallConfig(method string, ratio float64, n int, sched string) (policy.Config, error) {
	if method == "full" {
		return policy.Config{Method: "full"}, nil
	}
	mode, err := MethodMode(method)
	if err != nil {
		return policy.Config{}, err
	}
	pc := methodConfig(method, mode, ratio, n)
	if mode == modeSchedule {
		if sched != SchedOwn {
			return pc, fmt.Errorf("recall: %s has its own schedule", method)
		}
		return pc, nil
	}
	switch sched {
	case SchedPrefill:
		pc.Every = policy.EveryNever
	case SchedDecode:
		pc.Every = 1
	default:
		return pc, fmt.Errorf("recall: unknown schedule %q", sched)
	}
	return pc, nil
}

// RecallSweep runs cfg on m (named name in the cells) with vocabulary v.
func RecallSweep(m *model.Model, name string, v *RecallVocab, cfg RecallConfig) (*RecallResults, error) {
	t0 := time.Now()
	if cfg.Contexts == nil {
		cfg.Contexts = RecallContexts(m.CtxLen)
	}
	if cfg.Methods == nil {
		cfg.Methods = append([]string{"full"}, slices.DeleteFunc(slices.Clone(policy.Methods), func(s string) bool { return s == "full" })...)
	}
	if cfg.N < 1 {
		return nil, fmt.Errorf("recall: %d samples per cell", cfg.N)
	}
	for _, c := range cfg.Contexts {
		if c > m.CtxLen {
			return nil, fmt.Errorf("recall: context %d exceeds the model's %d", c, m.CtxLen)
		}
	}
	if v.tok.VocabSize() != m.Vocab {
		return nil, fmt.Errorf("recall: the tokenizer has %d ids, the model %d", v.tok.VocabSize(), m.Vocab)
	}
	// The samples: a function of (task, context, depth, seed), seeds 0..N−1.
	type group struct {
		task    string
		ctx     int
		depth   float64
		samples []RecallSample
		chance  float64
	}
	var groups []*group
	for _, task := range cfg.Tasks {
		chance, _, err := v.ChanceRate(cfg.Spec, task)
		if err != nil {
			return nil, err
		}
		depths := []float64{-1}
		if task == TaskNeedle {
			depths = cfg.Depths
		}
		for _, ctx := range cfg.Contexts {
			for _, d := range depths {
				g := &group{task: task, ctx: ctx, depth: d, chance: chance}
				for seed := range uint64(cfg.N) {
					s, err := v.Sample(cfg.Spec, task, ctx, d, seed)
					if err != nil {
						return nil, err
					}
					g.samples = append(g.samples, s)
				}
				groups = append(groups, g)
			}
		}
	}
	type variant struct {
		method, codec, sched, proto string
		ratio                       float64
	}
	var variants []variant
	for _, meth := range cfg.Methods {
		for _, proto := range cfg.Protocols {
			if meth == "full" {
				variants = append(variants, variant{"full", "f32", "-", proto, 1})
				continue
			}
			scheds := cfg.Schedules
			if mode, err := MethodMode(meth); err != nil {
				return nil, err
			} else if mode == modeSchedule {
				scheds = []string{SchedOwn}
			}
			for _, r := range cfg.Ratios {
				for _, c := range cfg.Codecs {
					for _, sc := range scheds {
						variants = append(variants, variant{meth, c, sc, proto, r})
					}
				}
			}
		}
	}
	cells := make([]RecallCell, len(variants)*len(groups))
	for vi, va := range variants {
		for gi, g := range groups {
			cells[vi*len(groups)+gi] = RecallCell{Model: name, Method: va.method, Ratio: va.ratio, Codec: va.codec, Schedule: va.sched,
				Protocol: va.proto, Task: g.task, Context: g.ctx, Depth: g.depth, Chance: g.chance}
		}
	}
	// A job is a group under one codec (f32: the full cache): every
	// variant of that codec runs the group's samples in seed order, each
	// sample's prompt computed once for all of them (recallPrefix) unless
	// cfg.whole. A cell stops by its own count (recallStop), so it sees
	// the samples a job of its own would.
	var codecs []string
	for _, va := range variants {
		if !slices.Contains(codecs, va.codec) {
			codecs = append(codecs, va.codec)
		}
	}
	var jobs []job
	var reused, ran atomic.Int64
	for _, kc := range codecs {
		var kv model.KVOptions
		if kc != "f32" {
			var err error
			if kv, err = kvCodec(kc); err != nil {
				return nil, err
			}
			kv.MemBytes = poolHeadroom(m)
		}
		for gi, g := range groups {
			var run []*recallRunning
			for vi, va := range variants {
				if va.codec == kc {
					run = append(run, &recallRunning{cell: &cells[vi*len(groups)+gi], method: va.method, ratio: va.ratio, sched: va.sched})
				}
			}
			w := int64(len(g.samples)) * int64(g.ctx) * int64(len(run))
			jobs = append(jobs, job{w, fmt.Sprintf("%s %s %d %g", kc, g.task, g.ctx, g.depth), func() error {
				r, n := recallGroup(m, g.samples, run, kv, cfg)
				reused.Add(r)
				ran.Add(n)
				return nil
			}})
		}
	}
	if cfg.Progress != nil {
		var total int64
		for _, j := range jobs {
			total += j.weight
		}
		cfg.Progress.Start(total)
	}
	if err := runJobs(jobs, max(1, cfg.Workers), cfg.Progress); err != nil {
		return nil, err
	}
	res := &RecallResults{Config: cfg, Cells: cells, Wall: time.Since(t0).Seconds(), Confusion: true}
	if t := reused.Load() + ran.Load(); t > 0 {
		res.PromptReuse = float64(reused.Load()) / float64(t)
	}
	return res, nil
}

// recallRunning is a cell being measured: its variant and its running
// totals.
type recallRunning struct {
	cell          *RecallCell
	method, sched string
	ratio         float64
	done          bool
	kvBytes       float64       // summed over the samples run
	took          time.Duration // its runs and its share of the shared prompts
}

// recallGroup runs the cells of run (all of one codec, kv) on samples,
// in order, each until its stop (recallStop) or an error (the cell's
// Error); then sets their rates, intervals, bytes and seconds. It returns
// the prompt tokens the runs took from the shared prompts and those they
// computed.
func recallGroup(m *model.Model, samples []RecallSample, run []*recallRunning, kv model.KVOptions, cfg RecallConfig) (reused, ran int64) {
	for _, s := range samples {
		var live []*recallRunning
		for _, r := range run {
			if !r.done {
				live = append(live, r)
			}
		}
		if len(live) == 0 {
			break
		}
		t0 := time.Now()
		var pre *recallPrefix
		if !cfg.whole {
			var err error
			if pre, err = newRecallPrefix(m, s, kv); err != nil {
				for _, r := range live {
					r.cell.Error, r.done = err.Error(), true
				}
				break
			}
		}
		share := time.Since(t0) / time.Duration(len(live))
		for _, r := range live {
			t1 := time.Now()
			cell := r.cell
			n := len(s.Prompt)
			if cell.Protocol == ProtoAgnostic {
				n = s.Question
			}
			pc, err := recallConfig(r.method, r.ratio, n, r.sched)
			if err == nil && cell.Policy == "" {
				if nc, e := pc.Normalize(); e == nil {
					cell.Policy = nc.String()
				}
			}
			var got []int
			var b int64
			if err == nil {
				if pre != nil {
					got, b, err = pre.answer(s, pc, cell.Protocol)
				} else {
					got, b, err = RecallAnswer(m, s, pc, kv, cell.Protocol)
				}
			}
			r.took += time.Since(t1) + share
			if pre == nil && err == nil {
				ran += int64(len(s.Prompt))
			}
			if err != nil {
				cell.Error, r.done = err.Error(), true
				continue
			}
			all, right := Score(s, got)
			cell.N++
			if all {
				cell.Correct++
			}
			cell.Parts += len(s.Parts)
			cell.PartsOK += right
			cell.PartsConfused += Confused(s, got)
			r.kvBytes += float64(b)
			r.done = recallStop(cell.Correct, cell.N, len(samples), cfg.Margin)
		}
		if pre != nil {
			reused += int64(pre.reused)
			ran += int64(pre.ran)
		}
	}
	for _, r := range run {
		cell := r.cell
		if cell.Error != "" {
			continue // reported as n/a
		}
		cell.Acc = float64(cell.Correct) / float64(cell.N)
		cell.Lo, cell.Hi = Wilson(cell.Correct, cell.N, Z95)
		cell.KVBytes = r.kvBytes / float64(cell.N)
		cell.Seconds = r.took.Seconds()
	}
	return reused, ran
}
