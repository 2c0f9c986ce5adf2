package convert

import (
	"fmt"
	"strings"

	"github.com/kvlm/kvlm/tensor"
)

// A Mix says which type each weight matrix of a file is written in: a
// plain type (every matrix that type), or one of llama.cpp's mixes, whose
// per-tensor choices are those of llama-quantize (src/llama-quant.cpp,
// llama_tensor_get_type_impl, for a dense model without an importance
// matrix and architectures other than falcon):
//
//   - the classifier (output.weight, or token_embd.weight when the
//     embedding is tied): Q8_0 when its rows are not whole blocks of the
//     mix's base type, else Q6_K;
//   - attn_v (and fused attn_qkv: llama-quantize's category_is_attn_v;
//     its ATTENTION_QKV branch after it is never reached) of layer i of n:
//     Q2_K: Q4_K when heads/kv_heads >= 4, else Q3_K;
//     Q3_K_M: Q5_K for i < 2, else Q4_K;
//     Q4_K_M, Q5_K_M: Q6_K when useMoreBits(i, n);
//     IQ4_XS: Q5_K when heads/kv_heads >= 4;
//   - ffn_down of layer i of n:
//     Q2_K: Q3_K; Q3_K_M: Q5_K for i < n/16, else Q4_K;
//     Q4_K_M, Q5_K_M: Q6_K when useMoreBits(i, n); IQ4_XS: Q5_K for i < n/8;
//   - attn_output: Q2_K: Q3_K; Q3_K_M: Q4_K;
//   - every other matrix (token_embd untied, attn_q, attn_k, ffn_gate,
//     ffn_up): the base type (Q2_K, Q3_K, Q4_K, Q5_K, IQ4_XS).
//
// Then Fallback: a matrix whose rows are not whole blocks of its type
// takes llama.cpp's fallback type (tensor_type_fallback).
type Mix struct {
	Name     string       // as given on the command line: "Q4_K_M", "Q8_0", …
	Base     tensor.DType // the type of the matrices no rule names
	FileType uint32       // llama.cpp's general.file_type (llama_ftype)
	llama    bool         // a llama.cpp mix (the rules above), not a plain type
}

// mixes are the mixes by name; plain types are every computable type.
var mixes = []Mix{
	{"Q2_K", tensor.Q2_K, 10, true},
	{"Q3_K_M", tensor.Q3_K, 12, true},
	{"Q4_K_M", tensor.Q4_K, 15, true},
	{"Q5_K_M", tensor.Q5_K, 17, true},
	{"IQ4_XS", tensor.IQ4_XS, 30, true},
}

// plainFileType is general.file_type for files whose matrices are all
// of type t (the K-quants: llama.cpp's _S mixes, the closest).
var plainFileType = map[tensor.DType]uint32{
	tensor.F32: 0, tensor.F16: 1, tensor.Q4_0: 2, tensor.Q4_1: 3, tensor.Q8_0: 7, tensor.Q5_0: 8, tensor.Q5_1: 9,
	tensor.Q3_K: 11, tensor.Q4_K: 14, tensor.Q5_K: 16, tensor.Q6_K: 18, tensor.IQ4_NL: 25, tensor.BF16: 32,
	tensor.Q2_K: 10, tensor.IQ4_XS: 30, // by ParseMix's names, the mixes
}

// MixNames lists the names ParseMix accepts: the plain types, then the
// llama.cpp mixes (Q2_K and IQ4_XS name the mixes, as in llama-quantize).
func MixNames() []string {
	var n []string
	for _, t := range []tensor.DType{tensor.F32, tensor.F16, tensor.BF16, tensor.Q8_0, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0,
		tensor.Q5_1, tensor.IQ4_NL, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K} {
		n = append(n, t.String())
	}
	for _, m := range mixes {
		n = append(n, m.Name)
	}
	return n
}

