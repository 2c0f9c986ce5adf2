package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

const llama3Dir = "models/llama3-tokenizer/"

var llama3Once struct {
	sync.Once
	tok *BPE
	err error
}

// llama3 is the Llama 3 vocabulary of ../shared/models/llama3-tokenizer with
// Llama 3.1's special tokens as ids 128000–128255.
func llama3(t testing.TB) *BPE {
	t.Helper()
	enc := sharedFile(t, llama3Dir+"encoder.json")
	merges := sharedFile(t, llama3Dir+"vocab.bpe")
	llama3Once.Do(func() {
		tokens, mlist, err := ReadGPT2Vocab(enc, merges)
		if err != nil {
			llama3Once.err = err
			return
		}
		types := make([]int32, len(tokens), len(tokens)+256)
		for i := range types {
			types[i] = TypeNormal
		}
		for _, s := range Llama3Specials() {
			tokens = append(tokens, s)
			types = append(types, TypeControl)
		}
		llama3Once.tok, llama3Once.err = NewBPE(BPEConfig{Tokens: tokens, Types: types, Merges: mlist,
			Pre: "llama-bpe", BOS: 128000, EOS: 128001, AddBOS: true})
	})
	if llama3Once.err != nil {
		t.Fatal(llama3Once.err)
	}
	return llama3Once.tok
}

func TestReadGPT2VocabKeepsHashMerges(t *testing.T) {
	tok := llama3(t)
	if tok.VocabSize() != 128256 {
		t.Fatalf("vocab %d", tok.VocabSize())
	}
	// "# #" is merge 558, a real merge (only "#version" lines are headers).
	if len(tok.merges) != 280147 {
		t.Errorf("%d merges, want 280147", len(tok.merges))
	}
}

// The known encodings of ../shared/models/llama3-tokenizer/README.md.
func TestBPELlama3Known(t *testing.T) {
	tok := llama3(t)
	cases := []struct {
		text string
		ids  []int
	}{
		{"hello world", []int{15339, 1917}},
		{"hello <|end_of_text|>", []int{15339, 220, 128001}},
		{"0", []int{15}},
		{"00", []int{410}},
		{"000", []int{931}},
		{"0000", []int{931, 15}},
		{"00000", []int{931, 410}},
		{"000000", []int{931, 931}},
		{strings.Repeat("0", 17), []int{931, 931, 931, 931, 931, 410}},
		{"<|begin_of_text|>A B!", []int{128000, 32, 426, 0}},
		{"<|begin_of_text|>A<|end_of_text|>B!", []int{128000, 32, 128001, 33, 0}},
	}
	for _, c := range cases {
		if got := tok.Encode(c.text, false, false); !slices.Equal(got, c.ids) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.ids)
		}
	}
	if got := tok.Encode("hello world", true, true); !slices.Equal(got, []int{128000, 15339, 1917, 128001}) {
		t.Errorf("with BOS and EOS: %v", got)
	}
	// Without special parsing the markers are text.
	if got := tok.EncodeSpecial("<|end_of_text|>", false, false, false); slices.Contains(got, 128001) || tok.DecodeAll(got) != "<|end_of_text|>" {
		t.Errorf("no special parsing: %v", got)
	}
	if !tok.AddBOS() || !AddsBOS(tok) {
		t.Error("add_bos not reported")
	}
	if id, ok := TokenID(tok, "<|eot_id|>"); !ok || id != 128009 {
		t.Errorf("TokenID(<|eot_id|>) = %d %v", id, ok)
	}
}

func collect(split func(string, func(string)), s string) []string {
	var out []string
	split(s, func(w string) { out = append(out, w) })
	return out
}

func llama3Split(s string) []string {
	return collect(func(t string, e func(string)) { splitLlama3(t, 3, e) }, s)
}

func TestLlama3PreTokenizerKnown(t *testing.T) {
	cases := []struct {
		text  string
		words []string
	}{
		{"Hello World!", []string{"Hello", " World", "!"}},
		{"I'm don't won't", []string{"I", "'m", " don", "'t", " won", "'t"}},
		{"In 2024 there are 366 days", []string{"In", " ", "202", "4", " there", " are", " ", "366", " days"}},
		{"Hello!! ...world", []string{"Hello", "!!", " ...", "world"}},
		{"Hello    World", []string{"Hello", "   ", " World"}},
		{"Hello\nWorld", []string{"Hello", "\n", "World"}},
	}
	for _, c := range cases {
		if got := llama3Split(c.text); !slices.Equal(got, c.words) {
			t.Errorf("split(%q) = %q, want %q", c.text, got, c.words)
		}
	}
}

