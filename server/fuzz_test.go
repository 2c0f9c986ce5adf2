package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvlm/kvlm/engine"
)

// The statuses a request body may get from the generation endpoints: an
// answer, a client error (bad input, unknown model, too large), never a
// 5xx. (429 and 503 need a full queue or a shutdown, which one request at
// a time does not cause.)
var fuzzStatuses = map[int]bool{200: true, 400: true, 404: true, 413: true}

var fuzzCompletionSeeds = []string{
	`{"prompt":"Once upon a time","max_tokens":4}`,
	`{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0,"stop":["."],"n":2,"seed":3}`,
	`{"prompt":[1,403,407],"max_tokens":2,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"repetition_penalty":1.1,"seed":-4}`,
	`{"prompt":["Once"],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true},"n":3}`,
	`{"prompt":"The cat sat on the mat. The cat sat on the mat.","max_tokens":6,"kv":{"policy":"snapkv","ratio":0.5,"type_k":"q8","type_v":"q4"}}`,
	`{"prompt":"a","max_tokens":3,"kv":{"policy":"streaming","window":8,"sinks":2,"positions":"reindex","slot":2,"cache_prompt":false}}`,
	`{"prompt":"a","max_tokens":2,"kv":{"policy":"h2o","budget":4,"agg":"max","every":2,"type":"kivi2"}}`,
	`{"prompt":"a","max_tokens":1,"echo":false,"best_of":1,"logprobs":0,"suffix":"","user":"u","metadata":{"k":"v"},"store":false}`,
	`{"prompt":"` + strings.Repeat("word ", 600) + `"}`,
	`{"prompt":[-1]}`, `{"prompt":[]}`, `{"prompt":""}`, `{"prompt":"a","max_tokens":1048577}`,
	`{"prompt":"a","n":17}`, `{"prompt":"a","stop":["` + strings.Repeat("x", 300) + `"]}`,
	`{"prompt":"\u0000\ud800\uffff","max_tokens":2}`, `{"prompt":"a","max_tokens":1e400}`, `{"prompt":"a","temperature":NaN}`,
	`{"prompt":"a","kv":{"policy":"snapkv","ratio":1e-300}}`, `{"prompt":"a","kv":{"budget":-1,"window":16777217}}`,
	`[]`, `null`, `"x"`, `{}`, ``, `{"prompt":"a"}{}`, `{"prompt":{"a":[[[[[[[[]]]]]]]]}}`, `{"prompt":"a","model":"gpt-4"}`,
	`{"prompt":"a","prompt":"b","max_tokens":1}`, `{"PROMPT":"a"}`, `{"prompt":"a","kv":null,"stop":null,"n":null}`,
}

var fuzzChatSeeds = []string{
	`{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":4}`,
	`{"model":"stories260K","messages":[{"role":"system","content":"x"},{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null},{"role":"developer","content":"d"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
	`{"messages":[{"role":"user","content":"a","name":"n"}],"max_completion_tokens":2,"n":2,"stop":"\n","seed":1,"temperature":0}`,
	`{"messages":[{"role":"user","content":"a"}],"max_tokens":3,"response_format":{"type":"text"},"tools":[],"tool_choice":"none","parallel_tool_calls":false,"logprobs":false}`,
	`{"messages":[{"role":"user","content":"a"}],"max_tokens":3,"kv":{"policy":"tova","ratio":0.5,"type_k":"f16","type_v":"bf16","slot":5}}`,
	`{"messages":[{"role":"user","content":"` + strings.Repeat("story ", 700) + `"}]}`,
	`{"messages":[]}`, `{"messages":[{"role":"tool","content":"a"}]}`, `{"messages":[{"content":"a"}]}`,
	`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a","extra":1}]}]}`,
	`{"messages":[{"role":"user","content":5}]}`, `{"messages":{"role":"user"}}`, `{"messages":[null]}`,
	`{"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"response_format":{"type":"json_object"}}`,
	`{"messages":[{"role":"user","content":"a"}],"stream":false,"stream_options":{}}`, `{"messages":[{"role":"user","content":"\ud83d"}],"max_tokens":1}`,
	`[]`, `null`, `{}`, ``, `{"messages":[{"role":"user","content":"a"}]} x`,
}

func FuzzCompletions(f *testing.F) { fuzzEndpoint(f, "/v1/completions", fuzzCompletionSeeds) }

func FuzzChat(f *testing.F) { fuzzEndpoint(f, "/v1/chat/completions", fuzzChatSeeds) }

// fuzzEndpoint posts each body to path through the whole handler and
// checks the answer, then that the request left no KV memory behind.
func fuzzEndpoint(f *testing.F, path string, seeds []string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	fx := newFixture(f, engine.Config{}, Options{MaxBody: 32 << 10})
	h := fx.srv.Handler()
	e := fx.srv.Engine()
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Host = "127.0.0.1"
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		res := w.Result()
		raw := w.Body.Bytes()
		if !fuzzStatuses[res.StatusCode] {
			t.Fatalf("status %d for %q: %s", res.StatusCode, body, raw)
		}
		switch ct := res.Header.Get("Content-Type"); {
		case strings.HasPrefix(ct, "text/event-stream"):
			chunks, done, err := readSSE(bytes.NewReader(raw))
			if err != nil || !done {
				t.Fatalf("stream for %q: done %v, %v:\n%s", body, done, err, raw)
			}
			for _, c := range chunks {
				if _, ok := c["error"]; ok {
					t.Fatalf("stream for %q ended in an error: %v", body, c)
				}
			}
		case ct == "application/json":
			if res.StatusCode != 200 {
				apiErr(t, raw)
				break
			}
			var out struct {
				Choices []json.RawMessage `json:"choices"`
				Usage   *usageJSON        `json:"usage"`
			}
			if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) == 0 || out.Usage == nil {
				t.Fatalf("200 for %q is not a completion: %s", body, raw)
			}
		default:
			t.Fatalf("Content-Type %q for %q: %s", ct, body, raw)
		}
		// Slots keep their sequences by design: erase them, then every
		// block must be free.
		slots, err := e.Slots()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots {
			if err := e.EraseSlot(s.ID); err != nil {
				t.Fatal(err)
			}
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			st := e.Stats()
			if st.UsedBytes == 0 && st.Running == 0 && st.Waiting == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %q the engine still holds %d KV bytes (%d running, %d waiting)", body, st.UsedBytes, st.Running, st.Waiting)
			}
		}
	})
}
