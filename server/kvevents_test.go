package server

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/kvevents"
	"github.com/vmihailenco/msgpack/v5"
)

// kvEvent is one decoded KV event, either format.
type kvEvent struct {
	tag       string
	hashes    []uint64
	parent    *uint64
	tokens    []int
	blockSize int
	medium    any
}

// eventSub is a subscriber that knows vLLM's format, not kvlm's code: it
// decodes each payload into generic msgpack values.
type eventSub struct {
	t      *testing.T
	pub    *kvevents.Publisher
	sub    zmq4.Socket
	format kvevents.Format
	next   uint64 // the sequence number expected next
}

func newEventSub(t *testing.T, pub *kvevents.Publisher, topic string) *eventSub {
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() { sub.Close(); cancel() })
	if err := sub.Dial("tcp://" + pub.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !slices.Contains(pub.Subscriptions(), topic); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the publisher never saw the subscription")
		}
	}
	return &eventSub{t: t, pub: pub, sub: sub, format: pub.Config().Format}
}

// drain flushes the publisher and returns the events of every batch sent
// so far that were not read yet, checking topic and sequence numbers.
func (s *eventSub) drain(topic string) []kvEvent {
	t := s.t
	t.Helper()
	s.pub.Flush()
	var out []kvEvent
	for s.next < uint64(s.pub.Stats().Batches) {
		ch := make(chan zmq4.Msg, 1)
		go func() { m, _ := s.sub.Recv(); ch <- m }()
		var m zmq4.Msg
		select {
		case m = <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("batch %d never came", s.next)
		}
		if len(m.Frames) != 3 || string(m.Frames[0]) != topic || len(m.Frames[1]) != 8 {
			t.Fatalf("message %q, want [%q, 8-byte seq, payload]", m.Frames, topic)
		}
		if seq := binary.BigEndian.Uint64(m.Frames[1]); seq != s.next {
			t.Fatalf("sequence %d, want %d", seq, s.next)
		}
		s.next++
		var v any
		if err := msgpack.Unmarshal(m.Frames[2], &v); err != nil {
			t.Fatal(err)
		}
		b, ok := v.([]any)
		if !ok || len(b) != 3 {
			t.Fatalf("batch %#v is not [ts, events, data_parallel_rank]", v)
		}
		if _, ok := b[0].(float64); !ok {
			t.Errorf("ts %#v is not a float", b[0])
		}
		for _, e := range b[1].([]any) {
			out = append(out, s.event(e))
		}
	}
	return out
}

var fieldNames = map[string][]string{
	"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
	"BlockRemoved":     {"block_hashes", "medium"},
	"AllBlocksCleared": {},
}

func (s *eventSub) event(v any) kvEvent {
	t := s.t
	t.Helper()
	var tag string
	var f []any
	if s.format == kvevents.Map {
		m := v.(map[string]any)
		tag = m["type"].(string)
		for _, k := range fieldNames[tag] {
			x, ok := m[k]
			if !ok {
				t.Fatalf("%s lacks %s", tag, k)
			}
			f = append(f, x)
		}
	} else {
		a := v.([]any)
		tag, f = a[0].(string), a[1:]
	}
	if len(f) != len(fieldNames[tag]) {
		t.Fatalf("%s with %d fields", tag, len(f))
	}
	e := kvEvent{tag: tag}
	if tag == "AllBlocksCleared" {
		return e
	}
	for _, h := range f[0].([]any) {
		e.hashes = append(e.hashes, anyUint(t, h))
	}
	if tag == "BlockRemoved" {
		e.medium = f[1]
		return e
	}
	if f[1] != nil {
		p := anyUint(t, f[1])
		e.parent = &p
	}
	for _, x := range f[2].([]any) {
		e.tokens = append(e.tokens, int(anyUint(t, x)))
	}
	e.blockSize, e.medium = int(anyUint(t, f[3])), f[5]
	if f[4] != nil || f[6] != nil {
		t.Errorf("lora_id %v lora_name %v, want None", f[4], f[6])
	}
	return e
}

func anyUint(t *testing.T, v any) uint64 {
	t.Helper()
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return uint64(r.Int())
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return r.Uint()
	}
	t.Fatalf("%#v is not an integer", v)
	return 0
}

// chainHash is kvlm's prefix-cache hash of a block, written from its
// definition with the standard library's SHA-256 (parent, extra 0, each
// token as 8 little-endian bytes; the digest's first 8 bytes, big-endian): what a router that hashes prompts
// itself would compute.
func chainHash(parent uint64, tokens []int) uint64 {
	h := sha256.New()
	var b [8]byte
	for _, v := range append([]uint64{parent, 0}, func() (o []uint64) {
		for _, x := range tokens {
			o = append(o, uint64(uint32(x)))
		}
		return o
	}()...) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	return binary.BigEndian.Uint64(h.Sum(nil)[:8])
}

