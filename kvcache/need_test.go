package kvcache

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// needPools is a pool of every codec pair and block size a pool accepts,
// with a short KIVI residual so that sealing happens within a few groups.
func needPools(t *testing.T, f func(t *testing.T, p *Pool)) {
	l := Layout{Layers: 2, KVHeads: 2, HeadDim: 32}
	for _, kn := range codec.Names {
		for _, vn := range codec.Names {
			k, err := codec.Parse(kn, codec.Keys)
			if err != nil {
				t.Fatal(err)
			}
			v, err := codec.Parse(vn, codec.Values)
			if err != nil {
				t.Fatal(err)
			}
			for _, B := range []int{1, 3, 8, 16, 32} {
				cfg := PoolConfig{Layout: l, BlockTokens: B, K: k, V: v, Tokens: 1024, Residual: 5}
				if _, err := FootprintOf(cfg); err != nil {
					continue // KIVI keys with a block size that does not divide their group
				}
				t.Run(fmt.Sprintf("%s-%s-B%d", kn, vn, B), func(t *testing.T) {
					p, err := NewPool(cfg)
					if err != nil {
						t.Fatal(err)
					}
					f(t, p)
				})
			}
		}
	}
}

// appendMeasured appends n tokens to s and fails the test unless the
// pool's used bytes grew by exactly s.Need(n).
func appendMeasured(t *testing.T, s *Paged, start, n int, what string) {
	t.Helper()
	need := s.Need(n)
	before := s.Pool().Usage().BytesUsed
	if err := appendTokens(t, s, start, n); err != nil {
		t.Fatalf("%s: append of %d tokens at %d: %v", what, n, start, err)
	}
	if got := s.Pool().Usage().BytesUsed - before; got != need {
		t.Fatalf("%s: appending %d tokens at %d took %d bytes, Need said %d", what, n, start, got, need)
	}
}

// TestNeedIsExact: for every codec pair and block size, what Need(n)
// reports is what appending n tokens takes from the arena: in order, after
// a fork (the shared last block is copied by the first writer, not by the
// last), after a prefix-cache hit, and under HoldSeal (counted when the
// hold is released).
func TestNeedIsExact(t *testing.T) {
	needPools(t, func(t *testing.T, p *Pool) {
		B := p.BlockTokens()
		steps := []int{1, 2, B, 1, 2*B + 1, 7, 1, 3 * B, 1}

		s := p.NewSequence()
		pos := 0
		for _, n := range steps {
			appendMeasured(t, s, pos, n, "in order")
			pos += n
		}

		// Forks share the blocks: each writer but the last copies a
		// shared partly filled block.
		f := s.Fork()
		g := s.Fork()
		for i, n := range []int{1, B + 2, 1} {
			appendMeasured(t, f, pos, n, fmt.Sprintf("fork f step %d", i))
			appendMeasured(t, g, pos, n, fmt.Sprintf("fork g step %d", i))
			appendMeasured(t, s, pos, n, fmt.Sprintf("original step %d", i))
			pos += n
		}
		f.Free()
		g.Free()
		s.Free()

		// A sequence that starts from the prefix cache.
		tok := seqRange(0, 4*B+3)
		a := p.NewSequence()
		appendMeasured(t, a, 0, len(tok), "prefix source")
		a.RegisterPrefix(tok, 0)
		b := p.NewSequence()
		m := b.MatchPrefix(tok, 0)
		if p.residual == 0 && m == 0 {
			t.Fatal("nothing matched")
		}
		appendMeasured(t, b, m, 1, "after a prefix hit")
		appendMeasured(t, b, m+1, B+1, "after a prefix hit")
		a.Free()
		b.Free()

		// Held in the residual: nothing is sealed until the release, which
		// takes what Need said.
		h := p.NewSequence()
		if err := h.HoldSeal(true); err != nil {
			t.Fatal(err)
		}
		var said int64
		before := p.Usage().BytesUsed
		pos = 0
		for _, n := range []int{3, 2 * B, 9, 1} {
			said += h.Need(n)
			if err := appendTokens(t, h, pos, n); err != nil {
				t.Fatal(err)
			}
			pos += n
		}
		if p.residual > 0 {
			if got := p.Usage().BytesUsed - before; got != 0 {
				t.Fatalf("held tokens took %d bytes before the release", got)
			}
		}
		if err := h.HoldSeal(false); err != nil {
			t.Fatal(err)
		}
		if got := p.Usage().BytesUsed - before; got != said {
			t.Fatalf("held appends and release took %d bytes, Need said %d", got, said)
		}
		appendMeasured(t, h, pos, B+1, "after the release")
		h.Free()
		if u := p.Usage(); u.Used != 0 {
			t.Fatalf("%d blocks still used", u.Used)
		}
	})
}

