package model

import (
	"math"
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcache/codec"
)

func loadStories(t testing.TB) *Model {
	t.Helper()
	m, err := LoadLlama2C(shared.Path(t, "models/stories260K/stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// The golden run of ../shared/models/README.md: run.c greedy from the prompt
// "Once upon a time", 64 new tokens.
var (
	goldenPrompt = []int{1, 403, 407, 261, 378}
	goldenIDs    = []int{432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292,
		411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426,
		338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310,
		439, 419, 357, 336}
	goldenLogits = []struct {
		pos, input, argmax int
		max, sum, logit1   float64
	}{
		{0, 1, 403, 17.023516, -1070.171674, 8.404342},
		{1, 403, 407, 18.459986, -2162.157880, 3.841276},
		{4, 378, 432, 17.799398, -2256.851513, -5.329466},
		{10, 298, 315, 15.605296, -2603.650117, -5.245306},
		{30, 433, 426, 13.740890, -3822.516568, 0.173230},
		{63, 438, 310, 19.273191, -1855.974909, 1.138132},
	}
)

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// TestGoldenGreedy feeds the prompt token by token, then decodes greedily,
// comparing generated ids and the logit checkpoints with run.c's.
func TestGoldenGreedy(t *testing.T) {
	m := loadStories(t)
	seq, err := m.NewStandaloneSequence(KVOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inputs := append(append([]int{}, goldenPrompt...), goldenIDs...)
	var got []int
	check := 0
	for pos := 0; pos < len(goldenPrompt)+len(goldenIDs)-1; pos++ {
		logits, err := seq.Forward([]int{inputs[pos]}, false)
		if err != nil {
			t.Fatal(err)
		}
		if check < len(goldenLogits) && goldenLogits[check].pos == pos {
			g := goldenLogits[check]
			check++
			var sum float64
			for _, v := range logits {
				sum += float64(v)
			}
			am := argmax(logits)
			if inputs[pos] != g.input || am != g.argmax {
				t.Errorf("pos %d: input %d argmax %d, want %d and %d", pos, inputs[pos], am, g.input, g.argmax)
			}
			for _, c := range []struct {
				name      string
				got, want float64
			}{{"max logit", float64(logits[am]), g.max}, {"sum of logits", sum, g.sum}, {"logit[1]", float64(logits[1]), g.logit1}} {
				if math.Abs(c.got-c.want) > 1e-3 {
					t.Errorf("pos %d: %s %.6f, want %.6f (|Δ| %.2g)", pos, c.name, c.got, c.want, math.Abs(c.got-c.want))
				}
			}
		}
		if pos >= len(goldenPrompt)-1 {
			got = append(got, argmax(logits))
		}
	}
	if check != len(goldenLogits) {
		t.Errorf("only %d of %d logit checkpoints reached", check, len(goldenLogits))
	}
	for i := range goldenIDs {
		if got[i] != goldenIDs[i] {
			t.Fatalf("generated token %d is %d, want %d (got %v)", i, got[i], goldenIDs[i], got)
		}
	}
}

// TestPrefillMatchesDecode: a prompt run as one matrix (and in uneven
// chunks) gives the logits of feeding it token by token.
func TestPrefillMatchesDecode(t *testing.T) {
	m := loadStories(t)
	toks := append(append([]int{}, goldenPrompt...), goldenIDs...)
	step, _ := m.NewStandaloneSequence(KVOptions{})
	want := make([]float32, 0, len(toks)*m.Vocab)
	for _, id := range toks {
		l, err := step.Forward([]int{id}, false)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, l...)
	}
	for _, chunk := range []int{len(toks), 7, 1, 32} {
		seq, _ := m.NewStandaloneSequence(KVOptions{})
		seq.Chunk = chunk
		got, err := seq.Forward(toks, true)
		if err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for i := range want {
			worst = math.Max(worst, math.Abs(float64(got[i]-want[i])))
		}
		if worst > 1e-5 {
			t.Errorf("chunk %d: max |Δlogit| %.3g > 1e-5", chunk, worst)
		}
		// The last-token-only form agrees too.
		seq2, _ := m.NewStandaloneSequence(KVOptions{})
		seq2.Chunk = chunk
		last, _ := seq2.Forward(toks, false)
		for i, v := range last {
			if math.Abs(float64(v-want[(len(toks)-1)*m.Vocab+i])) > 1e-5 {
				t.Fatalf("chunk %d: last-token logits differ at %d", chunk, i)
			}
		}
	}
}

func TestContextLimit(t *testing.T) {
	m := loadStories(t)
	seq, _ := m.NewStandaloneSequence(KVOptions{})
	toks := make([]int, m.CtxLen+1)
	if _, err := seq.Forward(toks, false); err == nil {
		t.Fatal("a prompt longer than the context was accepted")
	}
	if _, err := seq.Forward(toks[:m.CtxLen], false); err != nil {
		t.Fatalf("a prompt of exactly the context length: %v", err)
	}
	if _, err := seq.Forward([]int{1}, false); err == nil {
		t.Fatal("a token past the context was accepted")
	}
	if _, err := seq.Forward(nil, false); err == nil {
		t.Fatal("an empty forward was accepted")
	}
	seq2, _ := m.NewStandaloneSequence(KVOptions{})
	if _, err := seq2.Forward([]int{m.Vocab}, false); err == nil {
		t.Fatal("an out-of-range token id was accepted")
	}
}

func TestLlama2CBadInput(t *testing.T) {
	m := loadStories(t)
	_ = m
	good := []byte{}
	{
		// Rebuild the bytes of a tiny valid checkpoint to mutate.
		h := []int32{8, 16, 1, 2, 1, 10, 4}
		hd := 4
		floats := 10*8 + 2*8 + 8 + (8*8*2 + 4*8*2) + 3*16*8 + 4*hd
		good = make([]byte, 28+4*floats)
		for i, v := range h {
			putI32(good[4*i:], v)
		}
	}
	if _, err := ParseLlama2C(good); err != nil {
		t.Fatalf("valid tiny checkpoint: %v", err)
	}
	cases := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"short header", good[:20]},
		{"truncated", good[:len(good)-4]},
		{"too long", append(append([]byte{}, good...), 0, 0, 0, 0)},
		{"zero dim", withI32(good, 0, 0)},
		{"negative layers", withI32(good, 2, -3)},
		{"heads not dividing dim", withI32(good, 3, 3)},
		{"kv heads not dividing heads", withI32(good, 4, 3)},
		{"huge seq", withI32(good, 6, 1<<30)},
		{"gguf magic", append([]byte("GGUF"), good[4:]...)},
		{"versioned v2", append([]byte{0x32, 0x34, 0x6b, 0x61, 2, 0, 0, 0}, make([]byte, 300)...)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			buf := make([]byte, len(c.data)) // aligned copy
			copy(buf, c.data)
			if _, err := ParseLlama2C(buf); err == nil {
				t.Fatal("accepted")
			} else {
				t.Log(err)
			}
		})
	}
}

