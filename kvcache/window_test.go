package kvcache

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/kvcache/codec"
)

// appendLayer appends n tokens at start to one layer, with appendTokens'
// values.
func appendLayer(s *Paged, l, start, n int) error {
	L := s.Layout()
	w := L.KVHeads * L.HeadDim
	k, v := make([]float32, n*w), make([]float32, n*w)
	pos := make([]int32, n)
	for i := 0; i < n; i++ {
		pos[i] = int32(start + i)
		for h := 0; h < L.KVHeads; h++ {
			for c := 0; c < L.HeadDim; c++ {
				k[i*w+h*L.HeadDim+c] = value(start+i, l, h, c)
				v[i*w+h*L.HeadDim+c] = -value(start+i, l, h, c)
			}
		}
	}
	return s.Append(l, pos, k, v)
}

// appendByLayer appends n tokens at start layer by layer and returns how
// much each layer's Append changed the pool's used bytes.
func appendByLayer(t testing.TB, s *Paged, start, n int) []int64 {
	t.Helper()
	p := s.Pool()
	d := make([]int64, s.Layout().Layers)
	for l := range d {
		before := p.Usage().BytesUsed
		if err := appendLayer(s, l, start, n); err != nil {
			t.Fatalf("append of %d tokens at %d, layer %d: %v", n, start, l, err)
		}
		d[l] = p.Usage().BytesUsed - before
	}
	return d
}

// windowCodecs are the codec pairs the window tests run: each codec on
// both sides, and KIVI values under per-token keys.
var windowCodecs = [][2]string{{"f32", "f32"}, {"f16", "f16"}, {"bf16", "bf16"}, {"q8", "q8"}, {"q4", "q4"}, {"kivi2", "kivi2"}, {"kivi4", "kivi4"}, {"q8", "kivi2"}}

func windowPool(t testing.TB, l Layout, kn, vn string, B, residual int, a *Arena) (*Pool, error) {
	k, err := codec.Parse(kn, codec.Keys)
	if err != nil {
		t.Fatal(err)
	}
	v, err := codec.Parse(vn, codec.Values)
	if err != nil {
		t.Fatal(err)
	}
	cfg := PoolConfig{Layout: l, BlockTokens: B, K: k, V: v, Residual: residual, Arena: a}
	if a == nil {
		cfg.Tokens = 6000
	}
	return NewPool(cfg)
}

// heldPositions is (layer, head)'s positions, and whether they are the
// consecutive run from..to-1.
func heldPositions(s *Paged, layer, head, from, to int) ([]int32, bool) {
	pos := s.Positions(layer, head)
	ok := len(pos) == to-from
	for i, p := range pos {
		ok = ok && int(p) == from+i
	}
	return pos, ok
}

