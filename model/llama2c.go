package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"unsafe"

	"github.com/kvlm/kvlm/tensor"
)

// llama2.c checkpoint magic of the versioned exports ("ak42" little-endian).
const llama2cMagic = 0x616b3432

// Llama2CHeader is the 7 × int32 header of a llama2.c checkpoint.
type Llama2CHeader struct {
	Dim, HiddenDim, Layers, Heads, KVHeads, Vocab, SeqLen int
	Shared                                                bool // classifier shares the token embedding
	Version                                               int  // 0 = legacy export, 1 = fp32 versioned export
}

// LoadLlama2C loads a llama2.c checkpoint: the legacy (version 0) export
// that run.c reads, or the fp32 version 1 export.
func LoadLlama2C(path string) (*Model, error) {
	data, closer, err := mapFile(path)
	if err != nil {
		return nil, err
	}
	m, err := ParseLlama2C(data)
	if err != nil {
		closer()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	m.closer = closer
	return m, nil
}

// ParseLlama2C builds a model over the bytes of a llama2.c checkpoint (not
// copied: data must outlive the model and be 4-byte aligned).
func ParseLlama2C(data []byte) (*Model, error) {
	h, off, err := parseLlama2CHeader(data)
	if err != nil {
		return nil, err
	}
	cfg := Config{
		Arch: "llama", Dim: h.Dim, HiddenDim: h.HiddenDim, Layers: h.Layers, Heads: h.Heads,
		KVHeads: h.KVHeads, Vocab: h.Vocab, CtxLen: h.SeqLen, NormEps: 1e-5, RopeTheta: 10000,
		Rope: RopeInterleaved,
	}
	if h.Dim%h.Heads != 0 {
		return nil, fmt.Errorf("llama2.c checkpoint: dim %d is not a multiple of %d heads", h.Dim, h.Heads)
	}
	cfg.HeadDim = h.Dim / h.Heads
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("llama2.c checkpoint: %w", err)
	}
	L, dim, hid, kv, voc := int64(h.Layers), int64(h.Dim), int64(h.HiddenDim), int64(cfg.KVDim()), int64(h.Vocab)
	ropeTables := int64(0)
	if h.Version == 0 {
		ropeTables = int64(h.SeqLen) * int64(cfg.HeadDim) // freq_cis_real and _imag, each [seq][hd/2]
	}
	floats := voc*dim + 2*L*dim + dim + L*(dim*dim*2+kv*dim*2) + 3*L*hid*dim + ropeTables
	if !h.Shared {
		floats += voc * dim
	}
	if want := off + 4*floats; int64(len(data)) != want {
		return nil, fmt.Errorf("llama2.c checkpoint: file has %d bytes, header (dim %d, hidden %d, %d layers, %d heads, %d kv heads, vocab %d, seq %d) implies %d",
			len(data), h.Dim, h.HiddenDim, h.Layers, h.Heads, h.KVHeads, h.Vocab, h.SeqLen, want)
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(data)))%4 != 0 {
		return nil, fmt.Errorf("llama2.c checkpoint: data is not 4-byte aligned")
	}
	all := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(data[off:]))), floats)
	take := func(n int64) []float32 { v := all[:n:n]; all = all[n:]; return v }
	mats := func(count int, rows, cols int64) []*tensor.Matrix {
		ms := make([]*tensor.Matrix, count)
		for i := range ms {
			ms[i] = tensor.MatrixF32(int(rows), int(cols), take(rows*cols))
		}
		return ms
	}
	vecs := func(count int, n int64) [][]float32 {
		vs := make([][]float32, count)
		for i := range vs {
			vs[i] = take(n)
		}
		return vs
	}
	m := &Model{Config: cfg, Layers: make([]Layer, h.Layers)}
	var attnNorm, ffnNorm [][]float32
	var wq, wk, wv, wo, w1, w2, w3 []*tensor.Matrix
	nl := h.Layers
	if h.Version == 0 {
		m.TokEmb = mats(1, voc, dim)[0]
		attnNorm = vecs(nl, dim)
		wq, wk, wv, wo = mats(nl, dim, dim), mats(nl, kv, dim), mats(nl, kv, dim), mats(nl, dim, dim)
		ffnNorm = vecs(nl, dim)
		w1, w2, w3 = mats(nl, hid, dim), mats(nl, dim, hid), mats(nl, hid, dim)
		m.OutNorm = take(dim)
		take(ropeTables) // legacy RoPE tables: RoPE is computed on the fly
	} else {
		attnNorm, ffnNorm = vecs(nl, dim), vecs(nl, dim)
		m.OutNorm = take(dim)
		m.TokEmb = mats(1, voc, dim)[0]
		wq, wk, wv, wo = mats(nl, dim, dim), mats(nl, kv, dim), mats(nl, kv, dim), mats(nl, dim, dim)
		w1, w2, w3 = mats(nl, hid, dim), mats(nl, dim, hid), mats(nl, hid, dim)
	}
	m.Output = m.TokEmb
	if !h.Shared {
		m.Output = mats(1, voc, dim)[0]
	}
	for i := range m.Layers {
		m.Layers[i] = Layer{AttnNorm: attnNorm[i], Wq: wq[i], Wk: wk[i], Wv: wv[i], Wo: wo[i],
			FFNNorm: ffnNorm[i], WGate: w1[i], WDown: w2[i], WUp: w3[i]}
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return m, nil
}

