// Package tensor holds the element types and block formats of weights and
// activations (the GGML type ids that GGUF files use), their conversion to
// float32, and the dot/matvec/matmul kernels the model runs on.
package tensor

import "fmt"

// DType is a GGML tensor type id, exactly as stored in a GGUF tensor index.
type DType uint32

// The GGML type ids. Only some are computable (see Supported); the others are
// known so that a file holding them can still be indexed and named in errors.
const (
	F32     DType = 0
	F16     DType = 1
	Q4_0    DType = 2
	Q4_1    DType = 3
	Q5_0    DType = 6
	Q5_1    DType = 7
	Q8_0    DType = 8
	Q8_1    DType = 9
	Q2_K    DType = 10
	Q3_K    DType = 11
	Q4_K    DType = 12
	Q5_K    DType = 13
	Q6_K    DType = 14
	Q8_K    DType = 15
	IQ2_XXS DType = 16
	IQ2_XS  DType = 17
	IQ3_XXS DType = 18
	IQ1_S   DType = 19
	IQ4_NL  DType = 20
	IQ3_S   DType = 21
	IQ2_S   DType = 22
	IQ4_XS  DType = 23
	I8      DType = 24
	I16     DType = 25
	I32     DType = 26
	I64     DType = 27
	F64     DType = 28
	IQ1_M   DType = 29
	BF16    DType = 30
	TQ1_0   DType = 34
	TQ2_0   DType = 35
	MXFP4   DType = 39
)

// QK_K is the number of values in one super-block of the K-quant formats.
const QK_K = 256

type typeInfo struct {
	name       string
	blockSize  int  // values per block
	blockBytes int  // bytes per block
	supported  bool // this package can dequantize and compute with it
}

// typeTable is indexed by type id (an array: BlockSize and BlockBytes run
// in the kernels' per-tile code, where a map lookup showed in profiles);
// ids without an entry have an empty name. Read it through typeOf.
var typeTable = [...]typeInfo{
	F32:     {"F32", 1, 4, true},
	F16:     {"F16", 1, 2, true},
	Q4_0:    {"Q4_0", 32, 18, true},
	Q4_1:    {"Q4_1", 32, 20, true},
	Q5_0:    {"Q5_0", 32, 22, true},
	Q5_1:    {"Q5_1", 32, 24, true},
	Q8_0:    {"Q8_0", 32, 34, true},
	Q8_1:    {"Q8_1", 32, 36, false},
	Q2_K:    {"Q2_K", QK_K, 84, true},
	Q3_K:    {"Q3_K", QK_K, 110, true},
	Q4_K:    {"Q4_K", QK_K, 144, true},
	Q5_K:    {"Q5_K", QK_K, 176, true},
	Q6_K:    {"Q6_K", QK_K, 210, true},
	Q8_K:    {"Q8_K", QK_K, 292, false},
	IQ2_XXS: {"IQ2_XXS", QK_K, 66, false},
	IQ2_XS:  {"IQ2_XS", QK_K, 74, false},
	IQ3_XXS: {"IQ3_XXS", QK_K, 98, false},
	IQ1_S:   {"IQ1_S", QK_K, 50, false},
	IQ4_NL:  {"IQ4_NL", 32, 18, true},
	IQ3_S:   {"IQ3_S", QK_K, 110, false},
	IQ2_S:   {"IQ2_S", QK_K, 82, false},
	IQ4_XS:  {"IQ4_XS", QK_K, 136, true},
	I8:      {"I8", 1, 1, false},
	I16:     {"I16", 1, 2, false},
	I32:     {"I32", 1, 4, false},
	I64:     {"I64", 1, 8, false},
	F64:     {"F64", 1, 8, false},
	IQ1_M:   {"IQ1_M", QK_K, 56, false},
	BF16:    {"BF16", 1, 2, true},
	TQ1_0:   {"TQ1_0", QK_K, 54, false},
	TQ2_0:   {"TQ2_0", QK_K, 66, false},
	MXFP4:   {"MXFP4", 32, 17, false},
}

// typeOf returns t's entry in typeTable and whether t is known.
func typeOf(t DType) (typeInfo, bool) {
	if uint64(t) < uint64(len(typeTable)) && typeTable[t].name != "" {
		return typeTable[t], true
	}
	return typeInfo{}, false
}

// Known reports whether t is a GGML type id whose block layout is known.
func (t DType) Known() bool { _, ok := typeOf(t); return ok }

// Supported reports whether this package can dequantize and compute with t.
func (t DType) Supported() bool { ti, _ := typeOf(t); return ti.supported }

func (t DType) String() string {
	if ti, ok := typeOf(t); ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of values in one block (1 for plain types).
func (t DType) BlockSize() int { ti, _ := typeOf(t); return ti.blockSize }

// BlockBytes is the size in bytes of one block.
func (t DType) BlockBytes() int { ti, _ := typeOf(t); return ti.blockBytes }

// BitsPerValue is the storage cost of one value, block metadata included.
func (t DType) BitsPerValue() float64 {
	ti, _ := typeOf(t)
	if ti.blockSize == 0 {
		return 0
	}
	return float64(8*ti.blockBytes) / float64(ti.blockSize)
}

// ParseDType maps a type name (case-insensitive, e.g. "q8_0", "F16") to its id.
func ParseDType(name string) (DType, error) {
	for id, ti := range typeTable {
		if ti.name != "" && equalFold(ti.name, name) {
			return DType(id), nil
		}
	}
	return 0, fmt.Errorf("unknown tensor type %q", name)
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// RowBytes is the size in bytes of n values of type t. n must be a multiple
// of the block size.
func (t DType) RowBytes(n int) (int, error) {
	ti, ok := typeOf(t)
	if !ok {
		return 0, fmt.Errorf("unknown tensor type %d", uint32(t))
	}
	if n < 0 || n%ti.blockSize != 0 {
		return 0, fmt.Errorf("%s: %d values is not a multiple of the block size %d", ti.name, n, ti.blockSize)
	}
	return n / ti.blockSize * ti.blockBytes, nil
}
