package policy

// streaming is StreamingLLM: the first sinks tokens and the last window,
// positions counted inside the cache (re-indexed) by default.
func init() {
	Register(Method{Name: "streaming", Order: 2, Doc: "StreamingLLM: sinks + window, positions re-indexed",
		Params:       []string{"budget", "window", "sinks", "every", "positions"},
		DefaultEvery: 1, Reindex: true, WindowBudget: true, Unused: map[string]string{"ratio": "%s takes a window, not a ratio"}, Normalize: normalizeWindow, Scorer: windowScorer{}, PrefixTail: anyTail})
}
