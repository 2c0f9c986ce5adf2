package tensor

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Half-precision bit patterns used by the hand-built blocks below.
const (
	h0_25 = 0x3400 // 0.25
	h0_5  = 0x3800 // 0.5
	h1    = 0x3C00 // 1.0
	h2    = 0x4000 // 2.0
)

func put16(b []byte, v uint16) { binary.LittleEndian.PutUint16(b, v) }

func TestHalfConversions(t *testing.T) {
	f16 := []struct {
		bits uint16
		want float32
	}{
		{0x0000, 0}, {0x3C00, 1}, {0xC000, -2}, {0x3555, 0.333251953125},
		{0x7BFF, 65504}, {0x0001, 5.9604644775390625e-08}, {0x0400, 6.103515625e-05},
		{0x7C00, float32(math.Inf(1))}, {0xFC00, float32(math.Inf(-1))},
	}
	for _, c := range f16 {
		if got := F16ToF32(c.bits); got != c.want {
			t.Errorf("F16ToF32(%#04x) = %g, want %g", c.bits, got, c.want)
		}
		if got := F32ToF16(c.want); got != c.bits {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.want, got, c.bits)
		}
	}
	if h := F32ToF16(1 + 1.0/2048); h != 0x3C00 { // halfway between 0x3C00 and 0x3C01: even
		t.Errorf("F32ToF16 tie = %#04x, want 0x3c00", h)
	}
	bf := []struct {
		f    float32
		bits uint16
	}{
		{1, 0x3F80},
		{-2, 0xC000},
		{3.140625, 0x4049},
		{math.Float32frombits(0x3F808000), 0x3F80}, // tie, even stays
		{math.Float32frombits(0x3F818000), 0x3F82}, // tie, odd rounds up
		{math.Float32frombits(0x3F808001), 0x3F81}, // above the tie
		{math.Float32frombits(0x3F807FFF), 0x3F80}, // below the tie
		{math.Float32frombits(0x7F7FFFFF), 0x7F80}, // max float rounds to +Inf
		{float32(math.Inf(-1)), 0xFF80},
	}
	for _, c := range bf {
		if got := F32ToBF16(c.f); got != c.bits {
			t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", math.Float32bits(c.f), got, c.bits)
		}
	}
	if got := BF16ToF32(0x4049); got != 3.140625 {
		t.Errorf("BF16ToF32(0x4049) = %g", got)
	}
	nan := F32ToBF16(float32(math.NaN()))
	if f := BF16ToF32(nan); f == f {
		t.Errorf("F32ToBF16(NaN) = %#04x is not NaN", nan)
	}
	// A NaN whose payload lives only in the low 16 bits must not become Inf.
	if f := BF16ToF32(F32ToBF16(math.Float32frombits(0x7F800001))); f == f {
		t.Errorf("low-payload NaN became %g", f)
	}
}

// q4KBlock builds a Q4_K block with d=1, dmin=0.5, qs[i]=i and these
// sub-block scales/mins:
//
//	sc = 1 2 3 4 17 33 63 48
//	m  = 0 5 10 63 16 32 1 47
//
// packed by hand following get_scale_min_k4.
func q4KBlock() []byte {
	b := make([]byte, 144)
	put16(b[0:], h1)
	put16(b[2:], h0_5)
	copy(b[4:16], []byte{
		0x41, 0x82, 0xC3, 0xC4, // sc0..3 = 1,2,3,4; top bits = sc4..7>>4 = 1,2,3,3
		0x40, 0x85, 0x0A, 0xBF, // m0..3 = 0,5,10,63; top bits = m4..7>>4 = 1,2,0,2
		0x01, 0x01, 0x1F, 0xF0, // low nibbles sc4..7 = 1,1,15,0; high nibbles m4..7 = 0,0,1,15
	})
	for i := 0; i < 128; i++ {
		b[16+i] = byte(i)
	}
	return b
}

