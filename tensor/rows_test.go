package tensor

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// WriteRows gives back the row layout a matrix was made from, from panels
// (NewPanelMatrix on any machine) as from rows.
func TestWriteRows(t *testing.T) {
	cases := []struct {
		typ        DType
		rows, cols int
		panels     bool
		odd        bool // data at an odd address (the byte-by-byte path)
	}{
		{F16, 32, 64, true, true},
		{F32, 5, 7, false, false},
		{F16, 32, 48, true, false},
		{F16, 37, 32, true, false}, // 5 rows after the panels
		{BF16, 16, 16, true, false},
		{BF16, 3, 32, false, false}, // fewer rows than a panel
		{Q8_0, 32, 64, true, false},
		{Q8_0, 20, 64, false, false}, // rows not a multiple of 16: rows
		{Q4_0, 16, 96, true, false},
		{Q4_K, 16, 512, true, false},
		{Q6_K, 32, 512, true, false},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s %dx%d odd %v", c.typ, c.rows, c.cols, c.odd), func(t *testing.T) {
			rb, err := c.typ.RowBytes(c.cols)
			if err != nil {
				t.Fatal(err)
			}
			data := make([]byte, c.rows*rb+1)[:c.rows*rb]
			if c.odd {
				data = make([]byte, c.rows*rb+1)[1:]
			}
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			want := bytes.Clone(data)
			m, err := newPanelMatrix(c.typ, c.rows, c.cols, data)
			if err != nil {
				t.Fatal(err)
			}
			if (m.Panels() > 0) != c.panels {
				t.Fatalf("%d panels, want panels: %v", m.Panels(), c.panels)
			}
			if c.panels && bytes.Equal(m.Data, want) {
				t.Fatal("the panel layout is the row layout: the case tests nothing")
			}
			var got bytes.Buffer
			if err := m.WriteRows(&got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("WriteRows differs from the rows the matrix was made from (%d bytes, want %d)", got.Len(), len(want))
			}
		})
	}
	m, _ := newPanelMatrix(F16, 32, 32, make([]byte, 32*64))
	if err := m.WriteRows(failWriter{}); err == nil {
		t.Error("a write error was not returned")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("full") }
