package tokenizer

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// SentencePiece is a SentencePiece-style BPE tokenizer with byte fallback,
// encoding exactly as llama2.c's run.c encode does (and as llama.cpp does
// for GGUF tokenizer.ggml.model = "llama", on ordinary text):
//
//  1. optionally BOS;
//  2. if the text is non-empty, the dummy-prefix piece " ";
//  3. each UTF-8 code point as its piece, or else each of its bytes as the
//     <0xNN> byte token (an invalid byte is a code point of its own here);
//  4. repeatedly merge the adjacent pair whose concatenated pieces form the
//     piece of highest score (ties: the leftmost pair), until none forms one;
//  5. optionally EOS.
//
// run.c does step 4 in O(n²); this implementation uses a linked list and a
// heap, O(n log n), per run of symbols that merges could join, with
// identical results. Pieces are held with a plain
// space where SentencePiece writes U+2581 "▁".
//
// Control, unknown and unused tokens are never produced from text, neither
// by lookup nor by merging. Byte tokens are produced by byte fallback and,
// as in run.c and llama.cpp, also by a merge whose concatenation spells
// "<0xNN>". A merge whose piece scores NaN or at most -1e10 never happens
// (run.c starts its search at -1e10).
//
// A SentencePiece is immutable and safe for concurrent use.
type SentencePiece struct {
	pieces        []string // internal form: ' ' rather than '▁'
	scores        []float32
	types         []int32
	bos, eos, unk int

	vocab map[string]int32 // pieces that text can become
	// merges maps a pair of ids (pairKey) to the id of the piece their
	// pieces spell together, for every pair a merge can join.
	merges map[uint64]int32
	// adjacent[x] has bit y set when some piece that a merge can produce
	// holds byte x followed by byte y. Where it is clear for the last byte
	// of one initial symbol and the first byte of the next, no merge ever
	// joins them, and the two sides are encoded independently.
	adjacent [256][4]uint64
	byteTok  [256]int32 // byte fallback id per byte value; -1: dropped
	byteVal  []int16    // byte value of a byte token, else -1
}

var _ Tokenizer = (*SentencePiece)(nil)

// mergeFloor is run.c's initial best_score: only pieces scoring above it are
// ever merged into.
const mergeFloor = -1e10

// NewSentencePiece builds a tokenizer from GGUF-style metadata
// (tokenizer.ggml.tokens, .scores, .token_type, .bos_token_id,
// .eos_token_id, .unknown_token_id). Pieces use U+2581 "▁" for a space.
// scores may be nil (all zero); types may be nil, in which case pieces of
// the form <0xNN> are byte tokens, unk is the unknown token, bos and eos are
// control tokens and all others are normal. bos, eos and unk may be -1 for
// "none". A byte with no <0xNN> token falls back to unk, or is dropped when
// unk is -1.
func NewSentencePiece(pieces []string, scores []float32, types []int32, bos, eos, unk int) (*SentencePiece, error) {
	internal := make([]string, len(pieces))
	for i, p := range pieces {
		internal[i] = strings.ReplaceAll(p, "▁", " ")
	}
	return newSentencePiece(internal, scores, types, bos, eos, unk)
}

