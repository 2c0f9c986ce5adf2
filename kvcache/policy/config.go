// Package policy compresses a sequence's KV cache: a method is a small
// scorer (what each stored token is worth) plus a budget (how many tokens
// each (layer, KV head) keeps), and one prune applies any of them: keep the
// sinks and the recent window, keep the top-scored rest in original order
// (ties at the boundary go to the earlier position), compact the survivors
// into fresh blocks and free the old ones.
//
// Methods: full, window (sliding window), streaming (StreamingLLM: sinks +
// window), lminfinite (Λ-shaped window with the distance cap), h2o
// (accumulated attention: heavy hitters + recent), tova (the last query's
// attention, one token set per layer), snapkv (an observation window's
// pooled attention), adakv (head-adaptive budgets around snapkv),
// pyramidkv (snapkv with budgets shrinking with depth), knorm (keys of
// small norm), pyramidinfer (tokens pruned between layers during the
// prefill, so deeper layers compute and store fewer; see pyramidinfer.go)
// and minicache (adjacent layers' KV merged into shared directions, no
// token dropped; see minicache.go).
package policy

import (
	"fmt"
	"math"
	"strings"

	"github.com/kvlm/kvlm/attention"
)

// Positions says how kept tokens are positioned for RoPE.
type Positions int

const (
	// PosOriginal keeps each token's original position; new tokens
	// continue from the original length.
	PosOriginal Positions = iota
	// PosReindex renumbers the kept tokens 0..n-1 inside the cache (keys
	// re-rotated), new tokens continue at the cache length: StreamingLLM's
	// way of streaming past the trained context.
	PosReindex
)

// Config is one policy's parameters. The zero value of a field means the
// method's default.
type Config struct {
	Method    string        // full window streaming lminfinite h2o tova snapkv adakv pyramidkv knorm pyramidinfer minicache
	Budget    int           // tokens kept per (layer, KV head); or
	Ratio     float64       // the fraction of tokens kept (kvpress's compression_ratio is 1 − Ratio)
	Window    int           // recent tokens always kept (snapkv: the observation window)
	Sinks     int           // first tokens always kept
	Agg       attention.Agg // how the query heads of a KV head combine their scores
	Pool      string        // snapkv family: "avg" or "max" pooling of scores
	Kernel    int           // snapkv family: pooling kernel (odd)
	Every     int           // during decoding, prune every N steps (0: the method's default)
	Positions Positions     // original (default) or re-indexed
	Alpha     float64       // adakv: share of the budget spread evenly (0.2)
	Beta      float64       // pyramidkv: ratio of the largest to the smallest layer budget (20)

	// PyramidInfer (the authors' released defaults in brackets).
	Recent   float64 // share of the prompt whose queries score the rest (0.2)
	MinKeep  int     // context never pruned below this many tokens (64)
	Decay    float64 // prefill: last-layer retention of the cosine schedule (0.9)
	GenDecay float64 // decoding: last-layer retention of a compressed chunk's schedule (0.1)

	// MiniCache (minicache.go).
	Interp    float64 // SLERP weight of the upper layer of a merged pair (0.6)
	Gamma     float64 // share of tokens retained unmerged in both layers (0.05)
	MergeFrom int     // lower layer of the first merged pair (0: Layers/2)
}

// Methods lists the method names.
var Methods = []string{"full", "window", "streaming", "lminfinite", "h2o", "tova", "snapkv", "adakv", "pyramidkv", "knorm", "pyramidinfer", "minicache"}

// kind groups methods by how they score.
type kind int

const (
	kindNone    kind = iota // full
	kindWindow              // window, streaming, lminfinite: no scores
	kindAccum               // h2o: accumulated attention of every query
	kindLast                // tova: the last query's attention
	kindSnap                // snapkv, adakv, pyramidkv: an observation window's attention
	kindNorm                // knorm: key norms
	kindPyramid             // pyramidinfer: recent queries' attention, tokens pruned between layers
	kindMerge               // minicache: adjacent layers merged, no token dropped
)

func methodKind(m string) (kind, bool) {
	switch m {
	case "full":
		return kindNone, true
	case "window", "streaming", "lminfinite":
		return kindWindow, true
	case "h2o":
		return kindAccum, true
	case "tova":
		return kindLast, true
	case "snapkv", "adakv", "pyramidkv":
		return kindSnap, true
	case "knorm":
		return kindNorm, true
	case "pyramidinfer":
		return kindPyramid, true
	case "minicache":
		return kindMerge, true
	}
	return 0, false
}

// ParseAgg reads an aggregation name.
func ParseAgg(s string) (attention.Agg, error) {
	switch strings.ToLower(s) {
	case "", "mean":
		return attention.AggMean, nil
	case "max":
		return attention.AggMax, nil
	case "sum":
		return attention.AggSum, nil
	}
	return 0, fmt.Errorf("policy: unknown aggregation %q (mean, max, sum)", s)
}

// ParsePositions reads "original" or "reindex".
func ParsePositions(s string) (Positions, error) {
	switch strings.ToLower(s) {
	case "", "original":
		return PosOriginal, nil
	case "reindex":
		return PosReindex, nil
	}
	return 0, fmt.Errorf("policy: unknown positions %q (original, reindex)", s)
}

