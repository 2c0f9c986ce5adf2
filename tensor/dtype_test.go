package tensor

import (
	"strings"
	"testing"
)

// TestDTypeTable: known ids give their GGML names and block layouts, ids
// in the table's holes and past its end are unknown (no panic, errors
// that name them), and names parse back to their ids in any case.
func TestDTypeTable(t *testing.T) {
	for _, c := range []struct {
		t           DType
		name        string
		bs, bb      int
		known, comp bool
	}{
		{F32, "F32", 1, 4, true, true},
		{F16, "F16", 1, 2, true, true},
		{Q4_0, "Q4_0", 32, 18, true, true},
		{Q8_0, "Q8_0", 32, 34, true, true},
		{Q4_K, "Q4_K", 256, 144, true, true},
		{Q6_K, "Q6_K", 256, 210, true, true},
		{BF16, "BF16", 1, 2, true, true},
		{Q5_K, "Q5_K", 256, 176, true, true},
		{Q4_1, "Q4_1", 32, 20, true, true},
		{Q5_0, "Q5_0", 32, 22, true, true},
		{Q5_1, "Q5_1", 32, 24, true, true},
		{Q2_K, "Q2_K", 256, 84, true, true},
		{Q3_K, "Q3_K", 256, 110, true, true},
		{IQ4_NL, "IQ4_NL", 32, 18, true, true},
		{IQ4_XS, "IQ4_XS", 256, 136, true, true},
		{IQ2_XXS, "IQ2_XXS", 256, 66, true, false},
		{MXFP4, "MXFP4", 32, 17, true, false},
		{4, "type(4)", 0, 0, false, false}, // holes in the GGML ids
		{5, "type(5)", 0, 0, false, false},
		{31, "type(31)", 0, 0, false, false},
		{38, "type(38)", 0, 0, false, false},
		{40, "type(40)", 0, 0, false, false}, // past the table
		{1 << 31, "type(2147483648)", 0, 0, false, false},
	} {
		if got := c.t.String(); got != c.name {
			t.Errorf("%d: String() = %q, want %q", uint32(c.t), got, c.name)
		}
		if c.t.Known() != c.known || c.t.Supported() != c.comp {
			t.Errorf("%s: Known %v Supported %v, want %v %v", c.name, c.t.Known(), c.t.Supported(), c.known, c.comp)
		}
		if c.t.BlockSize() != c.bs || c.t.BlockBytes() != c.bb {
			t.Errorf("%s: block %d values / %d bytes, want %d / %d", c.name, c.t.BlockSize(), c.t.BlockBytes(), c.bs, c.bb)
		}
		rb, err := c.t.RowBytes(512)
		if c.known && (err != nil || rb != 512/c.bs*c.bb) {
			t.Errorf("%s: RowBytes(512) = %d, %v", c.name, rb, err)
		}
		if !c.known && err == nil {
			t.Errorf("%s: RowBytes of an unknown type gave no error", c.name)
		}
		if c.known {
			for _, s := range []string{c.name, strings.ToLower(c.name)} {
				if id, err := ParseDType(s); err != nil || id != c.t {
					t.Errorf("ParseDType(%q) = %d, %v", s, uint32(id), err)
				}
			}
		}
	}
	if _, err := ParseDType("q9_9"); err == nil {
		t.Error("ParseDType of an unknown name gave no error")
	}
}
