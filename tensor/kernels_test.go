package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// forEachLevel runs f with every kernel set this CPU supports (the plain Go
// one included), restoring the default afterwards.
func forEachLevel(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	defer func() { level = cpuLevel }()
	for l := levelGo; l <= cpuLevel; l++ {
		level = l
		t.Run(l.String(), f)
	}
}

func randF32(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// randMatrix makes a rows×cols matrix of type typ with random values.
func randMatrix(t testing.TB, r *rand.Rand, typ DType, rows, cols int) *Matrix {
	t.Helper()
	w := randF32(r, rows*cols)
	if typ == F32 {
		return MatrixF32(rows, cols, w)
	}
	rb, err := typ.RowBytes(cols)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, rows*rb)
	if err := Quantize(typ, w, data); err != nil {
		t.Fatal(err)
	}
	m, err := NewMatrix(typ, rows, cols, data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

// relRMS is the relative RMS error of got against want.
func relRMS(got, want []float32) float64 {
	var e, s float64
	for i := range got {
		d := float64(got[i] - want[i])
		e += d * d
		s += float64(want[i]) * float64(want[i])
	}
	return math.Sqrt(e / s)
}

// checkAccuracy multiplies a rows × 4·QK_K matrix of type typ by 11
// random vectors with path and with other, and requires path's relative
// RMS error against matmulRef (the float product of the dequantized
// weights) to stay under 1%; other's (what path replaces) is logged.
func checkAccuracy(t *testing.T, r *rand.Rand, typ DType, rows int, path, other func(m *Matrix, dst, x []float32, n int), otherName string) {
	t.Helper()
	cols, n := 4*QK_K, 11
	m := randMatrix(t, r, typ, rows, cols)
	x := randF32(r, n*cols)
	want := make([]float32, n*rows)
	m.matmulRef(want, x, n)
	got := make([]float32, n*rows)
	path(m, got, x, n)
	rel := relRMS(got, want)
	other(m, got, x, n)
	t.Logf("%s: relative RMS error %.3g (%s %.3g)", typ, rel, otherName, relRMS(got, want))
	if rel > 0.01 {
		t.Errorf("%s: relative RMS error %.3g", typ, rel)
	}
}

// matMulEachLevel checks that m.MatMul of the n rows of x gives want bit
// for bit at every level (skip: a level where the path under test does
// not run).
func matMulEachLevel(t *testing.T, what string, m *Matrix, x []float32, n int, want []float32, skip func() bool) {
	t.Helper()
	forEachLevel(t, func(t *testing.T) {
		got := make([]float32, n*m.Rows)
		m.MatMul(got, x, n)
		if skip != nil && skip() {
			return
		}
		for i := range got {
			if !sameBits(got[i], want[i]) {
				t.Fatalf("%s n=%d: [%d] = %g, want %g", what, n, i, got[i], want[i])
			}
		}
	})
}

// TestFloatMatMulExact: the float kernels give exactly the plain Go sums
// (rows converted to float32, then Dot) for every shape, tails included.
func TestFloatMatMulExact(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	rowsSet := []int{1, 5, 16, 17, 33, 172}
	colsSet := []int{1, 7, 16, 17, 64, 172, 255, 256, 257, 600, 1000}
	// Every token count meets every type: one kernel call (up to the
	// AVX-512 kernels' 16 rows, the AVX2 ones' 6), several, and a tail.
	nSet := []int{1, 2, 3, 6, 7, 13, 14, 15, 16, 17, 29, 33}
	k := 0
	for _, typ := range []DType{F32, F16, BF16} {
		for _, rows := range rowsSet {
			for _, cols := range colsSet {
				m := randMatrix(t, r, typ, rows, cols)
				n := nSet[k%len(nSet)]
				k++
				x := randF32(r, n*cols)
				want := make([]float32, n*rows)
				level = levelGo
				m.matmulRef(want, x, n)
				level = cpuLevel
				matMulEachLevel(t, fmt.Sprintf("%s %d×%d", typ, rows, cols), m, x, n, want, nil)
			}
		}
	}
}

// TestDotAxpyExact: Dot and Axpy give the same bits on every kernel set,
// for every length 0..1000; below 16 values Dot sums in order.
func TestDotAxpyExact(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	a, b := randF32(r, 1000), randF32(r, 1000)
	level = levelGo
	want := make([]float32, 1001)
	for n := 0; n <= 1000; n++ {
		want[n] = Dot(a[:n], b[:n])
		if n < 16 && !sameBits(want[n], dotSeq(a[:n], b[:n])) {
			t.Fatalf("Dot of %d values is not the in-order sum", n)
		}
	}
	wantAxpy := append([]float32(nil), b...)
	Axpy(wantAxpy[:999], 0.37, a)
	level = cpuLevel
	forEachLevel(t, func(t *testing.T) {
		for n := 0; n <= 1000; n++ {
			if got := Dot(a[:n], b[:n]); !sameBits(got, want[n]) {
				t.Fatalf("Dot of %d values = %g, want %g", n, got, want[n])
			}
		}
		got := append([]float32(nil), b...)
		Axpy(got[:999], 0.37, a)
		for i := range got {
			if !sameBits(got[i], wantAxpy[i]) {
				t.Fatalf("Axpy [%d] = %g, want %g", i, got[i], wantAxpy[i])
			}
		}
	})
}

func TestMemRead(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	p := make([]byte, 5000)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	for _, n := range []int{0, 7, 8, 255, 256, 1000, 4096, 5000} {
		level = levelGo
		want := MemRead(p[:n])
		var x uint64
		for i := 0; i+8 <= n; i += 8 {
			x ^= uint64(p[i]) | uint64(p[i+1])<<8 | uint64(p[i+2])<<16 | uint64(p[i+3])<<24 |
				uint64(p[i+4])<<32 | uint64(p[i+5])<<40 | uint64(p[i+6])<<48 | uint64(p[i+7])<<56
		}
		for i := n &^ 7; i < n; i++ {
			x ^= uint64(p[i])
		}
		if want != x {
			t.Fatalf("n=%d: go %x, want %x", n, want, x)
		}
		level = cpuLevel
		forEachLevel(t, func(t *testing.T) {
			if got := MemRead(p[:n]); got != want {
				t.Fatalf("n=%d: %x, want %x", n, got, want)
			}
		})
	}
}

// TestSwiGLUExact: the kernels give the twin's bits, special values
// included, and the twin's exponential rounds to float32 as math.Exp does.
func TestSwiGLUExact(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	n := 1000
	g, u := randF32(r, n), randF32(r, n)
	for i := range g {
		g[i] *= float32([]float64{1, 10, 100}[i%3])
	}
	inf := float32(math.Inf(1))
	copy(g, []float32{0, float32(math.Copysign(0, -1)), inf, -inf, float32(math.NaN()), 88.7, -88.7, 103.9, -103.9, 1e-30, -1e-30, 200, -200})
	want := make([]float32, n)
	level = levelGo
	SwiGLU(want, g, u)
	level = cpuLevel
	for m := 0; m <= n; m += 1 + m/3 {
		forEachLevel(t, func(t *testing.T) {
			got := make([]float32, m)
			SwiGLU(got, g[:m], u[:m])
			for i := range got {
				if !sameBits(got[i], want[i]) {
					t.Fatalf("n=%d: [%d] silu(%g)·%g = %g, want %g", m, i, g[i], u[i], got[i], want[i])
				}
			}
		})
	}
	// exp64 rounds to float32 like math.Exp over the float32 range.
	bad := 0
	for i := 0; i < 2000000; i++ {
		x := float32(r.Float64()*200 - 110)
		if i%2 == 0 {
			x = float32(r.NormFloat64() * 4)
		}
		if float32(exp64(float64(x))) != float32(math.Exp(float64(x))) {
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of 2e6 exponentials round differently from math.Exp", bad)
	}
}

func TestDotRows(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, d := range []int{1, 8, 15, 16, 17, 64, 100, 128} {
		a, q := randF32(r, 37*d), randF32(r, d)
		forEachLevel(t, func(t *testing.T) {
			for _, n := range []int{0, 1, 5, 37} {
				got := make([]float32, n)
				DotRows(got, a, d, q)
				for i := range got {
					if want := Dot(a[i*d:(i+1)*d], q); !sameBits(got[i], want) {
						t.Fatalf("d=%d n=%d: [%d] = %g, want %g", d, n, i, got[i], want)
					}
				}
			}
		})
	}
}

// checkManyVsMatMul: MatMulMany over ws gives each matrix's MatMul, bit
// for bit, and writes every output (they start as NaN).
func checkManyVsMatMul(t *testing.T, what string, ws []*Matrix, x []float32, n int) {
	t.Helper()
	dsts := make([][]float32, len(ws))
	for i, w := range ws {
		dsts[i] = make([]float32, n*w.Rows)
		for j := range dsts[i] {
			dsts[i][j] = float32(math.NaN())
		}
	}
	MatMulMany(dsts, ws, x, n)
	for i, w := range ws {
		want := make([]float32, n*w.Rows)
		w.MatMul(want, x, n)
		for j := range want {
			if !sameBits(dsts[i][j], want[j]) {
				t.Fatalf("%s matrix %d (%s): [%d] = %g, want %g", what, i, w.Type, j, dsts[i][j], want[j])
			}
		}
	}
}

// checkPanelMatrix rearranges a copy of m into panels (newPanelMatrix),
// checks the panel count, that the data moved (one tile per panel is
// row-major already) and that every row reads back the same; then that
// the panels' products by n = ns vectors are ref's bits (ref: the go
// level's products of m) at every level, alone and in MatMulMany beside m.
func checkPanelMatrix(t *testing.T, r *rand.Rand, m *Matrix, wantPanels int, ns []int, ref func(want, x []float32, n int)) {
	t.Helper()
	rows, cols := m.Rows, m.Cols
	p, err := newPanelMatrix(m.Type, rows, cols, append([]byte(nil), m.Data...))
	if err != nil {
		t.Fatal(err)
	}
	what := fmt.Sprintf("%s %d×%d", m.Type, rows, cols)
	if p.panels != wantPanels {
		t.Fatalf("%s: %d panels, want %d", what, p.panels, wantPanels)
	}
	if vals, _ := panelBlock(m.Type); wantPanels > 0 && cols > vals && string(p.Data) == string(m.Data) {
		t.Fatalf("%s: data not rearranged", what)
	}
	a, b := make([]float32, cols), make([]float32, cols)
	for i := 0; i < rows; i++ {
		m.Row(i, a)
		p.Row(i, b)
		if !slices.Equal(a, b) {
			t.Fatalf("%s: row %d differs", what, i)
		}
	}
	for _, n := range ns {
		x := randF32(r, n*cols)
		x[r.IntN(len(x))] *= 1000
		want := make([]float32, n*rows)
		level = levelGo
		ref(want, x, n)
		level = cpuLevel
		matMulEachLevel(t, what+" panels", p, x, n, want, nil)
		forEachLevel(t, func(t *testing.T) {
			checkManyVsMatMul(t, what+" panels", []*Matrix{p, m, p}, x, n)
		})
	}
}

// TestQuantPanelMatrix: quantized matrices in 16-row panels (every row
// when Rows is a multiple of 16, else none) give the row layout's rows and
// products bit for bit at every level: one token through the level's
// panel kernel or qpanelVia, several through the row-tile kernels with a
// block stride, and MatMulMany mixing both layouts.
func TestQuantPanelMatrix(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, c := range []struct {
		typ  DType
		cols []int
	}{{Q8_0, []int{32, 64, 96, 224, 2048}}, {Q4_0, []int{32, 96, 2048}}, {Q4_K, []int{256, 768}}, {Q6_K, []int{256, 768}}} {
		for _, rows := range []int{8, 16, 40, 48} {
			for _, cols := range c.cols {
				m := randMatrix(t, r, c.typ, rows, cols)
				if rows == 48 {
					m = randRawMatrix(r, c.typ, rows, cols)
				}
				wantPanels := 0
				if rows%16 == 0 {
					wantPanels = rows / 16
				}
				checkPanelMatrix(t, r, m, wantPanels, []int{1, 2, 9, 17}, m.MatMul)
			}
		}
	}
}

// TestPanelMatrix: a half-float matrix rearranged into 16-row panels
// (NewPanelMatrix) gives the same rows and, at every kernel level and
// token count, the same products bit for bit as the row-major matrix's
// plain Go sums, alone and in MatMulMany beside row-major matrices; shapes
// with a tail of rows, and columns that are no multiple of 16 (left row by
// row).
func TestPanelMatrix(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, typ := range []DType{F16, BF16} {
		for _, rows := range []int{5, 16, 17, 33, 48, 172} {
			for _, cols := range []int{16, 48, 256, 600, 1008} {
				m := randMatrix(t, r, typ, rows, cols)
				wantPanels := 0
				if cols%16 == 0 {
					wantPanels = rows / 16
				}
				checkPanelMatrix(t, r, m, wantPanels, []int{1, 2, 17}, m.matmulRef)
			}
		}
	}
}
