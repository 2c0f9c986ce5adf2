package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/tensor"
)

// raw encodes GGUF pieces by hand, independently of Writer, so that tests
// can build exact (and malformed) files.
type raw struct{ b []byte }

func (r *raw) u8(v uint8) *raw   { r.b = append(r.b, v); return r }
func (r *raw) u16(v uint16) *raw { r.b = binary.LittleEndian.AppendUint16(r.b, v); return r }
func (r *raw) u32(v uint32) *raw { r.b = binary.LittleEndian.AppendUint32(r.b, v); return r }
func (r *raw) u64(v uint64) *raw { r.b = binary.LittleEndian.AppendUint64(r.b, v); return r }
func (r *raw) str(s string) *raw { r.u64(uint64(len(s))); r.b = append(r.b, s...); return r }
func (r *raw) bytes(p []byte) *raw {
	r.b = append(r.b, p...)
	return r
}
func (r *raw) padTo(a int) *raw {
	for len(r.b)%a != 0 {
		r.b = append(r.b, 0)
	}
	return r
}
func header(nTensors, nKV uint64) *raw {
	return (&raw{}).bytes([]byte("GGUF")).u32(3).u64(nTensors).u64(nKV)
}

// tensorInfo appends one tensor index entry.
func (r *raw) tensorInfo(name string, dims []uint64, typ uint32, off uint64) *raw {
	r.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		r.u64(d)
	}
	return r.u32(typ).u64(off)
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

type sampleTensor struct {
	name  string
	typ   tensor.DType
	shape []uint64
	data  []byte
}

// sampleKVs is every value type, nested and empty arrays, empty strings.
func sampleKVs() []KV {
	return []KV{
		{"general.architecture", TypeString, "llama"},
		{"general.name", TypeString, ""},
		{"t.u8", TypeUint8, uint8(200)},
		{"t.i8", TypeInt8, int8(-100)},
		{"t.u16", TypeUint16, uint16(65000)},
		{"t.i16", TypeInt16, int16(-32000)},
		{"t.u32", TypeUint32, uint32(4000000000)},
		{"t.i32", TypeInt32, int32(-2000000000)},
		{"t.f32", TypeFloat32, float32(3.25)},
		{"t.bool.true", TypeBool, true},
		{"t.bool.false", TypeBool, false},
		{"t.u64", TypeUint64, uint64(1<<63 + 5)},
		{"t.i64", TypeInt64, int64(-1 << 62)},
		{"t.f64", TypeFloat64, math.Pi},
		{"t.unicode", TypeString, "héllo ▁wörld\x00!"},
		{"a.u8", TypeArray, Array{TypeUint8, []uint8{1, 2, 255}}},
		{"a.i8", TypeArray, Array{TypeInt8, []int8{-1, 0, 127}}},
		{"a.u16", TypeArray, Array{TypeUint16, []uint16{1, 65535}}},
		{"a.i16", TypeArray, Array{TypeInt16, []int16{-32768, 7}}},
		{"a.u32", TypeArray, Array{TypeUint32, []uint32{0, 1, 4294967295}}},
		{"a.i32", TypeArray, Array{TypeInt32, []int32{-5, 6}}},
		{"a.f32", TypeArray, Array{TypeFloat32, []float32{0.5, -1e30, float32(math.Inf(1))}}},
		{"a.bool", TypeArray, Array{TypeBool, []bool{true, false, true}}},
		{"a.str", TypeArray, Array{TypeString, []string{"a", "", "<s>", "▁the"}}},
		{"a.u64", TypeArray, Array{TypeUint64, []uint64{math.MaxUint64}}},
		{"a.i64", TypeArray, Array{TypeInt64, []int64{math.MinInt64, 3}}},
		{"a.f64", TypeArray, Array{TypeFloat64, []float64{1e-300, -2}}},
		{"a.empty.u32", TypeArray, Array{TypeUint32, []uint32{}}},
		{"a.empty.str", TypeArray, Array{TypeString, []string{}}},
		{"a.empty.arr", TypeArray, Array{TypeArray, []Array{}}},
		{"a.nested", TypeArray, Array{TypeArray, []Array{
			{TypeString, []string{"x", "yz"}},
			{TypeInt32, []int32{}},
			{TypeArray, []Array{{TypeFloat64, []float64{1, 2}}, {TypeBool, []bool{}}}},
		}}},
	}
}

