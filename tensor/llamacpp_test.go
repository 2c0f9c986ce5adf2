package tensor

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestDequantizeMatchesLlamaCpp: Dequantize gives llama.cpp's dequantized
// values bit for bit (ggml's dequantize_row_*, through its type traits'
// to_float) on the blocks of testdata/llamacpp: TYPE.rand.bin, random
// bytes with random finite f16 scales (every level, scale and min bit
// pattern), and TYPE.real.bin, the first blocks of a tensor that
// llama-quantize wrote (testdata/llamacpp/README.md says how both were
// made, with the llama.cpp commit).
func TestDequantizeMatchesLlamaCpp(t *testing.T) {
	for _, typ := range []DType{Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS} {
		kinds := []string{"rand", "real"}
		if typ == Q4_0 || typ == Q8_0 || typ == Q4_K || typ == Q6_K {
			kinds = kinds[:1] // the file llama-quantize wrote holds none
		}
		for _, kind := range kinds {
			t.Run(typ.String()+"/"+kind, func(t *testing.T) {
				base := filepath.Join("testdata", "llamacpp", typ.String()+"."+kind)
				blocks, err := os.ReadFile(base + ".bin")
				if err != nil {
					t.Fatal(err)
				}
				raw, err := os.ReadFile(base + ".f32")
				if err != nil {
					t.Fatal(err)
				}
				n := len(blocks) / typ.BlockBytes() * typ.BlockSize()
				if n == 0 || len(raw) != 4*n {
					t.Fatalf("%d block bytes, %d value bytes", len(blocks), len(raw))
				}
				got := make([]float32, n)
				if err := Dequantize(typ, blocks, got); err != nil {
					t.Fatal(err)
				}
				for i := range got {
					want := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
					if math.Float32bits(got[i]) != math.Float32bits(want) {
						t.Fatalf("value %d (block %d) = %g (%#08x), llama.cpp %g (%#08x)", i, i/typ.BlockSize(),
							got[i], math.Float32bits(got[i]), want, math.Float32bits(want))
					}
				}
			})
		}
	}
}
