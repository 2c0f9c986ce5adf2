package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/model"
)

// boundaryConfigs is, for one method, the product of boundary values of
// the parameters it takes (budget, ratio, window, sinks, every,
// positions: original only where it is not the default), with its other
// parameters cycling through their own boundary values.
func boundaryConfigs(method string) []Config {
	uses := Params(method)
	dim := func(p string, vals ...any) []any {
		if !slices.Contains(uses, p) {
			return []any{nil}
		}
		return vals
	}
	var out []Config
	i := 0
	positions := dim("positions", PosDefault, PosReindex)
	if method == "streaming" { // the only method whose default is not original
		positions = dim("positions", PosDefault, PosOriginal, PosReindex)
	}
	for _, b := range dim("budget", 0, 1, 2, 3, 20) {
		for _, r := range dim("ratio", 0.0, 0.01, 1.0) {
			for _, w := range dim("window", 0, 1, 3) {
				for _, s := range dim("sinks", 0, 1, 3) {
					for _, e := range dim("every", 0, EveryNever, 1, 2) {
						for _, p := range positions {
							c := Config{Method: method}
							if b != nil {
								c.Budget = b.(int)
							}
							if r != nil {
								c.Ratio = r.(float64)
							}
							if w != nil {
								c.Window = w.(int)
							}
							if s != nil {
								c.Sinks = s.(int)
							}
							if e != nil {
								c.Every = e.(int)
							}
							if p != nil {
								c.Positions = p.(Positions)
							}
							cyc := func(p string, vals ...any) any {
								if !slices.Contains(uses, p) {
									return nil
								}
								return vals[i%len(vals)]
							}
							if v := cyc("agg", attention.AggMean, attention.AggMax, attention.AggSum); v != nil {
								c.Agg = v.(attention.Agg)
							}
							if v := cyc("pool", "", "max", "avg"); v != nil {
								c.Pool = v.(string)
							}
							if v := cyc("kernel", 0, 1, 2, 3); v != nil {
								c.Kernel = v.(int)
							}
							if v := cyc("alpha", 0.0, 1.0, 1.5); v != nil {
								c.Opts.Set("alpha", v.(float64))
							}
							if v := cyc("beta", 0.0, 1.0, 0.5); v != nil {
								c.Opts.Set("beta", v.(float64))
							}
							out = append(out, c)
							i++
						}
					}
				}
			}
		}
	}
	switch method {
	case "pyramidinfer":
		for _, rc := range []float64{0, 0.01, 0.99, 1} {
			for _, mk := range []int{0, 1, 1000} {
				for _, d := range []float64{0, 0.01, 1, 1.5} {
					out = append(out, Config{Method: method, Opts: Opts{}.With("recent", rc).With("min-keep", float64(mk)).With("decay", d).With("gen-decay", d), Sinks: mk % 7})
				}
			}
		}
	case "minicache":
		for _, tv := range []float64{0, 1, 1.5} {
			for _, g := range []float64{0, 0.01, 1} {
				for _, from := range []int{0, 1, 3, 4} {
					for _, e := range []int{0, EveryNever, 1, 2} {
						out = append(out, Config{Method: method, Opts: Opts{}.With("t", tv).With("gamma", g).With("merge-from", float64(from)), Every: e, Window: from})
					}
				}
			}
		}
	}
	return out
}

// TestNormalizeComplete checks that policy validation is complete: every
// configuration of boundary parameters that Normalize accepts attaches to
// a sequence and runs a prompt fed in chunks (as the server's prefill
// does), its compression and decode steps that prune, without an error;
// everything else is refused with a one-line "policy:" error. A
// normalized configuration normalizes to itself.
func TestNormalizeComplete(t *testing.T) {
	if testing.Short() {
		t.Skip("slow; -short (CI's purego and race runs) skips it, the plain run has it")
	}
	st := loadStories(t)
	m := st.m
	const T, steps = 16, 8 // budget 20: pruned while decoding only
	for _, method := range Methods {
		t.Run(method, func(t *testing.T) {
			accepted, refused := 0, 0
			for _, cfg := range boundaryConfigs(method) {
				n, err := cfg.Normalize()
				if err != nil {
					refused++
					if msg := err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "policy: ") {
						t.Fatalf("%+v: error %q is not one policy line", cfg, msg)
					}
					continue
				}
				accepted++
				if again, err := n.Normalize(); err != nil || again != n {
					t.Fatalf("%+v: normalized %+v normalizes to %+v, %v", cfg, n, again, err)
				}
				if err := runShort(m, n, st.ids[:T], steps); err != nil {
					if method == "minicache" && len(n.MergedPairs(m.Config.Layers)) == 0 && strings.Contains(err.Error(), "no layer pair") {
						continue // refused by New, before any work: it depends on the model
					}
					t.Fatalf("%s (%+v) was accepted and failed: %v", n, cfg, err)
				}
			}
			if accepted == 0 || (method != "full" && refused == 0) {
				t.Fatalf("%d accepted, %d refused: the boundaries are not boundaries", accepted, refused)
			}
			t.Logf("%d accepted, %d refused", accepted, refused)
		})
	}
}

