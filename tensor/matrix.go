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

// NewPanelMatrix wraps data as NewMatrix does and, where this machine has
// a one-token kernel for the layout (PanelMatrices), rearranges it in
// place into panels of 16 rows: a panel is tiles one after another, each
// holding the 16 rows' next block (see panelBlock: 16 values for F16 and
// BF16, the type's block for Q8_0, Q4_0, Q4_K and Q6_K). A quantized tile
// holds row j's block at j block bytes; a half-float tile is column-major
// (row j's value at column k0+l at 32·l + 2·j bytes), so that a panel is
// the [Cols][16] that the product kernels read with rows in lanes.
// Half-float matrices keep their last Rows mod 16 rows row by row after
// the panels; quantized ones get panels only when Rows is a multiple of
// 16. Decode then reads one stream of memory for 16 rows at a time and
// each activation once per 16 rows (docs/PERFORMANCE.md), half-float
// prefill and batches read the panels in place, and the quantized
// row-tile kernels step from block to block by 16 blocks. data must be writable and is owned by the
// matrix from then on: read it through the matrix (Row, MatMul), not as
// rows. Other types and machines get the row layout. Results are the
// same bits as NewMatrix's.
func NewPanelMatrix(t DType, rows, cols int, data []byte) (*Matrix, error) {
	if !PanelMatrices(t) {
		return NewMatrix(t, rows, cols, data)
	}
	return newPanelMatrix(t, rows, cols, data)
}

// PanelMatrices reports whether NewPanelMatrix rearranges weights of type
// t on this machine: where the CPU (and build) has an AVX-512 panel
// kernel for one token at the kernel level in use (for the quantized
// types, with VNNI): SetKernels("avx2") before loading keeps the rows.
// Elsewhere panels would run slower than rows (the AVX2 level and the
// plain Go path read a half-float panel row by row, value by value, and
// a quantized one a block at a time), so rows stay.
func PanelMatrices(t DType) bool {
	switch t {
	case F16, BF16:
		return matvecP(t) != nil
	}
	return qpanelKern(t) != nil
}

// panelBlock is the values and bytes of the blocks that panels of type t
// put side by side (0: no panels for t).
func panelBlock(t DType) (vals, bytes int) {
	switch t {
	case F16, BF16:
		return 16, 32
	case Q8_0, Q4_0, Q4_K, Q6_K:
		return t.BlockSize(), t.BlockBytes()
	}
	return 0, 0
}

// newPanelMatrix is NewPanelMatrix on any machine.
func newPanelMatrix(t DType, rows, cols int, data []byte) (*Matrix, error) {
	m, err := NewMatrix(t, rows, cols, data)
	vals, bb := panelBlock(t)
	if err != nil || vals == 0 || cols%vals != 0 || rows < panelRows || (t != F16 && t != BF16 && rows%panelRows != 0) {
		return m, err
	}
	g := panelRows * m.rowBytes
	tmp := make([]byte, g)
	for p := 0; p < rows/panelRows; p++ {
		pd := data[p*g : (p+1)*g]
		copy(tmp, pd)
		if t == F16 || t == BF16 {
			for j := 0; j < panelRows; j++ {
				for k := 0; k < cols; k++ {
					copy(pd[m.halfOffset(j, k):][:2], tmp[j*m.rowBytes+2*k:])
				}
			}
			continue
		}
		for b := 0; b < cols/vals; b++ {
			for j := 0; j < panelRows; j++ {
				o := (b*panelRows + j) * bb
				copy(pd[o:o+bb], tmp[j*m.rowBytes+b*bb:])
			}
		}
	}
	m.panels = rows / panelRows
	return m, nil
}

// Panels is the number of 16-row panels the matrix's first rows are stored
// in (NewPanelMatrix; 0: row by row).
func (m *Matrix) Panels() int { return m.panels }

// blockOffset is the byte offset in Data of row r's block b (panelBlock)
// in a panel matrix, r in one of its panels.
func (m *Matrix) blockOffset(r, b int) int {
	_, bb := panelBlock(m.Type)
	return r/panelRows*panelRows*m.rowBytes + (b*panelRows+r%panelRows)*bb
}

// tileOffset is the byte offset in Data of the tile of columns k … k+15 (k
// a multiple of 16) of row r's panel in a half-float panel matrix.
func (m *Matrix) tileOffset(r, k int) int { return r/panelRows*panelRows*m.rowBytes + k/16*512 }

// halfOffset is the byte offset in Data of row r's value k in a half-float
// panel matrix, r in one of its panels.
func (m *Matrix) halfOffset(r, k int) int { return m.tileOffset(r, k) + 32*(k%16) + 2*(r%panelRows) }

// blockStrides returns the bytes from a row's block to the next row's
// (ldw) and to the row's next block (bs), for the quantized row-tile
// kernels: the row and block bytes in the row layout, the block bytes and
// 16 of them in panels.
func (m *Matrix) blockStrides() (ldw, bs int) {
	bb := m.Type.BlockBytes()
	if m.panels > 0 {
		return bb, panelRows * bb
	}
	return m.rowBytes, bb
}

// rowAt is the address of row r's first block, for the row-tile kernels
// (blockStrides) at a tile's first row r.
func (m *Matrix) rowAt(r int) unsafe.Pointer {
	if m.panels > 0 {
		return unsafe.Pointer(&m.Data[m.blockOffset(r, 0)])
	}
	return unsafe.Pointer(&m.Data[r*m.rowBytes])
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
	if i < panelRows*m.panels && (m.Type == F16 || m.Type == BF16) {
		for k := range dst[:m.Cols] {
			dst[k] = elemAt(m.Data[m.halfOffset(i, k):], m.Type, 0)
		}
		return
	}
	if i < panelRows*m.panels {
		vals, bb := panelBlock(m.Type)
		for b := 0; b < m.Cols/vals; b++ {
			o := m.blockOffset(i, b)
			if err := Dequantize(m.Type, m.Data[o:o+bb], dst[b*vals:(b+1)*vals]); err != nil {
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
// Float weights give the same bits whatever the kernel set and layout
// (NewMatrix, NewPanelMatrix): F32 rows exactly the in-order sums of
// llama2.c's run.c (a multiply, then an add); F16 and BF16 rows, converted
// exactly to float32, the in-order sums with a fused multiply-add per
// product (dotFMA: the FP pipes convert the weights beside the products),
// except times a single vector (n = 1, decode), summed in Dot's order
// (sixteen lanes, then a tree), which lets decode read weights as one
// stream. Quantized weights
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
	case Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS:
		if m.matmulP8(dst, x, n) || m.matmulKP(dst, x, n) {
			return
		}
		m.matmulQuant(quantKern(m.Type), dst, x, n)
		return
	}
	m.matmulRef(dst, x, n)
}

// matmulRef is the plain Go MatMul: each row converted to float32, then
// summed in order (dotSeq; dotFMA for F16 and BF16 rows), or in Dot's order
// for F16 and BF16 rows times one vector.
func (m *Matrix) matmulRef(dst, x []float32, n int) {
	cols, rows := m.Cols, m.Rows
	dot := dotSeq
	switch {
	case n == 1 && (m.Type == F16 || m.Type == BF16):
		dot = Dot
	case m.Type == F16 || m.Type == BF16:
		dot = dotFMA
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
