package server

import (
	"strings"
	"testing"

	"github.com/kvlm/kvlm/tokenizer"
)

// pieceTok decodes token i to pieces[i].
type pieceTok struct{ pieces []string }

func (p pieceTok) Encode(string, bool, bool) []int { return nil }
func (p pieceTok) Decode(_, t int) string          { return p.pieces[t] }
func (p pieceTok) DecodeAll(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(p.pieces[id])
	}
	return b.String()
}
func (p pieceTok) VocabSize() int      { return len(p.pieces) }
func (p pieceTok) BOS() int            { return -1 }
func (p pieceTok) EOS() int            { return -1 }
func (p pieceTok) Piece(id int) string { return p.pieces[id] }

var _ tokenizer.Tokenizer = pieceTok{}

func TestTextStream(t *testing.T) {
	// "é" is split over two tokens; "END" over three.
	tok := pieceTok{pieces: []string{"ab", "\xc3", "\xa9", "E", "N", "D", "x", "EN"}}
	cases := []struct {
		ids       []int
		stops     []string
		deltas    []string
		stopped   bool
		flushText string
	}{
		{[]int{0, 1, 2, 6}, nil, []string{"ab", "", "é", "x"}, false, ""},
		{[]int{0, 3, 4, 5, 6}, []string{"END"}, []string{"ab", "", "", ""}, true, ""},
		{[]int{0, 3, 4, 6}, []string{"END"}, []string{"ab", "", "", "ENx"}, false, ""},
		{[]int{0, 7}, []string{"END"}, []string{"ab", ""}, false, "EN"},
		{[]int{0, 3, 6}, []string{"x", "Ex"}, []string{"ab", "", ""}, true, ""},
	}
	for i, c := range cases {
		ts := NewTextStream(tok, -1, c.stops)
		var got []string
		stopped := false
		for _, id := range c.ids {
			d, s := ts.Add(id)
			if stopped {
				break
			}
			got = append(got, d)
			stopped = s
		}
		if strings.Join(got, "|") != strings.Join(c.deltas, "|") || stopped != c.stopped {
			t.Errorf("case %d: deltas %q stopped %v, want %q %v", i, got, stopped, c.deltas, c.stopped)
		}
		if f := ts.Flush(); f != c.flushText {
			t.Errorf("case %d: flush %q, want %q", i, f, c.flushText)
		}
	}
}
