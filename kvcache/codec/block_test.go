package codec

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/tensor"
)

// TestGetRows: GetRows decodes every slot as Get does, for every codec (a
// few slots and a whole panel; heads whose KIVI value groups are all of 32
// channels, end in a short group, or are not rows of 16), and
// Plain names the float codecs' element types (float keys are in panels,
// not plain rows).
func TestGetRows(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, name := range append(Names, "q8-shifted", "q4-shifted") {
		for _, kind := range []Kind{Keys, Values} {
			c, err := Parse(strings.TrimSuffix(name, "-shifted"), kind)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(name, "-shifted") {
				mu := make([]float32, 80)
				for i := range mu {
					mu[i] = float32(3 * r.NormFloat64())
				}
				c = Shifted(c, mu)
			}
			for _, d := range []int{8, 48, 64, 72, 80} {
				const n = 16
				x := make([]float32, n*d)
				for i := range x {
					x[i] = float32(r.NormFloat64())
				}
				blk := make([]byte, c.BlockBytes(n, d))
				if g, ok := c.(Grouped); ok {
					lo, hi := make([]float32, d), make([]float32, d)
					ChannelRange(x, d, lo, hi)
					g.EncodeRange(blk, n, d, x, lo, hi)
				} else {
					for i := range n {
						c.Put(blk, n, d, i, x[i*d:(i+1)*d])
					}
				}
				for _, span := range [][2]int{{3, 5}, {0, n}} {
					i0, cnt := span[0], span[1]
					got := make([]float32, cnt*d)
					GetRows(c, blk, n, d, i0, cnt, got)
					want := make([]float32, d)
					for i := range cnt {
						c.Get(blk, n, d, i0+i, want)
						for j := range want {
							if math.Float32bits(got[i*d+j]) != math.Float32bits(want[j]) {
								t.Fatalf("%s %s d=%d: slot %d value %d = %g, want %g", name, kind, d, i0+i, j, got[i*d+j], want[j])
							}
						}
					}
				}
			}
			typ, ok := Plain(c)
			want := map[string]tensor.DType{"f32": tensor.F32, "f16": tensor.F16, "bf16": tensor.BF16}
			if kind == Keys {
				delete(want, name) // in panels, not rows (F32Keys, KeyPanel)
			}
			if w, plain := want[name]; ok != plain || (ok && typ != w) {
				t.Fatalf("%s: Plain = %v, %v", name, typ, ok)
			}
		}
	}
}
