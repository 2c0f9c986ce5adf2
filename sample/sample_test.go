package sample

import (
	"math"
	"math/big"
	"slices"
	"testing"
)

func mustNew(t testing.TB, p Params) *Sampler {
	t.Helper()
	s, err := New(p)
	if err != nil {
		t.Fatalf("New(%+v): %v", p, err)
	}
	return s
}

var (
	inf = float32(math.Inf(1))
	nan = float32(math.NaN())
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		p    Params
		ok   bool
	}{
		{"zero", Params{}, true},
		{"typical", Params{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1.1, RepeatLastN: 64, Seed: 1}, true},
		{"topp one", Params{Temperature: 1, TopP: 1}, true},
		{"minp one", Params{Temperature: 1, MinP: 1}, true},
		{"lastN whole", Params{RepeatPenalty: 1.2, RepeatLastN: -1}, true},
		{"neg temp", Params{Temperature: -0.1}, false},
		{"nan temp", Params{Temperature: nan}, false},
		{"inf temp", Params{Temperature: inf}, false},
		{"neg topk", Params{TopK: -1}, false},
		{"neg topp", Params{TopP: -0.1}, false},
		{"big topp", Params{TopP: 1.01}, false},
		{"nan topp", Params{TopP: nan}, false},
		{"neg minp", Params{MinP: -0.01}, false},
		{"big minp", Params{MinP: 1.5}, false},
		{"nan minp", Params{MinP: nan}, false},
		{"neg penalty", Params{RepeatPenalty: -1}, false},
		{"nan penalty", Params{RepeatPenalty: nan}, false},
		{"lastN -2", Params{RepeatLastN: -2}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			_, nerr := New(tc.p)
			if (nerr == nil) != tc.ok {
				t.Fatalf("New() error = %v, want ok=%v", nerr, tc.ok)
			}
		})
	}
}

func TestGreedy(t *testing.T) {
	tests := []struct {
		name   string
		logits []float32
		want   int
	}{
		{"single", []float32{-3}, 0},
		{"max", []float32{1, 5, 2, 4}, 1},
		{"tie lowest id", []float32{1, 5, 2, 5, 5}, 1},
		{"all equal", []float32{7, 7, 7}, 0},
		{"negative", []float32{-5, -1, -3}, 1},
		{"nan ignored", []float32{nan, 1, 3, nan}, 2},
		{"nan first", []float32{nan, -1e30}, 1},
		{"+inf wins", []float32{1, inf, 3, inf}, 1},
		{"-inf", []float32{-inf, -inf, 0}, 2},
		{"all nan", []float32{nan, nan}, NoToken},
		{"all -inf", []float32{-inf, -inf}, NoToken},
		{"empty", nil, NoToken},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustNew(t, Params{TopK: 1, TopP: 0.5, MinP: 0.5}) // ignored when greedy
			rng := s.rng
			if got := s.Sample(tc.logits, nil); got != tc.want {
				t.Fatalf("Sample = %d, want %d", got, tc.want)
			}
			if s.rng != rng {
				t.Fatal("greedy consumed randomness")
			}
		})
	}
}

// refXorshift is an independent big-integer model of run.c's random_u32.
func refXorshift(seed uint64, count int) []uint32 {
	mask := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 64), big.NewInt(1))
	mul, _ := new(big.Int).SetString("2545F4914F6CDD1D", 16)
	st := new(big.Int).SetUint64(seed)
	tmp := new(big.Int)
	out := make([]uint32, count)
	for i := range out {
		st.Xor(st, tmp.Rsh(st, 12))
		st.Xor(st, tmp.And(tmp.Lsh(st, 25), mask))
		st.Xor(st, tmp.Rsh(st, 27))
		tmp.Mul(st, mul)
		tmp.And(tmp, mask)
		tmp.Rsh(tmp, 32)
		out[i] = uint32(tmp.Uint64())
	}
	return out
}

