package engine

// Slots: a request may keep its finished sequence in a numbered slot
// (GenRequest.Slot) instead of releasing it; a slot can be saved to a file
// and restored later, or in another process of the same model, as
// llama.cpp's server does with /slots/{id}?action=save|restore. A restored
// slot's tokens go into the prefix cache, so the next request whose prompt
// starts with them skips their prefill. Slots give their blocks back (to
// the prefix cache) when the pool needs room.
//
// Slots are written in the version 2 format (slotv2.go): the tables as
// the pool holds them, any policy's compression, KIVI residual and
// MiniCache merge included, with the policy's state. Version 1 files
// (little-endian) still restore:
//
//	"KVLMSLOT" | u32 version (1) | u32 header length | header (JSON)
//	| u32 tokens[n]
//	| for each layer, KV head: i32 pos[n] | f32 keys[n][headDim] | f32 values[n][headDim]
//	| sha256 of everything before it
//
// (keys and values decoded to float32 and re-encoded on restore, whole
// uncompressed sequences only).

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/cespare/xxhash/v2"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/tensor"
)

// MaxSlots is the number of slot ids (0..MaxSlots-1).
const MaxSlots = 64

const slotMagic = "KVLMSLOT"

type slot struct {
	cache  kvcache.Scheduled
	pool   *kvcache.Pool // the cache's
	tokens []int         // the tokens the sequence ran

	// A sequence under a policy (slotv2.go): a request whose prompt is
	// tokens (or whose kv.prefix is) with the same kv settings continues
	// from it (startFromSlot).
	cfg    policy.Config    // normalized; Method "" or "full": none
	snap   *policy.Snapshot // the policy's state; nil without a policy
	logits []float32        // [vocab] after the last of tokens; nil if unknown
	pos    int              // the sequence's next position (with snap)
}

// SlotInfo describes a slot's content.
type SlotInfo struct {
	ID     int    `json:"id"`
	Tokens int    `json:"n_tokens"`
	Bytes  int64  `json:"kv_bytes"`
	K      string `json:"type_k"`
	V      string `json:"type_v"`
}

type slotHeader struct {
	Model    string `json:"model"` // fingerprint
	Arch     string `json:"arch"`
	Layers   int    `json:"layers"`
	KVHeads  int    `json:"kv_heads"`
	HeadDim  int    `json:"head_dim"`
	K        string `json:"type_k"`
	V        string `json:"type_v"`
	NTokens  int    `json:"n_tokens"`
	Checksum string `json:"checksum"` // sha256 algorithm name, for readers
}

// Fingerprint identifies a model's weights: a sha256 over its shape
// (Config) and, for every tensor in a fixed order (name, type, shape), the
// xxhash64 of every byte of it in the row layout of a GGUF file
// (tensor.Matrix.WriteRows: the layout the weights were loaded in, panels
// or rows, mapped or read, does not count). A slot file restores only into
// a model of the same fingerprint. It is computed once per model (tensors
// hashed in parallel; the engine starts it in the background when it is
// made) and cached: weights must not change after the first call.
func Fingerprint(m *model.Model) string {
	fp, _ := fingerprint(m, nil)
	return fp
}

// fpEntry caches a model's fingerprint; fpCache maps weak pointers to
// models to their entries (dropped when a model is collected).
type fpEntry struct {
	mu sync.Mutex
	fp string
}

var fpCache sync.Map // weak.Pointer[model.Model] → *fpEntry

var errFingerprintStopped = errors.New("engine: fingerprint stopped")

// fingerprint is Fingerprint, given up (errFingerprintStopped) once stop
// is set.
func fingerprint(m *model.Model, stop *atomic.Bool) (string, error) {
	k := weak.Make(m)
	v, ok := fpCache.Load(k)
	if !ok {
		var loaded bool
		if v, loaded = fpCache.LoadOrStore(k, &fpEntry{}); !loaded {
			runtime.AddCleanup(m, func(k weak.Pointer[model.Model]) { fpCache.Delete(k) }, k)
		}
	}
	e := v.(*fpEntry)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fp == "" {
		fp, err := computeFingerprint(m, stop)
		if err != nil {
			return "", err
		}
		e.fp = fp
	}
	return e.fp, nil
}

