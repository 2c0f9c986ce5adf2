package engine

// Slot files, version 2: any sequence — compressed by a policy (tables
// ragged per (layer, KV head), each slot with its original or re-indexed
// position), KIVI (its full-precision residual), MiniCache (its merged
// layers) — as it is in the pool, so that a restored slot continues bit
// for bit where the saved one stood:
//
//	"KVLMSLOT" | u32 version (2) | u32 header length | header (JSON, slotHeaderV2)
//	| u32 tokens[n]                       the tokens the sequence ran
//	| f32 logits[vocab]                   after the last of them (has_logits)
//	| u32 length | policy state           policy.Snapshot.MarshalBinary (has_state)
//	| the tables                          kvcache.Image, below
//	| sha256 of everything before it
//
// The tables: u8 pristine, u8 hold, u32 last layer, then for each
// (layer, KV head) table: u32 tokens a window freed from its head, i32
// one past the highest position freed, u32 tokens in blocks, u32 blocks,
// each block;
// u8 residual? (u32 slots, u32 tokens, u16 keys[slots·headDim], u16
// values[slots·headDim], i32 pos[slots]); u8 merged? (i32 pair, u8
// counted, u32 direction blocks, each a u32 count and, when counted, the
// block; u32 norms, f32 key norms, f32 value norms; u32 retained blocks,
// each a u32 count and the block). A block is u32 key bytes, the keys as
// the codec encodes them, u32 value bytes, the values, u32 positions,
// i32 pos[positions]. Nothing is decoded: q8, q4 and KIVI bytes go back as
// they were (decoding and encoding again would not be bit-identical).
//
// Version 1 files (keys and values decoded to float32, whole uncompressed
// sequences) still restore.

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/policy"
)

const slotVersion = 2

// slotPolicy is a slot's policy in its header.
type slotPolicy struct {
	Method string         `json:"method"`
	Params map[string]any `json:"params,omitempty"`
	Key    string         `json:"key"` // policy.Config.Key, checked on restore
}

type slotHeaderV2 struct {
	Model       string     `json:"model"` // fingerprint
	Arch        string     `json:"arch"`
	Layers      int        `json:"layers"`
	KVHeads     int        `json:"kv_heads"`
	HeadDim     int        `json:"head_dim"`
	K           string     `json:"type_k"`
	V           string     `json:"type_v"`
	BlockTokens int        `json:"block_tokens"`
	KeyShift    bool       `json:"key_shift"`           // q8/q4 keys stored around the model's mean keys
	KeyMeans    string     `json:"key_means,omitempty"` // with key_shift: sha256 of the means (float32 bits, by table)
	NTokens     int        `json:"n_tokens"`            // tokens the sequence ran (its history)
	Pos         int        `json:"pos"`                 // the sequence's next position (re-indexed or not)
	Policy      slotPolicy `json:"policy"`
	HasLogits   bool       `json:"has_logits"`
	HasState    bool       `json:"has_state"`
	Checksum    string     `json:"checksum"` // sha256 algorithm name, for readers
}

// slotV2 is a decoded version 2 slot file.
type slotV2 struct {
	hdr    slotHeaderV2
	cfg    policy.Config
	tokens []int
	logits []float32
	state  []byte // policy.Snapshot.MarshalBinary
	img    *kvcache.Image
}

