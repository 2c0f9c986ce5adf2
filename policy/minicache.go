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
// Pairs: (f, f+1), (f+2, f+3), … while both layers exist, f being the
// merge-from parameter, Layers/2 by default (the paper merges from the
// middle layer up). With an odd number of layers from f on, the top
// layer stays unmerged: stories260K (5 layers) merges (2, 3) and keeps 4.
//
// The layers are the cache's: on a model whose layers share KV (CLA, YOCO,
// Layer-Condensed KV) a pair is two adjacent KV owners, f and Layers/2
// count owners (CLA2 on 6 layers has 3 cache layers, owners 0, 2, 4, and
// merges cache layers (1, 2), the KV of model layers 2 and 4), and a pair
// with a window-bounded cache layer is refused (checkMiniCache).

import (
	"errors"
	"fmt"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// The parameters of MiniCache: t = 0.6 and γ = 0.05 (the paper's t; γ is
// one implementation's retention share, the paper's exact rule being
// unverified).
var (
	pInterp = &Param{Name: "t", Kind: FloatParam, Doc: "SLERP weight of the upper layer of a merged pair", Default: "0.6",
		Lo: 0, LoOpen: true, Hi: 1, Fill: 0.6}
	pGamma = &Param{Name: "gamma", Kind: FloatParam, Doc: "share of tokens retained unmerged in both layers", Default: "0.05",
		Lo: 0, LoOpen: true, Hi: 1, Fill: 0.05}
	pMergeFrom = &Param{Name: "merge-from", Kind: IntParam, Doc: "lower (cache) layer of the first merged pair", Default: "layers/2"}
)

func init() {
	Register(Method{Name: "minicache", Order: 11, Doc: "MiniCache: adjacent layers' KV merged, no token dropped",
		Params: []string{"window", "every", "t", "gamma", "merge-from"}, Own: []*Param{pInterp, pGamma, pMergeFrom},
		Unused: map[string]string{
			"budget":    "minicache merges layers and drops no token; it takes no budget or ratio (set t, gamma, merge-from)",
			"ratio":     "minicache merges layers and drops no token; it takes no budget or ratio (set t, gamma, merge-from)",
			"sinks":     "minicache takes no {{sinks}}",
			"positions": "minicache keeps original positions ({{positions}})",
			"agg":       "minicache uses no attention scores; it takes no {{agg}}",
			"pool":      "minicache uses no attention scores; it takes no {{pool}}",
			"kernel":    "minicache uses no attention scores; it takes no {{kernel}}",
		},
		Describe: func(c Config) string {
			return fmt.Sprintf(" t=%g gamma=%g from=%d", pInterp.Float(c), pGamma.Float(c), pMergeFrom.Int(c))
		},
		Check:      checkMiniCache,
		Run:        func(st *State) (Runner, error) { return &miniCache{st}, nil },
		PrefixTail: anyTail})
}

// checkMiniCache refuses a layout with no pair to merge, or a pair with a
// window-bounded layer: a pair is merged token by token, so both layers
// must hold the same tokens, and a layer read by sliding-window attention
// frees the tokens that slide out of its window (Layout.Windows) while
// merged tokens are stored once for both layers, in blocks that never slide
// out.
func checkMiniCache(c Config, l kvcache.Layout, _ codec.Codec) error {
	ups := c.MergedPairs(l.Layers)
	if len(ups) == 0 {
		return fmt.Errorf("policy: minicache has no %s pair to merge from %s %d of %d", layerWord(l), layerWord(l), max(pMergeFrom.Int(c), l.Layers/2), l.Layers)
	}
	for _, u := range ups {
		for _, x := range []int{u - 1, u} {
			if l.Windows != nil && l.Windows[x] > 0 {
				return perr("merge-from", "policy: minicache merges cache layers %d and %d token by token, but cache layer %d is read by sliding-window attention (window %d) and frees the tokens that slide out, which merged tokens cannot; choose %s so that no pair holds a window-bounded layer", u-1, u, x, l.Windows[x], ref("merge-from"))
			}
		}
	}
	return nil
}

// layerWord is what the layers of l are called in errors: cache layers on
// a model whose layers share KV (they are its KV owners), layers otherwise.
func layerWord(l kvcache.Layout) string {
	if sharedLayer(l) >= 0 {
		return "cache layer"
	}
	return "layer"
}

// MergedPairs lists the merged layer pairs as their upper layers, for a
// model of L layers.
func (c Config) MergedPairs(L int) []int {
	from := pMergeFrom.Int(c)
	if from == 0 {
		from = L / 2
	}
	var ups []int
	for u := from + 1; u < L; u += 2 {
		ups = append(ups, u)
	}
	return ups
}

// miniCache is MiniCache's Runner.
type miniCache struct{ st *State }

func (m *miniCache) Begin(int) {}

// Request tracks the new slots' origins; merging needs no attention.
func (m *miniCache) Request(layer, start, n int) *attention.MassRequest {
	m.st.sync(layer, start, n)
	return nil
}

func (m *miniCache) Done(int, *attention.MassRequest, []float32, []int32) {}

// PromptRows: merging scores no attention.
func (m *miniCache) PromptRows(int, int) int { return 0 }

// Compress merges the prompt.
func (m *miniCache) Compress() error { return m.merge(false) }

// merge merges every pair's unmerged tokens: all of them after a prefill,
// whole blocks during decoding; the newest Window tokens stay.
func (m *miniCache) merge(decode bool) error {
	st := m.st
	ups := st.cfg.MergedPairs(st.L)
	if len(ups) == 0 {
		return checkMiniCache(st.cfg, st.cache.Layout(), nil)
	}
	mc, ok := st.cache.(kvcache.Merging)
	if !ok {
		return errors.New("policy: minicache: the sequence's cache cannot store merged layers")
	}
	opt := MergeOptions{T: pInterp.Float(st.cfg), Gamma: pGamma.Float(st.cfg), Recent: st.cfg.Window, Full: decode}
	for _, u := range ups {
		if _, err := MergeLayers(mc, u, opt); err != nil {
			return fmt.Errorf("policy: minicache: %w", err)
		}
	}
	st.Pruned++
	return nil
}

// Before is the decoding schedule: a merge every Every steps.
func (m *miniCache) Before(int) error {
	st := m.st
	if st.cfg.Every <= 0 {
		return nil
	}
	st.steps++
	if st.steps%st.cfg.Every != 0 {
		return nil
	}
	return m.merge(true)
}
