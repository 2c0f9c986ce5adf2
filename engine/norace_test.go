//go:build !race

package engine

// raceEnabled: the race detector slows token-by-token tests ~10x.
const raceEnabled = false
