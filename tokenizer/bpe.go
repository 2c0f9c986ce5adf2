package tokenizer

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// BPE is a GPT-2-style byte-level BPE tokenizer (GGUF tokenizer.ggml.model =
// "gpt2": Llama 3, Qwen 2, SmolLM). Encoding goes as llama.cpp and Hugging
// Face tokenizers do:
//
//  1. special tokens (control and user-defined pieces) are cut out of the
//     text first, leftmost and then longest match; control tokens only when
//     specials are parsed (Encode does);
//  2. each remaining fragment is split into words by the pre-tokenizer
//     named in tokenizer.ggml.pre (see Pretokenizers);
//  3. each word's bytes become byte tokens and are merged by rank (lowest
//     first, the leftmost of equal ranks), unless the pre-tokenizer ignores
//     merges (llama-bpe) and the whole word is a token.
//
// Pieces are stored as raw bytes (the GPT-2 byte-to-unicode mapping of the
// vocabulary is undone when building). A BPE is immutable and safe for
// concurrent use.
type BPE struct {
	pieces   []string // raw bytes of normal and byte tokens; text of the others
	types    []int32
	bos, eos int
	addBOS   bool
	addEOS   bool
	pre      string
	split    func(text string, emit func(word string))
	ignore   bool // ignore_merges: a word that is a token is that token

	vocab   map[string]int32 // raw bytes -> id of the tokens text can become
	merges  map[uint64]bpeMerge
	byteTok [256]int32 // token of each single byte; -1 when the vocabulary has none

	// Specials matched before pre-tokenization, by first byte, longest first.
	specials [256][]int32
}

var _ Tokenizer = (*BPE)(nil)

type bpeMerge struct {
	rank int32
	id   int32
}

// BPEConfig describes a byte-level BPE vocabulary as GGUF stores it.
type BPEConfig struct {
	Tokens []string // tokenizer.ggml.tokens: byte-level pieces (GPT-2 mapping, "Ġ" is a space)
	Types  []int32  // tokenizer.ggml.token_type; nil: all normal except BOS/EOS (control)
	Merges []string // tokenizer.ggml.merges: "left right" pairs in rank order
	Pre    string   // tokenizer.ggml.pre: pre-tokenizer name ("" means "default")
	BOS    int      // -1: none
	EOS    int      // -1: none
	AddBOS bool     // tokenizer.ggml.add_bos_token
	AddEOS bool     // tokenizer.ggml.add_eos_token
}

// Pretokenizers lists the supported tokenizer.ggml.pre names.
var Pretokenizers = []string{"llama-bpe", "llama3", "llama-v3", "qwen2", "smollm", "gpt-2", "gpt2", "default"}

