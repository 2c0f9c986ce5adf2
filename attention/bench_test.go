package attention

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// BenchmarkDecode measures one decode step of attention (one query token,
// 1 KV head × 8 query heads, head dim 128: one GQA group, so the split is
// the only parallelism) against caches of 1K to 64K
// tokens, split into parallel chunks (FlashDecoding) or in a single pass,
// for each storage codec. Metrics: ns per token (per step) and the KV bytes
// the step reads.
func BenchmarkDecode(b *testing.B) {
	const heads, G, hd = 1, 8, 128
	rng := rand.New(rand.NewPCG(1, 1))
	for _, cn := range []string{"f32", "f16", "q8", "q4", "q8dot", "q4dot", "kivi4", "kivi2"} {
		kc, _ := codec.Parse(cn, codec.Keys)
		vc, _ := codec.Parse(cn, codec.Values)
		for _, ctx := range []int{1 << 10, 1 << 12, 1 << 14, 1 << 16} {
			f := build(b, rng, heads, G, hd, ctx, 16, kc, vc)
			bytes := f.seq.Bytes()
			q := make([]float32, heads*G*hd)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			out := make([]float32, len(q))
			for _, split := range []bool{true, false} {
				name := fmt.Sprintf("%s/ctx=%d/split=%v", cn, ctx, split)
				b.Run(name, func(b *testing.B) {
					bt := Batch{Heads: heads, G: G, HeadDim: hd, Norm: float32(math.Sqrt(hd)), Q: q, Out: out,
						Pos: []int32{int32(ctx)}, Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }}
					if !split {
						bt.SplitMin = -1
					}
					var sc Scratch
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						bt.Run(&sc)
					}
					b.ReportMetric(float64(bytes), "kv-bytes/token")
				})
			}
			f.seq.Free()
		}
	}
}

// BenchmarkPrefill measures one layer's attention over a 515-token prompt
// run in chunks of 128 (as model.Sequence.Forward does), TinyLlama's shape:
// 4 KV heads × 8 query heads, head dim 64, blocks of 16. Each chunk sees the
// cache as it is then (the prompt up to the chunk's end).
func BenchmarkPrefill(b *testing.B) {
	const heads, G, hd, tokens, chunk = 4, 8, 64, 515, 128
	rng := rand.New(rand.NewPCG(2, 2))
	for _, cn := range []string{"f32", "f16", "q8"} {
		kc, _ := codec.Parse(cn, codec.Keys)
		vc, _ := codec.Parse(cn, codec.Values)
		f := build(b, rng, heads, G, hd, tokens, 16, kc, vc)
		stride := heads * G * hd
		q := make([]float32, chunk*stride)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		out := make([]float32, len(q))
		b.Run(cn, func(b *testing.B) {
			var sc Scratch
			for i := 0; i < b.N; i++ {
				for c0 := 0; c0 < tokens; c0 += chunk {
					c1 := min(c0+chunk, tokens)
					pos := make([]int32, c1-c0)
					for t := range pos {
						pos[t] = int32(c0 + t)
					}
					bt := Batch{Heads: heads, G: G, HeadDim: hd, Norm: float32(math.Sqrt(hd)), Q: q[:len(pos)*stride], Out: out[:len(pos)*stride],
						Pos: pos, Segs: func(h int) []kvcache.Segment {
							var segs []kvcache.Segment
							for _, s := range f.seq.Segments(0, h) {
								if s.Pos[0] >= int32(c1) {
									break
								}
								n := 0
								for n < s.N && s.Pos[n] < int32(c1) {
									n++
								}
								s.N, s.Pos = n, s.Pos[:n]
								segs = append(segs, s)
							}
							return segs
						}}
					bt.Run(&sc)
				}
			}
			b.ReportMetric(float64(b.N)*tokens/b.Elapsed().Seconds(), "tok/s")
		})
		f.seq.Free()
	}
}

// BenchmarkDecodeGQA measures one decode step of one layer's attention in
// TinyLlama's shape (4 KV heads × 8 query heads, head dim 64, blocks of
// 16) against caches of 512, 2048 and 16384 tokens: what decode at long
// context adds per layer, for each storage codec. Metric: KV bytes read per
// step.
func BenchmarkDecodeGQA(b *testing.B) {
	const heads, G, hd = 4, 8, 64
	rng := rand.New(rand.NewPCG(3, 3))
	for _, cn := range []string{"f32", "f16", "q8", "q4", "q8dot", "q4dot", "kivi2"} {
		kc, _ := codec.Parse(cn, codec.Keys)
		vc, _ := codec.Parse(cn, codec.Values)
		for _, ctx := range []int{512, 2048, 16384} {
			f := build(b, rng, heads, G, hd, ctx, 16, kc, vc)
			q := make([]float32, heads*G*hd)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			out := make([]float32, len(q))
			b.Run(fmt.Sprintf("%s/ctx=%d", cn, ctx), func(b *testing.B) {
				bt := Batch{Heads: heads, G: G, HeadDim: hd, Norm: float32(math.Sqrt(hd)), Q: q, Out: out,
					Pos: []int32{int32(ctx)}, Segs: func(h int) []kvcache.Segment { return f.seq.Segments(0, h) }}
				var sc Scratch
				for b.Loop() {
					bt.Run(&sc)
				}
				b.ReportMetric(float64(f.seq.Bytes()), "kv-bytes/token")
			})
			f.seq.Free()
		}
	}
}

