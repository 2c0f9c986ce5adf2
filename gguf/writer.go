package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/kvlm/kvlm/tensor"
)

// Writer builds a GGUF v3 file: metadata set with Set, tensors added with
// AddTensor or AddTensorFunc, then WriteTo or WriteFile. Tensors are laid out
// in the order added, each at the next multiple of the alignment, and each
// followed by zero padding to the alignment (as ggml writes them).
type Writer struct {
	kvs         []KV
	kvIndex     map[string]int
	tensors     []wtensor
	tensorIndex map[string]int
	alignment   uint64
	err         error // from SetAlignment, reported by WriteTo
}

type wtensor struct {
	info TensorInfo
	data []byte
	fill func(io.Writer) error
}

// NewWriter returns an empty Writer with the default alignment.
func NewWriter() *Writer {
	return &Writer{
		kvIndex:     map[string]int{},
		tensorIndex: map[string]int{},
		alignment:   DefaultAlignment,
	}
}

// Set sets key to value; the Go type decides the GGUF type: uint8, int8,
// uint16, int16, uint32, int32, float32, bool, string, uint64, int64,
// float64, a slice of one of those ([]uint8 ... []float64, []string,
// []bool), []Array or an Array (nested arrays allowed). Slices are copied.
// An existing key keeps its position and takes the new value. Setting
// general.alignment (any integer type) also sets the data alignment.
func (w *Writer) Set(key string, value any) error {
	t, v, err := normalize(value, 0)
	if err != nil {
		return fmt.Errorf("gguf: key %q: %w", key, err)
	}
	kv := KV{Key: key, Type: t, Value: v}
	if key == KeyAlignment {
		a, err := alignmentValue(kv)
		if err != nil {
			return fmt.Errorf("gguf: %w", err)
		}
		w.alignment = a
	}
	if i, ok := w.kvIndex[key]; ok {
		w.kvs[i] = kv
		return nil
	}
	w.kvIndex[key] = len(w.kvs)
	w.kvs = append(w.kvs, kv)
	return nil
}

// SetAlignment sets the data alignment (a power of two, at most
// MaxAlignment) and records it as general.alignment. An invalid alignment makes
// WriteTo fail.
func (w *Writer) SetAlignment(a uint64) {
	if a == 0 || a&(a-1) != 0 || a > MaxAlignment {
		w.err = fmt.Errorf("gguf: alignment %d is not a power of two from 1 to 2^31", a)
		return
	}
	w.err = nil
	_ = w.Set(KeyAlignment, uint32(a)) // cannot fail: a is valid
}

func cloneArray[T any](v []T) Array {
	c := slices.Clone(v)
	if c == nil {
		c = []T{}
	}
	var zero T
	return Array{Elem: goType(any(zero)), Values: c}
}

func goType(v any) ValueType {
	switch v.(type) {
	case uint8:
		return TypeUint8
	case int8:
		return TypeInt8
	case uint16:
		return TypeUint16
	case int16:
		return TypeInt16
	case uint32:
		return TypeUint32
	case int32:
		return TypeInt32
	case float32:
		return TypeFloat32
	case bool:
		return TypeBool
	case string:
		return TypeString
	case uint64:
		return TypeUint64
	case int64:
		return TypeInt64
	case float64:
		return TypeFloat64
	case Array:
		return TypeArray
	}
	return math.MaxUint32
}

