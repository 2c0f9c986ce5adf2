package policy

import (
	"math"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
)

func TestPyramidInferNormalize(t *testing.T) {
	c, err := Config{Method: "pyramidinfer"}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	if c.Opts.Get("recent") != 0.2 || c.Opts.Get("decay") != 0.9 || c.Opts.Get("gen-decay") != 0.1 || c.Opts.Get("min-keep") != 64 || c.Sinks != 4 || c.Positions != PosOriginal {
		t.Fatalf("defaults: %+v", c)
	}
	if !slices.Contains(Methods, "pyramidinfer") {
		t.Fatal("pyramidinfer is not listed in Methods")
	}
	bad := []struct {
		cfg  Config
		want string
	}{
		{Config{Method: "pyramidinfer", Budget: 64}, "no budget"},
		{Config{Method: "pyramidinfer", Ratio: 0.5}, "no budget"},
		{Config{Method: "pyramidinfer", Window: 8}, "recent"},
		{Config{Method: "pyramidinfer", Every: 4}, "every"},
		{Config{Method: "pyramidinfer", Positions: PosReindex}, "original"},
		{Config{Method: "pyramidinfer", Opts: Opts{}.With("recent", 1.5)}, "recent"},
		{Config{Method: "pyramidinfer", Opts: Opts{}.With("decay", 1.5)}, "decay"},
		{Config{Method: "pyramidinfer", Opts: Opts{}.With("gen-decay", -1)}, "decay"},
		{Config{Method: "pyramidinfer", Opts: Opts{}.With("min-keep", -1)}, "min-keep"},
	}
	for _, b := range bad {
		if _, err := b.cfg.Normalize(); err == nil || !contains(err.Error(), b.want) {
			t.Errorf("%+v: error %v, want one mentioning %q", b.cfg, err, b.want)
		}
	}
}

// probsAt is naive attention of one query head over keys at the given
// positions: softmax(q·k/√d) over keys at or before qpos.
func probsAt(q []float32, keys [][]float64, kpos []int32, qpos int32) []float64 {
	p := make([]float64, len(keys))
	mx := math.Inf(-1)
	for j, k := range keys {
		if kpos[j] > qpos {
			p[j] = math.Inf(-1)
			continue
		}
		s := 0.0
		for c := range k {
			s += float64(q[c]) * k[c]
		}
		p[j] = s / math.Sqrt(float64(len(k)))
		mx = math.Max(mx, p[j])
	}
	sum := 0.0
	for j := range p {
		p[j] = math.Exp(p[j] - mx)
		sum += p[j]
	}
	for j := range p {
		p[j] /= sum
	}
	return p
}

// headMean is the attention of the query at qpos (recorded at layer l),
// averaged over every query head, on each slot of the layer's tables.
func headMean(t *testing.T, m *model.Model, rec *recorder, l int, qpos int32, keys [][][]float64, kpos [][]int32) []float64 {
	t.Helper()
	qi := -1
	for i, p := range rec.pos[l] {
		if p == qpos {
			qi = i
		}
	}
	if qi < 0 {
		t.Fatalf("layer %d: no query recorded at position %d", l, qpos)
	}
	hd, G := m.HeadDim, m.GroupSize()
	out := make([]float64, len(keys[l*m.KVHeads]))
	for h := 0; h < m.KVHeads; h++ {
		for j := 0; j < G; j++ {
			q := rec.q[l][qi][(h*G+j)*hd : (h*G+j+1)*hd]
			for i, v := range probsAt(q, keys[l*m.KVHeads+h], kpos[l*m.KVHeads+h], qpos) {
				out[i] += v / float64(m.Config.Heads)
			}
		}
	}
	return out
}

// topByScore keeps the k best of cand (ties: the earlier position), in
// position order.
func topByScore(cand []int32, score map[int32]float64, k int) []int32 {
	c := append([]int32(nil), cand...)
	sort.SliceStable(c, func(a, b int) bool { return score[c[a]] > score[c[b]] })
	c = c[:k]
	slices.Sort(c)
	return c
}

// positionsOf lists each table's positions.
func positionsOf(cache *kvcache.Paged, L, H int) [][]int32 {
	out := make([][]int32, L*H)
	for t := range out {
		out[t] = cache.Positions(t/H, t%H)
	}
	return out
}

