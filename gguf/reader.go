package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvlm/kvlm/tensor"
)

// File is a parsed GGUF file. Its metadata and tensor index are ordinary Go
// values (copied out of the file); TensorData returns slices of the file's
// bytes, which for a File from Open stay valid only until Close.
type File struct {
	Version    uint32
	KVs        []KV         // in file order
	Tensors    []TensorInfo // in file order
	Alignment  uint64
	DataOffset uint64 // absolute file offset of the data section
	Size       uint64 // bytes in the file

	data        []byte
	unmap       func() error
	writable    bool // data is this File's own memory (Load)
	kvIndex     map[string]int
	tensorIndex map[string]int
}

// Parse parses a GGUF file held in data. The File refers to data (no copy)
// for TensorData.
func Parse(data []byte) (*File, error) {
	f, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	return f, nil
}

// Close releases the file mapping of a File from Open; afterwards TensorData
// returns nil and slices it returned before must no longer be used. Close
// is a no-op for a File from Parse and safe to call twice.
func (f *File) Close() error {
	f.data = nil
	if f.unmap == nil {
		return nil
	}
	u := f.unmap
	f.unmap = nil
	if err := u(); err != nil {
		return fmt.Errorf("gguf: unmap: %w", err)
	}
	return nil
}

// Lookup returns the entry for key.
func (f *File) Lookup(key string) (KV, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return KV{}, false
	}
	return f.KVs[i], true
}

// Tensor returns the index entry of the named tensor.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tensorIndex[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// Writable reports whether the tensors' bytes are the File's own memory
// (Load), which a reader may rearrange in place (tensor.NewPanelMatrix):
// then each tensor's bytes must be taken over by one reader only.
func (f *File) Writable() bool { return f.writable }

// TensorData returns the bytes of t (zero copy), or nil if t does not lie
// within the file (never the case for an entry of f.Tensors) or f is closed.
// The bytes must not be modified unless Writable: for a File from Open they
// are a read-only mapping.
func (f *File) TensorData(t *TensorInfo) []byte {
	if t == nil || f.data == nil {
		return nil
	}
	start, ok := addU64(f.DataOffset, t.Offset)
	if !ok {
		return nil
	}
	end, ok := addU64(start, t.Size)
	if !ok || end > uint64(len(f.data)) {
		return nil
	}
	return f.data[start:end:end]
}

// --- typed accessors ---

func (f *File) get(key string) (KV, error) {
	kv, ok := f.Lookup(key)
	if !ok {
		return KV{}, fmt.Errorf("gguf: key %q missing", key)
	}
	return kv, nil
}

func typeError(kv KV, want string) error {
	return fmt.Errorf("gguf: key %q has type %s, want %s", kv.Key, kv.TypeName(), want)
}

// String returns a string value.
func (f *File) String(key string) (string, error) {
	kv, err := f.get(key)
	if err != nil {
		return "", err
	}
	s, ok := kv.Value.(string)
	if !ok {
		return "", typeError(kv, "string")
	}
	return s, nil
}

// asInt64 converts any integer value; big is set for a uint64 above
// MaxInt64 (its value is then in u).
func asInt64(v any) (i int64, u uint64, big, ok bool) {
	switch x := v.(type) {
	case uint8:
		return int64(x), 0, false, true
	case int8:
		return int64(x), 0, false, true
	case uint16:
		return int64(x), 0, false, true
	case int16:
		return int64(x), 0, false, true
	case uint32:
		return int64(x), 0, false, true
	case int32:
		return int64(x), 0, false, true
	case int64:
		return x, 0, false, true
	case uint64:
		if x > math.MaxInt64 {
			return 0, x, true, true
		}
		return int64(x), 0, false, true
	}
	return 0, 0, false, false
}