func TestRNG(t *testing.T) {
	// First outputs of random_u32 / random_f32 from llama2.c run.c
	// (gcc -O3) for state 133742.
	wantU := []uint32{3033531262, 2674377904, 2312864567, 2287415643, 1408443089, 3731947629}
	wantF := []float32{0x1.69a006p-1, 0x1.3ecf88p-1, 0x1.13b706p-1, 0x1.10ae62p-1, 0x1.4fcc88p-2, 0x1.bce2p-1}
	if ref := refXorshift(133742, len(wantU)); !slices.Equal(ref, wantU) {
		t.Fatalf("big-int reference %v disagrees with run.c %v", ref, wantU)
	}
	s := &Sampler{rng: 133742}
	for i, w := range wantU {
		if got := s.randU32(); got != w {
			t.Fatalf("random_u32 #%d = %d, want %d", i, got, w)
		}
	}
	s = &Sampler{rng: 133742}
	for i, w := range wantF {
		if got := s.randF32(); got != w {
			t.Fatalf("random_f32 #%d = %x, want %x", i, got, w)
		}
	}
	for _, seed := range []uint64{1, 42, 1 << 63, math.MaxUint64, DefaultSeed} {
		s := &Sampler{rng: seed}
		for i, w := range refXorshift(seed, 100) {
			if got := s.randU32(); got != w {
				t.Fatalf("seed %d output %d = %d, want %d", seed, i, got, w)
			}
		}
	}
	// Seed 0 is replaced; f32 always in [0,1).
	s = mustNew(t, Params{})
	if s.rng != DefaultSeed {
		t.Fatalf("seed 0 state = %d, want DefaultSeed", s.rng)
	}
	for range 10000 {
		if f := s.randF32(); f < 0 || f >= 1 {
			t.Fatalf("random_f32 out of range: %v", f)
		}
	}
}

// genLogits reproduces the logits fed to run.c's sampler by the harness
// that produced the goldens below.
func genLogits(x []float32, step, salt int, coarse bool) {
	for i := range x {
		h := uint32(i)*2654435761 + uint32(step)*40503 + uint32(salt)*97
		h ^= h >> 15
		if coarse {
			x[i] = float32(h%16) / 4
		} else {
			x[i] = float32(h%2000) / 250
		}
	}
}

