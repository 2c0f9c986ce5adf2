package main

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/kvcalc"
	"github.com/kvlm/kvlm/model"
)

// TestKVBytesAgree: for every codec, on stories260K and a gen-model shape,
// kvcalc, inspect, the pool and --kv-mem count the same bytes: kvcalc's
// bytes_per_token = inspect's kv_bytes_per_token = the pool's block bytes ×
// tables / block tokens, positions included; kvcalc's total_bytes and
// blocks for N tokens = what a real sequence of N tokens reserves
// (Paged.Memory: whole blocks of 16, the last rounded up; KIVI's residual
// buffers); and a --kv-mem of those blocks' bytes holds the N tokens.
func TestKVBytesAgree(t *testing.T) {
	s := storiesFiles(t)
	tiny := filepath.Join(t.TempDir(), "tiny.gguf")
	if o, e, code := kvlm(t, "gen-model", "--shape", "tiny", "--type", "Q8_0", "--tokenizer", shared.Path(t, "models/llama2-tokenizer/tokenizer.bin"), "-o", tiny); code != 0 {
		t.Fatalf("gen-model: exit %d: %s %s", code, o, e)
	}
	const N = 200 // not a multiple of 16; past KIVI's residual of 128
	for _, f := range []struct {
		name, path string
		load       func(string) (*model.Model, error)
	}{
		{"stories260K", s.bin, model.LoadLlama2C},
		{"stories260K.gguf", s.gguf, func(p string) (*model.Model, error) { m, _, err := model.LoadGGUF(p); return m, err }},
		{"gen-model tiny", tiny, func(p string) (*model.Model, error) { m, _, err := model.LoadGGUF(p); return m, err }},
	} {
		m, err := f.load(f.path)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		out, errOut, code := kvlm(t, "inspect", f.path, "--json")
		if code != 0 {
			t.Fatalf("inspect: exit %d: %s", code, errOut)
		}
		var in inspectJSON
		if err := json.Unmarshal([]byte(out), &in); err != nil {
			t.Fatal(err)
		}
		tables := m.Config.Layers * m.KVHeads
		for _, cd := range kvcalc.Codecs() {
			name := string(cd)
			t.Run(f.name+"/"+name, func(t *testing.T) {
				r := kvcalcJSONRun(t, "-m", f.path, "--kv-type", name, "--seq", strconv.Itoa(N))
				ctx := kvcalcJSONRun(t, "-m", f.path, "--kv-type", name)
				if in.KVBytesPerToken[name] != r.BytesPerToken || in.KVFormulaBytesPerToken[name] != r.FormulaBytesPerToken ||
					in.KVContextBytes[name] != ctx.TotalBytes || in.KVBlockTokens != r.KVBlockTokens {
					t.Fatalf("inspect %v / %v B per token (context %d), kvcalc %v / %v (%d)", in.KVBytesPerToken[name], in.KVFormulaBytesPerToken[name],
						in.KVContextBytes[name], r.BytesPerToken, r.FormulaBytesPerToken, ctx.TotalBytes)
				}
				k, err := codec.Parse(name, codec.Keys)
				if err != nil {
					t.Fatal(err)
				}
				v, err := codec.Parse(name, codec.Values)
				if err != nil {
					t.Fatal(err)
				}
				seq, err := m.NewStandaloneSequence(model.KVOptions{K: k, V: v, Tokens: N})
				if err != nil {
					t.Fatal(err)
				}
				defer seq.Close()
				paged := seq.Cache().(*kvcache.Paged)
				pool := paged.Pool()
				if got := float64(pool.BlockBytes()) * float64(tables) / float64(pool.BlockTokens()); got != r.BytesPerToken || pool.BlockBytes() != r.BlockBytes {
					t.Fatalf("pool %v B per token (block %d B), kvcalc %v (block %d B)", got, pool.BlockBytes(), r.BytesPerToken, r.BlockBytes)
				}
				tokens := make([]int, N)
				for i := range tokens {
					tokens[i] = (7*i + 3) % m.Vocab
				}
				if _, err := seq.Forward(tokens, false); err != nil {
					t.Fatal(err)
				}
				mem := paged.Memory()
				if mem.Reserved != r.TotalBytes || int64(mem.Blocks) != r.Blocks {
					t.Fatalf("%d tokens: the sequence reserves %d B in %d blocks, kvcalc says %d B in %d", N, mem.Reserved, mem.Blocks, r.TotalBytes, r.Blocks)
				}
				// --kv-mem is the block arena (KIVI's residual buffers live
				// beside it): kv_mem_bytes admits the N tokens; a byte less
				// does not, except with KIVI, whose residual tokens hold no
				// block yet (kv_mem_bytes admits them in any chunking; this
				// one, 128 then 72, needs less).
				arena := r.Blocks * int64(r.BlockBytes)
				if strings.HasPrefix(name, "kivi") {
					slots := codec.DefaultResidual + codec.DefaultGroup // per table
					if arena+int64(float64(slots)*r.ResidualBytesPerToken) != r.TotalBytes {
						t.Fatalf("kivi total %d is not %d B of blocks and %d residual slots per table of %v B", r.TotalBytes, arena, slots, r.ResidualBytesPerToken/float64(tables))
					}
				} else if arena != r.TotalBytes || r.KVMemBytes != r.TotalBytes {
					t.Fatalf("total %d is not its %d blocks of %d B (kv_mem_bytes %d)", r.TotalBytes, r.Blocks, r.BlockBytes, r.KVMemBytes)
				}
				mems := []int64{r.KVMemBytes, r.KVMemBytes - 1}
				if strings.HasPrefix(name, "kivi") {
					mems = mems[:1]
				}
				for _, mem := range mems {
					bounded, err := m.NewStandaloneSequence(model.KVOptions{K: k, V: v, MemBytes: mem})
					if err != nil {
						t.Fatal(err)
					}
					_, err = bounded.Forward(tokens, false)
					bounded.Close()
					if fits := mem == r.KVMemBytes; (err == nil) != fits {
						t.Fatalf("--kv-mem %d B (kv_mem_bytes %d) with %d tokens: %v", mem, r.KVMemBytes, N, err)
					}
				}
			})
		}
	}
}