// Uint returns an integer value of any integer type, which must not be
// negative.
func (f *File) Uint(key string) (uint64, error) {
	kv, err := f.get(key)
	if err != nil {
		return 0, err
	}
	i, u, big, ok := asInt64(kv.Value)
	switch {
	case !ok:
		return 0, typeError(kv, "an unsigned integer")
	case big:
		return u, nil
	case i < 0:
		return 0, fmt.Errorf("gguf: key %q is %d, want a non-negative value", key, i)
	}
	return uint64(i), nil
}

// Int returns an integer value of any integer type that fits in int64.
func (f *File) Int(key string) (int64, error) {
	kv, err := f.get(key)
	if err != nil {
		return 0, err
	}
	i, u, big, ok := asInt64(kv.Value)
	switch {
	case !ok:
		return 0, typeError(kv, "an integer")
	case big:
		return 0, fmt.Errorf("gguf: key %q is %d, which overflows int64", key, u)
	}
	return i, nil
}

// Float returns a float32 or float64 value; integers are converted too.
func (f *File) Float(key string) (float64, error) {
	kv, err := f.get(key)
	if err != nil {
		return 0, err
	}
	switch x := kv.Value.(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	}
	i, u, big, ok := asInt64(kv.Value)
	switch {
	case !ok:
		return 0, typeError(kv, "a number")
	case big:
		return float64(u), nil
	}
	return float64(i), nil
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, error) {
	kv, err := f.get(key)
	if err != nil {
		return false, err
	}
	b, ok := kv.Value.(bool)
	if !ok {
		return false, typeError(kv, "bool")
	}
	return b, nil
}

// Array returns an array value.
func (f *File) Array(key string) (Array, error) {
	kv, err := f.get(key)
	if err != nil {
		return Array{}, err
	}
	a, ok := kv.Value.(Array)
	if !ok {
		return Array{}, typeError(kv, "array")
	}
	return a, nil
}

// Strings returns an array of strings. The slice is shared with f.KVs and
// must not be modified.
func (f *File) Strings(key string) ([]string, error) {
	a, err := f.Array(key)
	if err != nil {
		return nil, err
	}
	s, ok := a.Values.([]string)
	if !ok {
		kv, _ := f.Lookup(key)
		return nil, typeError(kv, "array[string]")
	}
	return s, nil
}

// Float32s returns an array of numbers as float32: a float32 array as is
// (shared with f.KVs, must not be modified), float64 and integer arrays
// converted.
func (f *File) Float32s(key string) ([]float32, error) {
	a, err := f.Array(key)
	if err != nil {
		return nil, err
	}
	switch v := a.Values.(type) {
	case []float32:
		return v, nil
	case []float64:
		return convert(v, func(x float64) float32 { return float32(x) }), nil
	}
	if ints, ok := intElems(a); ok {
		out := make([]float32, len(ints))
		for i, x := range ints {
			out[i] = float32(x.float())
		}
		return out, nil
	}
	kv, _ := f.Lookup(key)
	return nil, typeError(kv, "array[float32]")
}

// Int32s returns an array of integers of any integer type as int32; an
// element outside the int32 range is an error.
func (f *File) Int32s(key string) ([]int32, error) {
	a, err := f.Array(key)
	if err != nil {
		return nil, err
	}
	if v, ok := a.Values.([]int32); ok {
		return v, nil
	}
	ints, ok := intElems(a)
	if !ok {
		kv, _ := f.Lookup(key)
		return nil, typeError(kv, "array[int32]")
	}
	out := make([]int32, len(ints))
	for i, x := range ints {
		if x.big || x.i < math.MinInt32 || x.i > math.MaxInt32 {
			return nil, fmt.Errorf("gguf: key %q: element %d (%s) is out of the int32 range", key, i, x)
		}
		out[i] = int32(x.i)
	}
	return out, nil
}

// wideInt holds any GGUF integer: i, or u when big (a uint64 > MaxInt64).
type wideInt struct {
	i   int64
	u   uint64
	big bool
}

