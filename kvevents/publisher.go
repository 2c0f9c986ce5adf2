// Package kvevents publishes the KV cache's block events as vLLM does, for
// prefix-aware routers (llm-d's KV indexer, the Gateway API Inference
// Extension's endpoint picker): a ZeroMQ PUB socket sends multipart
// messages [topic, sequence number, msgpack KVEventBatch], and an optional
// ROUTER socket replays the last batches to a subscriber that missed some.
// docs/KVEVENTS.md gives the wire format and the vLLM source it follows.
//
// A Publisher is a kvcache.PrefixObserver: the pool calls it under its
// lock, and it only appends to a bounded list; its own goroutine batches,
// encodes and sends, so a slow or absent subscriber never slows the
// engine (events beyond the bound are dropped and counted).
package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// DefaultTopic is kvlm serve's topic: that of vLLM's example subscriber
// and docs (vLLM's KVEventsConfig itself defaults to "").
const DefaultTopic = "kv-events"

// Config sets up a Publisher. Zero fields take the defaults given.
type Config struct {
	// Endpoint is the address the PUB socket binds, tcp://HOST:PORT
	// (HOST * : every interface; PORT 0: any free port, see Addr), or
	// connects to with Connect.
	Endpoint string
	// Connect makes the PUB socket connect to Endpoint, where a subscriber
	// binds (llm-d's KV indexer), instead of binding it: in the
	// background, retrying every second until it is there and again
	// whenever the connection is lost.
	Connect bool
	// Replay, if set, is the address of the ROUTER socket that answers
	// replay requests (tcp://HOST:PORT).
	Replay string
	Topic  string // the first frame of every message, as given ("" is vLLM's default)
	Format Format // how events are encoded (Array)
	// BlockSize is the tokens of a block (the pool's); required.
	BlockSize int
	Medium    string        // the events' medium ("CPU": kvlm's blocks are in host memory)
	Interval  time.Duration // how often pending events are sent as one batch (10ms)
	// MaxPending bounds the events waiting to be sent (100000, vLLM's
	// max_queue_size); more are dropped and counted.
	MaxPending int
	// BufferBatches is how many sent batches the replay socket keeps
	// (10000, vLLM's buffer_steps).
	BufferBatches int
	// HWM is the PUB socket's high-water mark in messages (100000, vLLM's
	// hwm): beyond it the socket drops.
	HWM int
	// DataParallelRank is the batches' data_parallel_rank (0).
	DataParallelRank int
}

// Stats are the publisher's running counters.
type Stats struct {
	Events  int64 // events sent (a BlockStored of several blocks is one)
	Batches int64 // batches sent
	Dropped int64 // events dropped because MaxPending were waiting
	Replays int64 // replay requests answered
}

// Publisher sends KV events; it implements kvcache.PrefixObserver.
type Publisher struct {
	cfg    Config
	pub    zmq4.Socket
	replay zmq4.Socket
	cancel context.CancelFunc

	mu      sync.Mutex
	pending []event // since the last batch, consecutive stores of one chain merged
	npend   int     // blocks and clears pending (the MaxPending bound)
	closed  bool

	bufMu sync.Mutex
	buf   []sent // ring of the last BufferBatches batches, oldest at head
	head  int

	seq                    uint64 // the next batch's sequence number (publisher goroutine only)
	events, batches, drops atomic.Int64
	replays                atomic.Int64
	flushCh                chan chan struct{}
	done                   chan struct{}
}

type sent struct {
	seq     uint64
	payload []byte
}

// ParseEndpoint checks a tcp://HOST:PORT address and returns it with
// HOST * as zmq writes it; the error names the flag's value.
func ParseEndpoint(ep string) (string, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("%q is not tcp://HOST:PORT", ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("%q is not tcp://HOST:PORT: %v", ep, err)
	}
	if host == "" {
		return "", fmt.Errorf("%q has no host (tcp://*:PORT binds every interface)", ep)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("%q: port %q is not a number from 0 to 65535", ep, port)
	}
	if host != "*" && net.ParseIP(host) == nil {
		if _, err := net.LookupHost(host); err != nil {
			return "", fmt.Errorf("%q: host %q: %v", ep, host, err)
		}
	}
	return ep, nil
}

