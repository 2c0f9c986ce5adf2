package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcalc"
	"github.com/kvlm/kvlm/model"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// mapFlags describe a preset's KV source map (docs/KVCALC.md): one
// architecture (--cla, --yoco, --lckv, --local-global, or the map itself
// with --kv-source), windows over it (--window, --layer-window).
type mapFlags struct {
	cla, yoco, lckv, window int
	localGlobal             string
	kvSource, layerWindow   string
}

var (
	mapFlagNames = []string{"kv-source", "cla", "yoco", "lckv", "local-global", "layer-window", "window"}
	mapFlagArchs = []string{"--kv-source", "--cla", "--yoco", "--lckv", "--local-global"}
)

func (mf *mapFlags) register(f *pflag.FlagSet) {
	f.StringVar(&mf.kvSource, "kv-source", "", "KV source of every layer, comma-separated (layer i reads layer src[i]'s KV), as the GGUF's attention.kv_source")
	f.IntVar(&mf.cla, "cla", 0, "Cross-Layer Attention: groups of N layers read their first layer's KV (CLA2: 2)")
	f.IntVar(&mf.yoco, "yoco", 0, "YOCO with self-decoder window W: the first half of the layers slide a window of W, one global KV for the rest")
	f.IntVar(&mf.lckv, "lckv", 0, "Layer-Condensed KV with N warmup layers at the bottom: the others read the top layer's KV")
	f.StringVar(&mf.localGlobal, "local-global", "", "N:W: interleaved layers, N local ones of window W then one global (Gemma-style 5:1024)")
	f.StringVar(&mf.layerWindow, "layer-window", "", "attention window of every layer, comma-separated (0: full), as the GGUF's attention.layer_window")
	f.IntVar(&mf.window, "window", 0, "sliding window of every layer (Mistral's sliding_window)")
}

// given is the first map flag set, "" if none.
func (mf *mapFlags) given(f *pflag.FlagSet) string {
	for _, n := range mapFlagNames {
		if f.Changed(n) {
			return n
		}
	}
	return ""
}

// apply puts the map the flags describe on preset m.
func (mf *mapFlags) apply(f *pflag.FlagSet, m kvcalc.Model) (kvcalc.Model, error) {
	var arch []string
	for _, n := range mapFlagNames[:5] {
		if f.Changed(n) {
			arch = append(arch, "--"+n)
		}
	}
	if len(arch) > 1 {
		return m, fmt.Errorf("give one of %s, not %s together", strings.Join(mapFlagArchs, ", "), strings.Join(arch, " and "))
	}
	if f.Changed("window") && f.Changed("layer-window") {
		return m, errors.New("give --window or --layer-window, not both")
	}
	var mp kvcalc.Map
	var err error
	switch {
	case f.Changed("kv-source"):
		if mp.Source, err = layerList("--kv-source", mf.kvSource, m.Layers, true); err != nil {
			return m, err
		}
	case f.Changed("cla"):
		mp, err = kvcalc.CLA(m.Layers, mf.cla)
	case f.Changed("yoco"):
		mp, err = kvcalc.YOCO(m.Layers, mf.yoco)
	case f.Changed("lckv"):
		mp, err = kvcalc.LCKV(m.Layers, mf.lckv)
	case f.Changed("local-global"):
		n, w, ok := strings.Cut(mf.localGlobal, ":")
		a, err1 := strconv.Atoi(strings.TrimSpace(n))
		b, err2 := strconv.Atoi(strings.TrimSpace(w))
		if !ok || err1 != nil || err2 != nil {
			return m, fmt.Errorf("--local-global %q: want N:W, N local layers of window W per global layer (e.g. 5:1024)", mf.localGlobal)
		}
		mp, err = kvcalc.LocalGlobal(m.Layers, a, b)
	}
	if err != nil {
		return m, err
	}
	if f.Changed("window") || f.Changed("layer-window") {
		if mp.Windows != nil {
			return m, fmt.Errorf("%s sets the windows itself: drop --window and --layer-window", arch[0])
		}
		if f.Changed("window") {
			if mf.window <= 0 {
				return m, fmt.Errorf("--window %d must be positive", mf.window)
			}
			mp.Windows = make([]int, m.Layers)
			for i := range mp.Windows {
				mp.Windows[i] = mf.window
			}
		} else if mp.Windows, err = layerList("--layer-window", mf.layerWindow, m.Layers, false); err != nil {
			return m, err
		}
	}
	if mp.Source == nil && mp.Windows == nil {
		return m, nil
	}
	return kvcalc.WithMap(m, mp)
}