// TestRunCGolden compares against token sequences produced by llama2.c
// run.c's build_sampler/sample (gcc -O3, glibc), 64 consecutive steps per
// case with the same sampler, so the RNG stream is checked as well.
func TestRunCGolden(t *testing.T) {
	tests := []struct {
		n      int
		temp   float32
		topp   float32
		seed   uint64
		salt   int
		coarse bool
		want   []int
	}{
		{512, 1, 0.9, 133742, 1, false, []int{283, 162, 404, 39, 449, 277, 158, 290, 240, 67, 99, 121, 152, 72, 419, 161, 265, 160, 441, 262, 300, 422, 249, 359, 242, 347, 324, 17, 424, 399, 43, 97, 395, 367, 398, 230, 35, 334, 333, 252, 345, 491, 49, 30, 425, 403, 445, 174, 468, 89, 328, 204, 169, 439, 313, 471, 43, 367, 487, 423, 220, 18, 461, 346}},
		{512, 1, 0, 42, 2, false, []int{171, 411, 397, 485, 431, 423, 120, 205, 165, 339, 208, 180, 433, 86, 21, 310, 196, 168, 504, 173, 191, 361, 200, 175, 175, 155, 299, 382, 262, 399, 82, 125, 235, 495, 287, 325, 418, 281, 386, 256, 280, 371, 320, 478, 428, 429, 51, 429, 28, 493, 458, 152, 254, 240, 452, 365, 264, 398, 52, 231, 191, 25, 154, 213}},
		{512, 0.8, 0.95, 7, 3, false, []int{150, 234, 404, 29, 424, 20, 176, 145, 351, 143, 236, 360, 83, 357, 75, 198, 395, 102, 25, 151, 138, 262, 416, 161, 151, 238, 21, 174, 162, 76, 154, 223, 46, 349, 393, 372, 122, 200, 252, 441, 418, 72, 31, 17, 111, 264, 209, 245, 351, 472, 284, 168, 285, 367, 31, 503, 192, 75, 174, 407, 476, 223, 163, 468}},
		{32000, 1, 0.9, 133742, 4, false, []int{9630, 27385, 1680, 26959, 21781, 31760, 3018, 30154, 23393, 22297, 16973, 11332, 8431, 8184, 10191, 15567, 27026, 1762, 12085, 19240, 19574, 8184, 20573, 27836, 3823, 15284, 25598, 31633, 16239, 25814, 22269, 15483, 10941, 8685, 20628, 6831, 16385, 6896, 16111, 346, 12450, 24585, 25436, 31812, 10721, 19760, 7545, 846, 24521, 24962, 27167, 12411, 6626, 29296, 8542, 25428, 22551, 12993, 12212, 31863, 11112, 23065, 5040, 3970}},
		{32000, 1.3, 1, 99, 5, false, []int{9585, 31436, 29969, 27629, 13561, 23505, 3577, 25347, 23689, 4343, 4303, 22690, 294, 15089, 26705, 17317, 18929, 5670, 16015, 23040, 19001, 10638, 18859, 30038, 8925, 1138, 26633, 20217, 20730, 30215, 5361, 13527, 11191, 11400, 14075, 4630, 31538, 3396, 23116, 18600, 31029, 10488, 17999, 13796, 31030, 26370, 31476, 24671, 9857, 20882, 29544, 18155, 12207, 19150, 24758, 11535, 31590, 8375, 20386, 13554, 30591, 933, 30902, 10610}},
		{512, 0, 0.9, 1, 6, false, []int{33, 257, 448, 266, 150, 121, 293, 357, 109, 324, 308, 369, 421, 355, 53, 366, 226, 80, 123, 36, 217, 53, 133, 95, 40, 237, 475, 204, 188, 116, 4, 111, 322, 190, 12, 477, 141, 116, 319, 472, 12, 221, 315, 177, 269, 422, 11, 210, 196, 510, 93, 217, 432, 150, 71, 388, 420, 224, 353, 294, 6, 9, 35, 189}},
		{512, 0.5, 0.5, 1234, 7, false, []int{362, 400, 174, 497, 457, 498, 364, 56, 208, 483, 94, 199, 346, 134, 75, 393, 113, 282, 334, 209, 292, 43, 279, 115, 28, 361, 278, 58, 15, 354, 149, 323, 22, 64, 149, 101, 182, 330, 382, 54, 488, 298, 94, 136, 432, 170, 97, 314, 210, 215, 414, 448, 217, 209, 404, 183, 311, 509, 338, 389, 162, 277, 308, 428}},
		// coarse logits: many exactly equal probabilities (tie order in top-p)
		{512, 1, 0.9, 5, 8, true, []int{501, 307, 227, 361, 197, 12, 202, 367, 289, 319, 168, 379, 467, 66, 220, 72, 470, 343, 246, 62, 312, 123, 3, 442, 42, 150, 354, 230, 291, 410, 257, 495, 3, 161, 53, 394, 22, 211, 344, 482, 433, 152, 420, 127, 35, 198, 81, 156, 209, 188, 164, 504, 374, 147, 425, 509, 441, 329, 393, 434, 455, 327, 147, 294}},
		{64, 2, 0.7, 11, 9, true, []int{8, 25, 33, 48, 59, 50, 40, 20, 17, 61, 41, 55, 5, 46, 31, 50, 25, 63, 41, 33, 36, 13, 62, 51, 24, 30, 41, 20, 43, 11, 33, 61, 12, 20, 16, 7, 36, 21, 51, 57, 32, 48, 23, 33, 42, 36, 25, 55, 4, 32, 24, 34, 17, 21, 9, 0, 36, 41, 16, 18, 58, 3, 35, 16}},
	}
	for _, tc := range tests {
		s := mustNew(t, Params{Temperature: tc.temp, TopP: tc.topp, Seed: tc.seed})
		x := make([]float32, tc.n)
		for step, w := range tc.want {
			genLogits(x, step, tc.salt, tc.coarse)
			if got := s.Sample(x, nil); got != w {
				t.Fatalf("n=%d t=%v p=%v seed=%d step %d: got %d, want %d", tc.n, tc.temp, tc.topp, tc.seed, step, got, w)
			}
		}
	}
}

// support returns the set of ids drawn in draws samples.
func support(t *testing.T, p Params, logits []float32, draws int) map[int]int {
	t.Helper()
	s := mustNew(t, p)
	seen := map[int]int{}
	for range draws {
		seen[s.Sample(logits, nil)]++
	}
	return seen
}

