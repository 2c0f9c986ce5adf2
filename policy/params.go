package policy

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kvlm/kvlm/attention"
)

// ParamKind is the type of a parameter's value.
type ParamKind int

const (
	IntParam    ParamKind = iota // an integer
	FloatParam                   // a number
	ChoiceParam                  // one of Choices, as a string
)

// Param describes one parameter of the methods: the front ends derive
// their spelling of it from Name (the CLI's --kv-NAME, the server's
// kv.NAME with '-' as '_'), their help from Doc and Default, and
// Normalize checks its bounds. The zero value of a parameter means "not
// set": the method's default.
type Param struct {
	Name    string
	Kind    ParamKind
	Doc     string   // what it is, for --help
	Default string   // its default as the help says it ("" when it has none)
	Choices []string // ChoiceParam: the accepted values

	// Bounds of a number that is set (checked before the method's
	// Normalize): Lo ≤ v ≤ Hi, exclusive where LoOpen/HiOpen; Hi 0 is no
	// upper bound. Range, if set, says them in the error instead ("not be
	// negative"), and Note follows the error in brackets.
	Lo, Hi         float64
	LoOpen, HiOpen bool
	Range, Note    string

	// Fill, if non-zero, is the value an unset parameter takes when the
	// method uses it.
	Fill float64

	// field points at a shared parameter's storage in a Config: *int,
	// *float64, *string, *attention.Agg or *Positions. A method's own
	// parameter has none: it is stored in Config.Opts under its Name.
	field func(*Config) any
}

// Flag is the CLI's spelling of a parameter: --kv-NAME.
func Flag(param string) string { return "--kv-" + param }

// JSONName is the server's field name of a parameter in the kv object.
func JSONName(param string) string { return strings.ReplaceAll(param, "-", "_") }

// Value is the parameter's value in c: an int, a float64 or a string.
func (p *Param) Value(c Config) any {
	if p.field == nil {
		v := c.Opts.Get(p.Name)
		if p.Kind == IntParam {
			return int(v)
		}
		return v
	}
	switch f := p.field(&c).(type) {
	case *int:
		return *f
	case *float64:
		return *f
	case *string:
		return *f
	case *attention.Agg:
		return [...]string{"mean", "max", "sum"}[*f]
	case *Positions:
		return [...]string{"", "original", "reindex"}[*f]
	}
	panic("policy: parameter " + p.Name + " has no storage")
}

// Float is a number parameter's value in c (0: not set), for the method
// that owns it.
func (p *Param) Float(c Config) float64 {
	switch v := p.Value(c).(type) {
	case int:
		return float64(v)
	case float64:
		return v
	}
	panic("policy: parameter " + p.Name + " is not a number")
}

// Int is an integer parameter's value in c (0: not set).
func (p *Param) Int(c Config) int {
	if v, ok := p.Value(c).(int); ok {
		return v
	}
	panic("policy: parameter " + p.Name + " is not an integer")
}

// IsSet reports whether the parameter holds something other than "not
// set". Original positions are what every method without the choice does.
func (p *Param) IsSet(c Config) bool {
	if p.field == nil {
		return c.Opts.Get(p.Name) != 0
	}
	switch f := p.field(&c).(type) {
	case *int:
		return *f != 0
	case *float64:
		return *f != 0
	case *string:
		return *f != ""
	case *attention.Agg:
		return *f != attention.AggMean
	case *Positions:
		return *f == PosReindex
	}
	return false
}

// Set stores v (an int for IntParam, a float64 or an int for FloatParam,
// a string for ChoiceParam) in c. A choice is checked here; numbers are
// checked by Normalize.
func (p *Param) Set(c *Config, v any) error {
	num := func() (float64, bool) {
		switch x := v.(type) {
		case int:
			return float64(x), true
		case float64:
			return x, p.Kind == FloatParam
		}
		return 0, false
	}
	if p.Kind == ChoiceParam {
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("policy: %s takes a string, got %v", p.Name, v)
		}
		switch f := p.field(c).(type) {
		case *attention.Agg:
			a, err := ParseAgg(s)
			if err != nil {
				return err
			}
			*f = a
		case *Positions:
			ps, err := ParsePositions(s)
			if err != nil {
				return err
			}
			*f = ps
		case *string:
			*f = s
		}
		return nil
	}
	x, ok := num()
	if !ok {
		return fmt.Errorf("policy: %s takes a number, got %v", p.Name, v)
	}
	if p.field == nil {
		c.Opts.Set(p.Name, x)
		return nil
	}
	switch f := p.field(c).(type) {
	case *int:
		*f = int(x)
	case *float64:
		*f = x
	}
	return nil
}

// fill gives an unset parameter its Fill value.
func (p *Param) fill(c *Config) {
	if p.Fill != 0 && !p.IsSet(*c) {
		if p.Kind == IntParam {
			p.Set(c, int(p.Fill))
		} else {
			p.Set(c, p.Fill)
		}
	}
}

