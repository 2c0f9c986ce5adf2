package kvcache_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/policy"
)

// refSlerp is MiniCache's merge written out plainly in float64: unit
// vectors, Ω = arccos of their dot product, SLERP weights (LERP when
// sinΩ < 1e-6), renormalised.
func refSlerp(a, b []float32, t float64) (e []float64, omega float64) {
	unit := func(x []float32) []float64 {
		n := 0.0
		for _, v := range x {
			n += float64(v) * float64(v)
		}
		n = math.Sqrt(n)
		u := make([]float64, len(x))
		for i, v := range x {
			u[i] = float64(v) / n
		}
		return u
	}
	ua, ub := unit(a), unit(b)
	c := 0.0
	for i := range ua {
		c += ua[i] * ub[i]
	}
	omega = math.Acos(math.Max(-1, math.Min(1, c)))
	wa, wb := 1-t, t
	if math.Sin(omega) >= 1e-6 {
		wa, wb = math.Sin((1-t)*omega)/math.Sin(omega), math.Sin(t*omega)/math.Sin(omega)
	}
	e = make([]float64, len(a))
	n := 0.0
	for i := range e {
		e[i] = wa*ua[i] + wb*ub[i]
		n += e[i] * e[i]
	}
	for i := range e {
		e[i] /= math.Sqrt(n)
	}
	return e, omega
}

func norm64(x []float32) float64 {
	n := 0.0
	for _, v := range x {
		n += float64(v) * float64(v)
	}
	return math.Sqrt(n)
}

func TestSlerp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	randVec := func(d int) []float32 {
		x := make([]float32, d)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	type pair struct {
		name string
		a, b []float32
	}
	var cases []pair
	for i := 0; i < 200; i++ {
		d := []int{2, 8, 64, 128}[i%4]
		a := randVec(d)
		b := slices.Clone(a)
		scale := []float64{3, 0.5, 0.05, 1e-4}[i/4%4] // from unrelated to nearly parallel
		for j := range b {
			b[j] = float32(float64(b[j])*1.7 + scale*rng.NormFloat64())
		}
		cases = append(cases, pair{fmt.Sprintf("random%d", i), a, b})
	}
	x := randVec(8)
	neg := slices.Clone(x)
	for i := range neg {
		neg[i] = -2 * neg[i]
	}
	cases = append(cases,
		pair{"identical", x, x},
		pair{"parallel", x, []float32{2 * x[0], 2 * x[1], 2 * x[2], 2 * x[3], 2 * x[4], 2 * x[5], 2 * x[6], 2 * x[7]}},
		pair{"antipodal", x, neg},
		pair{"orthogonal", []float32{1, 0, 0, 0}, []float32{0, 3, 0, 0}})
	for _, tt := range []float64{0, 0.25, 0.6, 1} {
		for _, c := range cases {
			out := make([]float32, len(c.a))
			om, na, nb := policy.Slerp(c.a, c.b, tt, out)
			want, wom := refSlerp(c.a, c.b, tt)
			if math.Abs(om-wom) > 1e-12 || math.Abs(na-norm64(c.a)) > 1e-12 || math.Abs(nb-norm64(c.b)) > 1e-12 {
				t.Fatalf("%s t=%g: Ω %v norms %v %v, want %v %v %v", c.name, tt, om, na, nb, wom, norm64(c.a), norm64(c.b))
			}
			for i := range out {
				if math.Abs(float64(out[i])-want[i]) > 1e-7 {
					t.Fatalf("%s t=%g: e[%d] = %v, want %v", c.name, tt, i, out[i], want[i])
				}
			}
			// SLERP moves along the great circle: e sits at angle tΩ from the lower direction.
			if s := math.Sin(wom); s > 1e-3 && wom < math.Pi-1e-3 {
				ua, _ := refSlerp(c.a, c.a, 0)
				dot := 0.0
				for i := range ua {
					dot += ua[i] * float64(out[i])
				}
				if got := math.Acos(math.Min(1, dot)); math.Abs(got-tt*wom) > 1e-3 {
					t.Fatalf("%s t=%g: angle to the lower direction %v, want tΩ = %v", c.name, tt, got, tt*wom)
				}
			}
		}
	}
	// Antipodal directions halfway: no direction in between; the upper one.
	e := make([]float32, 8)
	if om, _, _ := policy.Slerp(x, neg, 0.5, e); math.Abs(om-math.Pi) > 1e-6 {
		t.Fatalf("antipodal: Ω %v", om)
	}
	for i := range e {
		if want := -x[i] / float32(norm64(x)); math.Abs(float64(e[i]-want)) > 1e-7 {
			t.Fatalf("antipodal at t=0.5: e %v, want the upper direction", e)
		}
	}
	// A zero vector has no direction: e is the other one's, exactly restorable.
	out := make([]float32, 4)
	a := []float32{0, 0, 0, 0}
	b := []float32{3, 0, 4, 0}
	if om, na, nb := policy.Slerp(a, b, 0.6, out); om != 0 || na != 0 || nb != 5 || !slices.Equal(out, []float32{0.6, 0, 0.8, 0}) {
		t.Fatalf("zero lower: Ω %v norms %v %v e %v", om, na, nb, out)
	}
	if om, _, _ := policy.Slerp(b, a, 0.6, out); om != 0 || !slices.Equal(out, []float32{0.6, 0, 0.8, 0}) {
		t.Fatalf("zero upper: Ω %v e %v", om, out)
	}
	if policy.Slerp(a, a, 0.6, out); !slices.Equal(out, []float32{0, 0, 0, 0}) {
		t.Fatalf("both zero: e %v", out)
	}
}