func keys(m map[int]int) []int {
	var k []int
	for id := range m {
		k = append(k, id)
	}
	slices.Sort(k)
	return k
}

func TestTopK(t *testing.T) {
	tests := []struct {
		name   string
		logits []float32
		k      int
		want   []int
	}{
		{"k1", []float32{1, 3, 2}, 1, []int{1}},
		{"k2", []float32{1, 3, 2, 0}, 2, []int{1, 2}},
		{"ties at boundary keep lowest ids", []float32{2, 1, 2, 2, 0}, 2, []int{0, 2}},
		{"all equal", []float32{1, 1, 1, 1, 1, 1}, 3, []int{0, 1, 2}},
		{"k=n", []float32{0, 0.5, 1}, 3, []int{0, 1, 2}},
		{"k>n", []float32{0, 0.5}, 10, []int{0, 1}},
		{"nan not kept", []float32{nan, 1, nan, 0.5, 0.2}, 2, []int{1, 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// direct: exactly k finite logits remain (or n if k >= n)
			s := mustNew(t, Params{Temperature: 1, TopK: tc.k})
			x := s.load(tc.logits)
			if tc.k < len(x) {
				s.topK(x, tc.k)
			}
			var kept []int
			for i, v := range x {
				if !math.IsInf(float64(v), -1) {
					kept = append(kept, i)
				}
			}
			if !slices.Equal(kept, tc.want) {
				t.Fatalf("kept %v, want %v", kept, tc.want)
			}
			// through Sample: the support is exactly the kept set
			got := keys(support(t, Params{Temperature: 1, TopK: tc.k, Seed: 3}, tc.logits, 2000))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("sampled support %v, want %v", got, tc.want)
			}
		})
	}
	// larger random case: exactly k survive, and they are the k largest
	x := make([]float32, 1000)
	genLogits(x, 0, 1, true) // many ties
	for _, k := range []int{1, 7, 40, 999} {
		s := mustNew(t, Params{Temperature: 1, TopK: k})
		y := s.load(x)
		s.topK(y, k)
		var kept []int
		for i, v := range y {
			if !math.IsInf(float64(v), -1) {
				kept = append(kept, i)
			}
		}
		ids := make([]int, len(x))
		for i := range ids {
			ids[i] = i
		}
		slices.SortStableFunc(ids, func(a, b int) int {
			switch {
			case x[a] > x[b]:
				return -1
			case x[a] < x[b]:
				return 1
			}
			return 0
		})
		want := slices.Clone(ids[:k])
		slices.Sort(want)
		if !slices.Equal(kept, want) {
			t.Fatalf("k=%d: kept %d ids, want the %d best", k, len(kept), k)
		}
	}
}

func TestTopPNucleus(t *testing.T) {
	p := []float32{0.125, 0.5, 0.25, 0.125}
	tests := []struct {
		topp float32
		want []int // in draw order
	}{
		{0.3, []int{1}},
		{0.5, []int{1, 2}}, // 0.5 does not exceed 0.5
		{0.6, []int{1, 2}},
		{0.75, []int{1, 2, 0}}, // tie 0/3 broken by id
		{0.8, []int{1, 2, 0}},
		{0.9, []int{1, 2, 0, 3}},
		{0.99, []int{1, 2, 0, 3}},
	}
	for _, tc := range tests {
		got := nucleus(nil, p, tc.topp)
		var ids []int
		for _, c := range got {
			ids = append(ids, int(c.index))
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("topp=%v: nucleus %v, want %v", tc.topp, ids, tc.want)
		}
		logits := make([]float32, len(p))
		for i, v := range p {
			logits[i] = float32(math.Log(float64(v)))
		}
		sup := keys(support(t, Params{Temperature: 1, TopP: tc.topp, Seed: 9}, logits, 3000))
		want := slices.Sorted(slices.Values(tc.want))
		// softmax of log(p) is within an ulp of p; stay away from the exact
		// boundaries where that ulp decides.
		if tc.topp != 0.5 && tc.topp != 0.75 && !slices.Equal(sup, want) {
			t.Errorf("topp=%v: sampled support %v, want %v", tc.topp, sup, want)
		}
	}
	// run.c would read out of bounds here (no p reaches the cutoff).
	if got := nucleus(nil, []float32{0.5, 0.5}, 0.1); len(got) != 1 || got[0].index != 0 {
		t.Fatalf("degenerate cutoff: %v", got)
	}
}

