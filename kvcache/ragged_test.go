package kvcache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// raggedModel is what every table should hold: positions in slot order
// and, by position, the decoded key and value the codec stored.
type raggedModel struct {
	pos  [][]int32
	rows []map[int32][]float32
}

// read records the rows of the positions the model does not know yet.
func (m *raggedModel) read(s *Paged) {
	for i, snap := range snapshot(s) {
		for q, row := range snap {
			if _, ok := m.rows[i][q]; !ok {
				m.rows[i][q] = row
			}
		}
	}
}

// check compares s with the model and the table structure with its
// rules: a regular table's blocks are full but the last, a ragged one's
// counts add up to its tokens, each block holds at least one.
func (m *raggedModel) check(t *testing.T, s *Paged, what string) {
	t.Helper()
	B := s.pool.B
	snap := snapshot(s)
	for i := range s.tables {
		tb := &s.tables[i]
		got := s.Positions(i/s.pool.layout.KVHeads, i%s.pool.layout.KVHeads)
		if !slices.Equal(got, m.pos[i]) {
			j := 0
			for j < min(len(got), len(m.pos[i])) && got[j] == m.pos[i][j] {
				j++
			}
			t.Fatalf("%s: table %d holds %d tokens, want %d; from slot %d: %v, want %v", what, i, len(got), len(m.pos[i]), j,
				got[j:min(j+8, len(got))], m.pos[i][j:min(j+8, len(m.pos[i]))])
		}
		for _, q := range got {
			if !slices.Equal(snap[i][q], m.rows[i][q]) {
				t.Fatalf("%s: table %d position %d reads %v, want %v", what, i, q, snap[i][q], m.rows[i][q])
			}
		}
		if tb.cnt == nil {
			if len(tb.blocks) != (tb.n+B-1)/B {
				t.Fatalf("%s: regular table %d holds %d tokens in %d blocks", what, i, tb.n, len(tb.blocks))
			}
			continue
		}
		sum := 0
		for _, c := range tb.cnt {
			if c < 1 || int(c) > B {
				t.Fatalf("%s: table %d counts %v", what, i, tb.cnt)
			}
			sum += int(c)
		}
		if len(tb.cnt) != len(tb.blocks) || sum != tb.n {
			t.Fatalf("%s: table %d: %d blocks, counts %v for %d tokens", what, i, len(tb.blocks), tb.cnt, tb.n)
		}
	}
}

// TestRaggedKeep drives a cache through random prunes (mostly a few slots,
// as decoding drops them, sometimes most of a table), appends, removals,
// truncations, key rewrites and forks, and compares every table with a
// model after each step: the tokens held, in order, read back unchanged
// (moves are lossless), the block counts consistent, a pruned table within
// maxBlocks, Need exact on ragged tables, no block leaked or shared
// contents changed. It fails unless tables went ragged and were compacted
// back to full blocks along the way.
func TestRaggedKeep(t *testing.T) {
	for _, name := range []string{"f32", "f16", "q8", "q4"} {
		for _, B := range []int{1, 4, 16} {
			t.Run(fmt.Sprintf("%s-B%d", name, B), func(t *testing.T) {
				kc, _ := codec.Parse(name, codec.Keys)
				vc, _ := codec.Parse(name, codec.Values)
				L := Layout{Layers: 2, KVHeads: 2, HeadDim: 8}
				p, err := NewPool(PoolConfig{Layout: L, BlockTokens: B, K: kc, V: vc, Tokens: 10000})
				if err != nil {
					t.Fatal(err)
				}
				raggedSteps(t, p, rand.New(rand.NewPCG(uint64(B), 7)))
			})
		}
	}
}

