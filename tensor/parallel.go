package tensor

import (
	"runtime"
	"sync"
)

// Threads is the number of workers Parallel splits work across.
var Threads = runtime.GOMAXPROCS(0)

type job struct {
	fn     func(lo, hi int)
	lo, hi int
	wg     *sync.WaitGroup
}

var (
	poolOnce sync.Once
	jobs     chan job
)

func startPool() {
	jobs = make(chan job, 64)
	for i := 0; i < runtime.GOMAXPROCS(0); i++ {
		go func() {
			for j := range jobs {
				j.fn(j.lo, j.hi)
				j.wg.Done()
			}
		}()
	}
}

// Parallel runs fn over [0,n) split into at most Threads contiguous ranges
// on a persistent worker pool, and waits for all of them. Work of fewer than
// grain items per worker runs on the calling goroutine.
func Parallel(n, grain int, fn func(lo, hi int)) {
	workers := Threads
	if grain < 1 {
		grain = 1
	}
	if w := n / grain; w < workers {
		workers = w
	}
	if workers <= 1 {
		fn(0, n)
		return
	}
	poolOnce.Do(startPool)
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for lo := chunk; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		jobs <- job{fn, lo, hi, &wg}
	}
	fn(0, min(chunk, n))
	wg.Wait()
}