// refSplit is the pre-tokenizer regular expression run by a naive
// backtracking matcher built from Go regexps: at each position, the
// alternatives are tried in order, each anchored and greedy with
// backtracking emulated by trying ever shorter matches (which is what
// Go's leftmost-first semantics give for a single anchored alternative),
// and the negative look-ahead of \s+(?!\S) checked by hand.
type refAlt struct {
	re        *regexp.Regexp
	lookahead bool // (?!\S) after the match
}

func refSplitter(alts []string) func(string) []string {
	var res []refAlt
	for _, a := range alts {
		la := strings.HasSuffix(a, `(?!\S)`)
		a = strings.TrimSuffix(a, `(?!\S)`)
		res = append(res, refAlt{regexp.MustCompile(`^(?:` + a + `)`), la})
	}
	return func(s string) []string {
		var out []string
		for i := 0; i < len(s); {
			end := -1
			for _, a := range res {
				if !a.lookahead {
					if m := a.re.FindStringIndex(s[i:]); m != nil && m[1] > 0 {
						end = i + m[1]
						break
					}
					continue
				}
				// \s+(?!\S): the longest whitespace prefix not followed by
				// a non-space.
				m := a.re.FindStringIndex(s[i:])
				if m == nil {
					continue
				}
				for e := i + m[1]; e > i; {
					if e == len(s) {
						end = e
						break
					}
					r, _ := utf8.DecodeRuneInString(s[e:])
					if unicode.IsSpace(r) {
						end = e
						break
					}
					_, w := utf8.DecodeLastRuneInString(s[i:e])
					e -= w
				}
				if end >= 0 {
					break
				}
			}
			if end < 0 {
				_, w := utf8.DecodeRuneInString(s[i:])
				end = i + w
			}
			out = append(out, s[i:end])
			i = end
		}
		return out
	}
}

// Go's \s is ASCII only; the pre-tokenizers' \s is Unicode White_Space.
const ws = `[\p{Z}\t\n\v\f\r\x{85}]`

var refLlama3 = refSplitter([]string{
	`'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]`,
	`[^\r\n\pL\pN]?\pL+`,
	`\pN{1,3}`,
	` ?[^\p{Z}\t\n\v\f\r\x{85}\pL\pN]+[\r\n]*`,
	ws + `*[\r\n]+`,
	ws + `+(?!\S)`,
	ws + `+`,
})

var refQwen2 = refSplitter([]string{
	`'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]`,
	`[^\r\n\pL\pN]?\pL+`,
	`\pN`,
	` ?[^\p{Z}\t\n\v\f\r\x{85}\pL\pN]+[\r\n]*`,
	ws + `*[\r\n]+`,
	ws + `+(?!\S)`,
	ws + `+`,
})

var refGPT2 = refSplitter([]string{
	`'s|'t|'re|'ve|'m|'ll|'d`,
	` ?\pL+`,
	` ?\pN+`,
	` ?[^\p{Z}\t\n\v\f\r\x{85}\pL\pN]+`,
	ws + `+(?!\S)`,
	ws + `+`,
})

func refSmolLM(s string) []string {
	var out []string
	start := 0
	for i, r := range s {
		if unicode.IsNumber(r) {
			if start < i {
				out = append(out, refGPT2(s[start:i])...)
			}
			out = append(out, string(r))
			start = i + utf8.RuneLen(r)
		}
	}
	if start < len(s) {
		out = append(out, refGPT2(s[start:])...)
	}
	return out
}

// randomPreText mixes the characters the pre-tokenizers distinguish.
func randomPreText(r *rand.Rand, n int) string {
	atoms := []string{"a", "B", "é", "ß", "语", "ж", "1", "23", "٣", "½", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000",
		"'", "'s", "'S", "'ll", "'Re", "'ve", "'d", "'x", "!", ".", ",", "…", "🙂", "\u0301", "-", "$", "\x0b", "\u2028"}
	var b strings.Builder
	for range n {
		b.WriteString(atoms[r.IntN(len(atoms))])
	}
	return b.String()
}

