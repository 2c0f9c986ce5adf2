package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"testing"
)

// recorder is a PrefixObserver that writes down what it hears.
type recorder struct{ log []obsEvent }

type obsEvent struct {
	kind      string // stored, removed, cleared
	hash      uint64
	parent    uint64
	hasParent bool
	tokens    []int32
}

func (r *recorder) BlockStored(h, parent uint64, hasParent bool, tokens []int32) {
	r.log = append(r.log, obsEvent{"stored", h, parent, hasParent, slices.Clone(tokens)})
}
func (r *recorder) BlockRemoved(h uint64) { r.log = append(r.log, obsEvent{kind: "removed", hash: h}) }
func (r *recorder) AllBlocksCleared()     { r.log = append(r.log, obsEvent{kind: "cleared"}) }

func (r *recorder) take() []obsEvent {
	l := r.log
	r.log = nil
	return l
}

// refHash is the prefix cache's chain hash written from its definition
// with the standard library's SHA-256 (its first 8 bytes, big-endian) over
// the parent hash, extra and every token (as a uint32, widened) as 8
// little-endian bytes each.
func refHash(parent uint64, tokens []int, extra uint64) uint64 {
	h := sha256.New()
	var b [8]byte
	for _, v := range append([]uint64{parent, extra}, func() []uint64 {
		var out []uint64
		for _, t := range tokens {
			out = append(out, uint64(uint32(t)))
		}
		return out
	}()...) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	return binary.BigEndian.Uint64(h.Sum(nil)[:8])
}

func toks32(ts []int) []int32 {
	out := make([]int32, len(ts))
	for i, t := range ts {
		out[i] = int32(t)
	}
	return out
}

// The observer hears every full block a prompt registers, chained as the
// index hashes them, each once; the removal of an entry when its block is
// reused; one clear when the pool closes; nothing of a compressed prefix.
func TestPrefixObserver(t *testing.T) {
	p := newTestPool(t, 2, 1, 4, 4, 12) // 3 blocks per table
	r := &recorder{}
	p.SetPrefixObserver(r)
	prompt := seqRange(500, 509) // two full blocks and one token
	a := p.NewSequence()
	if err := appendTokens(t, a, 0, len(prompt)); err != nil {
		t.Fatal(err)
	}
	a.RegisterPrefix(prompt, 7)
	h1 := refHash(0, prompt[:4], 7)
	h2 := refHash(h1, prompt[4:8], 7)
	want := []obsEvent{{"stored", h1, 0, false, toks32(prompt[:4])}, {"stored", h2, h1, true, toks32(prompt[4:8])}}
	if got := r.take(); !slices.EqualFunc(got, want, sameEvent) {
		t.Fatalf("registering a prompt: heard %+v, want %+v", got, want)
	}
	// Registering again, and matching, store nothing new.
	a.RegisterPrefix(prompt, 7)
	b := p.NewSequence()
	if n := b.MatchPrefix(prompt, 7); n != 8 {
		t.Fatalf("matched %d", n)
	}
	b.Free()
	if got := r.take(); len(got) != 0 {
		t.Fatalf("re-registering and matching: heard %+v", got)
	}
	// The prompt's blocks wait in the cached list; a sequence of 12 other
	// tokens reuses them (the free block first), dropping both entries.
	a.Free()
	c := p.NewSequence()
	if err := appendTokens(t, c, 0, 12); err != nil {
		t.Fatal(err)
	}
	got := r.take()
	removed := []uint64{}
	for _, e := range got {
		if e.kind != "removed" {
			t.Errorf("reuse: heard %+v", e)
		}
		removed = append(removed, e.hash)
	}
	slices.Sort(removed)
	wantRemoved := []uint64{h1, h2}
	slices.Sort(wantRemoved)
	if !slices.Equal(removed, wantRemoved) {
		t.Errorf("reuse removed %x, want %x", removed, wantRemoved)
	}
	// A compressed prefix is not a block of one prompt: not reported.
	if _, err := c.RegisterCompressed(seqRange(0, 12), 1, nil); err != nil {
		t.Fatal(err)
	}
	if got := r.take(); len(got) != 0 {
		t.Errorf("a compressed prefix: heard %+v", got)
	}
	other := seqRange(900, 912)
	c.RegisterPrefix(other, 0)
	if got := r.take(); len(got) != 3 || got[2].parent != got[1].hash || got[1].parent != got[0].hash || got[0].hasParent {
		t.Errorf("three blocks: heard %+v", got)
	}
	c.Free()
	// Clearing: one event, and nothing is found afterwards.
	if n := p.ClearPrefixes(); n != 3 {
		t.Errorf("cleared %d entries, want 3", n)
	}
	if got := r.take(); len(got) != 1 || got[0].kind != "cleared" {
		t.Errorf("clearing: heard %+v, want one clear", got)
	}
	d := p.NewSequence()
	if n := d.MatchPrefix(append(other, 1), 0); n != 0 {
		t.Errorf("matched %d tokens after clearing", n)
	}
	d.RegisterPrefix(nil, 0)
	d.Free()
	// Closing an empty index says nothing; one with entries, one clear.
	if p.ClearPrefixes(); len(r.take()) != 0 {
		t.Error("clearing an empty index was heard")
	}
	e := p.NewSequence()
	if err := appendTokens(t, e, 0, 4); err != nil {
		t.Fatal(err)
	}
	e.RegisterPrefix(seqRange(0, 4), 0)
	e.Free()
	r.take()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if got := r.take(); len(got) != 1 || got[0].kind != "cleared" {
		t.Errorf("closing: heard %+v, want one clear", got)
	}
}

func sameEvent(a, b obsEvent) bool {
	return a.kind == b.kind && a.hash == b.hash && a.parent == b.parent && a.hasParent == b.hasParent && slices.Equal(a.tokens, b.tokens)
}