// stopWriter hashes what is written until stop is set.
type stopWriter struct {
	h    *xxhash.Digest
	stop *atomic.Bool
}

func (w stopWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 { // a MiB at a time: a mapped tensor may be read from disk
		if w.stop != nil && w.stop.Load() {
			return n, errFingerprintStopped
		}
		c := min(len(p), 1<<20)
		w.h.Write(p[:c])
		n, p = n+c, p[c:]
	}
	return n, nil
}

func computeFingerprint(m *model.Model, stop *atomic.Bool) (string, error) {
	type tensorHash struct {
		name string
		mat  *tensor.Matrix
		vec  []float32
		sum  uint64
	}
	var ts []*tensorHash
	addM := func(name string, w *tensor.Matrix) {
		if w != nil {
			ts = append(ts, &tensorHash{name: name, mat: w})
		}
	}
	addV := func(name string, v []float32) {
		if v != nil {
			ts = append(ts, &tensorHash{name: name, vec: v})
		}
	}
	addM("token_embd", m.TokEmb)
	if m.Output != m.TokEmb {
		addM("output", m.Output)
	}
	addV("output_norm", m.OutNorm)
	for i, l := range m.Layers {
		b := fmt.Sprintf("blk.%d.", i)
		addV(b+"attn_norm", l.AttnNorm)
		addM(b+"attn_q", l.Wq)
		addM(b+"attn_k", l.Wk)
		addM(b+"attn_v", l.Wv)
		addM(b+"attn_output", l.Wo)
		addV(b+"attn_q.bias", l.Bq)
		addV(b+"attn_k.bias", l.Bk)
		addV(b+"attn_v.bias", l.Bv)
		addV(b+"ffn_norm", l.FFNNorm)
		addM(b+"ffn_gate", l.WGate)
		addM(b+"ffn_up", l.WUp)
		addM(b+"ffn_down", l.WDown)
	}
	// Largest first, over a few workers: the embedding alone may be a
	// tenth of a model.
	order := slices.Clone(ts)
	size := func(t *tensorHash) int {
		if t.mat != nil {
			return len(t.mat.Data)
		}
		return 4 * len(t.vec)
	}
	slices.SortStableFunc(order, func(a, b *tensorHash) int { return size(b) - size(a) })
	next := make(chan *tensorHash, len(order))
	for _, t := range order {
		next <- t
	}
	close(next)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for range min(len(order), max(1, runtime.GOMAXPROCS(0)/2), 8) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for t := range next {
				h := xxhash.New()
				w := stopWriter{h, stop}
				var err error
				if t.mat != nil {
					err = t.mat.WriteRows(w)
				} else {
					buf = buf[:0]
					for _, x := range t.vec {
						buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
					}
					_, err = w.Write(buf)
				}
				if err != nil {
					failed.Store(true)
					return
				}
				t.sum = h.Sum64()
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		return "", errFingerprintStopped
	}
	h := sha256.New()
	fmt.Fprintf(h, "kvlm model fingerprint 2\n%+v\n", m.Config)
	for _, t := range ts {
		if t.mat != nil {
			fmt.Fprintf(h, "%s %s %dx%d %016x\n", t.name, t.mat.Type, t.mat.Rows, t.mat.Cols, t.sum)
		} else {
			fmt.Fprintf(h, "%s f32 %d %016x\n", t.name, len(t.vec), t.sum)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

func (e *Engine) fingerprint() string { return Fingerprint(e.m) }

// keepSlot moves a finished sample's cache into slot id, with its policy's
// state and the logits after its last token (so that a request continuing
// from it samples what the sample would have next). It reports whether it
// kept it (false: the policy's state cannot be kept; Submit refuses such
// requests). Scheduler only.
func (e *Engine) keepSlot(id int, s *seqState) bool {
	sl := &slot{cache: s.cache, pool: s.req.pool, tokens: slices.Clone(s.hist[:s.fed]), cfg: s.req.r.Policy}
	if s.lastLogits != nil {
		sl.logits = slices.Clone(s.lastLogits)
	}
	if s.pol != nil && sl.cfg.Method != "full" {
		snap, err := s.pol.SlotSnapshot()
		if err != nil {
			return false
		}
		sl.snap, sl.pos = snap, s.seq.Pos()
	}
	e.dropSlot(id)
	e.ref(s.req.pool, 1)
	e.slots[id] = sl
	return true
}

// dropSlot frees slot id, if it holds anything. Scheduler only.
func (e *Engine) dropSlot(id int) bool {
	s := e.slots[id]
	if s == nil {
		return false
	}
	s.cache.Free()
	e.ref(s.pool, -1)
	delete(e.slots, id)
	return true
}

// releaseSlots frees every kept slot (their blocks stay in the prefix
// cache until reused) and reports whether there was any. Scheduler only.
func (e *Engine) releaseSlots() bool {
	any := false
	for id := range e.slots {
		any = e.dropSlot(id) || any
	}
	return any
}

// Slots lists the kept slots.
func (e *Engine) Slots() ([]SlotInfo, error) {
	var out []SlotInfo
	err := e.do(func() {
		for id, s := range e.slots {
			out = append(out, e.slotInfo(id, s))
		}
	})
	slices.SortFunc(out, func(a, b SlotInfo) int { return a.ID - b.ID })
	return out, err
}

func (e *Engine) slotInfo(id int, s *slot) SlotInfo {
	k, v := s.pool.Codecs()
	return SlotInfo{ID: id, Tokens: len(s.tokens), Bytes: s.cache.Bytes(), K: k.Name(), V: v.Name()}
}

// ErrNoSlot is returned for an empty slot.
var ErrNoSlot = errors.New("engine: the slot is empty")

func checkSlot(id int) error {
	if id < 0 || id >= MaxSlots {
		return invalid("slot id must be between 0 and %d, got %d", MaxSlots-1, id)
	}
	return nil
}

// EraseSlot frees a slot.
func (e *Engine) EraseSlot(id int) error {
	if err := checkSlot(id); err != nil {
		return err
	}
	var err error
	if derr := e.do(func() {
		if !e.dropSlot(id) {
			err = ErrNoSlot
		}
	}); derr != nil {
		return derr
	}
	return err
}

// slotData is a slot decoded to float32.
type slotData struct {
	hdr    slotHeader
	tokens []int
	pos    [][]int32   // [layer·kvHeads+head][n]
	k, v   [][]float32 // [layer·kvHeads+head][n·headDim]
}

// SaveSlot writes slot id to w in the slot file format.
func (e *Engine) SaveSlot(id int, w io.Writer) (SlotInfo, error) {
	if err := checkSlot(id); err != nil {
		return SlotInfo{}, err
	}
	var body []byte
	var info SlotInfo
	var err error
	if derr := e.do(func() {
		s := e.slots[id]
		if s == nil {
			err = ErrNoSlot
			return
		}
		info = e.slotInfo(id, s)
		body, err = e.encodeSlotV2(s)
	}); derr != nil {
		return info, derr
	}
	if err != nil {
		return info, err
	}
	return info, writeSlotV2(w, body)
}

// snapshot is the version 1 encoder (keys and values decoded to float32),
// kept so that tests write the files an older kvlm wrote; SaveSlot writes
// version 2.
func (e *Engine) snapshot(s *slot) (*slotData, error) {
	l := e.m.KVLayout()
	kc, vc := s.pool.Codecs()
	n := len(s.tokens)
	d := &slotData{tokens: s.tokens, hdr: slotHeader{Model: e.fingerprint(), Arch: e.m.Arch, Layers: l.Layers, KVHeads: l.KVHeads,
		HeadDim: l.HeadDim, K: kc.Name(), V: vc.Name(), NTokens: n, Checksum: "sha256"}}
	hd := l.HeadDim
	for layer := range l.Layers {
		for h := range l.KVHeads {
			pos := make([]int32, 0, n)
			k, v := make([]float32, 0, n*hd), make([]float32, 0, n*hd)
			row := make([]float32, hd)
			for _, seg := range s.cache.Segments(layer, h) {
				if seg.KMag != nil || seg.VMag != nil {
					return nil, errors.New("engine: a merged (MiniCache) cache cannot be saved")
				}
				for i := range seg.N {
					seg.KC.Get(seg.K, seg.Cap, hd, i, row)
					k = append(k, row...)
					seg.VC.Get(seg.V, seg.Cap, hd, i, row)
					v = append(v, row...)
					pos = append(pos, seg.Pos[i])
				}
			}
			if len(pos) < n && l.Windows != nil && l.Windows[layer] > 0 {
				return nil, fmt.Errorf("engine: KV layer %d keeps only the last positions its sliding window of %d sees (%d of %d tokens): a slot holds whole sequences", layer, l.Windows[layer], len(pos), n)
			}
			if len(pos) != n {
				return nil, fmt.Errorf("engine: layer %d head %d holds %d tokens, not %d: only uncompressed sequences can be saved", layer, h, len(pos), n)
			}
			d.pos = append(d.pos, pos)
			d.k = append(d.k, k)
			d.v = append(d.v, v)
		}
	}
	return d, nil
}

type hashWriter struct {
	w *bufio.Writer
	h hash.Hash
}

func (hw hashWriter) Write(p []byte) (int, error) {
	hw.h.Write(p)
	return hw.w.Write(p)
}

func (d *slotData) write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	hw := hashWriter{w: bw, h: sha256.New()}
	hdr, err := json.Marshal(d.hdr)
	if err != nil {
		return err
	}
	put := func(v any) error { return binary.Write(hw, binary.LittleEndian, v) }
	hw.Write([]byte(slotMagic))
	put(uint32(1))
	put(uint32(len(hdr)))
	hw.Write(hdr)
	toks := make([]uint32, len(d.tokens))
	for i, t := range d.tokens {
		toks[i] = uint32(t)
	}
	put(toks)
	for i := range d.pos {
		put(d.pos[i])
		put(d.k[i])
		if err := put(d.v[i]); err != nil {
			return err
		}
	}
	if _, err := bw.Write(hw.h.Sum(nil)); err != nil {
		return err
	}
	return bw.Flush()
}

// readSlot parses and verifies a slot file against the model. limit bounds
// what is read.
func (e *Engine) readSlot(r io.Reader) (*slotData, *slotV2, error) {
	d, err := e.readSlotFile(r)
	if err != nil {
		return nil, nil, err
	}
	if v2, ok := d.(*slotV2); ok {
		return nil, v2, nil
	}
	return d.(*slotData), nil, nil
}

// readSlotFile is readSlot: a *slotData (version 1) or a *slotV2.
func (e *Engine) readSlotFile(r io.Reader) (any, error) {
	l := e.m.KVLayout()
	// The whole file is needed to verify the checksum before anything is
	// trusted; its size is bounded by the model's context (version 1), or
	// by the KV budget and the tokens a window method may have run past
	// the context (version 2: 64 MiB of tokens and policy state).
	maxBytes := int64(len(slotMagic)+8+4096) + int64(e.m.CtxLen)*(4+int64(e.tables)*(4+8*int64(l.HeadDim))) + sha256.Size
	maxBytes = max(maxBytes, 2*e.budget+4*int64(e.m.Vocab)+1<<26)
	buf, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(buf)) > maxBytes {
		return nil, invalid("slot file is larger than any sequence of this model")
	}
	if len(buf) < len(slotMagic)+8+sha256.Size || string(buf[:len(slotMagic)]) != slotMagic {
		return nil, invalid("not a kvlm slot file")
	}
	body, sum := buf[:len(buf)-sha256.Size], buf[len(buf)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, invalid("slot file checksum mismatch: the file is corrupt or truncated")
	}
	br := bytes.NewReader(body[len(slotMagic):])
	var ver, hlen uint32
	binary.Read(br, binary.LittleEndian, &ver)
	if ver == slotVersion {
		return e.readSlotV2(body[len(slotMagic)+4:])
	}
	binary.Read(br, binary.LittleEndian, &hlen)
	if ver != 1 {
		return nil, invalid("slot file version %d is not supported (this kvlm reads versions 1 and %d)", ver, slotVersion)
	}
	if int(hlen) > br.Len() {
		return nil, invalid("slot file header is truncated")
	}
	hb := make([]byte, hlen)
	br.Read(hb)
	d := &slotData{}
	if err := json.Unmarshal(hb, &d.hdr); err != nil {
		return nil, invalid("slot file header: %v", err)
	}
	h := d.hdr
	if h.Model != e.fingerprint() || h.Layers != l.Layers || h.KVHeads != l.KVHeads || h.HeadDim != l.HeadDim {
		return nil, invalid("slot file was saved from another model (fingerprint %s, this model is %s)", h.Model, e.fingerprint())
	}
	n := h.NTokens
	if n <= 0 || n > e.m.CtxLen {
		return nil, invalid("slot file holds %d tokens; this model's context is %d", n, e.m.CtxLen)
	}
	want := int64(n)*4 + int64(e.tables)*int64(n)*(4+8*int64(l.HeadDim))
	if int64(br.Len()) != want {
		return nil, invalid("slot file body is %d bytes, want %d", br.Len(), want)
	}
	toks := make([]uint32, n)
	binary.Read(br, binary.LittleEndian, toks)
	d.tokens = make([]int, n)
	for i, t := range toks {
		if int(t) >= e.m.Vocab {
			return nil, invalid("slot file token %d out of range", t)
		}
		d.tokens[i] = int(t)
	}
	for range e.tables {
		pos := make([]int32, n)
		k, v := make([]float32, n*l.HeadDim), make([]float32, n*l.HeadDim)
		binary.Read(br, binary.LittleEndian, pos)
		binary.Read(br, binary.LittleEndian, k)
		binary.Read(br, binary.LittleEndian, v)
		for _, x := range slices.Concat(k, v) {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, invalid("slot file holds non-finite keys or values")
			}
		}
		d.pos, d.k, d.v = append(d.pos, pos), append(d.k, k), append(d.v, v)
	}
	// Tokens 0..n-1 in order in every table: what the prefix cache indexes.
	for t := range d.pos {
		for i, p := range d.pos[t] {
			if int(p) != i {
				return nil, invalid("slot file: table %d holds position %d at slot %d; only whole, uncompressed sequences are restored", t, p, i)
			}
		}
	}
	return d, nil
}

