package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvlm/kvlm/engine"
)

// TestLoad drives the server on loopback with 32 concurrent clients and a
// few hundred mixed requests: completions and chat, whole and streamed,
// prompts of mixed lengths (some sharing prefixes), n = 1 or 2, stop
// strings, KV policies and codecs per request (compressed prefixes reused:
// the same prompt under the same policy, and one document compressed once
// for several prompts with kv.prefix), and some streams cancelled mid-way. Every answer must be a well-formed 200, and the KV pool must
// be fully free at the end. The pool is small enough that sequences get
// preempted. Throughput and latency percentiles are logged (-v).
//
//	go test -v -run TestLoad ./server/            (KVLM_LOAD_REQUESTS=N to resize)
func TestLoad(t *testing.T) {
	requests, clients, maxNew := 320, 32, 150
	if raceEnabled || testing.Short() {
		requests, maxNew = 96, 60
	}
	if s := os.Getenv("KVLM_LOAD_REQUESTS"); s != "" {
		requests, _ = strconv.Atoi(s)
	}
	f := newFixture(t, engine.Config{MaxRunning: 32, MaxQueue: 1024, KVMem: 3 << 20}, Options{})
	story := "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. Lily's mom said, \"Lily, let's go to the park.\" "
	prompts := []string{
		"Once upon a time",
		"Tom had a dog.",
		story,
		story + "Then Lily saw a bird.",
		strings.Repeat(story, 3),
		"The sun was hot and the children wanted to swim in the lake, so they",
	}
	docPrefix := "Once upon a time, there was a little girl named Lily."
	kvs := []map[string]any{
		nil, nil,
		{"policy": "snapkv", "ratio": 0.5},
		{"policy": "streaming", "window": 32},
		{"policy": "h2o", "budget": 64},
		{"policy": "tova", "budget": 48, "type_k": "q8", "type_v": "q8"},
		{"policy": "knorm", "ratio": 0.5},
		{"policy": "pyramidkv", "ratio": 0.3, "type": "f16"},
		{"type_k": "kivi4", "type_v": "kivi4"},
		{"type": "q8"},
	}
	type result struct {
		status    int
		err       error
		latency   time.Duration
		ttft      time.Duration
		tokens    int
		cancelled bool
		stream    bool
	}
	results := make([]result, requests)
	jobs := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 77))
			client := &http.Client{Timeout: 5 * time.Minute}
			for i := range jobs {
				chat := rng.IntN(2) == 0
				stream := rng.IntN(10) < 6
				cancel := stream && rng.IntN(10) == 0
				n := 1
				if rng.IntN(5) == 0 {
					n = 2
				}
				body := map[string]any{"max_tokens": 8 + rng.IntN(maxNew), "n": n, "temperature": 0.8, "seed": i}
				p := prompts[rng.IntN(len(prompts))]
				path := "/v1/completions"
				if chat {
					path = "/v1/chat/completions"
					body["messages"] = []map[string]any{{"role": "user", "content": p}}
				} else {
					body["prompt"] = p
				}
				if kv := kvs[rng.IntN(len(kvs))]; kv != nil {
					body["kv"] = kv
				}
				if strings.HasPrefix(p, docPrefix) && rng.IntN(3) == 0 {
					// One document, many questions: compressed once.
					body["kv"] = map[string]any{"policy": "snapkv", "ratio": 0.25, "window": 8, "prefix": docPrefix}
				}
				if rng.IntN(4) == 0 {
					body["stop"] = []string{".", "!"}
				}
				if stream {
					body["stream"] = true
					body["stream_options"] = map[string]any{"include_usage": true}
				}
				r := &results[i]
				r.stream, r.cancelled = stream, cancel
				t0 := time.Now()
				r.status, r.tokens, r.ttft, r.err = doLoadRequest(client, f.ts.URL+path, body, chat, n, cancel, rng.IntN(5)+1)
				r.latency = time.Since(t0)
			}
		}()
	}
	for i := range requests {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	wall := time.Since(start)
	var lat, ttft []time.Duration
	tokens, cancelled := 0, 0
	for i, r := range results {
		if r.err != nil {
			t.Errorf("request %d: %v", i, r.err)
			continue
		}
		if r.status != 200 {
			t.Errorf("request %d: status %d", i, r.status)
			continue
		}
		if r.cancelled {
			cancelled++
			continue
		}
		tokens += r.tokens
		lat = append(lat, r.latency)
		if r.stream {
			ttft = append(ttft, r.ttft)
		}
	}
	waitFree(t, f.srv.Engine())
	m := f.metrics(t)
	st := f.srv.Engine().Stats()
	t.Logf("load: %d requests (%d cancelled mid-stream) from %d clients in %.1fs: %.1f req/s, %d completion tokens, %.0f tok/s",
		requests, cancelled, clients, wall.Seconds(), float64(requests)/wall.Seconds(), tokens, float64(tokens)/wall.Seconds())
	t.Logf("latency p50 %v p90 %v p99 %v; streamed time to first token p50 %v p90 %v p99 %v",
		pct(lat, 50), pct(lat, 90), pct(lat, 99), pct(ttft, 50), pct(ttft, 90), pct(ttft, 99))
	t.Logf("server: %v preemptions, prefix-cache hit rate %.2f, inter-token latency mean %.1f ms, KV blocks used at the end %v",
		st.Preemptions, m["kvlm_prefix_cache_hit_rate"],
		1000*m["kvlm_inter_token_latency_seconds_sum"]/max(1, m["kvlm_inter_token_latency_seconds_count"]), m[`kvlm_kv_blocks_used{pool="f32/f32"}`])
	t.Logf("compressed prefixes: %v hits, %v misses, %v cached (%v bytes)", m["kvlm_compressed_prefix_hits_total"], m["kvlm_compressed_prefix_misses_total"],
		m["kvlm_compressed_prefixes"], m["kvlm_compressed_prefix_bytes"])
	if m["kvlm_compressed_prefix_hits_total"] == 0 {
		t.Errorf("no request started from a compressed prefix")
	}
	for k, v := range m {
		if strings.HasPrefix(k, `kvlm_http_requests_total`) && strings.Contains(k, `code="5`) && v > 0 {
			t.Errorf("%s = %v", k, v)
		}
	}
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(time.Millisecond)
}

