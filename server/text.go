package server

import (
	"strings"
	"unicode/utf8"

	"github.com/kvlm/kvlm/tokenizer"
)

// TextStream turns one sample's tokens into text as they come: it holds
// back bytes of an unfinished UTF-8 character and any tail that may be the
// start of a stop string, and cuts the text where a stop string appears
// (the stop string itself is not returned, as OpenAI does).
type TextStream struct {
	tok   tokenizer.Tokenizer
	prev  int // the previous token (Decode drops a leading space after BOS)
	stops []string
	full  []byte // every byte decoded
	sent  int    // bytes of full returned so far
	ended bool   // a stop string matched
}

// NewTextStream starts the text of a sample whose prompt ends with token
// prev, cut at the first of stops.
func NewTextStream(tok tokenizer.Tokenizer, prev int, stops []string) *TextStream {
	return &TextStream{tok: tok, prev: prev, stops: stops}
}

// Add decodes a token and returns the text that can be delivered now, and
// whether a stop string ended the sample (nothing is added after that).
func (ts *TextStream) Add(id int) (string, bool) {
	if ts.ended {
		return "", true
	}
	ts.full = append(ts.full, ts.tok.Decode(ts.prev, id)...)
	ts.prev = id
	pending := ts.full[ts.sent:]
	// A stop string can only start in what was not delivered: a prefix of
	// it was always held back.
	cut := -1
	for _, s := range ts.stops {
		if i := strings.Index(string(pending), s); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		out := string(pending[:cut])
		ts.sent = len(ts.full)
		ts.ended = true
		return out, true
	}
	hold := 0
	for _, s := range ts.stops {
		for k := min(len(s)-1, len(pending)); k > hold; k-- {
			if strings.HasSuffix(string(pending), s[:k]) {
				hold = k
				break
			}
		}
	}
	n := len(pending) - hold
	n = completeUTF8(pending[:n])
	ts.sent += n
	return string(pending[:n]), false
}

// Flush returns what was held back, at the end of the sample.
func (ts *TextStream) Flush() string {
	if ts.ended {
		return ""
	}
	out := string(ts.full[ts.sent:])
	ts.sent = len(ts.full)
	return out
}

// completeUTF8 is the length of the longest prefix of b that does not end
// inside a UTF-8 character (bytes that can never be valid are let through).
func completeUTF8(b []byte) int {
	for back := 1; back <= 3 && back <= len(b); back++ {
		c := b[len(b)-back]
		if c < 0x80 {
			return len(b) // ASCII: nothing unfinished
		}
		if c >= 0xC0 { // a leading byte: is its character complete?
			if utf8.FullRune(b[len(b)-back:]) {
				return len(b)
			}
			return len(b) - back
		}
	}
	return len(b)
}