// TestWindowMemoryFlat: over 4,000 decoded tokens (after a 96-token
// prompt) a window-bounded layer's bytes, read from its pool and from the
// arena, stay the same at every checkpoint while an unbounded layer's grow
// with the tokens, for every codec; the bounded layer always holds every
// position its next query sees, never more than the bound; nothing leaks.
func TestWindowMemoryFlat(t *testing.T) {
	const W, prompt, decode = 64, 96, 4000
	for _, cp := range windowCodecs {
		t.Run(cp[0]+"-"+cp[1], func(t *testing.T) {
			a, err := NewArena(64<<20, 4<<10)
			if err != nil {
				t.Fatal(err)
			}
			B := 16
			win, err := windowPool(t, Layout{Layers: 1, KVHeads: 2, HeadDim: 8, Windows: []int{W}}, cp[0], cp[1], B, 0, a)
			if err != nil {
				t.Fatal(err)
			}
			full, err := windowPool(t, Layout{Layers: 1, KVHeads: 2, HeadDim: 8}, cp[0], cp[1], B, 0, a)
			if err != nil {
				t.Fatal(err)
			}
			f := win.fp
			bound := int64(2*f.AdmitWindowBlocks(prompt+decode, W, prompt)) * int64(f.BlockBytes)
			sw, sf := win.NewSequence(), full.NewSequence()
			for _, s := range []*Paged{sw, sf} {
				if err := appendTokens(t, s, 0, prompt); err != nil {
					t.Fatal(err)
				}
			}
			var flat, flatHeld int64
			var last int64
			for n := prompt; n < prompt+decode; n++ {
				for _, s := range []*Paged{sw, sf} {
					if err := appendTokens(t, s, n, 1); err != nil {
						t.Fatal(err)
					}
				}
				T := n + 1
				u := win.Usage()
				if u.BytesUsed > bound {
					t.Fatalf("%d tokens: the windowed layer uses %d bytes, above its bound %d", T, u.BytesUsed, bound)
				}
				// Every position the next query (at T) sees is held.
				lo := sw.WindowDropped(0, 0)
				if lo > T-W+1 {
					t.Fatalf("%d tokens: positions below %d freed, the next query sees %d on", T, lo, T-W+1)
				}
				if _, ok := heldPositions(sw, 0, 1, lo, T); !ok {
					t.Fatalf("%d tokens: holds %v, want %d…%d", T, sw.Positions(0, 1), lo, T-1)
				}
				if T%1024 == 0 {
					fu := full.Usage()
					if want := int64(2*f.AdmitBlocks(T)) * int64(f.BlockBytes); f.SealTokens == 0 && fu.BytesUsed != want {
						t.Fatalf("%d tokens: the full layer uses %d bytes, want %d", T, fu.BytesUsed, want)
					}
					if fu.BytesUsed <= last {
						t.Fatalf("%d tokens: the full layer's %d bytes did not grow from %d", T, fu.BytesUsed, last)
					}
					last = fu.BytesUsed
					t.Logf("%d tokens: windowed layer %d B used (%d B of arena chunks), full layer %d B", T, u.BytesUsed, u.BytesTotal, fu.BytesUsed)
					if flat == 0 {
						flat, flatHeld = u.BytesUsed, u.BytesTotal
					} else if u.BytesUsed != flat || u.BytesTotal != flatHeld {
						t.Fatalf("%d tokens: the windowed layer uses %d bytes (%d held), %d (%d) at 1024", T, u.BytesUsed, u.BytesTotal, flat, flatHeld)
					}
				}
			}
			if cp[0] == "f32" {
				lo := sw.WindowDropped(0, 0)
				checkContentsFrom(t, sw, lo, prompt+decode)
			}
			checkInvariants(t, win, []*Paged{sw})
			sw.Free()
			sf.Free()
			if u, v := win.Usage(), full.Usage(); u.Used != 0 || v.Used != 0 {
				t.Fatalf("after Free: %d and %d blocks used", u.Used, v.Used)
			}
		})
	}
}

// TestWindowUnsealed: with KIVI and a window within the residual (W ≤
// Residual), a window-bounded layer takes no blocks, holds the positions
// its queries read (this append's and the next), and holds at every
// position the next query reads bit for bit what an unbounded KIVI layer
// of the same pool holds there (its f16 residual, where KIVI keeps the
// newest Residual tokens): decoding loses nothing to never sealing. A
// window past the residual still seals, and its blocks are slid as before.
func TestWindowUnsealed(t *testing.T) {
	const R, n = 9, 400
	for _, cp := range [][2]string{{"kivi2", "kivi2"}, {"kivi4", "kivi4"}, {"q8", "kivi2"}} {
		for _, W := range []int{1, 5, R, R + 1, 40} {
			for _, step := range []int{1, 7, 50} {
				t.Run(fmt.Sprintf("%s-%s/W%d/step%d", cp[0], cp[1], W, step), func(t *testing.T) {
					win, err := windowPool(t, Layout{Layers: 1, KVHeads: 2, HeadDim: 8, Windows: []int{W}}, cp[0], cp[1], 16, R, nil)
					if err != nil {
						t.Fatal(err)
					}
					full, err := windowPool(t, Layout{Layers: 1, KVHeads: 2, HeadDim: 8}, cp[0], cp[1], 16, R, nil)
					if err != nil {
						t.Fatal(err)
					}
					unsealed := W <= R
					if got := win.fp.Unsealed(W); got != unsealed {
						t.Fatalf("Unsealed(%d) = %v with residual %d", W, got, R)
					}
					sw, sf := win.NewSequence(), full.NewSequence()
					sealed := false
					for p0 := 0; p0 < n; p0 += step {
						c := min(step, n-p0)
						for _, s := range []*Paged{sw, sf} {
							if err := appendTokens(t, s, p0, c); err != nil {
								t.Fatal(err)
							}
						}
						e := p0 + c
						a, b := snapshot(sw), snapshot(sf)
						for h := range 2 {
							if blocks := BlockTokensOf(sw, 0, h); unsealed && blocks != 0 {
								t.Fatalf("after %d tokens: the never-sealed table holds %d tokens in blocks", e, blocks)
							}
							sealed = sealed || BlockTokensOf(sw, 0, h) > 0
							for pos := max(0, p0-W+1); pos < e; pos++ { // what this append's queries read
								if _, ok := a[h][int32(pos)]; !ok {
									t.Fatalf("after %d tokens: position %d (visible) not held", e, pos)
								}
							}
							if !unsealed {
								continue
							}
							for pos := max(0, e-W+1); pos < e; pos++ { // what the next query reads
								if x, y := a[h][int32(pos)], b[h][int32(pos)]; fmt.Sprint(x) != fmt.Sprint(y) {
									t.Fatalf("after %d tokens: position %d holds %v, the unbounded KIVI layer %v", e, pos, x, y)
								}
							}
							if len(a[h]) != min(p0, W-1)+c {
								t.Fatalf("after %d tokens: holds %d tokens, want %d", e, len(a[h]), min(p0, W-1)+c)
							}
						}
					}
					if sealed == unsealed {
						t.Fatalf("window %d, residual %d: sealed %v", W, R, sealed)
					}
					checkInvariants(t, win, []*Paged{sw})
					sw.Free()
					sf.Free()
					if u := win.Usage(); u.Used != 0 {
						t.Fatalf("%d blocks used after Free", u.Used)
					}
				})
			}
		}
	}
}