func TestMinP(t *testing.T) {
	p := []float32{0.125, 0.5, 0.25, 0.125}
	logits := make([]float32, len(p))
	for i, v := range p {
		logits[i] = float32(math.Log(float64(v)))
	}
	tests := []struct {
		minp float32
		topp float32
		want []int
	}{
		{0.2, 0, []int{0, 1, 2, 3}}, // thr 0.1
		{0.3, 0, []int{1, 2}},       // thr 0.15
		{0.6, 0, []int{1}},          // thr 0.3
		{1, 0, []int{1}},
		{0.2, 0.6, []int{1, 2}}, // top-p first
		{0.6, 0.9, []int{1}},
	}
	for _, tc := range tests {
		sup := keys(support(t, Params{Temperature: 1, MinP: tc.minp, TopP: tc.topp, Seed: 5}, logits, 3000))
		if !slices.Equal(sup, tc.want) {
			t.Errorf("minp=%v topp=%v: support %v, want %v", tc.minp, tc.topp, sup, tc.want)
		}
	}
	cand := []probIndex{{0.125, 0}, {0.5, 1}, {0.25, 2}, {0.125, 3}}
	if got := minP(cand, 0.25, false); len(got) != 4 { // p >= thr is kept
		t.Fatalf("boundary: kept %d, want 4", len(got))
	}
}

func TestRepeatPenalty(t *testing.T) {
	tests := []struct {
		name    string
		p       Params
		logits  []float32
		history []int
		want    []float32
	}{
		{"divide positive, multiply negative, once per token",
			Params{RepeatPenalty: 2}, []float32{2, -2, 1, 0.5}, []int{0, 1, 0, 0}, []float32{1, -4, 1, 0.5}},
		{"zero is multiplied", Params{RepeatPenalty: 2}, []float32{0, 1}, []int{0}, []float32{0, 1}},
		{"window", Params{RepeatPenalty: 2, RepeatLastN: 1}, []float32{2, 4}, []int{0, 1}, []float32{2, 2}},
		{"default window 64", Params{RepeatPenalty: 2}, []float32{2, 4},
			append([]int{0}, make([]int, 64)...), []float32{1, 4}},
		{"default window excludes old", Params{RepeatPenalty: 2}, []float32{2, 4},
			append([]int{1}, slices.Repeat([]int{0}, 64)...), []float32{1, 4}},
		{"whole history", Params{RepeatPenalty: 2, RepeatLastN: -1}, []float32{2, 4},
			append([]int{1}, slices.Repeat([]int{0}, 100)...), []float32{1, 2}},
		{"out of range ids ignored", Params{RepeatPenalty: 2}, []float32{2, 4}, []int{-1, 2, 99}, []float32{2, 4}},
		{"penalty < 1 encourages", Params{RepeatPenalty: 0.5}, []float32{2, -2}, []int{0, 1}, []float32{4, -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustNew(t, tc.p)
			x := s.load(tc.logits)
			s.applyPenalty(x, tc.history)
			if !slices.Equal(x, tc.want) {
				t.Fatalf("got %v, want %v", x, tc.want)
			}
		})
	}
	// effect on the choice
	s := mustNew(t, Params{RepeatPenalty: 2})
	if got := s.Sample([]float32{2, 1.5}, []int{0}); got != 1 {
		t.Fatalf("greedy with penalty = %d, want 1", got)
	}
	if got := s.Sample([]float32{2, 1.5}, []int{1}); got != 0 {
		t.Fatalf("greedy with penalty = %d, want 0", got)
	}
	if got := mustNew(t, Params{RepeatPenalty: 1}).Sample([]float32{2, 1.5}, []int{0}); got != 0 {
		t.Fatalf("penalty 1 must be off, got %d", got)
	}
	// repeated calls reuse the stamp buffer correctly
	for i := range 5 {
		if got := s.Sample([]float32{2, 1.5, 1.8}, []int{i % 2}); got != []int{2, 0}[i%2] {
			t.Fatalf("call %d: got %d", i, got)
		}
	}
}

