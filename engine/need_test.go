package engine

import (
	"strings"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

// TestEngineAdmitsByCacheBytes: the engine admits what the cache says a
// request takes (kvcache.Pool.AdmitBytes), not a count of blocks of its
// own. A KIVI request whose tokens all stay in the full-precision
// residual takes no block, so it runs under a budget of a few blocks per
// table; a prompt that does need more blocks than the whole pool is
// refused at once, naming the bytes.
func TestEngineAdmitsByCacheBytes(t *testing.T) {
	m, tok := loadStories(t)
	l := m.KVLayout()
	tables := l.Layers * l.KVHeads
	k, _ := codec.Parse("kivi4", codec.Keys)
	v, _ := codec.Parse("kivi4", codec.Values)
	f, err := kvcache.FootprintOf(kvcache.PoolConfig{Layout: l, BlockTokens: kvcache.DefaultBlockTokens, K: k, V: v})
	if err != nil {
		t.Fatal(err)
	}
	budget := int64(3 * tables * f.BlockBytes)
	e := newEngine(t, m, Config{KVMem: budget, K: "kivi4", V: "kivi4"})

	prompt := tok.Encode("Once upon a time, there was a little girl named Lily.", true, false)
	if len(prompt)+8 >= f.Residual {
		t.Fatalf("prompt of %d tokens does not stay in the residual of %d", len(prompt), f.Residual)
	}
	o := collect(t, must(e.Submit(GenRequest{Prompt: prompt, MaxTokens: 8, N: 2})))
	for i, fin := range o.finish {
		if fin != FinishLength && fin != FinishEOS {
			t.Fatalf("sample %d: %s %v", i, fin, o.errs[i])
		}
	}
	checkFree(t, e)

	// A prompt long enough to seal more groups than the pool holds.
	long := make([]int, 0, m.CtxLen-1)
	for len(long) < m.CtxLen-1 {
		long = append(long, prompt...)
	}
	long = long[:m.CtxLen-1]
	_, err = e.Submit(GenRequest{Prompt: long, MaxTokens: 1})
	if err == nil || !strings.Contains(err.Error(), "more than the whole pool") {
		t.Fatalf("a prompt larger than the pool: %v", err)
	}
}
