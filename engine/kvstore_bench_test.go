package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvlm/kvlm/internal/redistest"
	"github.com/kvlm/kvlm/kvstore"
)

// BenchmarkStoreCost is the shared tier's cost on one replica when
// nothing is shared: two engines over their own copies of stories260K,
// one with a store on a loopback redis-server, one without, each
// iteration one request of a fresh random prompt (so every lookup
// misses and every block is written) on each, in alternating order.
// Reported: the median time to first token and the median decode rate
// (tokens after the first over their time) of each.
//
//	go test ./engine/ -run '^$' -bench StoreCost -benchtime 40x
func BenchmarkStoreCost(b *testing.B) {
	srv := redistest.Start(b)
	st, err := kvstore.OpenRedis(kvstore.Options{URL: srv.URL()})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	mk := func(s kvstore.Store) *Engine {
		m, _ := loadStories(b)
		e := newEngine(b, m, Config{Store: s})
		<-e.fpDone
		return e
	}
	engines := [2]*Engine{mk(nil), mk(st)}
	const prompt, gen = 256, 200
	rng := rand.New(rand.NewPCG(1, 2))
	var ttft, tps [2][]float64
	one := func(e *Engine) (time.Duration, float64) {
		p := make([]int, prompt)
		p[0] = 1
		for i := 1; i < prompt; i++ {
			p[i] = 3 + rng.IntN(500)
		}
		t0 := time.Now()
		h, err := e.Submit(GenRequest{Prompt: p, MaxTokens: gen})
		if err != nil {
			b.Fatal(err)
		}
		var first, last time.Time
		n := 0
		for {
			ev, err := h.Next(context.Background())
			if err != nil {
				break
			}
			if ev.Done {
				continue
			}
			if n == 0 {
				first = time.Now()
			}
			last = time.Now()
			n++
		}
		if n != gen {
			b.Fatalf("%d tokens", n)
		}
		return first.Sub(t0), float64(n-1) / last.Sub(first).Seconds()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := range 2 {
			j := (i + k) % 2 // alternate which goes first
			d, r := one(engines[j])
			ttft[j] = append(ttft[j], float64(d.Microseconds())/1000)
			tps[j] = append(tps[j], r)
		}
	}
	b.StopTimer()
	med := func(x []float64) float64 { s := slices.Clone(x); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(med(ttft[0]), "ttft_ms_plain")
	b.ReportMetric(med(ttft[1]), "ttft_ms_store")
	b.ReportMetric(med(tps[0]), "decode_tok/s_plain")
	b.ReportMetric(med(tps[1]), "decode_tok/s_store")
	s := engines[1].StoreStats()
	if s.Written == 0 || s.HitBlocks != 0 {
		b.Fatalf("store stats %+v: want writes and no hits", s)
	}
	b.ReportMetric(float64(s.Written)/float64(b.N), "blocks_written/op")
}