// Start binds the sockets and starts the publisher's goroutine.
func Start(cfg Config) (*Publisher, error) {
	if cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("kvevents: block size must be positive, got %d", cfg.BlockSize)
	}
	if cfg.Medium == "" {
		cfg.Medium = "CPU"
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Millisecond
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 100_000
	}
	if cfg.BufferBatches <= 0 {
		cfg.BufferBatches = 10_000
	}
	if cfg.HWM <= 0 {
		cfg.HWM = 100_000
	}
	if cfg.Format != Array && cfg.Format != Map {
		return nil, fmt.Errorf("kvevents: unknown format %d", cfg.Format)
	}
	if _, err := ParseEndpoint(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("--kv-events: %w", err)
	}
	if cfg.Replay != "" {
		if _, err := ParseEndpoint(cfg.Replay); err != nil {
			return nil, fmt.Errorf("--kv-events-replay: %w", err)
		}
	}
	if cfg.Connect && strings.Contains(cfg.Endpoint, "*") {
		return nil, fmt.Errorf("--kv-events: cannot connect to %s: name the subscriber's host", cfg.Endpoint)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, cancel: cancel, flushCh: make(chan chan struct{}), done: make(chan struct{})}
	var opts []zmq4.Option
	if cfg.Connect {
		opts = append(opts, zmq4.WithDialerRetry(time.Second), zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
	}
	p.pub = zmq4.NewPub(ctx, opts...)
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		cancel()
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	if cfg.Connect {
		// Dial retries until the subscriber is there or Close cancels it.
		go p.pub.Dial(cfg.Endpoint)
	} else if err := p.pub.Listen(cfg.Endpoint); err != nil {
		p.pub.Close()
		cancel()
		return nil, fmt.Errorf("--kv-events: cannot bind %s: %v", cfg.Endpoint, unwrapListen(err))
	}
	if cfg.Replay != "" {
		p.replay = zmq4.NewRouter(ctx)
		if err := p.replay.Listen(cfg.Replay); err != nil {
			p.replay.Close()
			p.pub.Close()
			cancel()
			return nil, fmt.Errorf("--kv-events-replay: cannot bind %s: %v", cfg.Replay, unwrapListen(err))
		}
		go p.serveReplay()
	}
	go p.run()
	return p, nil
}

// unwrapListen is the innermost error of a failed bind ("address already
// in use"), without zmq4's wrapping of the same address.
func unwrapListen(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// Addr is the PUB socket's address (its port when Endpoint's was 0); nil
// with Connect.
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the replay socket's address; nil without one.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.replay == nil {
		return nil
	}
	return p.replay.Addr()
}

// Subscriptions are the topic prefixes the connected subscribers asked
// for (sorted, each once): a subscriber that connected is in it once its
// subscription arrived, and from then on receives every batch.
func (p *Publisher) Subscriptions() []string { return p.pub.(zmq4.Topics).Topics() }

// Config is the configuration with defaults filled in.
func (p *Publisher) Config() Config { return p.cfg }

// Stats reads the counters.
func (p *Publisher) Stats() Stats {
	return Stats{Events: p.events.Load(), Batches: p.batches.Load(), Dropped: p.drops.Load(), Replays: p.replays.Load()}
}

// The kvcache.PrefixObserver methods: called under the pool's lock, they
// only append.

// BlockStored queues a BlockStored event, merged into the pending one
// when it continues that event's chain (as vLLM sends the blocks of one
// request's step together).
func (p *Publisher) BlockStored(hash, parent uint64, hasParent bool, tokens []int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.room() {
		return
	}
	if n := len(p.pending); n > 0 && hasParent {
		if last := &p.pending[n-1]; last.kind == stored && last.hashes[len(last.hashes)-1] == parent {
			last.hashes = append(last.hashes, hash)
			last.tokens = append(last.tokens, tokens...)
			return
		}
	}
	p.pending = append(p.pending, event{kind: stored, hashes: []uint64{hash}, parent: parent, hasParent: hasParent,
		tokens: append([]int32(nil), tokens...)})
}

// BlockRemoved queues a BlockRemoved event, merged into a pending one
// right before it.
func (p *Publisher) BlockRemoved(hash uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.room() {
		return
	}
	if n := len(p.pending); n > 0 && p.pending[n-1].kind == removed {
		p.pending[n-1].hashes = append(p.pending[n-1].hashes, hash)
		return
	}
	p.pending = append(p.pending, event{kind: removed, hashes: []uint64{hash}})
}

