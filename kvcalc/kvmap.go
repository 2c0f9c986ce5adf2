package kvcalc

import (
	"fmt"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
)

// The KV source map (model/kvmap.go, docs/ARCHITECTURES.md): layer i
// attends the KV of layer src[i] with window win[i] (0: full attention).
// Only layers that some layer reads (owners) are cached, and a cache layer
// read only by sliding windows keeps only what they see
// (kvcache.Layout.Windows). A Model carries the map as a GGUF does
// (KVSource, LayerWindows, SlidingWindow); the cache shape comes from
// model.Config's own Owners and CacheWindows, for a file and a preset
// alike.

// Map is a KV source map over a model's layers.
type Map struct {
	Source  []int // src[i] ([layers]); nil: every layer its own
	Windows []int // win[i] ([layers]); nil: no layer windowed
}

// CLA is Cross-Layer Attention with groups of n consecutive layers
// (arXiv 2405.12981): the first layer of each group owns KV, the others
// read it.
func CLA(layers, n int) (Map, error) {
	if n < 1 || n > layers {
		return Map{}, fmt.Errorf("CLA groups of %d layers: must be between 1 and the %d layers", n, layers)
	}
	src := make([]int, layers)
	for i := range src {
		src[i] = i - i%n
	}
	return Map{Source: src}, nil
}

// YOCO is You Only Cache Once (arXiv 2405.05254): the first half of the
// layers is a self-decoder of sliding-window attention (window w, each
// layer its own KV); the first cross-decoder layer owns one global KV that
// it and every later layer read in full.
func YOCO(layers, w int) (Map, error) {
	if layers < 2 {
		return Map{}, fmt.Errorf("YOCO needs at least 2 layers, the model has %d", layers)
	}
	if w < 1 {
		return Map{}, fmt.Errorf("YOCO's self-decoder window %d must be positive", w)
	}
	half := layers / 2
	m := Map{Source: make([]int, layers), Windows: make([]int, layers)}
	for i := range layers {
		if i < half {
			m.Source[i], m.Windows[i] = i, w
		} else {
			m.Source[i] = half
		}
	}
	return m, nil
}

// LCKV is Layer-Condensed KV (arXiv 2405.10637) with warmup standard
// layers at the bottom: every other layer reads the top layer's KV (the
// diagonal masked).
func LCKV(layers, warmup int) (Map, error) {
	if warmup < 0 || warmup > layers-1 {
		return Map{}, fmt.Errorf("LCKV warmup of %d layers: must be between 0 and %d (the top layer is the shared one)", warmup, layers-1)
	}
	src := make([]int, layers)
	for i := range src {
		src[i] = layers - 1
		if i < warmup {
			src[i] = i
		}
	}
	return Map{Source: src}, nil
}

// LocalGlobal interleaves local and global layers (Gemma-style): in each
// run of local+1 layers the first local ones attend a sliding window of w
// and the last one in full; every layer owns its KV.
func LocalGlobal(layers, local, w int) (Map, error) {
	if local < 1 || w < 1 {
		return Map{}, fmt.Errorf("local-global: %d local layers per global one of window %d: both must be positive", local, w)
	}
	win := make([]int, layers)
	for i := range win {
		if (i+1)%(local+1) != 0 {
			win[i] = w
		}
	}
	return Map{Windows: win}, nil
}

// WithMap returns m with the map applied (its KVSource and LayerWindows;
// a layer window list given over a map without windows, as for CLA with
// --layer-window, is merged by the caller). The parameters lose the K and V
// projections of the layers that no longer own KV.
func WithMap(m Model, mp Map) (Model, error) {
	if m.KVSource != nil || m.LayerWindows != nil || m.SlidingWindow != 0 {
		return Model{}, fmt.Errorf("kvcalc: model %s already has a KV map", m.Name)
	}
	m.KVSource, m.LayerWindows = mp.Source, mp.Windows
	if err := m.validateMap(); err != nil {
		return Model{}, err
	}
	if m.Dim > 0 {
		per := int64(2) * int64(m.Dim) * int64(m.KVHeads) * int64(m.HeadDim)
		if m.QKVBias {
			per += 2 * int64(m.KVHeads) * int64(m.HeadDim)
		}
		m.Params -= int64(m.Layers-len(m.config().Owners())) * per
	}
	return m, nil
}

// config is the part of model.Config the map needs.
func (m Model) config() model.Config {
	return model.Config{Layers: m.Layers, KVSource: m.KVSource, LayerWindows: m.LayerWindows, SlidingWindow: m.SlidingWindow}
}

// validateMap rejects a map the forward pass could not run (model's rules).
func (m Model) validateMap() error {
	if m.KVSource != nil {
		if len(m.KVSource) != m.Layers {
			return fmt.Errorf("kvcalc: model %s: KV source map has %d entries for %d layers", m.Name, len(m.KVSource), m.Layers)
		}
		for i, s := range m.KVSource {
			if s < 0 || s >= m.Layers {
				return fmt.Errorf("kvcalc: model %s: layer %d reads layer %d, not a layer (0…%d)", m.Name, i, s, m.Layers-1)
			}
			if m.KVSource[s] != s {
				return fmt.Errorf("kvcalc: model %s: layer %d reads layer %d, which reads layer %d: a layer that others read must read its own", m.Name, i, s, m.KVSource[s])
			}
		}
	}
	if m.LayerWindows != nil && len(m.LayerWindows) != m.Layers {
		return fmt.Errorf("kvcalc: model %s: %d layer windows for %d layers", m.Name, len(m.LayerWindows), m.Layers)
	}
	for i, w := range m.LayerWindows {
		if w < 0 || w > 1<<30 {
			return fmt.Errorf("kvcalc: model %s: layer %d's window %d is out of range [0, 2^30]", m.Name, i, w)
		}
	}
	if m.SlidingWindow < 0 || m.SlidingWindow > 1<<30 {
		return fmt.Errorf("kvcalc: model %s: sliding window %d is out of range [0, 2^30]", m.Name, m.SlidingWindow)
	}
	return nil
}

// Layout is the cache a kvlm pool keeps for the model: one layer per KV
// owner, window-bounded ones with their bound (what model.Model.KVLayout
// returns for the same map).
func (m Model) Layout() kvcache.Layout {
	c := m.config()
	return kvcache.Layout{Layers: len(c.Owners()), KVHeads: m.KVHeads, HeadDim: m.HeadDim, Windows: c.CacheWindows()}
}

// Shared reports whether the model has a map other than every layer
// reading its own KV in full.
func (m Model) Shared() bool {
	return m.config().Shared() || m.Layout().Windowed()
}
