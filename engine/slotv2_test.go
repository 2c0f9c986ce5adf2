package engine

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// slotMethods are the 15 method configurations of cmd/kvlm's methods
// golden (policy's invariant table, full, pyramidinfer and minicache), and
// slotCodecs its 4 codec pairs.
var slotMethods = []policy.Config{
	{Method: "full"},
	{Method: "window", Window: 40},
	{Method: "streaming", Window: 36, Sinks: 4},
	{Method: "streaming", Window: 36, Sinks: 4, Positions: policy.PosOriginal, Every: 1},
	{Method: "lminfinite", Window: 60, Sinks: 4},
	{Method: "h2o", Budget: 48},
	{Method: "h2o", Ratio: 0.5, Every: 8},
	{Method: "tova", Budget: 40},
	{Method: "snapkv", Budget: 64, Window: 16},
	{Method: "snapkv", Ratio: 0.25, Window: 16, Every: 16},
	{Method: "adakv", Budget: 64, Window: 16},
	{Method: "pyramidkv", Budget: 64, Window: 16},
	{Method: "knorm", Budget: 50, Sinks: 2, Window: 8, Every: 4},
	{Method: "pyramidinfer"},
	{Method: "minicache"},
}

var slotCodecs = [][2]string{{"f32", "f32"}, {"f16", "bf16"}, {"q8", "q4"}, {"kivi4", "kivi2"}}

// slotRun is one sequence under test: a prompt and decoded tokens.
type slotRun struct {
	seq    *model.Sequence
	st     *policy.State
	hist   []int
	logits []float32
}

func (r *slotRun) step(t *testing.T) (int, error) {
	tok := argmaxOf(r.logits)
	l, err := r.seq.Forward([]int{tok}, false)
	if err != nil {
		return tok, err
	}
	r.hist, r.logits = append(r.hist, tok), l
	return tok, nil
}