// miniData is the keys and values a test feeds a cache: adjacent layers are
// similar (a shared base, scaled, plus noise), and every 7th token of odd
// layers is unrelated, so retention has something to find.
type miniData struct {
	L, H, d int
	k, v    [][]float32 // [layer][pos·H·d + h·d + c]
}

func newMiniData(rng *rand.Rand, L, H, d, T int) *miniData {
	m := &miniData{L: L, H: H, d: d, k: make([][]float32, L), v: make([][]float32, L)}
	w := H * d
	bk, bv := make([]float32, T*w), make([]float32, T*w)
	for i := range bk {
		bk[i], bv[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	for l := 0; l < L; l++ {
		m.k[l], m.v[l] = make([]float32, T*w), make([]float32, T*w)
		for i := range bk {
			pos := i / w
			if l%2 == 1 && pos%7 == 3 {
				m.k[l][i], m.v[l][i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
				continue
			}
			s := float32(1 + 0.2*float64(l))
			m.k[l][i] = s*bk[i] + 0.3*float32(rng.NormFloat64())
			m.v[l][i] = s*bv[i] + 0.3*float32(rng.NormFloat64())
		}
	}
	return m
}

func (m *miniData) vec(kind, l, h int, pos int32) []float32 {
	x := m.k[l]
	if kind == 1 {
		x = m.v[l]
	}
	o := int(pos)*m.H*m.d + h*m.d
	return x[o : o+m.d]
}

// feed appends positions [from, to) to every layer of s.
func (m *miniData) feed(t testing.TB, s *kvcache.Paged, from, to int) {
	t.Helper()
	w := m.H * m.d
	pos := make([]int32, to-from)
	for i := range pos {
		pos[i] = int32(from + i)
	}
	for l := 0; l < m.L; l++ {
		if err := s.Append(l, pos, m.k[l][from*w:to*w], m.v[l][from*w:to*w]); err != nil {
			t.Fatal(err)
		}
	}
}

// stored decodes every slot of every table: [table][pos] → key ++ value.
func stored(s *kvcache.Paged) []map[int32][]float32 {
	lay := s.Layout()
	d := lay.HeadDim
	out := make([]map[int32][]float32, lay.Layers*lay.KVHeads)
	for ti := range out {
		out[ti] = map[int32][]float32{}
		for _, seg := range s.Segments(ti/lay.KVHeads, ti%lay.KVHeads) {
			for i := 0; i < seg.N; i++ {
				x := make([]float32, 2*d)
				seg.KC.Get(seg.K, seg.Cap, d, i, x[:d])
				seg.VC.Get(seg.V, seg.Cap, d, i, x[d:])
				if seg.KMag != nil {
					for c := 0; c < d; c++ {
						x[c] *= seg.KMag[i]
						x[d+c] *= seg.VMag[i]
					}
				}
				out[ti][seg.Pos[i]] = x
			}
		}
	}
	return out
}

// checkMerge checks every table of s after merging the pairs (lower,
// upper) given, against before (what the cache held before the merge):
// unmerged tables and retained tokens are unchanged (bitwise unless exact
// is false, then within tol·‖x‖: KIVI re-quantizes retained keys and
// quantizes what leaves the residual), merged tokens equal the float64
// SLERP of the stored vectors times the layer's norm within
// tol·max(1, ‖x‖), each table holds every position once, and the retained
// tokens of each pair are the ⌈γ·n⌉ most distant ones.
func checkMerge(t *testing.T, s *kvcache.Paged, before []map[int32][]float32, uppers []int, tt, gamma float64, tol float64, exact bool) {
	t.Helper()
	lay := s.Layout()
	L, H, d := lay.Layers, lay.KVHeads, lay.HeadDim
	after := stored(s)
	isUpper := func(l int) bool { return slices.Contains(uppers, l) }
	for ti := range L * H {
		l, h := ti/H, ti%H
		mi := kvcache.MiniOf(s, l, h)
		if len(after[ti]) != len(before[ti]) || s.Slots(l, h) != len(before[ti]) {
			t.Fatalf("layer %d head %d: %d positions (%d slots), had %d", l, h, len(after[ti]), s.Slots(l, h), len(before[ti]))
		}
		pos := s.Positions(l, h)
		if !slices.IsSorted(pos) || len(pos) != len(before[ti]) {
			t.Fatalf("layer %d head %d: positions not sorted or wrong count", l, h)
		}
		merged := map[int32]bool{}
		var retained []int32
		if m := mi; m != nil {
			for _, seg := range m.Segs {
				for i := 0; i < seg.N; i++ {
					if seg.KMag != nil {
						merged[seg.Pos[i]] = true
					} else {
						retained = append(retained, seg.Pos[i])
					}
				}
			}
			if m.Pair != l+1 && m.Pair != l-1 || isUpper(l) != (m.Pair == l-1) {
				t.Fatalf("layer %d paired with %d", l, m.Pair)
			}
		} else if isUpper(l) || isUpper(l+1) {
			t.Fatalf("layer %d head %d is not merged", l, h)
		}
		for q, x := range after[ti] {
			want, ok := before[ti][q]
			if !ok {
				t.Fatalf("layer %d head %d: position %d appeared", l, h, q)
			}
			if !merged[q] {
				for c := range x {
					kind := c / d
					if math.Float32bits(x[c]) == math.Float32bits(want[c]) ||
						!exact && math.Abs(float64(x[c]-want[c])) <= tol*math.Max(1, norm64(want[kind*d:(kind+1)*d])) {
						continue
					}
					t.Fatalf("layer %d head %d position %d: unmerged slot changed at %d: %v, had %v", l, h, q, c, x[c], want[c])
				}
				continue
			}
			lo, up := l, l+1
			if isUpper(l) {
				lo, up = l-1, l
			}
			for kind := 0; kind < 2; kind++ {
				a, b := before[lo*H+h][q][kind*d:(kind+1)*d], before[up*H+h][q][kind*d:(kind+1)*d]
				e, _ := refSlerp(a, b, tt)
				own := before[ti][q][kind*d : (kind+1)*d]
				n := norm64(own)
				for c := 0; c < d; c++ {
					if diff := math.Abs(float64(x[kind*d+c]) - e[c]*n); diff > tol*math.Max(1, n) {
						t.Fatalf("layer %d head %d position %d kind %d: restored %v, want %v (Δ %.3g)", l, h, q, kind, x[kind*d+c], e[c]*n, diff)
					}
				}
			}
		}
		if mi == nil || !isUpper(l) {
			continue
		}
		// The retained tokens are the most distant ones (ties: earlier).
		lo := kvcache.MiniOf(s, l-1, h)
		if !slices.Equal(lo.DirBlocks, mi.DirBlocks) {
			t.Fatalf("layers %d and %d head %d do not share their direction blocks", l-1, l, h)
		}
		for _, b := range mi.DirBlocks {
			if r := kvcache.BlockRefs(s.Pool(), b); r < 2 {
				t.Fatalf("shared block %d has %d references", b, r)
			}
		}
		var lret []int32
		for _, seg := range lo.Segs {
			if seg.KMag == nil {
				lret = append(lret, seg.Pos[:seg.N]...)
			}
		}
		if !slices.Equal(lret, retained) {
			t.Fatalf("layers %d and %d head %d retain different tokens: %v and %v", l-1, l, h, lret, retained)
		}
		if gamma < 0 {
			continue // several merges: the ranking was per merge
		}
		var cand []int32
		for q := range merged {
			cand = append(cand, q)
		}
		cand = append(cand, retained...)
		slices.Sort(cand)
		dist := map[int32]float64{}
		for _, q := range cand {
			_, wk := refSlerp(before[(l-1)*H+h][q][:d], before[l*H+h][q][:d], tt)
			_, wv := refSlerp(before[(l-1)*H+h][q][d:], before[l*H+h][q][d:], tt)
			dist[q] = math.Max(wk, wv) / math.Pi
		}
		order := slices.Clone(cand)
		slices.SortStableFunc(order, func(a, b int32) int {
			switch {
			case dist[a] > dist[b]:
				return -1
			case dist[a] < dist[b]:
				return 1
			}
			return int(a - b)
		})
		want := slices.Clone(order[:int(math.Ceil(gamma*float64(len(cand))-1e-9))])
		slices.Sort(want)
		if !slices.Equal(want, retained) {
			t.Fatalf("layer %d head %d retains %v, want %v", l, h, retained, want)
		}
	}
	_ = L
}

func TestMergeLayersF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 3))
	const L, H, d, B, T = 5, 2, 8, 4, 37
	p, err := kvcache.NewPool(kvcache.PoolConfig{Layout: kvcache.Layout{Layers: L, KVHeads: H, HeadDim: d}, BlockTokens: B, Tokens: 128})
	if err != nil {
		t.Fatal(err)
	}
	md := newMiniData(rng, L, H, d, 80)
	s := p.NewSequence()
	md.feed(t, s, 0, T)
	before := stored(s)
	used0 := p.Usage().Used
	opt := policy.MergeOptions{T: 0.6, Gamma: 0.1}
	st, err := policy.MergeLayers(s, 3, opt) // pair (2, 3); layer 4 stays alone
	if err != nil {
		t.Fatal(err)
	}
	if st.Retained != H*4 || st.Merged != H*(T-4) {
		t.Fatalf("stats %+v, want %d retained and %d merged", st, H*4, H*(T-4))
	}
	kvcache.CheckInvariants(t, p, []*kvcache.Paged{s})
	checkMerge(t, s, before, []int{3}, 0.6, 0.1, 1e-6, true)
	// Memory: a pair stores ⌈33/4⌉ direction blocks once and one block of
	// retained tokens per layer, instead of 2·⌈37/4⌉ blocks.
	u := p.Usage()
	if want := used0 - H*(2*10-9-2); u.Used != want {
		t.Fatalf("pool uses %d blocks after merging, want %d (had %d)", u.Used, want, used0)
	}
	m := s.Memory()
	if m.Blocks != u.Used || m.Magnitudes != int64(2*H*(T-4)*8) || m.Reserved != int64(u.Used)*int64(p.BlockBytes())+m.Magnitudes {
		t.Fatalf("memory %+v, pool %+v", m, u)
	}
	if _, err := policy.MergeLayers(s, 4, opt); err == nil || !strings.Contains(err.Error(), "already merged") {
		t.Fatalf("merging layer 3 again with 4: %v", err)
	}
	for _, bad := range []policy.MergeOptions{{T: 1.5}, {T: math.NaN()}, {Gamma: -0.1}, {Recent: -1}} {
		if _, err := policy.MergeLayers(s, 1, bad); err == nil {
			t.Fatalf("options %+v accepted", bad)
		}
	}
	if _, err := policy.MergeLayers(s, 0, opt); err == nil {
		t.Fatal("layer 0 has no lower layer")
	}

	// Operations on merged tables: slot-addressed ones refuse, Truncate
	// works past the merged tokens, attention segments grow with decoding.
	if err := s.Keep(3, 0, []int{0, 1}); err == nil || !strings.Contains(err.Error(), "merged") {
		t.Fatalf("Keep on a merged table: %v", err)
	}
	if err := s.RewriteKeys(2, 0, []int{0}, func(p int32, k []float32) int32 { return p }); err == nil || !strings.Contains(err.Error(), "merged") {
		t.Fatalf("RewriteKeys on a merged table: %v", err)
	}
	if err := s.RemoveRange(3, 5); err == nil || !strings.Contains(err.Error(), "merged") {
		t.Fatalf("RemoveRange over merged tables: %v", err)
	}
	if got := stored(s); fmt.Sprint(got) != fmt.Sprint(stored(s)) || len(got[0]) != T {
		t.Fatal("a refused operation changed the cache")
	}
	if err := s.Keep(0, 0, kvcache.SeqRange(0, T)); err != nil { // keeping everything is no change
		t.Fatal(err)
	}
	md.feed(t, s, T, T+20)
	if s.Len() != T+20 || s.Slots(3, 1) != T+20 {
		t.Fatalf("length %d after decoding", s.Len())
	}
	if err := s.Truncate(T - 1); err == nil || !strings.Contains(err.Error(), "merged") {
		t.Fatalf("truncating into merged tokens: %v", err)
	}
	if err := s.Truncate(T + 10); err != nil {
		t.Fatal(err)
	}
	md.feed(t, s, T+10, T+30)
	kvcache.CheckInvariants(t, p, []*kvcache.Paged{s})

	// Decode-time merge of whole blocks, keeping the newest 5 tokens; the
	// partly filled direction block is topped up.
	before = stored(s)
	st, err = policy.MergeLayers(s, 3, policy.MergeOptions{T: 0.6, Gamma: 0.1, Recent: 5})
	if err != nil {
		t.Fatal(err)
	}
	if st.Merged+st.Retained != H*24 || st.Retained != H*3 { // 30 new tokens, 5 recent → 24 in whole blocks
		t.Fatalf("decode-time merge: %+v", st)
	}
	kvcache.CheckInvariants(t, p, []*kvcache.Paged{s})
	checkMerge(t, s, before, []int{3}, 0.6, -1, 1e-6, true)
	if n := kvcache.BlockTokensOf(s, 3, 0); n != 6 {
		t.Fatalf("%d tokens left in ordinary blocks, want 6", n)
	}

	// Fork shares everything; a merge in the fork copies the shared
	// partly filled direction block and leaves the parent alone.
	f := s.Fork()
	kvcache.CheckInvariants(t, p, []*kvcache.Paged{s, f})
	parent := stored(s)
	md.feed(t, f, T+30, T+40)
	fb := stored(f)
	cow := p.Usage().CopyOnWrite
	if _, err := policy.MergeLayers(f, 3, policy.MergeOptions{T: 0.6}); err != nil {
		t.Fatal(err)
	}
	if p.Usage().CopyOnWrite == cow {
		t.Fatal("the fork's merge wrote into a shared block without copying it")
	}
	kvcache.CheckInvariants(t, p, []*kvcache.Paged{s, f})
	checkMerge(t, f, fb, []int{3}, 0.6, -1, 1e-6, true)
	if got := stored(s); fmt.Sprint(got) != fmt.Sprint(parent) {
		t.Fatal("merging the fork changed the parent")
	}
	// A second pair, from another start.
	fb = stored(f)
	if _, err := policy.MergeLayers(f, 1, policy.MergeOptions{T: 0.6, Gamma: 0.05}); err != nil {
		t.Fatal(err)
	}
	checkMerge(t, f, fb, []int{1, 3}, 0.6, -1, 1e-6, true)
	kvcache.CheckInvariants(t, p, []*kvcache.Paged{s, f})

	s.Free()
	f.Free()
	kvcache.CheckInvariants(t, p, nil)
	if u := p.Usage(); u.Used != 0 {
		t.Fatalf("%d blocks used after freeing everything", u.Used)
	}
}