// checkContentsFrom checks every table holds positions from…to-1 with
// appendTokens' values (f32).
func checkContentsFrom(t testing.TB, s *Paged, from, to int) {
	t.Helper()
	checkContents(t, s, seqRange(from, to))
}

// TestWindowFootprint: for every codec, block size, window and step,
// what Footprint says a window-bounded table holds after each step
// (WindowTable), the most it holds (WindowPeak) and the admission bound
// (AdmitWindowBlocks, also under random steps up to the step) are what a
// real sequence holds.
func TestWindowFootprint(t *testing.T) {
	const n = 300
	for _, cp := range windowCodecs {
		for _, B := range []int{1, 4, 16} {
			for _, W := range []int{1, 5, 16, 70} {
				for _, step := range []int{1, 3, 16, 50} {
					l := Layout{Layers: 1, KVHeads: 2, HeadDim: 8, Windows: []int{W}}
					p, err := windowPool(t, l, cp[0], cp[1], B, 9, nil)
					if err != nil {
						continue // KIVI keys with a block that does not divide their group
					}
					t.Run(fmt.Sprintf("%s-%s/B%d/W%d/step%d", cp[0], cp[1], B, W, step), func(t *testing.T) {
						f := p.fp
						s := p.NewSequence()
						peak := 0
						for p0 := 0; p0 < n; p0 += step {
							c := min(step, n-p0)
							if err := appendTokens(t, s, p0, c); err != nil {
								t.Fatal(err)
							}
							e := p0 + c
							m := s.Memory()
							blocks, res, _ := f.WindowTable(e, W, step)
							if m.Blocks != 2*blocks || m.Reserved != 2*f.WindowTableBytes(e, W, step) {
								t.Fatalf("%d tokens: %d blocks, %d B; footprint %d blocks (+%d residual), %d B per table", e, m.Blocks, m.Reserved, blocks, res, f.WindowTableBytes(e, W, step))
							}
							peak = max(peak, m.Blocks/2)
							if lo := s.WindowDropped(0, 0); lo > max(0, p0-W+1) {
								t.Fatalf("after the step at %d: freed up to %d, its queries see %d on", p0, lo, p0-W+1)
							}
						}
						if got := f.WindowPeak(n, W, step); got != peak {
							t.Fatalf("WindowPeak = %d, the table held at most %d", got, peak)
						}
						if b := f.AdmitWindowBlocks(n, W, step); b < peak {
							t.Fatalf("AdmitWindowBlocks = %d, below the %d blocks held", b, peak)
						}
						s.Free()
						// Random steps of at most step tokens stay within the bound.
						rng := rand.New(rand.NewPCG(uint64(B*1000+W), uint64(step)))
						s = p.NewSequence()
						peak = 0
						for p0 := 0; p0 < n; {
							c := min(1+rng.IntN(step), n-p0)
							if err := appendTokens(t, s, p0, c); err != nil {
								t.Fatal(err)
							}
							p0 += c
							peak = max(peak, s.Memory().Blocks/2)
						}
						if b := f.AdmitWindowBlocks(n, W, step); b < peak {
							t.Fatalf("random steps ≤ %d: AdmitWindowBlocks = %d, below the %d blocks held", step, b, peak)
						}
						s.Free()
						if u := p.Usage(); u.Used != 0 {
							t.Fatalf("%d blocks used after Free", u.Used)
						}
					})
				}
			}
		}
	}
}

