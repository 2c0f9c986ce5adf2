package policy

// The window methods keep the last Window tokens (and the first Sinks):
// no scores, the budget is sinks + window, pruned at every decode step by
// default.

// windowScorer keeps sinks and window only.
type windowScorer struct{ scorerBase }

// normalizeWindow fills in a window method's defaults: its budget is its
// sinks plus its window (sinks default to 4 where the method keeps them).
func normalizeWindow(c Config) (Config, error) {
	if c.Window == 0 && c.Budget == 0 {
		return c, perr("window", "policy: %s needs %s (or %s)", c.Method, ref("window"), ref("budget"))
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
	return c, nil
}

func init() {
	Register(Method{Name: "window", Order: 1, Doc: "sliding window: the last window tokens",
		Params:       []string{"budget", "window", "every", "positions"},
		DefaultEvery: 1, WindowBudget: true, Unused: map[string]string{"ratio": "%s takes a window, not a ratio", "sinks": "window keeps no sinks; use streaming"}, Normalize: normalizeWindow, Scorer: windowScorer{}, PrefixTail: anyTail})
}