// TestMergeLayersCodecs: directions are stored in the pool's codecs, so
// MiniCache combines with every one; retained tokens move without
// requantization (KIVI keys excepted); a KIVI pool merges its sealed
// tokens and the residual's beyond the newest R (those from full
// precision: merge, then quantize), and leaves those R alone. With sealing
// held (a prompt), everything but the newest R is merged from full
// precision.
func TestMergeLayersCodecs(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 5))
	const L, H, d, B, T = 4, 2, 16, 4, 100
	cases := []struct {
		k, v  string
		tol   float64 // on restored merged values, relative to ‖x‖
		shift bool    // keys shifted by a mean (kvcache.PoolConfig.KeyShift)
	}{
		{"f32", "f32", 1e-6, false},
		{"f16", "bf16", 1e-2, false},
		{"q8", "q8", 1e-2, false},
		{"q8", "q8", 1e-2, true},
		{"f32", "q4", 0.1, false},
		{"q4", "q4", 0.1, false},
		{"q4", "kivi4", 0.1, true},
		{"f32", "kivi4", 0.1, false},
		{"kivi4", "kivi4", 0.1, false},
		{"kivi2", "kivi2", 0.5, false},
	}
	for _, c := range cases {
		name := c.k + "_" + c.v
		if c.shift {
			name += "_shift"
		}
		t.Run(name, func(t *testing.T) {
			kc, err := codec.Parse(c.k, codec.Keys)
			if err != nil {
				t.Fatal(err)
			}
			vc, err := codec.Parse(c.v, codec.Values)
			if err != nil {
				t.Fatal(err)
			}
			lay := kvcache.Layout{Layers: L, KVHeads: H, HeadDim: d}
			p, err := kvcache.NewPool(kvcache.PoolConfig{Layout: lay, BlockTokens: B, K: kc, V: vc, Tokens: 256, Residual: 8, KeyShift: kvcache.KeyShiftFor(lay, c.shift)})
			if err != nil {
				t.Fatal(err)
			}
			md := newMiniData(rng, L, H, d, T+40)
			exact := !strings.HasPrefix(c.k, "kivi") && !strings.HasPrefix(c.v, "kivi")
			s := p.NewSequence()
			md.feed(t, s, 0, T)
			before := stored(s)
			used := p.Usage().Used
			res := 0 // the residual left: KIVI's newest R = 8 tokens
			if _, ok := kvcache.ResidualOf(s, 3, 0); ok {
				res = 8
			}
			st, err := policy.MergeLayers(s, 3, policy.MergeOptions{T: 0.6, Gamma: 0.05})
			if err != nil {
				t.Fatal(err)
			}
			if st.Merged+st.Retained != H*(T-res) {
				t.Fatalf("merged %+v, want %d tokens per head", st, T-res)
			}
			kvcache.CheckInvariants(t, p, []*kvcache.Paged{s})
			checkMerge(t, s, before, []int{3}, 0.6, 0.05, c.tol, exact)
			if u := p.Usage().Used; u >= used {
				t.Fatalf("pool uses %d blocks after merging, %d before", u, used)
			}
			if r, ok := kvcache.ResidualOf(s, 3, 0); ok && r != res {
				t.Fatalf("the residual went from %d to %d tokens", res, r)
			}
			// Decoding and sealing go on after the merge.
			md.feed(t, s, T, T+40)
			kvcache.CheckInvariants(t, p, []*kvcache.Paged{s})
			if s.Len() != T+40 {
				t.Fatalf("length %d", s.Len())
			}
			before = stored(s)
			if _, err := policy.MergeLayers(s, 3, policy.MergeOptions{T: 0.6, Gamma: 0.05, Full: true}); err != nil {
				t.Fatal(err)
			}
			checkMerge(t, s, before, []int{3}, 0.6, -1, c.tol, exact)
			s.Free()
			if u := p.Usage().Used; u != 0 {
				t.Fatalf("%d blocks used after Free", u)
			}
			if res == 0 {
				return
			}
			// A prompt held in full precision: merged before it is quantized.
			s = p.NewSequence()
			s.HoldSeal(true)
			md.feed(t, s, 0, T)
			if kvcache.BlockTokensOf(s, 3, 0) != 0 {
				t.Fatal("tokens sealed while held")
			}
			before = stored(s)
			if st, err = policy.MergeLayers(s, 3, policy.MergeOptions{T: 0.6, Gamma: 0.05}); err != nil {
				t.Fatal(err)
			}
			if err := s.HoldSeal(false); err != nil {
				t.Fatal(err)
			}
			if r, _ := kvcache.ResidualOf(s, 3, 0); st.Merged+st.Retained != H*(T-res) || r != res {
				t.Fatalf("held prompt: %+v, residual %d", st, r)
			}
			checkMerge(t, s, before, []int{3}, 0.6, 0.05, c.tol, exact)
			kvcache.CheckInvariants(t, p, []*kvcache.Paged{s})
			s.Free()
		})
	}
}

