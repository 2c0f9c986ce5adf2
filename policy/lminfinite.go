package policy

import (
	"fmt"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// lminfinite is LM-Infinite's Λ-shaped window: sinks + window as
// streaming, with the distance cap: a global (sink) token is never seen
// further away than the local window.
type lmInfinite struct{ windowScorer }

// Step applies the cap before each decode step: the sinks move to
// position next−Window when that is later than where they are.
func (lmInfinite) Step(st *State, incoming int) error {
	next := int32(st.seq.Pos())
	target := next - int32(st.cfg.Window)
	for t := range st.orig {
		l, h := t/st.H, t%st.H
		s := min(st.cfg.Sinks, st.cache.Slots(l, h))
		slots := make([]int, s)
		for i := range slots {
			slots[i] = i
		}
		err := st.moveKeys(l, h, slots, func(_ int, pos int32) int32 { return max(pos, target) })
		if err != nil {
			return err
		}
	}
	return nil
}

func init() {
	Register(Method{Name: "lminfinite", Order: 3, Doc: "LM-Infinite: sinks + window with the distance cap",
		Params:       []string{"budget", "window", "sinks", "every", "positions"},
		DefaultEvery: 1, WindowBudget: true, Unused: map[string]string{"ratio": "%s takes a window, not a ratio"}, Normalize: normalizeWindow, Scorer: lmInfinite{}, PrefixTail: anyTail,
		Check: func(c Config, _ kvcache.Layout, keys codec.Codec) error {
			if keys != nil && !keys.PerToken() {
				return fmt.Errorf("policy: lminfinite moves its global tokens at every step, which needs per-token keys; %s keys are sealed in groups", keys.Name())
			}
			return nil
		}})
}
