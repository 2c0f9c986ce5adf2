package policy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// A policy's state in a file (engine's slot files): the Snapshot the
// compressed prefix cache keeps, as bytes, and the configuration it was
// taken under as the value of every parameter.

// SlotSnapshot is Snapshot for a slot file: it also takes the state of
// full (nothing but the history) and of minicache (whose runner keeps
// nothing of its own: the merged tables are the cache's). Methods whose
// runner or scorer keeps per-sequence state (expected's query statistics,
// pyramidinfer's schedule) are refused with an error that names them.
func (st *State) SlotSnapshot() (*Snapshot, error) {
	if st.prefT != 0 {
		return nil, errors.New("policy: the state is inside a prompt")
	}
	if err := SlotSavable(st.cfg); err != nil {
		return nil, err
	}
	return st.copyState(), nil
}

// SlotSavable says whether SlotSnapshot takes the state of c's method
// (nil), or why not.
func SlotSavable(c Config) error {
	m, ok := registry[c.Method]
	if !ok {
		return fmt.Errorf("policy: unknown method %q", c.Method)
	}
	if c.Method == "minicache" || (!m.prunes() && m.Run == nil) || (m.Scorer != nil && m.NewScorer == nil && m.Run == nil) {
		return nil
	}
	return fmt.Errorf("policy: the state of a %s sequence cannot be saved (the method keeps per-sequence state of its own)", c.Method)
}

// Config is the configuration the snapshot was taken under (normalized).
func (sn *Snapshot) Config() Config { return sn.cfg }

// ConfigParams is c's method and the value of every parameter it takes
// (ints, floats and strings), what ConfigFromParams reads back.
func ConfigParams(c Config) map[string]any {
	out := map[string]any{}
	for _, name := range Params(c.Method) {
		out[name] = params[name].Value(c)
	}
	return out
}

// ConfigFromParams is the normalized configuration of method with the
// parameter values of ConfigParams (JSON-decoded: numbers as float64).
func ConfigFromParams(method string, vals map[string]any) (Config, error) {
	m, ok := registry[method]
	if !ok {
		return Config{}, fmt.Errorf("policy: unknown method %q", method)
	}
	c := Config{Method: method}
	for name, v := range vals {
		p, ok := params[name]
		if !ok || !slices.Contains(m.Params, name) {
			return c, fmt.Errorf("policy: %s takes no parameter %q", method, name)
		}
		if f, ok := v.(float64); ok && p.Kind == IntParam {
			if f != math.Trunc(f) || math.Abs(f) > math.MaxInt32 {
				return c, fmt.Errorf("policy: %s %v is not an integer", name, f)
			}
			v = int(f)
		}
		if s, ok := v.(string); ok && s == "" {
			continue
		}
		if err := p.Set(&c, v); err != nil {
			return c, err
		}
	}
	return c.Normalize()
}

// snapshotVersion 2 adds the anchors; version 1 (without them) is read
// too.
const snapshotVersion = 2

// MarshalBinary encodes the snapshot's numbers (not its configuration:
// the caller stores ConfigParams beside it): little-endian u32 version,
// i64 seen, steps, pruned, pos, u32 tables, then per table u32 n, i32
// orig[n], u32 m, f32 scores[m]; then per table the anchors: u32 count,
// u32 d, and per anchor i32 token, i32 pos, f32 key[d].
func (sn *Snapshot) MarshalBinary() ([]byte, error) {
	var b bytes.Buffer
	put := func(v any) { binary.Write(&b, binary.LittleEndian, v) }
	put(uint32(snapshotVersion))
	put([]int64{int64(sn.seen), int64(sn.steps), int64(sn.pruned), int64(sn.pos)})
	put(uint32(len(sn.orig)))
	for i := range sn.orig {
		put(uint32(len(sn.orig[i])))
		put(sn.orig[i])
		put(uint32(len(sn.scores[i])))
		put(sn.scores[i])
	}
	for i := range sn.orig {
		var as []anchor
		if sn.anchors != nil {
			as = sn.anchors[i]
		}
		d := 0
		if len(as) > 0 {
			d = len(as[0].key)
		}
		put([]uint32{uint32(len(as)), uint32(d)})
		for _, a := range as {
			put([]int32{a.token, a.pos})
			put(a.key)
		}
	}
	return b.Bytes(), nil
}