// RestoreSlot reads a slot file into slot id (replacing what it held) and
// offers its tokens to the prefix cache.
func (e *Engine) RestoreSlot(id int, r io.Reader) (SlotInfo, error) {
	if err := checkSlot(id); err != nil {
		return SlotInfo{}, err
	}
	d, d2, err := e.readSlot(r)
	if err != nil {
		return SlotInfo{}, err
	}
	if d2 != nil {
		return e.restoreSlotV2(id, d2)
	}
	pool, err := e.pool(d.hdr.K, d.hdr.V)
	if err != nil {
		return SlotInfo{}, poolError(err)
	}
	defer e.ref(pool, -1) // the slot takes its own reference
	var info SlotInfo
	if derr := e.do(func() {
		e.dropSlot(id)
		need := pool.AdmitBytes(len(d.tokens), 1)
		if !e.room(pool, need) {
			err = capacity(ErrKVBusy, "engine: not enough free KV memory now to restore %d tokens; retry later", len(d.tokens))
			return
		}
		c := pool.NewSequence()
		if err = d.fill(c, e.m.KVLayout()); err != nil {
			c.Free()
			if errors.Is(err, kvcache.ErrNoBlocks) {
				err = capacity(ErrKVBusy, "engine: not enough free KV memory now to restore %d tokens; retry later", len(d.tokens))
			}
			return
		}
		c.RegisterPrefix(d.tokens, 0)
		s := &slot{cache: c, pool: pool, tokens: d.tokens}
		e.ref(pool, 1)
		e.slots[id] = s
		info = e.slotInfo(id, s)
	}); derr != nil {
		return info, derr
	}
	return info, err
}

// fill appends the slot's keys and values to an empty cache, layer by layer.
func (d *slotData) fill(c kvcache.Writer, l kvcache.Layout) error {
	n, hd := len(d.tokens), l.HeadDim
	w := l.KVHeads * hd
	k, v := make([]float32, n*w), make([]float32, n*w)
	for layer := range l.Layers {
		for h := range l.KVHeads {
			t := layer*l.KVHeads + h
			for i := range n {
				copy(k[i*w+h*hd:i*w+(h+1)*hd], d.k[t][i*hd:(i+1)*hd])
				copy(v[i*w+h*hd:i*w+(h+1)*hd], d.v[t][i*hd:(i+1)*hd])
			}
		}
		if err := c.Append(layer, d.pos[layer*l.KVHeads], k, v); err != nil {
			return err
		}
	}
	return nil
}