// NewBPE builds a byte-level BPE tokenizer.
func NewBPE(c BPEConfig) (*BPE, error) {
	n := len(c.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("tokenizer: empty vocabulary")
	}
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("tokenizer: vocabulary of %d tokens is too large", n)
	}
	for _, x := range []struct {
		name string
		id   int
	}{{"bos", c.BOS}, {"eos", c.EOS}} {
		if x.id < -1 || x.id >= n {
			return nil, fmt.Errorf("tokenizer: %s id %d out of range [-1, %d)", x.name, x.id, n)
		}
	}
	b := &BPE{bos: c.BOS, eos: c.EOS, addBOS: c.AddBOS && c.BOS >= 0, addEOS: c.AddEOS && c.EOS >= 0, pre: c.Pre}
	switch c.Pre {
	case "llama-bpe", "llama3", "llama-v3":
		b.split = func(t string, emit func(string)) { splitLlama3(t, 3, emit) }
		b.ignore = true
	case "qwen2":
		b.split = func(t string, emit func(string)) { splitLlama3(t, 1, emit) }
	case "smollm":
		b.split = splitDigitsGPT2
	case "gpt-2", "gpt2", "default", "":
		b.split = splitGPT2
	default:
		return nil, fmt.Errorf("tokenizer: pre-tokenizer %q is not supported (supported: %s)", c.Pre, strings.Join(Pretokenizers, ", "))
	}
	if c.Types == nil {
		b.types = make([]int32, n)
		for i := range b.types {
			b.types[i] = TypeNormal
		}
		for _, id := range []int{c.BOS, c.EOS} {
			if id >= 0 {
				b.types[id] = TypeControl
			}
		}
	} else if len(c.Types) != n {
		return nil, fmt.Errorf("tokenizer: %d token types for %d tokens", len(c.Types), n)
	} else {
		b.types = append([]int32(nil), c.Types...)
	}
	b.pieces = make([]string, n)
	b.vocab = make(map[string]int32, n)
	for i := range b.byteTok {
		b.byteTok[i] = -1
	}
	var specials []int32
	for i, p := range c.Tokens {
		switch t := b.types[i]; t {
		case TypeUndefined, TypeNormal, TypeByte:
			raw := byteLevelDecode(p)
			b.pieces[i] = raw
			if _, dup := b.vocab[raw]; !dup && raw != "" {
				b.vocab[raw] = int32(i)
			}
		case TypeControl, TypeUserDefined:
			b.pieces[i] = p
			if p != "" {
				specials = append(specials, int32(i))
			}
		case TypeUnknown, TypeUnused:
			b.pieces[i] = p
		default:
			return nil, fmt.Errorf("tokenizer: token %d has unknown type %d", i, t)
		}
	}
	for i := range b.byteTok {
		if id, ok := b.vocab[byteStrings[i]]; ok {
			b.byteTok[i] = id
		}
	}
	// Longest first, then lowest id: the order matches are tried in.
	sort.SliceStable(specials, func(x, y int) bool { return len(b.pieces[specials[x]]) > len(b.pieces[specials[y]]) })
	for _, id := range specials {
		f := b.pieces[id][0]
		b.specials[f] = append(b.specials[f], id)
	}
	b.merges = make(map[uint64]bpeMerge, len(c.Merges))
	for rank, m := range c.Merges {
		l, r, ok := splitMerge(m)
		if !ok {
			return nil, fmt.Errorf("tokenizer: merge %d %q is not two pieces separated by a space", rank, m)
		}
		lr, rr := byteLevelDecode(l), byteLevelDecode(r)
		li, ok1 := b.vocab[lr]
		ri, ok2 := b.vocab[rr]
		id, ok3 := b.vocab[lr+rr]
		if !ok1 || !ok2 || !ok3 {
			continue // a merge into or from a piece that is not a token never applies
		}
		k := pairKey(li, ri)
		if _, dup := b.merges[k]; !dup {
			b.merges[k] = bpeMerge{rank: int32(rank), id: id}
		}
	}
	return b, nil
}

// splitMerge splits "left right" at its single space (pieces never hold a
// plain space: the byte-level mapping writes it "Ġ"). A merge with more
// than one space splits at the first one after a non-empty left side.
func splitMerge(m string) (string, string, bool) {
	i := strings.IndexByte(m[min(1, len(m)):], ' ')
	if i < 0 {
		return "", "", false
	}
	i += min(1, len(m))
	l, r := m[:i], m[i+1:]
	if l == "" || r == "" {
		return "", "", false
	}
	return l, r, true
}

// VocabSize implements Tokenizer.
func (b *BPE) VocabSize() int { return len(b.pieces) }

// BOS implements Tokenizer.
func (b *BPE) BOS() int { return b.bos }

// EOS implements Tokenizer.
func (b *BPE) EOS() int { return b.eos }

// AddBOS reports whether the model expects BOS before a prompt
// (tokenizer.ggml.add_bos_token).
func (b *BPE) AddBOS() bool { return b.addBOS }

// AddEOS reports tokenizer.ggml.add_eos_token.
func (b *BPE) AddEOS() bool { return b.addEOS }

// Pre is the pre-tokenizer's name.
func (b *BPE) Pre() string { return b.pre }

// Type is the token type of id (TypeUndefined when out of range).
func (b *BPE) Type(id int) int32 {
	if id < 0 || id >= len(b.types) {
		return TypeUndefined
	}
	return b.types[id]
}

