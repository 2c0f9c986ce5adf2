package tensor

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Threads is the number of workers Parallel splits work across (the
// calling goroutine included).
var Threads = runtime.GOMAXPROCS(0)

// The pool: Threads-1 goroutines started once, which after finishing a
// task spin for a short while on the task counter (decode runs a few
// hundred short parallel regions per token, and waking a sleeping
// goroutine costs microseconds) and then sleep until the next task.
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

// spinRounds bounds how long an idle worker polls for the next task before
// sleeping (roughly 20-50 µs).
const spinRounds = 20000

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
		for i := 0; pool.epoch.Load() == seen; i++ {
			if i < spinRounds {
				if i%256 == 255 {
					runtime.Gosched()
				}
				continue
			}
			pool.sleepers.Add(1)
			if pool.epoch.Load() == seen {
				<-pool.wake
			}
			pool.sleepers.Add(-1)
			i = 0
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
	// A few chunks per worker, for balance.
	chunk := max(grain, (n+4*workers-1)/(4*workers))
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
	for i := 0; t.left.Load() > 0 && i < spinRounds; i++ {
		if i%256 == 255 {
			runtime.Gosched()
		}
	}
	<-t.done
	pool.task.Store(nil)
	pool.busy.Store(false)
}
