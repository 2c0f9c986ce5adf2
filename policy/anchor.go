package policy

// anchor is a decoded copy of a key that a policy moves step after step:
// the sinks that re-indexed positions slide forward with the window, and
// LM-Infinite's capped sinks. Each move rotates the copy from the position
// it was taken at and encodes the key once, so a lossy codec's rounding
// (f16, q8, q4) does not compound over the steps as re-rotating the stored
// key would.
type anchor struct {
	token int32     // the token's original position (State.orig): which key this is
	pos   int32     // the position the copy is rotated for
	key   []float32 // the key at pos [HeadDim]
}

// moveKeys moves the given slots (ascending) of table (l, h) to the
// positions to returns for each (k: the index into slots; pos: where the
// slot is now), re-rotating their keys. The first Config.Sinks slots are
// moved through anchors; the table's anchors are then those of the tokens
// in its first Sinks slots.
func (st *State) moveKeys(l, h int, slots []int, to func(k int, pos int32) int32) error {
	t := l*st.H + h
	m := st.rotator()
	if st.anchors == nil {
		st.anchors = make([][]anchor, len(st.orig))
	}
	anchors := st.anchors[t]
	find := func(tok int32) int {
		for j := range anchors {
			if anchors[j].token == tok {
				return j
			}
		}
		return -1
	}
	k := 0
	err := st.cache.RewriteKeys(l, h, slots, func(pos int32, key []float32) int32 {
		i, np := slots[k], to(k, pos)
		k++
		if np == pos {
			return pos
		}
		if i >= st.cfg.Sinks || i >= len(st.orig[t]) {
			m.Rotate(key, l, int(np-pos))
			return np
		}
		j := find(st.orig[t][i])
		if j < 0 {
			anchors = append(anchors, anchor{token: st.orig[t][i], pos: pos, key: append([]float32(nil), key...)})
			j = len(anchors) - 1
		}
		copy(key, anchors[j].key)
		m.Rotate(key, l, int(np-anchors[j].pos))
		return np
	})
	// Keep the anchors of the tokens still in the first Sinks slots.
	kept := anchors[:0]
	for _, a := range anchors {
		for i := 0; i < min(st.cfg.Sinks, len(st.orig[t])); i++ {
			if st.orig[t][i] == a.token {
				kept = append(kept, a)
				break
			}
		}
	}
	st.anchors[t] = kept
	return err
}

// cloneAnchors is a deep copy of a State's anchors (nil stays nil).
func cloneAnchors(in [][]anchor) [][]anchor {
	if in == nil {
		return nil
	}
	out := make([][]anchor, len(in))
	for t, as := range in {
		for _, a := range as {
			out[t] = append(out[t], anchor{token: a.token, pos: a.pos, key: append([]float32(nil), a.key...)})
		}
	}
	return out
}
