package kvcache

import (
	"testing"
)

// TestCompressSharedPrefixCopies: a sequence that starts from cached
// prefix blocks and is then compressed (Keep) or re-indexed (RewriteKeys)
// copies the shared blocks it changes; the blocks, their contents and their
// prefix-cache entries stay as they were for everyone else, so the plain
// prefix is still a full hit afterwards.
func TestCompressSharedPrefixCopies(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(s *Paged) error
	}{
		{"Keep", func(s *Paged) error { return s.Keep(0, 1, append([]int{1}, seqRange(3, 9)...)) }},
		{"Keep of every table", func(s *Paged) error {
			for l := 0; l < 2; l++ {
				for h := 0; h < 2; h++ {
					if err := s.Keep(l, h, []int{0, 5, 8}); err != nil {
						return err
					}
				}
			}
			return nil
		}},
		{"RemoveRange", func(s *Paged) error { return s.RemoveRange(2, 6) }},
		{"RewriteKeys", func(s *Paged) error {
			return s.RewriteKeys(1, 0, []int{0, 1, 6}, func(pos int32, k []float32) int32 {
				for i := range k {
					k[i] = -1
				}
				return pos + 100
			})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newTestPool(t, 2, 2, 4, 4, 64)
			prompt := seqRange(100, 113) // 13 tokens: three full blocks
			a := p.NewSequence()
			if err := appendTokens(t, a, 0, len(prompt)); err != nil {
				t.Fatal(err)
			}
			a.RegisterPrefix(prompt, 0)
			ref := snapshot(a)
			b := p.NewSequence()
			if n := b.MatchPrefix(prompt, 0); n != 12 {
				t.Fatalf("matched %d tokens, want 12", n)
			}
			if err := appendTokens(t, b, 12, 1); err != nil {
				t.Fatal(err)
			}
			if err := c.change(b); err != nil {
				t.Fatal(err)
			}
			checkSnapshot(t, a, ref, seqRange(0, 13))
			a.Free()
			d := p.NewSequence()
			if n := d.MatchPrefix(prompt, 0); n != 12 {
				t.Fatalf("after %s on a sharing sequence the plain prefix matched %d tokens, want 12", c.name, n)
			}
			checkContents(t, d, seqRange(0, 12))
			checkInvariants(t, p, []*Paged{b, d})
			b.Free()
			d.Free()
		})
	}
}
