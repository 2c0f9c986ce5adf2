package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvlm/kvlm/engine"
)

// scrape reads /metrics as Prometheus' text format: the TYPE of every
// family, and every sample (name{labels} as written) with its value.
func (f *fixture) scrape(t *testing.T) (types map[string]string, samples map[string]float64) {
	t.Helper()
	resp, err := http.Get(f.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	types, samples = map[string]string{}, map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			types[name] = typ
			continue
		}
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		samples[line[:i]] = v
	}
	return types, samples
}

// The vLLM metrics the endpoint picker and llm-d read, with vLLM's types,
// labels and buckets (vllm/v1/metrics/loggers.py), after requests of which
// some were preempted (a pool for 200 tokens, 6 at once) and one aborted.
func TestVLLMMetrics(t *testing.T) {
	f := newFixture(t, engine.Config{KVMem: 20 * 1088 * 13, MaxRunning: 8}, Options{})
	lbl := `engine="0",model_name="stories260K"`
	success := func(r string) string {
		return `vllm:request_success_total{engine="0",finished_reason="` + r + `",model_name="stories260K"}`
	}
	prompts := []string{"Once upon a time", "Tom had a dog.", "The sun was hot", "Lily saw a bird.", "One day, a big", "The cat sat on"}
	var wg sync.WaitGroup
	for _, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, body := f.post(t, "/v1/completions", map[string]any{"prompt": p, "max_tokens": 60, "temperature": 0}); code != 200 {
				t.Errorf("%d %v", code, body)
			}
		}()
	}
	wg.Wait()
	// One stream the client leaves after its first chunk: aborted.
	b, _ := json.Marshal(map[string]any{"prompt": "Once upon a time", "max_tokens": 200, "stream": true})
	resp, err := http.Post(f.ts.URL+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var types map[string]string
	var m map[string]float64
	// The engine counts the abort when its step reaps the stream and sets
	// the running gauge at that step's end: wait for both, so the scrape
	// below sees the step whole (a scrape between them saw the abort
	// counted, one request still running and its latency not yet observed).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		types, m = f.scrape(t)
		if v, ok := m["vllm:num_requests_running{"+lbl+"}"]; m[success("abort")] == 1 && ok && v == 0 {
			break
		}
		if time.Now().After(deadline) {
			var have []string
			for k, v := range m {
				if strings.Contains(k, "request_success") || strings.Contains(k, "samples_finished") {
					have = append(have, fmt.Sprint(k, " ", v))
				}
			}
			t.Fatalf("the aborted stream was never counted, or a request still runs (running %v): %v", m["vllm:num_requests_running{"+lbl+"}"], have)
		}
	}
	for name, typ := range map[string]string{
		"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
		"vllm:cache_config_info": "gauge", "vllm:num_preemptions_total": "counter", "vllm:request_success_total": "counter",
		"vllm:e2e_request_latency_seconds": "histogram", "vllm:time_to_first_token_seconds": "histogram",
		"vllm:inter_token_latency_seconds": "histogram", "vllm:prefix_cache_queries_total": "counter",
		"vllm:prefix_cache_hits_total": "counter", "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter",
	} {
		if types[name] != typ {
			t.Errorf("%s is a %q, want a %s", name, types[name], typ)
		}
	}
	st := f.srv.Engine().Stats()
	if st.Preemptions == 0 {
		t.Error("no preemption: the test did not provoke one")
	}
	for name, want := range map[string]float64{
		"vllm:num_requests_running{" + lbl + "}":  0,
		"vllm:num_requests_waiting{" + lbl + "}":  0,
		"vllm:kv_cache_usage_perc{" + lbl + "}":   0,
		"vllm:num_preemptions_total{" + lbl + "}": float64(st.Preemptions),
		"kvlm_preemptions_total":                  float64(st.Preemptions),
		// Six requests and the aborted one, each one sample.
		"vllm:e2e_request_latency_seconds_count{" + lbl + "}": 7,
		"vllm:time_to_first_token_seconds_count{" + lbl + "}": 7,
	} {
		if got, ok := m[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	// Every finished_reason of vLLM is there from 0; they add up to the
	// samples.
	total := 0.0
	for _, r := range []string{"stop", "length", "abort", "error", "repetition"} {
		v, ok := m[success(r)]
		if !ok {
			t.Errorf("no request_success_total for %s", r)
		}
		total += v
	}
	if total != 7 || m[success("error")] != 0 {
		t.Errorf("request_success_total adds up to %v, want 7", total)
	}
	// vLLM's buckets, exactly.
	for name, want := range map[string][]float64{
		"vllm:e2e_request_latency_seconds": {0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680},
		"vllm:time_to_first_token_seconds": {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560},
		"vllm:inter_token_latency_seconds": {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80},
	} {
		var got []float64
		for k := range m {
			if rest, ok := strings.CutPrefix(k, name+"_bucket{"+lbl+`,le="`); ok {
				le := strings.TrimSuffix(rest, `"}`)
				if le == "+Inf" {
					continue
				}
				v, _ := strconv.ParseFloat(le, 64)
				got = append(got, v)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s buckets %v, want %v", name, got, want)
		}
	}
	// cache_config_info: block_size tokens, num_gpu_blocks vLLM blocks
	// (16 tokens of all 5 layers × 4 KV heads: 20 × 1088 bytes in f32).
	blocks := f.srv.Engine().Budget() / (20 * 1088)
	cfg := fmt.Sprintf(`vllm:cache_config_info{block_size="16",cache_dtype="f32/f32",enable_prefix_caching="True",engine="0",model_name="stories260K",num_gpu_blocks="%d"}`, blocks)
	if m[cfg] != 1 {
		var have []string
		for k := range m {
			if strings.HasPrefix(k, "vllm:cache_config_info") {
				have = append(have, k)
			}
		}
		t.Errorf("no %s = 1; have %v", cfg, have)
	}
	if blocks < 12 || blocks > 13 {
		t.Errorf("num_gpu_blocks %d for a budget of 13 blocks", blocks)
	}
	if s := m["vllm:e2e_request_latency_seconds_sum{"+lbl+"}"]; s <= m["vllm:time_to_first_token_seconds_sum{"+lbl+"}"] {
		t.Errorf("e2e latency sum %v not above the TTFT sum", s)
	}
}