func q4KExpected() []float32 {
	sc := [8]float32{1, 2, 3, 4, 17, 33, 63, 48}
	m := [8]float32{0, 5, 10, 63, 16, 32, 1, 47}
	want := make([]float32, 256)
	for v := range want {
		chunk, r := v/64, v%64
		q := byte(32*chunk + r%32) // qs[i] = i
		sub := 2 * chunk
		if r < 32 {
			q &= 0x0F
		} else {
			q >>= 4
			sub++
		}
		want[v] = 1*sc[sub]*float32(q) - 0.5*m[sub]
	}
	return want
}

// q6KBlock builds a Q6_K block with d=0.25, ql[i]=i, qh[i]=3i and scales
// 1,-1,2,-2,...,8,-8.
func q6KBlock() []byte {
	b := make([]byte, 210)
	for i := 0; i < 128; i++ {
		b[i] = byte(i)
	}
	for i := 0; i < 64; i++ {
		b[128+i] = byte(3 * i)
	}
	for i := 0; i < 16; i++ {
		s := int8(i/2 + 1)
		if i%2 == 1 {
			s = -s
		}
		b[192+i] = byte(s)
	}
	put16(b[208:], h0_25)
	return b
}

// q6KExpected decodes value by value: value v lies in half n=v/128, quarter
// k=(v%128)/32, lane l=v%32; its low 4 bits are the low (k<2) or high (k>=2)
// nibble of ql[64n + 32*(k%2) + l], its high 2 bits are bits 2k..2k+1 of
// qh[32n + l], and its scale is scales[8n + 2k + l/16].
func q6KExpected() []float32 {
	ql := func(i int) int { return i }
	qh := func(i int) int { return (3 * i) & 0xFF }
	scale := func(i int) float32 {
		s := float32(i/2 + 1)
		if i%2 == 1 {
			s = -s
		}
		return s
	}
	want := make([]float32, 256)
	for v := range want {
		n, k, l := v/128, (v%128)/32, v%32
		lo := ql(64*n + 32*(k%2) + l)
		if k >= 2 {
			lo >>= 4
		}
		lo &= 0xF
		hi := (qh(32*n+l) >> (2 * k)) & 3
		q := lo | hi<<4
		want[v] = 0.25 * scale(8*n+2*k+l/16) * float32(q-32)
	}
	return want
}

func TestDequantizeHandBuilt(t *testing.T) {
	q80 := make([]byte, 34)
	put16(q80, h0_5)
	q80want := make([]float32, 32)
	for j := 0; j < 32; j++ {
		q80[2+j] = byte(int8(8*j - 128))
		q80want[j] = float32(4*j - 64) // (8j-128)*0.5
	}

	q40 := make([]byte, 18)
	put16(q40, h2)
	q40want := make([]float32, 32)
	for j := 0; j < 16; j++ {
		q40[2+j] = byte(j | (15-j)<<4)
		q40want[j] = float32(2 * (j - 8))    // low nibble j
		q40want[16+j] = float32(2 * (7 - j)) // high nibble 15-j: (15-j-8)*2
	}

	f32 := make([]byte, 12)
	binary.LittleEndian.PutUint32(f32[0:], 0x3F800000)
	binary.LittleEndian.PutUint32(f32[4:], 0xC0490FDB)
	binary.LittleEndian.PutUint32(f32[8:], 0x00000001)

	cases := []struct {
		name string
		t    DType
		src  []byte
		want []float32
	}{
		{"F32", F32, f32, []float32{1, -3.1415927, math.Float32frombits(1)}},
		{"F16", F16, []byte{0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B, 0x01, 0x00}, []float32{1, -2, 65504, 5.9604644775390625e-08}},
		{"BF16", BF16, []byte{0x80, 0x3F, 0x49, 0x40, 0x00, 0xC0}, []float32{1, 3.140625, -2}},
		{"Q8_0", Q8_0, q80, q80want},
		{"Q4_0", Q4_0, q40, q40want},
		{"Q4_K", Q4_K, q4KBlock(), q4KExpected()},
		{"Q6_K", Q6_K, q6KBlock(), q6KExpected()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := make([]float32, len(c.want))
			if err := Dequantize(c.t, c.src, got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("value %d = %g, want %g", i, got[i], c.want[i])
				}
			}
		})
	}
}

