package policy

import (
	"fmt"
	"slices"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// Method is one KV method as its file registers it (Register, from the
// file's init): its parameters, its defaults and checks, and either a
// Scorer that the shared prune applies or a Runner of its own schedule.
// Nothing outside the method's file names it.
type Method struct {
	Name  string
	Order int    // its place in Methods and in --help
	Doc   string // one line: what it keeps

	// Params are the parameters it takes, by name: shared ones (budget,
	// ratio, window, sinks, agg, pool, kernel, every, positions) and its
	// Own, which Register registers.
	Params []string
	Own    []*Param
	// Unused explains, for some parameters it does not take, why (the
	// error's text after "policy: "; %s is the method's name, {{name}} a
	// parameter); the others are refused with the list of those it takes.
	Unused map[string]string

	DefaultEvery int  // the decoding schedule when none is given: 1 every step, 0 only after the prompt
	Reindex      bool // positions are re-indexed by default (StreamingLLM)
	WindowBudget bool // the budget is sinks + window: room errors name the window
	// RecentWindow, if set, is the recent window of a prune to total
	// tokens when none is given (H2O: half the budget).
	RecentWindow func(total int) int

	// Normalize, if set, fills in the method's defaults of the shared
	// parameters and refuses what the parameters' bounds cannot say. It
	// runs after the bounds and Fill values of Params.
	Normalize func(c Config) (Config, error)
	// Check, if set, refuses a normalized configuration the model's KV
	// layout cannot run (keys sealed in groups, no layer pair to merge).
	Check func(c Config, l kvcache.Layout, keys codec.Codec) error
	// PrefixTail, if set, is the fewest last tokens of a prompt of n
	// tokens the method must see computed (their queries run) to reach what
	// a prefill of the whole prompt gives it, so that the prompt's other
	// tokens may come from the prefix cache. Nil: the method reads the
	// queries of every prompt token (h2o, expected) or changes the prefill
	// itself (pyramidinfer), and the whole prompt is computed. See
	// Config.ComputedTail.
	PrefixTail func(c Config, n int) int
	// Describe, if set, is String's text of the method's own parameters
	// (default: " name=value" for each of Own).
	Describe func(c Config) string

	// Scorer: a method the shared prune applies (after the prompt, and
	// every Every decode steps), or
	Scorer Scorer
	// NewScorer: a Scorer with per-sequence state, made for each State
	// (instead of Scorer), or
	NewScorer func(st *State) Scorer
	// Run: a method with its own schedule, attached to a State.
	Run func(st *State) (Runner, error)
}

// Scorer is a method that the shared prune runs: keep the sinks and the
// recent window, then the best-scored rest up to each (layer, KV head)'s
// budget. Embed scorerBase for the defaults.
type Scorer interface {
	// Mass is what the method needs from attention when layer runs the
	// queries of tokens [start, start+n) of the history (nil: nothing).
	// Out is allocated by the State.
	Mass(st *State, layer, start, n int) *attention.MassRequest
	// Done receives the filled request, with the layer's rotated queries
	// ([n][heads·headDim]) and their positions.
	Done(st *State, layer int, req *attention.MassRequest, q []float32, pos []int32)
	// Scores is the score of each slot of each KV head of layer before a
	// prune that keeps window recent slots (nil: no scores, sinks and
	// window only).
	Scores(st *State, layer, window int) [][]float32
	// Budgets is each KV head's budget at layer (nil: b for every head).
	Budgets(st *State, layer, b, window int, scores [][]float32) []int
	// Pruned runs after each prune.
	Pruned(st *State)
	// Step runs before each decode step, after the schedule's prune.
	Step(st *State, incoming int) error
	// Rows is how many of the last queries of a step of n tokens
	// (history [start, start+n)) the method scores, their attention or the
	// queries themselves (State.PromptRows).
	Rows(st *State, start, n int) int
}

// Runner is a method with its own schedule: the State hands it the
// policy protocol.
type Runner interface {
	Begin(n int)                                                          // a prefill of n tokens starts
	Request(layer, start, n int) *attention.MassRequest                   // model.MassHook
	Done(layer int, req *attention.MassRequest, q []float32, pos []int32) // model.MassHook
	Compress() error                                                      // the prefill ended
	Before(incoming int) error                                            // a decode step follows
}

// scorerBase is the Scorer defaults: no attention, no scores, b for
// every head, nothing after a prune or before a step.
type scorerBase struct{}

func (scorerBase) Mass(*State, int, int, int) *attention.MassRequest { return nil }
func (scorerBase) Done(st *State, layer int, req *attention.MassRequest, _ []float32, _ []int32) {
	st.addMass(layer, req)
}
func (scorerBase) Scores(*State, int, int) [][]float32              { return nil }
func (scorerBase) Budgets(*State, int, int, int, [][]float32) []int { return nil }
func (scorerBase) Pruned(*State)                                    {}
func (scorerBase) Step(*State, int) error                           { return nil }
func (scorerBase) Rows(*State, int, int) int                        { return 0 }

// registry holds the methods by name; Methods lists them in Order.
var registry = map[string]*Method{}

// Methods lists the method names, in their Order.
var Methods []string

// Register adds a method (from its file's init). It panics on a duplicate
// name or a parameter that no registered method defines.
func Register(m Method) {
	if _, ok := registry[m.Name]; ok {
		panic("policy: method " + m.Name + " registered twice")
	}
	for _, p := range m.Own {
		registerParam(p)
	}
	for _, p := range m.Params {
		if _, ok := params[p]; !ok {
			panic(fmt.Sprintf("policy: method %s takes unknown parameter %s", m.Name, p))
		}
	}
	registry[m.Name] = &m
	Methods = append(Methods, m.Name)
	slices.SortStableFunc(Methods, func(a, b string) int { return registry[a].Order - registry[b].Order })
}

// prunes reports whether the shared prune runs the method.
func (m *Method) prunes() bool { return m.Scorer != nil || m.NewScorer != nil }

// Lookup returns the registered method of that name.
func Lookup(name string) (*Method, bool) {
	m, ok := registry[name]
	return m, ok
}

// Validate normalizes c and refuses what the model's KV layout (layers,
// KV heads) with keys stored by the codec keys cannot run: what New
// would refuse for a sequence of that model, without one.
func Validate(c Config, l kvcache.Layout, keys codec.Codec) error {
	n, err := c.Normalize()
	if err != nil {
		return err
	}
	return check(n, registry[n.Method], l, keys)
}

// check is Validate past Normalize.
func check(c Config, m *Method, l kvcache.Layout, keys codec.Codec) error {
	if keys != nil && !keys.PerToken() && c.Positions == PosReindex {
		return fmt.Errorf("policy: re-indexed positions need per-token keys; %s keys are sealed in groups", keys.Name())
	}
	if a, b := unevenBounds(l); b >= 0 && c.Positions == PosReindex {
		return perr("positions", "policy: %s re-indexes positions (every layer's tokens renumbered 0…n−1 from one next position), but cache layer %d keeps %s and cache layer %d %s (a window-bounded layer frees the tokens that slide out of it), so the layers hold different numbers of tokens; use %s original",
			c.Method, a, boundText(l, a), b, boundText(l, b), ref("positions"))
	}
	if m.Check != nil {
		return m.Check(c, l, keys)
	}
	return nil
}

// boundedLayer is the first cache layer of l bounded by a window
// (Layout.Windows), or −1.
func boundedLayer(l kvcache.Layout) int {
	for c, w := range l.Windows {
		if w > 0 {
			return c
		}
	}
	return -1
}

// unevenBounds is two cache layers of l with different window bounds
// (Layout.Windows; 0: unbounded), or −1, −1 when all have the same.
func unevenBounds(l kvcache.Layout) (int, int) {
	for c, w := range l.Windows {
		if w != l.Windows[0] {
			return 0, c
		}
	}
	return -1, -1
}

// boundText says what cache layer c of l keeps.
func boundText(l kvcache.Layout, c int) string {
	if w := l.Windows[c]; w > 0 {
		return fmt.Sprintf("the last %d positions", w)
	}
	return "every token"
}

// sharedLayer is the first cache layer of l that several model layers
// read (Layout.Readers), or −1.
func sharedLayer(l kvcache.Layout) int {
	for c, r := range l.Readers {
		if r > 1 {
			return c
		}
	}
	return -1
}
