package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// start starts a publisher on a free loopback port.
func start(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 2
	}
	p, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// subscribe connects a SUB socket to p for topic and waits until p knows
// of the subscription.
func subscribe(t *testing.T, p *Publisher, topic string) zmq4.Socket {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() { sub.Close(); cancel() })
	if err := sub.Dial("tcp://" + p.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(p.Subscriptions(), topic) {
		if time.Now().After(deadline) {
			t.Fatalf("the publisher never saw the subscription to %q (has %q)", topic, p.Subscriptions())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return sub
}

// recv reads one message: its topic, sequence number and decoded batch.
func recv(t *testing.T, sub zmq4.Socket) (string, uint64, []any) {
	t.Helper()
	type res struct {
		m   zmq4.Msg
		err error
	}
	ch := make(chan res, 1)
	go func() { m, err := sub.Recv(); ch <- res{m, err} }()
	var r res
	select {
	case r = <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no message within 5s")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.m.Frames) != 3 {
		t.Fatalf("%d frames, want 3 (topic, sequence, payload)", len(r.m.Frames))
	}
	if len(r.m.Frames[1]) != 8 {
		t.Fatalf("sequence frame of %d bytes, want 8", len(r.m.Frames[1]))
	}
	return string(r.m.Frames[0]), binary.BigEndian.Uint64(r.m.Frames[1]), decode(t, r.m.Frames[2])
}

// decode reads a payload into generic values, as a subscriber that knows
// nothing of kvlm does.
func decode(t *testing.T, payload []byte) []any {
	t.Helper()
	var v any
	if err := msgpack.Unmarshal(payload, &v); err != nil {
		t.Fatalf("payload is not msgpack: %v", err)
	}
	b, ok := v.([]any)
	if !ok || len(b) != 3 {
		t.Fatalf("batch %#v is not [ts, events, data_parallel_rank]", v)
	}
	return b
}

// num reads a msgpack integer of any width as uint64.
func num(t *testing.T, v any) uint64 {
	t.Helper()
	switch x := v.(type) {
	case int8, int16, int32, int64:
		return uint64(reflect.ValueOf(x).Int())
	case uint8, uint16, uint32, uint64:
		return reflect.ValueOf(x).Uint()
	}
	t.Fatalf("%#v (%T) is not an integer", v, v)
	return 0
}

func nums(t *testing.T, v any) []uint64 {
	t.Helper()
	a, ok := v.([]any)
	if !ok {
		t.Fatalf("%#v is not an array", v)
	}
	out := make([]uint64, len(a))
	for i := range a {
		out[i] = num(t, a[i])
	}
	return out
}

// fields turns an event of either format into its tag and its fields in
// vLLM's order, checking the map format's names.
func fields(t *testing.T, f Format, v any) (string, []any) {
	t.Helper()
	names := map[string][]string{
		tagStored:  {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
		tagRemoved: {"block_hashes", "medium"},
		tagCleared: {},
	}
	switch f {
	case Array:
		a, ok := v.([]any)
		if !ok || len(a) == 0 {
			t.Fatalf("array event %#v", v)
		}
		tag, _ := a[0].(string)
		if len(a)-1 != len(names[tag]) {
			t.Fatalf("%s has %d fields, want %d", tag, len(a)-1, len(names[tag]))
		}
		return tag, a[1:]
	default:
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("map event %#v", v)
		}
		tag, _ := m["type"].(string)
		want, ok := names[tag]
		if !ok || len(m) != len(want)+1 {
			t.Fatalf("map event %#v: tag %q, %d keys", v, tag, len(m))
		}
		out := make([]any, len(want))
		for i, k := range want {
			x, ok := m[k]
			if !ok {
				t.Fatalf("%s lacks %q", tag, k)
			}
			out[i] = x
		}
		return tag, out
	}
}

// The encoding of each event against vLLM's fields, in both formats, the
// merging of a chain's stores, the batch's shape and sequence numbers.
func TestEvents(t *testing.T) {
	for _, f := range []Format{Array, Map} {
		t.Run(f.String(), func(t *testing.T) {
			p := start(t, Config{Format: f, Topic: "kv@pod@m", Interval: time.Hour, Medium: "CPU"})
			sub := subscribe(t, p, "kv@")
			// One chain stored in two calls (merged), a removal of two
			// hashes (merged), another chain's first block, a clear.
			p.BlockStored(0xfedcba9876543210, 0, false, []int32{1, 2})
			p.BlockStored(7, 0xfedcba9876543210, true, []int32{3, 4})
			p.BlockRemoved(7)
			p.BlockRemoved(0xfedcba9876543210)
			p.BlockStored(9, 0, false, []int32{5, 6})
			p.AllBlocksCleared()
			before := float64(time.Now().UnixNano()) / 1e9
			p.Flush()
			topic, seq, b := recv(t, sub)
			if topic != "kv@pod@m" || seq != 0 {
				t.Errorf("topic %q seq %d, want kv@pod@m 0", topic, seq)
			}
			if ts, ok := b[0].(float64); !ok || ts < before-1 || ts > before+5 {
				t.Errorf("ts %#v, want a float64 near %v", b[0], before)
			}
			if r := num(t, b[2]); r != 0 {
				t.Errorf("data_parallel_rank %d", r)
			}
			evs := b[1].([]any)
			if len(evs) != 4 {
				t.Fatalf("%d events, want 4: %#v", len(evs), evs)
			}
			tag, x := fields(t, f, evs[0])
			if tag != tagStored || !slices.Equal(nums(t, x[0]), []uint64{0xfedcba9876543210, 7}) || x[1] != nil ||
				!slices.Equal(nums(t, x[2]), []uint64{1, 2, 3, 4}) || num(t, x[3]) != 2 || x[4] != nil || x[5] != "CPU" || x[6] != nil {
				t.Errorf("first event %s %#v", tag, x)
			}
			tag, x = fields(t, f, evs[1])
			if tag != tagRemoved || !slices.Equal(nums(t, x[0]), []uint64{7, 0xfedcba9876543210}) || x[1] != "CPU" {
				t.Errorf("second event %s %#v", tag, x)
			}
			tag, x = fields(t, f, evs[2])
			if tag != tagStored || !slices.Equal(nums(t, x[0]), []uint64{9}) || x[1] != nil || !slices.Equal(nums(t, x[2]), []uint64{5, 6}) {
				t.Errorf("third event %s %#v", tag, x)
			}
			if tag, _ = fields(t, f, evs[3]); tag != tagCleared {
				t.Errorf("fourth event %s", tag)
			}
			// A store chained onto a block sent before is not merged into
			// anything: its parent is given.
			p.BlockStored(10, 9, true, []int32{7, 8})
			p.Flush()
			_, seq, b = recv(t, sub)
			if seq != 1 {
				t.Errorf("second batch seq %d", seq)
			}
			evs = b[1].([]any)
			if tag, x := fields(t, f, evs[0]); len(evs) != 1 || tag != tagStored || num(t, x[1]) != 9 {
				t.Errorf("second batch %#v", evs)
			}
			if st := p.Stats(); st.Batches != 2 || st.Events != 5 || st.Dropped != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// The array format byte for byte against msgspec's encoding of vLLM's
// KVEventBatch([ts, [BlockStored(...)], 0]) with array_like=True and
// omit_defaults=True (a value written out from the msgpack spec, not from
// this encoder): fixarray 3, float64, fixarray 1, fixarray 8, ...
func TestArrayBytes(t *testing.T) {
	e := newEncoder(Array, 2, "CPU")
	got, err := e.batch(1.5, []event{{kind: stored, hashes: []uint64{1 << 63}, tokens: []int32{1, 300}}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91,
		0x98, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd',
		0x91, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0, // block_hashes [2^63] as uint64
		0xc0,                         // parent_block_hash None
		0x92, 0x01, 0xcd, 0x01, 0x2c, // token_ids [1, 300]
		0x02,                // block_size
		0xc0,                // lora_id None
		0xa3, 'C', 'P', 'U', // medium
		0xc0, // lora_name None
		0x00} // data_parallel_rank
	if !bytes.Equal(got, want) {
		t.Errorf("got  % x\nwant % x", got, want)
	}
}

// A publisher nobody reads never blocks the caller, and beyond MaxPending
// pending events drops and counts.
func TestBounded(t *testing.T) {
	p := start(t, Config{MaxPending: 10, Interval: time.Hour})
	done := make(chan struct{})
	go func() {
		for i := range 25 {
			p.BlockStored(uint64(i+1), 0, false, []int32{1, 2})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("BlockStored blocked")
	}
	if st := p.Stats(); st.Dropped != 15 {
		t.Errorf("dropped %d, want 15", st.Dropped)
	}
	p.Flush()
	// The pending list is free again.
	p.BlockRemoved(1)
	if st := p.Stats(); st.Dropped != 15 {
		t.Errorf("dropped %d after a flush, want 15", st.Dropped)
	}
}

// The replay socket answers as vLLM's: every kept batch from the start
// sequence on, then the end marker (-1, empty payload); a bounded buffer
// keeps the newest.
func TestReplay(t *testing.T) {
	p := start(t, Config{Replay: "tcp://127.0.0.1:0", Interval: time.Hour, BufferBatches: 3})
	for i := range 5 {
		p.BlockRemoved(uint64(100 + i))
		p.Flush()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A DEALER reads the stream of answers (pyzmq's REQ, as vLLM's example
	// subscriber uses, is in test/kvevents_sub.py).
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial("tcp://" + p.ReplayAddr().String()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		start uint64
		want  []int64
	}{{0, []int64{2, 3, 4}}, {3, []int64{3, 4}}, {9, nil}} {
		t.Run(fmt.Sprint(c.start), func(t *testing.T) {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], c.start)
			if err := dealer.Send(zmq4.NewMsgFrom(nil, b[:])); err != nil {
				t.Fatal(err)
			}
			var got []int64
			for {
				m, err := dealer.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if len(m.Frames) != 3 || len(m.Frames[0]) != 0 {
					t.Fatalf("answer %q, want [\"\", seq, payload]", m.Frames)
				}
				seq := int64(binary.BigEndian.Uint64(m.Frames[1]))
				if seq == -1 {
					break
				}
				got = append(got, seq)
				_, x := fields(t, Array, decode(t, m.Frames[2])[1].([]any)[0])
				if h := nums(t, x[0]); len(h) != 1 || h[0] != uint64(100+seq) {
					t.Errorf("batch %d holds %v", seq, h)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("replayed %v, want %v", got, c.want)
			}
		})
	}
}

// Bad addresses and busy ports are refused at Start with one line.
func TestStartErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := "tcp://" + ln.Addr().String()
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"scheme", Config{Endpoint: "udp://127.0.0.1:5557"}, "is not tcp://HOST:PORT"},
		{"no port", Config{Endpoint: "tcp://127.0.0.1"}, "is not tcp://HOST:PORT"},
		{"port", Config{Endpoint: "tcp://127.0.0.1:99999"}, "is not a number from 0 to 65535"},
		{"no host", Config{Endpoint: "tcp://:5557"}, "has no host"},
		{"host", Config{Endpoint: "tcp://no-such-host.invalid:5557"}, "no-such-host.invalid"},
		{"busy", Config{Endpoint: busy}, "address already in use"},
		{"busy replay", Config{Endpoint: "tcp://127.0.0.1:0", Replay: busy}, "--kv-events-replay: cannot bind"},
		{"bad replay", Config{Endpoint: "tcp://127.0.0.1:0", Replay: "127.0.0.1:1"}, "--kv-events-replay"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.BlockSize = 16
			p, err := Start(c.cfg)
			if err == nil {
				p.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line with %q", err, c.want)
			}
		})
	}
}

// With Connect the publisher dials a subscriber that binds (llm-d's KV
// indexer), retrying until it is there: started first, it reaches a
// subscriber that comes a moment later.
func TestConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := start(t, Config{Endpoint: "tcp://" + addr, Connect: true, Topic: "kv@pod@m", Interval: time.Hour})
	if p.Addr() != nil {
		t.Errorf("a connecting publisher has the address %v", p.Addr())
	}
	time.Sleep(300 * time.Millisecond) // the first dial fails: nobody listens yet
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Listen("tcp://" + addr); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(p.Subscriptions(), "kv@"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the publisher never connected")
		}
	}
	p.BlockStored(5, 0, false, []int32{1, 2})
	p.Flush()
	topic, seq, b := recv(t, sub)
	if tag, x := fields(t, Array, b[1].([]any)[0]); topic != "kv@pod@m" || seq != 0 || tag != tagStored || nums(t, x[0])[0] != 5 {
		t.Errorf("%q %d %s %v", topic, seq, tag, x)
	}
	if _, err := Start(Config{Endpoint: "tcp://*:5557", Connect: true, BlockSize: 16}); err == nil || !strings.Contains(err.Error(), "cannot connect to tcp://*:5557") {
		t.Errorf("connecting to *: %v", err)
	}
}

// BenchmarkBlockStored is the cost the pool pays under its lock for one
// stored block (16 tokens) and one removal, the publisher's goroutine
// sending every 10 ms:
//
//	go test -run '^$' -bench BlockStored -benchmem ./kvevents/
func BenchmarkBlockStored(b *testing.B) {
	for _, c := range []struct {
		name     string
		interval time.Duration
	}{{"sent every 10ms", 10 * time.Millisecond}, {"never sent", time.Hour}} {
		b.Run(c.name, func(b *testing.B) { benchStored(b, c.interval) })
	}
}

func benchStored(b *testing.B, interval time.Duration) {
	p, err := Start(Config{Endpoint: "tcp://127.0.0.1:0", BlockSize: 16, MaxPending: 1 << 30, Interval: interval})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	toks := make([]int32, 16)
	b.ReportAllocs()
	for i := range b.N {
		p.BlockStored(uint64(i+1), uint64(i), i%8 != 0, toks)
		p.BlockRemoved(uint64(i + 1))
	}
}