func softmax64(logits []float32, temp float64) []float64 {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	p := make([]float64, len(logits))
	var sum float64
	for i, v := range logits {
		p[i] = math.Exp((float64(v) - mx) / temp)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	return p
}

func TestDistribution(t *testing.T) {
	logits := []float32{1, 2, 0.5, -1, 1.5, 0}
	const draws = 4000
	tests := []struct {
		name string
		p    Params
		want func() []float64
	}{
		{"t=1", Params{Temperature: 1, Seed: 2024}, func() []float64 { return softmax64(logits, 1) }},
		{"t=0.7", Params{Temperature: 0.7, Seed: 77}, func() []float64 { return softmax64(logits, 0.7) }},
		{"t=1.5", Params{Temperature: 1.5, Seed: 133742}, func() []float64 { return softmax64(logits, 1.5) }},
		{"top-k 3 renormalised", Params{Temperature: 1, TopK: 3, Seed: 8}, func() []float64 {
			return softmax64([]float32{1, 2, float32(math.Inf(-1)), float32(math.Inf(-1)), 1.5, float32(math.Inf(-1))}, 1)
		}},
		{"top-p renormalised", Params{Temperature: 1, TopP: 0.6, Seed: 9}, func() []float64 {
			// softmax: 2 (.420), 1.5 (.255), 1 (.154): nucleus {1, 4}
			ni := float32(math.Inf(-1))
			return softmax64([]float32{ni, 2, ni, ni, 1.5, ni}, 1)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want()
			s := mustNew(t, tc.p)
			counts := make([]int, len(logits))
			for range draws {
				counts[s.Sample(logits, nil)]++
			}
			for i, c := range counts {
				got := float64(c) / draws
				sd := math.Sqrt(want[i]*(1-want[i])/draws) + 1e-9
				if math.Abs(got-want[i]) > 4*sd+0.002 {
					t.Errorf("token %d: freq %.4f, want %.4f (±%.4f)", i, got, want[i], 4*sd)
				}
			}
		})
	}
}

func TestDeterminism(t *testing.T) {
	p := Params{Temperature: 0.9, TopK: 50, TopP: 0.9, MinP: 0.02, RepeatPenalty: 1.2, Seed: 31337}
	x := make([]float32, 300)
	run := func(p Params) []int {
		s := mustNew(t, p)
		var hist []int
		for step := range 200 {
			genLogits(x, step, 3, false)
			hist = append(hist, s.Sample(x, hist))
		}
		return hist
	}
	a, b := run(p), run(p)
	if !slices.Equal(a, b) {
		t.Fatal("same seed gave different sequences")
	}
	p.Seed++
	if c := run(p); slices.Equal(a, c) {
		t.Fatal("different seeds gave the same 200-token sequence")
	}
}

func TestLogitsNotModified(t *testing.T) {
	params := []Params{
		{},
		{Temperature: 0.7},
		{Temperature: 0.7, TopP: 0.9},
		{Temperature: 1.3, TopK: 5, TopP: 0.8, MinP: 0.1, RepeatPenalty: 1.5},
	}
	for _, p := range params {
		s := mustNew(t, p)
		x := make([]float32, 100)
		genLogits(x, 1, 1, false)
		x[3], x[4] = nan, float32(math.Inf(-1))
		orig := slices.Clone(x)
		hist := []int{1, 2, 3, 2}
		origHist := slices.Clone(hist)
		for range 10 {
			s.Sample(x, hist)
		}
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(orig[i]) {
				t.Fatalf("%+v: logits[%d] changed %v -> %v", p, i, orig[i], x[i])
			}
		}
		if !slices.Equal(hist, origHist) {
			t.Fatalf("%+v: history changed", p)
		}
	}
}

