package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"testing"

	"github.com/kvlm/kvlm/attention"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/tokenizer"
)

func TestKeep(t *testing.T) {
	cases := []struct {
		name                  string
		n, budget, sinks, win int
		score                 []float32
		want                  []int
	}{
		{"under budget", 4, 6, 1, 1, nil, []int{0, 1, 2, 3}},
		{"window only", 6, 3, 0, 3, nil, []int{3, 4, 5}},
		{"sinks and window", 8, 4, 2, 2, nil, []int{0, 1, 6, 7}},
		{"top scores in order", 6, 3, 0, 1, []float32{1, 5, 2, 4, 3, 0}, []int{1, 3, 5}},
		{"ties: earlier wins", 6, 3, 0, 0, []float32{1, 2, 2, 2, 0, 0}, []int{1, 2, 3}},
		{"ties at the boundary", 6, 2, 0, 0, []float32{3, 1, 1, 1, 1, 0}, []int{0, 1}},
		{"sinks, scores, window", 10, 5, 1, 2, []float32{0, 1, 9, 1, 8, 1, 1, 1, 0, 0}, []int{0, 2, 4, 8, 9}},
		{"NaN sorts last", 4, 2, 0, 0, []float32{float32(math.NaN()), 1, 2, 0}, []int{1, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Keep(c.n, c.budget, c.sinks, c.win, c.score)
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("Keep = %v, want %v", got, c.want)
			}
		})
	}
}

// TestKeepFewDrops: what Dropped finds for a few dropped slots (passes
// over the candidates) is what Keep's stable sort (keepBest) drops, on
// random tables, budgets, sinks and windows and scores with ties, NaNs,
// −Inf and missing entries, for 1 to fewDrops+2 slots dropped; Keep is its
// complement, and past fewDrops Dropped declines.
func TestKeepFewDrops(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 600 {
		n := 2 + rng.IntN(60)
		score := make([]float32, n-rng.IntN(3)) // slots past len(score) score 0
		for i := range score {
			switch rng.IntN(6) {
			case 0:
				score[i] = float32(math.NaN())
			case 1:
				score[i] = float32(math.Inf(-1))
			default:
				score[i] = float32(rng.IntN(5)) // ties
			}
		}
		drop := min(n-1, 1+rng.IntN(fewDrops+2))
		budget := n - drop
		sinks, window := rng.IntN(3), rng.IntN(4)
		// What the sort keeps of the candidates between the clamped sinks
		// and window.
		s, w := min(sinks, budget), min(window, budget-min(sinks, budget))
		var mid []int
		for i := s; i < n-w; i++ {
			mid = append(mid, i)
		}
		kept := keepBest(slices.Clone(mid), budget-s-w, score)
		var want []int
		for _, i := range mid {
			if !slices.Contains(kept, i) {
				want = append(want, i)
			}
		}
		gone, ok := Dropped(n, budget, sinks, window, score)
		if drop > fewDrops {
			if ok {
				t.Fatalf("trial %d: Dropped took %d slots, more than %d", trial, drop, fewDrops)
			}
			continue
		}
		if !ok || fmt.Sprint(gone) != fmt.Sprint(want) {
			t.Fatalf("trial %d: n %d budget %d sinks %d window %d scores %v: Dropped %v (%v), the sort drops %v", trial, n, budget, sinks, window, score, gone, ok, want)
		}
		keep := Keep(n, budget, sinks, window, score)
		for i := range n {
			if slices.Contains(keep, i) == slices.Contains(gone, i) {
				t.Fatalf("trial %d: Keep %v is not the complement of Dropped %v", trial, keep, gone)
			}
		}
	}
}