// TestSlotRoundTripMethods: for every method × codec pair of the methods
// golden, a sequence (a 170-token prompt, compressed, then 16 greedy
// tokens through the decoding-time prunes) is saved to a version 2 slot
// file, restored by another engine, and continued for 16 greedy tokens:
// the logits it stood at and every step's logits are bit for bit those of
// the uninterrupted sequence. Configurations the method refuses for a
// codec are refused alike; pyramidinfer's state cannot be saved, and the
// request asking for it is refused. Then the file is restored with a
// piece switched off — the slots' positions, the policy state, the KIVI
// residual — and the continuation must differ.
func TestSlotRoundTripMethods(t *testing.T) {
	if testing.Short() {
		t.Skip("60 method × codec round trips; -short (CI's race run) skips it, the plain run has it")
	}
	m, tok := loadStories(t)
	raw, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	prompt := tok.Encode(string(raw[:700]), true, false)
	const before, after = 16, 16
	e1 := newEngine(t, m, Config{KVMem: 64 << 20})
	e2 := newEngine(t, m, Config{KVMem: 64 << 20})
	ablated := map[string]int{}
	ablatable := map[string]int{}
	roundTrips := 0
	for _, cfg := range slotMethods {
		for _, cc := range slotCodecs {
			name := fmt.Sprintf("%s/%s-%s", cfg.Key(), cc[0], cc[1])
			if n, err := cfg.Normalize(); err == nil {
				name = fmt.Sprintf("%s/%s-%s", n.Key(), cc[0], cc[1])
			}
			t.Run(name, func(t *testing.T) {
				ncfg, err := cfg.Normalize()
				if err != nil {
					t.Fatal(err)
				}
				p1, err := e1.pool(cc[0], cc[1])
				if err != nil {
					t.Fatal(err)
				}
				defer e1.ref(p1, -1)
				orig, err := newSlotRun(m, p1, ncfg, prompt)
				if err != nil {
					t.Logf("refused: %v", err)
					return
				}
				defer orig.seq.Cache().(*kvcache.Paged).Free()
				for range before {
					if _, err := orig.step(t); err != nil {
						t.Fatal(err)
					}
				}
				sl := &slot{cache: orig.seq.Cache().(*kvcache.Paged), pool: p1, tokens: slices.Clone(orig.hist), cfg: ncfg, logits: slices.Clone(orig.logits)}
				if orig.st != nil {
					snap, err := orig.st.SlotSnapshot()
					if err != nil {
						if policy.SlotSavable(ncfg) == nil {
							t.Fatalf("SlotSavable passes %s, SlotSnapshot refuses: %v", ncfg.Method, err)
						}
						// A request keeping this slot is refused up front.
						if _, serr := e1.Submit(GenRequest{Prompt: prompt, MaxTokens: 1, Slot: new(int), Policy: ncfg}); serr == nil || !strings.Contains(serr.Error(), ncfg.Method) {
							t.Errorf("a slot request of %s: %v", ncfg.Method, serr)
						}
						t.Logf("refused: %v", err)
						return
					}
					sl.snap, sl.pos = snap, orig.seq.Pos()
				}
				body, err := e1.encodeSlotV2(sl)
				if err != nil {
					t.Fatal(err)
				}
				var file bytes.Buffer
				if err := writeSlotV2(&file, body); err != nil {
					t.Fatal(err)
				}
				// The uninterrupted continuation.
				want := [][]float32{slices.Clone(orig.logits)}
				wantTok := []int{}
				for range after {
					tk, err := orig.step(t)
					if err != nil {
						t.Fatal(err)
					}
					wantTok = append(wantTok, tk)
					want = append(want, slices.Clone(orig.logits))
				}
				got, gotTok, err := restoreAndRun(t, e2, file.Bytes(), after, nil)
				if err != nil {
					t.Fatal(err)
				}
				if i := firstDiff(want, got); i >= 0 || !slices.Equal(wantTok, gotTok) {
					t.Fatalf("restored: logits differ from step %d; tokens %v, want %v", i, gotTok, wantTok)
				}
				roundTrips++
				// Pieces switched off.
				d, err := e2.readSlotFile(bytes.NewReader(file.Bytes()))
				if err != nil {
					t.Fatal(err)
				}
				d2 := d.(*slotV2)
				// The file holds what the pair makes: a KIVI residual, a
				// MiniCache merge, tables ragged after a prune.
				var res, mini bool
				lens := map[int]bool{}
				for _, tb := range d2.img.Tables {
					res = res || (tb.Res != nil && tb.Res.N > 0)
					mini = mini || tb.Mini != nil
					lens[slotsOf(&tb, p1.BlockTokens())] = true
				}
				if res != strings.HasPrefix(cc[0], "kivi") || mini != (ncfg.Method == "minicache") {
					t.Errorf("file: residual %v, merged %v", res, mini)
				}
				t.Logf("tables of %d distinct lengths", len(lens))
				for _, piece := range []string{"positions", "state", "residual"} {
					if !ablates(d2, piece) {
						continue
					}
					ablatable[piece]++
					g, gt, err := restoreAndRun(t, e2, file.Bytes(), after, func(d *slotV2) { ablate(d, piece) })
					if err != nil || firstDiff(want, g) >= 0 || !slices.Equal(wantTok, gt) {
						ablated[piece]++
						t.Logf("without the %s: differs (%v)", piece, err)
					}
				}
			})
		}
	}
	t.Logf("%d round trips bit-identical; switched off (differing/applicable): %v / %v", roundTrips, ablated, ablatable)
	// Every piece is needed: without it some continuations differ. The
	// KIVI residual always holds the newest tokens: every one differs.
	for _, piece := range []string{"positions", "state", "residual"} {
		if ablated[piece] == 0 {
			t.Errorf("restoring without the %s changes nothing (%d cases): the test would not see it missing", piece, ablatable[piece])
		}
	}
	if ablated["residual"] != ablatable["residual"] {
		t.Errorf("without the KIVI residual %d of %d continuations differ, want all", ablated["residual"], ablatable["residual"])
	}
	checkFree(t, e1)
	checkFree(t, e2)
}

