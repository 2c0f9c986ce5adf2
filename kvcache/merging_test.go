package kvcache

import (
	"strings"
	"testing"
)

// TestStoreMergedRefusesBadPlans: StoreMerged checks what a merge hands
// it (every candidate once, ascending; directions and norms of the right
// size; candidates that match the tables) and refuses the rest with an
// error, leaving the tables unmerged.
func TestStoreMergedRefusesBadPlans(t *testing.T) {
	const L, H, d, B = 2, 1, 4, 4
	p, err := NewPool(PoolConfig{Layout: Layout{Layers: L, KVHeads: H, HeadDim: d}, BlockTokens: B, Tokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSequence()
	if err := appendTokens(t, s, 0, 8); err != nil {
		t.Fatal(err)
	}
	c, err := s.MergeCandidates(1, 0, 0, false)
	if err != nil || c.Len() != 8 {
		t.Fatalf("candidates %d, %v", c.Len(), err)
	}
	n := c.Len()
	good := func() MergePlan {
		pl := MergePlan{Merged: []int{0, 1, 2, 3, 4, 5}, Retained: []int{6, 7},
			KDir: make([]float32, n*d), VDir: make([]float32, n*d)}
		for j := range 2 {
			pl.KNorm[j], pl.VNorm[j] = make([]float32, n), make([]float32, n)
		}
		return pl
	}
	short := c
	short.Pos = c.Pos[:5] // inside the blocks but not on a block boundary
	for _, tc := range []struct {
		name string
		c    MergeCandidates
		plan func(MergePlan) MergePlan
		want string
	}{
		{"missing candidate", c, func(p MergePlan) MergePlan { p.Retained = []int{6}; return p }, "covers 7 of 8"},
		{"twice", c, func(p MergePlan) MergePlan { p.Retained = []int{5, 7}; return p }, "each of the 8 candidates once"},
		{"descending", c, func(p MergePlan) MergePlan { p.Retained = []int{7, 6}; return p }, "ascending"},
		{"out of range", c, func(p MergePlan) MergePlan { p.Retained = []int{6, 8}; return p }, "each of the 8 candidates once"},
		{"short directions", c, func(p MergePlan) MergePlan { p.KDir = p.KDir[:d]; return p }, "directions [8][4]"},
		{"missing norms", c, func(p MergePlan) MergePlan { p.VNorm[1] = nil; return p }, "norms [8]"},
		{"candidates off a block boundary", short, func(p MergePlan) MergePlan { return p }, "do not match the tables"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.StoreMerged(1, 0, tc.c, tc.plan(good()))
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %v, want one line mentioning %q", err, tc.want)
			}
			if s.tab(0, 0).mini != nil || s.tab(1, 0).mini != nil || s.Slots(1, 0) != 8 {
				t.Fatal("a refused plan changed the tables")
			}
			checkInvariants(t, p, []*Paged{s})
		})
	}
	if err := s.StoreMerged(1, 0, c, good()); err != nil {
		t.Fatal(err)
	}
	if s.tab(0, 0).mini == nil || s.Slots(0, 0) != 8 || s.Slots(1, 0) != 8 {
		t.Fatal("the good plan was not stored")
	}
	if _, err := s.MergeCandidates(0, 0, 0, false); err == nil {
		t.Fatal("layer 0 has no lower layer")
	}
	s.Free()
	if _, err := s.MergeCandidates(1, 0, 0, false); err == nil || !strings.Contains(err.Error(), "freed") {
		t.Fatalf("candidates of a freed sequence: %v", err)
	}
}
