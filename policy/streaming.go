package policy

// StreamingBudget is streaming's cache when neither a window nor a budget
// is given: sinks (4 by default) plus the most recent tokens, 512 in all
// (sinks 4 + window 508). StreamingLLM's reference defaults are
// start_size 4 with recent_size 2000 (its class default 512); a cache of
// 512 keeps the re-indexed positions (0..511) inside the context of every
// model kvlm runs, stories260K's 512 the smallest, where 2004 would run
// far past it.
const StreamingBudget = 512

// streaming is StreamingLLM: the first sinks tokens and the last window,
// positions counted inside the cache (re-indexed) by default.
func init() {
	Register(Method{Name: "streaming", Order: 2, Doc: "StreamingLLM: sinks + window (default 4 + 508), positions re-indexed",
		Params:       []string{"budget", "window", "sinks", "every", "positions"},
		DefaultEvery: 1, Reindex: true, WindowBudget: true, Unused: map[string]string{"ratio": "%s takes a window, not a ratio"}, Normalize: normalizeStreaming, Scorer: windowScorer{}, PrefixTail: anyTail})
}

// normalizeStreaming is normalizeWindow with StreamingBudget when neither
// the window nor the budget is given.
func normalizeStreaming(c Config) (Config, error) {
	if c.Window == 0 && c.Budget == 0 {
		c.Budget = StreamingBudget
	}
	return normalizeWindow(c)
}