func raggedSteps(t *testing.T, p *Pool, rng *rand.Rand) {
	L, B := p.layout, p.B
	T := L.Layers * L.KVHeads
	s := p.NewSequence()
	m := &raggedModel{pos: make([][]int32, T), rows: make([]map[int32][]float32, T)}
	for i := range m.rows {
		m.rows[i] = map[int32][]float32{}
	}
	next := 0
	add := func(n int, what string) {
		appendMeasured(t, s, next, n, what)
		for i := range m.pos {
			for q := range n {
				m.pos[i] = append(m.pos[i], int32(next+q))
			}
		}
		next += n
		m.read(s)
	}
	// drop returns the table's slots less the given ones.
	drop := func(n int, gone map[int]bool) []int {
		var keep []int
		for i := range n {
			if !gone[i] {
				keep = append(keep, i)
			}
		}
		return keep
	}
	// Tables of about raggedMin + 12 blocks, the smallest left ragged.
	hi, mid := (raggedMin+24)*B, (raggedMin+12)*B
	add(mid+rng.IntN(8*B), "prompt")
	ragged, compacted := 0, 0
	for step := range 400 {
		what := fmt.Sprintf("step %d", step)
		wasRagged := make([]bool, T)
		for i := range s.tables {
			wasRagged[i] = s.tables[i].cnt != nil
		}
		switch op := rng.IntN(12); {
		case op < 3:
			add(1+rng.IntN(2*B), what+" append")
		case op < 8: // a decode-time prune: a few slots of a table, or the oldest after 4 sinks
			i := rng.IntN(T)
			n := len(m.pos[i])
			if n < 8 {
				continue
			}
			gone := map[int]bool{}
			if op == 7 {
				gone[4] = true
			} else {
				for range 1 + rng.IntN(3) {
					gone[rng.IntN(n)] = true
				}
			}
			keep := drop(n, gone)
			if rng.IntN(2) == 0 {
				if err := s.Keep(i/L.KVHeads, i%L.KVHeads, keep); err != nil {
					t.Fatalf("%s: keep: %v", what, err)
				}
			} else { // the same prune named by its dropped slots
				var g []int
				for j := range n {
					if gone[j] {
						g = append(g, j)
					}
				}
				if err := s.Drop(i/L.KVHeads, i%L.KVHeads, g); err != nil {
					t.Fatalf("%s: drop: %v", what, err)
				}
			}
			m.pos[i] = gatherPos(m.pos[i], keep)
			// At most one block, or one in 32, more than full blocks.
			if tb := &s.tables[i]; len(tb.blocks) > (tb.n+B-1)/B+max(1, (tb.n+B-1)/B/32) {
				t.Fatalf("%s: %d tokens kept in %d blocks", what, tb.n, len(tb.blocks))
			}
		case op == 8: // a larger prune: a scattered quarter of a table, or (one time in three) all but a quarter
			i := rng.IntN(T)
			n := len(m.pos[i])
			gone := map[int]bool{}
			most := rng.IntN(3) == 0
			for j := range n {
				if (rng.IntN(4) == 0) != most {
					gone[j] = true
				}
			}
			keep := drop(n, gone)
			if err := s.Keep(i/L.KVHeads, i%L.KVHeads, keep); err != nil {
				t.Fatalf("%s: keep: %v", what, err)
			}
			m.pos[i] = gatherPos(m.pos[i], keep)
		case op == 9: // a range of every table, or a truncation
			short := len(m.pos[0])
			for _, q := range m.pos {
				short = min(short, len(q))
			}
			from := rng.IntN(short + 1)
			to := min(short, from+rng.IntN(3*B))
			if rng.IntN(2) == 0 {
				if err := s.RemoveRange(from, to); err != nil {
					t.Fatalf("%s: remove [%d,%d): %v", what, from, to, err)
				}
				for i, q := range m.pos {
					m.pos[i] = append(q[:from:from], q[to:]...)
				}
			} else {
				if err := s.Truncate(to); err != nil {
					t.Fatalf("%s: truncate to %d: %v", what, to, err)
				}
				for i := range m.pos {
					m.pos[i] = m.pos[i][:min(to, len(m.pos[i]))]
				}
			}
		case op == 10: // positions rewritten (re-indexing), keys re-encoded
			i := rng.IntN(T)
			var slots []int
			for j := range m.pos[i] {
				if rng.IntN(5) == 0 {
					slots = append(slots, j)
				}
			}
			if rng.IntN(2) == 0 {
				slices.Reverse(slots) // ascending is the cheap order, not a rule
			}
			const shift = 100000
			if err := s.RewriteKeys(i/L.KVHeads, i%L.KVHeads, slots, func(q int32, _ []float32) int32 { return q + shift }); err != nil {
				t.Fatalf("%s: rewrite: %v", what, err)
			}
			for _, j := range slots {
				q := m.pos[i][j]
				m.rows[i][q+shift] = slices.Clone(m.rows[i][q])
				m.pos[i][j] = q + shift
			}
			// The keys are decoded and encoded again (a quantized key may
			// move by its rounding): the model takes them as read, the
			// values must be unchanged.
			snap := snapshot(s)[i]
			for _, j := range slots {
				q := m.pos[i][j]
				d := L.HeadDim
				if !slices.Equal(snap[q][d:], m.rows[i][q][d:]) {
					t.Fatalf("%s: rewriting keys changed the value at position %d", what, q)
				}
				m.rows[i][q] = snap[q]
			}
		default: // a fork pruned and extended does not change the original
			f := s.Fork()
			i := rng.IntN(T)
			if n := len(m.pos[i]); n > 2 {
				if err := f.Keep(i/L.KVHeads, i%L.KVHeads, drop(n, map[int]bool{n / 2: true})); err != nil {
					t.Fatalf("%s: fork keep: %v", what, err)
				}
			}
			if err := appendTokens(t, f, next+1000, 1+rng.IntN(B)); err != nil {
				t.Fatalf("%s: fork append: %v", what, err)
			}
			m.check(t, s, what+" (after a fork's prune)")
			checkInvariants(t, p, []*Paged{s, f})
			f.Free()
		}
		m.check(t, s, what)
		checkInvariants(t, p, []*Paged{s})
		for i := range s.tables {
			switch r := s.tables[i].cnt != nil; {
			case r && !wasRagged[i]:
				ragged++
			case !r && wasRagged[i]:
				compacted++
			}
		}
		// Keep the cache near a decode-time size.
		if len(m.pos[0]) > hi {
			if err := s.Truncate(mid); err != nil {
				t.Fatal(err)
			}
			for i := range m.pos {
				m.pos[i] = m.pos[i][:min(mid, len(m.pos[i]))]
			}
			m.check(t, s, what+" truncated")
		}
	}
	if B > 1 && (ragged == 0 || compacted == 0) {
		t.Fatalf("tables went ragged %d times and back %d times: the test did not reach both", ragged, compacted)
	}
	// An image is taken of full blocks (ragged tables are compacted).
	img, err := s.Image()
	if err != nil {
		t.Fatal(err)
	}
	for i, ti := range img.Tables {
		if len(ti.Blocks) != (ti.N+B-1)/B || s.tables[i].cnt != nil {
			t.Fatalf("image of table %d: %d tokens in %d blocks", i, ti.N, len(ti.Blocks))
		}
	}
	m.check(t, s, "after the image")
	s.Free()
	checkInvariants(t, p, nil)
	if p.Usage().Used != 0 {
		t.Fatal("blocks leaked")
	}
}

