package model

import "testing"

// TinyArch builds the tiny random-weight GGUF of newArchs' case name for
// the package's external tests, and returns its path and its float64
// reference (refArchRun with the case's steps) over the cache kept
// describes (see refCache).
func TinyArch(t testing.TB, name string) (string, func(tokens []int, kept func(t, layer int) (idx, pos []int, qpos int)) [][]float64) {
	t.Helper()
	for _, a := range newArchs {
		if a.name == name {
			path, w := a.spec.build(t)
			return path, func(tokens []int, kept func(t, layer int) (idx, pos []int, qpos int)) [][]float64 {
				return refArchRun(a.spec, w, tokens, a.steps, kept)
			}
		}
	}
	t.Fatalf("no tiny architecture %q", name)
	return "", nil
}
