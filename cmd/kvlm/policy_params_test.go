package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/policy"
)

// minimalFlags is a configuration of method that runs: a budget where it
// takes one (window methods derive their window from it).
func minimalFlags(method string) []string {
	if slices.Contains(policy.Params(method), "budget") {
		return []string{"--kv-budget", "40"}
	}
	return nil
}

// TestPolicyParamsDerived: every parameter of every registered method is
// a --kv-NAME flag of generate and ppl with its descriptor's help; every
// method runs end to end through kvlm generate; a method's own parameter
// given at its default value changes nothing, and given to a method that
// does not use it is refused naming the flag.
func TestPolicyParamsDerived(t *testing.T) {
	s := storiesFiles(t)
	for _, cmd := range []string{"generate", "ppl"} {
		help, _, code := kvlm(t, cmd, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d", cmd, code)
		}
		for _, p := range policy.AllParams() {
			if !strings.Contains(help, policy.Flag(p.Name)+" ") || !strings.Contains(help, p.Doc) {
				t.Errorf("%s --help lacks %s (%s)", cmd, policy.Flag(p.Name), p.Doc)
			}
		}
	}
	gen := func(t *testing.T, args ...string) (generateJSON, string, int) {
		t.Helper()
		out, errOut, code := kvlm(t, append([]string{"generate", "-m", s.gguf, "-p", strings.Repeat("Once upon a time there was a little girl who liked to play with her cat. ", 6), "-n", "6", "--temp", "0", "--json"}, args...)...)
		var r generateJSON
		if code == 0 {
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
		}
		return r, errOut, code
	}
	full, errOut, code := gen(t)
	if code != 0 {
		t.Fatalf("full: exit %d: %s", code, errOut)
	}
	for _, method := range policy.Methods {
		m, _ := policy.Lookup(method)
		t.Run(method, func(t *testing.T) {
			base := append([]string{"--kv-policy", method}, minimalFlags(method)...)
			want, errOut, code := gen(t, base...)
			if code != 0 {
				t.Fatalf("%v: exit %d: %s", base, code, errOut)
			}
			if method != "full" && method != "minicache" && want.KVBytes >= full.KVBytes {
				t.Fatalf("%v: %d KV bytes, uncompressed %d", base, want.KVBytes, full.KVBytes)
			}
			for _, p := range m.Own {
				if p.Fill == 0 {
					continue
				}
				args := append(slices.Clone(base), policy.Flag(p.Name), fmt.Sprint(p.Fill))
				got, errOut, code := gen(t, args...)
				if code != 0 || !slices.Equal(got.Tokens, want.Tokens) || !slices.Equal(got.KeptPerLayer, want.KeptPerLayer) {
					t.Errorf("%v: exit %d %s, tokens %v kept %v; without it %v kept %v", args, code, errOut, got.Tokens, got.KeptPerLayer, want.Tokens, want.KeptPerLayer)
				}
				other := "full"
				if method == "full" {
					continue
				}
				_, errOut, code = gen(t, "--kv-policy", other, policy.Flag(p.Name), fmt.Sprint(p.Fill))
				if code != 1 || !strings.Contains(errOut, "full takes no "+policy.Flag(p.Name)) {
					t.Errorf("%s given to full: exit %d, %q", policy.Flag(p.Name), code, errOut)
				}
			}
		})
	}
}
