package server

import (
	"strconv"
	"sync"
	"time"

	"github.com/kvlm/kvlm/engine"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics is the /metrics registry: kvlm's own names, and the vLLM names
// that Kubernetes' Gateway API Inference Extension and llm-d schedulers
// scrape (vllm:num_requests_waiting, vllm:num_requests_running,
// vllm:kv_cache_usage_perc and the older vllm:gpu_cache_usage_perc as a
// 0–1 fraction, prefix-cache queries and hits in tokens), so kvlm replicas
// can sit behind those gateways unchanged.
type metrics struct {
	reg   *prometheus.Registry
	model string

	ttft, itl         prometheus.Histogram
	vttft, vitl       prometheus.Histogram
	step              prometheus.Histogram
	evicted           *prometheus.CounterVec
	finished          *prometheus.CounterVec
	requests          *prometheus.CounterVec
	preempted         prometheus.Counter
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

func newMetrics(e *engine.Engine, modelName string) *metrics {
	reg := prometheus.NewRegistry()
	lbl := prometheus.Labels{"model_name": modelName}
	m := &metrics{reg: reg, model: modelName,
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvlm_time_to_first_token_seconds",
			Help: "Time from a request's arrival to its first generated token.", Buckets: latencyBuckets}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvlm_inter_token_latency_seconds",
			Help: "Time between two generated tokens of a sample.", Buckets: latencyBuckets}),
		vttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
			Help: "Time to first token (vLLM name).", Buckets: latencyBuckets, ConstLabels: lbl}),
		vitl: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:inter_token_latency_seconds",
			Help: "Inter-token latency (vLLM name).", Buckets: latencyBuckets, ConstLabels: lbl}),
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
	reg.MustRegister(m.ttft, m.itl, m.vttft, m.vitl, m.step, m.evicted, m.finished, m.requests, m.preempted,
		m.genTokens, m.promptTokens, m.vGenTok, m.vPromTok,
		&engineCollector{e: e, m: m, lbl: lbl}, storeCollector{e},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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
func (m *metrics) Preempted()                     { m.preempted.Inc() }
func (m *metrics) Finished(r engine.FinishReason) { m.finished.WithLabelValues(string(r)).Inc() }

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
	e   *engine.Engine
	m   *metrics
	lbl prometheus.Labels
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
	vLabels       = []string{"model_name"}
	dVRunning     = prometheus.NewDesc("vllm:num_requests_running", "Requests running (vLLM name).", vLabels, nil)
	dVWaiting     = prometheus.NewDesc("vllm:num_requests_waiting", "Requests waiting (vLLM name).", vLabels, nil)
	dVKV          = prometheus.NewDesc("vllm:kv_cache_usage_perc", "KV cache usage, 1 means 100 percent (vLLM name).", vLabels, nil)
	dVGPU         = prometheus.NewDesc("vllm:gpu_cache_usage_perc", "KV cache usage, 1 means 100 percent (older vLLM name).", vLabels, nil)
	dVPQ          = prometheus.NewDesc("vllm:prefix_cache_queries_total", "Prefix cache queries in tokens (vLLM name).", vLabels, nil)
	dVPH          = prometheus.NewDesc("vllm:prefix_cache_hits_total", "Prefix cache hits in tokens (vLLM name).", vLabels, nil)
	dVCfg         = prometheus.NewDesc("vllm:cache_config_info", "KV cache configuration (vLLM name).", []string{"model_name", "block_size", "num_gpu_blocks", "cache_dtype"}, nil)
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
	budgetBlocks, blockSize, dtype := 0, 0, ""
	if len(st.Pools) > 0 {
		def := st.Pools[0]
		for _, p := range st.Pools {
			if p.Name == c.e.Config().K+"/"+c.e.Config().V {
				def = p
			}
		}
		budgetBlocks, blockSize, dtype = int(st.BudgetBytes/int64(def.BlockBytes)), def.BlockTokens, def.Name
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
	name := c.m.model
	g(dVRunning, float64(st.Running), name)
	g(dVWaiting, float64(st.Waiting), name)
	g(dVKV, usage, name)
	g(dVGPU, usage, name)
	ctr(dVPQ, float64(st.PrefixQueried), name)
	ctr(dVPH, float64(st.PrefixHit), name)
	g(dVCfg, 1, name, strconv.Itoa(blockSize), strconv.Itoa(budgetBlocks), dtype)
}
