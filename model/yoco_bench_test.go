//go:build unix

package model

import (
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkYOCOPrefill times a prompt's prefill (the last token's logits
// wanted) on gen-model's yoco shape (width 256, 8 layers, GQA 4:2, a
// self-decoder of 4 layers with window 64, then one global KV owner read by
// the 3 layers above it) against the same weights run as a plain model
// (every layer its own KV, full attention: the map and windows removed and
// layers 5-7 given K/V projections), and against YOCO without the prefill
// early exit. rows/layer-token is Sequence.RowLayers over tokens × layers;
// cpu-s/op the process's CPU seconds per prefill (all threads), which a
// machine shared with other work does not inflate as it does wall time.
//
//	nice go test -run X -bench YOCOPrefill -benchtime 1x ./model/
func BenchmarkYOCOPrefill(b *testing.B) {
	plain := synthModel(b, 256, 512, 8, 4, 2, 32000, 4096)
	yoco := &Model{Config: plain.Config, TokEmb: plain.TokEmb, OutNorm: plain.OutNorm, Output: plain.Output}
	yoco.KVSource = []int{0, 1, 2, 3, 4, 4, 4, 4}
	yoco.LayerWindows = []int{64, 64, 64, 64, 0, 0, 0, 0}
	yoco.Layers = append([]Layer(nil), plain.Layers...)
	for i := 5; i < 8; i++ {
		yoco.Layers[i].Wk, yoco.Layers[i].Wv = nil, nil
	}
	if err := yoco.check(); err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{512, 4096} {
		r := rand.New(rand.NewPCG(1, uint64(n)))
		prompt := make([]int, n)
		for i := range prompt {
			prompt[i] = r.IntN(plain.Vocab)
		}
		for _, c := range []struct {
			name   string
			m      *Model
			noExit bool
		}{{"plain", plain, false}, {"yoco", yoco, false}, {"yoco-no-exit", yoco, true}} {
			b.Run(c.name+"/"+itoa(n), func(b *testing.B) {
				rows := 0
				cpu0 := cpuTime()
				for b.Loop() {
					seq, err := c.m.NewStandaloneSequence(KVOptions{Tokens: n})
					if err != nil {
						b.Fatal(err)
					}
					seq.noEarlyExit = c.noExit
					if _, err := seq.Forward(prompt, false); err != nil {
						b.Fatal(err)
					}
					rows = seq.RowLayers
					seq.Close()
				}
				b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
				b.ReportMetric(float64(rows)/float64(n*c.m.Config.Layers), "rows/layer-token")
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}
