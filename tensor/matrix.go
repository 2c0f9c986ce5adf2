package tensor

import (
	"fmt"
	"unsafe"
)

// Matrix is a row-major weight matrix of Rows × Cols values in any supported
// type: y = W·x reads one row per output.
type Matrix struct {
	Type DType
	Rows int    // outputs
	Cols int    // inputs
	Data []byte // [Rows][RowBytes(Cols)]

	rowBytes int
	f32      []float32 // Data viewed as [Rows][Cols] float32 when Type is F32
	// panels: rows 0 … 16·panels−1 are stored in panels of 16 rows
	// (NewPanelMatrix), the rest row by row after them.
	panels int
}

// NewMatrix wraps data (not copied) as a Rows × Cols matrix of type t.
func NewMatrix(t DType, rows, cols int, data []byte) (*Matrix, error) {
	if !t.Supported() {
		return nil, fmt.Errorf("tensor type %s is not supported", t)
	}
	if rows <= 0 || cols <= 0 {
		return nil, fmt.Errorf("matrix shape %d×%d is not positive", rows, cols)
	}
	rb, err := t.RowBytes(cols)
	if err != nil {
		return nil, err
	}
	if len(data) != rows*rb {
		return nil, fmt.Errorf("%s matrix %d×%d needs %d bytes, got %d", t, rows, cols, rows*rb, len(data))
	}
	m := &Matrix{Type: t, Rows: rows, Cols: cols, Data: data, rowBytes: rb}
	if t == F32 {
		if uintptr(unsafe.Pointer(unsafe.SliceData(data)))%4 != 0 {
			return nil, fmt.Errorf("F32 matrix data is not 4-byte aligned")
		}
		m.f32 = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(data))), rows*cols)
	}
	return m, nil
}

// NewPanelMatrix wraps data as NewMatrix does and, for F16 and BF16
// weights whose Cols is a multiple of 16 on a CPU with AVX-512 (see
// PanelMatrices), rearranges it in place into panels of 16 rows (the last
// Rows mod 16 rows stay row by row after them): a panel is Cols/16 tiles
// of 512 bytes, one after another, each holding the 16 rows' next 16
// values (row j's at byte 32·j). Decode then reads one stream of memory
// for 16 rows at a time and each value of x once per 16 rows
// (docs/PERFORMANCE.md), and prefill packs its panels from tiles that are
// already contiguous. data must be writable and is owned by the matrix
// from then on: read it through the matrix (Row, MatMul), not as rows.
// Other types and machines get the row layout. Results are the same bits
// as NewMatrix's.
func NewPanelMatrix(t DType, rows, cols int, data []byte) (*Matrix, error) {
	if !PanelMatrices() {
		return NewMatrix(t, rows, cols, data)
	}
	return newPanelMatrix(t, rows, cols, data)
}

// PanelMatrices reports whether NewPanelMatrix rearranges half-float
// weights on this machine: where the CPU (and build) has the AVX-512
// panel kernel. The AVX2 one, which reads a panel in four passes of 4
// rows, decodes slower than rows do, and the plain Go path reads a panel
// 16 values at a time: there rows stay.
func PanelMatrices() bool { return cpuLevel >= levelAVX512 }

// newPanelMatrix is NewPanelMatrix on any machine.
func newPanelMatrix(t DType, rows, cols int, data []byte) (*Matrix, error) {
	m, err := NewMatrix(t, rows, cols, data)
	if err != nil || (t != F16 && t != BF16) || cols%16 != 0 || rows < panelRows {
		return m, err
	}
	g := panelRows * m.rowBytes
	tmp := make([]byte, g)
	for p := 0; p < rows/panelRows; p++ {
		pd := data[p*g : (p+1)*g]
		copy(tmp, pd)
		for b := 0; b < cols/16; b++ {
			for j := 0; j < panelRows; j++ {
				copy(pd[512*b+32*j:512*b+32*j+32], tmp[j*m.rowBytes+32*b:])
			}
		}
	}
	m.panels = rows / panelRows
	return m, nil
}

// Panels is the number of 16-row panels the matrix's first rows are stored
// in (NewPanelMatrix; 0: row by row).
func (m *Matrix) Panels() int { return m.panels }

