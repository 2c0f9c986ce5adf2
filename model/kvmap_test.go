package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// mapArch is an architecture as a KV source map and per-layer windows
// (nil: every layer its own KV, full attention).
type mapArch struct {
	name    string
	kvHeads int
	src     []int
	win     []int
}

// mapArchs are the architectures of issue 21 on 6 layers (docs/ARCHITECTURES.md).
var mapArchs = []mapArch{
	{"cla2", 2, []int{0, 0, 2, 2, 4, 4}, nil},
	{"cla3", 2, []int{0, 0, 0, 3, 3, 3}, nil},
	{"cla2-mqa", 1, []int{0, 0, 2, 2, 4, 4}, nil},
	// YOCO: a self-decoder of three sliding-window layers, then one global
	// owner read by every later layer.
	{"yoco", 2, []int{0, 1, 2, 3, 3, 3}, []int{8, 8, 8, 0, 0, 0}},
	// LCKV: two warmup layers; every other layer reads the top one.
	{"lckv", 2, []int{0, 1, 5, 5, 5, 5}, nil},
	// LCKV with a warmup layer at the top too: layers 1-3 read layer 4.
	{"lckv-top", 2, []int{0, 4, 4, 4, 4, 5}, nil},
	// Interleaved local (window 8) and global layers.
	{"local-global", 2, nil, []int{8, 8, 0, 8, 8, 0}},
}

// spec is the architecture's tiny GGUF: the map in its metadata and no
// attn_k / attn_v tensors in the layers that do not own KV (the weights
// are still drawn, so that a reference can ignore the map).
func (a mapArch) spec() tinySpec {
	s := tinySpec{arch: "llama", dim: 64, layers: 6, heads: 4, kvHeads: a.kvHeads, hidden: 96, ctx: 256, theta: 10000, eps: 1e-5,
		vocab: 300, tok: spmTok(300), seed: 41, meta: map[string]any{}}
	if a.src != nil {
		src := make([]int32, len(a.src))
		for i, v := range a.src {
			src[i] = int32(v)
		}
		s.meta[KeyKVSource] = src
		for i := range a.src {
			if !slices.Contains(a.src, i) {
				p := "blk." + itoa(i) + "."
				s.skip = append(s.skip, p+"attn_k.weight", p+"attn_v.weight")
			}
		}
	}
	if a.win != nil {
		win := make([]uint32, len(a.win))
		for i, v := range a.win {
			win[i] = uint32(v)
		}
		s.meta[KeyLayerWindow] = win
	}
	return s
}