// slotSeqBytes encodes what SaveSlot writes for slot s (everything but
// the magic, version and checksum framing).
func (e *Engine) encodeSlotV2(s *slot) ([]byte, error) {
	c, ok := s.cache.(*kvcache.Paged)
	if !ok {
		return nil, errors.New("engine: the slot's cache cannot be saved")
	}
	img, err := c.Image()
	if err != nil {
		return nil, err
	}
	l := e.m.KVLayout()
	kc, vc := s.pool.Codecs()
	cfg := s.cfg
	if cfg.Method == "" {
		cfg.Method = "full"
	}
	if cfg, err = cfg.Normalize(); err != nil {
		return nil, err
	}
	pos := c.Len()
	if s.snap != nil {
		pos = s.pos
	}
	hdr := slotHeaderV2{Model: e.fingerprint(), Arch: e.m.Arch, Layers: l.Layers, KVHeads: l.KVHeads, HeadDim: l.HeadDim,
		K: kc.Name(), V: vc.Name(), BlockTokens: s.pool.BlockTokens(), KeyShift: s.pool.KeyShifted(), NTokens: len(s.tokens), Pos: pos,
		Policy:    slotPolicy{Method: cfg.Method, Params: policy.ConfigParams(cfg), Key: cfg.Key()},
		HasLogits: s.logits != nil, HasState: s.snap != nil, Checksum: "sha256"}
	if hdr.KeyShift {
		hdr.KeyMeans = e.keyMeansHash()
	}
	var state []byte
	if s.snap != nil {
		if state, err = s.snap.MarshalBinary(); err != nil {
			return nil, err
		}
	}
	hj, err := json.Marshal(hdr)
	if err != nil {
		return nil, err
	}
	w := &slotWriter{}
	w.u32(uint32(len(hj)))
	w.b.Write(hj)
	for _, t := range s.tokens {
		w.u32(uint32(t))
	}
	for _, x := range s.logits {
		w.u32(math.Float32bits(x))
	}
	if s.snap != nil {
		w.u32(uint32(len(state)))
		w.b.Write(state)
	}
	w.image(img)
	return w.b.Bytes(), nil
}