func TestPreTokenizersMatchRegexp(t *testing.T) {
	splitters := []struct {
		name string
		got  func(string, func(string))
		ref  func(string) []string
	}{
		{"llama3", func(s string, e func(string)) { splitLlama3(s, 3, e) }, refLlama3},
		{"qwen2", func(s string, e func(string)) { splitLlama3(s, 1, e) }, refQwen2},
		{"gpt2", splitGPT2, refGPT2},
		{"smollm", splitDigitsGPT2, refSmolLM},
	}
	r := rand.New(rand.NewPCG(1, 2))
	texts := []string{"", " ", "  ", "a", " a", "a ", "'", "''s", "x'S", "\n", " \n ", "\t\ta", "1234567", " 12", "  !", " !\n\n", "a\r\n\r\nb"}
	for range 3000 {
		texts = append(texts, randomPreText(r, 1+r.IntN(12)))
	}
	for _, sp := range splitters {
		for _, text := range texts {
			got := collect(sp.got, text)
			want := sp.ref(text)
			if text == "" {
				want = nil
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: split(%q) = %q, regexp gives %q", sp.name, text, got, want)
			}
		}
	}
}

func TestBPERoundTrips(t *testing.T) {
	tok := llama3(t)
	texts := []string{"hello", "hello ", "hello  ", " hello", " hello ", " hello  ", "hello world", "请考试我的软件！12345"}
	for b := 1; b <= 0xff; b++ {
		texts = append(texts, string([]byte{byte(b)}))
	}
	texts = append(texts, "\xff\xfe invalid \xc3", "tabs\t\tand\r\nnewlines\n\n\n", strings.Repeat(" ", 5000)+"x", strings.Repeat("ab", 3000))
	for _, text := range texts {
		ids := tok.Encode(text, false, false)
		if got := tok.DecodeAll(ids); got != text {
			t.Errorf("round trip %q -> %v -> %q", text, ids, got)
		}
	}
}

func TestBPERoundTripFiles(t *testing.T) {
	tok := llama3(t)
	for _, f := range textFiles {
		text := string(sharedFile(t, f))
		start := time.Now()
		ids := tok.Encode(text, true, false)
		el := time.Since(start)
		t.Logf("%s: %d bytes, %d tokens in %v", f, len(text), len(ids), el)
		if got := tok.DecodeAll(ids); got != text {
			t.Fatalf("%s: round trip differs", f)
		}
	}
}

// refBPE is the textbook merge loop: repeatedly merge the lowest-ranked
// adjacent pair (the leftmost of equal ranks).
func refBPE(b *BPE, word string) []int {
	var syms []int32
	for i := 0; i < len(word); i++ {
		syms = append(syms, b.byteTok[word[i]])
	}
	for {
		best, at := int32(-1), -1
		for i := 0; i+1 < len(syms); i++ {
			if m, ok := b.merges[pairKey(syms[i], syms[i+1])]; ok && (at < 0 || m.rank < best) {
				best, at = m.rank, i
			}
		}
		if at < 0 {
			break
		}
		m := b.merges[pairKey(syms[at], syms[at+1])]
		syms = append(syms[:at+1], syms[at+2:]...)
		syms[at] = m.id
	}
	out := make([]int, len(syms))
	for i, s := range syms {
		out[i] = int(s)
	}
	return out
}

func TestBPEMergesMatchReference(t *testing.T) {
	tok := llama3(t)
	text := string(sharedFile(t, sherlock))
	words := map[string]bool{}
	splitLlama3(text[:200000], 3, func(w string) { words[w] = true })
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		words[randomPreText(r, 1+r.IntN(8))] = true
	}
	var e bpeEncoder
	e.b = tok
	for w := range words {
		got := e.merge(w)
		want := refBPE(tok, w)
		if len(got) != len(want) {
			t.Fatalf("%q: %v, reference %v", w, got, want)
		}
		for i := range got {
			if int(got[i]) != want[i] {
				t.Fatalf("%q: %v, reference %v", w, got, want)
			}
		}
	}
}

func TestBPEIgnoreMerges(t *testing.T) {
	// A word that is a token is that token under llama-bpe, even where the
	// merges would not build it; qwen2 merges.
	tokens := []string{"a", "b", "c", "ab", "abc"}
	merges := []string{"a b"}
	for _, c := range []struct {
		pre  string
		want []int
	}{{"llama-bpe", []int{4}}, {"qwen2", []int{3, 2}}} {
		tok, err := NewBPE(BPEConfig{Tokens: tokens, Merges: merges, Pre: c.pre, BOS: -1, EOS: -1})
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.Encode("abc", false, false); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.pre, got, c.want)
		}
	}
}

