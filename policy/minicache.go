package policy

// MiniCache (arXiv 2405.14366) as a policy: no token is dropped; the KV of
// adjacent layer pairs (l−1, l) from the middle of the model upward is
// merged into shared unit directions plus per-layer norms, the most
// distant tokens retained whole in both layers (MergeLayers does
// the work). Compress merges the prompt once after the prefill; with Every
// set, Before merges again every Every decode steps, whole blocks only,
// leaving the newest Window tokens unmerged (Window also applies after the
// prefill). Tokens merged stay in Kept: they are approximated, not evicted.
//
// Pairs: (MergeFrom, MergeFrom+1), (MergeFrom+2, MergeFrom+3), … while both
// layers exist, MergeFrom defaulting to Layers/2 (the paper merges from the
// middle layer up). With an odd number of layers from MergeFrom on, the top
// layer stays unmerged: stories260K (5 layers) merges (2, 3) and keeps 4.

import (
	"fmt"

	"github.com/kvlm/kvlm/attention"
)

// normalizeMiniCache fills in MiniCache's defaults: t = 0.6 and γ = 0.05
// (the paper's t; γ is one implementation's retention share, the paper's
// exact rule being unverified).
func (c Config) normalizeMiniCache() (Config, error) {
	switch {
	case c.Budget > 0 || c.Ratio > 0:
		return c, perr("budget", "policy: minicache merges layers and drops no token; it takes no budget or ratio (set t, gamma, merge-from)")
	case c.Sinks > 0:
		return c, perr("sinks", "policy: minicache takes no --kv-sinks")
	case c.Positions == PosReindex:
		return c, perr("positions", "policy: minicache keeps original positions")
	case c.Agg != attention.AggMean:
		return c, perr("agg", "policy: minicache uses no attention scores; it takes no --kv-agg")
	case c.Pool != "":
		return c, perr("pool", "policy: minicache uses no attention scores; it takes no --kv-pool")
	case c.Kernel > 0:
		return c, perr("kernel", "policy: minicache uses no attention scores; it takes no --kv-kernel")
	case c.MergeFrom < 0:
		return c, fmt.Errorf("policy: merge-from must not be negative, got %d", c.MergeFrom)
	}
	if c.Interp == 0 {
		c.Interp = 0.6
	}
	if c.Gamma == 0 {
		c.Gamma = 0.05
	}
	c.Positions = PosOriginal
	if !(c.Interp > 0 && c.Interp <= 1) {
		return c, fmt.Errorf("policy: minicache t must be in (0, 1], got %g", c.Interp)
	}
	if !(c.Gamma > 0 && c.Gamma <= 1) {
		return c, fmt.Errorf("policy: minicache gamma must be in (0, 1], got %g", c.Gamma)
	}
	return c, nil
}

// MergedPairs lists the merged layer pairs as their upper layers, for a
// model of L layers.
func (c Config) MergedPairs(L int) []int {
	from := c.MergeFrom
	if from == 0 {
		from = L / 2
	}
	var ups []int
	for u := from + 1; u < L; u += 2 {
		ups = append(ups, u)
	}
	return ups
}

// merge merges every pair's unmerged tokens: all of them after a prefill,
// whole blocks during decoding; the newest Window tokens stay.
func (st *State) merge(decode bool) error {
	ups := st.cfg.MergedPairs(st.L)
	if len(ups) == 0 {
		return fmt.Errorf("policy: minicache has no layer pair to merge from layer %d of %d", max(st.cfg.MergeFrom, st.L/2), st.L)
	}
	opt := MergeOptions{T: st.cfg.Interp, Gamma: st.cfg.Gamma, Recent: st.cfg.Window, Full: decode}
	for _, u := range ups {
		if _, err := MergeLayers(st.cache, u, opt); err != nil {
			return fmt.Errorf("policy: minicache: %w", err)
		}
	}
	st.Pruned++
	return nil
}

// mergeBefore is the decoding schedule: a merge every Every steps.
func (st *State) mergeBefore() error {
	if st.cfg.Every <= 0 {
		return nil
	}
	st.steps++
	if st.steps%st.cfg.Every != 0 {
		return nil
	}
	return st.merge(true)
}