// TestPyramidInferSelectionMatchesBruteForce runs a 400-token prompt of
// stories260K through PyramidInfer and recomputes, for every layer, which
// tokens go on to the next one, plainly: naive float64 attention of the
// recorded queries of the recent window over the layer's stored keys,
// averaged over all query heads, rows weighted 1 … 1.2, the cosine
// schedule written out, an explicit sort.
func TestPyramidInferSelectionMatchesBruteForce(t *testing.T) {
	st := loadStories(t)
	m := st.m
	const T = 400
	L := m.Config.Layers
	seq, err := m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	ps, err := New(Config{Method: "pyramidinfer"}, seq)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{inner: ps, q: make([][][]float32, L), pos: make([][]int32, L)}
	seq.Mass = rec
	ps.BeginPrefill(T)
	if _, err := seq.Forward(st.ids[:T], false); err != nil {
		t.Fatal(err)
	}
	cache := seq.Cache().(*kvcache.Paged)
	keys, kpos := snapshotKeys(seq), positionsOf(cache, L, m.KVHeads)
	if err := ps.Compress(); err != nil {
		t.Fatal(err)
	}
	got := ps.Kept()
	W := 1 + int(T*0.2) // the recent window, the last token included
	floor := min(64, T-W)
	pruned := 0
	for l := 0; l < L-1; l++ {
		alive := got[l][0]
		n := len(alive)
		ctx := n - W
		r := (1-0.9)*(math.Cos(math.Pi*float64(l)/float64(L))+1)/2 + 0.9
		want := alive
		if k := int(float64(ctx) * r); ctx > floor && r < 1 && k > floor {
			score := map[int32]float64{}
			for i := 0; i < W; i++ {
				w := 1 + 0.2*float64(i)/float64(W-1)
				mass := headMean(t, m, rec, l, alive[ctx+i], keys, kpos)
				for j := 0; j < ctx; j++ {
					score[alive[j]] += w * mass[j]
				}
			}
			want = append(append([]int32(nil), alive[:4]...), topByScore(alive[4:ctx], score, k-4)...)
			want = append(want, alive[ctx:]...)
			slices.Sort(want)
			pruned++
		}
		for h := 0; h < m.KVHeads; h++ {
			if !slices.Equal(got[l+1][h], want) {
				t.Fatalf("layer %d → %d head %d: kept %v\nwant %v", l, l+1, h, got[l+1][h], want)
			}
		}
	}
	if pruned == 0 {
		t.Fatal("nothing was pruned")
	}
	t.Logf("tokens per layer: %v", ps.KeptPerLayer())
}

