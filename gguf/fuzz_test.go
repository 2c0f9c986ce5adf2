package gguf

import (
	"bytes"
	"testing"
)

// FuzzParse checks that Parse never panics, that every tensor of a parsed
// file lies within the data, and that re-encoding a parsed file with Writer
// is stable (write → parse → write gives the same bytes).
func FuzzParse(f *testing.F) {
	w, _, _ := buildSample(f, 64)
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	w, _, _ = buildSample(f, 0)
	buf.Reset()
	if _, err := w.WriteTo(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	small := NewWriter()
	small.Set("a", []string{"x", ""})
	small.Set("b", Array{TypeArray, []Array{{TypeBool, []bool{true}}}})
	small.Set("c", int8(-1))
	small.AddTensor("t", 8, []uint64{32}, make([]byte, 34))
	buf.Reset()
	if _, err := small.WriteTo(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add(header(0, 0).b)
	for _, c := range badFiles(f) {
		f.Add(c.data)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			checkErrorText(t, err)
			return
		}
		if file.DataOffset%file.Alignment != 0 {
			t.Fatalf("data offset %d not aligned to %d", file.DataOffset, file.Alignment)
		}
		for i := range file.Tensors {
			ti := &file.Tensors[i]
			d := file.TensorData(ti)
			if d == nil || uint64(len(d)) != ti.Size {
				t.Fatalf("tensor %q: %d bytes of data, want %d", ti.Name, len(d), ti.Size)
			}
			if file.DataOffset+ti.Offset+ti.Size > uint64(len(data)) {
				t.Fatalf("tensor %q past the end", ti.Name)
			}
		}
		if file.Alignment > 1<<16 && len(file.Tensors) == 0 {
			return // re-encoding would write up to 2 GiB of padding
		}
		b1 := reencode(t, file)
		f2, err := Parse(b1)
		if err != nil {
			t.Fatalf("re-encoded file does not parse: %v", err)
		}
		if b2 := reencode(t, f2); !bytes.Equal(b1, b2) {
			t.Fatal("re-encoding is not stable")
		}
	})
}

func reencode(t *testing.T, f *File) []byte {
	w := NewWriter()
	for _, kv := range f.KVs {
		if err := w.Set(kv.Key, kv.Value); err != nil {
			t.Fatalf("Set(%q, %v): %v", kv.Key, kv.Value, err)
		}
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if err := w.AddTensor(ti.Name, ti.Type, ti.Shape, f.TensorData(ti)); err != nil {
			t.Fatalf("AddTensor: %v", err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