// gatherPos is q's entries at the kept indexes.
func gatherPos(q []int32, keep []int) []int32 {
	out := make([]int32, len(keep))
	for j, k := range keep {
		out[j] = q[k]
	}
	return out
}

// TestRaggedStreaming is StreamingLLM's steady state: each step one token
// in and the oldest after 4 sinks out. The prune compacts one block, not
// the table, and a drained block is topped up from the next: the table
// keeps within one block of full ones, the sinks' block is drained to the
// sinks alone between merges, and what the table holds is the sinks and
// the newest tokens, in order.
func TestRaggedStreaming(t *testing.T) {
	const sinks, B = 4, 16
	const budget = (raggedMin + 8) * B
	L := Layout{Layers: 1, KVHeads: 1, HeadDim: 8}
	kc, _ := codec.Parse("f32", codec.Keys)
	vc, _ := codec.Parse("f32", codec.Values)
	p, err := NewPool(PoolConfig{Layout: L, BlockTokens: B, K: kc, V: vc, Tokens: budget + 1})
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSequence()
	if err := appendTokens(t, s, 0, budget); err != nil {
		t.Fatal(err)
	}
	keep := drop1(budget+1, sinks)
	drained, ragged := false, 0
	for next := budget; next < budget+5*B; next++ {
		if err := appendTokens(t, s, next, 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Keep(0, 0, keep); err != nil {
			t.Fatal(err)
		}
		want := append(seqRange(0, sinks), seqRange(next+1-(budget-sinks), next+1)...)
		checkContents(t, s, want)
		tb := &s.tables[0]
		if len(tb.blocks) > budget/B+1 {
			t.Fatalf("after position %d: %d blocks for %d tokens (counts %v)", next, len(tb.blocks), tb.n, tb.cnt)
		}
		if tb.cnt != nil {
			ragged++
			drained = drained || tb.cnt[0] == sinks
		}
	}
	if ragged < 4*B || !drained {
		t.Fatalf("ragged after %d of %d steps, the sinks' block drained to the sinks: %v", ragged, 5*B, drained)
	}
	s.Free()
	checkInvariants(t, p, nil)
}

// drop1 is 0..n−1 less i.
func drop1(n, i int) []int {
	return append(seqRange(0, i), seqRange(i+1, n)...)
}

// TestRaggedPoolTokens: a pool sized in tokens holds a sequence that never
// exceeds them however a policy prunes it: decode steps that prune each
// table to one below the size at scattered slots (H2O's pattern) or after
// 4 sinks (StreamingLLM's), then append a token, never run out of blocks,
// though ragged tables hold more blocks than dense ones would.
func TestRaggedPoolTokens(t *testing.T) {
	const T, B = (raggedMin + 4) * 16, 16
	L := Layout{Layers: 2, KVHeads: 2, HeadDim: 8}
	for _, scattered := range []bool{true, false} {
		t.Run(fmt.Sprintf("scattered=%v", scattered), func(t *testing.T) {
			p, err := NewPool(PoolConfig{Layout: L, BlockTokens: B, K: codec.F16Keys, V: codec.F16, Tokens: T})
			if err != nil {
				t.Fatal(err)
			}
			s := p.NewSequence()
			defer s.Free()
			if err := appendTokens(t, s, 0, T); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(5, 6))
			most := 0
			for step := range 600 {
				for l := range L.Layers {
					for h := range L.KVHeads {
						n := s.Slots(l, h)
						g := 4
						if scattered {
							g = rng.IntN(n)
						}
						if err := s.Drop(l, h, []int{g}); err != nil {
							t.Fatalf("step %d: %v", step, err)
						}
						most = max(most, len(s.tab(l, h).blocks))
					}
				}
				if err := s.Reserve(1); err != nil {
					t.Fatalf("step %d: %v (tables of %d tokens in up to %d blocks)", step, err, T-1, most)
				}
				if err := appendTokens(t, s, T+step, 1); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
			}
			if most <= T/B {
				t.Fatalf("at most %d blocks a table: never ragged past dense", most)
			}
		})
	}
}