// TestPyramidInferInvariants: for prompts of several lengths the first 4
// tokens, the recent window and the last token reach every layer, each
// layer keeps a subset of the previous one's tokens (the same in every
// head), counts follow the schedule and never fall to the 64-token floor,
// the rows computed are the tokens stored, no prefix of the pruned cache
// is registered, and Close returns every block.
func TestPyramidInferInvariants(t *testing.T) {
	st := loadStories(t)
	m := st.m
	L := m.Config.Layers
	for _, tc := range []struct {
		T     int
		decay float64
	}{{50, 0}, {100, 0}, {200, 0}, {400, 0}, {511, 0}, {300, 0.5}, {160, 0.3}} {
		T := tc.T
		seq, err := m.NewStandaloneSequence(model.KVOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seq.Chunk = 64
		ps, err := New(Config{Method: "pyramidinfer", Opts: Opts{}.With("decay", tc.decay)}, seq)
		if err != nil {
			t.Fatal(err)
		}
		decay := ps.Config().Opts.Get("decay")
		ps.BeginPrefill(T)
		logits, err := seq.Forward(st.ids[:T], false)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range logits {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("T=%d: logit %v", T, v)
			}
		}
		if err := ps.Compress(); err != nil {
			t.Fatal(err)
		}
		if seq.Chunk != 64 {
			t.Fatalf("T=%d: chunk %d not restored", T, seq.Chunk)
		}
		W := 1 + int(float64(T)*0.2)
		floor := min(64, T-W)
		kept := ps.Kept()
		rows := 0
		for l := 0; l < L; l++ {
			set := kept[l][0]
			rows += len(set)
			for h := range kept[l] {
				if !slices.Equal(kept[l][h], set) {
					t.Fatalf("T=%d layer %d: head %d keeps other tokens than head 0", T, l, h)
				}
			}
			for i := 0; i < 4; i++ {
				if set[i] != int32(i) {
					t.Fatalf("T=%d layer %d: sink %d missing", T, l, i)
				}
			}
			for i := 0; i < W; i++ {
				if set[len(set)-W+i] != int32(T-W+i) {
					t.Fatalf("T=%d layer %d: recent token %d missing (last token %d)", T, l, T-W+i, T-1)
				}
			}
			want := T
			if l > 0 {
				prev := kept[l-1][0]
				for _, p := range set {
					if _, ok := slices.BinarySearch(prev, p); !ok {
						t.Fatalf("T=%d layer %d keeps %d, which layer %d dropped", T, l, p, l-1)
					}
				}
				ctx := len(prev) - W
				r := (1-decay)*(math.Cos(math.Pi*float64(l-1)/float64(L))+1)/2 + decay
				want = len(prev)
				if k := int(float64(ctx) * r); ctx > floor && k > floor && r < 1 {
					want = k + W
				}
			}
			if len(set) != want {
				t.Fatalf("T=%d layer %d: %d tokens, the schedule says %d", T, l, len(set), want)
			}
			if ctx := len(set) - W; ctx < floor {
				t.Fatalf("T=%d layer %d: context %d below the floor %d", T, l, ctx, floor)
			}
		}
		if seq.RowLayers != rows {
			t.Fatalf("T=%d: %d rows computed, %d stored", T, seq.RowLayers, rows)
		}
		if T <= 64+W && rows != T*L {
			t.Fatalf("T=%d: a prompt within the floor was pruned", T)
		}
		cache := seq.Cache().(*kvcache.Paged)
		cache.RegisterPrefix(st.ids[:T], 0)
		other := cache.Pool().NewSequence()
		if matched := other.MatchPrefix(st.ids[:T], 0); matched != 0 && rows != T*L {
			t.Fatalf("T=%d: %d tokens of a pruned prompt were registered as a prefix", T, matched)
		}
		other.Free()
		t.Logf("T=%d decay %g: tokens per layer %v", T, decay, ps.KeptPerLayer())
		seq.Close()
		if u := cache.Pool().Usage(); u.Used != 0 {
			t.Fatalf("T=%d: %d blocks used after Close", T, u.Used)
		}
	}
}

