package kvcache

import (
	"errors"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
)

var arenaLayout = Layout{Layers: 2, KVHeads: 2, HeadDim: 8}

func newArenaPool(t testing.TB, a *Arena, kn, vn string) *Pool {
	t.Helper()
	k, err := codec.Parse(kn, codec.Keys)
	if err != nil {
		t.Fatal(err)
	}
	v, err := codec.Parse(vn, codec.Values)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(PoolConfig{Layout: arenaLayout, BlockTokens: 4, K: k, V: v, Arena: a})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkArena: the arena never allocated more than its budget, and the
// pools hold what it says they hold.
func checkArena(t testing.TB, a *Arena, pools ...*Pool) {
	t.Helper()
	u := a.Usage()
	var held int64
	for _, p := range pools {
		held += p.Usage().BytesTotal
	}
	if u.Allocated > u.Budget || u.Held > u.Allocated || held != u.Held {
		t.Fatalf("arena %+v, pools hold %d bytes", u, held)
	}
}

// A pool takes memory only as it needs blocks.
func TestArenaLazy(t *testing.T) {
	a, err := NewArena(64<<10, 1088)
	if err != nil {
		t.Fatal(err)
	}
	p := newArenaPool(t, a, "f32", "f32")
	if u := a.Usage(); u.Allocated != 0 || p.Usage().BytesTotal != 0 {
		t.Fatalf("a new pool allocated memory: %+v", u)
	}
	s := p.NewSequence()
	if err := appendTokens(t, s, 0, 3); err != nil {
		t.Fatal(err)
	}
	if u := a.Usage(); u.Allocated != 1088 { // one chunk: a block for each of the 4 tables
		t.Fatalf("3 tokens allocated %d bytes, want one chunk", u.Allocated)
	}
	checkContents(t, s, seqRange(0, 3))
	checkInvariants(t, p, []*Paged{s})
	s.Free()
	checkArena(t, a, p)
	for _, c := range []struct {
		budget int64
		chunk  int
	}{{1 << 10, 32}, {100, 1088}, {1 << 50, 1 << 20}} {
		if _, err := NewArena(c.budget, c.chunk); err == nil {
			t.Errorf("NewArena(%d, %d) accepted", c.budget, c.chunk)
		}
	}
	small, _ := NewArena(1<<10, 256)
	if _, err := NewPool(PoolConfig{Layout: arenaLayout, BlockTokens: 4, Arena: small}); err == nil {
		t.Error("a pool whose block does not fit the arena's chunk accepted")
	}
	if _, err := NewPool(PoolConfig{Layout: arenaLayout, BlockTokens: 4, Arena: a, Tokens: 8}); err == nil {
		t.Error("a pool with an arena and a size accepted")
	}
}

// The order a pool finds memory in when the arena is spent: another
// pool's chunk of free blocks, then its own cached prefixes, then
// another pool's cached prefixes, then ErrNoBlocks. Referenced blocks are
// never taken; a closed pool's chunks are reused.
func TestArenaReclaimOrder(t *testing.T) {
	a, err := NewArena(4*1088, 1088) // 4 chunks of 4 f32 blocks: 4 tokens of every table each
	if err != nil {
		t.Fatal(err)
	}
	A, B := newArenaPool(t, a, "f32", "f32"), newArenaPool(t, a, "f32", "f32")
	pools := []*Pool{A, B}
	tokA, tokB := seqRange(0, 9), seqRange(100, 105)
	matched := func(p *Pool, tok []int) int {
		s := p.NewSequence()
		defer s.Free()
		return s.MatchPrefix(tok, 0)
	}
	step := func(what string, p *Pool, s *Paged, from, n int) {
		t.Helper()
		if err := appendTokens(t, s, from, n); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		checkArena(t, a, pools...)
	}
	// A caches 8 tokens (chunks 1, 2); B caches 4 (chunk 3); A holds a
	// chunk of free blocks (4): the arena is spent.
	a1 := A.NewSequence()
	step("a1", A, a1, 0, 4) // chunk 1: tokens 0-3 of every table
	step("a1", A, a1, 4, 4) // chunk 2: tokens 4-7
	a1.RegisterPrefix(tokA, 0)
	a1.Free()
	b1 := B.NewSequence()
	step("b1", B, b1, 100, 4)
	b1.RegisterPrefix(tokB, 0)
	b1.Free()
	a2 := A.NewSequence()
	step("a2", A, a2, 0, 4)
	a2.Free()
	if u := a.Usage(); u.Allocated != u.Budget {
		t.Fatalf("arena %+v, want it spent", u)
	}
	b2 := B.NewSequence()
	steps := []struct {
		name         string
		wantA, wantB int // tokens still cached afterwards
		blocksA      int
	}{
		{"another pool's free blocks first", 8, 4, 8},
		{"then its own cached prefix", 8, 0, 8},
		{"then another pool's cached prefix", 4, 0, 4}, // its least recently used block: the prefix's tail
		{"then the last of it", 0, 0, 0},
	}
	for i, c := range steps {
		step(c.name, B, b2, 200+4*i, 4)
		if gA, gB := matched(A, tokA), matched(B, tokB); gA != c.wantA || gB != c.wantB {
			t.Fatalf("%s: A has %d tokens cached, B %d; want %d and %d", c.name, gA, gB, c.wantA, c.wantB)
		}
		if u := A.Usage(); u.Blocks != c.blocksA {
			t.Fatalf("%s: A holds %d blocks, want %d", c.name, u.Blocks, c.blocksA)
		}
		checkInvariants(t, A, nil)
		checkInvariants(t, B, []*Paged{b2})
	}
	checkContents(t, b2, seqRange(200, 216))
	if err := appendTokens(t, b2, 216, 1); !errors.Is(err, ErrNoBlocks) {
		t.Fatalf("append beyond the arena: %v, want ErrNoBlocks", err)
	}
	if err := B.Close(); err == nil {
		t.Fatal("a pool closed while a sequence holds blocks")
	}
	b2.Free()
	for _, p := range []*Pool{A, B} {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if u := a.Usage(); u.Held != 0 || u.Allocated != u.Budget {
		t.Fatalf("after Close: %+v", u)
	}
	C := newArenaPool(t, a, "f32", "f32")
	pools = []*Pool{C}
	c1 := C.NewSequence()
	step("reuse", C, c1, 0, 16)
	checkContents(t, c1, seqRange(0, 16))
	if u := a.Usage(); u.Allocated != u.Budget || u.Held != u.Budget {
		t.Fatalf("a new pool after Close: %+v, want the same chunks reused", u)
	}
}

// Pools of every (K, V) codec pair drawing on one arena in turn, up to
// five open at once (the oldest closed, its memory reused), each filling
// what it can get, caching prefixes and keeping one sequence: the arena never
// allocates more than its budget, every pool gets memory (from the others'
// free and cached chunks), and a sequence held throughout keeps its
// contents.
func TestArenaCodecPairs(t *testing.T) {
	a, err := NewArena(64<<10, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keepPool := newArenaPool(t, a, "f32", "f32")
	keep := keepPool.NewSequence()
	if err := appendTokens(t, keep, 0, 12); err != nil {
		t.Fatal(err)
	}
	type open struct {
		p    *Pool
		live []*Paged
	}
	var pools []open
	all := func() []*Pool {
		out := []*Pool{keepPool}
		for _, o := range pools {
			out = append(out, o.p)
		}
		return out
	}
	tok := seqRange(1000, 1100)
	for round := range 2 {
		for _, kn := range codec.Names {
			for _, vn := range codec.Names {
				if len(pools) == 5 {
					for _, s := range pools[0].live {
						s.Free()
					}
					if err := pools[0].p.Close(); err != nil {
						t.Fatal(err)
					}
					pools = pools[1:]
				}
				o := open{p: newArenaPool(t, a, kn, vn)}
				got := 0
				for i := range 8 {
					s := o.p.NewSequence()
					n := 4 + (i*7+round*3)%37
					if err := appendTokens(t, s, 0, n); err != nil {
						if !errors.Is(err, ErrNoBlocks) {
							t.Fatalf("%s/%s: %v", kn, vn, err)
						}
						s.Free()
						continue
					}
					got++
					s.RegisterPrefix(tok[:n], uint64(i))
					if i != 1 {
						s.Free()
					} else {
						o.live = append(o.live, s)
					}
				}
				if got == 0 {
					t.Fatalf("%s/%s (round %d): no sequence got memory: %+v", kn, vn, round, a.Usage())
				}
				pools = append(pools, o)
				checkArena(t, a, all()...)
				checkInvariants(t, o.p, o.live)
				checkInvariants(t, keepPool, []*Paged{keep})
			}
		}
	}
	checkContents(t, keep, seqRange(0, 12))
	if u := a.Usage(); u.Allocated != u.Budget {
		t.Errorf("the arena never filled: %+v", u)
	}
}