// check refuses a number set outside the bounds.
func (p *Param) check(c Config) error {
	if p.Kind == ChoiceParam || !p.IsSet(c) {
		return nil
	}
	var x float64
	switch v := p.Value(c).(type) {
	case int:
		x = float64(v)
	case float64:
		x = v
	}
	ok := !math.IsNaN(x) && !math.IsInf(x, 0) &&
		(x > p.Lo || !p.LoOpen && x == p.Lo) &&
		(p.Hi == 0 || x < p.Hi || !p.HiOpen && x == p.Hi)
	if ok {
		return nil
	}
	r := p.Range
	if r == "" {
		switch {
		case p.Hi != 0:
			r = fmt.Sprintf("be in %s%g, %g%s", map[bool]string{false: "[", true: "("}[p.LoOpen], p.Lo, p.Hi, map[bool]string{false: "]", true: ")"}[p.HiOpen])
		case p.Kind == IntParam && p.Lo == 1:
			r = "be positive"
		case p.Lo == 0 && !p.LoOpen:
			r = "not be negative"
		default:
			r = fmt.Sprintf("be %s %g", map[bool]string{false: "≥", true: ">"}[p.LoOpen], p.Lo)
		}
	}
	note := ""
	if p.Note != "" {
		note = " (" + p.Note + ")"
	}
	return perr(p.Name, "policy: %s must %s, got %v%s", ref(p.Name), r, p.Value(c), note)
}

// params is every parameter, by name; paramOrder is their registration order.
var (
	params     = map[string]*Param{}
	paramOrder []string
	allParams  []string // the names, in order
	optParams  int      // how many are stored in Opts
)

func registerParam(p *Param) {
	if q, ok := params[p.Name]; ok {
		if q != p {
			panic("policy: parameter " + p.Name + " registered twice")
		}
		return
	}
	if p.field == nil {
		if p.Kind == ChoiceParam {
			panic("policy: parameter " + p.Name + ": a choice needs a Config field")
		}
		if optParams++; optParams > maxOpts {
			panic(fmt.Sprintf("policy: parameter %s: more than %d method parameters for Opts", p.Name, maxOpts))
		}
	}
	params[p.Name] = p
	paramOrder = append(paramOrder, p.Name)
	allParams = append(allParams, p.Name)
}

// AllParams lists every parameter of every registered method, the shared
// ones first, each once.
func AllParams() []*Param {
	out := make([]*Param, len(paramOrder))
	for i, n := range paramOrder {
		out[i] = params[n]
	}
	return out
}

// LookupParam returns the parameter of that name.
func LookupParam(name string) (*Param, bool) {
	p, ok := params[name]
	return p, ok
}

// UsedBy lists the methods that take the parameter, in Methods order.
func UsedBy(param string) []string {
	var out []string
	for _, m := range Methods {
		if slices.Contains(registry[m].Params, param) {
			out = append(out, m)
		}
	}
	return out
}

// Help is a parameter's help line: its doc, the methods that take it and
// its default.
func (p *Param) Help() string {
	s := p.Doc
	if u := UsedBy(p.Name); len(u) > 0 && len(u) < len(Methods)-1 {
		s += " [" + strings.Join(u, ", ") + "]"
	}
	if p.Default != "" {
		s += " (default " + p.Default + ")"
	}
	return s
}

// The parameters several methods share.
var (
	pBudget = &Param{Name: "budget", Kind: IntParam, Doc: "tokens kept per (layer, KV head)", Lo: 1,
		field: func(c *Config) any { return &c.Budget }}
	pRatio = &Param{Name: "ratio", Kind: FloatParam, Doc: "fraction of tokens kept (kvpress's compression_ratio is 1 − R)", Lo: 0, LoOpen: true, Hi: 1,
		field: func(c *Config) any { return &c.Ratio }}
	pWindow = &Param{Name: "window", Kind: IntParam, Doc: "recent tokens always kept (snapkv family: the observation window, default 32; h2o: default half the budget; minicache: tokens left unmerged)",
		field: func(c *Config) any { return &c.Window }}
	pSinks = &Param{Name: "sinks", Kind: IntParam, Doc: "first tokens always kept (streaming, lminfinite, pyramidinfer: default 4)",
		field: func(c *Config) any { return &c.Sinks }}
	pAgg = &Param{Name: "agg", Kind: ChoiceParam, Choices: []string{"mean", "max", "sum"}, Doc: "how the query heads of a KV head combine their scores: mean, max or sum", Default: "mean",
		field: func(c *Config) any { return &c.Agg }}
	pPool = &Param{Name: "pool", Kind: ChoiceParam, Choices: []string{"avg", "max"}, Doc: "score pooling, avg or max", Default: "avg",
		field: func(c *Config) any { return &c.Pool }}
	pKernel = &Param{Name: "kernel", Kind: IntParam, Doc: "pooling kernel (odd)", Default: "5", Lo: 1,
		field: func(c *Config) any { return &c.Kernel }}
	pEvery = &Param{Name: "every", Kind: IntParam, Doc: "during decoding, prune every N steps; 0: never, only after the prompt (default: every step for window methods, h2o and tova; never for the others)",
		Lo: EveryNever, Range: "not be negative", Note: "0: only after the prompt",
		field: func(c *Config) any { return &c.Every }}
	pPositions = &Param{Name: "positions", Kind: ChoiceParam, Choices: []string{"original", "reindex"}, Doc: "original or reindex (StreamingLLM's positions inside the cache); default: reindex for streaming, original otherwise",
		field: func(c *Config) any { return &c.Positions }}
)

