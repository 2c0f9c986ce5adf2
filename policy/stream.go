package policy

// StreamBound is, for a window method that prunes while decoding
// (window, streaming, lminfinite with every > 0), the most tokens a table
// holds while tokens are fed one at a time: its budget and the tokens of
// the steps between two prunes. Such a method can read a text longer than
// the context, token by token, as `kvlm ppl --stream` does. ok is false
// for every other configuration. c must be normalized.
func (c Config) StreamBound() (tokens int, ok bool) {
	m, found := registry[c.Method]
	if !found || !m.WindowBudget || c.Every <= 0 || c.Budget <= 0 {
		return 0, false
	}
	return c.Budget + c.Every, true
}
