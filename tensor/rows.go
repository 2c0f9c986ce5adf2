package tensor

import (
	"io"
	"unsafe"
)

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
			unpanelHalf(buf, pd, m.Cols)
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

// unpanelHalf writes the 16 rows of a half-float panel pd (cols values
// each) row by row to dst. Tile t holds columns 16t…16t+15 of the 16 rows,
// column-major: row j's value at column 16t+l is at 32·l + 2·j. Each row's
// 16 values of a tile are written together.
func unpanelHalf(dst, pd []byte, cols int) {
	if uintptr(unsafe.Pointer(unsafe.SliceData(pd)))%2 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%2 != 0 {
		for t := range cols / 16 {
			tile := pd[t*512 : (t+1)*512]
			for j := range panelRows {
				row := dst[2*(j*cols+16*t) : 2*(j*cols+16*t+16)]
				for l := range 16 {
					row[2*l], row[2*l+1] = tile[32*l+2*j], tile[32*l+2*j+1]
				}
			}
		}
		return
	}
	src := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(pd))), len(pd)/2)
	out := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(dst))), len(dst)/2)
	for t := range cols / 16 {
		tile := (*[256]uint16)(src[t*256 : (t+1)*256])
		for j := range panelRows {
			row := (*[16]uint16)(out[j*cols+16*t : j*cols+16*t+16])
			for l := range 16 {
				row[l] = tile[16*l+j]
			}
		}
	}
}