func (x wideInt) float() float64 {
	if x.big {
		return float64(x.u)
	}
	return float64(x.i)
}

func (x wideInt) String() string {
	if x.big {
		return fmt.Sprint(x.u)
	}
	return fmt.Sprint(x.i)
}

func convert[S, D any](s []S, f func(S) D) []D {
	out := make([]D, len(s))
	for i, x := range s {
		out[i] = f(x)
	}
	return out
}

// intElems widens the elements of an integer array.
func intElems(a Array) ([]wideInt, bool) {
	switch v := a.Values.(type) {
	case []uint8:
		return convert(v, func(x uint8) wideInt { return wideInt{i: int64(x)} }), true
	case []int8:
		return convert(v, func(x int8) wideInt { return wideInt{i: int64(x)} }), true
	case []uint16:
		return convert(v, func(x uint16) wideInt { return wideInt{i: int64(x)} }), true
	case []int16:
		return convert(v, func(x int16) wideInt { return wideInt{i: int64(x)} }), true
	case []uint32:
		return convert(v, func(x uint32) wideInt { return wideInt{i: int64(x)} }), true
	case []int32:
		return convert(v, func(x int32) wideInt { return wideInt{i: int64(x)} }), true
	case []int64:
		return convert(v, func(x int64) wideInt { return wideInt{i: x} }), true
	case []uint64:
		return convert(v, func(x uint64) wideInt {
			if x > math.MaxInt64 {
				return wideInt{u: x, big: true}
			}
			return wideInt{i: int64(x)}
		}), true
	}
	return nil, false
}

// --- parsing ---

// decoder reads little-endian values from data, checking every read
// against the bytes left.
type decoder struct {
	data []byte
	off  int
}

func (d *decoder) left() int { return len(d.data) - d.off }

// need fails unless n more bytes are available; what names the item read.
func (d *decoder) need(n uint64, what func() string) error {
	if n > uint64(d.left()) {
		return fmt.Errorf("truncated: %s needs %d bytes at offset %d, file has %d", what(), n, d.off, len(d.data))
	}
	return nil
}

func (d *decoder) u8(what func() string) (uint8, error) {
	if err := d.need(1, what); err != nil {
		return 0, err
	}
	v := d.data[d.off]
	d.off++
	return v, nil
}

