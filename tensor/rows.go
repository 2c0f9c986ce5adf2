package tensor

import "io"

// WriteRows writes the matrix's values to w in the row layout NewMatrix
// takes (row after row, RowBytes(Cols) bytes each: the bytes a GGUF file
// holds for the tensor), whatever layout the matrix keeps them in
// (NewPanelMatrix's panels are put back in row order, 16 rows at a time).
func (m *Matrix) WriteRows(w io.Writer) error {
	if m.panels == 0 {
		_, err := w.Write(m.Data)
		return err
	}
	rb := m.rowBytes
	g := panelRows * rb
	buf := make([]byte, g)
	half := m.Type == F16 || m.Type == BF16
	vals, bb := panelBlock(m.Type)
	for p := range m.panels {
		pd := m.Data[p*g : (p+1)*g]
		if half {
			// Tile t holds columns 16t…16t+15 of the 16 rows, column-major.
			for t := range m.Cols / 16 {
				tile := pd[t*512 : (t+1)*512]
				for l := range 16 {
					col := tile[32*l : 32*l+32]
					o := 2 * (16*t + l)
					for j := range panelRows {
						buf[j*rb+o], buf[j*rb+o+1] = col[2*j], col[2*j+1]
					}
				}
			}
		} else {
			for b := range m.Cols / vals {
				for j := range panelRows {
					o := (b*panelRows + j) * bb
					copy(buf[j*rb+b*bb:j*rb+(b+1)*bb], pd[o:o+bb])
				}
			}
		}
		if _, err := w.Write(buf); err != nil {
			return err
		}
	}
	_, err := w.Write(m.Data[m.panels*g:])
	return err
}
