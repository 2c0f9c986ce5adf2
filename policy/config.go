// Package policy compresses a sequence's KV cache. A method is a plug-in:
// one file registers it (Register) with its parameters (Param: name,
// bounds, default, doc, from which the CLI's flags, the server's kv
// object, the help and the errors are derived) and either a Scorer (what
// each stored token is worth, how many tokens each (layer, KV head)
// keeps) or a Runner of its own schedule. One prune applies every scorer:
// keep the sinks and the recent window, keep the top-scored rest in
// original order (ties at the boundary go to the earlier position),
// compact the survivors into fresh blocks and free the old ones.
//
// The methods (see Methods and docs/KVCACHE.md): full, window,
// streaming, lminfinite, h2o, tova, snapkv, adakv, pyramidkv, knorm,
// pyramidinfer (tokens pruned between layers during the prefill, so deeper
// layers compute and store fewer), minicache (adjacent layers' KV merged
// into shared directions, no token dropped), keydiff (the most distinctive
// keys) and expected (the attention future queries are expected to give).
package policy

import (
	"fmt"
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

// Config is one policy's parameters: the method and the values of its
// parameters (Param). The zero value of a field means the method's
// default. The parameters several methods share have a field; a method's
// own parameters (adakv's alpha, pyramidkv's beta, pyramidinfer's recent,
// decay, gen-decay and min-keep, minicache's t, gamma and merge-from,
// expected's n-future) are declared in its file and stored in Opts.
type Config struct {
	Method    string        // a Methods name
	Budget    int           // tokens kept per (layer, KV head); or
	Ratio     float64       // the fraction of tokens kept (kvpress's compression_ratio is 1 − Ratio)
	Window    int           // recent tokens always kept (snapkv: the observation window)
	Sinks     int           // first tokens always kept
	Agg       attention.Agg // how the query heads of a KV head combine their scores
	Pool      string        // snapkv family (snapkv, adakv, pyramidkv): "avg" or "max" pooling of scores
	Kernel    int           // snapkv family: pooling kernel (odd)
	Every     int           // during decoding, prune every N steps (0: the method's default; EveryNever: only after the prompt)
	Positions Positions     // PosDefault (the method's), original or re-indexed

	// Opts holds the methods' own parameters, by name (Param.Float,
	// Param.Int read them).
	Opts Opts
}

// EveryNever as Config.Every: no pruning while decoding, only after the
// prompt (what --kv-every 0 asks for).
const EveryNever = -1

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

// method resolves c's method name ("" is full).
func (c Config) method() (string, *Method, error) {
	name := strings.ToLower(strings.TrimSpace(c.Method))
	if name == "" {
		name = "full"
	}
	m, ok := registry[name]
	if !ok {
		return name, nil, fmt.Errorf("policy: unknown method %q (known: %s)", name, strings.Join(Methods, ", "))
	}
	return name, m, nil
}

// Normalize fills in the method's defaults and rejects, with a one-line
// error, every configuration the method cannot run: a parameter it does
// not use (Params), a value out of its bounds, a budget too small for its
// sinks and window after the prompt or, when it prunes while decoding, for
// the token being decoded. Normalizing a normalized configuration returns
// it unchanged. What depends on the model is left to Validate and New:
// re-indexing or lminfinite with keys sealed in groups (KIVI), minicache
// on a model with no layer pair to merge.
func (c Config) Normalize() (Config, error) {
	name, m, err := c.method()
	if err != nil {
		return c, err
	}
	c.Method = name
	for _, p := range allParams {
		if params[p].IsSet(c) && !slices.Contains(m.Params, p) {
			return c, unusedErr(name, p)
		}
	}
	for _, p := range m.Params {
		if err := params[p].check(c); err != nil {
			return c, err
		}
	}
	if c.Budget > 0 && c.Ratio > 0 {
		return c, perr("ratio", "policy: give a budget or a ratio, not both")
	}
	if c.Positions < PosDefault || c.Positions > PosReindex {
		return c, perr("positions", "policy: unknown positions %d", c.Positions)
	}
	if m.prunes() && !m.WindowBudget && c.Budget == 0 && c.Ratio == 0 {
		return c, perr("budget", "policy: %s needs a budget (%s N) or a ratio (%s R)", name, ref("budget"), ref("ratio"))
	}
	for _, p := range m.Own {
		p.fill(&c)
	}
	if m.Normalize != nil {
		if c, err = m.Normalize(c); err != nil {
			return c, err
		}
	}
	if c.Positions == PosDefault {
		c.Positions = PosOriginal
		if m.Reindex {
			c.Positions = PosReindex
		}
	}
	if c.Every == 0 {
		c.Every = m.DefaultEvery
	}
	if m.prunes() {
		return c, c.checkShape(m)
	}
	return c, nil
}

// NormalizeGiven is Normalize for a front end that knows which parameters
// the user gave (names as in Params), so that nothing given is silently
// dropped: a given parameter the method does not use is refused even at
// its zero value; every given as 0 means EveryNever (prune after the
// prompt only); a budget, ratio or kernel given as 0 is refused, and so is
// a window or sinks of 0 that the method would replace by its default
// (snapkv's window, streaming's sinks), or any other parameter given as 0
// that the method fills in.
func (c Config) NormalizeGiven(given ...string) (Config, error) {
	method, m, err := c.method()
	if err != nil {
		return c.Normalize()
	}
	for _, g := range given {
		if !slices.Contains(m.Params, g) {
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
		p := params[g]
		switch {
		case g == "budget" || g == "ratio" || g == "kernel":
			if !p.IsSet(c) {
				return n, perr(g, "policy: %s must be positive, got 0 (omit it for the default)", ref(g))
			}
		case g == "window" || g == "sinks":
			if !p.IsSet(c) && p.IsSet(n) {
				return n, perr(g, "policy: %s 0 is not a %s setting (its default is %v: omit %s for it, or give a positive value)",
					ref(g), method, p.Value(n), ref(g))
			}
		case p.Kind != ChoiceParam && g != "every":
			if !p.IsSet(c) && p.IsSet(n) {
				return n, perr(g, "policy: %s 0 is not a %s setting (its default is %v: omit %s for it)", ref(g), method, p.Value(n), ref(g))
			}
		}
	}
	return n, nil
}

// checkShape refuses a token budget that a prune after the prompt, or one
// while decoding (with the token being decoded on its way), could not
// apply. Ratio budgets always can (pruneShape).
func (c Config) checkShape(m *Method) error {
	if c.Budget == 0 {
		return nil
	}
	if _, _, _, err := c.pruneShape(m, c.Budget, 0); err != nil {
		return err
	}
	if c.Every > 0 {
		if _, _, _, err := c.pruneShape(m, c.Budget, 1); err != nil {
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
func (c Config) pruneShape(m *Method, total, incoming int) (b, sinks, window int, err error) {
	b = total - incoming
	if c.Budget == 0 {
		b = max(b, 1)
	}
	if b <= 0 {
		param := "budget"
		if m.WindowBudget {
			param = "window"
		}
		return 0, 0, 0, perr(param, "policy: %s budget %d leaves no room for the token being decoded (it needs at least %d, or %s 0)", c.Method, total, incoming+1, ref("every"))
	}
	sinks, window = c.Sinks, c.Window
	if m.RecentWindow != nil && window == 0 {
		window = m.RecentWindow(total)
	}
	// The incoming tokens are the newest of the window.
	window = max(0, window-incoming)
	if c.Budget == 0 {
		// Ratio budgets: the window never exceeds the budget.
		sinks = min(sinks, b)
		window = min(window, b-sinks)
	} else if b < sinks+window {
		if incoming > 0 {
			return 0, 0, 0, perr("budget", "policy: %s budget %d leaves no room for the token being decoded besides sinks %d + window %d (or use %s 0)", c.Method, total, sinks, window, ref("every"))
		}
		return 0, 0, 0, perr("budget", "policy: %s budget %d is smaller than sinks %d + window %d", c.Method, total, sinks, window)
	}
	return b, sinks, window, nil
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
	m, ok := registry[c.Method]
	if !ok {
		return s
	}
	if c.Positions == PosReindex {
		s += " positions=reindex"
	}
	if m.Reindex && c.Positions == PosOriginal {
		s += " positions=original" // not the method's default
	}
	if m.Describe != nil {
		s += m.Describe(c)
	} else {
		for _, p := range m.Own {
			s += " " + p.Name + "=" + formatValue(p.Value(c))
		}
	}
	switch def := m.DefaultEvery; {
	case c.Every < 0 && def != 0:
		s += " every=never"
	case c.Every > 0 && c.Every != def:
		s += fmt.Sprintf(" every=%d", c.Every)
	}
	return s
}
