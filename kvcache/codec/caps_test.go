package codec

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/tensor"
)

// capsCodecs is every codec Parse makes, keys and values, and the Shifted
// flavour of each codec that takes a shift (mu of d values).
func capsCodecs(t *testing.T, mu []float32) []named {
	var out []named
	for _, c := range allCodecs(t) {
		out = append(out, c)
		if c.c.Shiftable() {
			out = append(out, named{c.name + "/shifted", Shifted(c.c, mu)})
		}
	}
	return out
}

// TestCapabilities holds every capability a codec claims to its slot
// reads, so that a new codec is checked by being registered in Parse: the
// rows of a Plain codec, the panels of KeyPanel and DecodeKeyPanel, the
// levels and scales of LevelPanel, ChannelPanel and LevelRows (claimed by
// the q8, q4 and KIVI codecs), the rows of GetRows and the slots of
// CopySlot hold what Get decodes, bit for bit; Shiftable, Shift and Unshifted agree with Shifted; a codec groups
// tokens (GroupTokens) exactly when it is Grouped and not PerToken, and then
// keeps a residual to seal its groups from.
func TestCapabilities(t *testing.T) {
	const n, d = 40, 64 // two full groups of 16 slots and a partial one
	r := rand.New(rand.NewPCG(41, 42))
	mu := make([]float32, d)
	for i := range mu {
		mu[i] = float32(2 * r.NormFloat64())
	}
	x := make([]float32, n*d)
	for i := range x {
		x[i] = float32(r.NormFloat64()) + mu[i%d]
	}
	levels := map[string]bool{} // the codecs that gave levels in place, and how
	defer func() {
		want := []string{"q8/keys LevelPanel", "q4/keys LevelPanel", "q8/keys/shifted LevelPanel", "q4/keys/shifted LevelPanel",
			"kivi2/keys ChannelPanel", "kivi4/keys ChannelPanel", "q8/values LevelRows", "q4/values LevelRows", "kivi2/values LevelRows", "kivi4/values LevelRows",
			"q8dot/keys LevelPanel", "q4dot/keys LevelPanel", "q8dot/keys/shifted LevelPanel", "q4dot/keys/shifted LevelPanel", "q8dot/values LevelRows", "q4dot/values LevelRows"}
		for _, w := range want {
			if !levels[w] {
				t.Errorf("%s: not claimed (attention reads those levels in place)", w)
			}
		}
		if len(levels) != len(want) {
			t.Errorf("levels in place from %v, want %v", levels, want)
		}
	}()
	for _, cc := range capsCodecs(t, mu) {
		t.Run(strings.ReplaceAll(cc.name, "/", "_"), func(t *testing.T) {
			c := cc.c
			b := encode(c, n, d, x)
			want := decodeAll(c, b, n, d)
			same := func(what string, i, k int, got float32) {
				t.Helper()
				if w := want[i*d+k]; math.Float32bits(got) != math.Float32bits(w) {
					t.Fatalf("%s: slot %d value %d = %g, Get gives %g", what, i, k, got, w)
				}
			}
			if typ, ok := c.Plain(); ok {
				es := typ.BlockBytes() / typ.BlockSize()
				for i := range n {
					for k := range d {
						same("Plain", i, k, elem(b[es*(i*d+k):], typ, 0))
					}
				}
			}
			panel := make([]float32, d*tensor.AttnLanes)
			for _, i0 := range []int{0, 16, 32, 8} {
				full := i0%16 == 0 && i0+16 <= n
				p, typ, ok := c.KeyPanel(b, n, d, i0)
				if ok && !full {
					t.Fatalf("KeyPanel at slot %d: not a full group", i0)
				}
				if ok {
					for k := range d {
						for j := range tensor.AttnLanes {
							same("KeyPanel", i0+j, k, elem(p, typ, k*tensor.AttnLanes+j))
						}
					}
				}
				dec := c.DecodeKeyPanel(b, n, d, i0, panel)
				if dec && !full {
					t.Fatalf("DecodeKeyPanel at slot %d: not a full group", i0)
				}
				if dec && ok {
					t.Fatal("both KeyPanel and DecodeKeyPanel: attention reads the first")
				}
				if dec {
					for k := range d {
						for j := range tensor.AttnLanes {
							same("DecodeKeyPanel", i0+j, k, panel[k*tensor.AttnLanes+j])
						}
					}
				}
			}
			var sm [2 * tensor.AttnLanes]float32
			for _, i0 := range []int{0, 16, 32, 8} {
				full := i0%16 == 0 && i0+16 <= n
				lv, bits, shift, ok := c.LevelPanel(b, n, d, i0, &sm)
				if ok && !full {
					t.Fatalf("LevelPanel at slot %d: not a full group", i0)
				}
				if ok {
					levels[cc.name+" LevelPanel"] = true
					for k := range d {
						for j := range tensor.AttnLanes {
							v := float32(sm[j]*float32(panelLevel(lv, bits, k, j))) + sm[tensor.AttnLanes+j]
							if shift != nil {
								v += shift[k]
							}
							same("LevelPanel", i0+j, k, v)
						}
					}
				}
			}
			sc, mn := make([]float32, d), make([]float32, d)
			for _, i0 := range []int{0, 16, 32, 8} {
				full := i0%16 == 0 && i0+16 <= n
				lv, bits, ok := c.ChannelPanel(b, n, d, i0, sc, mn)
				if ok && !full {
					t.Fatalf("ChannelPanel at slot %d: not a full group", i0)
				}
				if ok {
					levels[cc.name+" ChannelPanel"] = true
					for k := range d {
						for j := range tensor.AttnLanes {
							v := float32(sc[k]*float32(panelLevel(lv, bits, k, j))) + mn[k]
							same("ChannelPanel", i0+j, k, v)
						}
					}
				}
			}
			vsm := make([]float32, 2*tensor.AttnLanes*((d+15)/16))
			for _, r := range [][2]int{{0, 16}, {16, 16}, {13, 7}, {32, 8}, {39, 1}} {
				i0, cnt := r[0], r[1]
				lv, bits, ld, ok := c.LevelRows(b, n, d, i0, cnt, vsm)
				if !ok {
					continue
				}
				levels[cc.name+" LevelRows"] = true
				for i := range cnt {
					for k := range d {
						ch := 2 * tensor.AttnLanes * (k / 16)
						v := float32(vsm[ch+i]*float32(rowLevel(lv[i*ld:], bits, k))) + vsm[ch+tensor.AttnLanes+i]
						same("LevelRows", i0+i, k, v)
					}
				}
			}
			rows := make([]float32, 7*d)
			if c.GetRows(b, n, d, 13, 7, rows) {
				for i := range 7 {
					for k := range d {
						same("GetRows", 13+i, k, rows[i*d+k])
					}
				}
			}
			dst := make([]byte, c.BlockBytes(4, d))
			if c.CopySlot(dst, 4, 3, b, n, 21, d) {
				got := make([]float32, d)
				c.Get(dst, 4, d, 3, got)
				for k := range d {
					same("CopySlot", 21, k, got[k])
				}
			}

			s := Shifted(c, mu)
			if c.Shiftable() != (s != c) {
				t.Fatalf("Shiftable %v, but Shifted gives %v", c.Shiftable(), s)
			}
			if c.Shiftable() {
				if s.Shiftable() || s.Shift() == nil || &s.Shift()[0] == &mu[0] || s.Shift()[0] != mu[0] {
					t.Fatal("a shifted codec keeps its own copy of mu and takes no second shift")
				}
				if u := s.Unshifted(); u != c || u.BlockBytes(n, d) != s.BlockBytes(n, d) {
					t.Fatalf("Unshifted of the shifted codec is %v, want %v", u, c)
				}
			}
			if u := c.Unshifted(); (u != nil) != (c.Shift() != nil) {
				t.Fatalf("Unshifted %v but Shift %v", u, c.Shift())
			}

			_, grouped := c.(Grouped)
			if G := c.GroupTokens(); (G > 0) != grouped || grouped == c.PerToken() {
				t.Fatalf("GroupTokens %d, Grouped %v, PerToken %v", G, grouped, c.PerToken())
			}
			if grouped && c.Residual() <= 0 {
				t.Fatalf("grouped keys without a residual to seal groups from (Residual %d)", c.Residual())
			}
			if c.Residual() < 0 {
				t.Fatalf("Residual %d", c.Residual())
			}
		})
	}
}