// writeSlotV2 writes the framed file.
func writeSlotV2(w io.Writer, body []byte) error {
	var head bytes.Buffer
	head.WriteString(slotMagic)
	binary.Write(&head, binary.LittleEndian, uint32(slotVersion))
	h := sha256.New()
	h.Write(head.Bytes())
	h.Write(body)
	for _, b := range [][]byte{head.Bytes(), body, h.Sum(nil)} {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

type slotWriter struct{ b bytes.Buffer }

func (w *slotWriter) u8(v bool) {
	if v {
		w.b.WriteByte(1)
	} else {
		w.b.WriteByte(0)
	}
}
func (w *slotWriter) u32(v uint32) { binary.Write(&w.b, binary.LittleEndian, v) }
func (w *slotWriter) raw(p []byte) { w.u32(uint32(len(p))); w.b.Write(p) }
func (w *slotWriter) i32s(p []int32) {
	w.u32(uint32(len(p)))
	binary.Write(&w.b, binary.LittleEndian, p)
}
func (w *slotWriter) block(b kvcache.BlockImage) { w.raw(b.K); w.raw(b.V); w.i32s(b.Pos) }

func (w *slotWriter) image(img *kvcache.Image) {
	w.u8(img.Pristine)
	w.u8(img.Hold)
	w.u32(uint32(img.Last))
	for _, t := range img.Tables {
		w.u32(uint32(t.Drop))
		w.u32(uint32(t.FreedTo))
		w.u32(uint32(t.N))
		w.u32(uint32(len(t.Blocks)))
		for _, b := range t.Blocks {
			w.block(b)
		}
		w.u8(t.Res != nil)
		if r := t.Res; r != nil {
			w.u32(uint32(len(r.Pos)))
			w.u32(uint32(r.N))
			binary.Write(&w.b, binary.LittleEndian, r.K)
			binary.Write(&w.b, binary.LittleEndian, r.V)
			binary.Write(&w.b, binary.LittleEndian, r.Pos)
		}
		w.u8(t.Mini != nil)
		if m := t.Mini; m != nil {
			w.u32(uint32(int32(m.Pair)))
			w.u8(m.Counted)
			w.u32(uint32(len(m.DirCnt)))
			for j, c := range m.DirCnt {
				w.u32(uint32(c))
				if m.Counted {
					w.block(m.Dir[j])
				}
			}
			w.u32(uint32(len(m.KMag)))
			binary.Write(&w.b, binary.LittleEndian, m.KMag)
			binary.Write(&w.b, binary.LittleEndian, m.VMag)
			w.u32(uint32(len(m.RetCnt)))
			for j, c := range m.RetCnt {
				w.u32(uint32(c))
				w.block(m.Ret[j])
			}
		}
	}
}

// slotReader reads a body, every count checked against what is left, so
// a malformed file is an error and never a panic or a huge allocation.
type slotReader struct {
	b   []byte
	err error
}

var errSlotShort = errors.New("slot file body is truncated or malformed")

func (r *slotReader) take(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b) {
		r.err = errSlotShort
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}
func (r *slotReader) u8() bool {
	p := r.take(1)
	if p == nil {
		return false
	}
	if p[0] > 1 {
		r.err = errSlotShort
	}
	return p[0] == 1
}
func (r *slotReader) u32() uint32 {
	p := r.take(4)
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(p)
}

// count is a u32 count of items of size bytes each that must fit in what
// is left.
func (r *slotReader) count(size int) int {
	n := int(r.u32())
	if r.err == nil && int64(n)*int64(size) > int64(len(r.b)) {
		r.err = errSlotShort
		return 0
	}
	return n
}
func (r *slotReader) raw() []byte { return slices.Clone(r.take(r.count(1))) }
func (r *slotReader) i32s(n int) []int32 {
	p := r.take(4 * n)
	out := make([]int32, len(p)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(p[4*i:]))
	}
	return out
}
func (r *slotReader) u16s(n int) []uint16 {
	p := r.take(2 * n)
	out := make([]uint16, len(p)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(p[2*i:])
	}
	return out
}
func (r *slotReader) f32s(n int) []float32 {
	p := r.take(4 * n)
	out := make([]float32, len(p)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
	}
	return out
}
func (r *slotReader) block() kvcache.BlockImage {
	return kvcache.BlockImage{K: r.raw(), V: r.raw(), Pos: r.i32s(r.count(4))}
}

func (r *slotReader) image(tables, d int) *kvcache.Image {
	img := &kvcache.Image{Pristine: r.u8(), Hold: r.u8(), Last: int(r.u32())}
	for range tables {
		if r.err != nil {
			return nil
		}
		var t kvcache.TableImage
		t.Drop, t.FreedTo = int(int32(r.u32())), int32(r.u32())
		t.N = int(r.u32())
		nb := r.count(12)
		for range nb {
			t.Blocks = append(t.Blocks, r.block())
		}
		if r.u8() {
			c := r.count(4*d + 4) // keys and values in f16, positions
			t.Res = &kvcache.ResidualImage{N: int(r.u32())}
			t.Res.K, t.Res.V, t.Res.Pos = r.u16s(c*d), r.u16s(c*d), r.i32s(c)
		}
		if r.u8() {
			m := &kvcache.MiniImage{Pair: int(int32(r.u32())), Counted: r.u8()}
			nd := r.count(4)
			for range nd {
				m.DirCnt = append(m.DirCnt, int32(r.u32()))
				if m.Counted {
					m.Dir = append(m.Dir, r.block())
				}
			}
			nm := r.count(8)
			m.KMag, m.VMag = r.f32s(nm), r.f32s(nm)
			nr := r.count(16)
			for range nr {
				m.RetCnt = append(m.RetCnt, int32(r.u32()))
				m.Ret = append(m.Ret, r.block())
			}
			t.Mini = m
		}
		img.Tables = append(img.Tables, t)
	}
	return img
}

// readSlotV2 decodes the body of a version 2 file (after the magic and the
// version, checksum verified) and checks it against the model.
func (e *Engine) readSlotV2(body []byte) (*slotV2, error) {
	l := e.m.KVLayout()
	r := &slotReader{b: body}
	hj := r.take(r.count(1))
	if r.err != nil {
		return nil, invalid("slot file header is truncated")
	}
	d := &slotV2{}
	dec := json.NewDecoder(bytes.NewReader(hj))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d.hdr); err != nil {
		return nil, invalid("slot file header: %v", err)
	}
	h := &d.hdr
	if h.Model != e.fingerprint() || h.Layers != l.Layers || h.KVHeads != l.KVHeads || h.HeadDim != l.HeadDim {
		return nil, invalid("slot file was saved from another model (fingerprint %s, this model is %s)", h.Model, e.fingerprint())
	}
	if h.NTokens <= 0 || h.Pos < 0 || h.Pos > math.MaxInt32 {
		return nil, invalid("slot file holds %d tokens at position %d", h.NTokens, h.Pos)
	}
	cfg, err := policy.ConfigFromParams(h.Policy.Method, h.Policy.Params)
	if err != nil {
		return nil, invalid("slot file policy: %v", err)
	}
	if cfg.Key() != h.Policy.Key {
		return nil, invalid("slot file policy %q reads back as %q", h.Policy.Key, cfg.Key())
	}
	if err := policy.SlotSavable(cfg); err != nil {
		return nil, invalid("slot file: %v", err)
	}
	if h.HasState != (cfg.Method != "full") {
		return nil, invalid("slot file: a %s slot must have a policy state exactly when it has a policy", cfg.Method)
	}
	d.cfg = cfg
	n := h.NTokens
	if int64(n)*4 > int64(len(r.b)) {
		return nil, invalid("slot file body is truncated")
	}
	d.tokens = make([]int, n)
	for i := range d.tokens {
		t := int(r.u32())
		if t >= e.m.Vocab {
			return nil, invalid("slot file token %d out of range", t)
		}
		d.tokens[i] = t
	}
	if h.HasLogits {
		d.logits = r.f32s(e.m.Vocab)
		for _, x := range d.logits {
			if math.IsNaN(float64(x)) {
				return nil, invalid("slot file holds NaN logits")
			}
		}
	}
	if h.HasState {
		d.state = r.raw()
	}
	d.img = r.image(e.tables, l.HeadDim)
	if r.err != nil {
		return nil, invalid("%v", r.err)
	}
	if len(r.b) != 0 {
		return nil, invalid("slot file has %d bytes after its tables", len(r.b))
	}
	return d, nil
}

