package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvlm/kvlm/kvcalc"
	"github.com/spf13/cobra"
)

// kvcalcJSON is what kvcalc --json prints: for one (batch, seq) point the
// row's fields sit at the top level; for a grid they are in "rows".
type kvcalcJSON struct {
	Model        kvcalc.Model `json:"model"`
	KVTypeK      kvcalc.Codec `json:"kv_type_k"`
	KVTypeV      kvcalc.Codec `json:"kv_type_v"`
	BitsK        float64      `json:"bits_per_value_k"`
	BitsV        float64      `json:"bits_per_value_v"`
	KIVIResidual int          `json:"kivi_residual_tokens,omitempty"`
	WeightsType  string       `json:"weights_type"`
	KVRatio      float64      `json:"kv_ratio,omitempty"`
	KVBudget     int          `json:"kv_budget,omitempty"`
	*kvcalc.Row
	Rows []kvcalc.Row `json:"rows,omitempty"`
}

type kvcalcListJSON struct {
	Presets []kvcalc.Model  `json:"presets"`
	Codecs  []codecBitsJSON `json:"codecs"`
}

type codecBitsJSON struct {
	Name     kvcalc.Codec `json:"name"`
	BitsK    float64      `json:"bits_per_value_k"` // at head dim 128
	BitsV    float64      `json:"bits_per_value_v"`
	Residual int          `json:"residual_tokens,omitempty"`
}

