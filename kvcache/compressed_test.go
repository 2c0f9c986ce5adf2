package kvcache

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// positionsOf is every table's stored positions.
func positionsOf(s *Paged) string {
	L := s.Layout()
	var out []any
	for l := 0; l < L.Layers; l++ {
		for h := 0; h < L.KVHeads; h++ {
			out = append(out, s.Positions(l, h))
		}
	}
	return fmt.Sprint(out...)
}

// compressedSeq is a sequence of 13 tokens (positions 0..12) that
// matched the plain prefix of prompt when one is cached, pruned to ragged
// tables: table i keeps a different subset.
func compressedSeq(t *testing.T, p *Pool, prompt []int) *Paged {
	t.Helper()
	s := p.NewSequence()
	m := s.MatchPrefix(prompt, 0)
	if err := appendTokens(t, s, m, len(prompt)-m); err != nil {
		t.Fatal(err)
	}
	keeps := [][]int{{0, 1, 2, 3, 4, 5, 6, 7, 12}, {1, 5, 9, 12}, {0, 1, 2, 3, 11, 12}, {2, 3, 4, 6, 8, 10, 12}}
	L := s.Layout()
	for i := 0; i < L.Layers*L.KVHeads; i++ {
		if err := s.Keep(i/L.KVHeads, i%L.KVHeads, keeps[i%len(keeps)]); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// TestCompressedPrefix: a compressed sequence's ragged tables, cached
// under (prompt, extra), are handed whole (contents and positions) to a
// later sequence with the same prompt and extra, and to no other; the
// sequence that registered them goes on without changing them; they are
// evicted by the pool's LRU like plain blocks, and dropped with a plain
// prefix block they share.
func TestCompressedPrefix(t *testing.T) {
	prompt := seqRange(100, 113)
	t.Run("match", func(t *testing.T) {
		p := newTestPool(t, 2, 2, 4, 4, 64)
		a := compressedSeq(t, p, prompt)
		want, wantSnap := positionsOf(a), snapshot(a)
		if ok, err := a.RegisterCompressed(prompt, 7, "meta"); !ok || err != nil {
			t.Fatalf("register: %v %v", ok, err)
		}
		if ok, _ := a.RegisterCompressed(prompt, 7, "again"); ok {
			t.Fatal("registered twice")
		}
		// a goes on: appends into its partly filled blocks, then prunes.
		if err := appendTokens(t, a, 13, 3); err != nil {
			t.Fatal(err)
		}
		if err := a.Keep(0, 0, []int{0, 2, 4, 9, 10, 11}); err != nil {
			t.Fatal(err)
		}
		a.Free()
		for _, c := range []struct {
			name   string
			prompt []int
			extra  uint64
			hit    bool
		}{
			{"the same prompt and extra", prompt, 7, true},
			{"another extra", prompt, 8, false},
			{"a longer prompt", append(seqRange(100, 113), 5), 7, false},
			{"a shorter prompt", prompt[:12], 7, false},
		} {
			b := p.NewSequence()
			meta, ok := b.MatchCompressed(c.prompt, c.extra)
			if ok != c.hit {
				t.Fatalf("%s: hit %v, want %v", c.name, ok, c.hit)
			}
			if ok {
				if meta != "meta" || positionsOf(b) != want {
					t.Fatalf("%s: meta %v, positions %s, want %s", c.name, meta, positionsOf(b), want)
				}
				checkSnapshotRagged(t, b, wantSnap)
				// b appends and prunes too: copies, not the cached blocks.
				if err := appendTokens(t, b, 13, 2); err != nil {
					t.Fatal(err)
				}
				if err := b.Keep(1, 1, []int{0, 3, 5}); err != nil {
					t.Fatal(err)
				}
			}
			checkInvariants(t, p, []*Paged{b})
			b.Free()
		}
		c := p.NewSequence()
		if _, ok := c.MatchCompressed(prompt, 7); !ok || positionsOf(c) != want {
			t.Fatalf("third match: %v %s", ok, positionsOf(c))
		}
		checkSnapshotRagged(t, c, wantSnap)
		if n, bytes := p.CompressedPrefixes(); n != 1 || bytes <= 0 {
			t.Fatalf("CompressedPrefixes %d, %d bytes", n, bytes)
		}
		c.Free()
	})
	t.Run("evicted by the LRU", func(t *testing.T) {
		p := newTestPool(t, 2, 2, 4, 4, 32)
		a := compressedSeq(t, p, prompt)
		a.RegisterCompressed(prompt, 1, nil)
		a.Free()
		fill := p.NewSequence()
		if err := appendTokens(t, fill, 0, 32); err != nil {
			t.Fatal(err)
		}
		if _, ok := p.NewSequence().MatchCompressed(prompt, 1); ok {
			t.Fatal("matched a compressed prefix whose blocks were reused")
		}
		if n, _ := p.CompressedPrefixes(); n != 0 {
			t.Fatalf("%d compressed prefixes left", n)
		}
		checkInvariants(t, p, []*Paged{fill})
	})
	t.Run("dropped with a plain block it shares", func(t *testing.T) {
		p := newTestPool(t, 2, 2, 4, 4, 64)
		plain := p.NewSequence()
		if err := appendTokens(t, plain, 0, 13); err != nil {
			t.Fatal(err)
		}
		plain.RegisterPrefix(prompt, 0)
		plain.Free()
		// Table 0 keeps 0..7 whole: its first two blocks are the plain
		// prefix's, owned by its entries.
		a := compressedSeq(t, p, prompt)
		a.RegisterCompressed(prompt, 1, nil)
		a.Free()
		if _, ok := p.NewSequence().MatchCompressed(prompt, 1); !ok {
			t.Fatal("no hit")
		}
		// A plain sequence that matches block 0 and rewrites it in a full
		// pool drops block 0's entry, and the compressed prefix with it.
		q := p.NewSequence()
		if n := q.MatchPrefix(prompt, 0); n != 12 {
			t.Fatalf("plain prefix: %d", n)
		}
		p.mu.Lock()
		p.dropEntry(p.meta[q.tables[0].blocks[0]].entry)
		p.mu.Unlock()
		if _, ok := p.NewSequence().MatchCompressed(prompt, 1); ok {
			t.Fatal("matched a compressed prefix whose shared block lost its entry")
		}
		q.Free()
	})
	t.Run("not in blocks", func(t *testing.T) {
		k, _ := codec.Parse("kivi4", codec.Keys)
		v, _ := codec.Parse("kivi4", codec.Values)
		p, err := NewPool(PoolConfig{Layout: Layout{Layers: 1, KVHeads: 1, HeadDim: 8}, BlockTokens: 4, Tokens: 64, K: k, V: v})
		if err != nil {
			t.Fatal(err)
		}
		s := p.NewSequence()
		if err := appendTokens(t, s, 0, 5); err != nil {
			t.Fatal(err)
		}
		if _, err := s.RegisterCompressed(prompt[:5], 1, nil); !errors.Is(err, ErrNotCacheable) {
			t.Fatalf("KIVI residual: %v", err)
		}
	})
}

// checkSnapshotRagged: every table of s holds what ref holds, position by
// position.
func checkSnapshotRagged(t *testing.T, s *Paged, ref []map[int32][]float32) {
	t.Helper()
	now := snapshot(s)
	for i := range ref {
		if len(now[i]) != len(ref[i]) {
			t.Fatalf("table %d holds %d tokens, want %d", i, len(now[i]), len(ref[i]))
		}
		for pos, row := range ref[i] {
			if fmt.Sprint(now[i][pos]) != fmt.Sprint(row) {
				t.Fatalf("table %d position %d: %v, want %v", i, pos, now[i][pos], row)
			}
		}
	}
}