// runShort runs a prompt in chunks of 8 under cfg, compresses, and
// decodes steps greedy tokens, pruning as the policy says.
func runShort(m *model.Model, cfg Config, prompt []int, steps int) error {
	seq, err := m.NewStandaloneSequence(model.KVOptions{BlockTokens: 16, Tokens: 64})
	if err != nil {
		return err
	}
	defer seq.Close()
	ps, err := New(cfg, seq)
	if err != nil {
		return err
	}
	ps.BeginPrefill(len(prompt))
	var logits []float32
	for i := 0; i < len(prompt); i += 8 {
		if logits, err = seq.Forward(prompt[i:min(i+8, len(prompt))], false); err != nil {
			return err
		}
	}
	if err := ps.Compress(); err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	for s := 0; s < steps; s++ {
		if err := ps.Before(1); err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		if logits, err = seq.Forward([]int{argmax(logits)}, false); err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
	}
	return nil
}

// TestNormalizeUnused refuses, for every method, each parameter it does
// not use, naming it.
func TestNormalizeUnused(t *testing.T) {
	value := map[string]func(*Config){
		"budget": func(c *Config) { c.Budget = 8 }, "ratio": func(c *Config) { c.Ratio = 0.5 },
		"window": func(c *Config) { c.Window = 4 }, "sinks": func(c *Config) { c.Sinks = 2 },
		"agg": func(c *Config) { c.Agg = attention.AggMax }, "pool": func(c *Config) { c.Pool = "max" },
		"kernel": func(c *Config) { c.Kernel = 3 }, "every": func(c *Config) { c.Every = 2 },
		"positions": func(c *Config) { c.Positions = PosReindex }, "alpha": func(c *Config) { c.Opts.Set("alpha", 0.5) },
		"beta": func(c *Config) { c.Opts.Set("beta", 2) }, "recent": func(c *Config) { c.Opts.Set("recent", 0.5) },
		"min-keep": func(c *Config) { c.Opts.Set("min-keep", 8) }, "decay": func(c *Config) { c.Opts.Set("decay", 0.5) },
		"gen-decay": func(c *Config) { c.Opts.Set("gen-decay", 0.5) }, "t": func(c *Config) { c.Opts.Set("t", 0.5) },
		"gamma": func(c *Config) { c.Opts.Set("gamma", 0.5) }, "merge-from": func(c *Config) { c.Opts.Set("merge-from", 1) },
		"n-future": func(c *Config) { c.Opts.Set("n-future", 8) },
	}
	// A configuration of each method that Normalize accepts.
	base := map[string]Config{
		"full": {}, "window": {Window: 8}, "streaming": {Window: 8}, "lminfinite": {Window: 8},
		"h2o": {Budget: 16}, "tova": {Budget: 16}, "snapkv": {Budget: 40}, "adakv": {Budget: 40},
		"pyramidkv": {Budget: 40}, "knorm": {Budget: 16}, "pyramidinfer": {}, "minicache": {},
		"keydiff": {Budget: 16}, "expected": {Budget: 16},
	}
	for _, method := range Methods {
		for _, p := range allParams {
			if slices.Contains(Params(method), p) {
				continue
			}
			t.Run(method+"/"+p, func(t *testing.T) {
				c := base[method]
				c.Method = method
				if _, err := c.Normalize(); err != nil {
					t.Fatalf("base %+v: %v", c, err)
				}
				value[p](&c)
				_, err := c.Normalize()
				var pe *ParamError
				if err == nil {
					t.Fatalf("%+v: accepted, but %s does not use %s", c, method, p)
				}
				if p != "ratio" && p != "budget" && (!errors.As(err, &pe) || pe.Param != p) {
					// a ratio or budget may be refused as the other one of the pair
					t.Fatalf("%+v: error %v does not name %s", c, err, p)
				}
			})
		}
	}
}

