package kvstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// gateStore is a Store whose Put waits until the gate opens (or its
// context ends: then it fails, as a timeout).
type gateStore struct {
	gate chan struct{}
	mu   sync.Mutex
	kv   map[string][]byte
	puts int
}

func newGateStore() *gateStore { return &gateStore{gate: make(chan struct{}), kv: map[string][]byte{}} }

func (g *gateStore) Get(ctx context.Context, keys []string) ([][]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = g.kv[k]
	}
	return out, nil
}

func (g *gateStore) Put(ctx context.Context, keys []string, vals [][]byte) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.puts++
	for i, k := range keys {
		g.kv[k] = vals[i]
	}
	return nil
}

func (g *gateStore) Close() error { return nil }

// TestWriterBounded: with the store stuck, Put never blocks; the queue
// takes entries up to its byte bound (the one in flight included) and
// drops and counts the rest; once the store moves, everything queued is
// written and counted, and Close flushes.
func TestWriterBounded(t *testing.T) {
	g := newGateStore()
	w := NewWriter(g, 10*100, time.Minute) // ten entries of 100 bytes
	val := make([]byte, 100)
	t0 := time.Now()
	accepted := 0
	for i := range 50 {
		if w.Put(fmt.Sprint("k", i), val) {
			accepted++
		}
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("50 Puts with the store stuck took %s", d)
	}
	if accepted != 10 {
		t.Fatalf("%d entries accepted, want 10 (the bound)", accepted)
	}
	if st := w.Stats(); st.Dropped != 40 || st.Written != 0 || st.QueuedBytes != 1000 {
		t.Fatalf("stats %+v, want 40 dropped, none written, 1000 bytes queued", st)
	}
	if w.Fits(1) {
		t.Fatal("Fits(1) with the queue full")
	}
	close(g.gate)
	w.Close(10 * time.Second)
	st := w.Stats()
	if st.Written != 10 || st.WrittenBytes != 1000 || st.Dropped != 40 || st.Errors != 0 || st.QueuedBytes != 0 {
		t.Fatalf("after Close: %+v, want 10 written, 1000 bytes, 40 dropped", st)
	}
	if len(g.kv) != 10 {
		t.Fatalf("the store holds %d entries, want 10", len(g.kv))
	}
	if w.Put("late", val) {
		t.Fatal("Put after Close accepted")
	}
}

// TestWriterTimeoutAndClose: a store that never answers fails each write
// at the timeout (counted as an error, its entries dropped), and Close
// returns by its deadline, dropping what is still queued.
func TestWriterTimeoutAndClose(t *testing.T) {
	g := newGateStore() // never opened
	w := NewWriter(g, 4*writeBatch, 50*time.Millisecond)
	for i := range 3 {
		w.Put(fmt.Sprint("k", i), make([]byte, writeBatch/2+1)) // one entry per pipeline
	}
	t0 := time.Now()
	w.Close(120 * time.Millisecond)
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("Close took %s", d)
	}
	st := w.Stats()
	if st.Written != 0 || st.Dropped != 3 || st.Errors < 1 {
		t.Fatalf("stats %+v, want nothing written, 3 dropped, errors counted", st)
	}
}

// errStore fails every operation.
type errStore struct{}

func (errStore) Get(context.Context, []string) ([][]byte, error) { return nil, errors.New("down") }
func (errStore) Put(context.Context, []string, [][]byte) error   { return errors.New("down") }
func (errStore) Close() error                                    { return nil }

// TestWriterErrors: failed writes are counted, their entries dropped.
func TestWriterErrors(t *testing.T) {
	w := NewWriter(errStore{}, 0, 0)
	w.Put("a", []byte("x"))
	w.Close(time.Second)
	if st := w.Stats(); st.Errors != 1 || st.Dropped != 1 || st.Written != 0 {
		t.Fatalf("stats %+v", st)
	}
}
