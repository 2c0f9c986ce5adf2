package policy

// Prefix reuse: which part of a prompt a method must compute itself.
//
// A scheduler with a prefix cache may start a sequence from cached blocks
// of its prompt's first tokens (computed earlier, uncompressed) and run
// only the rest. Whether the compressed result is then the one a whole
// prefill gives depends on what the method reads during the prefill:
//
//   - keys, values or positions only (window, streaming, lminfinite,
//     knorm, keydiff, minicache; full): the cached tokens' keys are the
//     ones a prefill would store, so any prefix may be reused;
//   - the last query's attention (tova): the last token is always
//     computed;
//   - an observation window's attention (snapkv, adakv, pyramidkv: the
//     prompt's last Window queries over every key): the window's tokens
//     must be computed, so at most the tokens before it are reused;
//   - every query of the prompt (h2o's accumulated mass, expected's query
//     statistics) or a prefill the method changes (pyramidinfer prunes
//     between layers while the prompt runs): nothing is reused, the whole
//     prompt is computed.
//
// Each method says which with Method.PrefixTail; ComputedTail reads it.

// ComputedTail is the fewest last tokens of a prompt of n tokens that must
// be computed under c for the compressed result to be the one a prefill
// of the whole prompt gives (at least 1, at most n). c must be normalized.
func (c Config) ComputedTail(n int) int {
	m, ok := registry[c.Method]
	if n <= 0 {
		return 0
	}
	if !ok || m.PrefixTail == nil {
		return n
	}
	return min(n, max(1, m.PrefixTail(c, n)))
}

// anyTail: the method reads no query of the prompt but the last token's
// (whose logits are needed anyway).
func anyTail(Config, int) int { return 1 }

// observedTail: the observation window (the snapkv family's Window).
func observedTail(c Config, n int) int { return c.Window }

// Key is the configuration's canonical form: the method and the value of
// every parameter it takes (Method.Params, its own included), defaults filled in by Normalize (so two
// configurations compress alike exactly when their keys are equal). It
// keys the compressed prefix cache; c must be normalized.
func (c Config) Key() string {
	m, ok := registry[c.Method]
	if !ok {
		return c.Method
	}
	s := c.Method
	for _, name := range m.Params {
		s += " " + name + "=" + formatValue(params[name].Value(c))
	}
	return s
}