// restoreV2 makes the sequence of a version 2 file in pool (codecs and key
// means checked by the caller) and the slot that keeps it. Scheduler only.
func (e *Engine) restoreV2(d *slotV2, pool *kvcache.Pool) (*slot, error) {
	h := d.hdr
	if h.BlockTokens != pool.BlockTokens() || h.KeyShift != pool.KeyShifted() || (h.KeyShift && h.KeyMeans != e.keyMeansHash()) {
		return nil, invalid("slot file was saved with %d-token blocks (key shift %v, means %s); this server's pool has %d (key shift %v)",
			h.BlockTokens, h.KeyShift, h.KeyMeans, pool.BlockTokens(), pool.KeyShifted())
	}
	c, err := pool.ImportImage(d.img)
	if err != nil {
		if errors.Is(err, kvcache.ErrNoBlocks) {
			return nil, capacity(ErrKVBusy, "engine: not enough free KV memory now to restore %d tokens; retry later", len(d.tokens))
		}
		return nil, invalid("slot file: %v", err)
	}
	// Every stored key and value decodes to a finite number.
	if err := finiteCache(c, e.m.KVLayout()); err != nil {
		c.Free()
		return nil, err
	}
	s := &slot{cache: c, pool: pool, tokens: d.tokens, cfg: d.cfg, logits: d.logits, pos: h.Pos}
	if d.state != nil {
		maxSlots := 0
		for i := range d.img.Tables {
			maxSlots = max(maxSlots, slotsOf(&d.img.Tables[i], pool.BlockTokens()))
		}
		sn, err := policy.UnmarshalSnapshot(d.state, d.cfg, e.tables, maxSlots)
		if err != nil {
			c.Free()
			return nil, invalid("slot file: %v", err)
		}
		// The state must fit the tables: Restore checks it on a scratch
		// sequence (its policy is thrown away).
		seq, err := e.m.NewSequence(c)
		if err == nil {
			_, err = policy.Restore(d.cfg, seq, sn)
		}
		if err != nil {
			c.Free()
			return nil, invalid("slot file: %v", err)
		}
		s.snap = sn
	}
	return s, nil
}

