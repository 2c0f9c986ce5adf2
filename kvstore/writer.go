package kvstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultQueueBytes bounds the bytes a Writer holds when the caller gives
// no bound.
const DefaultQueueBytes = 64 << 20

// writeBatch bounds the bytes one background write sends (one pipeline).
const writeBatch = 4 << 20

// Writer writes entries to a Store in the background. Put never blocks:
// an entry that does not fit the queue's byte bound (entries queued and
// being written count) is dropped and counted. One goroutine drains the
// queue, a pipeline of up to writeBatch bytes at a time, each bounded by
// the timeout.
type Writer struct {
	st       Store
	timeout  time.Duration
	maxBytes int64

	mu     sync.Mutex
	q      []item
	bytes  int64 // queued and in flight
	closed bool
	wake   chan struct{}
	done   chan struct{}

	written, writtenBytes, dropped, errs atomic.Int64
	lastErr                              atomic.Value // string: the last write error
}

type item struct {
	key string
	val []byte
}

// WriterStats are a Writer's counters.
type WriterStats struct {
	Written      int64 // entries the store accepted
	WrittenBytes int64 // their bytes
	Dropped      int64 // entries dropped: the queue was full (or the writer closed, or the store failed them)
	Errors       int64 // write operations (pipelines) the store failed
	QueuedBytes  int64 // bytes queued or in flight now
	LastError    string
}

// NewWriter starts a writer to st whose queue holds at most maxBytes
// (DefaultQueueBytes when 0); timeout bounds each write (DefaultTimeout
// when 0).
func NewWriter(st Store, maxBytes int64, timeout time.Duration) *Writer {
	if maxBytes <= 0 {
		maxBytes = DefaultQueueBytes
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	w := &Writer{st: st, timeout: timeout, maxBytes: maxBytes, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go w.drain()
	return w
}

// Fits reports whether n more bytes fit the queue now (so the caller need
// not copy an entry that would be dropped).
func (w *Writer) Fits(n int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.closed && w.bytes+int64(n) <= w.maxBytes
}

// Drop counts an entry the caller did not queue because it would not fit.
func (w *Writer) Drop() { w.dropped.Add(1) }

// Put queues val under key; false (counted as dropped) when it does not
// fit the queue or the writer is closed. It never blocks on the store.
func (w *Writer) Put(key string, val []byte) bool {
	w.mu.Lock()
	if w.closed || w.bytes+int64(len(val)) > w.maxBytes {
		w.mu.Unlock()
		w.dropped.Add(1)
		return false
	}
	w.q = append(w.q, item{key, val})
	w.bytes += int64(len(val))
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

// Stats reports the counters.
func (w *Writer) Stats() WriterStats {
	w.mu.Lock()
	q := w.bytes
	w.mu.Unlock()
	last, _ := w.lastErr.Load().(string)
	return WriterStats{Written: w.written.Load(), WrittenBytes: w.writtenBytes.Load(), Dropped: w.dropped.Load(), Errors: w.errs.Load(), QueuedBytes: q, LastError: last}
}

func (w *Writer) drain() {
	defer close(w.done)
	for {
		w.mu.Lock()
		n, size := 0, 0
		for n < len(w.q) && (n == 0 || size+len(w.q[n].val) <= writeBatch) {
			size += len(w.q[n].val)
			n++
		}
		batch := w.q[:n:n]
		w.q = w.q[n:]
		closed := w.closed
		w.mu.Unlock()
		if n == 0 {
			if closed {
				return
			}
			<-w.wake
			continue
		}
		keys := make([]string, n)
		vals := make([][]byte, n)
		for i, it := range batch {
			keys[i], vals[i] = it.key, it.val
		}
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		err := w.st.Put(ctx, keys, vals)
		cancel()
		if err != nil {
			w.lastErr.Store(err.Error())
			w.errs.Add(1)
			w.dropped.Add(int64(n))
		} else {
			w.written.Add(int64(n))
			w.writtenBytes.Add(int64(size))
		}
		w.mu.Lock()
		w.bytes -= int64(size)
		w.mu.Unlock()
	}
}

// Close stops taking entries, writes what is queued for at most wait,
// and returns; entries still queued then are dropped (counted). It does
// not close the store.
func (w *Writer) Close(wait time.Duration) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.done
		return
	}
	w.closed = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-w.done:
		return
	case <-t.C:
	}
	w.mu.Lock()
	w.dropped.Add(int64(len(w.q)))
	w.q = nil
	w.mu.Unlock()
	<-w.done // the write in flight ends within its timeout
}
