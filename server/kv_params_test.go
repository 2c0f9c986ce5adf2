package server

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/policy"
)

// TestKVParamsDerived: every registered method runs through the kv
// object, and every method's own parameter is a kv field (its name with
// '_' for '-'): accepted at its default by the method, refused by full
// with a 400 naming kv.NAME, in the message and in param.
func TestKVParamsDerived(t *testing.T) {
	f := newFixture(t, engine.Config{}, Options{})
	prompt := storyIDs(t, f, 120)
	post := func(kv map[string]any) (int, map[string]any) {
		return f.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "temperature": 0, "kv": kv})
	}
	for _, method := range policy.Methods {
		m, _ := policy.Lookup(method)
		t.Run(method, func(t *testing.T) {
			kv := map[string]any{"policy": method}
			if slices.Contains(m.Params, "budget") {
				kv["budget"] = 40
			}
			code, body := post(kv)
			if code != 200 {
				t.Fatalf("%v: status %d %v", kv, code, body)
			}
			u := usageOfBody(body)["kv"].(map[string]any)
			if method != "full" && method != "minicache" && u["evicted_tokens"].(float64) <= 0 {
				t.Fatalf("%v: nothing evicted: %v", kv, u)
			}
			for _, p := range m.Own {
				if p.Fill == 0 {
					continue
				}
				name := policy.JSONName(p.Name)
				with := map[string]any{name: p.Fill}
				for k, v := range kv {
					with[k] = v
				}
				if code, body := post(with); code != 200 {
					t.Errorf("%v: status %d %v", with, code, body)
				}
				code, body := post(map[string]any{"policy": "full", name: p.Fill})
				e, _ := body["error"].(map[string]any)
				msg, _ := e["message"].(string)
				if code != 400 || e["param"] != "kv."+name || !strings.Contains(msg, "full takes no kv."+name) {
					t.Errorf("kv.%s given to full: status %d, %v", name, code, body)
				}
			}
		})
	}
}
