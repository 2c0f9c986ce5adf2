package server

import (
	"strconv"
	"sync"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/kvevents"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics is the /metrics registry: kvlm's own names, and the vLLM names
// that Kubernetes' Gateway API Inference Extension and llm-d schedulers
// scrape, with vLLM's types, labels (model_name, engine "0"), buckets and
// meanings (vllm/v1/metrics/loggers.py; docs/KVEVENTS.md "Router
// metrics"), so kvlm replicas can sit behind those gateways unchanged.
type metrics struct {
	reg   *prometheus.Registry
	model string

	ttft, itl         prometheus.Histogram
	vttft, vitl       prometheus.Histogram
	ve2e              prometheus.Histogram
	step              prometheus.Histogram
	evicted           *prometheus.CounterVec
	finished          *prometheus.CounterVec
	vsuccess          *prometheus.CounterVec
	requests          *prometheus.CounterVec
	preempted         prometheus.Counter
	vpreempted        prometheus.Counter
	genTokens         prometheus.Counter
	promptTokens      prometheus.Counter
	vGenTok, vPromTok prometheus.Counter

	mu      sync.Mutex
	buckets [64]tpsBucket // generated tokens per second, ring by unix second
}

type tpsBucket struct {
	sec int64
	n   int
}

var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}

// vLLM's buckets (vllm/v1/metrics/loggers.py): time to first token, inter
// token latency (and time per output token), request latencies.
var (
	vllmTTFTBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	vllmITLBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	vllmRequestBuckets = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
)

// vllmFinishReasons are vLLM's finished_reason values
// (vllm/v1/engine/__init__.py FINISH_REASON_STRINGS), each counted from 0
// as vLLM does.
var vllmFinishReasons = []string{"stop", "length", "abort", "error", "repetition"}

// vllmReason is the finished_reason of a sample that ended for r: a stop
// token or string is "stop", max_tokens or the context "length" (vLLM's
// max_model_len), a cancelled request "abort", a failure "error".
func vllmReason(r engine.FinishReason) string {
	switch r {
	case engine.FinishEOS, engine.FinishStopped:
		return "stop"
	case engine.FinishLength, engine.FinishContext:
		return "length"
	case engine.FinishCancelled:
		return "abort"
	}
	return "error"
}

func newMetrics(e *engine.Engine, modelName string, ev *kvevents.Publisher) *metrics {
	reg := prometheus.NewRegistry()
	lbl := prometheus.Labels{"model_name": modelName, "engine": "0"}
	m := &metrics{reg: reg, model: modelName,
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvlm_time_to_first_token_seconds",
			Help: "Time from a request's arrival to its first generated token.", Buckets: latencyBuckets}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvlm_inter_token_latency_seconds",
			Help: "Time between two generated tokens of a sample.", Buckets: latencyBuckets}),
		vttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
			Help: "Histogram of time to first token in seconds (vLLM name).", Buckets: vllmTTFTBuckets, ConstLabels: lbl}),
		vitl: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:inter_token_latency_seconds",
			Help: "Histogram of inter token latency in seconds (vLLM name).", Buckets: vllmITLBuckets, ConstLabels: lbl}),
		ve2e: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds",
			Help: "Histogram of e2e request latency in seconds: from a request's arrival to the end of each of its samples (vLLM name).", Buckets: vllmRequestBuckets, ConstLabels: lbl}),
		vsuccess: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
			Help: "Count of successfully processed requests (each sample of an n > 1 request counts), by finished_reason (vLLM name).", ConstLabels: lbl}, []string{"finished_reason"}),
		vpreempted: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:num_preemptions_total",
			Help: "Cumulative number of preemptions from the engine (vLLM name).", ConstLabels: lbl}),
		step: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvlm_scheduler_step_seconds",
			Help: "Duration of one scheduler step (a decode batch and a prefill chunk).", Buckets: latencyBuckets}),
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvlm_kv_evicted_tokens_total",
			Help: "Tokens dropped from the KV cache by compression policies (mean over (layer, KV head) tables), by policy."}, []string{"policy"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvlm_samples_finished_total",
			Help: "Samples ended, by reason."}, []string{"reason"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvlm_http_requests_total",
			Help: "HTTP requests answered, by endpoint and status code."}, []string{"endpoint", "code"}),
		preempted: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvlm_preemptions_total",
			Help: "Samples preempted when the KV pool ran dry (recomputed later)."}),
		genTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvlm_generation_tokens_total",
			Help: "Tokens generated."}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvlm_prompt_tokens_total",
			Help: "Prompt tokens of finished requests (cached ones included)."}),
		vGenTok: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:generation_tokens_total",
			Help: "Tokens generated (vLLM name).", ConstLabels: lbl}),
		vPromTok: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total",
			Help: "Prompt tokens (vLLM name).", ConstLabels: lbl}),
	}
	for _, r := range vllmFinishReasons {
		m.vsuccess.WithLabelValues(r)
	}
	reg.MustRegister(m.ttft, m.itl, m.vttft, m.vitl, m.ve2e, m.step, m.evicted, m.finished, m.vsuccess, m.requests, m.preempted, m.vpreempted,
		m.genTokens, m.promptTokens, m.vGenTok, m.vPromTok,
		&engineCollector{e: e, m: m}, storeCollector{e},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if ev != nil {
		reg.MustRegister(eventsCollector{ev})
	}
	return m
}