// windowNeedPools runs f on a pool of every codec pair and block size with
// a three-layer layout: windows w, none, and 3.
func windowNeedPools(t *testing.T, w int, f func(t *testing.T, p *Pool)) {
	l := Layout{Layers: 3, KVHeads: 2, HeadDim: 8, Windows: []int{w, 0, 3}}
	for _, kn := range codec.Names {
		for _, vn := range codec.Names {
			for _, B := range []int{1, 3, 16} {
				p, err := windowPool(t, l, kn, vn, B, 5, nil)
				if err != nil {
					continue
				}
				t.Run(fmt.Sprintf("%s-%s-B%d", kn, vn, B), func(t *testing.T) { f(t, p) })
			}
		}
	}
}

// needByLayer appends n tokens layer by layer and fails unless Need(n)
// was the sum over layers of what each layer's Append took (never less
// than zero: a layer that frees more than it takes counts 0).
func needByLayer(t *testing.T, s *Paged, start, n int, what string) {
	t.Helper()
	need := s.Need(n)
	var took int64
	for _, d := range appendByLayer(t, s, start, n) {
		took += max(0, d)
	}
	if took != need {
		t.Fatalf("%s: appending %d tokens at %d took %d bytes layer by layer, Need said %d", what, n, start, took, need)
	}
}

// TestWindowNeedIsExact: with window-bounded layers, Need(n) is exactly
// what the layers' appends take, each layer's freed blocks counted
// against its own new ones: in order, after forks (a shared block frees
// nothing until its last holder drops it) and after a prefix hit.
func TestWindowNeedIsExact(t *testing.T) {
	for _, w := range []int{1, 7, 40} {
		t.Run(fmt.Sprintf("W%d", w), func(t *testing.T) {
			windowNeedPools(t, w, func(t *testing.T, p *Pool) {
				B := p.BlockTokens()
				s := p.NewSequence()
				pos := 0
				for _, n := range []int{1, 2, B, 1, 2*B + 1, 7, 1, 3 * B, 1, 50, 1, 1, 1} {
					needByLayer(t, s, pos, n, "in order")
					pos += n
				}
				f, g := s.Fork(), s.Fork()
				for i, n := range []int{1, B + 2, 1, 45} {
					needByLayer(t, f, pos, n, fmt.Sprintf("fork f step %d", i))
					needByLayer(t, g, pos, n, fmt.Sprintf("fork g step %d", i))
					needByLayer(t, s, pos, n, fmt.Sprintf("original step %d", i))
					pos += n
				}
				checkInvariants(t, p, []*Paged{s, f, g})
				f.Free()
				g.Free()
				s.Free()

				tok := seqRange(0, 4*B+3)
				a := p.NewSequence()
				needByLayer(t, a, 0, len(tok), "prefix source")
				a.RegisterPrefix(tok, 0)
				b := p.NewSequence()
				m := b.MatchPrefix(tok, 0)
				if p.residual == 0 && m == 0 {
					t.Fatal("nothing matched")
				}
				needByLayer(t, b, m, 1, "after a prefix hit")
				needByLayer(t, b, m+1, B+1, "after a prefix hit")
				a.Free()
				b.Free()
				if u := p.Usage(); u.Used != 0 {
					t.Fatalf("%d blocks still used", u.Used)
				}
			})
		})
	}
}