// newSlotRun runs prompt under cfg in a sequence of pool p.
func newSlotRun(m *model.Model, p *kvcache.Pool, cfg policy.Config, prompt []int) (*slotRun, error) {
	c := p.NewSequence()
	seq, err := m.NewSequence(c)
	if err != nil {
		c.Free()
		return nil, err
	}
	r := &slotRun{seq: seq, hist: slices.Clone(prompt)}
	if cfg.Method != "full" {
		if r.st, err = policy.New(cfg, seq); err != nil {
			c.Free()
			return nil, err
		}
		seq.SetPolicy(r.st)
		seq.Prompt(len(prompt))
	}
	if r.logits, err = seq.Forward(prompt, false); err != nil {
		c.Free()
		return nil, err
	}
	return r, nil
}

// restoreAndRun restores a slot file in e (through readSlotFile and
// restoreV2, with change applied to what was read) and continues from it
// as a request would (startFromSlot): a fork of its cache, the policy
// restored, the first token from its logits. It returns the logits it
// stood at and after each of n greedy steps, and the tokens.
func restoreAndRun(t *testing.T, e *Engine, file []byte, n int, change func(*slotV2)) ([][]float32, []int, error) {
	d, err := e.readSlotFile(bytes.NewReader(file))
	if err != nil {
		return nil, nil, err
	}
	d2 := d.(*slotV2)
	if change != nil {
		change(d2)
	}
	pool, err := e.pool(d2.hdr.K, d2.hdr.V)
	if err != nil {
		return nil, nil, err
	}
	defer e.ref(pool, -1)
	sl, err := e.restoreV2(d2, pool)
	if err != nil {
		return nil, nil, err
	}
	defer sl.cache.Free()
	c := sl.cache.Fork()
	defer c.Free()
	seq, err := e.m.NewSequence(c)
	if err != nil {
		return nil, nil, err
	}
	r := &slotRun{seq: seq, logits: slices.Clone(sl.logits)}
	switch {
	case sl.snap != nil:
		if r.st, err = policy.Restore(sl.cfg, seq, sl.snap); err != nil {
			return nil, nil, err
		}
	case sl.cfg.Method != "full":
		// The state switched off: the policy starts afresh on the cache.
		if r.st, err = policy.New(sl.cfg, seq); err != nil {
			return nil, nil, err
		}
		seq.SetPolicy(r.st)
	}
	out := [][]float32{slices.Clone(r.logits)}
	var toks []int
	for range n {
		tk, err := r.step(t)
		if err != nil {
			return out, toks, err
		}
		toks = append(toks, tk)
		out = append(out, slices.Clone(r.logits))
	}
	return out, toks, nil
}

// ablates reports whether the file holds the piece.
func ablates(d *slotV2, piece string) bool {
	switch piece {
	case "positions":
		return true
	case "state":
		return d.state != nil
	case "residual":
		for _, t := range d.img.Tables {
			if t.Res != nil && t.Res.N > 0 {
				return true
			}
		}
	}
	return false
}

// ablate switches a piece off: every slot's position replaced by its
// index in the table (what a restore that dropped them would have: tokens
// in order), the policy state dropped, or the residual emptied.
func ablate(d *slotV2, piece string) {
	switch piece {
	case "positions":
		for i := range d.img.Tables {
			t := &d.img.Tables[i]
			at := int32(0)
			for j := range t.Blocks {
				for k := range t.Blocks[j].Pos {
					t.Blocks[j].Pos[k] = at
					at++
				}
			}
			if t.Res != nil {
				for k := range t.Res.N {
					t.Res.Pos[k] = at
					at++
				}
			}
		}
	case "state":
		d.state = nil
	case "residual":
		for i := range d.img.Tables {
			if r := d.img.Tables[i].Res; r != nil {
				r.N = 0
			}
		}
	}
}