// UnmarshalSnapshot decodes MarshalBinary's bytes for cfg (normalized),
// of tables tables each of at most maxSlots slots; a malformed input is an
// error.
func UnmarshalSnapshot(data []byte, cfg Config, tables, maxSlots int) (*Snapshot, error) {
	r := bytes.NewReader(data)
	bad := errors.New("policy: the saved state is malformed")
	var ver, nt uint32
	hdr := make([]int64, 4)
	if binary.Read(r, binary.LittleEndian, &ver) != nil || ver < 1 || ver > snapshotVersion {
		return nil, fmt.Errorf("policy: saved state version %d is not supported", ver)
	}
	if binary.Read(r, binary.LittleEndian, hdr) != nil || binary.Read(r, binary.LittleEndian, &nt) != nil || int(nt) != tables {
		return nil, bad
	}
	for _, x := range hdr {
		if x < 0 || x > math.MaxInt32 {
			return nil, bad
		}
	}
	sn := &Snapshot{cfg: cfg, seen: int(hdr[0]), steps: int(hdr[1]), pruned: int(hdr[2]), pos: int(hdr[3]),
		scores: make([][]float32, nt), orig: make([][]int32, nt)}
	count := func() (int, error) {
		var n uint32
		if binary.Read(r, binary.LittleEndian, &n) != nil || int64(n)*4 > int64(r.Len()) {
			return 0, bad
		}
		if int(n) > maxSlots {
			return 0, fmt.Errorf("policy: the saved state names %d slots of a table; the tables hold at most %d", n, maxSlots)
		}
		return int(n), nil
	}
	for i := range sn.orig {
		n, err := count()
		if err != nil {
			return nil, err
		}
		sn.orig[i] = make([]int32, n)
		binary.Read(r, binary.LittleEndian, sn.orig[i])
		for _, p := range sn.orig[i] {
			if p < 0 || int(p) >= sn.seen {
				return nil, fmt.Errorf("policy: the saved state holds position %d of %d tokens", p, sn.seen)
			}
		}
		if n, err = count(); err != nil {
			return nil, err
		}
		sn.scores[i] = make([]float32, n)
		binary.Read(r, binary.LittleEndian, sn.scores[i])
		for _, x := range sn.scores[i] {
			if math.IsNaN(float64(x)) {
				return nil, errors.New("policy: the saved state holds a NaN score")
			}
		}
	}
	if ver >= 2 {
		if err := readAnchors(r, sn, maxSlots); err != nil {
			return nil, err
		}
	}
	if r.Len() != 0 {
		return nil, bad
	}
	return sn, nil
}

// readAnchors reads MarshalBinary's anchors section into sn.
func readAnchors(r *bytes.Reader, sn *Snapshot, maxSlots int) error {
	bad := errors.New("policy: the saved state's anchors are malformed")
	sn.anchors = make([][]anchor, len(sn.orig))
	for i := range sn.anchors {
		var hdr [2]uint32
		if binary.Read(r, binary.LittleEndian, &hdr) != nil {
			return bad
		}
		n, d := int64(hdr[0]), int64(hdr[1])
		if n > int64(maxSlots) || d > 1<<16 || (n > 0 && d == 0) || n*(8+4*d) > int64(r.Len()) {
			return bad
		}
		for range n {
			var tp [2]int32
			key := make([]float32, d)
			binary.Read(r, binary.LittleEndian, &tp)
			binary.Read(r, binary.LittleEndian, key)
			if tp[0] < 0 || int(tp[0]) >= sn.seen || tp[1] < 0 {
				return fmt.Errorf("policy: the saved state holds an anchor of token %d at position %d of %d tokens", tp[0], tp[1], sn.seen)
			}
			for _, x := range key {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					return errors.New("policy: the saved state holds a key that is not finite")
				}
			}
			sn.anchors[i] = append(sn.anchors[i], anchor{token: tp[0], pos: tp[1], key: key})
		}
	}
	return nil
}