// refMapForward is the forward pass of a KV-sharing model written plainly
// in float64, token after token: layer i of token t computes its query and,
// if it owns KV (src[i] == i), its key and value; it attends the keys and
// values of layer src[i]: those of tokens u ≤ t when src[i] ≤ i (the
// source already ran for token t), u < t when src[i] > i plus a dummy key
// and value of zeros; and, with win[i] > 0, only t − u < win[i]. src nil
// is every layer its own, win nil full attention. It returns every
// position's logits.
func refMapForward(s tinySpec, w *tinyWeights, tokens []int, src, win []int) [][]float64 {
	n, D, hd, L := len(tokens), s.dim, s.hd(), s.layers
	if src == nil {
		src = make([]int, L)
		for i := range src {
			src[i] = i
		}
	}
	if win == nil {
		win = make([]int, L)
	}
	half := hd / 2
	rms := func(x, g []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+float64(s.eps))
		out := make([]float64, len(x))
		for i := range x {
			out[i] = x[i] * inv * g[i]
		}
		return out
	}
	matvec := func(m [][]float64, x []float64) []float64 {
		out := make([]float64, len(m))
		for i, row := range m {
			for j, v := range row {
				out[i] += v * x[j]
			}
		}
		return out
	}
	rotate := func(v []float64, pos int) {
		for j := 0; j < half; j++ {
			a := float64(pos) * math.Pow(float64(s.theta), -float64(2*j)/float64(hd))
			x0, x1 := v[2*j], v[2*j+1]
			v[2*j] = x0*math.Cos(a) - x1*math.Sin(a)
			v[2*j+1] = x0*math.Sin(a) + x1*math.Cos(a)
		}
	}
	keys := make([][][]float64, L) // [layer][token] rotated keys of the owners
	vals := make([][][]float64, L)
	group := s.heads / s.kvHeads
	logits := make([][]float64, n)
	for t, id := range tokens {
		x := slices.Clone(w.emb[id])
		for i, Ly := range w.layers {
			xb := rms(x, Ly.attnNorm)
			q := matvec(Ly.wq, xb)
			for h := 0; h < s.heads; h++ {
				rotate(q[h*hd:(h+1)*hd], t)
			}
			if src[i] == i {
				k, v := matvec(Ly.wk, xb), matvec(Ly.wv, xb)
				for h := 0; h < s.kvHeads; h++ {
					rotate(k[h*hd:(h+1)*hd], t)
				}
				keys[i], vals[i] = append(keys[i], k), append(vals[i], v)
			}
			later := src[i] > i
			att := make([]float64, s.heads*hd)
			for h := 0; h < s.heads; h++ {
				kh := h / group
				var logit []float64
				var us []int
				for u := 0; u <= t; u++ {
					if (later && u == t) || (win[i] > 0 && t-u >= win[i]) {
						continue
					}
					var d float64
					for c := 0; c < hd; c++ {
						d += q[h*hd+c] * keys[src[i]][u][kh*hd+c]
					}
					logit, us = append(logit, d/math.Sqrt(float64(hd))), append(us, u)
				}
				if later {
					logit = append(logit, 0) // the dummy key; its value is zero
				}
				mx := math.Inf(-1)
				for _, l := range logit {
					mx = math.Max(mx, l)
				}
				var sum float64
				for _, l := range logit {
					sum += math.Exp(l - mx)
				}
				for j, u := range us {
					p := math.Exp(logit[j]-mx) / sum
					for c := 0; c < hd; c++ {
						att[h*hd+c] += p * vals[src[i]][u][kh*hd+c]
					}
				}
			}
			o := matvec(Ly.wo, att)
			for c := 0; c < D; c++ {
				x[c] += o[c]
			}
			xb = rms(x, Ly.ffnNorm)
			g, up := matvec(Ly.wGate, xb), matvec(Ly.wUp, xb)
			for c := range g {
				g[c] = g[c] / (1 + math.Exp(-g[c])) * up[c]
			}
			d := matvec(Ly.wDown, g)
			for c := 0; c < D; c++ {
				x[c] += d[c]
			}
		}
		logits[t] = matvec(w.out, rms(x, w.outNorm))
	}
	return logits
}

// maxLogitDiff is the largest |a − b| over every position's logits.
func maxLogitDiff(a, b [][]float64) float64 {
	var worst float64
	for t := range a {
		for i := range a[t] {
			worst = math.Max(worst, math.Abs(a[t][i]-b[t][i]))
		}
	}
	return worst
}

// TestKVMapMatchesReference: for each KV-sharing architecture, a tiny
// random-weight GGUF with the map in its metadata (and no K/V projections
// in the layers that do not own KV) gives the logits of the plain float64
// reference within 1e-4 at every one of 64 positions: the prompt as one
// Forward, in chunks of 17 and 5, token by token, a prefill of 30 then
// decoding, and in DecodeBatch beside sequences at other positions. The
// reference run with the map ignored (every layer its own KV, using the
// K/V weights the file leaves out) or the windows ignored is far from
// kvlm's logits (> 1e-2), so the match is the map's doing.
func TestKVMapMatchesReference(t *testing.T) {
	const T = 64
	fk, fv := f32Codecs(t)
	for _, a := range mapArchs {
		t.Run(a.name, func(t *testing.T) {
			spec := a.spec()
			path, w := spec.build(t)
			m, _, err := LoadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if !slices.Equal(m.KVSource, a.src) || !slices.Equal(m.LayerWindows, a.win) {
				t.Fatalf("loaded map %v windows %v, want %v %v", m.KVSource, m.LayerWindows, a.src, a.win)
			}
			r := rand.New(rand.NewPCG(7, uint64(len(a.name))))
			prompts := make([][]int, 3)
			refs := make([][][]float64, 3)
			for i := range prompts {
				prompts[i] = make([]int, T)
				for j := range prompts[i] {
					prompts[i][j] = r.IntN(spec.vocab)
				}
				refs[i] = refMapForward(spec, w, prompts[i], a.src, a.win)
			}
			prompt, ref := prompts[0], refs[0]
			// The map matters: ignoring it (or the windows) changes the logits.
			if a.src != nil {
				if d := maxLogitDiff(ref, refMapForward(spec, w, prompt, nil, a.win)); d < 1e-2 {
					t.Fatalf("ignoring the KV sources changes the reference's logits by only %.3g", d)
				}
			}
			if a.win != nil {
				if d := maxLogitDiff(ref, refMapForward(spec, w, prompt, a.src, nil)); d < 1e-2 {
					t.Fatalf("ignoring the windows changes the reference's logits by only %.3g", d)
				}
			}
			checkForwardPaths(t, m, KVOptions{K: fk, V: fv}, prompts, refs, refPaths{tokenByToken: true, prefillDecode: true, decodeChunk: 17, fork: true})
		})
	}
}

