package kvcache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
)

func newTestPool(t testing.TB, layers, heads, hd, B, tokens int) *Pool {
	t.Helper()
	p, err := NewPool(PoolConfig{Layout: Layout{Layers: layers, KVHeads: heads, HeadDim: hd}, BlockTokens: B, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// appendTokens appends n tokens to every layer; token values encode
// (position, layer, head, channel) so contents can be checked.
func appendTokens(t testing.TB, s *Paged, start, n int) error {
	L := s.Layout()
	w := L.KVHeads * L.HeadDim
	for l := 0; l < L.Layers; l++ {
		k, v := make([]float32, n*w), make([]float32, n*w)
		pos := make([]int32, n)
		for i := 0; i < n; i++ {
			pos[i] = int32(start + i)
			for h := 0; h < L.KVHeads; h++ {
				for c := 0; c < L.HeadDim; c++ {
					k[i*w+h*L.HeadDim+c] = value(start+i, l, h, c)
					v[i*w+h*L.HeadDim+c] = -value(start+i, l, h, c)
				}
			}
		}
		if err := s.Append(l, pos, k, v); err != nil {
			return err
		}
	}
	return nil
}

func value(pos, l, h, c int) float32 { return float32(pos*1000 + l*100 + h*10 + c) }

// checkContents verifies that every table holds exactly the positions want,
// with the keys and values appendTokens wrote for them.
func checkContents(t testing.TB, s *Paged, want []int) {
	t.Helper()
	L := s.Layout()
	row := make([]float32, L.HeadDim)
	for l := 0; l < L.Layers; l++ {
		for h := 0; h < L.KVHeads; h++ {
			var got []int
			for _, seg := range s.Segments(l, h) {
				for i := 0; i < seg.N; i++ {
					p := int(seg.Pos[i])
					got = append(got, p)
					seg.KC.Get(seg.K, seg.Cap, L.HeadDim, i, row)
					for c, x := range row {
						if x != value(p, l, h, c) {
							t.Fatalf("layer %d head %d pos %d: key[%d] = %v, want %v", l, h, p, c, x, value(p, l, h, c))
						}
					}
					seg.VC.Get(seg.V, seg.Cap, L.HeadDim, i, row)
					if row[0] != -value(p, l, h, 0) {
						t.Fatalf("layer %d head %d pos %d: value %v", l, h, p, row[0])
					}
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("layer %d head %d holds %v, want %v", l, h, got, want)
			}
		}
	}
}

func seqRange(a, b int) []int {
	var r []int
	for i := a; i < b; i++ {
		r = append(r, i)
	}
	return r
}

// refsFromTables counts the references the live sequences hold.
func refsFromTables(seqs []*Paged) map[int32]int32 {
	refs := map[int32]int32{}
	for _, s := range seqs {
		for i := range s.tables {
			for _, b := range s.tables[i].blocks {
				refs[b]++
			}
			if m := s.tables[i].mini; m != nil {
				for _, b := range append(slices.Clone(m.dir.blocks), m.ret.blocks...) {
					refs[b]++
				}
			}
		}
	}
	return refs
}

// checkInvariants: reference counts equal the references tables hold, never
// negative; list membership matches ref == 0 (the cached list: a prefix
// entry); chunk and list counts add up.
func checkInvariants(t testing.TB, p *Pool, seqs []*Paged) {
	t.Helper()
	refs := refsFromTables(seqs)
	inList := map[uint8]int{}
	held := 0
	for b := range p.meta {
		m := p.meta[b]
		c := p.chunks[b/p.bpc]
		if c == nil || b%p.bpc >= len(c.pos)/p.B {
			if m.ref != 0 || m.list != listNone || m.entry != nil || refs[int32(b)] != 0 {
				t.Fatalf("absent block %d: %+v, tables hold %d", b, m, refs[int32(b)])
			}
			continue
		}
		held++
		if m.ref < 0 {
			t.Fatalf("block %d has reference count %d", b, m.ref)
		}
		if m.ref != refs[int32(b)] {
			t.Fatalf("block %d has reference count %d, tables hold %d", b, m.ref, refs[int32(b)])
		}
		want := uint8(listNone)
		if m.ref == 0 {
			want = listFree
			if m.entry != nil {
				want = listCached
			}
		}
		if m.list != want {
			t.Fatalf("block %d: ref %d entry %v in list %d, want %d", b, m.ref, m.entry != nil, m.list, want)
		}
		inList[m.list]++
	}
	for _, l := range []struct {
		id uint8
		l  blist
	}{{listFree, p.free}, {listCached, p.cached}} {
		n := 0
		for b := l.l.head; b >= 0; b = p.meta[b].next {
			n++
		}
		if n != l.l.n || n != inList[l.id] {
			t.Fatalf("list %d has %d blocks, counter %d, flags %d", l.id, n, l.l.n, inList[l.id])
		}
	}
	if p.nfree != p.free.n+p.cached.n || held != p.held {
		t.Fatalf("nfree %d (lists %d + %d), held %d (present %d)", p.nfree, p.free.n, p.cached.n, p.held, held)
	}
	idle := 0
	for slot, c := range p.chunks {
		if c == nil {
			continue
		}
		busy, cached := 0, 0
		for i := range len(c.pos) / p.B {
			m := p.meta[slot*p.bpc+i]
			if m.ref > 0 {
				busy++
			}
			if m.list == listCached {
				cached++
			}
		}
		if busy != c.busy || cached != c.cached {
			t.Fatalf("chunk %d: busy %d cached %d, blocks say %d and %d", slot, c.busy, c.cached, busy, cached)
		}
		if busy == 0 {
			idle++
		}
	}
	if int64(idle) != p.idle.Load() {
		t.Fatalf("%d idle chunks, counter %d", idle, p.idle.Load())
	}
}

func TestForkCopyOnWrite(t *testing.T) {
	p := newTestPool(t, 2, 2, 4, 4, 64)
	a := p.NewSequence()
	if err := appendTokens(t, a, 0, 10); err != nil {
		t.Fatal(err)
	}
	b := a.Fork()
	checkContents(t, b, seqRange(0, 10))
	before := p.Usage().Used
	// b writes into the shared, partly filled last block: it is copied.
	if err := appendTokens(t, b, 10, 1); err != nil {
		t.Fatal(err)
	}
	if got := p.Usage().Used - before; got != 4 { // one copy per (layer, head)
		t.Fatalf("a write to a shared block took %d new blocks, want 4", got)
	}
	checkContents(t, a, seqRange(0, 10))
	checkContents(t, b, seqRange(0, 11))
	// The written block is b's alone; the full ones are still shared.
	for i := range b.tables {
		lb, la := b.tables[i].blocks[2], a.tables[i].blocks[2]
		if lb == la || p.meta[lb].ref != 1 || p.meta[b.tables[i].blocks[0]].ref != 2 {
			t.Fatalf("table %d: after COW last blocks %d/%d refs %d", i, la, lb, p.meta[lb].ref)
		}
	}
	if p.Usage().CopyOnWrite != 4 {
		t.Fatalf("CopyOnWrite = %d", p.Usage().CopyOnWrite)
	}
	checkInvariants(t, p, []*Paged{a, b})
	a.Free()
	b.Free()
	checkInvariants(t, p, nil)
	if u := p.Usage(); u.Used != 0 || u.Free != u.Blocks {
		t.Fatalf("pool not free after all sequences ended: %+v", u)
	}
}

func TestTruncate(t *testing.T) {
	p := newTestPool(t, 1, 2, 4, 4, 64)
	s := p.NewSequence()
	if err := appendTokens(t, s, 0, 13); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{13, 12, 9, 8, 1, 0} {
		if err := s.Truncate(n); err != nil {
			t.Fatal(err)
		}
		checkContents(t, s, seqRange(0, n))
		if got, want := len(s.tables[0].blocks), (n+3)/4; got != want {
			t.Fatalf("truncate to %d keeps %d blocks, want %d", n, got, want)
		}
	}
	if err := appendTokens(t, s, 0, 5); err != nil {
		t.Fatal(err)
	}
	checkContents(t, s, seqRange(0, 5))
	s.Free()
	checkInvariants(t, p, nil)
}

// TestPoolProperties drives random fork/append/truncate/free/prefix
// sequences and checks the invariants after every step, and that the pool
// is wholly free at the end.
func TestPoolProperties(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		p := newTestPool(t, 2, 2, 4, 1+rng.IntN(8), 200)
		type live struct {
			s   *Paged
			len int
		}
		var seqs []live
		all := func() []*Paged {
			var r []*Paged
			for _, l := range seqs {
				r = append(r, l.s)
			}
			return r
		}
		tokens := make([]int, 400)
		for i := range tokens {
			tokens[i] = rng.IntN(50)
		}
		for step := 0; step < 300; step++ {
			switch op := rng.IntN(10); {
			case op < 2 || len(seqs) == 0:
				s := p.NewSequence()
				n := s.MatchPrefix(tokens[:1+rng.IntN(100)], 0)
				seqs = append(seqs, live{s, n})
			case op < 5:
				i := rng.IntN(len(seqs))
				n := 1 + rng.IntN(20)
				err := appendTokens(t, seqs[i].s, seqs[i].len, n)
				if errors.Is(err, ErrNoBlocks) {
					// A failed append leaves layers uneven: the runner frees such a sequence.
					seqs[i].s.Free()
					seqs = append(seqs[:i], seqs[i+1:]...)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				seqs[i].len += n
				seqs[i].s.RegisterPrefix(tokens[:seqs[i].len], 0)
			case op < 6:
				i := rng.IntN(len(seqs))
				seqs = append(seqs, live{seqs[i].s.Fork(), seqs[i].len})
			case op < 8:
				i := rng.IntN(len(seqs))
				n := rng.IntN(seqs[i].len + 1)
				if err := seqs[i].s.Truncate(n); err != nil {
					t.Fatal(err)
				}
				seqs[i].len = n
			default:
				i := rng.IntN(len(seqs))
				seqs[i].s.Free()
				seqs = append(seqs[:i], seqs[i+1:]...)
			}
			checkInvariants(t, p, all())
			for _, l := range seqs {
				if l.s.Len() != l.len && l.len > 0 {
					t.Fatalf("seed %d step %d: sequence holds %d tokens, want %d", seed, step, l.s.Len(), l.len)
				}
			}
		}
		for _, l := range seqs {
			checkContents(t, l.s, seqRange(0, l.len))
			l.s.Free()
		}
		checkInvariants(t, p, nil)
		if u := p.Usage(); u.Used != 0 {
			t.Fatalf("seed %d: %d blocks leaked", seed, u.Used)
		}
	}
}

func TestPrefixCache(t *testing.T) {
	p := newTestPool(t, 2, 2, 4, 4, 64)
	prompt := seqRange(100, 111) // 11 tokens: two full blocks
	a := p.NewSequence()
	if n := a.MatchPrefix(prompt, 0); n != 0 {
		t.Fatalf("empty cache matched %d tokens", n)
	}
	if err := appendTokens(t, a, 0, len(prompt)); err != nil {
		t.Fatal(err)
	}
	a.RegisterPrefix(prompt, 0)
	b := p.NewSequence()
	if n := b.MatchPrefix(prompt, 0); n != 8 {
		t.Fatalf("matched %d tokens, want 8", n)
	}
	checkContents(t, b, seqRange(0, 8))
	other := append([]int{}, prompt...)
	other[5] = 7
	for _, c := range []struct {
		name   string
		prompt []int
		extra  uint64
		want   int
	}{
		{"a different extra key", prompt, 1, 0},
		{"a prompt differing in block 1", other, 0, 4},
		{"a prompt of exactly two blocks leaves its last token to compute", prompt[:8], 0, 4},
	} {
		s := p.NewSequence()
		if n := s.MatchPrefix(c.prompt, c.extra); n != c.want {
			t.Fatalf("%s: matched %d tokens, want %d", c.name, n, c.want)
		}
		s.Free()
	}
	u := p.Usage()
	if u.PrefixHits == 0 || u.PrefixQueries < u.PrefixHits {
		t.Fatalf("counters %+v", u)
	}
	// Cached blocks outlive their sequences until reused.
	a.Free()
	b.Free()
	d := p.NewSequence()
	if n := d.MatchPrefix(prompt, 0); n != 8 {
		t.Fatalf("after free, matched %d", n)
	}
	checkContents(t, d, seqRange(0, 8))
	d.Free()
	// Filling the pool reuses the cached blocks and drops their entries.
	e := p.NewSequence()
	if err := appendTokens(t, e, 0, 64); err != nil {
		t.Fatal(err)
	}
	if f := p.NewSequence(); f.MatchPrefix(prompt, 0) != 0 {
		t.Fatal("a reused block was still matched")
	}
	if p.Usage().PrefixEvictions == 0 {
		t.Fatal("no eviction counted")
	}
}

func TestMemoryAccounting(t *testing.T) {
	p := newTestPool(t, 2, 3, 8, 16, 1024)
	s := p.NewSequence()
	if err := appendTokens(t, s, 0, 20); err != nil {
		t.Fatal(err)
	}
	m := s.Memory()
	bb := int64(p.BlockBytes())
	if bb != 16*8*4*2+16*4 {
		t.Fatalf("block bytes %d", bb)
	}
	if m.Blocks != 2*3*2 || m.Reserved != 12*bb || m.Used != 2*3*20*bb/16 || m.Wasted != m.Reserved-m.Used {
		t.Fatalf("memory %+v (block %d B)", m, bb)
	}
	if u := p.Usage(); u.Used != 12 || u.BytesUsed != 12*bb {
		t.Fatalf("usage %+v", u)
	}
}

func TestPoolConfigErrors(t *testing.T) {
	l := Layout{Layers: 2, KVHeads: 2, HeadDim: 8}
	kivi, _ := codec.Parse("kivi2", codec.Keys)
	cases := []struct {
		name string
		cfg  PoolConfig
		want string
	}{
		{"block size 0", PoolConfig{Layout: l, BlockTokens: 0, Tokens: 10}, "block size"},
		{"negative block", PoolConfig{Layout: l, BlockTokens: -1, Tokens: 10}, "block size"},
		{"no budget", PoolConfig{Layout: l, BlockTokens: 16}, "budget"},
		{"both budgets", PoolConfig{Layout: l, BlockTokens: 16, Tokens: 10, MemBytes: 1 << 20}, "not both"},
		{"budget under one block per head", PoolConfig{Layout: l, BlockTokens: 16, MemBytes: 1000}, "fewer than one per"},
		{"bad layout", PoolConfig{Layout: Layout{}, BlockTokens: 16, Tokens: 10}, "invalid layout"},
		{"kivi group vs block", PoolConfig{Layout: l, BlockTokens: 64, K: kivi, Tokens: 100}, "multiple of the block size"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewPool(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
		})
	}
	if _, err := codec.Parse("q3", codec.Keys); err == nil {
		t.Fatal("unknown codec accepted")
	}
}

func TestPoolExhaustion(t *testing.T) {
	p := newTestPool(t, 1, 1, 4, 4, 8) // 2 blocks
	s := p.NewSequence()
	if err := s.Reserve(9); !errors.Is(err, ErrNoBlocks) {
		t.Fatalf("Reserve(9) = %v", err)
	}
	if err := appendTokens(t, s, 0, 8); err != nil {
		t.Fatal(err)
	}
	if err := appendTokens(t, s, 8, 1); !errors.Is(err, ErrNoBlocks) {
		t.Fatalf("append past the pool = %v", err)
	}
	s.Free()
	checkInvariants(t, p, nil)
}

func TestRemoveRangeAndKeep(t *testing.T) {
	for _, name := range []string{"f32", "f16", "q8", "q4", "q8+shift", "q4+shift"} {
		t.Run(name, func(t *testing.T) {
			base, shifted := strings.CutSuffix(name, "+shift")
			kc, _ := codec.Parse(base, codec.Keys)
			vc, _ := codec.Parse(base, codec.Values)
			l := Layout{Layers: 2, KVHeads: 2, HeadDim: 8}
			p, err := NewPool(PoolConfig{Layout: l, BlockTokens: 4, K: kc, V: vc, Tokens: 64, KeyShift: testShift(l, shifted)})
			if err != nil {
				t.Fatal(err)
			}
			if p.KeyShifted() != shifted {
				t.Fatalf("KeyShifted %v", p.KeyShifted())
			}
			s := p.NewSequence()
			if err := appendTokens(t, s, 0, 30); err != nil {
				t.Fatal(err)
			}
			// Reference contents: what the codec stored, slot by slot.
			ref := snapshot(s)
			if err := s.RemoveRange(5, 13); err != nil {
				t.Fatal(err)
			}
			want := append(seqRange(0, 5), seqRange(13, 30)...)
			checkSnapshot(t, s, ref, want)
			if got := len(s.tables[0].blocks); got != 6 { // 22 tokens in blocks of 4
				t.Fatalf("%d blocks after removal, want 6", got)
			}
			// One head keeps fewer tokens than the others: ragged tables free blocks.
			before := p.Usage().Used
			if err := s.Keep(1, 1, []int{0, 1, 2, 20, 21}); err != nil {
				t.Fatal(err)
			}
			if freed := before - p.Usage().Used; freed != 4 {
				t.Fatalf("keeping 5 of 22 tokens freed %d blocks, want 4", freed)
			}
			if err := s.Keep(0, 0, []int{3, 1}); err == nil {
				t.Fatal("unordered keep accepted")
			}
			checkInvariants(t, p, []*Paged{s})
			// Appending continues after a compaction.
			if err := appendTokens(t, s, 30, 3); err != nil {
				t.Fatal(err)
			}
			s.Free()
			checkInvariants(t, p, nil)
			if p.Usage().Used != 0 {
				t.Fatal("blocks leaked")
			}
		})
	}
}

// snapshot decodes every stored slot by position, per table.
func snapshot(s *Paged) []map[int32][]float32 {
	L := s.Layout()
	var out []map[int32][]float32
	for l := 0; l < L.Layers; l++ {
		for h := 0; h < L.KVHeads; h++ {
			m := map[int32][]float32{}
			for _, seg := range s.Segments(l, h) {
				for i := 0; i < seg.N; i++ {
					row := make([]float32, 2*L.HeadDim)
					seg.KC.Get(seg.K, seg.Cap, L.HeadDim, i, row[:L.HeadDim])
					seg.VC.Get(seg.V, seg.Cap, L.HeadDim, i, row[L.HeadDim:])
					m[seg.Pos[i]] = row
				}
			}
			out = append(out, m)
		}
	}
	return out
}

func checkSnapshot(t *testing.T, s *Paged, ref []map[int32][]float32, want []int) {
	t.Helper()
	now := snapshot(s)
	L := s.Layout()
	for i := range now {
		var got []int
		for l := 0; l < 1; l++ {
		}
		segs := s.Segments(i/L.KVHeads, i%L.KVHeads)
		for _, seg := range segs {
			for j := 0; j < seg.N; j++ {
				got = append(got, int(seg.Pos[j]))
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("table %d holds %v, want %v", i, got, want)
		}
		for p, row := range now[i] {
			for c := range row {
				if row[c] != ref[i][p][c] {
					t.Fatalf("table %d pos %d changed by compaction", i, p)
				}
			}
		}
	}
}

// TestPruneKeepsPrefixEntry: compacting or rewriting a registered block
// changes a copy: the block keeps the cached prefix's contents and its
// entry, so a later sequence gets the prefix as it was registered. When the
// pool has no block for the copy, the entry is dropped instead, so no later
// sequence gets changed contents.
func TestPruneKeepsPrefixEntry(t *testing.T) {
	for _, c := range []struct {
		name   string
		tokens int // pool size
		change func(s *Paged) error
		want   int // tokens matched afterwards
	}{
		{"Keep", 64, func(s *Paged) error { return s.Keep(0, 0, append([]int{1}, seqRange(3, 13)...)) }, 12},
		{"RewriteKeys", 64, func(s *Paged) error {
			return s.RewriteKeys(0, 0, []int{0}, func(pos int32, k []float32) int32 { k[0] = -5; return pos + 7 })
		}, 12},
		{"Keep in a full pool", 16, func(s *Paged) error { return s.Keep(0, 0, append([]int{1}, seqRange(3, 16)...)) }, 0},
		{"RewriteKeys in a full pool", 16, func(s *Paged) error {
			return s.RewriteKeys(0, 0, []int{0}, func(pos int32, k []float32) int32 { k[0] = -5; return pos + 7 })
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newTestPool(t, 1, 1, 4, 4, c.tokens)
			n := min(c.tokens, 16)
			prompt := seqRange(0, n)
			a := p.NewSequence()
			if err := appendTokens(t, a, 0, n); err != nil {
				t.Fatal(err)
			}
			a.RegisterPrefix(prompt, 0)
			if err := c.change(a); err != nil {
				t.Fatal(err)
			}
			b := p.NewSequence()
			got := b.MatchPrefix(prompt[:13], 0)
			if got != c.want {
				t.Fatalf("matched %d tokens, want %d", got, c.want)
			}
			checkContents(t, b, seqRange(0, got))
			checkInvariants(t, p, []*Paged{a, b})
		})
	}
}

// TestCompactKeyPanels: removing a range moves keys stored as score
// panels (f32, f16, bf16, q8 and q4 keys) slot by slot across groups of 16 and blocks
// with a partial last group, losslessly.
func TestCompactKeyPanels(t *testing.T) {
	for _, name := range []string{"f32", "f16", "bf16", "q8", "q4"} {
		for _, B := range []int{16, 24} {
			t.Run(fmt.Sprintf("%s/B%d", name, B), func(t *testing.T) {
				kc, _ := codec.Parse(name, codec.Keys)
				vc, _ := codec.Parse(name, codec.Values)
				blk := make([]byte, kc.BlockBytes(16, 16))
				if _, _, ok := codec.KeyPanel(kc, blk, 16, 16, 0); !ok && !codec.DecodeKeyPanel(kc, blk, 16, 16, 0, make([]float32, 256)) {
					t.Fatalf("%s keys are not in panels", name)
				}
				p, err := NewPool(PoolConfig{Layout: Layout{Layers: 1, KVHeads: 2, HeadDim: 16}, BlockTokens: B, K: kc, V: vc, Tokens: 128})
				if err != nil {
					t.Fatal(err)
				}
				s := p.NewSequence()
				if err := appendTokens(t, s, 0, 70); err != nil {
					t.Fatal(err)
				}
				ref := snapshot(s)
				if err := s.RemoveRange(5, 33); err != nil {
					t.Fatal(err)
				}
				checkSnapshot(t, s, ref, append(seqRange(0, 5), seqRange(33, 70)...))
				if err := s.Keep(0, 1, []int{0, 3, 17, 18, 19, 20, 21, 40}); err != nil {
					t.Fatal(err)
				}
				checkInvariants(t, p, []*Paged{s})
				s.Free()
				checkInvariants(t, p, nil)
			})
		}
	}
}