// layerList parses one non-negative integer per layer.
func layerList(flag, s string, layers int, isLayer bool) ([]int, error) {
	parts := strings.Split(s, ",")
	if len(parts) != layers {
		return nil, fmt.Errorf("%s has %d entries; the model has %d layers", flag, len(parts), layers)
	}
	out := make([]int, layers)
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s: entry %d, %q, is not a non-negative integer", flag, i, strings.TrimSpace(p))
		}
		if isLayer && n >= layers {
			return nil, fmt.Errorf("%s: entry %d reads layer %d; the model has layers 0…%d", flag, i, n, layers-1)
		}
		out[i] = n
	}
	return out, nil
}

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
	// The pool the bytes are counted in: its block size and one block's
	// bytes per (layer, KV head): keys, values and positions.
	KVBlockTokens int `json:"kv_block_tokens"`
	BlockBytes    int `json:"block_bytes"`
	// The cache layers (KV owners) and, per cache layer, the window that
	// bounds it (absent when none does); the chunk appends arrive in and
	// the most bytes the bounded layers of a sequence hold.
	KVLayers         int   `json:"kv_layers"`
	KVWindows        []int `json:"kv_windows,omitempty"`
	Chunk            int   `json:"chunk"`
	WindowBoundBytes int64 `json:"window_bound_bytes,omitempty"`
	*kvcalc.Row
	Rows []kvcalc.Row `json:"rows,omitempty"`
}

type kvcalcListJSON struct {
	Presets []kvcalc.Model  `json:"presets"`
	Codecs  []codecBitsJSON `json:"codecs"`
}

type codecBitsJSON struct {
	Name     kvcalc.Codec `json:"name"`
	BitsK    float64      `json:"bits_per_value_k"` // at head dim 128, by the formula
	BitsV    float64      `json:"bits_per_value_v"`
	Residual int          `json:"residual_tokens,omitempty"`
	// PoolBits is a kvlm pool's bits per cached value (K and V together,
	// positions included) at head dim 128 in blocks of 16.
	PoolBits float64 `json:"pool_bits_per_value"`
}