func parseLlama2CHeader(data []byte) (Llama2CHeader, int64, error) {
	var h Llama2CHeader
	if len(data) < 28 {
		return h, 0, fmt.Errorf("llama2.c checkpoint: file has %d bytes, shorter than the 28-byte header", len(data))
	}
	i32 := func(o int) int { return int(int32(binary.LittleEndian.Uint32(data[o:]))) }
	off := int64(28)
	base := 0
	if binary.LittleEndian.Uint32(data) == llama2cMagic {
		if len(data) < 256 {
			return h, 0, fmt.Errorf("llama2.c checkpoint: versioned export of %d bytes is shorter than its 256-byte header", len(data))
		}
		h.Version = i32(4)
		if h.Version != 1 {
			return h, 0, fmt.Errorf("llama2.c checkpoint: export version %d is not supported (only the legacy export and version 1, fp32)", h.Version)
		}
		base, off = 8, 256
	}
	h.Dim, h.HiddenDim, h.Layers, h.Heads = i32(base), i32(base+4), i32(base+8), i32(base+12)
	h.KVHeads, h.Vocab, h.SeqLen = i32(base+16), i32(base+20), i32(base+24)
	if h.Version == 0 {
		h.Shared = h.Vocab > 0
		if h.Vocab < 0 {
			h.Vocab = -h.Vocab
		}
	} else {
		h.Shared = data[36] != 0
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"dim", h.Dim}, {"hidden_dim", h.HiddenDim}, {"n_layers", h.Layers}, {"n_heads", h.Heads},
		{"n_kv_heads", h.KVHeads}, {"vocab_size", h.Vocab}, {"seq_len", h.SeqLen}} {
		if f.v <= 0 || f.v > 1<<20 {
			return h, 0, fmt.Errorf("llama2.c checkpoint: header field %s = %d is out of range (not a llama2.c checkpoint?)", f.name, f.v)
		}
	}
	return h, off, nil
}

// mapFile maps a file read-only into memory.
func mapFile(path string) ([]byte, func() error, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if st.IsDir() {
		return nil, nil, fmt.Errorf("%s is a directory", path)
	}
	size := st.Size()
	if size == 0 {
		return nil, nil, fmt.Errorf("%s: file is empty", path)
	}
	if size > math.MaxInt-1 {
		return nil, nil, fmt.Errorf("%s: file too large", path)
	}
	return mmap(f, int(size))
}
