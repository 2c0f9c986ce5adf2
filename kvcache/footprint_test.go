package kvcache

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// TestFootprintMatchesMemory: for every codec and several block sizes, what
// Footprint says a table holds after n tokens is what a real sequence
// reserves (Paged.Memory) and what the pool allocates per block, so kvcalc
// and inspect, which report Footprint, count the pool's bytes.
func TestFootprintMatchesMemory(t *testing.T) {
	L := Layout{Layers: 2, KVHeads: 3, HeadDim: 8}
	tables := L.Layers * L.KVHeads
	for _, name := range codec.Names {
		for _, B := range []int{1, 16, 32} {
			kc, err := codec.Parse(name, codec.Keys)
			if err != nil {
				t.Fatal(err)
			}
			vc, err := codec.Parse(name, codec.Values)
			if err != nil {
				t.Fatal(err)
			}
			t.Run(name+"/B="+strconv.Itoa(B), func(t *testing.T) {
				cfg := PoolConfig{Layout: L, BlockTokens: B, K: kc, V: vc, Tokens: 400}
				f, err := FootprintOf(cfg)
				if err != nil {
					t.Fatal(err)
				}
				p, err := NewPool(cfg)
				if err != nil {
					t.Fatal(err)
				}
				if p.BlockBytes() != f.BlockBytes || f.BlockBytes != kc.BlockBytes(B, 8)+vc.BlockBytes(B, 8)+4*B {
					t.Fatalf("block bytes: pool %d, footprint %d", p.BlockBytes(), f.BlockBytes)
				}
				s := p.NewSequence()
				defer s.Free()
				n := 0
				for _, to := range []int{1, 15, 16, 17, 127, 128, 129, 159, 160, 161, 191, 192, 300} {
					if err := appendTokens(t, s, n, to-n); err != nil {
						t.Fatal(err)
					}
					n = to
					m := s.Memory()
					blocks, res, _ := f.Table(n)
					if m.Blocks != tables*blocks || m.Reserved != int64(tables)*f.TableBytes(n) {
						t.Fatalf("%d tokens: memory %+v, footprint %d blocks (+%d residual tokens), %d B per table",
							n, m, blocks, res, f.TableBytes(n))
					}
					if want := int64(tables) * (int64(n-res)*int64(f.BlockBytes)/int64(B) + int64(res)*int64(f.ResidualSlotBytes)); m.Used != want {
						t.Fatalf("%d tokens: used %d, want %d", n, m.Used, want)
					}
				}
			})
		}
	}
}

// TestFootprintErrors: the checks NewPool makes, without a pool.
func TestFootprintErrors(t *testing.T) {
	k2, _ := codec.Parse("kivi2", codec.Keys)
	for _, c := range []struct {
		name string
		cfg  PoolConfig
		want string
	}{
		{"block 0", PoolConfig{Layout: Layout{Layers: 1, KVHeads: 1, HeadDim: 8}}, "block size must be between 1 and 65536 tokens, got 0"},
		{"kivi group", PoolConfig{Layout: Layout{Layers: 1, KVHeads: 1, HeadDim: 8}, BlockTokens: 48, K: k2}, "kivi2 key groups of 32 tokens must be a multiple of the block size 48"},
		{"keys as values", PoolConfig{Layout: Layout{Layers: 1, KVHeads: 1, HeadDim: 8}, BlockTokens: 16, V: k2}, "codec kivi2 cannot store values"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := FootprintOf(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}