// Piece implements Tokenizer: the raw bytes of a normal token (" world"),
// the text of a special one ("<|eot_id|>").
func (b *BPE) Piece(id int) string {
	if id < 0 || id >= len(b.pieces) {
		return ""
	}
	return b.pieces[id]
}

// TokenID returns the id of the token whose Piece is p: a special token's
// text or a normal token's raw bytes.
func (b *BPE) TokenID(p string) (int, bool) {
	if p == "" {
		return 0, false
	}
	for _, id := range b.specials[p[0]] {
		if b.pieces[id] == p {
			return int(id), true
		}
	}
	id, ok := b.vocab[p]
	return int(id), ok
}

// Decode implements Tokenizer. Normal and byte tokens decode to their bytes,
// user-defined tokens to their text, control tokens (BOS, EOS, chat
// markers) to "".
func (b *BPE) Decode(prev, tok int) string {
	if tok < 0 || tok >= len(b.pieces) || b.types[tok] == TypeControl {
		return ""
	}
	return b.pieces[tok]
}

// DecodeAll implements Tokenizer.
func (b *BPE) DecodeAll(ids []int) string {
	var sb strings.Builder
	prev := -1
	for _, id := range ids {
		sb.WriteString(b.Decode(prev, id))
		prev = id
	}
	return sb.String()
}

// Encode implements Tokenizer, parsing special tokens in text.
func (b *BPE) Encode(text string, addBOS, addEOS bool) []int {
	return b.EncodeSpecial(text, addBOS, addEOS, true)
}

// EncodeSpecial encodes text; with special false only user-defined tokens
// are matched in it, and the text of control tokens is encoded as text.
func (b *BPE) EncodeSpecial(text string, addBOS, addEOS, special bool) []int {
	out := make([]int, 0, len(text)/3+2)
	if addBOS && b.bos >= 0 {
		out = append(out, b.bos)
	}
	var e bpeEncoder
	e.b = b
	if len(text) >= 4096 {
		e.cache = make(map[string][]int32)
	}
	start := 0
	for i := 0; i < len(text); {
		cands := b.specials[text[i]]
		id := int32(-1)
		for _, c := range cands {
			if !special && b.types[c] == TypeControl {
				continue
			}
			if strings.HasPrefix(text[i:], b.pieces[c]) {
				id = c
				break
			}
		}
		if id < 0 {
			i++
			continue
		}
		out = e.fragment(text[start:i], out)
		out = append(out, int(id))
		i += len(b.pieces[id])
		start = i
	}
	out = e.fragment(text[start:], out)
	if addEOS && b.eos >= 0 {
		out = append(out, b.eos)
	}
	return out
}

// bpeEncoder holds the scratch of one Encode call.
type bpeEncoder struct {
	b     *BPE
	cache map[string][]int32 // word -> ids, for long texts
	out   []int
	tok   []int32
	prev  []int32
	next  []int32
	heap  []bpeCand
	ids   []int32
}

type bpeCand struct {
	rank     int32
	left     int32 // slot of the left symbol
	right    int32 // slot of the right symbol when queued
	lid, rid int32 // the pair's ids when queued (stale check)
	merged   int32
}

func (a bpeCand) before(c bpeCand) bool {
	return a.rank < c.rank || (a.rank == c.rank && a.left < c.left)
}

func (e *bpeEncoder) fragment(text string, out []int) []int {
	if text == "" {
		return out
	}
	e.out = out
	e.b.split(text, e.word)
	return e.out
}

// word appends the ids of one pre-tokenized word to e.out.
func (e *bpeEncoder) word(w string) {
	b := e.b
	if b.ignore {
		if id, ok := b.vocab[w]; ok {
			e.out = append(e.out, int(id))
			return
		}
	}
	if len(w) == 1 {
		if id := b.byteTok[w[0]]; id >= 0 {
			e.out = append(e.out, int(id))
		}
		return
	}
	if e.cache != nil {
		if ids, ok := e.cache[w]; ok {
			for _, id := range ids {
				e.out = append(e.out, int(id))
			}
			return
		}
	}
	ids := e.merge(w)
	if e.cache != nil && len(w) <= 64 {
		e.cache[w] = append([]int32(nil), ids...)
	}
	for _, id := range ids {
		e.out = append(e.out, int(id))
	}
}