// TestNormalizeGiven: a front end's explicit parameters are honoured or
// refused by name, never dropped.
func TestNormalizeGiven(t *testing.T) {
	type tc struct {
		name  string
		cfg   Config
		given []string
		want  string // error substring; "" for success
		check func(Config) bool
	}
	cases := []tc{
		{"streaming positions original", Config{Method: "streaming", Window: 8, Positions: PosOriginal}, []string{"window", "positions"}, "",
			func(c Config) bool { return c.Positions == PosOriginal }},
		{"streaming positions default", Config{Method: "streaming", Window: 8}, []string{"window"}, "",
			func(c Config) bool { return c.Positions == PosReindex }},
		{"streaming every, positions default", Config{Method: "streaming", Window: 8, Every: 4}, []string{"window", "every"}, "",
			func(c Config) bool { return c.Positions == PosReindex && c.Every == 4 }},
		{"every 0 is never", Config{Method: "h2o", Budget: 8}, []string{"budget", "every"}, "",
			func(c Config) bool { return c.Every == EveryNever }},
		{"every absent is every step", Config{Method: "h2o", Budget: 8}, []string{"budget"}, "",
			func(c Config) bool { return c.Every == 1 }},
		{"window every 0", Config{Method: "window", Window: 8}, []string{"window", "every"}, "",
			func(c Config) bool { return c.Every == EveryNever }},
		{"snapkv every 0", Config{Method: "snapkv", Ratio: 0.5}, []string{"ratio", "every"}, "",
			func(c Config) bool { return c.Every == EveryNever }},
		{"full window", Config{Method: "full"}, []string{"window"}, "full takes no --kv-window", nil},
		{"full window 0", Config{Method: "full"}, []string{"window"}, "full takes no --kv-window", nil},
		{"full every", Config{Method: "full"}, []string{"every"}, "--kv-every", nil},
		{"full positions", Config{Method: "full", Positions: PosOriginal}, []string{"positions"}, "--kv-positions", nil},
		{"window kernel", Config{Method: "window", Window: 8}, []string{"window", "kernel"}, "window takes no --kv-kernel", nil},
		{"h2o pool", Config{Method: "h2o", Budget: 8, Pool: "max"}, []string{"budget", "pool"}, "h2o takes no --kv-pool", nil},
		{"knorm agg mean", Config{Method: "knorm", Budget: 8}, []string{"budget", "agg"}, "knorm takes no --kv-agg", nil},
		{"pyramidinfer every 0", Config{Method: "pyramidinfer"}, []string{"every"}, "--kv-every", nil},
		{"adakv positions", Config{Method: "adakv", Budget: 40}, []string{"budget", "positions"}, "--kv-positions", nil},
		{"budget 0", Config{Method: "h2o", Ratio: 0.5}, []string{"budget", "ratio"}, "--kv-budget must be positive", nil},
		{"kernel 0", Config{Method: "snapkv", Budget: 40}, []string{"budget", "kernel"}, "--kv-kernel must be positive", nil},
		{"snapkv window 0", Config{Method: "snapkv", Budget: 40}, []string{"budget", "window"}, "--kv-window 0", nil},
		{"streaming sinks 0", Config{Method: "streaming", Window: 8}, []string{"window", "sinks"}, "--kv-sinks 0", nil},
		{"h2o sinks 0", Config{Method: "h2o", Budget: 8}, []string{"budget", "sinks"}, "",
			func(c Config) bool { return c.Sinks == 0 }},
		{"tova window 0", Config{Method: "tova", Budget: 8}, []string{"budget", "window"}, "",
			func(c Config) bool { return c.Window == 0 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, err := c.cfg.NormalizeGiven(c.given...)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("error %v", err)
			case c.want == "" && !c.check(n):
				t.Fatalf("normalized %+v", n)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
			if c.want != "" {
				var pe *ParamError
				if !errors.As(err, &pe) || !slices.Contains(c.given, pe.Param) {
					t.Fatalf("error %v names no given parameter", err)
				}
			}
		})
	}
}