// TestDequantizeSpotValues pins a few values worked out on paper, so that a
// shared misreading of the layout by the decoder and the expectation
// helpers above would still be caught.
func TestDequantizeSpotValues(t *testing.T) {
	q4k := make([]float32, 256)
	if err := Dequantize(Q4_K, q4KBlock(), q4k); err != nil {
		t.Fatal(err)
	}
	q6k := make([]float32, 256)
	if err := Dequantize(Q6_K, q6KBlock(), q6k); err != nil {
		t.Fatal(err)
	}
	spots := []struct {
		name string
		got  float32
		want float32
	}{
		{"q4k[0]", q4k[0], 0},          // q=0, sc=1, m=0
		{"q4k[1]", q4k[1], 1},          // low nibble of 0x01, sc=1
		{"q4k[32]", q4k[32], -2.5},     // high nibble of 0x00, sub-block 1: 0 - 0.5*5
		{"q4k[63]", q4k[63], -0.5},     // high nibble of 0x1F = 1: 2*1 - 2.5
		{"q4k[64]", q4k[64], -5},       // low nibble of 0x20 = 0, sub-block 2: -0.5*10
		{"q4k[100]", q4k[100], -23.5},  // high nibble of 0x24 = 2, sub-block 3: 4*2 - 31.5
		{"q4k[130]", q4k[130], 34 - 8}, // low nibble of 0x42 = 2, sub-block 4: 17*2 - 0.5*16
		{"q4k[200]", q4k[200], 503.5},  // low nibble of 0x68 = 8, sub-block 6: 63*8 - 0.5
		{"q4k[255]", q4k[255], 312.5},  // high nibble of 0x7F = 7, sub-block 7: 48*7 - 23.5
		{"q6k[0]", q6k[0], -8},         // ql 0, qh 0 -> q=0: 0.25*1*(-32)
		{"q6k[1]", q6k[1], 4.25},       // ql[1]=1 low=1, qh[1]=3 bits 0-1 = 3 -> q=49; scale 1: 0.25*17
		{"q6k[33]", q6k[33], -15.5},    // ql[33]=0x21 low=1, qh[1]=3 bits 2-3 = 0 -> q=1; scale[2]=2: 0.25*2*(-31)
		{"q6k[255]", q6k[255], -14},    // ql[127]=0x7F high=7, qh[63]=189 bits 6-7 = 2 -> q=39; scale -8
	}
	for _, s := range spots {
		if s.got != s.want {
			t.Errorf("%s = %g, want %g", s.name, s.got, s.want)
		}
	}
}

