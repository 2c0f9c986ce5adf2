package tensor

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestParallel: every item is visited exactly once, in ranges of at least
// grain items (but the last), nested and concurrent calls included.
func TestParallel(t *testing.T) {
	check := func(t *testing.T, n, grain int, nest bool) {
		seen := make([]atomic.Int32, n)
		Parallel(n, grain, func(lo, hi int) {
			if lo < 0 || hi > n || lo >= hi || (hi-lo < grain && hi != n) {
				t.Errorf("n=%d grain=%d: range [%d,%d)", n, grain, lo, hi)
			}
			for i := lo; i < hi; i++ {
				seen[i].Add(1)
			}
			if nest {
				var c atomic.Int32
				Parallel(10, 1, func(lo, hi int) { c.Add(int32(hi - lo)) })
				if c.Load() != 10 {
					t.Errorf("nested Parallel covered %d of 10", c.Load())
				}
			}
		})
		for i := range seen {
			if seen[i].Load() != 1 {
				t.Fatalf("n=%d grain=%d: item %d seen %d times", n, grain, i, seen[i].Load())
			}
		}
	}
	for _, n := range []int{0, 1, 2, 3, 7, 100, 1000, 12345} {
		for _, g := range []int{0, 1, 3, 64, 5000} {
			check(t, n, g, false)
		}
	}
	check(t, 1000, 1, true)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				check(t, 500+i, 1+i%7, i%5 == 0)
			}
		}()
	}
	wg.Wait()
}

// TestPoolSleepsWhenIdle: once no task comes for a while, every worker
// stops spinning and sleeps (an idle process must not burn its cores), and
// a sleeping pool still runs the next task on all its workers.
func TestPoolSleepsWhenIdle(t *testing.T) {
	Parallel(1000, 1, func(lo, hi int) {})
	if pool.workers == 0 {
		t.Skip("one processor: no workers")
	}
	deadline := time.Now().Add(5 * time.Second)
	for int(pool.sleepers.Load()) < pool.workers {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d workers asleep %v after the last task (spinTime %v)", pool.sleepers.Load(), pool.workers, 5*time.Second, spinTime)
		}
		time.Sleep(time.Millisecond)
	}
	// Each chunk waits (up to a second) for another goroutine to be inside
	// the task at the same time: a worker that wakes, however late.
	var inflight, most atomic.Int32
	Parallel(64, 1, func(lo, hi int) {
		n := inflight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		for end := time.Now().Add(time.Second); most.Load() < 2 && time.Now().Before(end); {
			time.Sleep(100 * time.Microsecond)
		}
		inflight.Add(-1)
	})
	if most.Load() < 2 {
		t.Errorf("after sleeping, the pool ran a task on %d goroutine(s) at once", most.Load())
	}
}

func BenchmarkParallelEmpty(b *testing.B) {
	for b.Loop() {
		Parallel(1000, 1, func(lo, hi int) {})
	}
}