func sampleTensors() []sampleTensor {
	r := rand.New(rand.NewPCG(7, 8))
	mk := func(name string, typ tensor.DType, shape ...uint64) sampleTensor {
		n := uint64(typ.BlockBytes()) * shape[0] / uint64(typ.BlockSize())
		for _, d := range shape[1:] {
			n *= d
		}
		return sampleTensor{name, typ, shape, randBytes(r, int(n))}
	}
	return []sampleTensor{
		mk("token_embd.weight", tensor.Q8_0, 64, 10),
		mk("blk.0.attn_norm.weight", tensor.F32, 7),
		mk("blk.0.attn_q.weight", tensor.Q4_K, 256, 3),
		mk("blk.0.ffn_up.weight", tensor.Q6_K, 256, 2, 1, 2),
		mk("blk.0.ffn_down.weight", tensor.F16, 5, 3),
		mk("blk.0.other", tensor.IQ2_XXS, 256), // known but not computable
		mk("output.weight", tensor.BF16, 32, 2, 1),
	}
}

// buildSample writes the sample KVs and tensors with the given alignment.
func buildSample(t testing.TB, alignment uint64) (*Writer, []KV, []sampleTensor) {
	w := NewWriter()
	kvs := sampleKVs()
	for _, kv := range kvs {
		if err := w.Set(kv.Key, kv.Value); err != nil {
			t.Fatal(err)
		}
	}
	if alignment != 0 {
		w.SetAlignment(alignment)
		kvs = append(kvs, KV{KeyAlignment, TypeUint32, uint32(alignment)})
	}
	ts := sampleTensors()
	for _, s := range ts {
		if err := w.AddTensor(s.name, s.typ, s.shape, s.data); err != nil {
			t.Fatal(err)
		}
	}
	return w, kvs, ts
}

func checkSample(t *testing.T, f *File, kvs []KV, ts []sampleTensor, alignment uint64) {
	t.Helper()
	if f.Version != 3 {
		t.Errorf("version %d", f.Version)
	}
	if f.Alignment != alignment {
		t.Errorf("alignment %d, want %d", f.Alignment, alignment)
	}
	if f.DataOffset%alignment != 0 {
		t.Errorf("data offset %d not aligned to %d", f.DataOffset, alignment)
	}
	if !reflect.DeepEqual(f.KVs, kvs) {
		if len(f.KVs) != len(kvs) {
			t.Fatalf("%d KVs, want %d", len(f.KVs), len(kvs))
		}
		for i := range kvs {
			if !reflect.DeepEqual(f.KVs[i], kvs[i]) {
				t.Errorf("KV %d = %#v, want %#v", i, f.KVs[i], kvs[i])
			}
		}
	}
	if len(f.Tensors) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(ts))
	}
	for i, s := range ts {
		ti := &f.Tensors[i]
		if ti.Name != s.name || ti.Type != s.typ || !reflect.DeepEqual(ti.Shape, s.shape) || ti.Size != uint64(len(s.data)) {
			t.Errorf("tensor %d = %v, want %s %s %v size %d", i, ti, s.name, s.typ, s.shape, len(s.data))
		}
		if ti.Offset%alignment != 0 {
			t.Errorf("tensor %s offset %d not aligned", s.name, ti.Offset)
		}
		got, ok := f.Tensor(s.name)
		if !ok || got != ti {
			t.Errorf("Tensor(%q) = %v, %v", s.name, got, ok)
		}
		if d := f.TensorData(ti); !bytes.Equal(d, s.data) {
			t.Errorf("tensor %s data differs (%d bytes, want %d)", s.name, len(d), len(s.data))
		}
	}
	for _, kv := range kvs {
		got, ok := f.Lookup(kv.Key)
		if !ok || !reflect.DeepEqual(got, kv) {
			t.Errorf("Lookup(%q) = %v, %v", kv.Key, got, ok)
		}
	}
	if _, ok := f.Tensor("nope"); ok {
		t.Error("Tensor(nope) found")
	}
	if _, ok := f.Lookup("nope"); ok {
		t.Error("Lookup(nope) found")
	}
}

func TestRoundTrip(t *testing.T) {
	for _, alignment := range []uint64{0, 1, 8, 64, 4096} {
		w, kvs, ts := buildSample(t, alignment)
		want := alignment
		if want == 0 {
			want = DefaultAlignment
		}
		var buf bytes.Buffer
		n, err := w.WriteTo(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if n != int64(buf.Len()) {
			t.Errorf("WriteTo returned %d, wrote %d", n, buf.Len())
		}
		f, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("alignment %d: Parse: %v", alignment, err)
		}
		checkSample(t, f, kvs, ts, want)
		if !reflect.DeepEqual(f.Tensors, w.Tensors()) {
			t.Errorf("parsed index differs from Writer.Tensors")
		}

		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := w.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		onDisk, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(onDisk, buf.Bytes()) {
			t.Error("WriteFile and WriteTo differ")
		}
		for name, open := range opens {
			fo, err := open(path)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			checkSample(t, fo, kvs, ts, want)
			if err := fo.Close(); err != nil {
				t.Fatal(name, err)
			}
			if err := fo.Close(); err != nil {
				t.Fatal(name, "second Close:", err)
			}
			if fo.TensorData(&fo.Tensors[0]) != nil {
				t.Error(name, "TensorData after Close is not nil")
			}
		}
		entries, _ := os.ReadDir(filepath.Dir(path))
		if len(entries) != 1 {
			t.Errorf("WriteFile left %d files", len(entries))
		}
	}
}