// firstDiff is the first step whose logits differ in a bit, or -1.
func firstDiff(a, b [][]float32) int {
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || len(a[i]) != len(b[i]) {
			return i
		}
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				return i
			}
		}
	}
	return -1
}

// TestEngineSlotCompressed: requests under a policy keep their sequence
// in a slot; it is saved, restored by another engine, and a request whose
// prompt is the slot's tokens (same kv settings) starts from it: it
// computes none of its prompt, and its tokens are those the uninterrupted
// request generated after them. The engine that kept the slot continues
// from it alike, and the slot stays for the next request.
func TestEngineSlotCompressed(t *testing.T) {
	m, tok := loadStories(t)
	raw, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	prompt := tok.Encode(string(raw[:700]), true, false)
	const M, N = 12, 12
	cases := []struct {
		cfg  policy.Config
		k, v string
	}{
		{policy.Config{Method: "h2o", Budget: 48}, "f32", "f32"},
		{policy.Config{Method: "snapkv", Ratio: 0.25, Window: 16, Every: 16}, "q8", "q4"},
		{policy.Config{Method: "h2o", Ratio: 0.5, Every: 8}, "kivi4", "kivi2"},
		{policy.Config{Method: "streaming"}, "f16", "bf16"},
		{policy.Config{Method: "minicache"}, "f32", "f32"},
	}
	for _, c := range cases {
		t.Run(c.cfg.Method+"/"+c.k+"-"+c.v, func(t *testing.T) {
			e1 := newEngine(t, m, Config{KVMem: 32 << 20})
			e2 := newEngine(t, m, Config{KVMem: 32 << 20})
			req := func(p []int, n int, slot *int) GenRequest {
				return GenRequest{Prompt: p, MaxTokens: n, Policy: c.cfg, K: c.k, V: c.v, Slot: slot}
			}
			all := collect(t, must(e1.Submit(req(prompt, M+N, nil)))).tokens[0]
			if len(all) != M+N {
				t.Fatalf("%d tokens", len(all))
			}
			slot := 5
			first := collect(t, must(e1.Submit(req(prompt, M, &slot))))
			if !slices.Equal(first.tokens[0], all[:M]) {
				t.Fatalf("with a slot: %v, want %v", first.tokens[0], all[:M])
			}
			var file bytes.Buffer
			info, err := e1.SaveSlot(slot, &file)
			if err != nil {
				t.Fatal(err)
			}
			if info.Tokens != len(prompt)+M-1 {
				t.Errorf("slot of %d tokens, want %d", info.Tokens, len(prompt)+M-1)
			}
			if _, err := e2.RestoreSlot(0, bytes.NewReader(file.Bytes())); err != nil {
				t.Fatal(err)
			}
			next := slices.Concat(prompt, all[:M-1])
			for i, e := range []*Engine{e2, e1, e2} {
				o := collect(t, must(e.Submit(req(next, N+1, nil))))
				if !slices.Equal(o.tokens[0], all[M-1:]) {
					t.Errorf("continuation %d: %v, want %v", i, o.tokens[0], all[M-1:])
				}
				if o.usage.ComputedTokens != 0 || o.usage.CompressedTokens != len(next) {
					t.Errorf("continuation %d: computed %d, from the slot %d of %d", i, o.usage.ComputedTokens, o.usage.CompressedTokens, len(next))
				}
			}
			// Other kv settings do not start from the slot.
			other := c.cfg
			other.Method = "full"
			other = policy.Config{Method: "window", Window: 100}
			if o := collect(t, must(e2.Submit(GenRequest{Prompt: next, MaxTokens: 2, Policy: other, K: c.k, V: c.v}))); o.usage.CompressedTokens != 0 {
				t.Errorf("another policy started from the slot")
			}
			for _, e := range []*Engine{e1, e2} {
				slots, _ := e.Slots()
				for _, s := range slots {
					e.EraseSlot(s.ID)
				}
				checkFree(t, e)
			}
		})
	}
}