func newKVCalc() *cobra.Command {
	var (
		preset, modelPath, batchList, seqList string
		kvType, kvTypeK, kvTypeV, weightsType string
		ratio                                 float64
		budget, block, chunk                  int
		asJSON, list                          bool
		mf                                    mapFlags
	)
	c := &cobra.Command{
		Use:   "kvcalc --preset NAME | -m MODEL [--batch B,... --seq S,... --kv-type T]",
		Short: "Size the KV cache of a model for batches of sequences, in any KV codec",
		Long: `Size the KV cache as a kvlm block pool holds it (what --kv-mem buys):
per (layer, KV head), blocks of --kv-block tokens, each block its keys and
values (codec metadata included) and a 4-byte position per slot; a sequence
takes ⌈tokens/block⌉ blocks (KIVI: tokens sealed in groups, the newest in an
f16 residual buffer). Beside it, the formula per_token = 2 · layers ·
kv_heads · head_dim · bytes per value, total = per_token · tokens · batch
(no positions, no blocks). K and V each in their own codec, an optional
budget of tokens kept per sequence. Weights are sized as params × the
--weights-type (f16 unless a model file is given, whose stored size is
used). GB = 10^9 bytes, GiB = 2^30 bytes.

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
				if m, err = mf.apply(flags, m); err != nil {
					return err
				}
			case modelPath != "":
				if f := mf.given(flags); f != "" {
					return fmt.Errorf("--%s describes a preset's KV map; -m reads the map from the file", f)
				}
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
			if block <= 0 {
				return fmt.Errorf("--kv-block %d must be positive", block)
			}
			opt.BlockTokens = block
			if chunk <= 0 {
				return fmt.Errorf("--chunk %d must be positive", chunk)
			}
			opt.Chunk = chunk
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
					KVRatio: opt.Ratio, KVBudget: opt.Budget, KVBlockTokens: calc.Pool.BlockTokens, BlockBytes: calc.Pool.BlockBytes,
					KVLayers: calc.Layout.Layers, KVWindows: calc.Layout.Windows, Chunk: calc.Chunk, WindowBoundBytes: calc.BoundBytes(),
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
	f.StringVar(&kvType, "kv-type", "f16", "codec of keys and values: f32 f16 bf16 q8 q4 kivi2 kivi4 (q8dot and q4dot size as q8 and q4)")
	f.StringVar(&kvTypeK, "kv-type-k", "", "codec of keys (overrides --kv-type)")
	f.StringVar(&kvTypeV, "kv-type-v", "", "codec of values (overrides --kv-type)")
	f.StringVar(&weightsType, "weights-type", "", "type the weights are sized in: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, ... (default: f16 for presets, the stored size for files)")
	f.Float64Var(&ratio, "kv-ratio", 0, "fraction of tokens each sequence keeps, in (0, 1]: ⌈R·seq⌉")
	f.IntVar(&budget, "kv-budget", 0, "tokens each sequence keeps: min(N, seq)")
	f.IntVar(&block, "kv-block", kvcache.DefaultBlockTokens, "pool block size in tokens, as generate/serve --kv-block")
	f.IntVar(&chunk, "chunk", model.DefaultChunk, "tokens one append brings (prefill chunk, as generate/serve --chunk): a window-bounded layer holds at most window + chunk + block tokens")
	mf.register(f)
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
	fmt.Fprintf(w, "KV codecs  K %s (%s bits/value), V %s (%s bits/value), metadata included, by the formula\n", c.K, num(c.KBits), c.V, num(c.VBits))
	f := c.Pool
	tables := int64(c.Layout.Layers) * int64(m.KVHeads)
	if m.Shared() {
		printKVCalcMap(w, c)
	}
	bpt := c.BytesPerToken()
	grow := c.GrowingLayers()
	fmt.Fprintf(w, "per token  %s B = %s = %s in a kvlm pool  (%d layers · %d KV heads · %s B per block of %d: keys %s + values %s + positions %d)\n",
		bytesStr(bpt), binUnit(bpt), decUnit(bpt), grow, m.KVHeads, commas(int64(f.BlockBytes)), f.BlockTokens,
		commas(int64(f.KBytes)), commas(int64(f.VBytes)), kvcache.PosBytes*f.BlockTokens)
	fbpt := c.FormulaBytesPerToken()
	fmt.Fprintf(w, "formula    %s B = %s = %s  (2 · %d layers · %d KV heads · %d dims · (%s + %s) bits / 16; no positions, no blocks)\n",
		bytesStr(fbpt), binUnit(fbpt), decUnit(fbpt), grow, m.KVHeads, m.HeadDim, num(c.KBits), num(c.VBits))
	if res := max(c.K.Residual(), c.V.Residual()); res > 0 {
		unsealed := 0 // window-bounded layers whose window fits in the residual
		for _, win := range c.Layout.Windows {
			if f.Unsealed(win) {
				unsealed++
			}
		}
		sealing := tables - int64(unsealed)*int64(m.KVHeads)
		fmt.Fprintf(w, "KIVI       the pool seals %d tokens at a time once %d wait; the newest (%d to %d past %d) stay in an f16 residual buffer of %d slots × %s B per (layer, KV head) (%s B per sequence); per token above is the sealed rate\n",
			f.SealTokens, f.Residual+f.SealTokens, f.Residual, f.Residual+f.SealTokens-1, f.Residual, f.Residual+f.SealTokens, commas(int64(f.ResidualSlotBytes)),
			commas(sealing*int64(f.Residual+f.SealTokens)*int64(f.ResidualSlotBytes)))
		if unsealed > 0 {
			fmt.Fprintf(w, "           %d window-bounded layers (window ≤ %d, all of it f16 under KIVI) are never sealed: each (layer, KV head) holds its window in the residual alone, max(window, held) slots, no blocks\n",
				unsealed, f.Residual)
		}
		fmt.Fprintf(w, "           the formula counts the last %d tokens of each sequence in f16 (the residual), the rest at its rate\n", res)
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
	kivi := max(c.K.Residual(), c.V.Residual()) > 0
	fmt.Fprintf(tw, "blocks\tKV %s\tKV %s\tformula %s\t", dn, bn, dn)
	if kivi {
		fmt.Fprintf(tw, "--kv-mem %s\t", dn)
	}
	fmt.Fprintf(tw, "KV/weights\tKV+weights %s\t\n", dn)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t", commas(int64(r.Batch)*r.Blocks), gb(r.TotalBytes, dec), gb(r.TotalBytes, bin), gb(r.FormulaTotalBytes, dec))
		if kivi {
			fmt.Fprintf(tw, "%s\t", gb(r.KVMemBytes, dec))
		}
		fmt.Fprintf(tw, "%s\t%s\t\n", ratioStr(r.KVToWeights), gb(r.KVPlusWeightsBytes, dec))
	}
	tw.Flush()
	fmt.Fprintf(w, "blocks, KV, KV/weights: the kvlm pool (every sequence's blocks, KIVI residual buffers included); formula: the per-token formula × kept tokens\n")
	if kivi {
		fmt.Fprintf(w, "--kv-mem: the block arena that admits these tokens however they arrive (admission counts residual tokens as needing blocks; the residual buffers are allocated beside the arena)\n")
	}
	if beyond {
		fmt.Fprintf(w, "* beyond the trained context of %d tokens\n", m.Context)
	}
}

// printKVCalcMap says which layers keep KV and which of them a window bounds.
func printKVCalcMap(w io.Writer, c *kvcalc.Calc) {
	m, l := c.Model, c.Layout
	fmt.Fprintf(w, "KV map     %d of %d layers keep KV", l.Layers, m.Layers)
	if l.Layers < m.Layers {
		fmt.Fprint(w, " (the others read them)")
	}
	if b := l.Layers - c.GrowingLayers(); b > 0 {
		var ws []string
		seen := map[int]bool{}
		for _, x := range l.Windows {
			if x > 0 && !seen[x] {
				seen[x] = true
				ws = append(ws, strconv.Itoa(x))
			}
		}
		bb := c.BoundBytes()
		fmt.Fprintf(w, "; %d of them window-bounded (window %s): at most %s B = %s per sequence in appends of %d tokens", b, strings.Join(ws, ", "), commas(bb), decUnit(float64(bb)), c.Chunk)
	}
	fmt.Fprintln(w)
}

func printKVCalcList(w io.Writer, asJSON bool) error {
	var out kvcalcListJSON
	out.Presets = kvcalc.Presets()
	for _, c := range kvcalc.Codecs() {
		k, _ := c.KeyBits(128)
		v, _ := c.ValueBits(128)
		f, err := kvcalc.PoolFootprint(c, c, kvcache.DefaultBlockTokens, 128)
		if err != nil {
			return err
		}
		out.Codecs = append(out.Codecs, codecBitsJSON{c, k, v, c.Residual(), 8 * f.BytesPerToken() / (2 * 128)})
	}
	if asJSON {
		return writeJSON(w, out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "preset\tlayers\theads\tKV heads\thead dim\tcontext\tparams\tKV B/token f16\tformula\t\n")
	for _, p := range out.Presets {
		c, err := kvcalc.New(p, kvcalc.Options{})
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", p.Name, p.Layers, p.Heads, p.KVHeads, p.HeadDim, p.Context,
			billions(p.Params), bytesStr(c.BytesPerToken()), bytesStr(c.FormulaBytesPerToken()))
	}
	tw.Flush()
	fmt.Fprintln(w, "(KV B/token: a kvlm pool of 16-token blocks, positions included; formula: 2 · layers · KV heads · head dim · 2 B)")
	fmt.Fprintln(w, "\ncodec bits per value at head dim 128, metadata included (formula), and in a kvlm pool of 16-token blocks (K and V together, positions included):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "codec\tK bits\tV bits\tf16 residual\tpool bits\t\n")
	for _, c := range out.Codecs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t\n", c.Name, num(c.BitsK), num(c.BitsV), c.Residual, num(c.PoolBits))
	}
	tw.Flush()
	return nil
}

// binUnit and decUnit print a per-token size in KiB/MiB and KB/MB.
func binUnit(v float64) string {
	if v < 1<<17 {
		return num(v/(1<<10)) + " KiB"
	}
	return num(v/(1<<20)) + " MiB"
}

func decUnit(v float64) string {
	if v < 1<<17 {
		return num(v/1e3) + " KB"
	}
	return num(v/1e6) + " MB"
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