func TestNonFinite(t *testing.T) {
	ninf := float32(math.Inf(-1))
	all := []Params{
		{},
		{Temperature: 1, Seed: 4},
		{Temperature: 0.5, TopP: 0.9, Seed: 4},
		{Temperature: 1, TopK: 2, MinP: 0.1, Seed: 4},
		{Temperature: 1, TopK: 1, TopP: 0.5, MinP: 0.5, RepeatPenalty: 1.3, Seed: 4},
	}
	tests := []struct {
		name   string
		logits []float32
		allow  []int // every result must be one of these
	}{
		{"nan excluded", []float32{nan, 1, nan, 2}, []int{1, 3}},
		{"+inf uniform among +inf", []float32{1, inf, 3, inf, nan}, []int{1, 3}},
		{"-inf excluded", []float32{ninf, 0, ninf}, []int{1}},
		{"all nan", []float32{nan, nan, nan}, []int{NoToken}},
		{"all -inf", []float32{ninf, ninf}, []int{NoToken}},
		{"nan and -inf", []float32{nan, ninf}, []int{NoToken}},
		{"single +inf", []float32{inf}, []int{0}},
		{"empty", []float32{}, []int{NoToken}},
		{"nil", nil, []int{NoToken}},
		{"huge values", []float32{math.MaxFloat32, -math.MaxFloat32, math.MaxFloat32}, []int{0, 2}},
	}
	for _, tc := range tests {
		for _, p := range all {
			s := mustNew(t, p)
			for range 200 {
				got := s.Sample(tc.logits, []int{0, 1, 2})
				if !slices.Contains(tc.allow, got) {
					t.Fatalf("%s %+v: got %d, want one of %v", tc.name, p, got, tc.allow)
				}
			}
		}
	}
	// both +Inf tokens are reachable
	seen := support(t, Params{Temperature: 1, Seed: 1}, []float32{1, inf, 3, inf}, 500)
	if got := keys(seen); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("+inf support %v", got)
	}
	// tiny temperature overflowing to +Inf still yields a valid token
	s := mustNew(t, Params{Temperature: 1e-30, Seed: 1})
	if got := s.Sample([]float32{1e10, 2e10, -1e10}, nil); got != 1 {
		t.Fatalf("overflowing temperature: got %d, want 1", got)
	}
}

func TestVocabSizeChanges(t *testing.T) {
	s := mustNew(t, Params{Temperature: 1, TopK: 3, TopP: 0.9, RepeatPenalty: 1.1, Seed: 1})
	for _, n := range []int{1, 5, 1000, 3, 2000, 1} {
		x := make([]float32, n)
		genLogits(x, n, 2, false)
		if got := s.Sample(x, []int{0, 1, 5000}); got < 0 || got >= n {
			t.Fatalf("n=%d: got %d", n, got)
		}
	}
}

func TestNoSteadyStateAllocs(t *testing.T) {
	x := make([]float32, 32000)
	genLogits(x, 0, 1, false)
	hist := make([]int, 100)
	for i := range hist {
		hist[i] = i * 7
	}
	for _, p := range []Params{
		{},
		{Temperature: 1, Seed: 1},
		{Temperature: 1, TopP: 0.9, Seed: 1},
		{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1.1, Seed: 1},
		{Temperature: 0.8, MinP: 0.05, Seed: 1},
	} {
		s := mustNew(t, p)
		s.Sample(x, hist) // warm up buffers
		if a := testing.AllocsPerRun(20, func() { s.Sample(x, hist) }); a != 0 {
			t.Errorf("%+v: %v allocs per Sample", p, a)
		}
	}
}

func BenchmarkSample32k(b *testing.B) {
	x := make([]float32, 32000)
	genLogits(x, 0, 1, false)
	hist := make([]int, 64)
	for _, bc := range []struct {
		name string
		p    Params
	}{
		{"greedy", Params{}},
		{"temp", Params{Temperature: 1, Seed: 1}},
		{"topp", Params{Temperature: 1, TopP: 0.9, Seed: 1}},
		{"all", Params{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1.1, Seed: 1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := mustNew(b, bc.p)
			for b.Loop() {
				s.Sample(x, hist)
			}
		})
	}
}

func TestRandomSeed(t *testing.T) {
	seen := map[uint64]bool{}
	for range 64 {
		s := RandomSeed()
		if s == 0 || s >= 1<<53 {
			t.Fatalf("seed %d: want 0 < seed < 2^53", s)
		}
		seen[s] = true
	}
	if len(seen) < 60 {
		t.Fatalf("64 random seeds gave only %d distinct values", len(seen))
	}
}