// TestAdmitBytesIsExact: a prompt, forked into n samples that append one
// token each, takes exactly AdmitBytes(prompt, n).
func TestAdmitBytesIsExact(t *testing.T) {
	needPools(t, func(t *testing.T, p *Pool) {
		B := p.BlockTokens()
		for _, prompt := range []int{1, B - 1, B, B + 1, 5*B + 2, 40} {
			for _, n := range []int{1, 2, 3} {
				if prompt < 1 {
					continue
				}
				s := p.NewSequence()
				if err := appendTokens(t, s, 0, prompt); err != nil {
					t.Fatal(err)
				}
				all := []*Paged{s}
				for range n - 1 {
					all = append(all, s.Fork())
				}
				for _, x := range all {
					if err := appendTokens(t, x, prompt, 1); err != nil {
						t.Fatal(err)
					}
				}
				if got, want := p.Usage().BytesUsed, p.AdmitBytes(prompt, n); got != want {
					t.Errorf("prompt %d, %d samples: took %d bytes, AdmitBytes said %d", prompt, n, got, want)
				}
				for _, x := range all {
					x.Free()
				}
			}
		}
	})
}

// TestReserveByNeed: Reserve refuses exactly the appends whose Need is
// more than the pool can allocate; with KIVI, tokens that stay in the
// residual need no block.
func TestReserveByNeed(t *testing.T) {
	l := Layout{Layers: 1, KVHeads: 1, HeadDim: 32}
	for _, c := range []struct {
		k, v     string
		B        int
		blocks   int // the pool's
		fill     int // tokens appended first
		n        int
		wantFull bool
	}{
		{"f32", "f32", 4, 2, 0, 8, false},
		{"f32", "f32", 4, 2, 0, 9, true},
		{"f32", "f32", 4, 2, 5, 3, false},
		{"f32", "f32", 4, 2, 5, 4, true},
		{"kivi4", "kivi4", 16, 2, 0, 39, false}, // residual 8 + group 32: the 40th token seals a group (2 blocks)
		{"kivi4", "kivi4", 16, 2, 0, 71, false},
		{"kivi4", "kivi4", 16, 2, 0, 72, true}, // a second group
		{"q8", "kivi2", 16, 1, 0, 23, false},   // KIVI values seal a block of 16
		{"q8", "kivi2", 16, 1, 0, 40, true},
	} {
		t.Run(fmt.Sprintf("%s-%s-%d+%d", c.k, c.v, c.fill, c.n), func(t *testing.T) {
			k, _ := codec.Parse(c.k, codec.Keys)
			v, _ := codec.Parse(c.v, codec.Values)
			cfg := PoolConfig{Layout: l, BlockTokens: c.B, K: k, V: v, Residual: 8}
			f, err := FootprintOf(cfg)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MemBytes = int64(c.blocks * f.BlockBytes)
			p, err := NewPool(cfg)
			if err != nil {
				t.Fatal(err)
			}
			s := p.NewSequence()
			if err := appendTokens(t, s, 0, c.fill); err != nil {
				t.Fatal(err)
			}
			err = s.Reserve(c.n)
			if full := errors.Is(err, ErrNoBlocks); full != c.wantFull {
				t.Fatalf("Reserve(%d) after %d tokens = %v, want full %v", c.n, c.fill, err, c.wantFull)
			}
			if err := appendTokens(t, s, c.fill, c.n); (err == nil) == c.wantFull {
				t.Fatalf("Reserve said full %v, the append returned %v", c.wantFull, err)
			}
		})
	}
}