func (d *decoder) u16(what func() string) (uint16, error) {
	if err := d.need(2, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint16(d.data[d.off:])
	d.off += 2
	return v, nil
}

func (d *decoder) u32(what func() string) (uint32, error) {
	if err := d.need(4, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint32(d.data[d.off:])
	d.off += 4
	return v, nil
}

func (d *decoder) u64(what func() string) (uint64, error) {
	if err := d.need(8, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint64(d.data[d.off:])
	d.off += 8
	return v, nil
}

func (d *decoder) str(what func() string) (string, error) {
	n, err := d.u64(func() string { return what() + " length" })
	if err != nil {
		return "", err
	}
	if n > uint64(d.left()) {
		return "", fmt.Errorf("truncated: %s: string of %d bytes at offset %d exceeds the %d bytes left", what(), n, d.off, d.left())
	}
	s := string(d.data[d.off : d.off+int(n)])
	d.off += int(n)
	return s, nil
}

func sprintf(format string, args ...any) func() string {
	return func() string { return fmt.Sprintf(format, args...) }
}

func parse(data []byte) (*File, error) {
	d := &decoder{data: data}
	if len(data) < 4 {
		return nil, fmt.Errorf("truncated: magic needs 4 bytes, file has %d", len(data))
	}
	if m := binary.LittleEndian.Uint32(data); m != Magic {
		return nil, fmt.Errorf("bad magic %q, want \"GGUF\"", data[:4])
	}
	d.off = 4
	version, err := d.u32(sprintf("version"))
	if err != nil {
		return nil, err
	}
	switch {
	case version == 2 || version == 3:
	case version == 1:
		return nil, errors.New("version 1 is not supported (want 2 or 3)")
	case version&0xFFFF == 0 && bitsSwap32(version) >= 1 && bitsSwap32(version) <= 3:
		return nil, fmt.Errorf("big-endian GGUF (version %d) is not supported", bitsSwap32(version))
	default:
		return nil, fmt.Errorf("unsupported version %d (want 2 or 3)", version)
	}
	nTensors, err := d.u64(sprintf("tensor count"))
	if err != nil {
		return nil, err
	}
	nKV, err := d.u64(sprintf("kv count"))
	if err != nil {
		return nil, err
	}
	// Every KV takes at least 13 bytes (empty key, type, a 1-byte value) and
	// every tensor info 32 (empty name, n_dims, one dim, type, offset).
	const minKV, minTensor = 8 + 4 + 1, 8 + 4 + 8 + 4 + 8
	left := uint64(d.left())
	if nKV > left/minKV {
		return nil, fmt.Errorf("kv count %d needs at least %d bytes per entry, %d bytes left", nKV, minKV, left)
	}
	if nTensors > (left-nKV*minKV)/minTensor {
		return nil, fmt.Errorf("tensor count %d needs at least %d bytes per entry, %d bytes left after %d kvs", nTensors, minTensor, left, nKV)
	}

	f := &File{
		Version:     version,
		KVs:         make([]KV, 0, nKV),
		Tensors:     make([]TensorInfo, 0, nTensors),
		Alignment:   DefaultAlignment,
		Size:        uint64(len(data)),
		data:        data,
		kvIndex:     make(map[string]int, nKV),
		tensorIndex: make(map[string]int, nTensors),
	}

	for i := uint64(0); i < nKV; i++ {
		key, err := d.str(sprintf("key %d", i))
		if err != nil {
			return nil, err
		}
		if _, dup := f.kvIndex[key]; dup {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		t, err := d.u32(sprintf("type of key %q", key))
		if err != nil {
			return nil, err
		}
		vt := ValueType(t)
		if !vt.Valid() {
			return nil, fmt.Errorf("key %q: unknown value type %d", key, t)
		}
		v, err := d.value(vt, key, 0)
		if err != nil {
			return nil, err
		}
		f.kvIndex[key] = len(f.KVs)
		f.KVs = append(f.KVs, KV{Key: key, Type: vt, Value: v})
	}

	if kv, ok := f.Lookup(KeyAlignment); ok {
		a, err := alignmentValue(kv)
		if err != nil {
			return nil, err
		}
		f.Alignment = a
	}

	for i := uint64(0); i < nTensors; i++ {
		ti, err := d.tensorInfo(i, f.Alignment)
		if err != nil {
			return nil, err
		}
		if _, dup := f.tensorIndex[ti.Name]; dup {
			return nil, fmt.Errorf("duplicate tensor %q", ti.Name)
		}
		f.tensorIndex[ti.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ti)
	}

	var ok bool
	f.DataOffset, ok = alignUp(uint64(d.off), f.Alignment)
	if !ok {
		return nil, fmt.Errorf("data section offset overflows with alignment %d", f.Alignment)
	}
	if err := f.checkTensorPlacement(); err != nil {
		return nil, err
	}
	return f, nil
}

func bitsSwap32(v uint32) uint32 {
	return v>>24 | (v>>8)&0xff00 | (v<<8)&0xff0000 | v<<24
}

func alignmentValue(kv KV) (uint64, error) {
	i, u, big, ok := asInt64(kv.Value)
	if !ok {
		return 0, fmt.Errorf("key %q has type %s, want uint32", kv.Key, kv.TypeName())
	}
	a := uint64(i)
	if big {
		a = u
	}
	if i < 0 || a == 0 || a&(a-1) != 0 || a > MaxAlignment {
		return 0, fmt.Errorf("key %q: alignment %s is not a power of two from 1 to 2^31", kv.Key, wideInt{i, u, big})
	}
	return a, nil
}

func addU64(a, b uint64) (uint64, bool) {
	s := a + b
	return s, s >= a
}

func alignUp(n, a uint64) (uint64, bool) {
	s, ok := addU64(n, a-1)
	return s &^ (a - 1), ok
}

func (d *decoder) value(t ValueType, key string, depth int) (any, error) {
	what := func() string { return fmt.Sprintf("value of key %q", key) }
	switch t {
	case TypeUint8:
		return d.u8(what)
	case TypeInt8:
		v, err := d.u8(what)
		return int8(v), err
	case TypeUint16:
		return d.u16(what)
	case TypeInt16:
		v, err := d.u16(what)
		return int16(v), err
	case TypeUint32:
		return d.u32(what)
	case TypeInt32:
		v, err := d.u32(what)
		return int32(v), err
	case TypeFloat32:
		v, err := d.u32(what)
		return math.Float32frombits(v), err
	case TypeUint64:
		return d.u64(what)
	case TypeInt64:
		v, err := d.u64(what)
		return int64(v), err
	case TypeFloat64:
		v, err := d.u64(what)
		return math.Float64frombits(v), err
	case TypeBool:
		v, err := d.u8(what)
		if err != nil {
			return nil, err
		}
		if v > 1 {
			return nil, fmt.Errorf("key %q: bool value %d is not 0 or 1", key, v)
		}
		return v == 1, nil
	case TypeString:
		return d.str(what)
	case TypeArray:
		return d.array(key, depth+1)
	}
	return nil, fmt.Errorf("key %q: unknown value type %d", key, uint32(t))
}

func (d *decoder) array(key string, depth int) (Array, error) {
	if depth > maxArrayDepth {
		return Array{}, fmt.Errorf("key %q: arrays nested deeper than %d", key, maxArrayDepth)
	}
	et, err := d.u32(sprintf("array element type of key %q", key))
	if err != nil {
		return Array{}, err
	}
	elem := ValueType(et)
	if !elem.Valid() {
		return Array{}, fmt.Errorf("key %q: unknown array element type %d", key, et)
	}
	n64, err := d.u64(sprintf("array length of key %q", key))
	if err != nil {
		return Array{}, err
	}
	if minSz := uint64(elem.minSize()); n64 > uint64(d.left())/minSz {
		return Array{}, fmt.Errorf("truncated: key %q: array of %d %s at offset %d needs at least %d bytes each, %d bytes left",
			key, n64, elem, d.off, minSz, d.left())
	}
	n := int(n64)
	a := Array{Elem: elem}
	what := func() string { return fmt.Sprintf("array element of key %q", key) }
	b := d.data[d.off:]
	switch elem {
	case TypeUint8:
		a.Values = slices.Clone(b[:n:n])
		if n == 0 {
			a.Values = []uint8{}
		}
	case TypeInt8:
		a.Values = fixed(b, n, 1, func(p []byte) int8 { return int8(p[0]) })
	case TypeUint16:
		a.Values = fixed(b, n, 2, binary.LittleEndian.Uint16)
	case TypeInt16:
		a.Values = fixed(b, n, 2, func(p []byte) int16 { return int16(binary.LittleEndian.Uint16(p)) })
	case TypeUint32:
		a.Values = fixed(b, n, 4, binary.LittleEndian.Uint32)
	case TypeInt32:
		a.Values = fixed(b, n, 4, func(p []byte) int32 { return int32(binary.LittleEndian.Uint32(p)) })
	case TypeFloat32:
		a.Values = fixed(b, n, 4, func(p []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(p)) })
	case TypeUint64:
		a.Values = fixed(b, n, 8, binary.LittleEndian.Uint64)
	case TypeInt64:
		a.Values = fixed(b, n, 8, func(p []byte) int64 { return int64(binary.LittleEndian.Uint64(p)) })
	case TypeFloat64:
		a.Values = fixed(b, n, 8, func(p []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(p)) })
	case TypeBool:
		v := make([]bool, n)
		for i, c := range b[:n] {
			if c > 1 {
				return Array{}, fmt.Errorf("key %q: bool element %d is %d, not 0 or 1", key, i, c)
			}
			v[i] = c == 1
		}
		a.Values = v
	case TypeString:
		v := make([]string, n)
		for i := range v {
			if v[i], err = d.str(what); err != nil {
				return Array{}, err
			}
		}
		a.Values = v
		return a, nil
	case TypeArray:
		v := make([]Array, n)
		for i := range v {
			if v[i], err = d.array(key, depth+1); err != nil {
				return Array{}, err
			}
		}
		a.Values = v
		return a, nil
	}
	d.off += n * elem.fixedSize()
	return a, nil
}

// fixed decodes n fixed-size elements from b (the caller checked that b
// holds them).
func fixed[T any](b []byte, n, size int, get func([]byte) T) []T {
	v := make([]T, n)
	for i := range v {
		v[i] = get(b[i*size:])
	}
	return v
}

func (d *decoder) tensorInfo(i uint64, alignment uint64) (TensorInfo, error) {
	name, err := d.str(sprintf("tensor %d name", i))
	if err != nil {
		return TensorInfo{}, err
	}
	nDims, err := d.u32(sprintf("n_dims of tensor %q", name))
	if err != nil {
		return TensorInfo{}, err
	}
	if nDims == 0 || nDims > MaxDims {
		return TensorInfo{}, fmt.Errorf("tensor %q: %d dimensions, want 1 to %d", name, nDims, MaxDims)
	}
	shape := make([]uint64, nDims)
	for j := range shape {
		if shape[j], err = d.u64(sprintf("dimension %d of tensor %q", j, name)); err != nil {
			return TensorInfo{}, err
		}
	}
	typ, err := d.u32(sprintf("type of tensor %q", name))
	if err != nil {
		return TensorInfo{}, err
	}
	off, err := d.u64(sprintf("offset of tensor %q", name))
	if err != nil {
		return TensorInfo{}, err
	}
	size, err := tensorSize(tensor.DType(typ), shape)
	if err != nil {
		return TensorInfo{}, fmt.Errorf("tensor %q: %w", name, err)
	}
	if off%alignment != 0 {
		return TensorInfo{}, fmt.Errorf("tensor %q: offset %d is not a multiple of the alignment %d", name, off, alignment)
	}
	return TensorInfo{Name: name, Shape: shape, Type: tensor.DType(typ), Offset: off, Size: size}, nil
}

// checkTensorPlacement checks that every tensor lies within the file and
// that no two overlap.
func (f *File) checkTensorPlacement() error {
	fileSize := uint64(len(f.data))
	for i := range f.Tensors {
		t := &f.Tensors[i]
		start, ok1 := addU64(f.DataOffset, t.Offset)
		end, ok2 := addU64(start, t.Size)
		if !ok1 || !ok2 {
			return fmt.Errorf("tensor %q: offset %d and size %d overflow", t.Name, t.Offset, t.Size)
		}
		if end > fileSize {
			return fmt.Errorf("truncated: tensor %q needs bytes [%d,%d), file has %d", t.Name, start, end, fileSize)
		}
	}
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		oa, ob := f.Tensors[a].Offset, f.Tensors[b].Offset
		switch {
		case oa < ob:
			return -1
		case oa > ob:
			return 1
		}
		return a - b
	})
	for k := 1; k < len(order); k++ {
		p, c := &f.Tensors[order[k-1]], &f.Tensors[order[k]]
		if p.Offset+p.Size > c.Offset {
			return fmt.Errorf("tensors %q [%d,%d) and %q [%d,%d) overlap in the data section",
				p.Name, p.Offset, p.Offset+p.Size, c.Name, c.Offset, c.Offset+c.Size)
		}
	}
	return nil
}
