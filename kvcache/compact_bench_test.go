package kvcache

import (
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// BenchmarkKeepSlide is StreamingLLM's decode-time prune on a
// TinyLlama-shaped cache (22 layers × 4 KV heads of 64, blocks of 16):
// each op appends one token to every layer and drops, in every table,
// the oldest token after 4 sinks, so that 1,024 stay (the slide every
// decode step of `--kv-policy streaming --kv-sinks 4 --kv-window 1020`
// pays: the window behind the evicted slot compacted one slot down), for
// the f16, q8 and q4 codecs; each named by the kept slots (Keep) and by
// the dropped one (Drop, what a policy's decode step calls).
func BenchmarkKeepSlide(b *testing.B) {
	const sinks, budget = 4, 1024
	L := Layout{Layers: 22, KVHeads: 4, HeadDim: 64}
	for _, c := range []struct {
		name string
		k, v codec.Codec
	}{{"f16", codec.F16Keys, codec.F16}, {"q8", codec.Q8Keys, codec.Q8}, {"q4", codec.Q4Keys, codec.Q4}} {
		for _, drop := range []bool{false, true} {
			name := c.name
			if drop {
				name += "/drop"
			}
			b.Run(name, func(b *testing.B) {
				p, err := NewPool(PoolConfig{Layout: L, BlockTokens: DefaultBlockTokens, Tokens: budget + 2*DefaultBlockTokens, K: c.k, V: c.v})
				if err != nil {
					b.Fatal(err)
				}
				s := p.NewSequence()
				if err := appendTokens(b, s, 0, budget); err != nil {
					b.Fatal(err)
				}
				keep := make([]int, 0, budget)
				for i := range budget + 1 {
					if i != sinks {
						keep = append(keep, i)
					}
				}
				gone := []int{sinks}
				next := budget
				for b.Loop() {
					if err := appendTokens(b, s, next, 1); err != nil {
						b.Fatal(err)
					}
					next++
					for l := range L.Layers {
						for h := range L.KVHeads {
							var err error
							if drop {
								err = s.Drop(l, h, gone)
							} else {
								err = s.Keep(l, h, keep)
							}
							if err != nil {
								b.Fatal(err)
							}
						}
					}
				}
			})
		}
	}
}
