package policy

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
)

// TestValidateMatchesNew: Validate, given the model's KV layout and a key
// codec, refuses exactly what New refuses for a sequence of that model
// with that codec, with the same error, for every method's boundary
// configurations (minicache's layer pairs, re-indexing and lminfinite
// with KIVI keys included).
func TestValidateMatchesNew(t *testing.T) {
	st := loadStories(t)
	m := st.m
	for _, kn := range []string{"f32", "q8", "kivi2"} {
		kc, err := codec.Parse(kn, codec.Keys)
		if err != nil {
			t.Fatal(err)
		}
		for _, method := range Methods {
			t.Run(kn+"/"+method, func(t *testing.T) {
				refused := 0
				for _, cfg := range boundaryConfigs(method) {
					seq, err := m.NewStandaloneSequence(model.KVOptions{K: kc, BlockTokens: 16, Tokens: 64})
					if err != nil {
						t.Fatal(err)
					}
					_, nerr := New(cfg, seq)
					seq.Close()
					verr := Validate(cfg, m.KVLayout(), kc)
					if (nerr == nil) != (verr == nil) || (nerr != nil && nerr.Error() != verr.Error()) {
						t.Fatalf("%+v: New: %v; Validate: %v", cfg, nerr, verr)
					}
					if verr != nil {
						refused++
					}
				}
				if method != "full" && refused == 0 {
					t.Fatal("nothing refused: the boundaries are not boundaries")
				}
			})
		}
	}
	// What only the layout decides.
	if err := Validate(Config{Method: "minicache", Opts: Opts{}.With("merge-from", 4)}, kvcache.Layout{Layers: 5, KVHeads: 4, HeadDim: 8}, nil); err == nil || !strings.Contains(err.Error(), "no layer pair") {
		t.Fatalf("minicache from layer 4 of 5: %v", err)
	}
	if err := Validate(Config{Method: "minicache", Opts: Opts{}.With("merge-from", 4)}, kvcache.Layout{Layers: 6, KVHeads: 4, HeadDim: 8}, nil); err != nil {
		t.Fatalf("minicache from layer 4 of 6: %v", err)
	}
}

// TestRegistry: the methods are listed in their Order, each parameter a
// method takes is registered, every parameter is taken by some method,
// and each method's own parameters have a doc, a kind and valid bounds.
func TestRegistry(t *testing.T) {
	want := []string{"full", "window", "streaming", "lminfinite", "h2o", "tova", "snapkv", "adakv", "pyramidkv", "knorm", "pyramidinfer", "minicache"}
	if !slices.Equal(Methods[:len(want)], want) {
		t.Fatalf("Methods %v: the first twelve moved", Methods)
	}
	for i := 1; i < len(Methods); i++ {
		if registry[Methods[i-1]].Order >= registry[Methods[i]].Order {
			t.Fatalf("Methods %v not in Order", Methods)
		}
	}
	for _, p := range AllParams() {
		if len(UsedBy(p.Name)) == 0 {
			t.Errorf("parameter %s is taken by no method", p.Name)
		}
		if p.Doc == "" || p.Name != strings.ToLower(p.Name) || strings.ContainsAny(p.Name, " _") {
			t.Errorf("parameter %q: name or doc", p.Name)
		}
		if p.Kind == ChoiceParam && len(p.Choices) == 0 {
			t.Errorf("parameter %s: a choice without choices", p.Name)
		}
		if p.Fill != 0 {
			var c Config
			if err := p.Set(&c, p.Fill); err != nil && p.Kind != IntParam {
				t.Errorf("parameter %s: fill %g: %v", p.Name, p.Fill, err)
			}
			p.fill(&c)
			if err := p.check(c); err != nil {
				t.Errorf("parameter %s: its fill value is out of its bounds: %v", p.Name, err)
			}
		}
	}
	for _, bad := range []Method{
		{Name: "h2o"},
		{Name: "x", Params: []string{"no-such-param"}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%+v) accepted", bad)
				}
			}()
			Register(bad)
		}()
	}
}

// TestParamErrorRender: an error's parameters are rendered as the front
// end names them.
func TestParamErrorRender(t *testing.T) {
	_, err := Config{Method: "snapkv"}.Normalize()
	pe, ok := err.(*ParamError)
	if !ok || pe.Param != "budget" {
		t.Fatalf("%v", err)
	}
	if got := pe.Error(); got != "policy: snapkv needs a budget (--kv-budget N) or a ratio (--kv-ratio R)" {
		t.Fatalf("Error %q", got)
	}
	if got := pe.Render(func(p string) string { return "kv." + JSONName(p) }); got != "policy: snapkv needs a budget (kv.budget N) or a ratio (kv.ratio R)" {
		t.Fatalf("Render %q", got)
	}
	_, err = Config{Method: "pyramidinfer", Opts: Opts{}.With("min-keep", -1)}.Normalize()
	if pe, ok := err.(*ParamError); !ok || pe.Param != "min-keep" || pe.Render(func(p string) string { return "kv." + JSONName(p) }) != "policy: kv.min_keep must not be negative, got -1" {
		t.Fatalf("%v", err)
	}
}

// TestOwnParams: a method's own parameters live in Opts (Config has a
// field only for the shared ones); a front end can set every parameter of
// every method on one Config, in any order, before Normalize refuses
// those the method does not take; the same values set in another order
// compare equal, and Float/Int read back what Set stored.
func TestOwnParams(t *testing.T) {
	shared := map[string]bool{"budget": true, "ratio": true, "window": true, "sinks": true, "agg": true,
		"pool": true, "kernel": true, "every": true, "positions": true}
	value := func(p *Param) any {
		switch p.Kind {
		case IntParam:
			return 3
		case FloatParam:
			return 0.5
		}
		return p.Choices[len(p.Choices)-1]
	}
	var own []*Param
	for _, p := range AllParams() {
		if (p.field == nil) == shared[p.Name] {
			t.Errorf("parameter %s: shared %v, but stored in a Config field %v", p.Name, shared[p.Name], p.field != nil)
		}
		if p.field == nil {
			own = append(own, p)
		}
	}
	set := func(ps []*Param) (c Config) {
		c.Method = "snapkv"
		for _, p := range ps {
			if err := p.Set(&c, value(p)); err != nil {
				t.Fatalf("Set %s: %v", p.Name, err)
			}
		}
		return c
	}
	rev := slices.Clone(own)
	slices.Reverse(rev)
	a, b := set(own), set(rev)
	if a != b {
		t.Fatalf("the same parameters in another order differ:\n%+v\n%+v", a, b)
	}
	for _, p := range own {
		var got any
		if p.Kind == IntParam {
			got = p.Int(a)
		} else {
			got = p.Float(a)
		}
		if got != value(p) {
			t.Errorf("%s: read %v, set %v", p.Name, got, value(p))
		}
	}
	all := set(AllParams())
	if _, err := all.Normalize(); err == nil || !strings.Contains(err.Error(), "snapkv takes no") {
		t.Fatalf("every parameter given to snapkv: %v", err)
	}
}