// newSentencePiece takes ownership of its slices; pieces are in internal
// form.
func newSentencePiece(pieces []string, scores []float32, types []int32, bos, eos, unk int) (*SentencePiece, error) {
	n := len(pieces)
	if n == 0 {
		return nil, fmt.Errorf("tokenizer: empty vocabulary")
	}
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("tokenizer: vocabulary of %d tokens is too large", n)
	}
	if scores == nil {
		scores = make([]float32, n)
	} else if len(scores) != n {
		return nil, fmt.Errorf("tokenizer: %d scores for %d tokens", len(scores), n)
	} else {
		scores = append([]float32(nil), scores...)
	}
	for _, x := range []struct {
		name string
		id   int
	}{{"bos", bos}, {"eos", eos}, {"unk", unk}} {
		if x.id < -1 || x.id >= n {
			return nil, fmt.Errorf("tokenizer: %s id %d out of range [-1, %d)", x.name, x.id, n)
		}
	}
	s := &SentencePiece{
		pieces:  pieces,
		scores:  scores,
		bos:     bos,
		eos:     eos,
		unk:     unk,
		vocab:   make(map[string]int32, n),
		byteVal: make([]int16, n),
	}
	if types == nil {
		types = make([]int32, n)
		for i, p := range pieces {
			types[i] = TypeNormal
			if _, ok := parseByteToken(p); ok {
				types[i] = TypeByte
			}
		}
		for _, id := range []int{bos, eos} {
			if id >= 0 {
				types[id] = TypeControl
			}
		}
		if unk >= 0 {
			types[unk] = TypeUnknown
		}
	} else if len(types) != n {
		return nil, fmt.Errorf("tokenizer: %d token types for %d tokens", len(types), n)
	} else {
		types = append([]int32(nil), types...)
	}
	s.types = types
	for i := range s.byteTok {
		s.byteTok[i] = -1
	}
	for i, p := range pieces {
		s.byteVal[i] = -1
		switch t := types[i]; t {
		case TypeByte:
			b, ok := parseByteToken(p)
			if !ok {
				return nil, fmt.Errorf("tokenizer: token %d is of type byte but its piece %q is not <0xNN>", i, p)
			}
			s.byteVal[i] = int16(b)
			if s.byteTok[b] < 0 {
				s.byteTok[b] = int32(i)
			}
		case TypeUndefined, TypeNormal, TypeUserDefined:
		case TypeUnknown, TypeControl, TypeUnused:
			continue // never produced from text
		default:
			return nil, fmt.Errorf("tokenizer: token %d has unknown type %d", i, t)
		}
		if p == "" {
			continue
		}
		if _, dup := s.vocab[p]; !dup { // the lowest id wins
			s.vocab[p] = int32(i)
		}
		if scores[i] > mergeFloor {
			for k := 0; k+1 < len(p); k++ {
				s.adjacent[p[k]][p[k+1]>>6] |= 1 << (p[k+1] & 63)
			}
		}
	}
	s.buildMerges()
	if unk >= 0 {
		for b := range s.byteTok {
			if s.byteTok[b] < 0 {
				s.byteTok[b] = int32(unk)
			}
		}
	}
	return s, nil
}