// TestCapabilitiesDefaults: a codec that embeds defaults and overrides
// nothing claims no capability, and the package functions then fall back
// to its slot reads (GetRows, DotAll) or say it cannot (the others).
func TestCapabilitiesDefaults(t *testing.T) {
	c := slotOnly{}
	const n, d = 16, 8
	x := make([]float32, n*d)
	for i := range x {
		x[i] = float32(i) - 50
	}
	b := encode(c, n, d, x)
	if _, ok := Plain(c); ok {
		t.Error("Plain")
	}
	if _, _, ok := KeyPanel(c, b, n, d, 0); ok {
		t.Error("KeyPanel")
	}
	var sm [2 * tensor.AttnLanes]float32
	if _, _, _, ok := c.LevelPanel(b, n, d, 0, &sm); ok {
		t.Error("LevelPanel")
	}
	if _, _, _, ok := c.LevelRows(b, n, d, 0, n, make([]float32, 32)); ok {
		t.Error("LevelRows")
	}
	if _, _, ok := c.ChannelPanel(b, n, d, 0, make([]float32, d), make([]float32, d)); ok {
		t.Error("ChannelPanel")
	}
	if DecodeKeyPanel(c, b, n, d, 0, make([]float32, n*d)) || CopySlot(c, b, n, 0, b, n, 1, d) {
		t.Error("DecodeKeyPanel or CopySlot")
	}
	if Shifted(c, make([]float32, d)) != Codec(c) || Shift(c) != nil || Base(c) != Codec(c) || c.GroupTokens() != 0 || c.Residual() != 0 {
		t.Error("shift, group or residual")
	}
	rows := make([]float32, n*d)
	GetRows(c, b, n, d, 0, n, rows)
	dots := make([]float32, n)
	q := x[:d]
	DotAll(c, b, n, d, q, dots)
	for i := range n {
		for k := range d {
			if rows[i*d+k] != x[i*d+k] {
				t.Fatalf("GetRows slot %d value %d = %g, want %g", i, k, rows[i*d+k], x[i*d+k])
			}
		}
		if w := c.Dot(b, n, d, i, q); dots[i] != w {
			t.Fatalf("DotAll slot %d = %g, Dot %g", i, dots[i], w)
		}
	}
}

