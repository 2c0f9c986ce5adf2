package main

import (
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func kvcalcJSONRun(t *testing.T, args ...string) kvcalcJSON {
	t.Helper()
	out, errOut, code := kvlm(t, append([]string{"kvcalc", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("kvcalc %v: exit %d: %s", args, code, errOut)
	}
	var r kvcalcJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	return r
}

func TestKVCalcJSONPoint(t *testing.T) {
	r := kvcalcJSONRun(t, "--preset", "llama2-7b", "--seq", "4096")
	if r.Row == nil || r.Rows != nil {
		t.Fatalf("one point should print one row at the top level: %+v", r)
	}
	// The pool: 524,288 B of keys and values + 32 · 32 · 4 B of positions.
	if r.BytesPerToken != 528384 || r.TotalBytes != 4096*528384 || r.FormulaBytesPerToken != 524288 || r.FormulaTotalBytes != 4096*524288 ||
		r.WeightsBytes != 2*6_738_415_616 || r.Batch != 1 || r.Blocks != 256*32*32 || r.KVBlockTokens != 16 || r.BlockBytes != 16*512+64 {
		t.Fatalf("llama2-7b: %+v %+v", r, *r.Row)
	}
	if r.KVTypeK != "f16" || r.KVTypeV != "f16" || r.BitsK != 16 || r.WeightsType != "f16" || r.Model.Layers != 32 {
		t.Fatalf("header %+v", r)
	}

	// The field names the brief promises, read without the Go types.
	out, _, _ := kvlm(t, "kvcalc", "--preset", "gpt3-175b", "--batch", "4", "--seq", "4096", "--json")
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"bytes_per_token": 4_755_456, "total_bytes": 4 * 4096 * 4_755_456, "weights_bytes": 350e9,
		"formula_bytes_per_token": 4_718_592, "formula_total_bytes": 77_309_411_328, "kv_block_tokens": 16, "block_bytes": 8256}
	for k, v := range want {
		if raw[k] != v {
			t.Errorf("%s = %v, want %v", k, raw[k], v)
		}
	}
	if got, ok := raw["kv_to_weights"].(float64); !ok || math.Round(got*100)/100 != 0.22 {
		t.Errorf("kv_to_weights = %v, want 0.22", raw["kv_to_weights"])
	}
}

// TestKVCalcMaps: the map flags on a preset give the bytes of the layers
// that keep KV: CLA2 halves Llama 3 8B's cache, YOCO keeps one global layer
// growing and bounds the self-decoder's 16 layers, local-global (5:1024)
// bounds 27 layers of 32; --chunk sets the bound; the JSON names the cache
// layers and their windows.
func TestKVCalcMaps(t *testing.T) {
	plain := kvcalcJSONRun(t, "--preset", "llama3-8b", "--seq", "8192")
	cla := kvcalcJSONRun(t, "--preset", "llama3-8b", "--seq", "8192", "--cla", "2")
	if cla.TotalBytes*2 != plain.TotalBytes || cla.BytesPerToken*2 != plain.BytesPerToken || cla.KVLayers != 16 || cla.KVWindows != nil {
		t.Errorf("CLA2: %d B (%v per token, %d layers), plain %d (%v)", cla.TotalBytes, cla.BytesPerToken, cla.KVLayers, plain.TotalBytes, plain.BytesPerToken)
	}
	// 8 KV heads · 8,256 B per block of 16 tokens.
	const table = 8 * 8256
	for _, c := range []struct {
		args    []string
		layers  int
		perTok  float64
		bounded int // layers
		bound   int // blocks per bounded table
	}{
		{[]string{"--yoco", "1024"}, 17, table / 16, 16, (1024 + 128 + 14 + 15) / 16},
		{[]string{"--yoco", "1024", "--chunk", "1"}, 17, table / 16, 16, (1024 + 1 + 14 + 15) / 16},
		{[]string{"--local-global", "5:1024"}, 32, 5 * table / 16, 27, (1024 + 128 + 14 + 15) / 16},
		{[]string{"--window", "4096"}, 32, 0, 32, (4096 + 128 + 14 + 15) / 16},
	} {
		r := kvcalcJSONRun(t, append([]string{"--preset", "llama3-8b", "--seq", "32768"}, c.args...)...)
		bounded := 0
		for _, w := range r.KVWindows {
			if w > 0 {
				bounded++
			}
		}
		if r.KVLayers != c.layers || bounded != c.bounded || r.BytesPerToken != c.perTok || r.WindowBoundBytes != int64(c.bounded*c.bound*table) {
			t.Errorf("%v: %d layers (%d bounded), %v B per token, bound %d B; want %d (%d), %v, %d", c.args, r.KVLayers, bounded, r.BytesPerToken, r.WindowBoundBytes,
				c.layers, c.bounded, c.perTok, c.bounded*c.bound*table)
		}
		if r.WindowBytes <= 0 || r.WindowBytes > r.WindowBoundBytes || r.KVMemBytes < r.TotalBytes {
			t.Errorf("%v: window bytes %d of bound %d, --kv-mem %d for %d", c.args, r.WindowBytes, r.WindowBoundBytes, r.KVMemBytes, r.TotalBytes)
		}
	}
}

func TestKVCalcJSONGrid(t *testing.T) {
	r := kvcalcJSONRun(t, "--preset", "gpt3-175b", "--batch", "4,16,64", "--seq", "4096")
	if r.Row != nil || len(r.Rows) != 3 {
		t.Fatalf("a grid prints its rows in \"rows\": %+v", r)
	}
	for i, c := range []struct {
		batch int
		gb    float64
		ratio float64
	}{{4, 77.3, 0.22}, {16, 309.2, 0.88}, {64, 1237.0, 3.53}} {
		row := r.Rows[i]
		gb, ratio := float64(row.FormulaTotalBytes)/1e9, float64(row.FormulaTotalBytes)/float64(row.WeightsBytes)
		if row.Batch != c.batch || row.Seq != 4096 || math.Round(gb*10)/10 != c.gb || math.Round(ratio*100)/100 != c.ratio {
			t.Errorf("row %d: %+v, want a formula of %.1f GB, %.2f", i, row, c.gb, c.ratio)
		}
		if row.TotalBytes != int64(c.batch)*4096*4_755_456 || row.KVToWeights != float64(row.TotalBytes)/350e9 {
			t.Errorf("row %d: pool %d B, KV/weights %g", i, row.TotalBytes, row.KVToWeights)
		}
	}
	// Batch sizes outermost.
	r = kvcalcJSONRun(t, "--preset", "tinyllama-1.1b", "--batch", "1,2", "--seq", "10,20,30")
	if len(r.Rows) != 6 || r.Rows[2].Batch != 1 || r.Rows[2].Seq != 30 || r.Rows[3].Batch != 2 || r.Rows[3].Seq != 10 {
		t.Fatalf("grid order %+v", r.Rows)
	}
}

func TestKVCalcTable(t *testing.T) {
	out, errOut, code := kvlm(t, "kvcalc", "--preset", "gpt3-175b", "--batch", "4,16,64", "--seq", "4096")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, s := range []string{"4,755,456 B = 4.5352 MiB", "in a kvlm pool", "8,256 B per block of 16", "formula    4,718,592 B = 4.5 MiB",
		"GB = 10^9 bytes", "GiB = 2^30 bytes", "350.0 GB", "77.9", "311.7", "1246.6", "72.6", "1161.0", "formula GB", "77.3", "309.2", "1237.0",
		"0.22", "0.89", "3.56", "9,437,184"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
	out, _, code = kvlm(t, "kvcalc", "--preset", "llama3-8b", "--kv-type", "kivi2", "--kv-budget", "1000", "--seq", "4096")
	if code != 0 || !strings.Contains(out, "f16 (the residual)") || !strings.Contains(out, "kept") || !strings.Contains(out, "min(1000, seq)") {
		t.Fatalf("KIVI / budget notes missing:\n%s", out)
	}
	out, _, code = kvlm(t, "kvcalc", "--list")
	if code != 0 || !strings.Contains(out, "qwen2.5-7b") || !strings.Contains(out, "8.25") || !strings.Contains(out, "kivi4") ||
		!strings.Contains(out, "528,384    524,288") || !strings.Contains(out, "16.125") {
		t.Fatalf("list:\n%s", out)
	}
}

func TestKVCalcCodecsAndBudgets(t *testing.T) {
	// The formula, and the pool: 4 B of position per token per head, whole
	// blocks (--kv-block), KIVI keys' per-channel scales in every block and
	// its residual buffer of 160 f16 slots per head (4·128 + 4 B each).
	cases := []struct {
		args            []string
		formulaPerToken float64
		formulaTotal    int64
		poolPerToken    float64
		poolTotal       int64
	}{
		{[]string{"--kv-type", "q8"}, 1024 * 2 * 132, 4096 * 1024 * 2 * 132, 1024 * 268, 4096 * 1024 * 268},
		{[]string{"--kv-type-k", "q8", "--kv-type-v", "q4"}, 1024 * (132 + 68), 4096 * 1024 * (132 + 68), 1024 * 204, 4096 * 1024 * 204},
		{[]string{"--kv-type", "q4", "--kv-type-k", "f32"}, 1024 * (512 + 68), 4096 * 1024 * (512 + 68), 1024 * 584, 4096 * 1024 * 584},
		{[]string{"--kv-type", "kivi2"}, 1024 * 96, 1024 * (128*512 + 3968*96), 1024 * 116, 1024 * (3968*116 + 160*516)},
		{[]string{"--kv-ratio", "0.25"}, 524288, 1024 * 524288, 528384, 1024 * 528384},
		{[]string{"--kv-budget", "100"}, 524288, 100 * 524288, 528384, 112 * 528384},
		{[]string{"--kv-budget", "100", "--kv-block", "1"}, 524288, 100 * 524288, 528384, 100 * 528384},
		{[]string{"--kv-budget", "100", "--kv-block", "64"}, 524288, 100 * 524288, 528384, 128 * 528384},
	}
	for _, c := range cases {
		r := kvcalcJSONRun(t, append([]string{"--preset", "llama2-7b", "--seq", "4096"}, c.args...)...)
		if r.FormulaBytesPerToken != c.formulaPerToken || r.FormulaTotalBytes != c.formulaTotal || r.BytesPerToken != c.poolPerToken || r.TotalBytes != c.poolTotal {
			t.Errorf("%v: %v B/token, total %d (formula %v, %d); want %v, %d (%v, %d)", c.args, r.BytesPerToken, r.TotalBytes,
				r.FormulaBytesPerToken, r.FormulaTotalBytes, c.poolPerToken, c.poolTotal, c.formulaPerToken, c.formulaTotal)
		}
	}
	r := kvcalcJSONRun(t, "--preset", "llama2-7b", "--weights-type", "q8_0", "--seq", "1")
	if r.WeightsType != "q8_0" || r.WeightsBytes != 6_738_415_616/32*34 {
		t.Errorf("q8_0 weights: %s %d", r.WeightsType, r.WeightsBytes)
	}
}

// TestKVCalcModelFile: stories260K, checkpoint and GGUF: 1,360 B per token
// in f32 in the pool (1,280 by the formula), its context (512) as the
// default length, its stored size as the weights.
func TestKVCalcModelFile(t *testing.T) {
	s := storiesFiles(t)
	for _, path := range []string{s.bin, s.gguf} {
		r := kvcalcJSONRun(t, "-m", path, "--kv-type", "f32")
		if r.BytesPerToken != 1360 || r.FormulaBytesPerToken != 1280 || r.Seq != 512 || r.TotalBytes != 512*1360 || r.FormulaTotalBytes != 512*1280 ||
			r.WeightsType != "stored" || r.WeightsBytes < 1_000_000 {
			t.Errorf("%s: %+v %+v", path, r, *r.Row)
		}
		if r.Model.KVHeads != 4 || r.Model.Layers != 5 || r.Model.HeadDim != 8 {
			t.Errorf("%s: model %+v", path, r.Model)
		}
	}
	out, _, code := kvlm(t, "kvcalc", "-m", s.gguf, "--seq", "512,1024")
	if code != 0 || !strings.Contains(out, "KB") || !strings.Contains(out, "beyond the trained context of 512") {
		t.Fatalf("stories table:\n%s", out)
	}
}

func TestKVCalcBadInput(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.gguf")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown preset", []string{"--preset", "gpt5"}, "known: llama2-7b, llama2-13b"},
		{"unknown codec", []string{"--preset", "llama2-7b", "--kv-type", "int8"}, "unknown KV codec \"int8\" (known: f32, f16, bf16, q8, q4, kivi2, kivi4; q8dot and q4dot size as q8 and q4)"},
		{"unknown K codec", []string{"--preset", "llama2-7b", "--kv-type-k", "q2"}, "unknown KV codec"},
		{"unknown V codec", []string{"--preset", "llama2-7b", "--kv-type-v", ""}, "unknown KV codec"},
		{"batch zero", []string{"--preset", "llama2-7b", "--batch", "0"}, "--batch: 0 must be positive"},
		{"batch negative in list", []string{"--preset", "llama2-7b", "--batch", "1,-4"}, "--batch: -4 must be positive"},
		{"batch not a number", []string{"--preset", "llama2-7b", "--batch", "1,x"}, "--batch: \"x\" is not an integer"},
		{"seq zero", []string{"--preset", "llama2-7b", "--seq", "0"}, "--seq: 0 must be positive"},
		{"seq empty", []string{"--preset", "llama2-7b", "--seq", ""}, "--seq"},
		{"ratio zero", []string{"--preset", "llama2-7b", "--kv-ratio", "0"}, "outside (0, 1]"},
		{"ratio above one", []string{"--preset", "llama2-7b", "--kv-ratio", "1.5"}, "outside (0, 1]"},
		{"ratio negative", []string{"--preset", "llama2-7b", "--kv-ratio", "-0.1"}, "outside (0, 1]"},
		{"budget zero", []string{"--preset", "llama2-7b", "--kv-budget", "0"}, "--kv-budget 0 must be positive"},
		{"budget negative", []string{"--preset", "llama2-7b", "--kv-budget", "-5"}, "--kv-budget"},
		{"ratio and budget", []string{"--preset", "llama2-7b", "--kv-ratio", "0.5", "--kv-budget", "5"}, "not both"},
		{"preset and model", []string{"--preset", "llama2-7b", "-m", missing}, "not both"},
		{"neither", []string{}, "give --preset NAME or -m MODEL"},
		{"missing file", []string{"-m", missing}, "no such file"},
		{"bad weights type", []string{"--preset", "llama2-7b", "--weights-type", "q9"}, "unknown weights type"},
		{"overflow", []string{"--preset", "gpt3-175b", "--batch", "1000000000", "--seq", "1000000000"}, "overflows"},
		{"stray argument", []string{"--preset", "llama2-7b", "extra"}, "unknown command"},
		{"block zero", []string{"--preset", "llama2-7b", "--kv-block", "0"}, "--kv-block 0 must be positive"},
		{"block too large", []string{"--preset", "llama2-7b", "--kv-block", "70000"}, "block size must be between 1 and 65536"},
		{"kivi block", []string{"--preset", "llama2-7b", "--kv-type", "kivi4", "--kv-block", "48"}, "key groups of 32 tokens must be a multiple of the block size 48"},
		{"chunk zero", []string{"--preset", "llama2-7b", "--chunk", "0"}, "--chunk 0 must be positive"},
		{"two architectures", []string{"--preset", "llama2-7b", "--cla", "2", "--yoco", "64"}, "not --cla and --yoco together"},
		{"cla zero", []string{"--preset", "llama2-7b", "--cla", "0"}, "CLA groups of 0 layers"},
		{"yoco with window", []string{"--preset", "llama2-7b", "--yoco", "64", "--window", "8"}, "--yoco sets the windows itself"},
		{"window and list", []string{"--preset", "tinyllama-1.1b", "--window", "8", "--layer-window", "1"}, "not both"},
		{"window zero", []string{"--preset", "llama2-7b", "--window", "0"}, "--window 0 must be positive"},
		{"short source", []string{"--preset", "llama2-7b", "--kv-source", "0,0"}, "--kv-source has 2 entries; the model has 32 layers"},
		{"source not a layer", []string{"--preset", "llama2-7b", "--kv-source", "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,99"}, "entry 31 reads layer 99"},
		{"source chain", []string{"--preset", "llama2-7b", "--kv-source", "0,0,1,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31"}, "must read its own"},
		{"bad window list", []string{"--preset", "llama2-7b", "--cla", "2", "--layer-window", "x"}, "--layer-window has 1 entries"},
		{"local-global form", []string{"--preset", "llama2-7b", "--local-global", "5"}, "want N:W"},
		{"lckv too many", []string{"--preset", "llama2-7b", "--lckv", "32"}, "LCKV warmup of 32 layers"},
		{"map on a file", []string{"-m", missing, "--cla", "2"}, "-m reads the map from the file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := kvlm(t, append([]string{"kvcalc"}, c.args...)...)
			if code != 1 {
				t.Fatalf("exit %d, want 1; stdout %q stderr %q", code, out, errOut)
			}
			if strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "kvlm: ") {
				t.Fatalf("error is not one line: %q", errOut)
			}
			if !strings.Contains(errOut, c.want) {
				t.Fatalf("error %q does not mention %q", errOut, c.want)
			}
		})
	}
}