// keyMeansHash identifies the key means shifted pools store keys around
// (set once a shifted pool exists).
func (e *Engine) keyMeansHash() string {
	h := sha256.New()
	for _, m := range e.shift {
		for _, x := range m {
			binary.Write(h, binary.LittleEndian, math.Float32bits(x))
		}
	}
	return fmt.Sprintf("%x", h.Sum(nil))[:32]
}

// slotsOf is the tokens a table image holds.
func slotsOf(t *kvcache.TableImage, B int) int {
	n := t.N
	if t.Res != nil {
		n += t.Res.N
	}
	if m := t.Mini; m != nil {
		for _, c := range m.DirCnt {
			n += int(c)
		}
		for _, c := range m.RetCnt {
			n += int(c)
		}
	}
	return n
}

// finiteCache refuses a cache holding a non-finite key or value.
func finiteCache(c *kvcache.Paged, l kvcache.Layout) error {
	row := make([]float32, l.HeadDim)
	for layer := range l.Layers {
		for h := range l.KVHeads {
			for _, seg := range c.Segments(layer, h) {
				for i := range seg.N {
					seg.KC.Get(seg.K, seg.Cap, l.HeadDim, i, row)
					ok := finite(row)
					seg.VC.Get(seg.V, seg.Cap, l.HeadDim, i, row)
					if !ok || !finite(row) || (seg.KMag != nil && !finite(seg.KMag[i:i+1])) || (seg.VMag != nil && !finite(seg.VMag[i:i+1])) {
						return invalid("slot file holds non-finite keys or values (layer %d, KV head %d)", layer, h)
					}
				}
			}
		}
	}
	return nil
}

func finite(x []float32) bool {
	for _, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return false
		}
	}
	return true
}

// restoreSlotV2 is RestoreSlot of a version 2 file.
func (e *Engine) restoreSlotV2(id int, d *slotV2) (SlotInfo, error) {
	pool, err := e.pool(d.hdr.K, d.hdr.V)
	if err != nil {
		return SlotInfo{}, poolError(err)
	}
	defer e.ref(pool, -1) // the slot takes its own reference
	var info SlotInfo
	if derr := e.do(func() {
		e.dropSlot(id)
		var s *slot
		if s, err = e.restoreV2(d, pool); err != nil {
			return
		}
		if s.snap == nil && d.img.Pristine {
			s.cache.RegisterPrefix(s.tokens, 0)
		}
		e.ref(pool, 1)
		e.slots[id] = s
		info = e.slotInfo(id, s)
	}); derr != nil {
		return info, derr
	}
	return info, err
}

// startFromSlot starts s from a kept slot whose sequence ran the first k
// tokens of s's history under s's policy and codecs, if there is one: a
// fork of the slot's cache (the slot keeps its own), its policy state
// restored, so s computes none of those tokens and goes on as the slot's
// sequence would have. It reports whether it did (else cache is still
// empty and s starts as usual). Scheduler only.
func (e *Engine) startFromSlot(s *seqState, cache *kvcache.Paged, k int) bool {
	q := s.req
	key := q.r.Policy.Key()
	var from *slot
	for _, sl := range e.slots {
		if sl.snap != nil && sl.pool == q.pool && sl.cfg.Key() == key && slices.Equal(sl.tokens, s.hist[:k]) &&
			(sl.logits != nil || k < len(s.hist)) {
			from = sl
			break
		}
	}
	if from == nil {
		return false
	}
	cache.Free()
	var logits []float32
	if k == len(s.hist) {
		logits = slices.Clone(from.logits)
	}
	return e.startRestored(s, from.cache.Fork(), from.snap, k, logits)
}
