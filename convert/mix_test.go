package convert

import (
	"fmt"
	"testing"

	"github.com/kvlm/kvlm/tensor"
)

// TestMixRules: the per-tensor types of each llama.cpp mix for a 32-layer
// model with 8 query heads per KV head (Llama 3 8B's shape) and for one
// with 2 (below llama.cpp's GQA threshold of 4), worked out by hand from
// llama_tensor_get_type_impl: use_more_bits(i, 32) holds for layers 0–3,
// 28–31 and 6, 9, …, 27.
func TestMixRules(t *testing.T) {
	more := map[int]bool{}
	for i := 0; i < 32; i++ {
		more[i] = i < 4 || i >= 28 || (i-4)%3 == 2
	}
	if !more[6] || more[5] || !more[27] || more[26] {
		t.Fatal("use_more_bits table")
	}
	gqa8 := MixModel{Layers: 32, GQA: 8}
	gqa2 := MixModel{Layers: 32, GQA: 2}
	type want struct {
		name  string
		layer int
		mm    MixModel
		typ   tensor.DType
	}
	cases := map[string][]want{
		"Q4_K_M": {{"output.weight", 32, gqa8, tensor.Q6_K}, {"token_embd.weight", 0, gqa8, tensor.Q4_K},
			{"blk.0.attn_q.weight", 0, gqa8, tensor.Q4_K}, {"blk.5.attn_v.weight", 5, gqa8, tensor.Q4_K},
			{"blk.6.attn_v.weight", 6, gqa8, tensor.Q6_K}, {"blk.30.ffn_down.weight", 30, gqa8, tensor.Q6_K},
			{"blk.7.ffn_down.weight", 7, gqa8, tensor.Q4_K}, {"blk.7.attn_output.weight", 7, gqa8, tensor.Q4_K}},
		"Q5_K_M": {{"output.weight", 32, gqa8, tensor.Q6_K}, {"blk.9.attn_v.weight", 9, gqa8, tensor.Q6_K},
			{"blk.10.attn_v.weight", 10, gqa8, tensor.Q5_K}, {"blk.0.ffn_down.weight", 0, gqa8, tensor.Q6_K},
			{"blk.4.ffn_up.weight", 4, gqa8, tensor.Q5_K}},
		"Q3_K_M": {{"output.weight", 32, gqa8, tensor.Q6_K}, {"blk.1.attn_v.weight", 1, gqa8, tensor.Q5_K},
			{"blk.2.attn_v.weight", 2, gqa8, tensor.Q4_K}, {"blk.1.ffn_down.weight", 1, gqa8, tensor.Q5_K},
			{"blk.2.ffn_down.weight", 2, gqa8, tensor.Q4_K}, {"blk.3.attn_output.weight", 3, gqa8, tensor.Q4_K},
			{"blk.3.attn_k.weight", 3, gqa8, tensor.Q3_K}, {"blk.3.ffn_gate.weight", 3, gqa8, tensor.Q3_K}},
		"Q2_K": {{"output.weight", 32, gqa8, tensor.Q6_K}, {"blk.0.attn_v.weight", 0, gqa8, tensor.Q4_K},
			{"blk.0.attn_v.weight", 0, gqa2, tensor.Q3_K}, {"blk.0.ffn_down.weight", 0, gqa8, tensor.Q3_K},
			{"blk.0.attn_output.weight", 0, gqa8, tensor.Q3_K}, {"blk.0.ffn_up.weight", 0, gqa8, tensor.Q2_K}},
		"IQ4_XS": {{"output.weight", 32, gqa8, tensor.Q6_K}, {"blk.0.attn_v.weight", 0, gqa8, tensor.Q5_K},
			{"blk.0.attn_v.weight", 0, gqa2, tensor.IQ4_XS}, {"blk.3.ffn_down.weight", 3, gqa8, tensor.Q5_K},
			{"blk.4.ffn_down.weight", 4, gqa8, tensor.IQ4_XS}, {"blk.4.attn_q.weight", 4, gqa8, tensor.IQ4_XS}},
		"Q4_K": {{"output.weight", 32, gqa8, tensor.Q4_K}, {"blk.0.attn_v.weight", 0, gqa8, tensor.Q4_K}},
		"Q5_0": {{"output.weight", 32, gqa8, tensor.Q5_0}},
	}
	for mixName, ws := range cases {
		mix, err := ParseMix(mixName)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			t.Run(fmt.Sprintf("%s/%s/gqa%d", mixName, w.name, w.mm.GQA), func(t *testing.T) {
				if got := mix.TensorType(w.name, w.layer, 4096, w.mm); got != w.typ {
					t.Errorf("%s", got)
				}
			})
		}
	}
	// A tied embedding is the classifier; a classifier whose rows are not
	// whole blocks of the base type is Q8_0.
	m, _ := ParseMix("Q4_K_M")
	if got := m.TensorType("token_embd.weight", 0, 4096, MixModel{Layers: 16, GQA: 4, Tied: true}); got != tensor.Q6_K {
		t.Errorf("tied embedding %s", got)
	}
	if got := m.TensorType("output.weight", 2, 64, MixModel{Layers: 2, GQA: 2}); got != tensor.Q8_0 {
		t.Errorf("64-column classifier %s", got)
	}
	// Rows of 64 values take the fallback of the rule's type.
	if got := m.TensorType("blk.0.attn_q.weight", 0, 64, MixModel{Layers: 2, GQA: 2}); got != tensor.Q5_0 {
		t.Errorf("64-column Q4_K matrix %s", got)
	}
}

func TestFallback(t *testing.T) {
	for _, c := range []struct {
		typ  tensor.DType
		cols int
		want tensor.DType
	}{
		{tensor.Q4_K, 256, tensor.Q4_K}, {tensor.Q4_K, 64, tensor.Q5_0}, {tensor.Q5_K, 64, tensor.Q5_1},
		{tensor.Q6_K, 128, tensor.Q8_0}, {tensor.Q2_K, 96, tensor.Q4_0}, {tensor.Q3_K, 32, tensor.Q4_0},
		{tensor.IQ4_XS, 160, tensor.IQ4_NL}, {tensor.Q4_0, 64, tensor.Q4_0}, {tensor.Q4_0, 48, tensor.F16},
		{tensor.Q6_K, 48, tensor.F16}, {tensor.Q5_1, 40, tensor.F16}, {tensor.F32, 5, tensor.F32},
	} {
		if got := Fallback(c.typ, c.cols); got != c.want {
			t.Errorf("Fallback(%s, %d) = %s, want %s", c.typ, c.cols, got, c.want)
		}
	}
}

func TestParseMix(t *testing.T) {
	for _, c := range []struct {
		name string
		ft   uint32
		base tensor.DType
	}{{"q4_k_m", 15, tensor.Q4_K}, {"Q2_K", 10, tensor.Q2_K}, {"IQ4_XS", 30, tensor.IQ4_XS}, {"Q3_K_M", 12, tensor.Q3_K},
		{"Q5_K_M", 17, tensor.Q5_K}, {"Q8_0", 7, tensor.Q8_0}, {"Q5_1", 9, tensor.Q5_1}, {"IQ4_NL", 25, tensor.IQ4_NL}} {
		m, err := ParseMix(c.name)
		if err != nil || m.FileType != c.ft || m.Base != c.base {
			t.Errorf("%s: %+v, %v", c.name, m, err)
		}
	}
	for _, bad := range []string{"Q9", "IQ2_XXS", "Q8_K", ""} {
		if _, err := ParseMix(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