func randNormal(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func TestQuantizeRoundTrip(t *testing.T) {
	// maxRel bounds the RMS error relative to the RMS of the data; maxBlock
	// bounds each value's error relative to the largest magnitude of its block.
	cases := []struct {
		t        DType
		maxRel   float64
		maxBlock float64
	}{
		{F32, 0, 0},
		{F16, 1e-3, 1e-3},
		{BF16, 5e-3, 8e-3},
		{Q8_0, 0.01, 0.5/127 + 1e-3},
		{Q4_0, 0.13, 1.0/8 + 1e-3}, // the side opposite the extreme value clamps at 7d
		{Q4_K, 0.11, 0.2},          // least squares may clip an outlier
		{Q6_K, 0.045, 0.5/32 + 0.01},
		{Q4_1, 0.09, 1.0/15 + 1e-3}, // half a step of (max-min)/15
		{Q5_0, 0.05, 1.0/16 + 1e-3}, // as Q4_0: the positive side clamps at 15d
		{Q5_1, 0.045, 1.0/31 + 1e-3},
		{IQ4_NL, 0.09, 0.2}, // the levels' widest gap is 24/254 of the range; the refitted scale may clip
		{Q2_K, 0.3, 0.6},    // four levels; least squares clips outliers
		{Q3_K, 0.16, 0.4},
		{Q5_K, 0.045, 0.1},
		{IQ4_XS, 0.09, 0.25},
	}
	r := rand.New(rand.NewPCG(1, 2))
	inputs := map[string][]float32{
		"normal": randNormal(r, 4096),
		"zeros":  make([]float32, 512),
	}
	pos := randNormal(r, 1024)
	for i := range pos {
		pos[i] = float32(math.Abs(float64(pos[i]))) + 3 // all positive, offset
	}
	inputs["positive"] = pos
	scaled := randNormal(r, 1024)
	for i := range scaled {
		scaled[i] *= float32(math.Pow(10, float64(i/256-2))) // blocks of very different magnitude
	}
	inputs["scaled"] = scaled
	for _, c := range cases {
		for name, x := range inputs {
			n, _ := c.t.RowBytes(len(x))
			q := make([]byte, n)
			if err := Quantize(c.t, x, q); err != nil {
				t.Fatalf("%v %s: %v", c.t, name, err)
			}
			y := make([]float32, len(x))
			if err := Dequantize(c.t, q, y); err != nil {
				t.Fatalf("%v %s: %v", c.t, name, err)
			}
			bs := max(32, c.t.BlockSize())
			var se, sx float64
			for b := 0; b < len(x); b += bs {
				var amax float64
				for _, v := range x[b : b+bs] {
					amax = math.Max(amax, math.Abs(float64(v)))
				}
				for i := b; i < b+bs; i++ {
					e := math.Abs(float64(y[i] - x[i]))
					se += e * e
					sx += float64(x[i]) * float64(x[i])
					if e > c.maxBlock*amax {
						t.Fatalf("%v %s: value %d = %g, want %g (err %g > %g*%g)", c.t, name, i, y[i], x[i], e, c.maxBlock, amax)
					}
				}
			}
			if sx == 0 {
				if se != 0 {
					t.Errorf("%v %s: zeros do not round trip", c.t, name)
				}
				continue
			}
			rel := math.Sqrt(se / sx)
			t.Logf("%-4v %-8s rel RMS error %.4f", c.t, name, rel)
			if rel > c.maxRel {
				t.Errorf("%v %s: relative RMS error %.4f > %.4f", c.t, name, rel, c.maxRel)
			}
		}
	}
}

// TestQuantizeMatchesReference checks Q8_0 and Q4_0 bytes against values
// worked out from ggml's reference formulas.
func TestQuantizeMatchesReference(t *testing.T) {
	x := make([]float32, 32)
	for i := range x {
		x[i] = float32(i) - 16 // -16..15: max magnitude is -16
	}
	q := make([]byte, 18)
	if err := Quantize(Q4_0, x, q); err != nil {
		t.Fatal(err)
	}
	// d = -16 / -8 = 2; q = trunc(x/2 + 8.5): x=-16 -> 0, x=-15 -> 1 (1.0), x=15 -> min(15, 16) = 15.
	if d := F16ToF32(binary.LittleEndian.Uint16(q)); d != 2 {
		t.Errorf("Q4_0 d = %g, want 2", d)
	}
	if q[2] != 0x0|0x8<<4 { // x[0]=-16 -> 0; x[16]=0 -> 8
		t.Errorf("Q4_0 qs[0] = %#02x, want 0x80", q[2])
	}
	// x[15] = -1: -0.5+8.5 = 8.0 -> 8; x[31] = 15: 7.5+8.5 = 16 -> min(15, 16) = 15.
	if q[17] != 0x8|0xF<<4 {
		t.Errorf("Q4_0 qs[15] = %#02x, want 0xf8", q[17])
	}

	q8 := make([]byte, 34)
	if err := Quantize(Q8_0, x, q8); err != nil {
		t.Fatal(err)
	}
	// d = 16/127; q = round(x*127/16): x=-16 -> -127, x=1 -> round(7.9375) = 8, x=15 -> round(119.06) = 119.
	for _, c := range []struct{ i, want int }{{0, -127}, {17, 8}, {31, 119}, {16, 0}} {
		if got := int(int8(q8[2+c.i])); got != c.want {
			t.Errorf("Q8_0 q[%d] = %d, want %d", c.i, got, c.want)
		}
	}
}

func TestQuantizeSpecialValues(t *testing.T) {
	// NaN and Inf must not panic; constant blocks must round trip closely.
	for _, typ := range []DType{Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS} {
		for _, v := range []float32{float32(math.NaN()), float32(math.Inf(1)), -7, 3} {
			x := make([]float32, 256)
			for i := range x {
				x[i] = v
			}
			n, _ := typ.RowBytes(256)
			q := make([]byte, n)
			if err := Quantize(typ, x, q); err != nil {
				t.Fatal(err)
			}
			y := make([]float32, 256)
			if err := Dequantize(typ, q, y); err != nil {
				t.Fatal(err)
			}
			if v == -7 || v == 3 {
				for i := range y {
					if math.Abs(float64(y[i]-v)) > 0.1*math.Abs(float64(v)) {
						t.Fatalf("%v constant %g: value %d = %g", typ, v, i, y[i])
					}
				}
			}
		}
	}
}

func TestConversionErrors(t *testing.T) {
	cases := []struct {
		name    string
		t       DType
		nvals   int
		nbytes  int
		wantErr string
	}{
		{"q8 partial block", Q8_0, 31, 34, "not a multiple of the block size 32"},
		{"q8 short src", Q8_0, 32, 33, "32 values take 34 bytes, got 33"},
		{"q8 long src", Q8_0, 32, 35, "got 35"},
		{"q4k partial", Q4_K, 128, 72, "block size 256"},
		{"q6k bytes", Q6_K, 256, 209, "take 210 bytes"},
		{"f16 bytes", F16, 3, 5, "take 6 bytes"},
		{"unsupported", IQ2_XXS, 256, 66, "IQ2_XXS: unsupported type"},
		{"q5k bytes", Q5_K, 256, 175, "take 176 bytes"},
		{"unknown", DType(99), 1, 1, "unknown type 99"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Dequantize(c.t, make([]byte, c.nbytes), make([]float32, c.nvals))
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("Dequantize: err = %v, want %q", err, c.wantErr)
			}
			err = Quantize(c.t, make([]float32, c.nvals), make([]byte, c.nbytes))
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("Quantize: err = %v, want %q", err, c.wantErr)
			}
		})
	}
}