// TestKVLayoutOwnersOnly: the cache has one layer per KV owner, with the
// windows of window-bounded owners and each owner's reader count.
func TestKVLayoutOwnersOnly(t *testing.T) {
	for _, c := range []struct {
		a       mapArch
		layers  int
		windows []int
		readers []int
	}{
		{mapArchs[0], 3, nil, []int{2, 2, 2}},
		{mapArchs[1], 2, nil, []int{3, 3}},
		{mapArchs[3], 4, []int{8, 8, 8, 0}, []int{1, 1, 1, 3}},
		{mapArchs[4], 3, nil, []int{1, 1, 4}},
		{mapArchs[6], 6, []int{8, 8, 0, 8, 8, 0}, nil},
	} {
		m := &Model{Config: Config{Layers: 6, KVHeads: 2, HeadDim: 16, KVSource: c.a.src, LayerWindows: c.a.win}}
		l := m.KVLayout()
		if l.Layers != c.layers || !slices.Equal(l.Windows, c.windows) || !slices.Equal(l.Readers, c.readers) {
			t.Errorf("%s: layout %+v, want %d layers, windows %v, readers %v", c.a.name, l, c.layers, c.windows, c.readers)
		}
	}
}

// TestKVMapLoadErrors: a map the forward pass cannot run, and K/V tensors
// in a layer that reads another's KV, are refused with errors naming them.
func TestKVMapLoadErrors(t *testing.T) {
	cla2 := mapArchs[0]
	for _, c := range []struct {
		name string
		edit func(*tinySpec)
		want string
	}{
		{"short map", func(s *tinySpec) { s.meta[KeyKVSource] = []int32{0, 0, 2} }, "has 3 entries for 6 layers"},
		{"source out of range", func(s *tinySpec) { s.meta[KeyKVSource] = []int32{0, 0, 2, 2, 4, 6} }, "is not a layer"},
		{"negative source", func(s *tinySpec) { s.meta[KeyKVSource] = []int32{0, -1, 2, 2, 4, 4} }, "is not a layer"},
		{"chained source", func(s *tinySpec) {
			s.meta[KeyKVSource] = []int32{0, 0, 1, 2, 4, 4}
			s.skip = []string{"blk.1.attn_k.weight", "blk.1.attn_v.weight", "blk.3.attn_k.weight", "blk.3.attn_v.weight", "blk.5.attn_k.weight", "blk.5.attn_v.weight"}
		}, "must read its own"},
		{"source not integers", func(s *tinySpec) { s.meta[KeyKVSource] = []string{"a"} }, "attention.kv_source"},
		{"short windows", func(s *tinySpec) { s.meta[KeyLayerWindow] = []uint32{8, 8} }, "has 2 entries for 6 layers"},
		{"huge window", func(s *tinySpec) { s.meta[KeyLayerWindow] = []uint32{8, 8, 8, 8, 8, 1 << 31} }, "layer_window"},
		{"K/V tensor in a reader", func(s *tinySpec) {
			s.skip = []string{"blk.1.attn_k.weight", "blk.1.attn_v.weight", "blk.3.attn_v.weight", "blk.5.attn_k.weight", "blk.5.attn_v.weight"}
		},
			"blk.3.attn_k.weight present, but layer 3 reads layer 2's KV"},
		{"missing owner K", func(s *tinySpec) { s.skip = append(s.skip, "blk.2.attn_k.weight") }, "missing tensor blk.2.attn_k.weight"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := cla2.spec()
			c.edit(&s)
			path, _ := s.build(t)
			_, _, err := LoadGGUF(path)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// nll is the mean negative log-likelihood of tokens[t+1] under logits[t]
// ([n][V] flat, float32) or ref ([n][V]).
func nll(logits []float32, ref [][]float64, tokens []int, V int) float64 {
	var sum float64
	for t := 0; t+1 < len(tokens); t++ {
		row := make([]float64, V)
		for i := range row {
			if ref != nil {
				row[i] = ref[t][i]
			} else {
				row[i] = float64(logits[t*V+i])
			}
		}
		mx := slices.Max(row)
		var z float64
		for _, v := range row {
			z += math.Exp(v - mx)
		}
		sum += mx + math.Log(z) - row[tokens[t+1]]
	}
	return sum / float64(len(tokens)-1)
}

// TestLCKVPasses: Layer-Condensed KV's iterative parallel prompt encoding.
// With at least as many passes as a chunk has tokens it is exact (every
// position's logits match the float64 reference, which encodes token by
// token, and decoding after it too); with fewer it is an approximation
// whose distance from the sequential result is logged per m (the closing
// note's table: go test ./model/ -run TestLCKVPasses -v). The strict mask
// matters here: a pass sees the previous pass's entry at the query's own
// position, which it must not.
func TestLCKVPasses(t *testing.T) {
	const T = 64
	fk, fv := f32Codecs(t)
	for _, a := range []mapArch{mapArchs[4], mapArchs[5]} {
		t.Run(a.name, func(t *testing.T) {
			spec := a.spec()
			path, w := spec.build(t)
			m, _, err := LoadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			r := rand.New(rand.NewPCG(9, 9))
			prompt := make([]int, T)
			for i := range prompt {
				prompt[i] = r.IntN(spec.vocab)
			}
			ref := refMapForward(spec, w, prompt, a.src, a.win)
			V := m.Vocab
			run := func(t *testing.T, passes, chunk int) (*Sequence, []float32) {
				seq, err := m.NewStandaloneSequence(KVOptions{K: fk, V: fv, BlockTokens: 16, LCKVPasses: passes})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(seq.Close)
				seq.Chunk = chunk
				logits, err := seq.Forward(prompt[:T-8], true)
				if err != nil {
					t.Fatal(err)
				}
				return seq, slices.Clone(logits)
			}
			for _, c := range []struct{ passes, chunk int }{{56, 64}, {8, 8}, {17, 17}, {60, 128}} {
				t.Run("passes "+itoa(c.passes)+" chunk "+itoa(c.chunk), func(t *testing.T) {
					seq, logits := run(t, c.passes, c.chunk)
					for p := 0; p < T-8; p++ {
						compareLogits(t, "pos "+itoa(p), logits[p*V:(p+1)*V], ref[p], 1e-4)
					}
					for p := T - 8; p < T; p++ {
						logits, err := seq.Forward(prompt[p:p+1], false)
						if err != nil {
							t.Fatal(err)
						}
						compareLogits(t, "decode pos "+itoa(p), logits, ref[p], 1e-4)
					}
				})
			}
			// Fewer passes than tokens: the distance from sequential encoding.
			refNLL := nll(nil, ref, prompt[:T-8], V)
			for passes := 1; passes <= 8; passes++ {
				_, logits := run(t, passes, 64)
				var d float64
				last := T - 9
				for i := 0; i < V; i++ {
					d = math.Max(d, math.Abs(float64(logits[last*V+i])-ref[last][i]))
				}
				dNLL := nll(logits, nil, prompt[:T-8], V) - refNLL
				t.Logf("%s, %d prompt tokens, m = %d passes: last token's logits max |Δ| %.4g, prompt NLL %+.4g nats (sequential %.4f)", a.name, T-8, passes, d, dNLL, refNLL)
				if passes == 1 && d < 1e-2 {
					t.Errorf("one pass is within %.3g of sequential encoding: the passes do nothing", d)
				}
			}
		})
	}
}

// TestLCKVPassesErrors: LCKVPasses where it cannot apply is refused.
func TestLCKVPassesErrors(t *testing.T) {
	fk, fv := f32Codecs(t)
	plain := mapArch{name: "plain", kvHeads: 2}
	path, _ := plain.spec().build(t)
	m, _, err := LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.NewStandaloneSequence(KVOptions{K: fk, V: fv, LCKVPasses: 7}); err == nil || !strings.Contains(err.Error(), "without layers that read a later layer's KV") {
		t.Errorf("passes on a plain model: %v", err)
	}
	path, _ = mapArchs[4].spec().build(t)
	lc, _, err := LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	if _, err := lc.NewStandaloneSequence(KVOptions{K: fk, V: fv, LCKVPasses: -1}); err == nil || !strings.Contains(err.Error(), "want 0 (sequential) or more") {
		t.Errorf("negative passes: %v", err)
	}
	seq, err := lc.NewStandaloneSequence(KVOptions{K: fk, V: fv, LCKVPasses: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	seq.Prune = dropLast{}
	if _, err := seq.Forward([]int{1, 2, 3}, false); err == nil || !strings.Contains(err.Error(), "row pruner") {
		t.Errorf("passes with a pruner: %v", err)
	}
}

// TestPrefillEarlyExit: when only the last logits are wanted, the layers
// above the last KV owner run for the last prompt token only (not at all
// for a chunk that is not the prompt's last): Sequence.RowLayers counts
// exactly T·(last owner + 1) + (layers above it), the last logits match
// the reference, and decoding after it matches too (the cache is whole).
// With every logit wanted every row runs in every layer.
func TestPrefillEarlyExit(t *testing.T) {
	const T = 64
	fk, fv := f32Codecs(t)
	for _, a := range []mapArch{mapArchs[0], mapArchs[3], mapArchs[5], mapArchs[6]} {
		t.Run(a.name, func(t *testing.T) {
			spec := a.spec()
			path, w := spec.build(t)
			m, _, err := LoadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			r := rand.New(rand.NewPCG(3, 3))
			prompt := make([]int, T)
			for i := range prompt {
				prompt[i] = r.IntN(spec.vocab)
			}
			ref := refMapForward(spec, w, prompt, a.src, a.win)
			L, last := m.Config.Layers, m.LastOwner()
			const pre = T - 8
			for _, chunk := range []int{128, 17} {
				seq, err := m.NewStandaloneSequence(KVOptions{K: fk, V: fv, BlockTokens: 16})
				if err != nil {
					t.Fatal(err)
				}
				seq.Chunk = chunk
				logits, err := seq.Forward(prompt[:pre], false)
				if err != nil {
					t.Fatal(err)
				}
				compareLogits(t, "prefill chunk "+itoa(chunk), logits, ref[pre-1], 1e-4)
				want := pre*(last+1) + (L - 1 - last)
				if m.Condensed() {
					want = pre * L // sequential: every token is a prompt's last row
				}
				if seq.RowLayers != want {
					t.Errorf("chunk %d: %d rows computed, want %d (last owner %d of %d layers)", chunk, seq.RowLayers, want, last, L)
				}
				for p := pre; p < T; p++ {
					logits, err := seq.Forward(prompt[p:p+1], false)
					if err != nil {
						t.Fatal(err)
					}
					compareLogits(t, "decode pos "+itoa(p), logits, ref[p], 1e-4)
				}
				seq.Close()
			}
			seq, err := m.NewStandaloneSequence(KVOptions{K: fk, V: fv, BlockTokens: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			if _, err := seq.Forward(prompt, true); err != nil {
				t.Fatal(err)
			}
			if seq.RowLayers != T*L {
				t.Errorf("every logit: %d rows computed, want %d", seq.RowLayers, T*L)
			}
			// NoEarlyExit, and a row pruner (which follows the rows layer by
			// layer: it is consulted after every layer but the last, and
			// here keeps every row), turn the early exit off: the same
			// logits, every row in every layer.
			for _, c := range []struct {
				name   string
				noExit bool
				prune  *rulePruner
			}{{"NoEarlyExit", true, nil}, {"pruner", false, &rulePruner{keep: func(int, int32) bool { return true }}}} {
				seq, err := m.NewStandaloneSequence(KVOptions{K: fk, V: fv, BlockTokens: 16})
				if err != nil {
					t.Fatal(err)
				}
				seq.Chunk, seq.NoEarlyExit = 17, c.noExit
				if c.prune != nil {
					seq.Prune = c.prune
				}
				logits, err := seq.Forward(prompt, false)
				if err != nil {
					t.Fatal(err)
				}
				compareLogits(t, c.name, logits, ref[T-1], 1e-4)
				if seq.RowLayers != T*L {
					t.Errorf("%s: %d rows computed, want %d", c.name, seq.RowLayers, T*L)
				}
				// Once after every layer but the last of each chunk that
				// does not want every logit (token by token on LCKV: the
				// last token's step wants its only logits).
				steps := (T + 16) / 17
				if m.Condensed() {
					steps = T - 1
				}
				if c.prune != nil && len(c.prune.calls) != steps*(L-1) {
					t.Errorf("pruner consulted %d times, want %d", len(c.prune.calls), steps*(L-1))
				}
				seq.Close()
			}
		})
	}
}