// TestPyramidInferPrefillSaving measures the prefill compute PyramidInfer
// saves on a 400-token stories260K prompt: rows computed over all layers
// against the dense prefill, and wall times (best of 7, interleaved)
// against the dense prefill in the default chunks and as one step (as
// PyramidInfer runs its prompt).
func TestPyramidInferPrefillSaving(t *testing.T) {
	if testing.Short() {
		t.Skip("slow; -short (CI's purego and race runs) skips it, the plain run has it")
	}
	st := loadStories(t)
	m := st.m
	const T = 400
	prompt := st.ids[:T]
	run := func(cfg *Config, chunk int) (int, time.Duration) {
		seq, err := m.NewStandaloneSequence(model.KVOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Close()
		seq.Chunk = chunk
		var ps *State
		if cfg != nil {
			if ps, err = New(*cfg, seq); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if ps != nil {
			ps.BeginPrefill(T)
		}
		if _, err := seq.Forward(prompt, false); err != nil {
			t.Fatal(err)
		}
		if ps != nil {
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
		}
		return seq.RowLayers, time.Since(start)
	}
	cfgs := []Config{{Method: "pyramidinfer", Opts: Opts{}.With("decay", 0.9)}, {Method: "pyramidinfer", Opts: Opts{}.With("decay", 0.5)}}
	best := make([]time.Duration, 2+len(cfgs))
	rows := make([]int, len(best))
	for i := range best {
		best[i] = time.Duration(math.MaxInt64)
	}
	for range 7 {
		for i := range best {
			var r int
			var d time.Duration
			switch i {
			case 0:
				r, d = run(nil, model.DefaultChunk)
			case 1:
				r, d = run(nil, T)
			default:
				r, d = run(&cfgs[i-2], model.DefaultChunk)
			}
			rows[i], best[i] = r, min(best[i], d)
		}
	}
	dense := T * m.Config.Layers
	if rows[0] != dense || rows[1] != dense {
		t.Fatalf("dense prefill computed %d and %d rows, want %d", rows[0], rows[1], dense)
	}
	for i, cfg := range cfgs {
		r, d := rows[2+i], best[2+i]
		if r >= dense {
			t.Fatalf("%s: %d rows computed, dense %d", cfg, r, dense)
		}
		t.Logf("prefill of %d tokens, decay %g: %d of %d row-layers computed (%.1f%% saved); wall %v: %.2f× dense in chunks of %d (%v), %.2f× dense as one step (%v)",
			T, cfg.Opts.Get("decay"), r, dense, 100*(1-float64(r)/float64(dense)), d.Round(time.Microsecond),
			float64(d)/float64(best[0]), model.DefaultChunk, best[0].Round(time.Microsecond), float64(d)/float64(best[1]), best[1].Round(time.Microsecond))
	}
}

// TestPyramidInferDecode: while decoding, the prompt's KV stays as the
// prefill left it; once 16 generated tokens lie beyond the recent window,
// each layer reduces them to ⌊16·0.9·r_gen(l)⌋, chosen as a brute-force
// recomputation says (naive attention of the window's recorded queries
// over the keys each of them saw, averaged over heads, weighted 1 … 1.2);
// newer tokens stay; nothing leaks.
func TestPyramidInferDecode(t *testing.T) {
	st := loadStories(t)
	m := st.m
	const T, N = 200, 110
	L, H := m.Config.Layers, m.KVHeads
	seq, err := m.NewStandaloneSequence(model.KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := New(Config{Method: "pyramidinfer"}, seq)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{inner: ps, q: make([][][]float32, L), pos: make([][]int32, L)}
	seq.Mass = rec
	cache := seq.Cache().(*kvcache.Paged)
	ps.BeginPrefill(T)
	logits, err := seq.Forward(st.ids[:T], false)
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Compress(); err != nil {
		t.Fatal(err)
	}
	prompt := positionsOf(cache, L, H)
	W := 1 + int(T*0.2)
	// The keys and positions each generated token's queries saw.
	type view struct {
		keys [][][]float64
		pos  [][]int32
	}
	views := map[int32]view{}
	type compression struct {
		chunk  int32   // first position of the chunk
		window []int32 // positions of the window's queries
	}
	var comps []compression
	pending := 0
	for g := 0; g < N; g++ {
		for pending-W >= 16 {
			first := int32(T + g - pending)
			var win []int32
			for p := int32(T + g - W); p < int32(T+g); p++ {
				win = append(win, p)
			}
			comps = append(comps, compression{first, win})
			pending -= 16
		}
		if err := ps.Before(1); err != nil {
			t.Fatal(err)
		}
		next := 0
		for i, v := range logits {
			if v > logits[next] {
				next = i
			}
		}
		if logits, err = seq.Forward([]int{next}, false); err != nil {
			t.Fatal(err)
		}
		pending++
		views[int32(T+g)] = view{snapshotKeys(seq), positionsOf(cache, L, H)}
	}
	if len(comps) < 3 || ps.run.(*pyramid).chunks != len(comps) {
		t.Fatalf("%d chunks compressed, expected %d (at least 3)", ps.run.(*pyramid).chunks, len(comps))
	}
	final := positionsOf(cache, L, H)
	for l := 0; l < L; l++ {
		rgen := (1-0.1)*(math.Cos(math.Pi*float64(l)/float64(L))+1)/2 + 0.1
		k := max(1, int(16*0.9*rgen))
		for h := 0; h < H; h++ {
			tb := l*H + h
			var inPrompt []int32
			for _, p := range final[tb] {
				if p < T {
					inPrompt = append(inPrompt, p)
				}
			}
			if !slices.Equal(inPrompt, prompt[tb]) {
				t.Fatalf("layer %d head %d: the prompt's KV changed while decoding", l, h)
			}
			want := len(prompt[tb]) + k*len(comps) + (N - 16*len(comps))
			if len(final[tb]) != want {
				t.Fatalf("layer %d head %d: %d tokens, want %d", l, h, len(final[tb]), want)
			}
		}
		for _, c := range comps {
			score := map[int32]float64{}
			for i, qp := range c.window {
				w := 1 + 0.2*float64(i)/float64(W-1)
				v := views[qp]
				mass := headMean(t, m, rec, l, qp, v.keys, v.pos)
				for j, p := range v.pos[l*H] {
					if p >= c.chunk && p < c.chunk+16 {
						score[p] += w * mass[j]
					}
				}
			}
			var chunk []int32
			for p := c.chunk; p < c.chunk+16; p++ {
				chunk = append(chunk, p)
			}
			want := topByScore(chunk, score, k)
			for h := 0; h < H; h++ {
				var got []int32
				for _, p := range final[l*H+h] {
					if p >= c.chunk && p < c.chunk+16 {
						got = append(got, p)
					}
				}
				if !slices.Equal(got, want) {
					t.Fatalf("layer %d head %d chunk at %d: kept %v, want %v", l, h, c.chunk, got, want)
				}
			}
		}
	}
	t.Logf("after %d generated tokens: %d chunks compressed, tokens per layer %v", N, len(comps), ps.KeptPerLayer())
	pool := cache.Pool()
	seq.Close()
	if u := pool.Usage(); u.Used != 0 {
		t.Fatalf("%d blocks used after Close", u.Used)
	}
}

// TestPyramidInferCodecs: the prefill pruning and the decoding chunks work
// over quantized and KIVI caches too (KIVI keeps the prompt in full
// precision until Compress): the prompt untouched while decoding, the
// schedule's counts, no leak.
func TestPyramidInferCodecs(t *testing.T) {
	st := loadStories(t)
	m := st.m
	const T, N = 200, 80
	L, H := m.Config.Layers, m.KVHeads
	for _, cn := range [][2]string{{"f32", "f32"}, {"q8", "q4"}, {"kivi4", "kivi2"}} {
		t.Run(cn[0]+"-"+cn[1], func(t *testing.T) {
			kc, _ := codec.Parse(cn[0], codec.Keys)
			vc, _ := codec.Parse(cn[1], codec.Values)
			seq, err := m.NewStandaloneSequence(model.KVOptions{K: kc, V: vc})
			if err != nil {
				t.Fatal(err)
			}
			ps, err := New(Config{Method: "pyramidinfer"}, seq)
			if err != nil {
				t.Fatal(err)
			}
			cache := seq.Cache().(*kvcache.Paged)
			ps.BeginPrefill(T)
			logits, err := seq.Forward(st.ids[:T], false)
			if err != nil {
				t.Fatal(err)
			}
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
			prompt := positionsOf(cache, L, H)
			for g := 0; g < N; g++ {
				if err := ps.Before(1); err != nil {
					t.Fatal(err)
				}
				next := 0
				for i, v := range logits {
					if v > logits[next] {
						next = i
					}
				}
				if logits, err = seq.Forward([]int{next}, false); err != nil {
					t.Fatal(err)
				}
			}
			chunks := ps.run.(*pyramid).chunks
			if chunks != (N-1-(1+T/5))/16 {
				t.Fatalf("%d chunks compressed", chunks)
			}
			final := positionsOf(cache, L, H)
			for l := 0; l < L; l++ {
				k := max(1, int(16*0.9*((1-0.1)*(math.Cos(math.Pi*float64(l)/float64(L))+1)/2+0.1)))
				for h := 0; h < H; h++ {
					tb := l*H + h
					p := final[tb]
					if !slices.IsSorted(p) || !slices.Equal(p, final[l*H]) {
						t.Fatalf("layer %d head %d: positions out of order or differ between heads", l, h)
					}
					if !slices.Equal(p[:len(prompt[tb])], prompt[tb]) || p[0] != 0 || p[3] != 3 {
						t.Fatalf("layer %d head %d: the prompt's tokens changed", l, h)
					}
					if want := len(prompt[tb]) + k*chunks + N - 16*chunks; len(p) != want {
						t.Fatalf("layer %d head %d: %d tokens, want %d", l, h, len(p), want)
					}
				}
			}
			t.Logf("tokens per layer after %d generated: %v", N, ps.KeptPerLayer())
			pool := cache.Pool()
			seq.Close()
			if u := pool.Usage(); u.Used != 0 {
				t.Fatalf("%d blocks used after Close", u.Used)
			}
		})
	}
}