// normalize maps a Go value to its GGUF type and stored value (arrays
// copied and checked against their element type).
func normalize(value any, depth int) (ValueType, any, error) {
	switch v := value.(type) {
	case uint8, int8, uint16, int16, uint32, int32, float32, bool, string, uint64, int64, float64:
		return goType(v), v, nil
	case []uint8:
		return TypeArray, cloneArray(v), nil
	case []int8:
		return TypeArray, cloneArray(v), nil
	case []uint16:
		return TypeArray, cloneArray(v), nil
	case []int16:
		return TypeArray, cloneArray(v), nil
	case []uint32:
		return TypeArray, cloneArray(v), nil
	case []int32:
		return TypeArray, cloneArray(v), nil
	case []float32:
		return TypeArray, cloneArray(v), nil
	case []bool:
		return TypeArray, cloneArray(v), nil
	case []string:
		return TypeArray, cloneArray(v), nil
	case []uint64:
		return TypeArray, cloneArray(v), nil
	case []int64:
		return TypeArray, cloneArray(v), nil
	case []float64:
		return TypeArray, cloneArray(v), nil
	case []Array:
		return normalize(Array{Elem: TypeArray, Values: v}, depth)
	case Array:
		if depth >= maxArrayDepth {
			return 0, nil, fmt.Errorf("arrays nested deeper than %d", maxArrayDepth)
		}
		if v.Elem == TypeArray {
			inner, ok := v.Values.([]Array)
			if !ok {
				return 0, nil, fmt.Errorf("array of %s holds %T, want []gguf.Array", v.Elem, v.Values)
			}
			out := make([]Array, len(inner))
			for i, a := range inner {
				_, n, err := normalize(a, depth+1)
				if err != nil {
					return 0, nil, fmt.Errorf("element %d: %w", i, err)
				}
				out[i] = n.(Array)
			}
			return TypeArray, Array{Elem: TypeArray, Values: out}, nil
		}
		t, n, err := normalize(v.Values, depth)
		if err != nil || t != TypeArray || n.(Array).Elem != v.Elem {
			return 0, nil, fmt.Errorf("array of %s holds %T", v.Elem, v.Values)
		}
		return TypeArray, n, nil
	case int, uint:
		return 0, nil, fmt.Errorf("%T has no fixed size: use int32, uint32, int64 or uint64", v)
	}
	return 0, nil, fmt.Errorf("unsupported value type %T", value)
}

// AddTensor adds a tensor; shape is in GGML order (shape[0] innermost) and
// len(data) must be RowBytes(shape[0]) × the product of the other
// dimensions. data is not copied: it must stay unchanged until written.
func (w *Writer) AddTensor(name string, typ tensor.DType, shape []uint64, data []byte) error {
	info, err := w.newTensor(name, typ, shape)
	if err != nil {
		return err
	}
	if uint64(len(data)) != info.Size {
		return fmt.Errorf("gguf: tensor %q: %s %v takes %d bytes, got %d", name, typ, shape, info.Size, len(data))
	}
	w.add(wtensor{info: info, data: data})
	return nil
}

// AddTensorFunc adds a tensor whose bytes fill writes when the file is
// written (for tensors too large to hold in memory). fill must write exactly
// the tensor's size in bytes.
func (w *Writer) AddTensorFunc(name string, typ tensor.DType, shape []uint64, fill func(w io.Writer) error) error {
	info, err := w.newTensor(name, typ, shape)
	if err != nil {
		return err
	}
	if fill == nil {
		return fmt.Errorf("gguf: tensor %q: nil fill function", name)
	}
	w.add(wtensor{info: info, fill: fill})
	return nil
}

func (w *Writer) newTensor(name string, typ tensor.DType, shape []uint64) (TensorInfo, error) {
	if _, dup := w.tensorIndex[name]; dup {
		return TensorInfo{}, fmt.Errorf("gguf: duplicate tensor %q", name)
	}
	size, err := tensorSize(typ, shape)
	if err != nil {
		return TensorInfo{}, fmt.Errorf("gguf: tensor %q: %w", name, err)
	}
	return TensorInfo{Name: name, Shape: slices.Clone(shape), Type: typ, Size: size}, nil
}

func (w *Writer) add(t wtensor) {
	w.tensorIndex[t.info.Name] = len(w.tensors)
	w.tensors = append(w.tensors, t)
}

// Tensors returns the tensor index as it will be written (offsets for the
// current alignment).
func (w *Writer) Tensors() []TensorInfo {
	out := make([]TensorInfo, len(w.tensors))
	off := uint64(0)
	for i, t := range w.tensors {
		out[i] = t.info
		out[i].Shape = slices.Clone(t.info.Shape)
		out[i].Offset = off
		off, _ = alignUp(off+t.info.Size, w.alignment)
	}
	return out
}