// BenchmarkPrefillOneStep measures one layer's attention over a 2048-token
// prompt run as one step of 2048 queries (as PyramidInfer's prefill does)
// and in chunks of 128 (each chunk against the cache up to its end), in
// stories260K's shape (4 KV heads × 2 query heads, head dim 8) and
// TinyLlama's (4 × 8, head dim 64), f32 cache in blocks of 16. The two
// compute the same outputs; the one-step rows are causally masked over the
// whole prompt.
func BenchmarkPrefillOneStep(b *testing.B) {
	const tokens, chunk = 2048, 128
	for _, sh := range []struct {
		name         string
		heads, G, hd int
	}{{"stories260K", 4, 2, 8}, {"tinyllama", 4, 8, 64}} {
		rng := rand.New(rand.NewPCG(4, 4))
		f := build(b, rng, sh.heads, sh.G, sh.hd, tokens, 16, codec.F32, codec.F32)
		stride := sh.heads * sh.G * sh.hd
		q := make([]float32, tokens*stride)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		out := make([]float32, len(q))
		pos := make([]int32, tokens)
		for t := range pos {
			pos[t] = int32(t)
		}
		for _, step := range []int{tokens, chunk} {
			b.Run(fmt.Sprintf("%s/step=%d", sh.name, step), func(b *testing.B) {
				var sc Scratch
				for b.Loop() {
					for c0 := 0; c0 < tokens; c0 += step {
						c1 := min(c0+step, tokens)
						bt := Batch{Heads: sh.heads, G: sh.G, HeadDim: sh.hd, Norm: float32(math.Sqrt(float64(sh.hd))),
							Q: q[c0*stride : c1*stride], Out: out[c0*stride : c1*stride], Pos: pos[c0:c1],
							Segs: func(h int) []kvcache.Segment { return upTo(f.seq.Segments(0, h), int32(c1)) }}
						bt.Run(&sc)
					}
				}
			})
		}
		f.seq.Free()
	}
}

// upTo returns the segments' slots at positions below end (segments in
// position order, as a prompt's are).
func upTo(segs []kvcache.Segment, end int32) []kvcache.Segment {
	var out []kvcache.Segment
	for _, s := range segs {
		if s.Pos[0] >= end {
			break
		}
		n := 0
		for n < s.N && s.Pos[n] < end {
			n++
		}
		s.N, s.Pos = n, s.Pos[:n]
		out = append(out, s)
	}
	return out
}

// BenchmarkDecodeStep measures the attention of a whole decode step of a
// TinyLlama-shaped model (22 layers × 4 KV heads × 8 query heads, head dim
// 64, blocks of 16) after 16,384 tokens, the layers one after another as a
// forward pass runs them, so that the cache (358 MiB in f16) streams from
// memory as in `kvlm bench`, where one layer's (BenchmarkDecodeGQA) may sit
// in the L3. Metric: the KV bytes a step reads.
func BenchmarkDecodeStep(b *testing.B) {
	const layers, heads, G, hd, ctx, chunk = 22, 4, 8, 64, 16384, 512
	rng := rand.New(rand.NewPCG(5, 5))
	k, v := make([]float32, chunk*heads*hd), make([]float32, chunk*heads*hd)
	for i := range k {
		k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	q := make([]float32, heads*G*hd)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	out := make([]float32, len(q))
	pos := make([]int32, chunk)
	for _, cn := range []string{"f16", "q8", "q4", "q8dot", "q4dot", "kivi2"} {
		kc, _ := codec.Parse(cn, codec.Keys)
		vc, _ := codec.Parse(cn, codec.Values)
		pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: kvcache.Layout{Layers: layers, KVHeads: heads, HeadDim: hd},
			BlockTokens: 16, K: kc, V: vc, Tokens: ctx})
		if err != nil {
			b.Fatal(err)
		}
		seq := pool.NewSequence()
		for lo := 0; lo < ctx; lo += chunk {
			for i := range pos {
				pos[i] = int32(lo + i)
			}
			for l := range layers {
				if err := seq.Append(l, pos, k, v); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(fmt.Sprintf("%s/ctx=%d", cn, ctx), func(b *testing.B) {
			bt := make([]Batch, layers)
			for l := range bt {
				bt[l] = Batch{Heads: heads, G: G, HeadDim: hd, Norm: float32(math.Sqrt(hd)), Q: q, Out: out,
					Pos: []int32{ctx}, Segs: func(h int) []kvcache.Segment { return seq.Segments(l, h) }}
			}
			var sc Scratch
			for b.Loop() {
				for l := range bt {
					bt[l].Run(&sc)
				}
			}
			b.ReportMetric(float64(seq.Bytes()), "kv-bytes/step")
		})
		seq.Free()
	}
}
