package kvcache

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Arena is one byte budget that the block memory of several pools (one
// per codec pair, say) comes from. It hands out chunks of ChunkBytes, at
// most Budget/ChunkBytes of them, allocated the first time they are asked
// for: a pool starts with no memory and takes a chunk when it has no free
// block left, so the memory in use follows the blocks sequences held at
// the peak, never more than the budget, whatever the number of pools.
//
// A chunk comes back to the arena when its pool is closed, or when another
// pool needs memory and every block of the chunk is unreferenced (free, or
// holding a cached prefix: that prefix is dropped). Returned chunks are
// reused (cleared) by any pool, so pools dropped and made again cost no new
// memory. Allocated is the memory the arena ever allocated; it never
// exceeds the budget.
type Arena struct {
	mu     sync.Mutex
	chunk  int      // bytes of a chunk
	max    int      // chunks at most (Budget / chunk)
	made   int      // chunks allocated so far
	free   [][]byte // chunks given back, for reuse
	pools  []*Pool  // pools drawing on the arena (reclaim candidates)
	budget int64
}

// NewArena makes an arena of budget bytes handed out in chunks of
// chunkBytes (the budget is rounded down to whole chunks). A chunk must
// hold at least one block of every pool that draws on it.
func NewArena(budget int64, chunkBytes int) (*Arena, error) {
	if chunkBytes < 64 {
		return nil, fmt.Errorf("kvcache: arena chunks of %d bytes are too small (64 at least)", chunkBytes)
	}
	if budget < int64(chunkBytes) {
		return nil, fmt.Errorf("kvcache: a KV budget of %d bytes holds no chunk of %d bytes", budget, chunkBytes)
	}
	if budget > 1<<40 {
		return nil, fmt.Errorf("kvcache: a KV budget of %d bytes is too large", budget)
	}
	n := budget / int64(chunkBytes)
	return &Arena{chunk: chunkBytes, max: int(n), budget: n * int64(chunkBytes)}, nil
}

// Budget is the arena's size in bytes (whole chunks).
func (a *Arena) Budget() int64 { return a.budget }

// ChunkBytes is the size of the chunks pools take.
func (a *Arena) ChunkBytes() int { return a.chunk }

// ArenaUsage is a snapshot of an arena.
type ArenaUsage struct {
	Allocated int64 // bytes of chunks allocated so far (never more than the budget)
	Held      int64 // bytes of chunks pools hold now
	Budget    int64
}

// Usage reports the arena's memory.
func (a *Arena) Usage() ArenaUsage {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := int64(a.chunk)
	return ArenaUsage{Allocated: int64(a.made) * c, Held: int64(a.made-len(a.free)) * c, Budget: a.budget}
}

func (a *Arena) register(p *Pool) {
	a.mu.Lock()
	a.pools = append(a.pools, p)
	a.mu.Unlock()
}

// take gives pool p a chunk: a returned one, a new one while the budget
// allows, or one reclaimed from another pool whose blocks in it are all
// unreferenced (with allowCached, also one holding cached prefixes, which
// are dropped). nil when there is none. The caller holds p.mu; other
// pools are only tried (TryLock), so two pools growing at once cannot
// deadlock.
func (a *Arena) take(p *Pool, allowCached bool) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := len(a.free); n > 0 {
		mem := a.free[n-1]
		a.free = a.free[:n-1]
		clear(mem)
		return mem
	}
	if a.made < a.max {
		a.made++
		return make([]byte, a.chunk)
	}
	for _, q := range a.pools {
		if q == p || q.idle.Load() == 0 || !q.mu.TryLock() {
			continue
		}
		mem := q.releaseIdleChunk(allowCached)
		q.mu.Unlock()
		if mem != nil {
			clear(mem)
			return mem
		}
	}
	return nil
}

// spare is how many chunks p could take now (returned, never allocated,
// or idle in other pools). The caller holds p.mu.
func (a *Arena) spare(p *Pool) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.free) + a.max - a.made
	for _, q := range a.pools {
		if q != p {
			n += int(q.idle.Load())
		}
	}
	return n
}

// give returns chunks of a closed pool and forgets the pool.
func (a *Arena) give(p *Pool, chunks [][]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.free = append(a.free, chunks...)
	for i, q := range a.pools {
		if q == p {
			a.pools = append(a.pools[:i], a.pools[i+1:]...)
			break
		}
	}
}

// pchunk is one arena chunk a pool holds: the keys, values and positions
// of n blocks, each region 64-byte aligned.
type pchunk struct {
	mem    []byte
	k, v   []byte
	pos    []int32
	busy   int // blocks with references
	cached int // blocks in the cached list
}

// idleCounter counts a pool's chunks whose blocks are all unreferenced.
type idleCounter = atomic.Int64