func TestNormalizeErrors(t *testing.T) {
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{Method: "nope"}, "unknown method"},
		{Config{Method: "h2o"}, "needs a budget"},
		{Config{Method: "h2o", Budget: -1}, "positive"},
		{Config{Method: "h2o", Ratio: 1.5}, "ratio"},
		{Config{Method: "h2o", Ratio: -0.5}, "ratio"},
		{Config{Method: "h2o", Budget: 8, Ratio: 0.5}, "not both"},
		{Config{Method: "snapkv", Budget: 16, Window: 32}, "smaller than sinks"},
		{Config{Method: "snapkv", Budget: 40, Window: 32, Sinks: 10}, "smaller than sinks"},
		{Config{Method: "streaming", Budget: 10, Window: 20}, "must equal"},
		{Config{Method: "window"}, "needs --kv-window"},
		{Config{Method: "window", Window: 8, Sinks: 2}, "no sinks"},
		{Config{Method: "full", Budget: 8}, "no budget"},
		{Config{Method: "snapkv", Budget: 64, Kernel: 4}, "odd"},
		{Config{Method: "snapkv", Budget: 64, Pool: "median"}, "pooling"},
	}
	for _, c := range cases {
		_, err := c.cfg.Normalize()
		if err == nil || !contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one mentioning %q", c.cfg, err, c.want)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}

// recorder wraps a policy's mass hook and keeps every layer's queries.
type recorder struct {
	inner model.MassHook
	q     [][][]float32 // [layer][query] rotated query heads, of the steps that asked for mass
	pos   [][]int32     // [layer][query]
}

func (r *recorder) Request(layer, start, n int) *attention.MassRequest {
	return r.inner.Request(layer, start, n)
}

func (r *recorder) Done(layer int, req *attention.MassRequest, q []float32, pos []int32) {
	r.inner.Done(layer, req, q, pos)
	w := len(q) / len(pos)
	for i := range pos {
		r.q[layer] = append(r.q[layer], append([]float32(nil), q[i*w:(i+1)*w]...))
		r.pos[layer] = append(r.pos[layer], pos[i])
	}
}

type stories struct {
	m   *model.Model
	tok tokenizer.Tokenizer
	ids []int
}

func loadStories(t testing.TB) stories {
	t.Helper()
	m, err := model.LoadLlama2C(shared.Path(t, "models/stories260K/stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadLlama2C(shared.Path(t, "models/stories260K/tok512.bin"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	text, err := os.ReadFile(shared.Path(t, "data/tinystories_valid_head.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return stories{m, tok, tok.Encode(string(text[:20000]), true, false)}
}

// snapshotKeys decodes every stored key of every table.
func snapshotKeys(seq *model.Sequence) [][][]float64 {
	c := seq.Cache()
	l := c.Layout()
	out := make([][][]float64, l.Layers*l.KVHeads)
	row := make([]float32, l.HeadDim)
	for t := range out {
		for _, s := range c.Segments(t/l.KVHeads, t%l.KVHeads) {
			for i := 0; i < s.N; i++ {
				s.KC.Get(s.K, s.Cap, l.HeadDim, i, row)
				k := make([]float64, l.HeadDim)
				for j, v := range row {
					k[j] = float64(v)
				}
				out[t] = append(out[t], k)
			}
		}
	}
	return out
}

// probs is the naive attention matrix of one query head over keys at
// positions 0..len(keys)-1: softmax(q·k/√d) over keys at or before qpos.
func probs(q []float32, keys [][]float64, qpos int32) []float64 {
	p := make([]float64, len(keys))
	mx := math.Inf(-1)
	for j, k := range keys {
		if int32(j) > qpos {
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

// refKeep is the brute-force selection: explicit sort by score (desc),
// earlier position first on ties, sinks and window always kept.
func refKeep(n, budget, sinks, window int, score []float64) []int {
	if n <= budget {
		return seq(0, n)
	}
	var mid []int
	for i := sinks; i < n-window; i++ {
		mid = append(mid, i)
	}
	sort.SliceStable(mid, func(a, b int) bool { return score[mid[a]] > score[mid[b]] })
	keep := append(seq(0, sinks), mid[:budget-sinks-window]...)
	keep = append(keep, seq(n-window, n)...)
	sort.Ints(keep)
	return keep
}

func seq(a, b int) []int {
	var r []int
	for i := a; i < b; i++ {
		r = append(r, i)
	}
	return r
}

// TestSelectionMatchesBruteForce runs each scoring policy on stories260K
// activations and compares the kept tokens of every (layer, KV head) with a
// selection recomputed plainly from the recorded queries and the stored
// keys: a naive float64 attention matrix, explicit sums, pooling and sort.
func TestSelectionMatchesBruteForce(t *testing.T) {
	st := loadStories(t)
	m := st.m
	const T = 200
	prompt := st.ids[:T]
	G := m.GroupSize()
	hd := m.HeadDim
	cases := []Config{
		{Method: "h2o", Budget: 64},
		{Method: "h2o", Budget: 64, Agg: attention.AggMax},
		{Method: "tova", Budget: 50},
		{Method: "snapkv", Budget: 64, Window: 16},
		{Method: "snapkv", Ratio: 0.25, Window: 16, Pool: "max", Kernel: 7},
		{Method: "snapkv", Budget: 64, Window: 16, Agg: attention.AggSum},
		{Method: "pyramidkv", Budget: 64, Window: 16},
		{Method: "adakv", Budget: 64, Window: 16},
		{Method: "knorm", Budget: 80, Sinks: 4, Window: 8},
		{Method: "window", Window: 48},
		{Method: "streaming", Window: 44, Sinks: 4, Positions: PosOriginal, Every: 1},
	}
	for _, cfg := range cases {
		t.Run(cfg.String(), func(t *testing.T) {
			seqn, err := m.NewStandaloneSequence(model.KVOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer seqn.Close()
			ps, err := New(cfg, seqn)
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{inner: ps, q: make([][][]float32, m.Config.Layers), pos: make([][]int32, m.Config.Layers)}
			if seqn.Mass != nil {
				seqn.Mass = rec
			}
			ps.BeginPrefill(T)
			seqn.Chunk = 64 // the observation window spans chunks
			if _, err := seqn.Forward(prompt, false); err != nil {
				t.Fatal(err)
			}
			keys := snapshotKeys(seqn)
			if err := ps.Compress(); err != nil {
				t.Fatal(err)
			}
			c := ps.Config()
			b := ps.budget(T)
			got := ps.Kept()
			for l := 0; l < m.Config.Layers; l++ {
				// Aggregated attention mass of each KV head's group, per query.
				byPos := map[int32]int{}
				for i, p := range rec.pos[l] {
					byPos[p] = i
				}
				// mass of the query at position qp.
				mass := func(h int, qp int) []float64 {
					q, ok := byPos[int32(qp)]
					if !ok {
						t.Fatalf("layer %d: no query recorded at position %d", l, qp)
					}
					agg := make([]float64, T)
					for j := 0; j < G; j++ {
						qq := rec.q[l][q][(h*G+j)*hd : (h*G+j+1)*hd]
						p := probs(qq, keys[l*m.KVHeads+h], rec.pos[l][q])
						for i, v := range p {
							switch c.Agg {
							case attention.AggMax:
								agg[i] = math.Max(agg[i], v)
							default:
								agg[i] += v
							}
						}
					}
					if c.Agg == attention.AggMean {
						for i := range agg {
							agg[i] /= float64(G)
						}
					}
					return agg
				}
				want := make([][]int, m.KVHeads)
				switch c.Method {
				case "h2o":
					for h := range want {
						score := make([]float64, T)
						for q := 0; q < T; q++ {
							for i, v := range mass(h, q) {
								score[i] += v
							}
						}
						want[h] = refKeep(T, b, 0, b/2, score)
					}
				case "tova":
					score := make([]float64, T)
					for h := 0; h < m.KVHeads; h++ {
						for i, v := range mass(h, T-1) {
							score[i] += v / float64(m.KVHeads)
						}
					}
					for h := range want {
						want[h] = refKeep(T, b, 0, 0, score)
					}
				case "snapkv", "pyramidkv", "adakv":
					W := c.Window
					pooled := make([][]float64, m.KVHeads)
					for h := range pooled {
						raw := make([]float64, T-W)
						for q := T - W; q < T; q++ {
							for i, v := range mass(h, q)[:T-W] {
								raw[i] += v
							}
						}
						pooled[h] = make([]float64, T)
						r := c.Kernel / 2
						for i := range raw {
							acc := math.Inf(-1)
							if c.Pool == "avg" {
								acc = 0
							}
							for j := i - r; j <= i+r; j++ {
								if j < 0 || j >= len(raw) {
									continue
								}
								if c.Pool == "max" {
									acc = math.Max(acc, raw[j])
								} else {
									acc += raw[j]
								}
							}
							if c.Pool == "avg" {
								acc /= float64(c.Kernel)
							}
							pooled[h][i] = acc
						}
					}
					budgets := make([]int, m.KVHeads)
					for h := range budgets {
						budgets[h] = b
					}
					if c.Method == "pyramidkv" {
						// The published schedule, written out.
						L := m.Config.Layers
						minB := float64(b-W) / c.Opts.Get("beta")
						maxB := 2*float64(b-W) - minB
						if maxB >= float64(T-W) {
							maxB, minB = float64(T-W), 2*float64(b-W)-float64(T-W)
						}
						for h := range budgets {
							budgets[h] = int(maxB-float64(l)*(maxB-minB)/float64(L-1)) + W
						}
					}
					if c.Method == "adakv" {
						type cand struct {
							s    float64
							h, i int
						}
						var all []cand
						for h := range pooled {
							for i := 0; i < T-W; i++ {
								all = append(all, cand{pooled[h][i], h, i})
							}
						}
						sort.SliceStable(all, func(a, b int) bool { return all[a].s > all[b].s })
						count := make([]int, m.KVHeads)
						for _, x := range all[:m.KVHeads*(b-W)] {
							count[x.h]++
						}
						for h := range budgets {
							budgets[h] = int(math.Round(float64(count[h])*(1-c.Opts.Get("alpha"))+c.Opts.Get("alpha")*float64(b-W))) + W
						}
					}
					for h := range want {
						want[h] = refKeep(T, budgets[h], 0, W, pooled[h])
					}
				case "knorm":
					for h := range want {
						score := make([]float64, T)
						for i, k := range keys[l*m.KVHeads+h] {
							n := 0.0
							for _, v := range k {
								n += v * v
							}
							score[i] = float64(-float32(math.Sqrt(n))) // scores are float32: equal norms (the same token at two positions) tie
						}
						want[h] = refKeep(T, b, c.Sinks, c.Window, score)
					}
				case "window", "streaming":
					for h := range want {
						want[h] = append(seq(0, c.Sinks), seq(T-c.Window, T)...)
					}
				}
				for h := range want {
					g := got[l][h]
					gi := make([]int, len(g))
					for i, v := range g {
						gi[i] = int(v)
					}
					if !slices.Equal(gi, want[h]) {
						t.Fatalf("layer %d head %d: kept %v\nwant %v", l, h, gi, want[h])
					}
					if n := seqn.Cache().(interface{ Slots(int, int) int }).Slots(l, h); n != len(want[h]) {
						t.Fatalf("layer %d head %d: cache holds %d tokens, selection %d", l, h, n, len(want[h]))
					}
				}
			}
		})
	}
}
