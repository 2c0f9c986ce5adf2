package policy

import (
	"errors"
	"slices"

	"github.com/kvlm/kvlm/model"
)

// Snapshot is a State between steps, for a compressed prefix cache: the
// cache itself is kept by the caller (kvcache's compressed prefixes), this
// is what the policy knows of it. Only methods the shared prune runs with
// a Scorer that holds no per-sequence state can be snapshotted (every
// method but expected, pyramidinfer and minicache).
type Snapshot struct {
	cfg    Config
	scores [][]float32 // [layer·H + head][slot]
	orig   [][]int32   // [layer·H + head][slot]
	seen   int
	steps  int
	pruned int
	pos    int // the sequence's next position (re-indexed or not)

	anchors [][]anchor // [layer·H + head] the moved sinks' key copies (anchor.go); nil: none taken yet
}

// Tokens is the history the snapshot continues from (what the sequence ran).
func (sn *Snapshot) Tokens() int { return sn.seen }

// Snapshot copies the state, which must be between steps (not inside a
// prompt). ok is false for a method whose state it cannot copy.
func (st *State) Snapshot() (*Snapshot, bool) {
	if st.prefT != 0 || st.method.Scorer == nil || st.method.Run != nil {
		return nil, false
	}
	return st.copyState(), true
}

// copyState is the Snapshot of the state as it is (Snapshot and
// SlotSnapshot check first that it may be taken).
func (st *State) copyState() *Snapshot {
	sn := &Snapshot{cfg: st.cfg, seen: st.seen, steps: st.steps, pruned: st.Pruned, pos: st.seq.Pos(),
		scores: make([][]float32, len(st.scores)), orig: make([][]int32, len(st.orig))}
	for i := range st.scores {
		sn.scores[i] = slices.Clone(st.scores[i])
		sn.orig[i] = slices.Clone(st.orig[i])
	}
	sn.anchors = cloneAnchors(st.anchors)
	return sn
}

// Restore attaches the snapshotted policy to seq, whose cache holds what
// the snapshotted sequence's held (kvcache's compressed prefix): seq
// continues at the snapshot's position, and what it computes next is what
// the snapshotted sequence would have. cfg must be the snapshot's.
func Restore(cfg Config, seq *model.Sequence, sn *Snapshot) (*State, error) {
	cfg, err := cfg.Normalize()
	if err != nil {
		return nil, err
	}
	if cfg.Key() != sn.cfg.Key() {
		return nil, errors.New("policy: a snapshot restores only the configuration it was taken under")
	}
	seq.SetPos(sn.pos)
	seq.SetHistory(sn.seen)
	st, err := New(cfg, seq)
	if err != nil {
		return nil, err
	}
	for i := range st.orig {
		if n := st.cache.Slots(i/st.H, i%st.H); n != len(sn.orig[i]) {
			return nil, errors.New("policy: the cache does not hold what the snapshot's did")
		}
		st.orig[i] = slices.Clone(sn.orig[i])
		st.scores[i] = slices.Clone(sn.scores[i])
	}
	st.seen, st.steps, st.Pruned = sn.seen, sn.steps, sn.pruned
	st.anchors = cloneAnchors(sn.anchors)
	seq.SetPolicy(st)
	return st, nil
}