// countWriter counts bytes and keeps the first error.
type countWriter struct {
	w   *bufio.Writer
	n   int64
	err error
	buf [8]byte
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

func (c *countWriter) u8(v uint8) { c.Write([]byte{v}) }
func (c *countWriter) u16(v uint16) {
	binary.LittleEndian.PutUint16(c.buf[:], v)
	c.Write(c.buf[:2])
}
func (c *countWriter) u32(v uint32) {
	binary.LittleEndian.PutUint32(c.buf[:], v)
	c.Write(c.buf[:4])
}
func (c *countWriter) u64(v uint64) {
	binary.LittleEndian.PutUint64(c.buf[:], v)
	c.Write(c.buf[:8])
}
func (c *countWriter) str(s string) {
	c.u64(uint64(len(s)))
	if c.err == nil {
		n, err := c.w.WriteString(s)
		c.n += int64(n)
		c.err = err
	}
}

func (c *countWriter) pad(a uint64) {
	var zero [64]byte
	for n := (a - uint64(c.n)%a) % a; n > 0; {
		k := min(n, uint64(len(zero)))
		c.Write(zero[:k])
		n -= k
	}
}

func (c *countWriter) value(t ValueType, v any) {
	switch t {
	case TypeUint8:
		c.u8(v.(uint8))
	case TypeInt8:
		c.u8(uint8(v.(int8)))
	case TypeUint16:
		c.u16(v.(uint16))
	case TypeInt16:
		c.u16(uint16(v.(int16)))
	case TypeUint32:
		c.u32(v.(uint32))
	case TypeInt32:
		c.u32(uint32(v.(int32)))
	case TypeFloat32:
		c.u32(math.Float32bits(v.(float32)))
	case TypeUint64:
		c.u64(v.(uint64))
	case TypeInt64:
		c.u64(uint64(v.(int64)))
	case TypeFloat64:
		c.u64(math.Float64bits(v.(float64)))
	case TypeBool:
		if v.(bool) {
			c.u8(1)
		} else {
			c.u8(0)
		}
	case TypeString:
		c.str(v.(string))
	case TypeArray:
		a := v.(Array)
		c.u32(uint32(a.Elem))
		c.u64(uint64(a.Len()))
		switch s := a.Values.(type) {
		case []uint8:
			c.Write(s)
		case []Array:
			for _, e := range s {
				c.value(TypeArray, e)
			}
		default:
			forEach(a.Values, func(e any) { c.value(a.Elem, e) })
		}
	}
}

func forEach(values any, f func(any)) {
	switch s := values.(type) {
	case []int8:
		for _, e := range s {
			f(e)
		}
	case []uint16:
		for _, e := range s {
			f(e)
		}
	case []int16:
		for _, e := range s {
			f(e)
		}
	case []uint32:
		for _, e := range s {
			f(e)
		}
	case []int32:
		for _, e := range s {
			f(e)
		}
	case []float32:
		for _, e := range s {
			f(e)
		}
	case []bool:
		for _, e := range s {
			f(e)
		}
	case []string:
		for _, e := range s {
			f(e)
		}
	case []uint64:
		for _, e := range s {
			f(e)
		}
	case []int64:
		for _, e := range s {
			f(e)
		}
	case []float64:
		for _, e := range s {
			f(e)
		}
	}
}

// WriteTo writes the file (GGUF version 3) to out.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	if w.err != nil {
		return 0, w.err
	}
	c := &countWriter{w: bufio.NewWriterSize(out, 1<<20)}
	c.u32(Magic)
	c.u32(3)
	c.u64(uint64(len(w.tensors)))
	c.u64(uint64(len(w.kvs)))
	for _, kv := range w.kvs {
		c.str(kv.Key)
		c.u32(uint32(kv.Type))
		c.value(kv.Type, kv.Value)
	}
	infos := w.Tensors()
	for _, t := range infos {
		c.str(t.Name)
		c.u32(uint32(len(t.Shape)))
		for _, d := range t.Shape {
			c.u64(d)
		}
		c.u32(uint32(t.Type))
		c.u64(t.Offset)
	}
	c.pad(w.alignment)
	for i, t := range w.tensors {
		start := c.n
		if t.fill != nil {
			if err := t.fill(c); err != nil && c.err == nil {
				return c.n, fmt.Errorf("gguf: tensor %q: %w", t.info.Name, err)
			}
		} else {
			c.Write(t.data)
		}
		if c.err != nil {
			break
		}
		if got := uint64(c.n - start); got != infos[i].Size {
			return c.n, fmt.Errorf("gguf: tensor %q: wrote %d bytes, want %d", t.info.Name, got, infos[i].Size)
		}
		c.pad(w.alignment)
	}
	if c.err == nil {
		c.err = c.w.Flush()
	}
	if c.err != nil {
		return c.n, fmt.Errorf("gguf: write: %w", c.err)
	}
	return c.n, nil
}

// WriteFile writes the file to path atomically: into a temporary file in
// the same directory, synced, then renamed over path.
func (w *Writer) WriteFile(path string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = w.WriteTo(tmp); err != nil {
		return err
	}
	if err = tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	return nil
}