// The engine.Observer methods.

func (m *metrics) FirstToken(d time.Duration) {
	m.ttft.Observe(d.Seconds())
	m.vttft.Observe(d.Seconds())
}

func (m *metrics) InterToken(d time.Duration) {
	m.itl.Observe(d.Seconds())
	m.vitl.Observe(d.Seconds())
}

func (m *metrics) Step(prefill, generated int, d time.Duration) {
	m.step.Observe(d.Seconds())
	if generated == 0 {
		return
	}
	m.genTokens.Add(float64(generated))
	m.vGenTok.Add(float64(generated))
	now := time.Now().Unix()
	m.mu.Lock()
	b := &m.buckets[now%int64(len(m.buckets))]
	if b.sec != now {
		*b = tpsBucket{sec: now}
	}
	b.n += generated
	m.mu.Unlock()
}

func (m *metrics) Evicted(policy string, tokens float64) {
	m.evicted.WithLabelValues(policy).Add(tokens)
}
func (m *metrics) Preempted() {
	m.preempted.Inc()
	m.vpreempted.Inc()
}

func (m *metrics) Finished(r engine.FinishReason, e2e time.Duration) {
	m.finished.WithLabelValues(string(r)).Inc()
	m.vsuccess.WithLabelValues(vllmReason(r)).Inc()
	m.ve2e.Observe(e2e.Seconds())
}

func (m *metrics) prompt(n int) {
	m.promptTokens.Add(float64(n))
	m.vPromTok.Add(float64(n))
}

// tokensPerSecond is the generation rate over the last 10 whole seconds.
func (m *metrics) tokensPerSecond() float64 {
	now := time.Now().Unix()
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for s := now - 10; s < now; s++ {
		if b := m.buckets[s%int64(len(m.buckets))]; b.sec == s {
			n += b.n
		}
	}
	return float64(n) / 10
}

// engineCollector reads the engine's state at scrape time.
type engineCollector struct {
	e *engine.Engine
	m *metrics
}