// buildMerges fills s.merges: for each piece a merge can produce and each
// way of splitting it in two, every pair of ids whose pieces are the halves.
// Any id may appear on either side (a symbol can be an unk or a duplicate
// piece), so this equals looking up the concatenated pieces in s.vocab.
func (s *SentencePiece) buildMerges() {
	byPiece := make(map[string][]int32, len(s.pieces))
	for i, p := range s.pieces {
		byPiece[p] = append(byPiece[p], int32(i))
	}
	s.merges = make(map[uint64]int32)
	for p, id := range s.vocab {
		if !(s.scores[id] > mergeFloor) { // also excludes NaN
			continue
		}
		for k := 1; k < len(p); k++ {
			left, ok := byPiece[p[:k]]
			if !ok {
				continue
			}
			for _, b := range byPiece[p[k:]] {
				for _, a := range left {
					s.merges[pairKey(a, b)] = id
				}
			}
		}
	}
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// parseByteToken recognizes a byte-token piece "<0xNN>" (hex, either case).
func parseByteToken(p string) (byte, bool) {
	if len(p) != 6 || p[:3] != "<0x" || p[5] != '>' {
		return 0, false
	}
	hi, ok1 := unhex(p[3])
	lo, ok2 := unhex(p[4])
	return hi<<4 | lo, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// VocabSize implements Tokenizer.
func (s *SentencePiece) VocabSize() int { return len(s.pieces) }

// BOS implements Tokenizer.
func (s *SentencePiece) BOS() int { return s.bos }

// EOS implements Tokenizer.
func (s *SentencePiece) EOS() int { return s.eos }

// Unk is the unknown-token id, or -1.
func (s *SentencePiece) Unk() int { return s.unk }

// Piece implements Tokenizer. It returns the piece as stored, with a space
// for "▁" (for a llama2.c file, BOS is "\n<s>\n").
func (s *SentencePiece) Piece(id int) string {
	if id < 0 || id >= len(s.pieces) {
		return ""
	}
	return s.pieces[id]
}

// byteStrings holds the one-byte string of every byte value.
var byteStrings = func() (t [256]string) {
	for i := range t {
		t[i] = string([]byte{byte(i)})
	}
	return
}()

// Decode implements Tokenizer with run.c semantics: a byte token becomes its
// raw byte, and a piece following BOS loses one leading space. Control
// tokens (BOS, EOS) decode to "", ids out of range too; unknown and unused
// tokens decode to their piece.
func (s *SentencePiece) Decode(prev, tok int) string {
	if tok < 0 || tok >= len(s.pieces) {
		return ""
	}
	if b := s.byteVal[tok]; b >= 0 {
		return byteStrings[b]
	}
	if s.types[tok] == TypeControl {
		return ""
	}
	p := s.pieces[tok]
	if prev == s.bos && prev >= 0 && len(p) > 0 && p[0] == ' ' {
		p = p[1:]
	}
	return p
}

// DecodeAll implements Tokenizer.
func (s *SentencePiece) DecodeAll(ids []int) string {
	var b strings.Builder
	prev := -1
	for _, id := range ids {
		b.WriteString(s.Decode(prev, id))
		prev = id
	}
	return b.String()
}

// Export returns the vocabulary in GGUF form: pieces with "▁" for a space,
// scores, and token types. The llama2.c control pieces "\n<s>\n" and
// "\n</s>\n" (as BOS and EOS) become "<s>" and "</s>". NewSentencePiece on
// the result, with the same BOS, EOS and Unk ids, encodes and decodes
// exactly as s does.
func (s *SentencePiece) Export() (pieces []string, scores []float32, types []int32) {
	pieces = make([]string, len(s.pieces))
	for i, p := range s.pieces {
		if s.types[i] == TypeControl {
			switch {
			case i == s.bos && p == "\n<s>\n":
				p = "<s>"
			case i == s.eos && p == "\n</s>\n":
				p = "</s>"
			}
		}
		pieces[i] = strings.ReplaceAll(p, " ", "▁")
	}
	return pieces, append([]float32(nil), s.scores...), append([]int32(nil), s.types...)
}

// Encode implements Tokenizer.
func (s *SentencePiece) Encode(text string, addBOS, addEOS bool) []int {
	var e encoder
	e.init(s, len(text)+1)
	if text != "" {
		e.segment(" ") // the dummy prefix
		e.segment(text)
	}

	out := make([]int, 0, len(e.tok)/2+2)
	if addBOS && s.bos >= 0 {
		out = append(out, s.bos)
	}
	out = e.merge(out)
	if addEOS && s.eos >= 0 {
		out = append(out, s.eos)
	}
	return out
}

// encoder holds the symbols of one Encode call: a doubly linked list over
// symbol slots (slot order is text order) and a heap of candidate merges.
type encoder struct {
	s    *SentencePiece
	tok  []int32 // token id of each symbol
	size []int32 // byte length of its piece; 0 once merged away
	prev []int32
	next []int32
	heap []candidate
}

// candidate is a possible merge of the symbol at left with its right
// neighbour, recorded when their pieces together were size bytes long.
type candidate struct {
	score float32
	left  int32
	size  int32
	id    int32
}

// before orders the heap: higher score first, then leftmost (run.c scans
// left to right and keeps the first of equal scores).
func (a candidate) before(b candidate) bool {
	return a.score > b.score || (a.score == b.score && a.left < b.left)
}

func (e *encoder) init(s *SentencePiece, capacity int) {
	e.s = s
	e.tok = make([]int32, 0, capacity)
	e.size = make([]int32, 0, capacity)
}

func (e *encoder) push(id int32) {
	if id < 0 {
		return
	}
	e.tok = append(e.tok, id)
	e.size = append(e.size, int32(len(e.s.pieces[id])))
}

// segment appends the initial symbols of text: code points found as pieces,
// else their bytes as byte tokens. Each byte of invalid UTF-8 is a code
// point of its own.
func (e *encoder) segment(text string) {
	s := e.s
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRuneInString(text[i:])
		if r == utf8.RuneError && n <= 1 {
			e.push(s.byteTok[text[i]])
			i++
			continue
		}
		if id, ok := s.vocab[text[i:i+n]]; ok {
			e.push(id)
		} else {
			for j := i; j < i+n; j++ {
				e.push(s.byteTok[text[j]])
			}
		}
		i += n
	}
}

// consider queues the merge of symbol l with its right neighbour r when
// their pieces together form a piece that a merge can produce, appending it
// to the heap slice (the caller restores heap order), and reports whether it
// did.
func (e *encoder) consider(l, r int32) bool {
	id, ok := e.s.merges[pairKey(e.tok[l], e.tok[r])]
	if !ok {
		return false
	}
	e.heap = append(e.heap, candidate{score: e.s.scores[id], left: l, size: e.size[l] + e.size[r], id: id})
	return true
}

// merge runs the merges and appends the resulting ids to out. It cuts the
// symbols into runs that no merge can join (see SentencePiece.adjacent) and
// merges each run on its own, which keeps the heap small. The result is that
// of merging the whole: a merge inside one run never changes the candidates
// of another, and each run's merges happen in the same order either way.
func (e *encoder) merge(out []int) []int {
	s := e.s
	n := len(e.tok)
	if n == 0 {
		return out
	}
	e.prev = make([]int32, n)
	e.next = make([]int32, n)
	start := 0
	for i := 1; i <= n; i++ {
		if i < n {
			// An empty piece (only possible for unk) never merges.
			if a, b := s.pieces[e.tok[i-1]], s.pieces[e.tok[i]]; a != "" && b != "" {
				x, y := a[len(a)-1], b[0]
				if s.adjacent[x][y>>6]&(1<<(y&63)) != 0 {
					continue
				}
			}
		}
		out = e.mergeRun(int32(start), int32(i), out)
		start = i
	}
	return out
}

// mergeRun merges symbols lo..hi-1 and appends the result to out.
func (e *encoder) mergeRun(lo, hi int32, out []int) []int {
	for i := lo; i < hi; i++ {
		e.prev[i] = i - 1
		e.next[i] = i + 1
	}
	e.prev[lo] = -1
	e.next[hi-1] = -1
	e.heap = e.heap[:0]
	for i := lo; i+1 < hi; i++ {
		e.consider(i, i+1)
	}
	for i := len(e.heap)/2 - 1; i >= 0; i-- {
		e.down(i)
	}
	for len(e.heap) > 0 {
		c := e.pop()
		l := c.left
		r := e.next[l]
		// Stale unless both symbols are unchanged: a symbol only grows
		// (absorbing its right neighbour) or vanishes (size 0), so equal
		// total size means the same pair.
		if e.size[l] == 0 || r < 0 || e.size[l]+e.size[r] != c.size {
			continue
		}
		e.tok[l] = c.id
		e.size[l] = c.size
		e.size[r] = 0
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
	for i := lo; i >= 0; i = e.next[i] {
		out = append(out, int(e.tok[i]))
	}
	return out
}

func (e *encoder) pop() candidate {
	top, h := popMin(e.heap)
	e.heap = h
	return top
}

func (e *encoder) up(i int) {
	if i <= 0 || i >= len(e.heap) {
		return
	}
	siftUp(e.heap, i)
}

func (e *encoder) down(i int) { siftDown(e.heap, i) }

// Type is the token type of id (TypeUndefined when out of range).
func (s *SentencePiece) Type(id int) int32 {
	if id < 0 || id >= len(s.types) {
		return TypeUndefined
	}
	return s.types[id]
}