// Normalize fills in the method's defaults and rejects impossible
// settings with a clear error.
func (c Config) Normalize() (Config, error) {
	c.Method = strings.ToLower(strings.TrimSpace(c.Method))
	if c.Method == "" {
		c.Method = "full"
	}
	k, ok := methodKind(c.Method)
	if !ok {
		return c, fmt.Errorf("policy: unknown method %q (known: %s)", c.Method, strings.Join(Methods, ", "))
	}
	if c.Budget < 0 {
		return c, fmt.Errorf("policy: budget must be positive, got %d", c.Budget)
	}
	if c.Ratio < 0 || c.Ratio > 1 || math.IsNaN(c.Ratio) {
		return c, fmt.Errorf("policy: ratio must be in (0, 1], got %g", c.Ratio)
	}
	if c.Budget > 0 && c.Ratio > 0 {
		return c, fmt.Errorf("policy: give a budget or a ratio, not both")
	}
	if c.Window < 0 || c.Sinks < 0 || c.Every < 0 || c.Kernel < 0 {
		return c, fmt.Errorf("policy: window, sinks, every and kernel must not be negative")
	}
	if k == kindNone {
		if c.Budget > 0 || c.Ratio > 0 {
			return c, fmt.Errorf("policy: method full keeps every token; it takes no budget")
		}
		return c, nil
	}
	if k == kindPyramid {
		return c.normalizePyramid()
	}
	if k == kindMerge {
		return c.normalizeMiniCache()
	}
	if k == kindWindow {
		// A window policy's budget is its sinks plus its window.
		switch {
		case c.Window == 0 && c.Budget == 0:
			return c, fmt.Errorf("policy: %s needs --kv-window (or --kv-budget)", c.Method)
		case c.Ratio > 0:
			return c, fmt.Errorf("policy: %s takes a window, not a ratio", c.Method)
		}
		if c.Method == "window" && c.Sinks > 0 {
			return c, fmt.Errorf("policy: window keeps no sinks; use streaming")
		}
		if c.Method != "window" && c.Sinks == 0 {
			c.Sinks = 4
		}
		if c.Window == 0 {
			c.Window = c.Budget - c.Sinks
		}
		if c.Budget == 0 {
			c.Budget = c.Sinks + c.Window
		}
		if c.Budget != c.Sinks+c.Window || c.Window <= 0 {
			return c, fmt.Errorf("policy: %s budget %d must equal sinks %d + window %d", c.Method, c.Budget, c.Sinks, c.Window)
		}
		if c.Method == "streaming" && c.Positions == PosOriginal && c.Every == 0 {
			// StreamingLLM counts positions inside the cache.
			c.Positions = PosReindex
		}
		if c.Every == 0 {
			c.Every = 1
		}
		return c, nil
	}
	if c.Budget == 0 && c.Ratio == 0 {
		return c, fmt.Errorf("policy: %s needs a budget (--kv-budget N) or a ratio (--kv-ratio R)", c.Method)
	}
	if c.Alpha == 0 {
		c.Alpha = 0.2
	}
	if c.Beta == 0 {
		c.Beta = 20
	}
	if c.Alpha < 0 || c.Alpha > 1 || c.Beta < 1 {
		return c, fmt.Errorf("policy: alpha must be in [0,1] and beta ≥ 1")
	}
	switch k {
	case kindSnap:
		if c.Window == 0 {
			c.Window = 32
		}
		if c.Kernel == 0 {
			c.Kernel = 5
		}
		if c.Kernel%2 == 0 {
			return c, fmt.Errorf("policy: pooling kernel must be odd, got %d", c.Kernel)
		}
		switch c.Pool {
		case "":
			c.Pool = "avg"
		case "avg", "max":
		default:
			return c, fmt.Errorf("policy: unknown pooling %q (avg, max)", c.Pool)
		}
	case kindAccum, kindLast:
		if c.Every == 0 {
			c.Every = 1 // H2O and TOVA evict greedily at every step
		}
	}
	if c.Budget > 0 && c.Budget < c.Sinks+c.Window+boolInt(k == kindAccum && c.Window == 0) {
		return c, fmt.Errorf("policy: budget %d is smaller than sinks %d + window %d", c.Budget, c.Sinks, c.Window)
	}
	return c, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// String is the configuration in flag form, for reports and cache keys.
func (c Config) String() string {
	s := c.Method
	if c.Budget > 0 {
		s += fmt.Sprintf(" budget=%d", c.Budget)
	}
	if c.Ratio > 0 {
		s += fmt.Sprintf(" ratio=%g", c.Ratio)
	}
	if c.Sinks > 0 {
		s += fmt.Sprintf(" sinks=%d", c.Sinks)
	}
	if c.Window > 0 {
		s += fmt.Sprintf(" window=%d", c.Window)
	}
	if c.Positions == PosReindex {
		s += " positions=reindex"
	}
	if c.Method == "minicache" {
		s += fmt.Sprintf(" t=%g gamma=%g from=%d", c.Interp, c.Gamma, c.MergeFrom)
		if c.Every > 0 {
			s += fmt.Sprintf(" every=%d", c.Every)
		}
	}
	if c.Method == "pyramidinfer" {
		s += fmt.Sprintf(" recent=%g decay=%g gen-decay=%g min-keep=%d", c.Recent, c.Decay, c.GenDecay, c.MinKeep)
	}
	return s
}