// merge runs the BPE merges over the bytes of w and returns the ids (valid
// until the next call).
func (e *bpeEncoder) merge(w string) []int32 {
	b := e.b
	e.tok = e.tok[:0]
	for i := 0; i < len(w); i++ {
		if id := b.byteTok[w[i]]; id >= 0 {
			e.tok = append(e.tok, id)
		}
	}
	n := len(e.tok)
	if n <= 1 {
		return e.tok
	}
	if cap(e.prev) < n {
		e.prev = make([]int32, n)
		e.next = make([]int32, n)
	}
	e.prev, e.next = e.prev[:n], e.next[:n]
	for i := range n {
		e.prev[i] = int32(i) - 1
		e.next[i] = int32(i) + 1
	}
	e.next[n-1] = -1
	e.heap = e.heap[:0]
	for i := 0; i+1 < n; i++ {
		e.consider(int32(i), int32(i+1))
	}
	for i := len(e.heap)/2 - 1; i >= 0; i-- {
		e.down(i)
	}
	for len(e.heap) > 0 {
		c := e.pop()
		l := c.left
		r := e.next[l]
		// Stale unless the left symbol is alive with the same right
		// neighbour and both still hold the queued ids.
		if e.tok[l] != c.lid || r < 0 || r != c.right || e.tok[r] != c.rid {
			continue
		}
		e.tok[l] = c.merged
		e.tok[r] = -1
		nr := e.next[r]
		e.next[l] = nr
		if nr >= 0 {
			e.prev[nr] = l
		}
		if p := e.prev[l]; p >= 0 && e.consider(p, l) {
			e.up(len(e.heap) - 1)
		}
		if nr >= 0 && e.consider(l, nr) {
			e.up(len(e.heap) - 1)
		}
	}
	e.ids = e.ids[:0]
	for i := int32(0); i >= 0; i = e.next[i] {
		e.ids = append(e.ids, e.tok[i])
	}
	return e.ids
}

func (e *bpeEncoder) consider(l, r int32) bool {
	m, ok := e.b.merges[pairKey(e.tok[l], e.tok[r])]
	if !ok {
		return false
	}
	e.heap = append(e.heap, bpeCand{rank: m.rank, left: l, lid: e.tok[l], rid: e.tok[r], merged: m.id, right: r})
	return true
}

func (e *bpeEncoder) pop() bpeCand {
	top, h := popMin(e.heap)
	e.heap = h
	return top
}

func (e *bpeEncoder) up(i int) { siftUp(e.heap, i) }

func (e *bpeEncoder) down(i int) { siftDown(e.heap, i) }

// GPT-2's byte-to-unicode mapping: printable bytes stand for themselves, the
// others (0–32, 127–160, 173) for U+0100 onwards in byte order.
var byteToRune, runeToByte = func() (bt [256]rune, rb map[rune]byte) {
	rb = make(map[rune]byte, 256)
	n := rune(0)
	for i := range 256 {
		if (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF) {
			bt[i] = rune(i)
		} else {
			bt[i] = 256 + n
			n++
		}
		rb[bt[i]] = byte(i)
	}
	return
}()

// byteLevelDecode undoes the byte-to-unicode mapping of a stored piece; a
// character outside the mapping stands for its own UTF-8 bytes.
func byteLevelDecode(p string) string {
	var buf []byte
	for i, r := range p {
		if c, ok := runeToByte[r]; ok && r != utf8.RuneError {
			if buf == nil {
				if r < utf8.RuneSelf && (i == 0 || isASCIIPrefix(p[:i])) {
					continue // still identical to p so far
				}
				buf = append(make([]byte, 0, len(p)), p[:i]...)
			}
			buf = append(buf, c)
			continue
		}
		if buf == nil {
			buf = append(make([]byte, 0, len(p)), p[:i]...)
		}
		buf = utf8.AppendRune(buf, r)
	}
	if buf == nil {
		return p
	}
	return string(buf)
}

