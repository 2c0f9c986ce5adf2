package kvcalc

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
)

// archModel is a small GQA model of 12 layers to put maps on.
var archModel = Model{Name: "arch", Layers: 12, Heads: 8, KVHeads: 2, HeadDim: 16, Dim: 128, HiddenDim: 256, Vocab: 100, Context: 4096, Params: 1_000_000}

// archCases are each architecture's map and, written out by hand, the
// cache a kvlm pool keeps for it: the owner layers and their bounds.
func archCases(t *testing.T) []struct {
	name string
	m    Map
	want kvcache.Layout
} {
	t.Helper()
	must := func(m Map, err error) Map {
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	l := func(layers int, w ...int) kvcache.Layout {
		return kvcache.Layout{Layers: layers, KVHeads: 2, HeadDim: 16, Windows: w}
	}
	cla2w := must(CLA(12, 2))
	cla2w.Windows = []int{40, 40, 0, 0, 40, 40, 0, 0, 40, 40, 0, 0}
	return []struct {
		name string
		m    Map
		want kvcache.Layout
	}{
		{"cla2", must(CLA(12, 2)), l(6)},                              // layers 0 2 4 … own
		{"cla3", must(CLA(12, 3)), l(4)},                              // 0 3 6 9
		{"yoco", must(YOCO(12, 32)), l(7, 32, 32, 32, 32, 32, 32, 0)}, // 6 self-decoder layers of window 32, one global
		{"lckv", must(LCKV(12, 2)), l(3)},                             // warmups 0 1, the top layer 11
		{"local-global", must(LocalGlobal(12, 5, 24)), l(12, 24, 24, 24, 24, 24, 0, 24, 24, 24, 24, 24, 0)},
		{"window", Map{Windows: []int{50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50}}, l(12, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50)},
		{"cla2-windows", cla2w, l(6, 40, 0, 40, 0, 40, 0)}, // a group is bounded only if both its layers are
		{"plain", Map{}, l(12)},
	}
}

// TestArchitecturesMatchPool: for each architecture, codec and chunk,
// kvcalc's bytes are a real kvlm pool's over the layout written out by
// hand: the whole cache after the kept tokens arrive a chunk at a time
// (TotalBytes, Blocks), the bytes one more decoded token adds
// (BytesPerToken, measured over 256 tokens of decoding), the bound of the
// window-bounded layers (flat while decoding) and the --kv-mem that
// admits it (never exceeded).
func TestArchitecturesMatchPool(t *testing.T) {
	for _, a := range archCases(t) {
		m, err := WithMap(archModel, a.m)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Layout(); !reflect.DeepEqual(got, a.want) {
			t.Fatalf("%s: layout %+v, want %+v", a.name, got, a.want)
		}
		for _, cn := range []Codec{F16, Q8, KIVI4} {
			for _, chunk := range []int{128, 1, 37} {
				t.Run(fmt.Sprintf("%s/%s/chunk%d", a.name, cn, chunk), func(t *testing.T) {
					const kept = 300
					c, err := New(m, Options{K: cn, V: cn, Chunk: chunk})
					if err != nil {
						t.Fatal(err)
					}
					r, err := c.Row(1, kept)
					if err != nil {
						t.Fatal(err)
					}
					kc, _ := codec.Parse(string(cn), codec.Keys)
					vc, _ := codec.Parse(string(cn), codec.Values)
					p, err := kvcache.NewPool(kvcache.PoolConfig{Layout: a.want, BlockTokens: 16, K: kc, V: vc, Tokens: 2000})
					if err != nil {
						t.Fatal(err)
					}
					s := p.NewSequence()
					defer s.Free()
					var peak int64
					for p0 := 0; p0 < kept; p0 += chunk {
						appendAll(t, s, p0, min(chunk, kept-p0))
						peak = max(peak, p.Usage().BytesUsed)
					}
					if mem := s.Memory(); mem.Reserved != r.TotalBytes || int64(mem.Blocks) != r.Blocks {
						t.Fatalf("pool holds %d B in %d blocks, kvcalc says %d B in %d", mem.Reserved, mem.Blocks, r.TotalBytes, r.Blocks)
					}
					// Decode to 512 (aligned with blocks and KIVI groups), then 256 more.
					bytesAt := map[int]int64{}
					for n := kept; n < 768; n++ {
						appendAll(t, s, n, 1)
						peak = max(peak, p.Usage().BytesUsed)
						if n+1 == 512 || n+1 == 768 {
							bytesAt[n+1] = s.Memory().Reserved
						}
					}
					if got := float64(bytesAt[768]-bytesAt[512]) / 256; got != r.BytesPerToken {
						t.Fatalf("one more token takes %v B in the pool, kvcalc says %v", got, r.BytesPerToken)
					}
					if a.want.Windowed() {
						if r.WindowBytes <= 0 || r.WindowBytes > c.BoundBytes() {
							t.Fatalf("window bytes %d, bound %d", r.WindowBytes, c.BoundBytes())
						}
					}
					if r2 := mustRow(t, m, Options{K: cn, V: cn, Chunk: chunk}, 1, 768); peak > r2.KVMemBytes {
						t.Fatalf("the pool used %d B at most, kvcalc's --kv-mem is %d", peak, r2.KVMemBytes)
					}
				})
			}
		}
	}
}

// appendAll appends n tokens at start to every layer of s.
func appendAll(t *testing.T, s *kvcache.Paged, start, n int) {
	t.Helper()
	L := s.Layout()
	w := L.KVHeads * L.HeadDim
	k, v := make([]float32, n*w), make([]float32, n*w)
	pos := make([]int32, n)
	for i := range pos {
		pos[i] = int32(start + i)
		for j := range w {
			k[i*w+j] = float32((start+i)%7) - 3
			v[i*w+j] = float32(j%5) - 2
		}
	}
	for l := range L.Layers {
		if err := s.Append(l, pos, k, v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMapFromConfig: a model read from a file carries its map as
// model.Config has it (what ConfigFromGGUF reads from the GGUF keys), and
// gives the bytes of the same architecture described by the map's
// builders on a preset-like shape.
func TestMapFromConfig(t *testing.T) {
	for _, a := range archCases(t) {
		cfg := model.Config{Layers: 12, Heads: 8, KVHeads: 2, HeadDim: 16, Dim: 128, HiddenDim: 256, Vocab: 100, CtxLen: 4096,
			KVSource: a.m.Source, LayerWindows: a.m.Windows}
		file := fromConfig("arch.gguf", cfg)
		desc, err := WithMap(archModel, a.m)
		if err != nil {
			t.Fatal(err)
		}
		for _, seq := range []int{1, 100, 4096} {
			rf, rd := mustRow(t, file, Options{}, 3, seq), mustRow(t, desc, Options{}, 3, seq)
			rf.WeightsBytes, rf.KVToWeights, rf.KVPlusWeightsBytes = rd.WeightsBytes, rd.KVToWeights, rd.KVPlusWeightsBytes // the file has no tensors here
			if !reflect.DeepEqual(rf, rd) {
				t.Errorf("%s, %d tokens: from the config %+v, from the map %+v", a.name, seq, rf, rd)
			}
		}
	}
	// A sliding window in the file bounds every layer.
	file := fromConfig("swa.gguf", model.Config{Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 16, SlidingWindow: 64})
	if l := file.Layout(); !reflect.DeepEqual(l.Windows, []int{64, 64, 64, 64}) {
		t.Errorf("sliding window 64: layout %+v", l)
	}
}

// TestMapParams: layers that no longer own KV lose their K and V
// projections; the bytes per token follow the owners.
func TestMapParams(t *testing.T) {
	base := mustPreset(t, "llama3-8b")
	cla, err := CLA(base.Layers, 2)
	if err != nil {
		t.Fatal(err)
	}
	m, err := WithMap(base, cla)
	if err != nil {
		t.Fatal(err)
	}
	if want := base.Params - 16*2*4096*8*128; m.Params != want {
		t.Errorf("CLA2 params %d, want %d", m.Params, want)
	}
	r0, r := mustRow(t, base, Options{}, 1, 8192), mustRow(t, m, Options{}, 1, 8192)
	if r.TotalBytes*2 != r0.TotalBytes || r.FormulaBytesPerToken*2 != r0.FormulaBytesPerToken {
		t.Errorf("CLA2 halves the cache: %d of %d B, %v of %v B per token", r.TotalBytes, r0.TotalBytes, r.FormulaBytesPerToken, r0.FormulaBytesPerToken)
	}
}

// TestMapErrors: maps the forward pass could not run, and builders given
// impossible shapes, are refused with a one-line reason.
func TestMapErrors(t *testing.T) {
	bad := func(mp Map, err error) error {
		if err != nil {
			return err
		}
		_, err = WithMap(archModel, mp)
		return err
	}
	src := make([]int, 12)
	for i := range src {
		src[i] = i
	}
	chain := append([]int(nil), src...)
	chain[2], chain[3] = 1, 2 // layer 3 reads 2, which reads 1
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"cla 0", bad(CLA(12, 0)), "CLA groups of 0 layers"},
		{"cla 13", bad(CLA(12, 13)), "CLA groups of 13 layers"},
		{"yoco window", bad(YOCO(12, 0)), "window 0 must be positive"},
		{"lckv warmup", bad(LCKV(12, 12)), "LCKV warmup of 12 layers"},
		{"local-global", bad(LocalGlobal(12, 0, 8)), "both must be positive"},
		{"short map", bad(Map{Source: []int{0, 0}}, nil), "2 entries for 12 layers"},
		{"out of range", bad(Map{Source: append(src[:11:11], 12)}, nil), "reads layer 12, not a layer"},
		{"chain", bad(Map{Source: chain}, nil), "a layer that others read must read its own"},
		{"windows", bad(Map{Windows: []int{1}}, nil), "1 layer windows for 12 layers"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, c.err, c.want)
		}
	}
	m, _ := WithMap(archModel, Map{Windows: make([]int, 12)})
	if _, err := WithMap(m, Map{}); err == nil || !strings.Contains(err.Error(), "already has a KV map") {
		t.Errorf("a second map: %v", err)
	}
}
