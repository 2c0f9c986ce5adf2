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

// TestMatMulMatchesLlamaCpp: MatMul of the recorded random blocks
// (TYPE.rand.bin as a matrix of 256 columns) times five activation rows
// (mm.x.f32) against ggml's ggml_mul_mat on the CPU (TYPE.mm.f32; README.md),
// one token at a time and all five at once. For the 256-value types both
// quantize the activations to ggml's Q8_K alike (one scale per 256 values,
// round half to even) and sum the integer products exactly, so they agree
// to float32 rounding (within 1e-6 of Σ|w·x|; measured 3.5e-8); for the 32-value types
// llama.cpp quantizes activations with one scale per 32 values (Q8_0, Q8_1)
// and kvlm one per 4 (act.go), so they agree to that quantization's error
// (within 0.5% of Σ|w·x|; measured 0.17%).
func TestMatMulMatchesLlamaCpp(t *testing.T) {
	read := func(t *testing.T, name string) []float32 {
		raw, err := os.ReadFile(filepath.Join("testdata", "llamacpp", name))
		if err != nil {
			t.Fatal(err)
		}
		v := make([]float32, len(raw)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		return v
	}
	const cols, n = 256, 5
	for _, typ := range []DType{Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS} {
		t.Run(typ.String(), func(t *testing.T) {
			w, err := os.ReadFile(filepath.Join("testdata", "llamacpp", typ.String()+".rand.bin"))
			if err != nil {
				t.Fatal(err)
			}
			rb, _ := typ.RowBytes(cols)
			rows := len(w) / rb
			m, err := NewMatrix(typ, rows, cols, w)
			if err != nil {
				t.Fatal(err)
			}
			x := read(t, "mm.x.f32")
			want := read(t, typ.String()+".mm.f32")
			if len(x) != n*cols || len(want) != n*rows {
				t.Fatalf("%d activations, %d results", len(x), len(want))
			}
			rel := 1e-6
			if typ.BlockSize() == 32 {
				rel = 0.005
			}
			row := make([]float32, cols)
			forEachLevel(t, func(t *testing.T) {
				all := make([]float32, n*rows)
				m.MatMul(all, x, n)
				var worst float64
				for tok := 0; tok < n; tok++ {
					one := make([]float32, rows)
					m.MatMul(one, x[tok*cols:(tok+1)*cols], 1)
					for r := 0; r < rows; r++ {
						m.Row(r, row)
						var mag float64
						for i, v := range row {
							mag += math.Abs(float64(v) * float64(x[tok*cols+i]))
						}
						ref := float64(want[tok*rows+r])
						for _, got := range []float32{one[r], all[tok*rows+r]} {
							e := math.Abs(float64(got)-ref) / mag
							worst = max(worst, e)
							if e > rel {
								t.Fatalf("token %d row %d: %g, llama.cpp %g (error %.3g of Σ|w·x| = %.3g)", tok, r, got, ref, e, mag)
							}
						}
					}
				}
				t.Logf("largest difference %.3g of Σ|w·x|", worst)
			})
		})
	}
}
