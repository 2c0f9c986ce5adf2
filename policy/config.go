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
	"slices"
	"strings"

	"github.com/kvlm/kvlm/attention"
)

// Positions says how kept tokens are positioned for RoPE.
type Positions int

const (
	// PosDefault is the method's default: re-indexed for streaming,
	// original for every other method. Normalize resolves it.
	PosDefault Positions = iota
	// PosOriginal keeps each token's original position; new tokens
	// continue from the original length.
	PosOriginal
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
	Every     int           // during decoding, prune every N steps (0: the method's default; EveryNever: only after the prompt)
	Positions Positions     // PosDefault (the method's), original or re-indexed
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

// EveryNever as Config.Every: no pruning while decoding, only after the
// prompt (what --kv-every 0 asks for).
const EveryNever = -1

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

// ParsePositions reads "original" or "reindex" ("": the method's default).
func ParsePositions(s string) (Positions, error) {
	switch strings.ToLower(s) {
	case "":
		return PosDefault, nil
	case "original":
		return PosOriginal, nil
	case "reindex":
		return PosReindex, nil
	}
	return 0, fmt.Errorf("policy: unknown positions %q (original, reindex)", s)
}

// ParamError is an error of Normalize caused by one parameter, named as
// in Params (budget, window, every, …), so that a front end can point at
// its own spelling of it. Its text names CLI parameters by their flags
// (--kv-budget).
type ParamError struct {
	Param string
	Msg   string
}

func (e *ParamError) Error() string { return e.Msg }

func perr(param, format string, args ...any) error {
	return &ParamError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// FlagParams are the parameters the CLI and the server take (as --kv-NAME
// and kv.NAME); the others are set through Config only.
var FlagParams = []string{"budget", "ratio", "window", "sinks", "agg", "pool", "kernel", "every", "positions"}

// flag is a parameter as error messages name it: its CLI flag where it
// has one.
func flag(param string) string {
	if slices.Contains(FlagParams, param) {
		return "--kv-" + param
	}
	return param
}

// Params lists the parameters a method uses, by name: budget, ratio,
// window, sinks, agg, pool, kernel, every, positions (the --kv-NAME flags
// and the server's kv.NAME fields), alpha, beta, recent, min-keep, decay,
// gen-decay, t, gamma, merge-from (Config only). A parameter not listed is
// refused by Normalize when set and by NormalizeGiven when given at all.
// Methods without positions keep original positions.
func Params(method string) []string {
	switch method {
	case "window":
		return []string{"budget", "window", "every", "positions"}
	case "streaming", "lminfinite":
		return []string{"budget", "window", "sinks", "every", "positions"}
	case "h2o", "tova":
		return []string{"budget", "ratio", "window", "sinks", "agg", "every", "positions"}
	case "snapkv":
		return []string{"budget", "ratio", "window", "sinks", "agg", "pool", "kernel", "every", "positions"}
	case "adakv":
		return []string{"budget", "ratio", "window", "sinks", "agg", "pool", "kernel", "every", "alpha"}
	case "pyramidkv":
		return []string{"budget", "ratio", "window", "sinks", "agg", "pool", "kernel", "every", "beta"}
	case "knorm":
		return []string{"budget", "ratio", "window", "sinks", "every", "positions"}
	case "pyramidinfer":
		return []string{"sinks", "recent", "min-keep", "decay", "gen-decay"}
	case "minicache":
		return []string{"window", "every", "t", "gamma", "merge-from"}
	}
	return nil
}

// set reports whether a parameter holds something other than "not set".
// Original positions are what every method without the choice does.
func (c Config) set(param string) bool {
	switch param {
	case "budget":
		return c.Budget != 0
	case "ratio":
		return c.Ratio != 0
	case "window":
		return c.Window != 0
	case "sinks":
		return c.Sinks != 0
	case "agg":
		return c.Agg != attention.AggMean
	case "pool":
		return c.Pool != ""
	case "kernel":
		return c.Kernel != 0
	case "every":
		return c.Every != 0
	case "positions":
		return c.Positions == PosReindex
	case "alpha":
		return c.Alpha != 0
	case "beta":
		return c.Beta != 0
	case "recent":
		return c.Recent != 0
	case "min-keep":
		return c.MinKeep != 0
	case "decay":
		return c.Decay != 0
	case "gen-decay":
		return c.GenDecay != 0
	case "t":
		return c.Interp != 0
	case "gamma":
		return c.Gamma != 0
	case "merge-from":
		return c.MergeFrom != 0
	}
	return false
}

var allParams = append(slices.Clone(FlagParams), "alpha", "beta", "recent", "min-keep", "decay", "gen-decay", "t", "gamma", "merge-from")

// unusedErr is the error of a parameter the method does not use.
func unusedErr(method, param string) error {
	uses := Params(method)
	var fl []string
	for _, p := range uses {
		if slices.Contains(FlagParams, p) {
			fl = append(fl, flag(p))
		}
	}
	why := "it has no parameters"
	if len(fl) > 0 {
		why = "it takes " + strings.Join(fl, ", ")
	}
	if param == "positions" {
		why = "it keeps original positions"
	}
	return perr(param, "policy: %s takes no %s (%s)", method, flag(param), why)
}

// Normalize fills in the method's defaults and rejects, with a one-line
// error, every configuration the method cannot run: a parameter it does
// not use (Params), a value out of range, a budget too small for its sinks
// and window after the prompt or, when it prunes while decoding, for the
// token being decoded. Normalizing a normalized configuration returns it
// unchanged. What depends on the sequence is left to New: re-indexing or
// lminfinite with keys sealed in groups (KIVI), minicache on a model with
// no layer pair to merge.
func (c Config) Normalize() (Config, error) {
	raw := c
	c.Method = strings.ToLower(strings.TrimSpace(c.Method))
	if c.Method == "" {
		c.Method = "full"
	}
	k, ok := methodKind(c.Method)
	if !ok {
		return c, fmt.Errorf("policy: unknown method %q (known: %s)", c.Method, strings.Join(Methods, ", "))
	}
	out, err := c.normalize(k)
	if err != nil {
		return c, err
	}
	uses := Params(c.Method)
	for _, p := range allParams {
		if raw.set(p) && !slices.Contains(uses, p) {
			return c, unusedErr(c.Method, p)
		}
	}
	return out, nil
}

// NormalizeGiven is Normalize for a front end that knows which parameters
// the user gave (names as in Params: budget, ratio, window, sinks, agg,
// pool, kernel, every, positions), so that nothing given is silently
// dropped: a given parameter the method does not use is refused even at
// its zero value; every given as 0 means EveryNever (prune after the
// prompt only); a budget, ratio or kernel given as 0 is refused, and so is
// a window or sinks of 0 that the method would replace by its default
// (snapkv's window, streaming's sinks).
func (c Config) NormalizeGiven(given ...string) (Config, error) {
	method := strings.ToLower(strings.TrimSpace(c.Method))
	if method == "" {
		method = "full"
	}
	if _, ok := methodKind(method); !ok {
		return c.Normalize()
	}
	uses := Params(method)
	for _, g := range given {
		if !slices.Contains(uses, g) {
			return c, unusedErr(method, g)
		}
	}
	if slices.Contains(given, "every") && c.Every == 0 {
		c.Every = EveryNever
	}
	n, err := c.Normalize()
	if err != nil {
		return n, err
	}
	for _, g := range given {
		switch g {
		case "budget", "ratio", "kernel":
			if !c.set(g) {
				return n, perr(g, "policy: %s must be positive, got 0 (omit it for the default)", flag(g))
			}
		case "window", "sinks":
			if !c.set(g) && n.set(g) {
				return n, perr(g, "policy: %s 0 is not a %s setting (its default is %d: omit %s for it, or give a positive value)",
					flag(g), method, map[string]int{"window": n.Window, "sinks": n.Sinks}[g], flag(g))
			}
		}
	}
	return n, nil
}

// normalize is Normalize past the method's name.
func (c Config) normalize(k kind) (Config, error) {
	if c.Budget < 0 {
		return c, perr("budget", "policy: --kv-budget must be positive, got %d", c.Budget)
	}
	if c.Ratio < 0 || c.Ratio > 1 || math.IsNaN(c.Ratio) {
		return c, perr("ratio", "policy: --kv-ratio must be in (0, 1], got %g", c.Ratio)
	}
	if c.Budget > 0 && c.Ratio > 0 {
		return c, perr("ratio", "policy: give a budget or a ratio, not both")
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"window", c.Window}, {"sinks", c.Sinks}, {"kernel", c.Kernel}} {
		if f.v < 0 {
			return c, perr(f.name, "policy: %s must not be negative, got %d", flag(f.name), f.v)
		}
	}
	if c.Every < EveryNever {
		return c, perr("every", "policy: --kv-every must not be negative, got %d (0: only after the prompt)", c.Every)
	}
	if c.Positions < PosDefault || c.Positions > PosReindex {
		return c, perr("positions", "policy: unknown positions %d", c.Positions)
	}
	switch k {
	case kindNone:
		if c.Budget > 0 || c.Ratio > 0 {
			return c, perr("budget", "policy: method full keeps every token; it takes no budget")
		}
		c.Positions = PosOriginal
		return c, nil
	case kindPyramid:
		return c.normalizePyramid()
	case kindMerge:
		return c.normalizeMiniCache()
	case kindWindow:
		return c.normalizeWindow()
	}
	if c.Budget == 0 && c.Ratio == 0 {
		return c, perr("budget", "policy: %s needs a budget (--kv-budget N) or a ratio (--kv-ratio R)", c.Method)
	}
	switch c.Method {
	case "adakv":
		if c.Alpha == 0 {
			c.Alpha = 0.2
		}
		if !(c.Alpha >= 0 && c.Alpha <= 1) {
			return c, perr("alpha", "policy: alpha must be in [0,1], got %g", c.Alpha)
		}
	case "pyramidkv":
		if c.Beta == 0 {
			c.Beta = 20
		}
		if !(c.Beta >= 1) || math.IsInf(c.Beta, 0) {
			return c, perr("beta", "policy: beta must be ≥ 1, got %g", c.Beta)
		}
	}
	switch c.Positions {
	case PosDefault:
		c.Positions = PosOriginal
	case PosReindex:
		if c.Method == "adakv" || c.Method == "pyramidkv" {
			return c, perr("positions", "policy: %s keeps different numbers of tokens per head or layer, so its positions cannot be re-indexed", c.Method)
		}
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
			return c, perr("kernel", "policy: pooling kernel (--kv-kernel) must be odd, got %d", c.Kernel)
		}
		switch c.Pool {
		case "":
			c.Pool = "avg"
		case "avg", "max":
		default:
			return c, perr("pool", "policy: unknown pooling %q (avg, max)", c.Pool)
		}
	case kindAccum, kindLast:
		if c.Every == 0 {
			c.Every = 1 // H2O and TOVA evict greedily at every step
		}
	}
	return c, c.checkShape(k)
}