func putI32(b []byte, v int32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func withI32(b []byte, field int, v int32) []byte {
	c := append([]byte{}, b...)
	putI32(c[4*field:], v)
	return c
}

// BenchmarkPrefill and BenchmarkDecode measure stories260K: tokens/s are
// reported as a custom metric.
func BenchmarkPrefill(b *testing.B) {
	m := loadStories(b)
	toks := make([]int, 256)
	for i := range toks {
		toks[i] = (i*7919 + 3) % m.Vocab
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		seq, _ := m.NewStandaloneSequence(KVOptions{})
		if _, err := seq.Forward(toks, false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(toks)*b.N)/b.Elapsed().Seconds(), "tok/s")
}

func BenchmarkDecode(b *testing.B) {
	m := loadStories(b)
	seq, _ := m.NewStandaloneSequence(KVOptions{})
	ctx := 256
	toks := make([]int, ctx)
	if _, err := seq.Forward(toks, false); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if seq.Pos() >= m.CtxLen {
			seq.Truncate(ctx)
		}
		if _, err := seq.Forward([]int{i % m.Vocab}, false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
}

// TestGoldenPagedCaches: the golden greedy ids hold with paged caches of
// several block sizes and with f16 storage.
func TestGoldenPagedCaches(t *testing.T) {
	m := loadStories(t)
	f16, _ := codec.Parse("f16", codec.Keys)
	cases := []struct {
		name string
		opt  KVOptions
	}{
		{"f32 B=1", KVOptions{BlockTokens: 1}},
		{"f32 B=16", KVOptions{BlockTokens: 16}},
		{"f32 B=64", KVOptions{BlockTokens: 64}},
		{"f16 B=16", KVOptions{BlockTokens: 16, K: f16, V: f16}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seq, err := m.NewStandaloneSequence(c.opt)
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			logits, err := seq.Forward(goldenPrompt, false)
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range goldenIDs {
				got := argmax(logits)
				if got != want {
					t.Fatalf("token %d: %d, want %d", i, got, want)
				}
				if logits, err = seq.Forward([]int{got}, false); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestPrefixReuse: a second sequence with the same long prompt takes its
// blocks from the prefix cache and computes only the tail, with the same
// logits.
func TestPrefixReuse(t *testing.T) {
	m := loadStories(t)
	pool, err := kvcache.NewPool(kvcache.PoolConfig{Layout: m.KVLayout(), BlockTokens: 16, Tokens: 2 * m.CtxLen})
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int, 200)
	for i := range prompt {
		prompt[i] = (i*31 + 7) % m.Vocab
	}
	run := func() ([]float32, *Sequence, int) {
		c := pool.NewSequence()
		hit := c.MatchPrefix(prompt, 0)
		seq, err := m.NewSequence(c)
		if err != nil {
			t.Fatal(err)
		}
		logits, err := seq.Forward(prompt[hit:], false)
		if err != nil {
			t.Fatal(err)
		}
		c.RegisterPrefix(prompt, 0)
		return append([]float32(nil), logits...), seq, hit
	}
	first, s1, hit1 := run()
	second, s2, hit2 := run()
	if hit1 != 0 || s1.Computed != 200 {
		t.Fatalf("first run: hit %d computed %d", hit1, s1.Computed)
	}
	if hit2 != 192 || s2.Computed != 8 {
		t.Fatalf("second run: hit %d computed %d, want 192 and 8", hit2, s2.Computed)
	}
	for i := range first {
		if math.Abs(float64(first[i]-second[i])) > 1e-6 {
			t.Fatalf("logit %d differs: %v vs %v", i, first[i], second[i])
		}
	}
	s1.Close()
	s2.Close()
	if u := pool.Usage(); u.Used != 0 {
		t.Fatalf("%d blocks still used", u.Used)
	}
}

// TestRotate: rotating a key computed at position p by d equals the key
// computed at position p+d (RoPE is a rotation by angle·position).
func TestRotate(t *testing.T) {
	m := loadStories(t)
	for _, style := range []RopeStyle{RopeInterleaved, RopeNeoX} {
		m.Rope = style
		x := make([]float32, m.HeadDim)
		for i := range x {
			x[i] = float32(i) - 3.5
		}
		cos, sin := make([]float32, m.HeadDim/2), make([]float32, m.HeadDim/2)
		at := func(p int) []float32 {
			y := append([]float32(nil), x...)
			m.angles(cos, sin, p)
			m.ropeRows(y, cos, sin, 1, 1)
			return y
		}
		for _, c := range []struct{ p, d int }{{5, 3}, {100, -40}, {7, -7}, {0, 511}} {
			got := at(c.p)
			m.Rotate(got, 0, c.d)
			want := at(c.p + c.d)
			for i := range got {
				if math.Abs(float64(got[i]-want[i])) > 2e-5 {
					t.Fatalf("%s: rotate(%d)+%d differs at %d: %v vs %v", style, c.p, c.d, i, got[i], want[i])
				}
			}
		}
	}
	m.Rope = RopeInterleaved
}