func TestDequantizeRow(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const rows, cols = 3, 64
	x := randNormal(r, rows*cols)
	q := make([]byte, rows*68)
	if err := Quantize(Q8_0, x, q); err != nil {
		t.Fatal(err)
	}
	all := make([]float32, rows*cols)
	if err := Dequantize(Q8_0, q, all); err != nil {
		t.Fatal(err)
	}
	row := make([]float32, cols)
	for i := 0; i < rows; i++ {
		if err := DequantizeRow(Q8_0, q, i, row); err != nil {
			t.Fatal(err)
		}
		for j := range row {
			if row[j] != all[i*cols+j] {
				t.Fatalf("row %d col %d = %g, want %g", i, j, row[j], all[i*cols+j])
			}
		}
	}
	for _, bad := range []int{-1, rows} {
		if err := DequantizeRow(Q8_0, q, bad, row); err == nil {
			t.Errorf("row %d: no error", bad)
		}
	}
	if err := DequantizeRow(Q8_0, q, 0, make([]float32, 33)); err == nil {
		t.Error("33 columns of Q8_0: no error")
	}
}

func BenchmarkDequantize(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	x := randNormal(r, 4096)
	y := make([]float32, len(x))
	for _, typ := range []DType{F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K} {
		n, _ := typ.RowBytes(len(x))
		q := make([]byte, n)
		if err := Quantize(typ, x, q); err != nil {
			b.Fatal(err)
		}
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				_ = Dequantize(typ, q, y)
			}
		})
	}
}