// TestMergeLayersErrors: tables that no longer hold the same tokens (a
// policy pruned one) are refused, and a pool without room for the
// directions fails cleanly without changing anything.
func TestMergeLayersErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 7))
	p, err := kvcache.NewPool(kvcache.PoolConfig{Layout: kvcache.Layout{Layers: 2, KVHeads: 1, HeadDim: 4}, BlockTokens: 4, Tokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	md := newMiniData(rng, 2, 1, 4, 16)
	s := p.NewSequence()
	md.feed(t, s, 0, 12)
	pruned := []int{0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11}
	if err := s.Keep(1, 0, pruned); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.MergeLayers(s, 1, policy.MergeOptions{T: 0.6}); err == nil {
		t.Fatal("merged tables holding different tokens")
	}
	s.Free()
	// One block per layer, both used: retaining one of two tokens needs a
	// direction block and two retained blocks, but the release frees two.
	// With γ = 1 every token is retained, in two blocks.
	p, err = kvcache.NewPool(kvcache.PoolConfig{Layout: kvcache.Layout{Layers: 2, KVHeads: 1, HeadDim: 4}, BlockTokens: 4, Tokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	s = p.NewSequence()
	md.feed(t, s, 0, 2)
	before := stored(s)
	if _, err := policy.MergeLayers(s, 1, policy.MergeOptions{T: 0.6, Gamma: 0.5}); !errors.Is(err, kvcache.ErrNoBlocks) {
		t.Fatalf("merge needing 3 blocks with 2: %v", err)
	}
	if kvcache.MiniOf(s, 0, 0) != nil || fmt.Sprint(stored(s)) != fmt.Sprint(before) {
		t.Fatal("a failed merge changed the cache")
	}
	kvcache.CheckInvariants(t, p, []*kvcache.Paged{s})
	if _, err := policy.MergeLayers(s, 1, policy.MergeOptions{T: 0.6, Gamma: 1}); err != nil {
		t.Fatal(err)
	}
	checkMerge(t, s, before, []int{1}, 0.6, 1, 0, true)
	if _, err := policy.MergeLayers(s, 1, policy.MergeOptions{T: 0.6}); err != nil {
		t.Fatal(err) // nothing left to merge
	}
	s.Free()
	kvcache.CheckInvariants(t, p, nil)
}
