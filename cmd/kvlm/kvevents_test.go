package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// freePort is a loopback port nothing listens on (now).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Bad KV event flags are refused at start, with one line naming the flag.
func TestServeKVEventsFlags(t *testing.T) {
	s := storiesFiles(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := "tcp://" + ln.Addr().String()
	base := []string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--addr", "127.0.0.1:0"}
	for _, c := range []struct {
		name string
		args []string
		msg  string
	}{
		{"address", []string{"--kv-events", "127.0.0.1:5557"}, `--kv-events: "127.0.0.1:5557" is not tcp://HOST:PORT`},
		{"port", []string{"--kv-events", "tcp://127.0.0.1:70000"}, "is not a number from 0 to 65535"},
		{"port in use", []string{"--kv-events", busy}, "address already in use"},
		{"replay port in use", []string{"--kv-events", "tcp://127.0.0.1:0", "--kv-events-replay", busy}, "--kv-events-replay: cannot bind"},
		{"replay alone", []string{"--kv-events-replay", "tcp://127.0.0.1:0"}, "--kv-events-replay needs --kv-events"},
		{"topic alone", []string{"--kv-events-topic", "kv@a@b"}, "--kv-events-topic needs --kv-events"},
		{"format", []string{"--kv-events", "tcp://127.0.0.1:0", "--kv-events-format", "json"}, `unknown KV event format "json"`},
		{"connect alone", []string{"--kv-events-connect"}, "--kv-events-connect needs --kv-events"},
		{"connect to every interface", []string{"--kv-events", "tcp://*:5557", "--kv-events-connect"}, "cannot connect to tcp://*:5557"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, code := kvlm(t, append(base, c.args...)...)
			if code == 0 || !strings.Contains(errOut, c.msg) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
				t.Errorf("code %d, %q; want one line with %q", code, errOut, c.msg)
			}
		})
	}
}

// pythonZMQ is /usr/bin/python3 when it has zmq and msgpack (Debian's
// python3-zmq, python3-msgpack); otherwise the test skips, or fails under
// CI, which installs them (.ci/run).
func pythonZMQ(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s without zmq and msgpack (CI=true: apt-get install python3-zmq python3-msgpack): %v", py, err)
		}
		t.Skipf("%s without zmq and msgpack (apt-get install python3-zmq python3-msgpack): %v", py, err)
	}
	return py
}

// chainHash is kvlm's prefix-cache block hash, from its definition
// (SHA-256 over parent, extra 0 and each token, 8 little-endian bytes
// each; the digest's first 8 bytes, big-endian), as a router hashing prompts would compute it.
func chainHash(parent uint64, tokens []int) uint64 {
	h := sha256.New()
	var b [8]byte
	put := func(v uint64) { binary.LittleEndian.PutUint64(b[:], v); h.Write(b[:]) }
	put(parent)
	put(0)
	for _, x := range tokens {
		put(uint64(uint32(x)))
	}
	return binary.BigEndian.Uint64(h.Sum(nil)[:8])
}