// tileOffset is the byte offset in Data of row r's values k … k+15 (k a
// multiple of 16) in a panel matrix, r in one of its panels.
func (m *Matrix) tileOffset(r, k int) int {
	return r/panelRows*panelRows*m.rowBytes + k/16*512 + r%panelRows*32
}

// MatrixF32 wraps float32 data (not copied) as a Rows × Cols F32 matrix.
func MatrixF32(rows, cols int, data []float32) *Matrix {
	if len(data) != rows*cols {
		panic(fmt.Sprintf("tensor: MatrixF32 %d×%d given %d values", rows, cols, len(data)))
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(data))), 4*len(data))
	return &Matrix{Type: F32, Rows: rows, Cols: cols, Data: b, rowBytes: 4 * cols, f32: data}
}

// F32 returns the matrix data as float32 values when its type is F32.
func (m *Matrix) F32() []float32 { return m.f32 }

// Row writes row i, converted to float32, to dst[:Cols].
func (m *Matrix) Row(i int, dst []float32) {
	if m.f32 != nil {
		copy(dst[:m.Cols], m.f32[i*m.Cols:(i+1)*m.Cols])
		return
	}
	if i < panelRows*m.panels {
		for k := 0; k < m.Cols; k += 16 {
			o := m.tileOffset(i, k)
			if err := Dequantize(m.Type, m.Data[o:o+32], dst[k:k+16]); err != nil {
				panic(err)
			}
		}
		return
	}
	if err := Dequantize(m.Type, m.Data[i*m.rowBytes:(i+1)*m.rowBytes], dst[:m.Cols]); err != nil {
		panic(err) // shapes were checked by NewMatrix
	}
}

// MatVec computes dst[:Rows] = W·x.
func (m *Matrix) MatVec(dst, x []float32) { m.MatMul(dst, x, 1) }

// MatMul computes dst[t] = W·x[t] for n inputs: x is [n][Cols], dst is
// [n][Rows]. Each weight row is read once for all n inputs.
//
// Float weights (F32, F16, BF16) give exactly the in-order sums of
// llama2.c's run.c over the rows converted to float32, whatever the kernel
// set and layout (NewMatrix, NewPanelMatrix); except that F16 and BF16 rows
// times a single vector (n = 1, decode) are summed in Dot's order (sixteen
// lanes, then a tree), which lets decode read weights as one stream. Quantized weights
// (Q8_0, Q4_0, Q4_K, Q6_K) multiply activations quantized to 8 bits with
// integer dot products (act.go, qdot.go), with the same result bit for bit
// on every kernel set.
func (m *Matrix) MatMul(dst, x []float32, n int) {
	cols, rows := m.Cols, m.Rows
	_ = x[n*cols-1]
	_ = dst[n*rows-1]
	switch m.Type {
	case F16, BF16:
		if n == 1 {
			if k := matvecH(m.Type); k != nil {
				m.matvecHalf(k, dst, x)
				return
			}
			break
		}
		fallthrough
	case F32:
		if fk := floatKern(); fk != nil {
			m.matmulFloat(fk, dst, x, n)
			return
		}
	case Q8_0, Q4_0, Q4_K, Q6_K:
		if m.matmulP8(dst, x, n) || m.matmulKP(dst, x, n) {
			return
		}
		m.matmulQuant(quantKern(m.Type), dst, x, n)
		return
	}
	m.matmulRef(dst, x, n)
}

// matmulRef is the plain Go MatMul: each row converted to float32, then
// summed in order (dotSeq), or in Dot's order for F16 and BF16 rows times
// one vector.
func (m *Matrix) matmulRef(dst, x []float32, n int) {
	cols, rows := m.Cols, m.Rows
	dot := dotSeq
	if n == 1 && (m.Type == F16 || m.Type == BF16) {
		dot = Dot
	}
	grain := max(1, 16384/(cols*n))
	Parallel(rows, grain, func(lo, hi int) {
		var buf []float32
		if m.f32 == nil {
			buf = make([]float32, cols)
		}
		for r := lo; r < hi; r++ {
			var w []float32
			if m.f32 != nil {
				w = m.f32[r*cols : (r+1)*cols]
			} else {
				m.Row(r, buf)
				w = buf
			}
			for t := 0; t < n; t++ {
				dst[t*rows+r] = dot(w, x[t*cols:(t+1)*cols])
			}
		}
	})
}