// slotOnly is f32's slot access with the default capabilities.
type slotOnly struct {
	defaults
	f f32Codec
}

func (s slotOnly) Name() string                  { return "slot-only" }
func (s slotOnly) Bits() int                     { return 32 }
func (s slotOnly) BlockBytes(n, d int) int       { return s.f.BlockBytes(n, d) }
func (s slotOnly) BitsPerValue(n, d int) float64 { return bitsPerValue(s, n, d) }
func (s slotOnly) PerToken() bool                { return true }
func (s slotOnly) Put(dst []byte, n, d, i int, x []float32) {
	s.f.Put(dst, n, d, i, x)
}
func (s slotOnly) Get(src []byte, n, d, i int, out []float32) { s.f.Get(src, n, d, i, out) }
func (s slotOnly) Dot(src []byte, n, d, i int, q []float32) float32 {
	return s.f.Dot(src, n, d, i, q)
}
func (s slotOnly) Axpy(src []byte, n, d, i int, a float32, out []float32) {
	s.f.Axpy(src, n, d, i, a, out)
}

// panelLevel is level c of lane j of a [d][16] panel of bits 8, 4 or 2
// (the row's levels packed low bits first).
func panelLevel(u []byte, bits, c, j int) byte {
	e := (16*c + j) * bits
	return u[e/8] >> (e % 8) & (1<<bits - 1)
}

// rowLevel is level c of a row of bits 8, 4 or 2 (low bits first).
func rowLevel(u []byte, bits, c int) byte {
	e := c * bits
	return u[e/8] >> (e % 8) & (1<<bits - 1)
}