// TestWriterMatchesSpec compares the Writer's bytes with a file encoded by
// hand from the spec.
func TestWriterMatchesSpec(t *testing.T) {
	data := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	w := NewWriter()
	must(t, w.Set("general.architecture", "llama"))
	must(t, w.Set("x.list", []int32{-1, 2}))
	must(t, w.AddTensor("a", tensor.F32, []uint64{2}, data))
	must(t, w.AddTensor("b", tensor.F16, []uint64{2, 2}, data))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	r := header(2, 2)
	r.str("general.architecture").u32(8).str("llama")
	r.str("x.list").u32(9).u32(5).u64(2).u32(0xFFFFFFFF).u32(2)
	r.tensorInfo("a", []uint64{2}, 0, 0)
	r.tensorInfo("b", []uint64{2, 2}, 1, 32)
	r.padTo(32).bytes(data).padTo(32).bytes(data).padTo(32)
	if !bytes.Equal(buf.Bytes(), r.b) {
		t.Fatalf("writer output differs from the hand encoding:\n got %x\nwant %x", buf.Bytes(), r.b)
	}
	f, err := Parse(r.b)
	if err != nil {
		t.Fatal(err)
	}
	if f.DataOffset != uint64(len(r.b)-64) || f.Version != 3 {
		t.Errorf("data offset %d version %d", f.DataOffset, f.Version)
	}
	// A version 2 file has the same layout.
	binary.LittleEndian.PutUint32(r.b[4:], 2)
	if f, err := Parse(r.b); err != nil || f.Version != 2 {
		t.Fatalf("v2: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestAccessors(t *testing.T) {
	w := NewWriter()
	vals := map[string]any{
		"s": "hi", "u8": uint8(7), "i8": int8(-3), "u32": uint32(9), "i64": int64(-9),
		"u64big": uint64(1 << 63), "f32": float32(1.5), "f64": 2.25, "b": true,
		"strs": []string{"a", "b"}, "f32s": []float32{1, 2}, "f64s": []float64{0.5},
		"i32s": []int32{1, -2}, "u32s": []uint32{1, 4294967295}, "i64s": []int64{-5, 1 << 40},
		"u8s": []uint8{3}, "i16s": []int16{-7},
	}
	for k, v := range vals {
		must(t, w.Set(k, v))
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, got, want any, err error, wantErr string) {
		t.Helper()
		if wantErr != "" {
			if err == nil || err.Error() != wantErr {
				t.Errorf("%s: err = %v, want %q", name, err, wantErr)
			}
			return
		}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, %v; want %v", name, got, err, want)
		}
	}
	s, err := f.String("s")
	check("String(s)", s, "hi", err, "")
	_, err = f.String("nope")
	check("String(nope)", nil, nil, err, `gguf: key "nope" missing`)
	_, err = f.String("u8")
	check("String(u8)", nil, nil, err, `gguf: key "u8" has type uint8, want string`)
	u, err := f.Uint("u8")
	check("Uint(u8)", u, uint64(7), err, "")
	u, err = f.Uint("u64big")
	check("Uint(u64big)", u, uint64(1<<63), err, "")
	_, err = f.Uint("i8")
	check("Uint(i8)", nil, nil, err, `gguf: key "i8" is -3, want a non-negative value`)
	_, err = f.Uint("f32")
	check("Uint(f32)", nil, nil, err, `gguf: key "f32" has type float32, want an unsigned integer`)
	i, err := f.Int("i64")
	check("Int(i64)", i, int64(-9), err, "")
	i, err = f.Int("u32")
	check("Int(u32)", i, int64(9), err, "")
	_, err = f.Int("u64big")
	check("Int(u64big)", nil, nil, err, `gguf: key "u64big" is 9223372036854775808, which overflows int64`)
	fl, err := f.Float("f32")
	check("Float(f32)", fl, 1.5, err, "")
	fl, err = f.Float("f64")
	check("Float(f64)", fl, 2.25, err, "")
	fl, err = f.Float("i8")
	check("Float(i8)", fl, -3.0, err, "")
	_, err = f.Float("s")
	check("Float(s)", nil, nil, err, `gguf: key "s" has type string, want a number`)
	b, err := f.Bool("b")
	check("Bool(b)", b, true, err, "")
	_, err = f.Bool("u8")
	check("Bool(u8)", nil, nil, err, `gguf: key "u8" has type uint8, want bool`)
	ss, err := f.Strings("strs")
	check("Strings", ss, []string{"a", "b"}, err, "")
	_, err = f.Strings("f32s")
	check("Strings(f32s)", nil, nil, err, `gguf: key "f32s" has type array[float32], want array[string]`)
	_, err = f.Strings("s")
	check("Strings(s)", nil, nil, err, `gguf: key "s" has type string, want array`)
	fs, err := f.Float32s("f32s")
	check("Float32s", fs, []float32{1, 2}, err, "")
	fs, err = f.Float32s("f64s")
	check("Float32s(f64s)", fs, []float32{0.5}, err, "")
	fs, err = f.Float32s("i32s")
	check("Float32s(i32s)", fs, []float32{1, -2}, err, "")
	_, err = f.Float32s("strs")
	check("Float32s(strs)", nil, nil, err, `gguf: key "strs" has type array[string], want array[float32]`)
	is, err := f.Int32s("i32s")
	check("Int32s", is, []int32{1, -2}, err, "")
	is, err = f.Int32s("u8s")
	check("Int32s(u8s)", is, []int32{3}, err, "")
	is, err = f.Int32s("i16s")
	check("Int32s(i16s)", is, []int32{-7}, err, "")
	_, err = f.Int32s("u32s")
	check("Int32s(u32s)", nil, nil, err, `gguf: key "u32s": element 1 (4294967295) is out of the int32 range`)
	_, err = f.Int32s("i64s")
	check("Int32s(i64s)", nil, nil, err, `gguf: key "i64s": element 1 (1099511627776) is out of the int32 range`)
	_, err = f.Int32s("f32s")
	check("Int32s(f32s)", nil, nil, err, `gguf: key "f32s" has type array[float32], want array[int32]`)
}

func TestWriterErrors(t *testing.T) {
	w := NewWriter()
	for _, c := range []struct {
		value   any
		wantErr string
	}{
		{7, "int has no fixed size"},
		{uint(7), "uint has no fixed size"},
		{[]int{1}, "unsupported value type []int"},
		{struct{}{}, "unsupported value type struct {}"},
		{Array{TypeUint32, []int32{1}}, "array of uint32 holds []int32"},
		{Array{TypeArray, []string{"x"}}, "want []gguf.Array"},
		{Array{ValueType(42), []uint8{}}, "array of type(42) holds []uint8"},
		{Array{TypeString, nil}, "array of string holds <nil>"},
	} {
		err := w.Set("k", c.value)
		if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.HasPrefix(err.Error(), "gguf: ") {
			t.Errorf("Set(%#v): err = %v, want %q", c.value, err, c.wantErr)
		}
	}
	deep := Array{TypeUint8, []uint8{}}
	for range maxArrayDepth {
		deep = Array{TypeArray, []Array{deep}}
	}
	if err := w.Set("deep", deep); err == nil {
		t.Error("over-deep array accepted")
	}
	if err := w.Set(KeyAlignment, uint32(48)); err == nil {
		t.Error("alignment 48 accepted")
	}
	if err := w.Set(KeyAlignment, "x"); err == nil {
		t.Error("string alignment accepted")
	}

	// Replacing keeps the position.
	must(t, w.Set("a", uint32(1)))
	must(t, w.Set("b", uint32(2)))
	must(t, w.Set("a", "now a string"))
	if w.kvs[0].Key != "a" || w.kvs[0].Value != "now a string" || w.kvs[1].Key != "b" {
		t.Errorf("replace: %v", w.kvs)
	}

	for _, c := range []struct {
		name    string
		typ     tensor.DType
		shape   []uint64
		n       int
		wantErr string
	}{
		{"x", tensor.F32, []uint64{4}, 15, `gguf: tensor "x": F32 [4] takes 16 bytes, got 15`},
		{"x", tensor.Q8_0, []uint64{33}, 34, `gguf: tensor "x": row length 33 is not a multiple of the Q8_0 block size 32`},
		{"x", tensor.DType(99), []uint64{4}, 4, `gguf: tensor "x": unknown type 99`},
		{"x", tensor.F32, []uint64{4, 0}, 0, `gguf: tensor "x": dimension 1 is 0`},
		{"x", tensor.F32, []uint64{}, 0, `gguf: tensor "x": 0 dimensions, want 1 to 4`},
		{"x", tensor.F32, []uint64{1, 1, 1, 1, 1}, 4, `gguf: tensor "x": 5 dimensions, want 1 to 4`},
		{"x", tensor.F32, []uint64{1 << 32, 1 << 32}, 0, "more than 2^63-1 elements"},
	} {
		err := w.AddTensor(c.name, c.typ, c.shape, make([]byte, c.n))
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("AddTensor(%v %v): err = %v, want %q", c.typ, c.shape, err, c.wantErr)
		}
	}
	must(t, w.AddTensor("t", tensor.F32, []uint64{1}, make([]byte, 4)))
	if err := w.AddTensor("t", tensor.F32, []uint64{1}, make([]byte, 4)); err == nil || err.Error() != `gguf: duplicate tensor "t"` {
		t.Errorf("duplicate tensor: %v", err)
	}

	// Invalid alignment from SetAlignment fails WriteTo.
	w.SetAlignment(3)
	if _, err := w.WriteTo(io.Discard); err == nil {
		t.Error("alignment 3: WriteTo succeeded")
	}
	w.SetAlignment(16)
	if _, err := w.WriteTo(io.Discard); err != nil {
		t.Error(err)
	}

	// A fill function writing the wrong count, or failing, fails the write
	// and WriteFile leaves nothing behind.
	dir := t.TempDir()
	for _, fill := range []func(io.Writer) error{
		func(w io.Writer) error { _, err := w.Write(make([]byte, 7)); return err },
		func(w io.Writer) error { return errors.New("boom") },
	} {
		w := NewWriter()
		must(t, w.AddTensorFunc("f", tensor.F32, []uint64{2}, fill))
		if err := w.WriteFile(filepath.Join(dir, "x.gguf")); err == nil {
			t.Error("bad fill: WriteFile succeeded")
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("failed WriteFile left %v", entries)
		}
	}
	w2 := NewWriter()
	must(t, w2.AddTensorFunc("f", tensor.F32, []uint64{2}, func(w io.Writer) error {
		_, err := w.Write(make([]byte, 8))
		return err
	}))
	must(t, w2.WriteFile(filepath.Join(dir, "ok.gguf")))
	f, err := Open(filepath.Join(dir, "ok.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.TensorData(&f.Tensors[0])) != 8 {
		t.Error("AddTensorFunc data")
	}
}

// truncatableSample is a small file whose last tensor ends exactly at the
// end of the file (its size is a multiple of the alignment), so every
// proper prefix misses bytes the file needs.
func truncatableSample(t *testing.T) []byte {
	w := NewWriter()
	must(t, w.Set("general.architecture", "llama"))
	must(t, w.Set("tokenizer.ggml.tokens", []string{"<s>", "", "a"}))
	must(t, w.Set("n", Array{TypeArray, []Array{{TypeUint16, []uint16{1, 2}}}}))
	must(t, w.Set("b", true))
	must(t, w.AddTensor("w", tensor.Q8_0, []uint64{32, 2}, make([]byte, 68)))
	must(t, w.AddTensor("v", tensor.F32, []uint64{8}, make([]byte, 32)))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestEveryTruncation(t *testing.T) {
	data := truncatableSample(t)
	if _, err := Parse(data); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(data); i++ {
		f, err := Parse(data[:i:i])
		if err == nil {
			t.Fatalf("Parse of the first %d of %d bytes succeeded: %+v", i, len(data), f)
		}
		checkErrorText(t, err)
	}
	dir := t.TempDir()
	for i := 0; i < len(data); i += 1 + i/8 {
		path := filepath.Join(dir, "trunc.gguf")
		if err := os.WriteFile(path, data[:i], 0o644); err != nil {
			t.Fatal(err)
		}
		for name, open := range opens {
			f, err := open(path)
			if err == nil {
				f.Close()
				t.Fatalf("%s of the first %d bytes succeeded", name, i)
			}
			checkErrorText(t, err)
			if !strings.Contains(err.Error(), path) {
				t.Errorf("%s error does not name the file: %v", name, err)
			}
		}
	}
	for name, open := range opens {
		if _, err := open(filepath.Join(dir, "missing.gguf")); err == nil {
			t.Errorf("%s of a missing file succeeded", name)
		}
		if _, err := open(dir); err == nil {
			t.Errorf("%s of a directory succeeded", name)
		}
	}
}

// opens: the two ways to open a file, mapped and read.
var opens = map[string]func(string) (*File, error){"Open": Open, "Load": Load}

func checkErrorText(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if !strings.HasPrefix(msg, "gguf: ") || strings.Contains(msg, "\n") {
		t.Errorf("error is not a single line prefixed gguf: %q", msg)
	}
}

type badFile struct {
	name    string
	data    []byte
	wantErr string
}

// badFiles are malformed files and the error each must give (they also
// seed FuzzParse).
func badFiles(t testing.TB) []badFile {
	const name = "blk.0.attn_q.weight"
	// A valid file with one F32 [8] tensor and its data; pieces are replaced
	// below.
	oneTensor := func(dims []uint64, typ uint32, off uint64, dataLen int) []byte {
		r := header(1, 0).tensorInfo(name, dims, typ, off).padTo(32)
		return r.bytes(make([]byte, dataLen)).b
	}
	kv := func(build func(r *raw)) []byte {
		r := header(0, 1)
		build(r)
		return r.b
	}
	nested := func(depth int) []byte {
		r := header(0, 1).str("deep").u32(uint32(TypeArray))
		for range depth - 1 {
			r.u32(uint32(TypeArray)).u64(1)
		}
		return r.u32(uint32(TypeUint8)).u64(0).b
	}
	valid := oneTensor([]uint64{8}, 0, 0, 32)
	if _, err := Parse(valid); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(nested(maxArrayDepth)); err != nil {
		t.Fatalf("nesting depth %d: %v", maxArrayDepth, err)
	}
	swap := func(b []byte, off int, v uint32) []byte {
		c := bytes.Clone(b)
		binary.LittleEndian.PutUint32(c[off:], v)
		return c
	}
	return []badFile{
		{"empty", nil, "gguf: truncated: magic needs 4 bytes, file has 0"},
		{"wrong magic", append([]byte("GGML"), valid[4:]...), `gguf: bad magic "GGML", want "GGUF"`},
		{"version 1", swap(valid, 4, 1), "gguf: version 1 is not supported (want 2 or 3)"},
		{"version 0", swap(valid, 4, 0), "gguf: unsupported version 0 (want 2 or 3)"},
		{"version 4", swap(valid, 4, 4), "gguf: unsupported version 4 (want 2 or 3)"},
		{"big endian", swap(valid, 4, 0x03000000), "gguf: big-endian GGUF (version 3) is not supported"},
		{"huge kv count", header(0, 1<<62).b, "gguf: kv count 4611686018427387904 needs at least 13 bytes per entry, 0 bytes left"},
		{"huge tensor count", header(1<<62, 0).u64(0).b, "gguf: tensor count 4611686018427387904 needs at least 32 bytes"},
		{"max counts", header(math.MaxUint64, math.MaxUint64).b, "gguf: kv count"},
		{"unknown value type", kv(func(r *raw) { r.str("k").u32(13).u64(0) }), `gguf: key "k": unknown value type 13`},
		{"unknown array type", kv(func(r *raw) { r.str("k").u32(9).u32(99).u64(0) }), `gguf: key "k": unknown array element type 99`},
		{"huge string", kv(func(r *raw) { r.str("k").u32(8).u64(1 << 62) }), `gguf: truncated: value of key "k": string of 4611686018427387904 bytes`},
		{"huge key", header(0, 1).u64(math.MaxUint64).u64(0).b, "gguf: truncated: key 0: string of 18446744073709551615 bytes"},
		{"huge array", kv(func(r *raw) { r.str("k").u32(9).u32(4).u64(1 << 61).u32(0) }), `gguf: truncated: key "k": array of 2305843009213693952 uint32`},
		{"huge string array", kv(func(r *raw) { r.str("k").u32(9).u32(8).u64(3).u64(0).u64(0) }), `gguf: truncated: key "k": array of 3 string`},
		{"string array element past end", kv(func(r *raw) { r.str("k").u32(9).u32(8).u64(1).u64(9).u64(0) }), `gguf: truncated: array element of key "k": string of 9 bytes`},
		{"deep nesting", nested(maxArrayDepth + 1), `gguf: key "deep": arrays nested deeper than 8`},
		{"bool 2", kv(func(r *raw) { r.str("k").u32(7).u8(2) }), `gguf: key "k": bool value 2 is not 0 or 1`},
		{"bool array 3", kv(func(r *raw) { r.str("k").u32(9).u32(7).u64(2).u8(1).u8(3) }), `gguf: key "k": bool element 1 is 3, not 0 or 1`},
		{"duplicate key", header(0, 2).str("k").u32(0).u8(1).str("k").u32(0).u8(2).b, `gguf: duplicate key "k"`},
		{"alignment 0", kv(func(r *raw) { r.str(KeyAlignment).u32(4).u32(0) }), `gguf: key "general.alignment": alignment 0 is not a power of two`},
		{"alignment 48", kv(func(r *raw) { r.str(KeyAlignment).u32(4).u32(48) }), `alignment 48 is not a power of two`},
		{"alignment negative", kv(func(r *raw) { r.str(KeyAlignment).u32(5).u32(0xFFFFFFE0) }), `alignment -32 is not a power of two`},
		{"alignment string", kv(func(r *raw) { r.str(KeyAlignment).u32(8).str("32") }), `gguf: key "general.alignment" has type string, want uint32`},
		{"alignment 2^63", header(0, 1).str(KeyAlignment).u32(10).u64(1 << 63).b, `alignment 9223372036854775808 is not a power of two from 1 to 2^31`},
		{"alignment 2^32", header(0, 1).str(KeyAlignment).u32(10).u64(1 << 32).b, `alignment 4294967296 is not a power of two`},
		{"alignment 2^31 tensor past end", header(1, 1).str(KeyAlignment).u32(4).u32(1<<31).tensorInfo("t", []uint64{1}, 0, 0).b, `gguf: truncated: tensor "t" needs bytes [2147483648,2147483652)`},
		{"unknown tensor type", oneTensor([]uint64{8}, 99, 0, 32), `gguf: tensor "blk.0.attn_q.weight": unknown type 99`},
		{"n_dims 0", oneTensor(nil, 0, 0, 32), `gguf: tensor "blk.0.attn_q.weight": 0 dimensions, want 1 to 4`},
		{"n_dims 5", oneTensor([]uint64{1, 1, 1, 1, 8}, 0, 0, 32), `gguf: tensor "blk.0.attn_q.weight": 5 dimensions, want 1 to 4`},
		{"n_dims huge", header(1, 0).str("x").u32(1 << 31).bytes(make([]byte, 32)).b, `gguf: tensor "x": 2147483648 dimensions, want 1 to 4`},
		{"zero dim", oneTensor([]uint64{8, 0}, 0, 0, 32), `gguf: tensor "blk.0.attn_q.weight": dimension 1 is 0`},
		{"element overflow", oneTensor([]uint64{1 << 32, 1 << 31}, 0, 0, 32), "more than 2^63-1 elements"},
		{"byte overflow", oneTensor([]uint64{1 << 31, 1 << 31}, 0, 0, 32), "takes more than 2^63-1 bytes"},
		{"partial block", oneTensor([]uint64{33}, 8, 0, 64), `gguf: tensor "blk.0.attn_q.weight": row length 33 is not a multiple of the Q8_0 block size 32`},
		{"misaligned offset", oneTensor([]uint64{8}, 0, 16, 64), `gguf: tensor "blk.0.attn_q.weight": offset 16 is not a multiple of the alignment 32`},
		{"data past end", oneTensor([]uint64{8}, 0, 0, 31), `gguf: truncated: tensor "blk.0.attn_q.weight" needs bytes [96,128), file has 127`},
		{"offset past end", oneTensor([]uint64{8}, 0, 1<<40, 32), `gguf: truncated: tensor "blk.0.attn_q.weight" needs bytes [1099511627872,1099511627904), file has 128`},
		{"offset overflow", oneTensor([]uint64{8}, 0, math.MaxUint64-31, 32), "offset 18446744073709551584 and size 32 overflow"},
		{"duplicate tensor", header(2, 0).tensorInfo("t", []uint64{8}, 0, 0).tensorInfo("t", []uint64{8}, 0, 32).padTo(32).bytes(make([]byte, 64)).b, `gguf: duplicate tensor "t"`},
		{"overlap", header(2, 0).tensorInfo("a", []uint64{16}, 0, 0).tensorInfo("b", []uint64{8}, 0, 32).padTo(32).bytes(make([]byte, 64)).b, `gguf: tensors "a" [0,64) and "b" [32,64) overlap in the data section`},
		{"same offset", header(2, 0).tensorInfo("a", []uint64{8}, 0, 0).tensorInfo("b", []uint64{8}, 0, 0).padTo(32).bytes(make([]byte, 32)).b, `gguf: tensors "a" [0,32) and "b" [0,32) overlap`},
	}
}

func TestBadFiles(t *testing.T) {
	for _, c := range badFiles(t) {
		t.Run(c.name, func(t *testing.T) {
			f, err := Parse(c.data)
			if err == nil {
				t.Fatalf("no error; tensors %v", f.Tensors)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("err = %v\nwant %q", err, c.wantErr)
			}
			checkErrorText(t, err)
		})
	}
}

// TestLenient pins what the reader accepts beyond what the Writer emits.
func TestLenient(t *testing.T) {
	// Tensors in any order, with gaps; no padding after the last tensor.
	// general.alignment stored as a uint8.
	r := header(2, 1).str(KeyAlignment).u32(uint32(TypeUint8)).u8(16)
	r.tensorInfo("late", []uint64{4}, 0, 48).tensorInfo("early", []uint64{2}, 0, 0)
	r.padTo(16)
	dataStart := len(r.b)
	r.bytes(make([]byte, 64))
	f, err := Parse(r.b)
	if err != nil {
		t.Fatal(err)
	}
	if f.Alignment != 16 || f.DataOffset != uint64(dataStart) {
		t.Errorf("alignment %d data offset %d (want %d)", f.Alignment, f.DataOffset, dataStart)
	}
	late, _ := f.Tensor("late")
	if d := f.TensorData(late); len(d) != 16 || &d[0] != &r.b[dataStart+48] {
		t.Error("TensorData is not a zero-copy slice of the file")
	}
	// No tensors: the data section may be absent.
	f, err = Parse(header(0, 0).b)
	if err != nil || len(f.KVs) != 0 || len(f.Tensors) != 0 {
		t.Fatalf("empty file: %v", err)
	}
	if f.TensorData(&TensorInfo{Size: 1}) != nil {
		t.Error("TensorData of a foreign tensor")
	}
}

// TestModelFile writes a small llama-shaped model with quantized weights
// and reads it back through Open, dequantizing every tensor.
func TestModelFile(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const dim, ffn, vocab = 256, 512, 300
	w := NewWriter()
	must(t, w.Set("general.architecture", "llama"))
	must(t, w.Set("general.name", "tiny"))
	must(t, w.Set("llama.context_length", uint32(512)))
	must(t, w.Set("llama.embedding_length", uint32(dim)))
	must(t, w.Set("llama.feed_forward_length", uint32(ffn)))
	must(t, w.Set("llama.block_count", uint32(1)))
	must(t, w.Set("llama.attention.head_count", uint32(8)))
	must(t, w.Set("llama.attention.head_count_kv", uint32(2)))
	must(t, w.Set("llama.attention.layer_norm_rms_epsilon", float32(1e-5)))
	must(t, w.Set("llama.rope.freq_base", float32(10000)))
	must(t, w.Set("tokenizer.ggml.model", "llama"))
	tokens := make([]string, vocab)
	scores := make([]float32, vocab)
	types := make([]int32, vocab)
	for i := range tokens {
		tokens[i] = string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		scores[i] = -float32(i)
		types[i] = 1
	}
	must(t, w.Set("tokenizer.ggml.tokens", tokens))
	must(t, w.Set("tokenizer.ggml.scores", scores))
	must(t, w.Set("tokenizer.ggml.token_type", types))
	must(t, w.Set("tokenizer.ggml.bos_token_id", uint32(1)))

	type weight struct {
		name  string
		typ   tensor.DType
		shape []uint64
		vals  []float32
	}
	weights := []weight{
		{"token_embd.weight", tensor.Q8_0, []uint64{dim, vocab}, nil},
		{"blk.0.attn_norm.weight", tensor.F32, []uint64{dim}, nil},
		{"blk.0.attn_q.weight", tensor.Q4_K, []uint64{dim, dim}, nil},
		{"blk.0.attn_k.weight", tensor.Q4_0, []uint64{dim, dim / 4}, nil},
		{"blk.0.attn_v.weight", tensor.Q6_K, []uint64{dim, dim / 4}, nil},
		{"blk.0.ffn_up.weight", tensor.F16, []uint64{dim, ffn}, nil},
		{"blk.0.ffn_down.weight", tensor.BF16, []uint64{ffn, dim}, nil},
	}
	for i := range weights {
		wt := &weights[i]
		n := 1
		for _, d := range wt.shape {
			n *= int(d)
		}
		wt.vals = make([]float32, n)
		for j := range wt.vals {
			wt.vals[j] = float32(r.NormFloat64() * 0.02)
		}
		nb, err := wt.typ.RowBytes(n)
		must(t, err)
		q := make([]byte, nb)
		must(t, tensor.Quantize(wt.typ, wt.vals, q))
		must(t, w.AddTensor(wt.name, wt.typ, wt.shape, q))
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	must(t, w.WriteFile(path))

	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if a, _ := f.String("general.architecture"); a != "llama" {
		t.Errorf("architecture %q", a)
	}
	if n, err := f.Uint("llama.attention.head_count_kv"); err != nil || n != 2 {
		t.Errorf("head_count_kv %d %v", n, err)
	}
	if eps, err := f.Float("llama.attention.layer_norm_rms_epsilon"); err != nil || float32(eps) != 1e-5 {
		t.Errorf("eps %g %v", eps, err)
	}
	if got, err := f.Strings("tokenizer.ggml.tokens"); err != nil || !reflect.DeepEqual(got, tokens) {
		t.Errorf("tokens: %v", err)
	}
	if got, err := f.Float32s("tokenizer.ggml.scores"); err != nil || !reflect.DeepEqual(got, scores) {
		t.Errorf("scores: %v", err)
	}
	if got, err := f.Int32s("tokenizer.ggml.token_type"); err != nil || !reflect.DeepEqual(got, types) {
		t.Errorf("token types: %v", err)
	}
	for _, wt := range weights {
		ti, ok := f.Tensor(wt.name)
		if !ok {
			t.Fatalf("tensor %s missing", wt.name)
		}
		got := make([]float32, len(wt.vals))
		must(t, tensor.Dequantize(ti.Type, f.TensorData(ti), got))
		var se, sx float64
		for j := range got {
			d := float64(got[j] - wt.vals[j])
			se += d * d
			sx += float64(wt.vals[j]) * float64(wt.vals[j])
		}
		if rel := math.Sqrt(se / sx); rel > 0.15 {
			t.Errorf("%s (%s): relative error %.3f", wt.name, ti.Type, rel)
		}
		// Row access as an embedding lookup would do it.
		row := make([]float32, ti.Shape[0])
		last := len(got)/len(row) - 1
		must(t, tensor.DequantizeRow(ti.Type, f.TensorData(ti), last, row))
		if !reflect.DeepEqual(row, got[last*len(row):]) {
			t.Errorf("%s: last row differs", wt.name)
		}
	}
}