// slotFiles is a version 2 slot file of a KIVI h2o request and of a
// MiniCache one, and a version 1 file of a plain request (written by the
// version 1 encoder, as an older kvlm did).
func slotFiles(t testing.TB, e *Engine, tok []int) (v2 [][]byte, v1 []byte) {
	t.Helper()
	for i, r := range []GenRequest{
		{Prompt: tok, MaxTokens: 6, Policy: policy.Config{Method: "h2o", Budget: 24}, K: "kivi4", V: "kivi2"},
		{Prompt: tok, MaxTokens: 6, Policy: policy.Config{Method: "minicache"}},
	} {
		id := i
		r.Slot = &id
		collect(t, must(e.Submit(r)))
		var b bytes.Buffer
		if _, err := e.SaveSlot(id, &b); err != nil {
			t.Fatal(err)
		}
		v2 = append(v2, b.Bytes())
	}
	id := 2
	collect(t, must(e.Submit(GenRequest{Prompt: tok, MaxTokens: 6, Slot: &id})))
	var b bytes.Buffer
	var err error
	if derr := e.do(func() {
		var d *slotData
		if d, err = e.snapshot(e.slots[id]); err == nil {
			err = d.write(&b)
		}
	}); derr != nil || err != nil {
		t.Fatal(derr, err)
	}
	for id := range 3 {
		e.EraseSlot(id)
	}
	return v2, b.Bytes()
}

// reframe gives body (a file without its checksum, magic and version
// included) a valid checksum, so that the parser, not the checksum, sees
// what is wrong with it.
func reframe(body []byte) []byte {
	sum := sha256Sum(body)
	return append(slices.Clone(body), sum...)
}

// TestSlotFileVersions: a version 1 file still restores (and feeds the
// prefix cache as before); an unknown version is refused with a message
// naming the versions read; a corrupt file fails its checksum.
func TestSlotFileVersions(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{KVMem: 16 << 20})
	p := tok.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside.", true, false)
	v2, v1 := slotFiles(t, e, p)
	if _, err := e.RestoreSlot(7, bytes.NewReader(v1)); err != nil {
		t.Fatalf("version 1 file: %v", err)
	}
	for i, f := range v2 {
		if _, err := e.RestoreSlot(8+i, bytes.NewReader(f)); err != nil {
			t.Fatalf("version 2 file %d: %v", i, err)
		}
	}
	v3 := slices.Clone(v2[0][:len(v2[0])-32])
	v3[len(slotMagic)] = 3
	if _, err := e.RestoreSlot(1, bytes.NewReader(reframe(v3))); err == nil || !strings.Contains(err.Error(), "version 3 is not supported (this kvlm reads versions 1 and 2)") {
		t.Errorf("version 3: %v", err)
	}
	bad := slices.Clone(v2[0])
	bad[len(bad)/2] ^= 1
	if _, err := e.RestoreSlot(1, bytes.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("corrupt file: %v", err)
	}
	for _, id := range []int{7, 8, 9} {
		if err := e.EraseSlot(id); err != nil {
			t.Error(err)
		}
	}
	checkFree(t, e)
}