var (
	dBlocksTotal  = prometheus.NewDesc("kvlm_kv_blocks_total", "KV blocks the pool holds memory for now (taken from the one KV arena of all pools as it grows).", []string{"pool"}, nil)
	dBlocksUsed   = prometheus.NewDesc("kvlm_kv_blocks_used", "KV blocks referenced by sequences.", []string{"pool"}, nil)
	dBlocksCached = prometheus.NewDesc("kvlm_kv_blocks_cached", "Free KV blocks still holding a reusable prompt prefix.", []string{"pool"}, nil)
	dBlocksBudget = prometheus.NewDesc("kvlm_kv_budget_blocks", "KV blocks of the default codecs that the byte budget holds.", nil, nil)
	dBlockEvict   = prometheus.NewDesc("kvlm_prefix_cache_block_evictions_total", "Cached prefix blocks reused for new data.", []string{"pool"}, nil)
	dBlockQueries = prometheus.NewDesc("kvlm_prefix_cache_block_queries_total", "Blocks looked up in the prefix cache.", []string{"pool"}, nil)
	dBlockHits    = prometheus.NewDesc("kvlm_prefix_cache_block_hits_total", "Blocks found in the prefix cache.", []string{"pool"}, nil)
	dCOW          = prometheus.NewDesc("kvlm_kv_copy_on_write_total", "Shared KV blocks copied before a write.", []string{"pool"}, nil)
	dBytesBudget  = prometheus.NewDesc("kvlm_kv_bytes_budget", "KV byte budget of all pools together.", nil, nil)
	dBytesUsed    = prometheus.NewDesc("kvlm_kv_bytes_used", "KV bytes referenced by sequences, all pools.", nil, nil)
	dUsage        = prometheus.NewDesc("kvlm_kv_usage_ratio", "Fraction of the KV budget in use (0–1).", nil, nil)
	dRunning      = prometheus.NewDesc("kvlm_requests_running", "Samples decoding or prefilling.", nil, nil)
	dWaiting      = prometheus.NewDesc("kvlm_requests_waiting", "Requests queued and preempted samples waiting.", nil, nil)
	dPQueries     = prometheus.NewDesc("kvlm_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", nil, nil)
	dPHits        = prometheus.NewDesc("kvlm_prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", nil, nil)
	dPHitRate     = prometheus.NewDesc("kvlm_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache over those looked up (0–1).", nil, nil)
	dPComputed    = prometheus.NewDesc("kvlm_prompt_tokens_computed_total", "Prompt tokens run through the model (the others came from the prefix cache; recomputations after a preemption included).", nil, nil)
	dCHits        = prometheus.NewDesc("kvlm_compressed_prefix_hits_total", "Requests with a policy that started from a compressed prefix (their whole prompt compressed before under the same kv settings).", nil, nil)
	dCMisses      = prometheus.NewDesc("kvlm_compressed_prefix_misses_total", "Requests with a policy that found no compressed prefix of their prompt.", nil, nil)
	dCEntries     = prometheus.NewDesc("kvlm_compressed_prefixes", "Compressed prefixes cached (all pools).", nil, nil)
	dCBytes       = prometheus.NewDesc("kvlm_compressed_prefix_bytes", "Bytes of the KV blocks of the cached compressed prefixes (a block two share counts in each).", nil, nil)
	dTPS          = prometheus.NewDesc("kvlm_generation_tokens_per_second", "Tokens generated per second over the last 10 seconds.", nil, nil)
	vLabels       = []string{"model_name", "engine"}
	dVRunning     = prometheus.NewDesc("vllm:num_requests_running", "Requests running (vLLM name).", vLabels, nil)
	dVWaiting     = prometheus.NewDesc("vllm:num_requests_waiting", "Requests waiting (vLLM name).", vLabels, nil)
	dVKV          = prometheus.NewDesc("vllm:kv_cache_usage_perc", "KV cache usage, 1 means 100 percent (vLLM name).", vLabels, nil)
	dVGPU         = prometheus.NewDesc("vllm:gpu_cache_usage_perc", "KV cache usage, 1 means 100 percent (older vLLM name).", vLabels, nil)
	dVPQ          = prometheus.NewDesc("vllm:prefix_cache_queries_total", "Prefix cache queries in tokens (vLLM name).", vLabels, nil)
	dVPH          = prometheus.NewDesc("vllm:prefix_cache_hits_total", "Prefix cache hits in tokens (vLLM name).", vLabels, nil)
	dVCfg         = prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig: block_size tokens a block, num_gpu_blocks blocks of every layer and KV head in the default codecs that the KV budget holds (vLLM name).",
		[]string{"model_name", "engine", "block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching"}, nil)
)

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dBlocksTotal, dBlocksUsed, dBlocksCached, dBlocksBudget, dBlockEvict, dBlockQueries, dBlockHits, dCOW,
		dBytesBudget, dBytesUsed, dUsage, dRunning, dWaiting, dPQueries, dPHits, dPHitRate, dPComputed, dCHits, dCMisses, dCEntries, dCBytes, dTPS,
		dVRunning, dVWaiting, dVKV, dVGPU, dVPQ, dVPH, dVCfg} {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.Stats()
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	ctr := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	for _, p := range st.Pools {
		g(dBlocksTotal, float64(p.Blocks), p.Name)
		g(dBlocksUsed, float64(p.Used), p.Name)
		g(dBlocksCached, float64(p.Cached), p.Name)
		ctr(dBlockEvict, float64(p.PrefixEvictions), p.Name)
		ctr(dBlockQueries, float64(p.PrefixQueries), p.Name)
		ctr(dBlockHits, float64(p.PrefixHits), p.Name)
		ctr(dCOW, float64(p.CopyOnWrite), p.Name)
	}
	usage := 0.0
	if st.BudgetBytes > 0 {
		usage = min(1, float64(st.UsedBytes)/float64(st.BudgetBytes))
	}
	budgetBlocks, vllmBlocks, blockSize, dtype := 0, 0, 0, ""
	if len(st.Pools) > 0 {
		def := st.Pools[0]
		for _, p := range st.Pools {
			if p.Name == c.e.Config().K+"/"+c.e.Config().V {
				def = p
			}
		}
		l := c.e.Model().KVLayout()
		budgetBlocks, blockSize, dtype = int(st.BudgetBytes/int64(def.BlockBytes)), def.BlockTokens, def.Name
		// A vLLM block holds block_size tokens of every layer and KV head;
		// a kvlm block one (layer, KV head)'s.
		vllmBlocks = budgetBlocks / (l.Layers * l.KVHeads)
	}
	g(dBlocksBudget, float64(budgetBlocks))
	g(dBytesBudget, float64(st.BudgetBytes))
	g(dBytesUsed, float64(st.UsedBytes))
	g(dUsage, usage)
	g(dRunning, float64(st.Running))
	g(dWaiting, float64(st.Waiting))
	ctr(dPQueries, float64(st.PrefixQueried))
	ctr(dPHits, float64(st.PrefixHit))
	rate := 0.0
	if st.PrefixQueried > 0 {
		rate = float64(st.PrefixHit) / float64(st.PrefixQueried)
	}
	g(dPHitRate, rate)
	ctr(dPComputed, float64(st.PrefillComputed))
	ctr(dCHits, float64(st.CompressedHits))
	ctr(dCMisses, float64(st.CompressedMisses))
	g(dCEntries, float64(st.CompressedPrefixes))
	g(dCBytes, float64(st.CompressedBytes))
	g(dTPS, c.m.tokensPerSecond())
	name, eng := c.m.model, "0"
	g(dVRunning, float64(st.Running), name, eng)
	g(dVWaiting, float64(st.Waiting), name, eng)
	g(dVKV, usage, name, eng)
	g(dVGPU, usage, name, eng)
	ctr(dVPQ, float64(st.PrefixQueried), name, eng)
	ctr(dVPH, float64(st.PrefixHit), name, eng)
	g(dVCfg, 1, name, eng, strconv.Itoa(blockSize), strconv.Itoa(vllmBlocks), dtype, "True")
}

// eventsCollector reads the KV event publisher's counters.
type eventsCollector struct{ p *kvevents.Publisher }

var (
	dEvSent    = prometheus.NewDesc("kvlm_kv_events_total", "KV events published (a BlockStored of several blocks counts once).", nil, nil)
	dEvBatches = prometheus.NewDesc("kvlm_kv_event_batches_total", "KV event batches published (sequence numbers used).", nil, nil)
	dEvDropped = prometheus.NewDesc("kvlm_kv_events_dropped_total", "KV events dropped because the publisher's queue was full.", nil, nil)
	dEvReplays = prometheus.NewDesc("kvlm_kv_event_replays_total", "Replay requests answered by the KV event replay socket.", nil, nil)
)

func (c eventsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dEvSent, dEvBatches, dEvDropped, dEvReplays} {
		ch <- d
	}
}

func (c eventsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.p.Stats()
	for _, x := range []struct {
		d *prometheus.Desc
		v int64
	}{{dEvSent, st.Events}, {dEvBatches, st.Batches}, {dEvDropped, st.Dropped}, {dEvReplays, st.Replays}} {
		ch <- prometheus.MustNewConstMetric(x.d, prometheus.CounterValue, float64(x.v))
	}
}