// A router fed only by the events knows what the replica caches: the
// stored events chain the prompt's blocks with the hashes a router
// computes from the tokens, carry those tokens, and are withdrawn by
// BlockRemoved when the pool reuses the blocks; before every request the
// blocks the events say are cached predict its cached_tokens exactly; a
// reset of the prefix cache is one AllBlocksCleared.
func TestKVEvents(t *testing.T) {
	for _, format := range []kvevents.Format{kvevents.Array, kvevents.Map} {
		t.Run(format.String(), func(t *testing.T) {
			const topic = "kv@pod-a@stories260K"
			pub, err := kvevents.Start(kvevents.Config{Endpoint: "tcp://127.0.0.1:0", Topic: topic, Format: format, BlockSize: 16})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pub.Close() })
			// About 12 blocks of 16 tokens: a few prompts reuse each
			// other's cached blocks.
			f := newFixture(t, engine.Config{KVMem: 256 << 10, MaxRunning: 1}, Options{KVEvents: pub})
			sub := newEventSub(t, pub, "kv@")
			live := map[uint64]bool{} // what the events say is cached
			stored := map[uint64][]int{}
			removedSeen, hits := false, 0
			prompt := func(seed, n int) []int {
				p := []int{1}
				for i := 1; i < n; i++ {
					p = append(p, 3+(seed*37+i*11)%500)
				}
				return p
			}
			prompts := [][]int{prompt(1, 70), prompt(1, 70), prompt(2, 90), prompt(3, 90), prompt(1, 70), prompt(4, 60), prompt(1, 70)}
			for i, p := range prompts {
				// The prediction: leading full blocks (but the last token)
				// whose chain hashes the events left cached.
				want, parent := 0, uint64(0)
				for j := 0; (j+1)*16 <= len(p)-1; j++ {
					h := chainHash(parent, p[j*16:(j+1)*16])
					if !live[h] {
						break
					}
					want += 16
					parent = h
				}
				code, resp := f.post(t, "/v1/completions", map[string]any{"prompt": p, "max_tokens": 4, "temperature": 0})
				if code != 200 {
					t.Fatalf("request %d: %d %v", i, code, resp)
				}
				if want > 0 {
					hits++
				}
				if got := int(num(resp, "usage", "prompt_tokens_details", "cached_tokens")); got != want {
					t.Errorf("request %d: %d cached tokens, the events predicted %d", i, got, want)
				}
				for _, e := range sub.drain(topic) {
					switch e.tag {
					case "BlockStored":
						if e.blockSize != 16 || e.medium != "CPU" || len(e.tokens) != 16*len(e.hashes) {
							t.Fatalf("stored event %+v", e)
						}
						parent := uint64(0)
						if e.parent != nil {
							parent = *e.parent
							if stored[parent] == nil {
								t.Errorf("parent %x was never stored", parent)
							}
						}
						for k, h := range e.hashes {
							blk := e.tokens[k*16 : (k+1)*16]
							if h != chainHash(parent, blk) {
								t.Errorf("block hash %x, the chain of its tokens gives %x", h, chainHash(parent, blk))
							}
							if live[h] {
								t.Errorf("%x stored twice", h)
							}
							live[h], stored[h], parent = true, blk, h
						}
					case "BlockRemoved":
						removedSeen = true
						if e.medium != "CPU" {
							t.Errorf("removed event medium %v", e.medium)
						}
						for _, h := range e.hashes {
							if !live[h] {
								t.Errorf("%x removed but not cached", h)
							}
							delete(live, h)
						}
					default:
						t.Errorf("unexpected %s", e.tag)
					}
				}
				if i == 0 {
					// The first prompt's blocks: its full blocks, chained
					// from None.
					h := chainHash(0, p[:16])
					if !slices.Equal(stored[h], p[:16]) || !live[chainHash(h, p[16:32])] {
						t.Fatalf("after the first request the events hold %d blocks, not the prompt's", len(stored))
					}
				}
			}
			if !removedSeen {
				t.Error("no block was removed: the test did not reuse a cached block")
			}
			if st := pub.Stats(); st.Dropped != 0 {
				t.Errorf("dropped %d events", st.Dropped)
			}
			m := f.metrics(t)
			if got := m["kvlm_kv_event_batches_total"]; got != float64(sub.next) {
				t.Errorf("kvlm_kv_event_batches_total %v, read %d", got, sub.next)
			}
			if hits == 0 {
				t.Error("no request was predicted a prefix hit")
			}
			// vLLM's reset: one AllBlocksCleared, and the prompt that was
			// cached is computed again.
			if code, resp := f.post(t, "/reset_prefix_cache", map[string]any{}); code != 200 || num(resp, "cleared") < float64(len(live)) {
				t.Fatalf("reset_prefix_cache: %d %v, %d blocks cached", code, resp, len(live))
			}
			if evs := sub.drain(topic); len(evs) != 1 || evs[0].tag != "AllBlocksCleared" {
				t.Errorf("after the reset: %+v, want one AllBlocksCleared", evs)
			}
			if _, resp := f.post(t, "/v1/completions", map[string]any{"prompt": prompts[0], "max_tokens": 1}); num(resp, "usage", "prompt_tokens_details", "cached_tokens") != 0 {
				t.Errorf("after the reset: %v cached tokens", num(resp, "usage", "prompt_tokens_details", "cached_tokens"))
			}
			t.Logf("%d batches, %d blocks stored, %d cached at the end, %d requests predicted a hit", sub.next, len(stored), len(live), hits)
		})
	}
}