// normalizeWindow fills in a window method's defaults: its budget is its
// sinks plus its window.
func (c Config) normalizeWindow() (Config, error) {
	switch {
	case c.Window == 0 && c.Budget == 0:
		return c, perr("window", "policy: %s needs --kv-window (or --kv-budget)", c.Method)
	case c.Ratio > 0:
		return c, perr("ratio", "policy: %s takes a window, not a ratio", c.Method)
	}
	if c.Method == "window" && c.Sinks > 0 {
		return c, perr("sinks", "policy: window keeps no sinks; use streaming")
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
		return c, perr("budget", "policy: %s budget %d must equal sinks %d + window %d", c.Method, c.Budget, c.Sinks, c.Window)
	}
	if c.Positions == PosDefault {
		c.Positions = PosOriginal
		if c.Method == "streaming" {
			// StreamingLLM counts positions inside the cache.
			c.Positions = PosReindex
		}
	}
	if c.Every == 0 {
		c.Every = 1
	}
	return c, c.checkShape(kindWindow)
}

// checkShape refuses a token budget that a prune after the prompt, or one
// while decoding (with the token being decoded on its way), could not
// apply. Ratio budgets always can (pruneShape).
func (c Config) checkShape(k kind) error {
	if c.Budget == 0 {
		return nil
	}
	if _, _, _, err := c.pruneShape(k, c.Budget, 0); err != nil {
		return err
	}
	if c.Every > 0 {
		if _, _, _, err := c.pruneShape(k, c.Budget, 1); err != nil {
			return err
		}
	}
	return nil
}

