package model

// The KV source map: which layer's keys and values each layer attends, and
// each layer's attention window. One mechanism covers the architectures that
// share KV across layers (docs/ARCHITECTURES.md):
//
//   - src[i] == i: ordinary attention over layer i's own KV;
//   - src[i] < i: layer i reads an earlier layer's KV, the current token's
//     entry included (CLA2/CLA3, YOCO's cross-decoder);
//   - src[i] > i: layer i reads a later layer's KV with the diagonal masked
//     (Layer-Condensed KV): token t sees the source's entries of tokens < t
//     only, plus one dummy key and value of zeros.
//
// A layer owns KV when some layer reads it; an owner reads its own KV
// (src[o] == o). Only owners have attn_k/attn_v weights and only owners get
// a layer in the cache: cache layer c is the c-th owner in layer order.

import "fmt"

// GGUF metadata keys of the map, under the architecture's namespace
// ({arch}.<key>). A file without them is an ordinary model.
const (
	// KeyKVSource is an int32 array [layers]: src[i].
	KeyKVSource = "attention.kv_source"
	// KeyLayerWindow is a uint32 array [layers]: win[i] (0: full causal
	// attention). Without it every layer has attention.sliding_window.
	KeyLayerWindow = "attention.layer_window"
)

// Source is the layer whose KV layer i attends.
func (c Config) Source(i int) int {
	if c.KVSource == nil {
		return i
	}
	return c.KVSource[i]
}

// Window is layer i's attention window (0: full causal attention): the
// query at position p sees keys at positions p−W+1 … p.
func (c Config) Window(i int) int {
	if c.LayerWindows == nil {
		return c.SlidingWindow
	}
	return c.LayerWindows[i]
}

// Owns reports whether layer i owns KV (some layer reads it).
func (c Config) Owns(i int) bool {
	if c.KVSource == nil {
		return true
	}
	for _, s := range c.KVSource {
		if s == i {
			return true
		}
	}
	return false
}

// Owners are the layers that own KV, ascending: cache layer c holds the KV
// of layer Owners()[c].
func (c Config) Owners() []int {
	var o []int
	for i := 0; i < c.Layers; i++ {
		if c.Owns(i) {
			o = append(o, i)
		}
	}
	return o
}

// CacheLayer is the cache layer layer i attends: the index of Source(i)
// among the owners.
func (c Config) CacheLayer(i int) int {
	if c.KVSource == nil {
		return i
	}
	src, n := c.KVSource[i], 0
	for j := 0; j < src; j++ {
		if c.Owns(j) {
			n++
		}
	}
	return n
}

// Readers is, per cache layer, the layers that attend it, ascending.
func (c Config) Readers() [][]int {
	r := make([][]int, len(c.Owners()))
	for i := 0; i < c.Layers; i++ {
		cl := c.CacheLayer(i)
		r[cl] = append(r[cl], i)
	}
	return r
}

// Shared reports whether the map is anything but every layer reading its
// own KV.
func (c Config) Shared() bool {
	for i := 0; i < c.Layers; i++ {
		if c.Source(i) != i {
			return true
		}
	}
	return false
}

// CacheWindows is, per cache layer, how many of the latest positions its
// readers can see (0: all): the largest window of its readers, 0 if any
// reads it in full. A cache layer with a bound keeps only that many tokens;
// nil when no cache layer is bounded.
func (c Config) CacheWindows() []int {
	var out []int
	for cl, readers := range c.Readers() {
		w := 0
		for _, i := range readers {
			wi := c.Window(i)
			if wi == 0 {
				w = 0
				break
			}
			w = max(w, wi)
		}
		if w > 0 && out == nil {
			out = make([]int, len(c.Owners()))
		}
		if out != nil {
			out[cl] = w
		}
	}
	return out
}

// validateKVMap rejects maps the forward pass cannot run.
func (c Config) validateKVMap() error {
	if c.KVSource != nil {
		if len(c.KVSource) != c.Layers {
			return fmt.Errorf("model: %s has %d entries for %d layers", KeyKVSource, len(c.KVSource), c.Layers)
		}
		for i, s := range c.KVSource {
			if s < 0 || s >= c.Layers {
				return fmt.Errorf("model: %s[%d] = %d is not a layer (0…%d)", KeyKVSource, i, s, c.Layers-1)
			}
			if c.KVSource[s] != s {
				return fmt.Errorf("model: %s[%d] = %d, but layer %d reads layer %d's KV: a layer that others read must read its own", KeyKVSource, i, s, s, c.KVSource[s])
			}
		}
	}
	if c.LayerWindows != nil {
		if len(c.LayerWindows) != c.Layers {
			return fmt.Errorf("model: %s has %d entries for %d layers", KeyLayerWindow, len(c.LayerWindows), c.Layers)
		}
		for i, w := range c.LayerWindows {
			if w < 0 || w > 1<<30 {
				return fmt.Errorf("model: %s[%d] = %d is out of range [0, 2^30]", KeyLayerWindow, i, w)
			}
		}
	}
	return nil
}

// ReadsLater reports whether layer i reads a later layer's KV (src[i] > i,
// Layer-Condensed KV): its attention masks the diagonal and adds a zero
// dummy key and value.
func (c Config) ReadsLater(i int) bool { return c.Source(i) > i }

// Condensed reports whether some layer reads a later layer's KV: a prompt
// chunk then cannot run as one matrix in one pass (Sequence.LCKVPasses).
func (c Config) Condensed() bool {
	for i := 0; i < c.Layers; i++ {
		if c.ReadsLater(i) {
			return true
		}
	}
	return false
}

// LastOwner is the highest layer that owns KV. The layers above it write
// nothing any token reads: a prompt token runs them only when its logits
// are wanted (prefill early exit).
func (c Config) LastOwner() int {
	o := c.Owners()
	return o[len(o)-1]
}