// sharedParams are registered before any method's init runs (package
// variables are initialized before init functions).
var sharedParams = func() []*Param {
	ps := []*Param{pBudget, pRatio, pWindow, pSinks, pAgg, pPool, pKernel, pEvery, pPositions}
	for _, p := range ps {
		registerParam(p)
	}
	return ps
}()

// Opts holds the methods' own parameters (those with no Config field:
// each is declared and read by its method's file), by name. It is a value
// (Config stays comparable); a parameter at 0 is not stored, and the
// names are kept sorted, so equal options compare equal.
type Opts struct {
	n    [maxOpts]string
	v    [maxOpts]float64
	used int
}

// maxOpts bounds the methods' own parameters, all of which a front end
// may set at once before Normalize refuses those the method does not use
// (registerParam panics past it).
const maxOpts = 16

// With is o with name set to v, for literals: Opts{}.With("t", 0.5).
func (o Opts) With(name string, v float64) Opts {
	o.Set(name, v)
	return o
}

// Get is the value of name (0: not set).
func (o Opts) Get(name string) float64 {
	for i := 0; i < o.used; i++ {
		if o.n[i] == name {
			return o.v[i]
		}
	}
	return 0
}

// Set stores v under name, the names kept sorted so that equal options
// compare equal.
func (o *Opts) Set(name string, v float64) {
	for i := 0; i < o.used; i++ {
		if o.n[i] == name {
			if v == 0 {
				copy(o.n[i:], o.n[i+1:o.used])
				copy(o.v[i:], o.v[i+1:o.used])
				o.used--
				o.n[o.used], o.v[o.used] = "", 0
				return
			}
			o.v[i] = v
			return
		}
	}
	if v == 0 {
		return
	}
	if o.used == maxOpts {
		panic("policy: too many method options")
	}
	i := o.used
	for i > 0 && o.n[i-1] > name {
		o.n[i], o.v[i] = o.n[i-1], o.v[i-1]
		i--
	}
	o.n[i], o.v[i] = name, v
	o.used++
}

// ParamError is an error of Normalize caused by one parameter, named as in
// AllParams (budget, window, min-keep, …), so that a front end can point
// at its own spelling of it. The message refers to parameters as {{name}};
// Error renders them as CLI flags (--kv-budget), Render as the caller
// says.
type ParamError struct {
	Param string
	Msg   string
}

func (e *ParamError) Error() string { return e.Render(Flag) }

var refRE = regexp.MustCompile(`\{\{([a-z-]+)\}\}`)

// Render is the message with each parameter named by name.
func (e *ParamError) Render(name func(param string) string) string {
	return refRE.ReplaceAllStringFunc(e.Msg, func(s string) string { return name(s[2 : len(s)-2]) })
}

// ref is a parameter's placeholder in a ParamError message.
func ref(param string) string { return "{{" + param + "}}" }

func perr(param, format string, args ...any) error {
	return &ParamError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// Params lists the parameters a method uses, by name (nil for an unknown
// method). A parameter not listed is refused by Normalize when set and by
// NormalizeGiven when given at all.
func Params(method string) []string {
	if m, ok := registry[method]; ok {
		return m.Params
	}
	return nil
}

// unusedErr is the error of a parameter the method does not use: the
// method's own explanation (Method.Unused) or the list of those it takes.
func unusedErr(method, param string) error {
	if why, ok := registry[method].Unused[param]; ok {
		return perr(param, "policy: %s", strings.ReplaceAll(why, "%s", method))
	}
	var fl []string
	for _, p := range Params(method) {
		fl = append(fl, ref(p))
	}
	why := "it has no parameters"
	if len(fl) > 0 {
		why = "it takes " + strings.Join(fl, ", ")
	}
	if param == "positions" {
		why = "it keeps original positions"
	}
	return perr(param, "policy: %s takes no %s (%s)", method, ref(param), why)
}

// formatValue is a parameter's value in String's form.
func formatValue(v any) string {
	switch x := v.(type) {
	case int:
		return strconv.Itoa(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return fmt.Sprint(v)
}