// AllBlocksCleared queues an AllBlocksCleared event.
func (p *Publisher) AllBlocksCleared() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.room() {
		return
	}
	p.pending = append(p.pending, event{kind: cleared})
}

// room counts one more pending block, or the drop when MaxPending are
// waiting (or the publisher closed). The caller holds p.mu.
func (p *Publisher) room() bool {
	if p.closed || p.npend >= p.cfg.MaxPending {
		p.drops.Add(1)
		return false
	}
	p.npend++
	return true
}

// Flush sends the pending events now, as one batch, and returns once it
// was handed to the socket.
func (p *Publisher) Flush() {
	ack := make(chan struct{})
	select {
	case p.flushCh <- ack:
		<-ack
	case <-p.done:
	}
}

// run sends a batch every Interval, when events are pending.
func (p *Publisher) run() {
	defer close(p.done)
	enc := newEncoder(p.cfg.Format, p.cfg.BlockSize, p.cfg.Medium)
	tick := time.NewTicker(p.cfg.Interval)
	defer tick.Stop()
	var spare []event
	for {
		var ack chan struct{}
		select {
		case <-tick.C:
		case ack = <-p.flushCh:
		}
		p.mu.Lock()
		evs, closed := p.pending, p.closed
		p.pending, p.npend = spare[:0], 0
		p.mu.Unlock()
		if len(evs) > 0 {
			p.send(enc, evs)
		}
		spare = evs
		if ack != nil {
			close(ack)
		}
		if closed {
			return
		}
	}
}

// send encodes and sends one batch and keeps it for replay.
func (p *Publisher) send(enc *encoder, evs []event) {
	ts := float64(time.Now().UnixNano()) / 1e9
	payload, err := enc.batch(ts, evs, p.cfg.DataParallelRank)
	if err != nil {
		p.drops.Add(int64(len(evs)))
		return
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], p.seq)
	// A PUB socket's Send queues (up to the HWM, then drops): it does not
	// wait on subscribers.
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seq[:], payload)); err != nil {
		p.drops.Add(int64(len(evs)))
	} else {
		p.events.Add(int64(len(evs)))
		p.batches.Add(1)
	}
	p.bufMu.Lock()
	if len(p.buf) < p.cfg.BufferBatches {
		p.buf = append(p.buf, sent{p.seq, payload})
	} else {
		p.buf[p.head] = sent{p.seq, payload}
		p.head = (p.head + 1) % len(p.buf)
	}
	p.bufMu.Unlock()
	p.seq++
}

// endSeq is the sequence number that ends a replay (-1 as 8 bytes, big
// endian, with an empty payload), as vLLM's END_SEQ.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplay answers replay requests as vLLM's ROUTER does: a request
// [identity, "", start sequence as 8 bytes big endian] is answered with
// [identity, "", seq, payload] for every kept batch from start on, then
// [identity, "", -1, ""].
func (p *Publisher) serveReplay() {
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			return // closed
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			continue // not a replay request; vLLM logs and ignores it too
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		p.bufMu.Lock()
		var out []sent
		for i := range p.buf {
			if b := p.buf[(p.head+i)%len(p.buf)]; b.seq >= start {
				out = append(out, b)
			}
		}
		p.bufMu.Unlock()
		p.replays.Add(1)
		for _, b := range out {
			var seq [8]byte
			binary.BigEndian.PutUint64(seq[:], b.seq)
			if p.replay.Send(zmq4.NewMsgFrom(id, nil, seq[:], b.payload)) != nil {
				break
			}
		}
		_ = p.replay.Send(zmq4.NewMsgFrom(id, nil, endSeq, nil))
	}
}

// Close sends what is pending and closes the sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	select {
	case p.flushCh <- make(chan struct{}):
	case <-p.done:
	}
	<-p.done
	// Give the PUB socket's writer a moment to put the last batch on the
	// wire before the connections close.
	time.Sleep(50 * time.Millisecond)
	err := p.pub.Close()
	if p.replay != nil {
		if e := p.replay.Close(); err == nil {
			err = e
		}
	}
	p.cancel()
	return err
}