// TestWindowAdmitBytesIsExact: a prompt appended step tokens at a time,
// forked into n samples that append one token each, holds in each layer
// at most what AdmitBytesStep counts for it, and the sum of those peaks
// is AdmitBytesStep; the pool's used bytes never exceed it.
func TestWindowAdmitBytesIsExact(t *testing.T) {
	for _, w := range []int{1, 7, 40} {
		t.Run(fmt.Sprintf("W%d", w), func(t *testing.T) {
			windowNeedPools(t, w, func(t *testing.T, p *Pool) {
				B := p.BlockTokens()
				for _, prompt := range []int{1, B, B + 1, 40, 97} {
					for _, step := range []int{prompt, 1, 7, B} {
						for _, n := range []int{1, 2, 3} {
							if prompt < 1 || step < 1 {
								continue
							}
							L := p.Layout().Layers
							run, peak := make([]int64, L), make([]int64, L)
							var most int64
							note := func(d []int64) {
								for l := range d {
									run[l] += d[l]
									peak[l] = max(peak[l], run[l])
								}
								most = max(most, p.Usage().BytesUsed)
							}
							s := p.NewSequence()
							for p0 := 0; p0 < prompt; p0 += step {
								note(appendByLayer(t, s, p0, min(step, prompt-p0)))
							}
							all := []*Paged{s}
							for range n - 1 {
								all = append(all, s.Fork())
							}
							for _, x := range all {
								note(appendByLayer(t, x, prompt, 1))
							}
							var sum int64
							for _, b := range peak {
								sum += b
							}
							want := p.AdmitBytesStep(prompt, n, step)
							if sum != want || most > want {
								t.Errorf("prompt %d in steps of %d, %d samples: layers held at most %v (sum %d), the pool %d; AdmitBytesStep said %d", prompt, step, n, peak, sum, most, want)
							}
							for _, x := range all {
								x.Free()
							}
						}
					}
				}
			})
		})
	}
}

// TestWindowTruncate: a window-bounded layer truncates within what it
// holds; a cut behind what its window freed, or an append whose queries
// would see freed positions, is refused with an error and changes
// nothing.
func TestWindowTruncate(t *testing.T) {
	const W, B = 8, 4
	p, err := NewPool(PoolConfig{Layout: Layout{Layers: 2, KVHeads: 1, HeadDim: 4, Windows: []int{W, 0}}, BlockTokens: B, Tokens: 400})
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSequence()
	for i := range 40 {
		if err := appendTokens(t, s, i, 1); err != nil {
			t.Fatal(err)
		}
	}
	// The step at 39 freed the blocks of positions ≤ 31.
	if got := s.WindowDropped(0, 0); got != 32 {
		t.Fatalf("freed %d tokens, want 32", got)
	}
	if s.Len() != 40 {
		t.Fatalf("Len = %d, want 40 (from the sequence's start)", s.Len())
	}
	// The token at 39 sees 32…39: a cut at 39 keeps all it needs.
	if err := s.Truncate(39); err != nil {
		t.Fatal(err)
	}
	if _, ok := heldPositions(s, 0, 0, 32, 39); !ok {
		t.Fatalf("windowed layer holds %v after Truncate(39)", s.Positions(0, 0))
	}
	if _, ok := heldPositions(s, 1, 0, 0, 39); !ok {
		t.Fatalf("full layer holds %v after Truncate(39)", s.Positions(1, 0))
	}
	for _, c := range []struct {
		n    int
		want string
	}{
		{20, "window freed its first 32"},
		{38, "already freed those below 32"}, // the token at 38 sees 31…38
	} {
		if err := s.Truncate(c.n); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("Truncate(%d) = %v, want %q", c.n, err, c.want)
		}
	}
	// An append further back than the window allows (a restore or a
	// rewind gone wrong) is refused.
	if err := appendLayer(s, 0, 30, 1); err == nil || !strings.Contains(err.Error(), "already freed those below 32") {
		t.Fatalf("append at 30 = %v", err)
	}
	if _, ok := heldPositions(s, 0, 0, 32, 39); !ok {
		t.Fatalf("a refused append changed the table: %v", s.Positions(0, 0))
	}
	if err := appendTokens(t, s, 39, 1); err != nil {
		t.Fatal(err)
	}
	checkLayer(t, s, 0, seqRange(32, 40))
	checkLayer(t, s, 1, seqRange(0, 40))
	s.Free()
	if u := p.Usage(); u.Used != 0 {
		t.Fatalf("%d blocks used after Free", u.Used)
	}
}