// kvlm serve --kv-events read by an independent subscriber: pyzmq and
// msgpack (test/kvevents/subscriber.py), live on the PUB socket and whole
// from the replay socket, in both formats. The events it decodes carry the
// prompt's blocks with the chain hashes of their tokens.
func TestServeKVEventsPython(t *testing.T) {
	py := pythonZMQ(t)
	s := storiesFiles(t)
	script, err := filepath.Abs("../../test/kvevents/subscriber.py")
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"array", "map"} {
		t.Run(format, func(t *testing.T) {
			const topic = "kv@pod-a@stories260K"
			pubEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			replayEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			var out, errOut syncBuffer
			root := newRoot(&out, &errOut)
			root.SetArgs([]string{"serve", "-m", s.bin, "--tokenizer", s.tok, "--addr", "127.0.0.1:0", "--kv-mem", "4MiB",
				"--kv-events", pubEP, "--kv-events-replay", replayEP, "--kv-events-topic", topic, "--kv-events-format", format})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- root.ExecuteContext(ctx) }()
			defer func() {
				cancel()
				select {
				case <-done:
				case <-time.After(20 * time.Second):
					t.Error("serve did not stop")
				}
			}()
			re := regexp.MustCompile(`listening on (http://\S+)`)
			var url string
			for deadline := time.Now().Add(30 * time.Second); url == ""; time.Sleep(10 * time.Millisecond) {
				if m := re.FindStringSubmatch(errOut.String()); m != nil {
					url = m[1]
				} else if time.Now().After(deadline) {
					t.Fatalf("no address in %q", errOut.String())
				}
			}
			if want := fmt.Sprintf("KV events (%s) on %s, topic %q, replay on %s", format, strings.TrimPrefix(pubEP, "tcp://"), topic, strings.TrimPrefix(replayEP, "tcp://")); !strings.Contains(errOut.String(), want) {
				t.Errorf("banner %q lacks %q", errOut.String(), want)
			}
			cmd := exec.Command(py, script, pubEP, replayEP, topic, format)
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			var pyErr strings.Builder
			cmd.Stderr = &pyErr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := bufio.NewScanner(stdout)
			lines.Buffer(nil, 1<<20)
			if !lines.Scan() || lines.Text() != "ready" {
				cmd.Wait()
				t.Fatalf("subscriber: %q %s", lines.Text(), pyErr.String())
			}
			// The subscription reaches the publisher shortly after the
			// connection; what is sent before it comes from the replay.
			time.Sleep(300 * time.Millisecond)
			prompt := []int{1}
			for i := 1; i < 40; i++ {
				prompt = append(prompt, 3+(i*53)%500)
			}
			var cached []float64
			for range 2 {
				body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 3, "temperature": 0})
				resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body)))
				if err != nil {
					t.Fatal(err)
				}
				var r struct {
					Usage struct {
						Details struct {
							Cached float64 `json:"cached_tokens"`
						} `json:"prompt_tokens_details"`
					} `json:"usage"`
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err := json.Unmarshal(raw, &r); err != nil || resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, raw)
				}
				cached = append(cached, r.Usage.Details.Cached)
			}
			time.Sleep(100 * time.Millisecond) // a batch every 10 ms
			io.WriteString(stdin, "done\n")
			type batch struct {
				Seq    int              `json:"seq"`
				Live   bool             `json:"live"`
				Rank   int              `json:"data_parallel_rank"`
				Events []map[string]any `json:"events"`
			}
			var batches []batch
			for lines.Scan() {
				var b batch
				if err := json.Unmarshal(lines.Bytes(), &b); err != nil {
					t.Fatalf("subscriber line %q: %v", lines.Text(), err)
				}
				batches = append(batches, b)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("subscriber: %v: %s", err, pyErr.String())
			}
			live := 0
			var hashes []uint64
			var tokens []int
			for _, b := range batches {
				if b.Live {
					live++
				}
				if b.Rank != 0 {
					t.Errorf("data_parallel_rank %d", b.Rank)
				}
				for _, e := range b.Events {
					if e["type"] != "BlockStored" {
						continue
					}
					if e["medium"] != "CPU" || e["block_size"] != 16.0 {
						t.Errorf("event %v", e)
					}
					if len(hashes) == 0 && e["parent_block_hash"] != nil {
						t.Errorf("the first block has a parent: %v", e)
					}
					if p, ok := e["parent_block_hash"].(string); ok && (len(hashes) == 0 || p != strconv.FormatUint(hashes[len(hashes)-1], 10)) {
						t.Errorf("parent %s does not continue the chain %x", p, hashes)
					}
					for _, h := range e["block_hashes"].([]any) {
						v, err := strconv.ParseUint(h.(string), 10, 64)
						if err != nil {
							t.Fatal(err)
						}
						hashes = append(hashes, v)
					}
					for _, x := range e["token_ids"].([]any) {
						tokens = append(tokens, int(x.(float64)))
					}
				}
			}
			if live == 0 {
				t.Error("no batch arrived live on the PUB socket")
			}
			// The prompt's two full blocks, chained from None.
			if len(tokens) < 32 || !slices.Equal(tokens[:32], prompt[:32]) {
				t.Fatalf("stored tokens %v, want the prompt's first 32 %v", tokens, prompt[:32])
			}
			h0 := chainHash(0, prompt[:16])
			h1 := chainHash(h0, prompt[16:32])
			if hashes[0] != h0 || hashes[1] != h1 {
				t.Errorf("block hashes %x %x, want %x %x", hashes[0], hashes[1], h0, h1)
			}
			if !slices.Equal(cached, []float64{0, 32}) {
				t.Errorf("cached tokens %v, want [0 32]", cached)
			}
		})
	}
}