func isASCIIPrefix(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// ByteLevelEncode applies GPT-2's byte-to-unicode mapping: the stored form
// of a piece of raw bytes.
func ByteLevelEncode(raw string) string {
	var sb strings.Builder
	for i := 0; i < len(raw); i++ {
		sb.WriteRune(byteToRune[raw[i]])
	}
	return sb.String()
}

// Character classes of the pre-tokenizers.
const (
	clsOther  = iota // none of the below (punctuation, symbols, marks, invalid bytes)
	clsLetter        // \p{L}
	clsNumber        // \p{N}
	clsSpace         // \s other than \r and \n
	clsNL            // \r or \n
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for i := range t {
		r := rune(i)
		switch {
		case r == '\r' || r == '\n':
			t[i] = clsNL
		case unicode.IsSpace(r):
			t[i] = clsSpace
		case unicode.IsLetter(r):
			t[i] = clsLetter
		case unicode.IsNumber(r):
			t[i] = clsNumber
		}
	}
	return
}()

// class returns the class and width of the character at s[i]. An invalid
// byte is a character of its own, of class other.
func class(s string, i int) (uint8, int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	switch {
	case r == utf8.RuneError && w <= 1:
		return clsOther, 1
	case unicode.IsLetter(r):
		return clsLetter, w
	case unicode.IsNumber(r):
		return clsNumber, w
	case unicode.IsSpace(r): // the White_Space property
		return clsSpace, w
	}
	return clsOther, w
}

// runOf returns the end of the run of characters of class cls from i.
func runOf(s string, i int, cls uint8) int {
	for i < len(s) {
		c, w := class(s, i)
		if c != cls {
			break
		}
		i += w
	}
	return i
}

// contraction returns the end of 's 't 're 've 'm 'll 'd at s[i] (s[i] ==
// '\”), or i. fold accepts upper-case letters too.
func contraction(s string, i int, fold bool) int {
	if i+1 >= len(s) {
		return i
	}
	lower := func(c byte) byte {
		if fold && c >= 'A' && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	var want byte
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		want = 'e'
	case 'l':
		want = 'l'
	default:
		return i
	}
	if i+2 < len(s) && lower(s[i+2]) == want {
		return i + 3
	}
	return i
}

// splitLlama3 is the Llama 3 pre-tokenizer (tokenizer.ggml.pre "llama-bpe";
// with maxDigits 1, Qwen 2's), hand-written from the regular expression
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// (each alternative tried in order at each position, as a backtracking
// engine does). The case folding of the contractions is ASCII, as in
// llama.cpp.
func splitLlama3(s string, maxDigits int, emit func(string)) {
	for i := 0; i < len(s); {
		end := llama3Match(s, i, maxDigits)
		emit(s[i:end])
		i = end
	}
}

func llama3Match(s string, i, maxDigits int) int {
	c0, w0 := class(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[i] == '\'' {
		if e := contraction(s, i, true); e > i {
			return e
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c0 == clsLetter {
		return runOf(s, i+w0, clsLetter)
	}
	if c0 != clsNL && c0 != clsNumber && i+w0 < len(s) {
		if c1, w1 := class(s, i+w0); c1 == clsLetter {
			return runOf(s, i+w0+w1, clsLetter)
		}
	}
	// \p{N}{1,3}
	if c0 == clsNumber {
		e := i + w0
		for k := 1; k < maxDigits && e < len(s); k++ {
			c, w := class(s, e)
			if c != clsNumber {
				break
			}
			e += w
		}
		return e
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if s[i] == ' ' {
		j++
	}
	if j < len(s) {
		if c, _ := class(s, j); c == clsOther {
			return otherThenNL(s, j)
		}
	}
	// Whitespace from here on: c0 is clsSpace or clsNL.
	end, lastNL, lastStart := i, -1, i
	for end < len(s) {
		c, w := class(s, end)
		if c != clsSpace && c != clsNL {
			break
		}
		if c == clsNL {
			lastNL = end + w
		}
		lastStart = end
		end += w
	}
	// \s*[\r\n]+
	if lastNL >= 0 {
		return lastNL
	}
	// \s+(?!\S)
	if end == len(s) {
		return end
	}
	if lastStart > i {
		return lastStart
	}
	// \s+
	return end
}

// otherThenNL returns the end of [^\s\p{L}\p{N}]+[\r\n]* starting at j.
func otherThenNL(s string, j int) int {
	e := runOf(s, j, clsOther)
	for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
		e++
	}
	return e
}

// splitGPT2 is GPT-2's pre-tokenizer:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func splitGPT2(s string, emit func(string)) {
	for i := 0; i < len(s); {
		end := gpt2Match(s, i)
		emit(s[i:end])
		i = end
	}
}

func gpt2Match(s string, i int) int {
	if s[i] == '\'' {
		if e := contraction(s, i, false); e > i {
			return e
		}
	}
	//  ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		j++
	}
	if c, w := class(s, j); c == clsLetter || c == clsNumber || c == clsOther {
		return runOf(s, j+w, c)
	}
	// \s+(?!\S)|\s+ (s[i] is whitespace)
	end, lastStart := i, i
	for end < len(s) {
		c, w := class(s, end)
		if c != clsSpace && c != clsNL {
			break
		}
		lastStart = end
		end += w
	}
	if end == len(s) || lastStart == i {
		return end
	}
	return lastStart
}

// splitDigitsGPT2 is SmolLM's pre-tokenizer: every \p{N} on its own, then
// GPT-2's split of the text between them.
func splitDigitsGPT2(s string, emit func(string)) {
	start := 0
	for i := 0; i < len(s); {
		c, w := class(s, i)
		if c != clsNumber {
			i += w
			continue
		}
		if start < i {
			splitGPT2(s[start:i], emit)
		}
		emit(s[i : i+w])
		i += w
		start = i
	}
	if start < len(s) {
		splitGPT2(s[start:], emit)
	}
}

// AddsBOS reports whether a prompt for tok should start with BOS: what the
// vocabulary says (GGUF tokenizer.ggml.add_bos_token, for BPE), else
// whether it has a BOS token at all.
func AddsBOS(tok Tokenizer) bool {
	if a, ok := tok.(interface{ AddBOS() bool }); ok {
		return a.AddBOS()
	}
	return tok.BOS() >= 0
}

// TokenID finds the token whose Piece is p (a special token's text such as
// "<|eot_id|>" or "</s>").
func TokenID(tok Tokenizer, p string) (int, bool) {
	if t, ok := tok.(interface{ TokenID(string) (int, bool) }); ok {
		return t.TokenID(p)
	}
	if p == "" {
		return 0, false
	}
	for i := range tok.VocabSize() {
		if tok.Piece(i) == p {
			return i, true
		}
	}
	return 0, false
}

// EncodeSpecial encodes text with the text of special tokens (control and
// user-defined pieces, such as "<s>" or "<|im_start|>") becoming those
// tokens, as llama.cpp does for prompts: how a rendered chat template is
// tokenized. For a SentencePiece vocabulary each piece of text between
// specials is encoded on its own (with the dummy-prefix space, as llama.cpp
// does after a special token).
func EncodeSpecial(tok Tokenizer, text string, addBOS, addEOS bool) []int {
	switch t := tok.(type) {
	case *BPE:
		return t.EncodeSpecial(text, addBOS, addEOS, true)
	case *SentencePiece:
		return t.encodeSpecial(text, addBOS, addEOS)
	}
	return tok.Encode(text, addBOS, addEOS)
}

func (s *SentencePiece) encodeSpecial(in string, addBOS, addEOS bool) []int {
	var specials []int
	text := func(id int) string {
		// llama2.c files store BOS and EOS as "\n<s>\n" and "\n</s>\n".
		if p := s.pieces[id]; s.types[id] == TypeControl && len(p) > 2 && p[0] == '\n' && p[len(p)-1] == '\n' {
			return p[1 : len(p)-1]
		}
		return s.pieces[id]
	}
	for i, p := range s.pieces {
		if (s.types[i] == TypeControl || s.types[i] == TypeUserDefined) && p != "" {
			specials = append(specials, i)
		}
	}
	sort.SliceStable(specials, func(x, y int) bool { return len(text(specials[x])) > len(text(specials[y])) })
	var out []int
	if addBOS && s.bos >= 0 {
		out = append(out, s.bos)
	}
	start := 0
	for i := 0; i < len(in); i++ {
		for _, id := range specials {
			p := text(id)
			if !strings.HasPrefix(in[i:], p) {
				continue
			}
			if start < i {
				out = append(out, s.Encode(in[start:i], false, false)...)
			}
			out = append(out, id)
			i += len(p) - 1
			start = i + 1
			break
		}
	}
	if start < len(in) {
		out = append(out, s.Encode(in[start:], false, false)...)
	}
	if addEOS && s.eos >= 0 {
		out = append(out, s.eos)
	}
	return out
}

// ReadGPT2Vocab reads a Hugging Face / OpenAI byte-level vocabulary:
// encoder.json (piece → id) and vocab.bpe (merges in rank order, one "a b"
// per line; a first line "#version…" is skipped). It returns the pieces in id
// order, for BPEConfig.Tokens (ids must be 0..n-1 without gaps), and the
// merges.
func ReadGPT2Vocab(encoderJSON, vocabBPE []byte) (tokens, merges []string, err error) {
	var enc map[string]int
	if err := json.Unmarshal(encoderJSON, &enc); err != nil {
		return nil, nil, fmt.Errorf("tokenizer: encoder.json: %w", err)
	}
	tokens = make([]string, len(enc))
	seen := make([]bool, len(enc))
	for p, id := range enc {
		if id < 0 || id >= len(enc) || seen[id] {
			return nil, nil, fmt.Errorf("tokenizer: encoder.json: ids are not 0..%d without gaps (id %d)", len(enc)-1, id)
		}
		seen[id] = true
		tokens[id] = p
	}
	lines := strings.Split(strings.TrimRight(string(vocabBPE), "\n"), "\n")
	if len(lines) > 0 && strings.HasPrefix(lines[0], "#version") {
		lines = lines[1:]
	}
	merges = make([]string, 0, len(lines))
	for _, l := range lines {
		if l = strings.TrimRight(l, "\r"); l != "" {
			merges = append(merges, l)
		}
	}
	return tokens, merges, nil
}

// ReadGPT2VocabDir reads dir/encoder.json and dir/vocab.bpe (see
// ReadGPT2Vocab) and appends specials after the regular pieces: the
// tokens, their types (TypeNormal, then TypeControl for the specials) and
// the merges, ready for BPEConfig or GGUF metadata.
func ReadGPT2VocabDir(dir string, specials []string) (tokens []string, types []int32, merges []string, err error) {
	enc, err := os.ReadFile(filepath.Join(dir, "encoder.json"))
	if err != nil {
		return nil, nil, nil, err
	}
	bpe, err := os.ReadFile(filepath.Join(dir, "vocab.bpe"))
	if err != nil {
		return nil, nil, nil, err
	}
	if tokens, merges, err = ReadGPT2Vocab(enc, bpe); err != nil {
		return nil, nil, nil, err
	}
	types = make([]int32, len(tokens), len(tokens)+len(specials))
	for i := range types {
		types[i] = TypeNormal
	}
	for _, sp := range specials {
		tokens = append(tokens, sp)
		types = append(types, TypeControl)
	}
	return tokens, types, merges, nil
}

// Llama3Specials are the texts of Llama 3.1's 256 special tokens, ids
// 128000 to 128255.
func Llama3Specials() []string {
	named := map[int]string{
		0: "<|begin_of_text|>", 1: "<|end_of_text|>", 4: "<|finetune_right_pad_id|>",
		6: "<|start_header_id|>", 7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>", 10: "<|python_tag|>",
	}
	out := make([]string, 256)
	r := 0
	for i := range out {
		if s, ok := named[i]; ok {
			out[i] = s
			continue
		}
		out[i] = fmt.Sprintf("<|reserved_special_token_%d|>", r)
		r++
	}
	return out
}