func newKVCalc() *cobra.Command {
	var (
		preset, modelPath, batchList, seqList string
		kvType, kvTypeK, kvTypeV, weightsType string
		ratio                                 float64
		budget                                int
		asJSON, list                          bool
	)
	c := &cobra.Command{
		Use:   "kvcalc --preset NAME | -m MODEL [--batch B,... --seq S,... --kv-type T]",
		Short: "Size the KV cache of a model for batches of sequences, in any KV codec",
		Long: `Size the KV cache: per_token = 2 · layers · kv_heads · head_dim · bytes per value,
total = per_token · tokens · batch, with K and V each in their own codec
(metadata included) and an optional budget of tokens kept per sequence.
Weights are sized as params × the --weights-type (f16 unless a model file is
given, whose stored size is used). GB = 10^9 bytes, GiB = 2^30 bytes.

KV codecs: f32 f16 bf16 q8 q4 kivi2 kivi4.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			if list {
				return printKVCalcList(w, asJSON)
			}
			flags := cmd.Flags()
			var m kvcalc.Model
			var err error
			switch {
			case preset != "" && modelPath != "":
				return errors.New("give --preset or -m, not both")
			case preset != "":
				if m, err = kvcalc.Preset(preset); err != nil {
					return err
				}
			case modelPath != "":
				p, err := resolveModel(modelPath)
				if err != nil {
					return err
				}
				if m, err = kvcalc.FromFile(p); err != nil {
					return err
				}
			default:
				return fmt.Errorf("give --preset NAME or -m MODEL (presets: %s)", strings.Join(kvcalc.PresetNames(), ", "))
			}
			var opt kvcalc.Options
			k, v := kvType, kvType
			if flags.Changed("kv-type-k") {
				k = kvTypeK
			}
			if flags.Changed("kv-type-v") {
				v = kvTypeV
			}
			if opt.K, err = kvcalc.ParseCodec(k); err != nil {
				return err
			}
			if opt.V, err = kvcalc.ParseCodec(v); err != nil {
				return err
			}
			if flags.Changed("weights-type") {
				if opt.Weights, err = kvcalc.ParseWeights(weightsType); err != nil {
					return err
				}
			}
			if flags.Changed("kv-ratio") && flags.Changed("kv-budget") {
				return errors.New("give --kv-ratio or --kv-budget, not both")
			}
			if flags.Changed("kv-ratio") {
				if !(ratio > 0 && ratio <= 1) {
					return fmt.Errorf("--kv-ratio %g is outside (0, 1]", ratio)
				}
				opt.Ratio = ratio
			}
			if flags.Changed("kv-budget") {
				if budget <= 0 {
					return fmt.Errorf("--kv-budget %d must be positive", budget)
				}
				opt.Budget = budget
			}
			batches, err := intList("--batch", batchList)
			if err != nil {
				return err
			}
			if !flags.Changed("seq") {
				seqList = "4096"
				if m.Context > 0 {
					seqList = strconv.Itoa(m.Context)
				}
			}
			seqs, err := intList("--seq", seqList)
			if err != nil {
				return err
			}
			calc, err := kvcalc.New(m, opt)
			if err != nil {
				return err
			}
			rows, err := calc.Grid(batches, seqs)
			if err != nil {
				return err
			}
			if asJSON {
				out := kvcalcJSON{
					Model: m, KVTypeK: calc.K, KVTypeV: calc.V, BitsK: calc.KBits, BitsV: calc.VBits,
					KIVIResidual: max(calc.K.Residual(), calc.V.Residual()), WeightsType: calc.Weights,
					KVRatio: opt.Ratio, KVBudget: opt.Budget,
				}
				if len(rows) == 1 {
					out.Row = &rows[0]
				} else {
					out.Rows = rows
				}
				return writeJSON(w, out)
			}
			printKVCalc(w, calc, opt, rows)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&preset, "preset", "", "a built-in model: "+strings.Join(kvcalc.PresetNames(), ", "))
	f.StringVarP(&modelPath, "model", "m", "", "model file: GGUF or llama2.c checkpoint")
	f.StringVar(&batchList, "batch", "1", "batch sizes, comma-separated")
	f.StringVar(&seqList, "seq", "", "tokens per sequence, comma-separated (default: the model's context, else 4096)")
	f.StringVar(&kvType, "kv-type", "f16", "codec of keys and values: f32 f16 bf16 q8 q4 kivi2 kivi4")
	f.StringVar(&kvTypeK, "kv-type-k", "", "codec of keys (overrides --kv-type)")
	f.StringVar(&kvTypeV, "kv-type-v", "", "codec of values (overrides --kv-type)")
	f.StringVar(&weightsType, "weights-type", "", "type the weights are sized in: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, ... (default: f16 for presets, the stored size for files)")
	f.Float64Var(&ratio, "kv-ratio", 0, "fraction of tokens each sequence keeps, in (0, 1]: ⌈R·seq⌉")
	f.IntVar(&budget, "kv-budget", 0, "tokens each sequence keeps: min(N, seq)")
	f.BoolVar(&asJSON, "json", false, "print JSON: one object (a grid's rows in \"rows\")")
	f.BoolVar(&list, "list", false, "list the presets and codecs")
	return c
}

// intList parses a comma-separated list of positive integers.
func intList(flag, s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not an integer", flag, p)
		}
		if n <= 0 {
			return nil, fmt.Errorf("%s: %d must be positive", flag, n)
		}
		out = append(out, n)
	}
	return out, nil
}

func printKVCalc(w io.Writer, c *kvcalc.Calc, opt kvcalc.Options, rows []kvcalc.Row) {
	m := c.Model
	fmt.Fprintf(w, "model      %s: %d layers, %d heads, %d KV heads, head dim %d", m.Name, m.Layers, m.Heads, m.KVHeads, m.HeadDim)
	if m.Context > 0 {
		fmt.Fprintf(w, ", context %d", m.Context)
	}
	if m.Source != "" && m.Source != m.Name {
		fmt.Fprintf(w, "  [%s]", m.Source)
	}
	fmt.Fprintln(w)
	wb := c.WeightsBytes
	if c.Weights == "stored" {
		fmt.Fprintf(w, "weights    %s B as stored (%s params) = %s\n", commas(wb), billions(m.Params), sizes(wb))
	} else {
		fmt.Fprintf(w, "weights    %s params × %s = %s\n", billions(m.Params), c.Weights, sizes(wb))
	}
	fmt.Fprintf(w, "KV codecs  K %s (%s bits/value), V %s (%s bits/value), metadata included\n", c.K, num(c.KBits), c.V, num(c.VBits))
	bpt := c.BytesPerToken()
	tb, td := num(bpt/(1<<20))+" MiB", num(bpt/1e6)+" MB"
	if bpt < 1<<17 {
		tb, td = num(bpt/(1<<10))+" KiB", num(bpt/1e3)+" KB"
	}
	fmt.Fprintf(w, "per token  %s B = %s = %s  (%d layers · %d KV heads · %d dims · (%s + %s) bits / 8)\n",
		bytesStr(bpt), tb, td, m.Layers, m.KVHeads, m.HeadDim, num(c.KBits), num(c.VBits))
	if res := max(c.K.Residual(), c.V.Residual()); res > 0 {
		fmt.Fprintf(w, "KIVI       the last %d tokens of each sequence are counted in f16 (the residual), the rest at the rate above\n", res)
	}
	switch {
	case opt.Budget > 0:
		fmt.Fprintf(w, "budget     each sequence keeps min(%d, seq) tokens\n", opt.Budget)
	case opt.Ratio > 0:
		fmt.Fprintf(w, "budget     each sequence keeps ⌈%g · seq⌉ tokens\n", opt.Ratio)
	}
	var most int64
	for _, r := range rows {
		most = max(most, r.TotalBytes)
	}
	dec, bin, dn, bn := units(most)
	fmt.Fprintf(w, "units      %s = 10^%d bytes, %s = 2^%d bytes\n\n", dn, int(math.Round(math.Log10(dec))), bn, int(math.Round(math.Log2(bin))))
	budget := opt.Budget > 0 || opt.Ratio > 0
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "batch\tseq\t")
	if budget {
		fmt.Fprint(tw, "kept\t")
	}
	fmt.Fprintf(tw, "KV %s\tKV %s\tKV/weights\tKV+weights %s\t\n", dn, bn, dn)
	beyond := false
	for _, r := range rows {
		mark := ""
		if m.Context > 0 && r.Seq > m.Context {
			mark, beyond = "*", true
		}
		fmt.Fprintf(tw, "%d\t%d%s\t", r.Batch, r.Seq, mark)
		if budget {
			fmt.Fprintf(tw, "%d\t", r.Kept)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", gb(r.TotalBytes, dec), gb(r.TotalBytes, bin), ratioStr(r.KVToWeights), gb(r.KVPlusWeightsBytes, dec))
	}
	tw.Flush()
	if beyond {
		fmt.Fprintf(w, "* beyond the trained context of %d tokens\n", m.Context)
	}
}

func printKVCalcList(w io.Writer, asJSON bool) error {
	var out kvcalcListJSON
	out.Presets = kvcalc.Presets()
	for _, c := range kvcalc.Codecs() {
		k, _ := c.KeyBits(128)
		v, _ := c.ValueBits(128)
		out.Codecs = append(out.Codecs, codecBitsJSON{c, k, v, c.Residual()})
	}
	if asJSON {
		return writeJSON(w, out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "preset\tlayers\theads\tKV heads\thead dim\tcontext\tparams\tKV B/token f16\t\n")
	for _, p := range out.Presets {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t\n", p.Name, p.Layers, p.Heads, p.KVHeads, p.HeadDim, p.Context,
			billions(p.Params), commas(4*int64(p.Layers)*int64(p.KVHeads)*int64(p.HeadDim)))
	}
	tw.Flush()
	fmt.Fprintln(w, "\ncodec bits per value at head dim 128, metadata included:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "codec\tK bits\tV bits\tf16 residual\t\n")
	for _, c := range out.Codecs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t\n", c.Name, num(c.BitsK), num(c.BitsV), c.Residual)
	}
	tw.Flush()
	return nil
}

// sizes prints b in decimal and binary units: "350.0 GB = 326.0 GiB".
func sizes(b int64) string {
	dec, bin, dn, bn := units(b)
	return fmt.Sprintf("%s %s = %s %s", gb(b, dec), dn, gb(b, bin), bn)
}

// units picks the decimal and binary units to show b in: KB, MB or GB.
func units(b int64) (dec, bin float64, decName, binName string) {
	switch {
	case b < 1e6:
		return 1e3, 1 << 10, "KB", "KiB"
	case b < 1e9:
		return 1e6, 1 << 20, "MB", "MiB"
	}
	return 1e9, 1 << 30, "GB", "GiB"
}

// gb prints b/unit with three significant digits or one decimal.
func gb(b int64, unit float64) string {
	v := float64(b) / unit
	switch {
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

func ratioStr(r float64) string {
	if r >= 0.01 || r == 0 {
		return fmt.Sprintf("%.2f", r)
	}
	return fmt.Sprintf("%.2g", r)
}

// bytesStr prints a byte count with thousands separators when it is whole.
func bytesStr(v float64) string {
	if v == math.Trunc(v) && v < 1<<62 {
		return commas(int64(v))
	}
	return num(v)
}

// num prints a float without trailing zeros.
func num(v float64) string { return strconv.FormatFloat(math.Round(v*1e4)/1e4, 'f', -1, 64) }

func billions(n int64) string {
	if n >= 1e9 {
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	}
	return fmt.Sprintf("%.2fM", float64(n)/1e6)
}

// commas groups digits by thousands.
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
