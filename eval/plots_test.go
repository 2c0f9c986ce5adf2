package eval

import (
	"math"
	"strconv"
	"testing"
)

// TestExactTicks: every labelled tick's label reads back as its value and
// no two labels are the same, on ranges where gonum's DefaultTicks rounds
// its labels (its ticks 0.05 apart at 2.1–2.3 read 2.1, 2.2, 2.2).
func TestExactTicks(t *testing.T) {
	for _, r := range []struct{ min, max float64 }{
		{2.13, 2.26}, {2.06, 2.26}, {0.001, 0.0042}, {0, 1}, {0.95, 1.0}, {12, 3170}, {-0.03, 0.02},
	} {
		t.Run(strconv.FormatFloat(r.min, 'g', -1, 64)+"-"+strconv.FormatFloat(r.max, 'g', -1, 64), func(t *testing.T) {
			seen := map[string]bool{}
			labelled := 0
			for _, tk := range (ExactTicks{}).Ticks(r.min, r.max) {
				if tk.Label == "" {
					continue
				}
				labelled++
				v, err := strconv.ParseFloat(tk.Label, 64)
				if err != nil || math.Abs(v-tk.Value) > 1e-9*max(1, math.Abs(tk.Value)) {
					t.Errorf("tick at %v labelled %q", tk.Value, tk.Label)
				}
				if seen[tk.Label] {
					t.Errorf("label %q twice", tk.Label)
				}
				seen[tk.Label] = true
			}
			if labelled < 2 {
				t.Errorf("%d labelled ticks", labelled)
			}
		})
	}
}
