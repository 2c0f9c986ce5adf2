package kvcache_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/policy"
)

// TestAttentionOverMergedTables: attention over the tables of a merged
// pair (shared directions with per-layer norms, retained slots, newer
// ordinary slots, out of position order) equals naive float64 attention
// over the restored vectors x̂ = ‖x‖·e (and the retained ones as stored),
// for decode (split and unsplit), a causal batch and the attention mass.
// With f32 storage the restored vectors are those of a float64 SLERP of
// the appended ones.
func TestAttentionOverMergedTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	const L, H, G, d, T = 4, 2, 3, 16, 700
	for _, names := range [][2]string{{"f32", "f32"}, {"q8", "q4"}, {"kivi4", "kivi4"}} {
		kc, _ := codec.Parse(names[0], codec.Keys)
		vc, _ := codec.Parse(names[1], codec.Values)
		t.Run(names[0]+"_"+names[1], func(t *testing.T) {
			p, err := kvcache.NewPool(kvcache.PoolConfig{Layout: kvcache.Layout{Layers: L, KVHeads: H, HeadDim: d}, BlockTokens: 16, K: kc, V: vc, Tokens: T})
			if err != nil {
				t.Fatal(err)
			}
			s := p.NewSequence()
			defer s.Free()
			w := H * d
			k, v := make([][]float32, L), make([][]float32, L)
			base := make([]float32, 2*T*w)
			for i := range base {
				base[i] = float32(rng.NormFloat64())
			}
			pos := make([]int32, T)
			for i := range pos {
				pos[i] = int32(i)
			}
			for l := 0; l < L; l++ {
				k[l], v[l] = make([]float32, T*w), make([]float32, T*w)
				for i := range k[l] {
					k[l][i] = base[i]*(1+0.3*float32(l)) + 0.4*float32(rng.NormFloat64())
					v[l][i] = base[T*w+i] + 0.4*float32(rng.NormFloat64())
				}
			}
			// 600 tokens, a merge, then 100 more (ordinary slots after the merged ones).
			for _, r := range [][2]int{{0, 600}, {600, T}} {
				for l := 0; l < L; l++ {
					if err := s.Append(l, pos[r[0]:r[1]], k[l][r[0]*w:r[1]*w], v[l][r[0]*w:r[1]*w]); err != nil {
						t.Fatal(err)
					}
				}
				if r[0] == 0 {
					if _, err := policy.MergeLayers(s, 3, policy.MergeOptions{T: 0.6, Gamma: 0.05}); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, layer := range []int{2, 3} {
				// The restored vectors, read back through the segments.
				keys, vals := make([][][]float64, H), make([][][]float64, H)
				spos := make([][]int32, H)
				row := make([]float32, d)
				mergedSlots := 0
				for h := 0; h < H; h++ {
					for _, sg := range s.Segments(layer, h) {
						for i := 0; i < sg.N; i++ {
							km, vm := 1.0, 1.0
							if sg.KMag != nil {
								km, vm = float64(sg.KMag[i]), float64(sg.VMag[i])
								mergedSlots++
							}
							sg.KC.Get(sg.K, sg.Cap, d, i, row)
							kr := make([]float64, d)
							for c := range row {
								kr[c] = km * float64(row[c])
							}
							sg.VC.Get(sg.V, sg.Cap, d, i, row)
							vr := make([]float64, d)
							for c := range row {
								vr[c] = vm * float64(row[c])
							}
							keys[h], vals[h] = append(keys[h], kr), append(vals[h], vr)
							spos[h] = append(spos[h], sg.Pos[i])
							if names[0] == "f32" && sg.KMag != nil {
								// x̂ = ‖x‖·SLERP of the appended vectors.
								q := int(sg.Pos[i])
								e := make([]float32, d)
								o := q*w + h*d
								_, nl, nu := policy.Slerp(k[2][o:o+d], k[3][o:o+d], 0.6, e)
								n := nl
								if layer == 3 {
									n = nu
								}
								for c := range e {
									if math.Abs(float64(e[c])*n-kr[c]) > 1e-5*math.Max(1, n) {
										t.Fatalf("layer %d head %d position %d: restored key %v, SLERP %v", layer, h, q, kr[c], float64(e[c])*n)
									}
								}
							}
						}
					}
				}
				if mergedSlots < H*400 { // KIVI: 448 sealed tokens, the residual stays
					t.Fatalf("layer %d: only %d merged slots", layer, mergedSlots)
				}
				checkAttention(t, rng, H, G, d, T, func(h int) []kvcache.Segment { return s.Segments(layer, h) }, keys, vals, spos, []attnCase{
					{qpos: []int32{T - 1}, splitMin: -1},
					{qpos: []int32{T - 1}, splitMin: 1},
					{qpos: []int32{300}, splitMin: 1},
					{qpos: pos[T-24:], mass: true},
					{qpos: pos[T-24:], online: true},
				}, fmt.Sprintf("layer %d", layer))
			}
		})
	}
}

// naive is float64 attention of one query head over explicit rows, masked
// by position; it also returns the probabilities.
func naive(q []float32, keys, vals [][]float64, pos []int32, qpos int32, norm float64) (out, prob []float64) {
	prob = make([]float64, len(keys))
	out = make([]float64, len(q))
	mx := math.Inf(-1)
	for i, k := range keys {
		prob[i] = math.Inf(-1)
		if pos[i] > qpos {
			continue
		}
		s := 0.0
		for c := range q {
			s += float64(q[c]) * k[c]
		}
		prob[i] = s / norm
		mx = math.Max(mx, prob[i])
	}
	sum := 0.0
	for i := range prob {
		prob[i] = math.Exp(prob[i] - mx)
		sum += prob[i]
	}
	for i := range prob {
		prob[i] /= sum
		for c := range out {
			out[c] += prob[i] * vals[i][c]
		}
	}
	return out, prob
}