// doLoadRequest sends one request and checks the answer is well formed. It
// returns the status, the completion tokens and, for streams, the time to
// the first content.
func doLoadRequest(client *http.Client, url string, body map[string]any, chat bool, n int, cancel bool, cancelAfter int) (int, int, time.Duration, error) {
	b, _ := json.Marshal(body)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		raw, _ := io.ReadAll(resp.Body)
		var e map[string]any
		if json.Unmarshal(raw, &e) != nil || e["error"] == nil {
			return resp.StatusCode, 0, 0, fmt.Errorf("status %d with a malformed error body %q", resp.StatusCode, raw)
		}
		return resp.StatusCode, 0, 0, nil
	}
	if _, isStream := body["stream"]; !isStream {
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return 200, 0, 0, fmt.Errorf("body is not JSON: %v", err)
		}
		chs, _ := out["choices"].([]any)
		if len(chs) != n {
			return 200, 0, 0, fmt.Errorf("%d choices, want %d", len(chs), n)
		}
		for _, c := range chs {
			c := c.(map[string]any)
			if fr := c["finish_reason"]; fr != "stop" && fr != "length" {
				return 200, 0, 0, fmt.Errorf("finish_reason %v", fr)
			}
			if chat {
				if _, ok := c["message"].(map[string]any)["content"].(string); !ok {
					return 200, 0, 0, fmt.Errorf("no message content: %v", c)
				}
			} else if _, ok := c["text"].(string); !ok {
				return 200, 0, 0, fmt.Errorf("no text: %v", c)
			}
		}
		u, ok := out["usage"].(map[string]any)
		if !ok || u["prompt_tokens"].(float64) <= 0 || u["total_tokens"].(float64) != u["prompt_tokens"].(float64)+u["completion_tokens"].(float64) {
			return 200, 0, 0, fmt.Errorf("bad usage %v", out["usage"])
		}
		return 200, int(u["completion_tokens"].(float64)), 0, nil
	}
	var ttft time.Duration
	if cancel {
		rd := bufio.NewReader(resp.Body)
		for range cancelAfter {
			if _, err := rd.ReadString('\n'); err != nil {
				break
			}
		}
		stop()
		return 200, 0, 0, nil
	}
	rd := &firstRead{r: resp.Body, t0: t0}
	chunks, done, err := readSSE(rd)
	if err != nil {
		return 200, 0, 0, err
	}
	if !done {
		return 200, 0, 0, fmt.Errorf("stream without [DONE]")
	}
	ttft = rd.first
	texts, finish, usage := streamText(chunks, chat)
	_ = texts
	if len(finish) != n {
		return 200, 0, 0, fmt.Errorf("%d finish reasons, want %d", len(finish), n)
	}
	for _, fr := range finish {
		if fr != "stop" && fr != "length" {
			return 200, 0, 0, fmt.Errorf("finish_reason %q", fr)
		}
	}
	if usage == nil {
		return 200, 0, 0, fmt.Errorf("stream without usage")
	}
	return 200, int(usage["completion_tokens"].(float64)), ttft, nil
}

// firstRead notes when the second read returned (the first holds the
// headers' chunk of the role deltas for chat; close enough for TTFT).
type firstRead struct {
	r     io.Reader
	t0    time.Time
	reads int
	first time.Duration
}

func (f *firstRead) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if n > 0 && f.first == 0 && bytes.Contains(p[:n], []byte(`"text":"`)) || n > 0 && f.first == 0 && bytes.Contains(p[:n], []byte(`"content":"`)) && !bytes.Contains(p[:n], []byte(`"content":""`)) {
		f.first = time.Since(f.t0)
	}
	return n, err
}