// pruneShape is the arithmetic of one prune of tables to total tokens
// with incoming tokens on their way: b tokens stay stored, of which the
// first sinks and the last window are kept whatever their score. A ratio
// budget keeps at least one stored token; a token budget too small for
// its sinks, window and the incoming tokens is an error.
func (c Config) pruneShape(k kind, total, incoming int) (b, sinks, window int, err error) {
	b = total - incoming
	if c.Budget == 0 {
		b = max(b, 1)
	}
	if b <= 0 {
		param := "budget"
		if k == kindWindow {
			param = "window"
		}
		return 0, 0, 0, perr(param, "policy: %s budget %d leaves no room for the token being decoded (it needs at least %d, or --kv-every 0)", c.Method, total, incoming+1)
	}
	sinks, window = c.Sinks, c.Window
	if k == kindAccum && window == 0 {
		window = total / 2 // H2O: half the budget for recent tokens
	}
	// The incoming tokens are the newest of the window.
	window = max(0, window-incoming)
	if c.Budget == 0 {
		// Ratio budgets: the window never exceeds the budget.
		sinks = min(sinks, b)
		window = min(window, b-sinks)
	} else if b < sinks+window {
		if incoming > 0 {
			return 0, 0, 0, perr("budget", "policy: %s budget %d leaves no room for the token being decoded besides sinks %d + window %d (or use --kv-every 0)", c.Method, total, sinks, window)
		}
		return 0, 0, 0, perr("budget", "policy: %s budget %d is smaller than sinks %d + window %d", c.Method, total, sinks, window)
	}
	return b, sinks, window, nil
}

// defaultEvery is a method's decoding schedule when none is given: every
// step for window methods, h2o and tova, none (0) for the others.
func defaultEvery(k kind) int {
	switch k {
	case kindWindow, kindAccum, kindLast:
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
	if c.Method == "streaming" && c.Positions == PosOriginal {
		s += " positions=original" // not streaming's default
	}
	if c.Method == "minicache" {
		s += fmt.Sprintf(" t=%g gamma=%g from=%d", c.Interp, c.Gamma, c.MergeFrom)
	}
	k, _ := methodKind(c.Method)
	switch def := defaultEvery(k); {
	case c.Every < 0 && def != 0:
		s += " every=never"
	case c.Every > 0 && c.Every != def:
		s += fmt.Sprintf(" every=%d", c.Every)
	}
	if c.Method == "pyramidinfer" {
		s += fmt.Sprintf(" recent=%g decay=%g gen-decay=%g min-keep=%d", c.Recent, c.Decay, c.GenDecay, c.MinKeep)
	}
	return s
}
