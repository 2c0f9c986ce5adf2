// Package gguf reads and writes GGUF files (versions 2 and 3), the
// container llama.cpp uses for model weights: a header of typed key/value
// metadata, an index of tensors (name, shape, GGML type, offset) and an
// aligned data section holding the tensors' bytes.
//
// Layout (all integers little-endian):
//
//	"GGUF" | uint32 version | uint64 tensor_count | uint64 kv_count
//	kv_count × { string key | uint32 value_type | value }
//	tensor_count × { string name | uint32 n_dims | n_dims × uint64 dim |
//	                 uint32 ggml_type | uint64 offset }
//	padding to general.alignment (default 32)
//	data section: each tensor at its offset (a multiple of the alignment)
//
// A string is a uint64 byte length and the bytes (no terminator). An array
// value is a uint32 element type, a uint64 count and the elements.
//
// The reader never trusts a count or length: each is checked against the
// bytes left before anything is allocated, so parsing arbitrary bytes costs
// memory proportional to their length and returns an error, never a panic.
package gguf

import (
	"fmt"
	"strings"

	"github.com/kvlm/kvlm/tensor"
)

// Magic is the first four bytes of a GGUF file, read as a little-endian uint32.
const Magic = 0x46554747 // "GGUF"

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// MaxAlignment is the largest accepted alignment (the largest power of two
// a uint32, general.alignment's type, holds).
const MaxAlignment = 1 << 31

// KeyAlignment is the metadata key that sets the data alignment.
const KeyAlignment = "general.alignment"

// MaxDims is the largest number of dimensions a tensor may have.
const MaxDims = 4

// maxArrayDepth caps the nesting of arrays of arrays (1 = a plain array).
const maxArrayDepth = 8

// ValueType is the type tag of a metadata value.
type ValueType uint32

// The GGUF metadata value types.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var typeNames = [...]string{
	"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
	"bool", "string", "array", "uint64", "int64", "float64",
}

func (t ValueType) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Valid reports whether t is one of the thirteen GGUF value types.
func (t ValueType) Valid() bool { return t <= TypeFloat64 }

// fixedSize is the encoded size of a scalar of type t (0 for string and
// array, whose size varies).
func (t ValueType) fixedSize() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// minSize is the fewest bytes one value of type t can take.
func (t ValueType) minSize() int {
	switch t {
	case TypeString:
		return 8 // length
	case TypeArray:
		return 12 // element type and count
	}
	return t.fixedSize()
}

// Array is an array value. Values is a typed slice matching Elem: []uint8,
// []int8, []uint16, []int16, []uint32, []int32, []float32, []bool,
// []string, []uint64, []int64, []float64, or []Array when Elem is TypeArray.
type Array struct {
	Elem   ValueType
	Values any
}

// Len is the number of elements (0 if Values is not a slice of Elem).
func (a Array) Len() int {
	switch v := a.Values.(type) {
	case []uint8:
		return len(v)
	case []int8:
		return len(v)
	case []uint16:
		return len(v)
	case []int16:
		return len(v)
	case []uint32:
		return len(v)
	case []int32:
		return len(v)
	case []float32:
		return len(v)
	case []bool:
		return len(v)
	case []string:
		return len(v)
	case []uint64:
		return len(v)
	case []int64:
		return len(v)
	case []float64:
		return len(v)
	case []Array:
		return len(v)
	}
	return 0
}

// KV is one metadata entry. Value holds a uint8, int8, uint16, int16,
// uint32, int32, float32, bool, string, uint64, int64, float64 or Array,
// as Type says.
type KV struct {
	Key   string
	Type  ValueType
	Value any
}

// TypeName describes the value's type, with the element type of arrays:
// "uint32", "array[string]", "array[array]".
func (kv KV) TypeName() string {
	if a, ok := kv.Value.(Array); ok && kv.Type == TypeArray {
		return "array[" + a.Elem.String() + "]"
	}
	return kv.Type.String()
}

// TensorInfo is one entry of the tensor index.
type TensorInfo struct {
	Name   string
	Shape  []uint64     // GGML order: Shape[0] is the innermost (contiguous) dimension
	Type   tensor.DType //
	Offset uint64       // from the start of the data section
	Size   uint64       // bytes
}

// Elements is the number of values in the tensor.
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

func (t *TensorInfo) String() string {
	dims := make([]string, len(t.Shape))
	for i, d := range t.Shape {
		dims[i] = fmt.Sprint(d)
	}
	return fmt.Sprintf("%s %s [%s] @%d+%d", t.Name, t.Type, strings.Join(dims, " "), t.Offset, t.Size)
}

// tensorSize is the byte size of a tensor of type typ and shape, with every
// check the reader and the writer share: a known type, 1..4 dimensions, no
// zero dimension, Shape[0] a multiple of the block size and element count
// and byte size within int64.
func tensorSize(typ tensor.DType, shape []uint64) (uint64, error) {
	if !typ.Known() {
		return 0, fmt.Errorf("unknown type %d", uint32(typ))
	}
	if len(shape) == 0 || len(shape) > MaxDims {
		return 0, fmt.Errorf("%d dimensions, want 1 to %d", len(shape), MaxDims)
	}
	const limit = 1<<63 - 1
	elems := uint64(1)
	for i, d := range shape {
		if d == 0 {
			return 0, fmt.Errorf("dimension %d is 0", i)
		}
		if d > limit/elems {
			return 0, fmt.Errorf("shape %v has more than 2^63-1 elements", shape)
		}
		elems *= d
	}
	bs, bb := uint64(typ.BlockSize()), uint64(typ.BlockBytes())
	if shape[0]%bs != 0 {
		return 0, fmt.Errorf("row length %d is not a multiple of the %s block size %d", shape[0], typ, bs)
	}
	blocks := elems / bs
	if blocks > limit/bb {
		return 0, fmt.Errorf("shape %v of %s takes more than 2^63-1 bytes", shape, typ)
	}
	return blocks * bb, nil
}