// checkLayer is checkContents for one layer.
func checkLayer(t testing.TB, s *Paged, l int, want []int) {
	t.Helper()
	L := s.Layout()
	row := make([]float32, L.HeadDim)
	for h := 0; h < L.KVHeads; h++ {
		var got []int
		for _, seg := range s.Segments(l, h) {
			for i := 0; i < seg.N; i++ {
				p := int(seg.Pos[i])
				got = append(got, p)
				seg.KC.Get(seg.K, seg.Cap, L.HeadDim, i, row)
				for c, x := range row {
					if x != value(p, l, h, c) {
						t.Fatalf("layer %d head %d pos %d: key[%d] = %v, want %v", l, h, p, c, x, value(p, l, h, c))
					}
				}
				seg.VC.Get(seg.V, seg.Cap, L.HeadDim, i, row)
				if row[0] != -value(p, l, h, 0) {
					t.Fatalf("layer %d head %d pos %d: value %v", l, h, p, row[0])
				}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("layer %d head %d holds %v, want %v", l, h, got, want)
		}
	}
}

// TestWindowPrefixAndFork: a prompt prefilled in chunks and registered
// after each chunk (as the engine does) is registered whole although the
// window frees its early blocks; a later sequence matches all of it, its
// windowed layer keeping only the blocks its next token sees, and reads
// the same keys and values. A sequence whose window freed blocks before
// they were registered registers nothing past them, so nothing is
// matched wrongly. Forks share blocks, a freed shared block only loses a
// reference, and every block comes back at the end.
func TestWindowPrefixAndFork(t *testing.T) {
	const W, B = 8, 4
	p, err := NewPool(PoolConfig{Layout: Layout{Layers: 2, KVHeads: 2, HeadDim: 4, Windows: []int{W, 0}}, BlockTokens: B, Tokens: 400})
	if err != nil {
		t.Fatal(err)
	}
	tok := seqRange(100, 141) // 41 token ids
	a := p.NewSequence()
	for p0 := 0; p0 < 40; p0 += 12 {
		if err := appendTokens(t, a, p0, min(12, 40-p0)); err != nil {
			t.Fatal(err)
		}
		a.RegisterPrefix(tok[:min(p0+12, 40)], 0)
	}
	if a.registered != 10 {
		t.Fatalf("registered %d blocks of 10", a.registered)
	}
	if a.WindowDropped(0, 0) == 0 {
		t.Fatal("the window freed nothing during the prefill")
	}
	f := a.Fork()
	for _, s := range []*Paged{a, f} {
		for i := 40; i < 60; i++ {
			if err := appendTokens(t, s, i, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	checkInvariants(t, p, []*Paged{a, f})
	checkLayer(t, f, 0, seqRange(52, 60))
	checkLayer(t, f, 1, seqRange(0, 60))
	f.Free()
	a.Free()
	checkInvariants(t, p, nil)

	b := p.NewSequence()
	if m := b.MatchPrefix(tok, 0); m != 40 {
		t.Fatalf("matched %d tokens, want 40", m)
	}
	if b.Len() != 40 {
		t.Fatalf("Len after the match = %d, want 40", b.Len())
	}
	checkLayer(t, b, 0, seqRange(32, 40)) // what the token at 40 sees: 33…40
	checkLayer(t, b, 1, seqRange(0, 40))
	if err := appendTokens(t, b, 40, 1); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, p, []*Paged{b})
	b.Free()

	// Decoded token by token and registered only at the end: the window
	// freed block 0 before it could be registered.
	other := seqRange(500, 541)
	c := p.NewSequence()
	for i := range 40 {
		if err := appendTokens(t, c, i, 1); err != nil {
			t.Fatal(err)
		}
	}
	c.RegisterPrefix(other[:40], 0)
	if c.registered != 0 {
		t.Fatalf("registered %d blocks whose windowed layer was freed", c.registered)
	}
	c.Free()
	d := p.NewSequence()
	if m := d.MatchPrefix(other, 0); m != 0 {
		t.Fatalf("matched %d tokens of a prefix never registered whole", m)
	}
	d.Free()
	checkInvariants(t, p, nil)
	if u := p.Usage(); u.Used != 0 {
		t.Fatalf("%d blocks used after Free", u.Used)
	}
}

// TestWindowKeep: after a policy's Keep the slots keep their stored
// positions and the window frees by those positions.
func TestWindowKeep(t *testing.T) {
	const W, B = 8, 4
	p, err := NewPool(PoolConfig{Layout: Layout{Layers: 1, KVHeads: 1, HeadDim: 4, Windows: []int{W}}, BlockTokens: B, Tokens: 400})
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSequence()
	if err := appendTokens(t, s, 0, 16); err != nil {
		t.Fatal(err)
	}
	// Keep positions 0, 2, 5, 6 and 10…15: blocks [0 2 5 6] [10 11 12 13] [14 15].
	if err := s.Keep(0, 0, []int{0, 2, 5, 6, 10, 11, 12, 13, 14, 15}); err != nil {
		t.Fatal(err)
	}
	if err := appendTokens(t, s, 16, 1); err != nil { // sees 9…16: the first block (≤ 6) goes
		t.Fatal(err)
	}
	checkLayer(t, s, 0, []int{10, 11, 12, 13, 14, 15, 16})
	if err := appendTokens(t, s, 17, 5); err != nil { // sees 10…: nothing more
		t.Fatal(err)
	}
	if err := appendTokens(t, s, 22, 1); err != nil { // sees 15…: [10…13] goes
		t.Fatal(err)
	}
	checkLayer(t, s, 0, seqRange(14, 23))
	s.Free()
	if u := p.Usage(); u.Used != 0 {
		t.Fatalf("%d blocks used after Free", u.Used)
	}
}

// TestWindowRemoveRange: RemoveRange counts tokens from the sequence's
// start in a window-bounded layer too.
func TestWindowRemoveRange(t *testing.T) {
	p, err := NewPool(PoolConfig{Layout: Layout{Layers: 2, KVHeads: 1, HeadDim: 4, Windows: []int{8, 0}}, BlockTokens: 4, Tokens: 400})
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSequence()
	for i := range 30 {
		if err := appendTokens(t, s, i, 1); err != nil {
			t.Fatal(err)
		}
	}
	// The windowed layer holds 20…29 (its first 20 freed).
	if err := s.RemoveRange(10, 24); err != nil {
		t.Fatal(err)
	}
	checkLayer(t, s, 0, seqRange(24, 30))
	checkLayer(t, s, 1, append(seqRange(0, 10), seqRange(24, 30)...))
	s.Free()
}

// TestWindowReindex: after a policy re-indexes positions (RewriteKeys),
// appends continue from the new positions: what the window freed counts
// below the lowest position held, not at its old positions.
func TestWindowReindex(t *testing.T) {
	p, err := NewPool(PoolConfig{Layout: Layout{Layers: 1, KVHeads: 1, HeadDim: 4, Windows: []int{8}}, BlockTokens: 4, Tokens: 400})
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSequence()
	for i := range 40 {
		if err := appendTokens(t, s, i, 1); err != nil {
			t.Fatal(err)
		}
	}
	// Holds 32…39; re-indexed to 0…7.
	slots := seqRange(0, s.Slots(0, 0))
	i := int32(0)
	if err := s.RewriteKeys(0, 0, slots, func(pos int32, key []float32) int32 { i++; return i - 1 }); err != nil {
		t.Fatal(err)
	}
	if err := appendTokens(t, s, 8, 1); err != nil {
		t.Fatalf("append at the re-indexed position 8: %v", err)
	}
	if pos := s.Positions(0, 0); fmt.Sprint(pos) != fmt.Sprint([]int32{0, 1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("positions %v", pos)
	}
	s.Free()
}

// TestLayoutWindowsValidate: windows and reader counts must fit the
// layers.
func TestLayoutWindowsValidate(t *testing.T) {
	for _, c := range []struct {
		l    Layout
		want string
	}{
		{Layout{Layers: 2, KVHeads: 1, HeadDim: 4, Windows: []int{3}}, "1 windows for 2 layers"},
		{Layout{Layers: 1, KVHeads: 1, HeadDim: 4, Windows: []int{-1}}, "window -1 is out of range"},
		{Layout{Layers: 2, KVHeads: 1, HeadDim: 4, Readers: []int{1, 2, 3}}, "3 reader counts for 2 layers"},
	} {
		if err := c.l.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.l, err, c.want)
		}
	}
}
