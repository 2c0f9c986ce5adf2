package main

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/kvcalc"
	"github.com/kvlm/kvlm/model"
)

// TestKVBytesAgreeMaps: for each of gen-model's KV-sharing shapes, kvcalc
// on the file (its map read through model.ConfigFromGGUF), kvcalc on the
// same shape described by the map's builders (as the preset flags do),
// inspect, and the model's own pool (m.KVLayout(): owners only, windows
// freeing what slid out) count the same bytes: the whole cache after a
// 200-token prompt prefilled 64 tokens at a time (kvcalc --chunk 64), and
// the bytes per token over 64 decoded tokens, in f16, and in kivi4 for the
// shapes with window-bounded layers (whose sealed groups the windows free).
func TestKVBytesAgreeMaps(t *testing.T) {
	tok := shared.Path(t, "models/llama2-tokenizer/tokenizer.bin")
	described := map[string]func(layers int) (kvcalc.Map, error){
		"cla2":         func(l int) (kvcalc.Map, error) { return kvcalc.CLA(l, 2) },
		"cla3":         func(l int) (kvcalc.Map, error) { return kvcalc.CLA(l, 3) },
		"cla2-mqa":     func(l int) (kvcalc.Map, error) { return kvcalc.CLA(l, 2) },
		"yoco":         func(l int) (kvcalc.Map, error) { return kvcalc.YOCO(l, 64) },
		"lckv":         func(l int) (kvcalc.Map, error) { return kvcalc.LCKV(l, 2) },
		"local-global": func(l int) (kvcalc.Map, error) { return kvcalc.LocalGlobal(l, 5, 64) },
	}
	const N, chunk = 200, 64
	for _, shape := range kvMapShapes {
		path := filepath.Join(t.TempDir(), shape+".gguf")
		if o, e, code := kvlm(t, "gen-model", "--shape", shape, "--type", "F16", "--ctx", "512", "--tokenizer", tok, "-o", path); code != 0 {
			t.Fatalf("gen-model %s: exit %d: %s %s", shape, code, o, e)
		}
		m, _, err := model.LoadGGUF(path)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		file, err := kvcalc.FromFile(path)
		if err != nil {
			t.Fatal(err)
		}
		plain := file
		plain.KVSource, plain.LayerWindows, plain.SlidingWindow = nil, nil, 0
		mp, err := described[shape](plain.Layers)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := kvcalc.WithMap(plain, mp)
		if err != nil {
			t.Fatal(err)
		}
		out, errOut, code := kvlm(t, "inspect", path, "--json")
		if code != 0 {
			t.Fatalf("inspect: exit %d: %s", code, errOut)
		}
		var in inspectJSON
		if err := json.Unmarshal([]byte(out), &in); err != nil {
			t.Fatal(err)
		}
		codecs := []kvcalc.Codec{kvcalc.F16}
		if m.KVLayout().Windowed() {
			codecs = append(codecs, kvcalc.KIVI4)
		}
		for _, cd := range codecs {
			t.Run(shape+"/"+string(cd), func(t *testing.T) {
				r := kvcalcJSONRun(t, "-m", path, "--kv-type", string(cd), "--seq", strconv.Itoa(N), "--chunk", strconv.Itoa(chunk))
				rd, err := kvcalc.Compute(desc, kvcalc.Options{K: cd, V: cd, Chunk: chunk}, 1, N)
				if err != nil {
					t.Fatal(err)
				}
				if r.TotalBytes != rd.TotalBytes || r.Blocks != rd.Blocks || r.BytesPerToken != rd.BytesPerToken || r.KVMemBytes != rd.KVMemBytes ||
					r.WindowBytes != rd.WindowBytes || r.FormulaTotalBytes != rd.FormulaTotalBytes {
					t.Fatalf("from the file %+v\nfrom the description %+v", *r.Row, rd)
				}
				if r.KVLayers != m.KVLayout().Layers || in.KVBytesPerToken[string(cd)] != r.BytesPerToken {
					t.Fatalf("kvcalc: %d cache layers, %v B per token; the model %d, inspect %v", r.KVLayers, r.BytesPerToken, m.KVLayout().Layers, in.KVBytesPerToken[string(cd)])
				}
				k, _ := codec.Parse(string(cd), codec.Keys)
				v, _ := codec.Parse(string(cd), codec.Values)
				seq, err := m.NewStandaloneSequence(model.KVOptions{K: k, V: v, Tokens: 512})
				if err != nil {
					t.Fatal(err)
				}
				defer seq.Close()
				seq.Chunk = chunk
				tokens := make([]int, 320)
				for i := range tokens {
					tokens[i] = (7*i + 3) % m.Vocab
				}
				if _, err := seq.Forward(tokens[:N], false); err != nil {
					t.Fatal(err)
				}
				paged := seq.Cache().(*kvcache.Paged)
				if mem := paged.Memory(); mem.Reserved != r.TotalBytes || int64(mem.Blocks) != r.Blocks {
					t.Fatalf("%d tokens: the model's cache reserves %d B in %d blocks, kvcalc says %d B in %d", N, mem.Reserved, mem.Blocks, r.TotalBytes, r.Blocks)
				}
				var at256 int64
				for i := N; i < 320; i++ {
					if _, err := seq.Forward(tokens[i:i+1], false); err != nil {
						t.Fatal(err)
					}
					if i+1 == 256 {
						at256 = paged.Memory().Reserved
					}
				}
				if got := float64(paged.Memory().Reserved-at256) / 64; got != r.BytesPerToken {
					t.Fatalf("a decoded token takes %v B in the model's cache, kvcalc says %v", got, r.BytesPerToken)
				}
				// bench's kv_bytes_per_token is the same figure.
				if got := kvBytesPerToken(m, model.KVOptions{K: k, V: v, BlockTokens: kvcache.DefaultBlockTokens}); float64(got) != r.BytesPerToken {
					t.Fatalf("bench reports %d B per token, kvcalc %v", got, r.BytesPerToken)
				}
			})
		}
	}
}
