package tensor

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Threads is the number of workers Parallel splits work across (the
// calling goroutine included).
var Threads = runtime.GOMAXPROCS(0)

// The pool: Threads-1 goroutines started once, which after finishing a
// task spin on the task counter for up to spinTime (decode runs ~111 short
// parallel regions a token with a few to tens of µs of serial work between
// them, and a sleeping goroutine takes ~200 µs to run again once woken
// here) and then sleep until the next task. A spinner yields the processor
// (runtime.Gosched) only once it has been idle for yieldAfter: a Gosched
// costs several µs, and one per region end made the next region's start
// late (docs/PERFORMANCE.md, "The pool's spin, measured token by token");
// past that, between decode steps or requests, other goroutines (a
// server's handlers) get the processor.
// The caller of Parallel waiting for the workers spins without yielding
// (for up to spinTime, then blocks).
// Work is handed out in chunks from an atomic counter, so a worker slowed
// by another process on its core takes fewer chunks.

type ptask struct {
	fn       func(lo, hi int)
	n, chunk int
	next     atomic.Int64 // start of the next chunk to hand out
	left     atomic.Int64 // chunks not finished
	done     chan struct{}
}

// run takes chunks until none are left; the goroutine finishing the last
// one closes done.
func (t *ptask) run() {
	for {
		lo := int(t.next.Add(int64(t.chunk))) - t.chunk
		if lo >= t.n {
			return
		}
		t.fn(lo, min(lo+t.chunk, t.n))
		if t.left.Add(-1) == 0 {
			close(t.done)
		}
	}
}

var pool struct {
	once     sync.Once
	workers  int
	busy     atomic.Bool // a task is running (nested calls run inline)
	task     atomic.Pointer[ptask]
	epoch    atomic.Uint64 // bumped for each task
	sleepers atomic.Int32
	wake     chan struct{}
}

const (
	spinTime   = time.Millisecond      // how long an idle worker polls before sleeping
	yieldAfter = 50 * time.Microsecond // idle time after which a spinner yields at each check
	spinCheck  = 256                   // polls between looks at the clock

	chunksPerWorker = 2 // a region's chunks per worker (the caller included)
)

// spin polls done until it reports true or spinTime has passed (false);
// with yield, it yields the processor at each look at the clock after
// yieldAfter.
func spin(done func() bool, yield bool) bool {
	var t0 time.Time
	for i := 1; ; i++ {
		if done() {
			return true
		}
		if i%spinCheck != 0 {
			continue
		}
		if i == spinCheck {
			t0 = time.Now()
			continue
		}
		switch idle := time.Since(t0); {
		case idle >= spinTime:
			return false
		case yield && idle >= yieldAfter:
			runtime.Gosched()
		}
	}
}

func startPool() {
	pool.workers = runtime.GOMAXPROCS(0) - 1
	pool.wake = make(chan struct{}, max(1, pool.workers))
	for i := 0; i < pool.workers; i++ {
		go worker()
	}
}

func worker() {
	seen := pool.epoch.Load()
	for {
		for !spin(func() bool { return pool.epoch.Load() != seen }, true) {
			pool.sleepers.Add(1)
			if pool.epoch.Load() == seen {
				<-pool.wake
			}
			pool.sleepers.Add(-1)
		}
		seen = pool.epoch.Load()
		if t := pool.task.Load(); t != nil {
			t.run()
		}
	}
}

// Parallel runs fn over [0,n), split into contiguous ranges of at least
// grain items (the last may be shorter), on the worker pool and the
// calling goroutine, and waits for all of them. Work of fewer than grain
// items per worker, and calls made while the pool is busy (from inside fn,
// or from another goroutine), run on the calling goroutine.
func Parallel(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	workers := min(Threads, n/grain)
	if workers <= 1 {
		fn(0, n)
		return
	}
	pool.once.Do(startPool)
	workers = min(workers, pool.workers+1)
	if workers <= 1 || !pool.busy.CompareAndSwap(false, true) {
		fn(0, n)
		return
	}
	// Two chunks per worker: some balance against a worker that another
	// process (or the host) slows, while each chunk restarts the kernels'
	// streams. Against four, alternated token by token: Q8_0 decode
	// +1.6–1.9%, prefill +1.9% (docs/PERFORMANCE.md, "The pool's spin,
	// measured token by token").
	chunk := max(grain, (n+chunksPerWorker*workers-1)/(chunksPerWorker*workers))
	t := &ptask{fn: fn, n: n, chunk: chunk, done: make(chan struct{})}
	t.left.Store(int64((n + chunk - 1) / chunk))
	pool.task.Store(t)
	pool.epoch.Add(1)
	for s := pool.sleepers.Load(); s > 0; s-- {
		select {
		case pool.wake <- struct{}{}:
		default:
		}
	}
	t.run()
	// The caller waits for the workers' last chunks without yielding:
	// a Gosched here made regions end late (~1.5% slower decode).
	spin(func() bool { return t.left.Load() <= 0 }, false)
	<-t.done
	pool.task.Store(nil)
	pool.busy.Store(false)
}