// TestSlotFileMalformed: version 2 files with bytes changed, cut or
// inserted (checksum recomputed, so the parser reads them) are refused
// with an InvalidError or restore; nothing panics and the pool is free
// after.
func TestSlotFileMalformed(t *testing.T) {
	m, tok := loadStories(t)
	e := newEngine(t, m, Config{KVMem: 16 << 20})
	p := tok.Encode("Once upon a time, there was a little girl named Lily.", true, false)
	v2, _ := slotFiles(t, e, p)
	rng := uint64(1)
	next := func(n int) int {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return int(rng % uint64(n))
	}
	refused := 0
	for i := range 600 {
		f := v2[i%len(v2)]
		body := slices.Clone(f[:len(f)-32])
		switch i % 4 {
		case 0: // a byte changed
			j := len(slotMagic) + 4 + next(len(body)-len(slotMagic)-4)
			body[j] ^= byte(1 + next(255))
		case 1: // a 32-bit count set large
			j := len(slotMagic) + 4 + next(len(body)-len(slotMagic)-8)
			copy(body[j:], []byte{0xff, 0xff, 0xff, byte(next(128))})
		case 2: // cut
			body = body[:len(slotMagic)+4+next(len(body)-len(slotMagic)-4)]
		case 3: // bytes inserted
			j := len(slotMagic) + 4 + next(len(body)-len(slotMagic)-4)
			body = slices.Insert(body, j, byte(next(256)), byte(next(256)), byte(next(256)), byte(next(256)))
		}
		_, err := e.RestoreSlot(10, bytes.NewReader(reframe(body)))
		var ie *InvalidError
		if err != nil {
			refused++
			if !errors.As(err, &ie) {
				t.Errorf("mutation %d: %v is not an InvalidError", i, err)
			}
		}
		e.EraseSlot(10)
	}
	t.Logf("%d of 600 mutated files refused", refused)
	if refused < 300 {
		t.Errorf("only %d of 600 mutated files refused", refused)
	}
	checkFree(t, e)
}

// FuzzSlotFile: any body (checksum made valid) restores or is refused with
// an error; nothing panics.
func FuzzSlotFile(f *testing.F) {
	m, tok := loadStories(f)
	e := newEngine(f, m, Config{KVMem: 16 << 20})
	v2, v1 := slotFiles(f, e, tok.Encode("Once upon a time", true, false))
	for _, b := range append(v2, v1) {
		f.Add(b[:len(b)-32])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, err := e.RestoreSlot(11, bytes.NewReader(reframe(body))); err == nil {
			e.EraseSlot(11)
		}
	})
}

func sha256Sum(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

// TestSlotKeyShift: a slot of a pool whose q8 keys are stored around the
// model's mean keys restores into an engine with the same means and
// continues as the uninterrupted request; an engine with other means, or
// none, refuses it.
func TestSlotKeyShift(t *testing.T) {
	m, tok := loadStories(t)
	prompt := tok.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park.", true, false)
	bos := []int{tok.BOS()}
	cfg := func(shift []int) Config { return Config{K: "q8", V: "q8", KeyShiftPrompt: shift, KVMem: 8 << 20} }
	e1 := newEngine(t, m, cfg(bos))
	req := GenRequest{Prompt: prompt, MaxTokens: 16, Policy: policy.Config{Method: "h2o", Budget: 16}}
	all := collect(t, must(e1.Submit(req))).tokens[0]
	slot := 1
	r := req
	r.MaxTokens, r.Slot = 8, &slot
	collect(t, must(e1.Submit(r)))
	var file bytes.Buffer
	if _, err := e1.SaveSlot(slot, &file); err != nil {
		t.Fatal(err)
	}
	e2 := newEngine(t, m, cfg(bos))
	if _, err := e2.RestoreSlot(0, bytes.NewReader(file.Bytes())); err != nil {
		t.Fatal(err)
	}
	r = req
	r.Prompt, r.MaxTokens = slices.Concat(prompt, all[:7]), 9
	if o := collect(t, must(e2.Submit(r))); !slices.Equal(o.tokens[0], all[7:]) || o.usage.ComputedTokens != 0 {
		t.Errorf("continuation %v (computed %d), want %v", o.tokens[0], o.usage.ComputedTokens, all[7:])
	}
	for _, shift := range [][]int{slices.Concat(bos, prompt[1:4]), nil} {
		e3 := newEngine(t, m, cfg(shift))
		if _, err := e3.RestoreSlot(0, bytes.NewReader(file.Bytes())); err == nil || !strings.Contains(err.Error(), "key shift") {
			t.Errorf("key shift prompt %v: %v", shift, err)
		}
	}
	e1.EraseSlot(slot)
	e2.EraseSlot(0)
	checkFree(t, e1)
	checkFree(t, e2)
}