func TestBPEQwen2Digits(t *testing.T) {
	tokens := []string{"1", "2", "3", "12", "Ġ", "a"}
	tok, err := NewBPE(BPEConfig{Tokens: tokens, Merges: []string{"1 2"}, Pre: "qwen2", BOS: -1, EOS: -1})
	if err != nil {
		t.Fatal(err)
	}
	// Qwen 2 splits digits one by one, so "12" never merges.
	if got := tok.Encode("123", false, false); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("qwen2 digits: %v", got)
	}
	if tok.AddBOS() {
		t.Error("no BOS token: AddBOS must be false")
	}
}

func TestBPEErrors(t *testing.T) {
	cases := []struct {
		c    BPEConfig
		want string
	}{
		{BPEConfig{BOS: -1, EOS: -1, Pre: "llama-bpe"}, "empty vocabulary"},
		{BPEConfig{Tokens: []string{"a"}, BOS: -1, EOS: -1, Pre: "tekken-9"}, `pre-tokenizer "tekken-9" is not supported`},
		{BPEConfig{Tokens: []string{"a"}, BOS: 3, EOS: -1}, "bos id 3 out of range"},
		{BPEConfig{Tokens: []string{"a"}, Types: []int32{1, 1}, BOS: -1, EOS: -1}, "2 token types for 1 tokens"},
		{BPEConfig{Tokens: []string{"a"}, Types: []int32{9}, BOS: -1, EOS: -1}, "unknown type 9"},
		{BPEConfig{Tokens: []string{"a"}, Merges: []string{"ab"}, BOS: -1, EOS: -1}, "is not two pieces"},
	}
	for _, c := range cases {
		_, err := NewBPE(c.c)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.c.Pre, err, c.want)
		}
	}
}

func TestByteLevelMapping(t *testing.T) {
	for b := range 256 {
		raw := string([]byte{byte(b)})
		if got := byteLevelDecode(ByteLevelEncode(raw)); got != raw {
			t.Fatalf("byte %#x: %q", b, got)
		}
	}
	if ByteLevelEncode(" \n") != "ĠĊ" {
		t.Errorf("space/newline: %q", ByteLevelEncode(" \n"))
	}
}

func TestEncodeSpecialSentencePiece(t *testing.T) {
	tok := llama2(t)
	got := EncodeSpecial(tok, "<s>[INST] hi [/INST]", false, false)
	want := append([]int{1}, tok.Encode("[INST] hi [/INST]", false, false)...)
	if !slices.Equal(got, want) {
		t.Errorf("EncodeSpecial = %v, want %v", got, want)
	}
	got = EncodeSpecial(tok, "a</s>", false, false)
	if want := append(tok.Encode("a", false, false), 2); !slices.Equal(got, want) {
		t.Errorf("EncodeSpecial = %v, want %v", got, want)
	}
}

func TestBPEConcurrent(t *testing.T) {
	tok := llama3(t)
	text := string(sharedFile(t, sherlock))[:50000]
	want := tok.Encode(text, false, false)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := tok.Encode(text, false, false); !slices.Equal(got, want) {
				t.Errorf("goroutine %d differs", i)
			}
		}()
	}
	wg.Wait()
}

func FuzzBPERoundTrip(f *testing.F) {
	tok := llama3(f)
	f.Add("hello <|end_of_text|> world 12345")
	f.Add("\xff\x00 'S 'll\r\n\n  x")
	f.Fuzz(func(t *testing.T, text string) {
		ids := tok.EncodeSpecial(text, false, false, false)
		if got := tok.DecodeAll(ids); got != text {
			t.Fatalf("round trip %q -> %q", text, got)
		}
	})
}

func BenchmarkBPEWarAndPeace(b *testing.B) {
	tok := llama3(b)
	text := string(sharedFile(b, warAndPeace))
	b.SetBytes(int64(len(text)))
	var n int
	for b.Loop() {
		n = len(tok.Encode(text, true, false))
	}
	b.ReportMetric(float64(n), "tokens")
}

func BenchmarkBPEPrompt(b *testing.B) {
	tok := llama3(b)
	text := "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text, true, false)
	}
}

var _ = fmt.Sprint