// ParseMix maps a name of MixNames (case-insensitive) to its mix.
func ParseMix(name string) (Mix, error) {
	for _, m := range mixes {
		if strings.EqualFold(m.Name, name) {
			return m, nil
		}
	}
	t, err := tensor.ParseDType(name)
	if ft, ok := plainFileType[t]; err == nil && ok {
		return Mix{Name: t.String(), Base: t, FileType: ft}, nil
	}
	return Mix{}, fmt.Errorf("unknown weight type %q (one of %s)", name, strings.Join(MixNames(), ", "))
}

// MixModel is what the mixes' rules look at besides a tensor's name.
type MixModel struct {
	Layers int  // transformer blocks
	GQA    int  // query heads per KV head
	Tied   bool // no output.weight: token_embd.weight is the classifier
}

// useMoreBits is llama.cpp's use_more_bits: the first and last eighth of
// the layers and every third layer in between.
func useMoreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

// RuleType is the type the mix's rules give the 2-D weight name (layer:
// its block index, for blk.* tensors) with rows of cols values, before
// Fallback.
func (m Mix) RuleType(name string, layer, cols int, mm MixModel) tensor.DType {
	if !m.llama {
		return m.Base
	}
	has := func(s string) bool { return strings.HasSuffix(name, s) }
	n := mm.Layers
	switch {
	case name == "output.weight" || mm.Tied && name == "token_embd.weight":
		if cols%m.Base.BlockSize() != 0 {
			return tensor.Q8_0
		}
		return tensor.Q6_K
	case has("attn_v.weight") || has("attn_qkv.weight"):
		switch m.Name {
		case "Q2_K":
			if mm.GQA >= 4 {
				return tensor.Q4_K
			}
			return tensor.Q3_K
		case "Q3_K_M":
			if layer < 2 {
				return tensor.Q5_K
			}
			return tensor.Q4_K
		case "Q4_K_M", "Q5_K_M":
			if useMoreBits(layer, n) {
				return tensor.Q6_K
			}
		case "IQ4_XS":
			if mm.GQA >= 4 {
				return tensor.Q5_K
			}
		}
	case has("ffn_down.weight"):
		switch m.Name {
		case "Q2_K":
			return tensor.Q3_K
		case "Q3_K_M":
			if layer < n/16 {
				return tensor.Q5_K
			}
			return tensor.Q4_K
		case "Q4_K_M", "Q5_K_M":
			if useMoreBits(layer, n) {
				return tensor.Q6_K
			}
		case "IQ4_XS":
			if layer < n/8 {
				return tensor.Q5_K
			}
		}
	case has("attn_output.weight"):
		switch m.Name {
		case "Q2_K":
			return tensor.Q3_K
		case "Q3_K_M":
			return tensor.Q4_K
		}
	}
	return m.Base
}

// TensorType is RuleType then Fallback.
func (m Mix) TensorType(name string, layer, cols int, mm MixModel) tensor.DType {
	return Fallback(m.RuleType(name, layer, cols, mm), cols)
}

// Fallback is the type a matrix of type t whose rows hold cols values is
// written in: t where its blocks divide the rows, else llama.cpp's
// fallback (tensor_type_fallback): IQ4_XS → IQ4_NL; Q2_K, Q3_K → Q4_0;
// Q4_K → Q5_0; Q5_K → Q5_1; Q6_K → Q8_0; F16 where that does not divide
// them either, and for the 32-value types (for which llama.cpp has no
// fallback and stops).
func Fallback(t tensor.DType, cols int) tensor.DType {
	if cols%t.BlockSize() == 0 {
		return t
	}
	fb := map[tensor.DType]tensor.DType{
		tensor.IQ4_XS: tensor.IQ4_NL, tensor.Q2_K: tensor.Q4_0, tensor.Q3_K: tensor.Q4_0,
		tensor.Q4_K: tensor.Q5_0, tensor.Q5_K: tensor.Q5_1, tensor.Q6_K: tensor.Q8_0,
	}[t]
	if fb != 0 && cols%fb.BlockSize() == 0 {
		return fb
	}
	return tensor.F16
}
