package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/kvcache"
	"github.com/kvlm/kvlm/kvcalc"
	"github.com/kvlm/kvlm/model"
	"github.com/spf13/cobra"
)

type inspectJSON struct {
	Format       string            `json:"format"`
	Version      uint32            `json:"version,omitempty"`
	Config       model.Config      `json:"config"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Tensors      []tensorJSON      `json:"tensors,omitempty"`
	WeightsBytes int64             `json:"weights_bytes"`
	// KV cache per token with keys and values in each codec: what a kvlm
	// pool of KVBlockTokens-token blocks holds (positions and codec
	// metadata included; kvcalc's bytes_per_token), and the textbook
	// formula 2 · layers · kv_heads · head_dim · bits/8 beside it.
	KVBlockTokens          int                `json:"kv_block_tokens"`
	KVBytesPerToken        map[string]float64 `json:"kv_bytes_per_token"`
	KVFormulaBytesPerToken map[string]float64 `json:"kv_formula_bytes_per_token"`
	// KVContextBytes is the pool's cache of one sequence at the full
	// context, per codec (kvcalc's total_bytes).
	KVContextBytes map[string]int64 `json:"kv_context_bytes"`

	kivi kvcache.Footprint // a KIVI table (for the residual note)
	grow int               // cache layers that grow per token (KV owners without a window)
}

type tensorJSON struct {
	Name  string   `json:"name"`
	Type  string   `json:"type"`
	Shape []uint64 `json:"shape"`
	Bytes uint64   `json:"bytes"`
}

func newInspect() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "inspect MODEL",
		Short: "Show a model file's metadata, tensors, sizes and KV bytes per token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := resolveModel(args[0])
			if err != nil {
				return err
			}
			var info inspectJSON
			isGGUF, err := engine.IsGGUF(path)
			if err != nil {
				return err
			}
			if isGGUF {
				f, err := gguf.Open(path)
				if err != nil {
					return err
				}
				defer f.Close()
				info.Format, info.Version = "gguf", f.Version
				info.Metadata = map[string]string{}
				for _, kv := range f.KVs {
					info.Metadata[kv.Key] = summarize(kv)
				}
				for _, t := range f.Tensors {
					info.Tensors = append(info.Tensors, tensorJSON{t.Name, t.Type.String(), t.Shape, t.Size})
					info.WeightsBytes += int64(t.Size)
				}
				cfg, err := model.ConfigFromGGUF(f)
				if err != nil {
					return err
				}
				info.Config = cfg
			} else {
				m, err := model.LoadLlama2C(path)
				if err != nil {
					return err
				}
				defer m.Close()
				info.Format, info.Config, info.WeightsBytes = "llama2.c", m.Config, m.WeightsBytes()
			}
			if err := info.kvSizes(); err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), info)
			}
			printInspect(cmd.OutOrStdout(), path, info)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return c
}

// kvSizes fills the KV sizes from kvcalc, which reads them off the pool's
// definition (kvcache.Footprint).
func (info *inspectJSON) kvSizes() error {
	c := info.Config
	m := kvcalc.FromConfig(c.Arch, c) // the map's owners and windows included
	info.KVBlockTokens = kvcache.DefaultBlockTokens
	info.KVBytesPerToken, info.KVFormulaBytesPerToken, info.KVContextBytes = map[string]float64{}, map[string]float64{}, map[string]int64{}
	for _, cd := range kvcalc.Codecs() {
		calc, err := kvcalc.New(m, kvcalc.Options{K: cd, V: cd, BlockTokens: info.KVBlockTokens})
		if err != nil {
			return err
		}
		row, err := calc.Row(1, c.CtxLen)
		if err != nil {
			return err
		}
		info.KVBytesPerToken[string(cd)], info.KVFormulaBytesPerToken[string(cd)] = row.BytesPerToken, row.FormulaBytesPerToken
		info.KVContextBytes[string(cd)] = row.TotalBytes
		if cd == kvcalc.KIVI2 {
			info.kivi = calc.Pool
		}
		info.grow = calc.GrowingLayers()
	}
	return nil
}

func summarize(kv gguf.KV) string {
	if a, ok := kv.Value.(gguf.Array); ok {
		n := a.Len()
		s := fmt.Sprintf("[%s × %d]", a.Elem, n)
		if strs, ok := a.Values.([]string); ok && n > 0 {
			k := min(n, 5)
			q := make([]string, k)
			for i := range q {
				q[i] = fmt.Sprintf("%q", strs[i])
			}
			s += " " + strings.Join(q, " ")
			if n > k {
				s += " …"
			}
		}
		return s
	}
	if str, ok := kv.Value.(string); ok {
		if len(str) > 120 {
			str = str[:120] + "…"
		}
		return fmt.Sprintf("%q", str)
	}
	return fmt.Sprint(kv.Value)
}

func printInspect(w io.Writer, path string, info inspectJSON) {
	c := info.Config
	fmt.Fprintf(w, "%s: %s", path, info.Format)
	if info.Version > 0 {
		fmt.Fprintf(w, " v%d", info.Version)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "architecture %s: dim %d, hidden %d, %d layers, %d heads, %d KV heads, head dim %d, vocab %d, context %d, rope %s θ=%g, eps %g",
		c.Arch, c.Dim, c.HiddenDim, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.Vocab, c.CtxLen, c.Rope, c.RopeTheta, c.NormEps)
	if model.Archs[c.Arch].Fused {
		fmt.Fprintf(w, ", fused QKV and gate/up matrices")
	}
	if c.LongRope != "" {
		fmt.Fprintf(w, ", LongRoPE: the %s factor set (context %d against the original %d)", c.LongRope, c.CtxLen, c.RopeOrigCtx)
	}
	if c.RopeAttnFactor != 0 {
		fmt.Fprintf(w, ", RoPE attention factor %g", c.RopeAttnFactor)
	}
	if c.QKNorm {
		fmt.Fprintf(w, ", Q/K norm (every query and key head RMS-normalised before RoPE)")
	}
	if c.EmbedScale != 0 {
		fmt.Fprintf(w, ", embedding ×%g", c.EmbedScale)
	}
	if c.PostNorms {
		fmt.Fprintf(w, ", post-norms (attention and FFN outputs RMS-normalised before the residual)")
	}
	if c.GELU {
		fmt.Fprintf(w, ", GeGLU FFN (tanh GELU)")
	}
	if c.AttnScale != 0 {
		fmt.Fprintf(w, ", query scale %g", c.AttnScale)
	}
	if c.AttnSoftcap != 0 {
		fmt.Fprintf(w, ", attention soft-cap %g", c.AttnSoftcap)
	}
	if c.FinalSoftcap != 0 {
		fmt.Fprintf(w, ", final logit soft-cap %g", c.FinalSoftcap)
	}
	if c.LocalRopeTheta != 0 {
		var local []int
		for i := 0; i < c.Layers; i++ {
			if c.Window(i) > 0 {
				local = append(local, i)
			}
		}
		fmt.Fprintf(w, ", local layers %s (window %d, rope θ=%g; the others global)", layerRanges(local), c.Window(local[0]), c.LocalRopeTheta)
	}
	if c.SlidingWindow > 0 {
		fmt.Fprintf(w, ", sliding window %d (a token attends to the last %d positions, itself included)", c.SlidingWindow, c.SlidingWindow)
	}
	fmt.Fprintln(w)
	if c.IgnoredSlidingWindow > 0 {
		fmt.Fprintf(w, "note: %s.attention.sliding_window = %d is not applied: %s runs full attention (as llama.cpp)\n", c.Arch, c.IgnoredSlidingWindow, c.Arch)
	}
	printKVMap(w, c)
	fmt.Fprintf(w, "weights %s\n", human(info.WeightsBytes))
	fmt.Fprintf(w, "KV cache per token, keys and values in one codec: in a kvlm pool (blocks of %d tokens; codec metadata and each slot's 4-byte position included; as kvcalc, --kv-mem), and by the formula 2 · %d layers · %d KV heads · %d dims · bits/8:\n",
		info.KVBlockTokens, info.grow, c.KVHeads, c.HeadDim)
	if info.grow != c.Layers {
		fmt.Fprintf(w, "  (%d layers: the KV owners the map leaves growing with every token; a window-bounded one stops at its bound, which \"pool at\" counts)\n", info.grow)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  codec\tpool B/token\tformula B/token\tpool at %d tokens\t\n", c.CtxLen)
	for _, cd := range kvcalc.Codecs() {
		n := string(cd)
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t\n", n, num(info.KVBytesPerToken[n]), num(info.KVFormulaBytesPerToken[n]), human(info.KVContextBytes[n]))
	}
	tw.Flush()
	f := info.kivi
	fmt.Fprintf(w, "  (kivi: B/token of tokens sealed into blocks; the newest of each (layer, KV head), %d to %d once past %d, wait in an f16 residual buffer of %d slots of %d B, counted in the context total)\n",
		f.Residual, f.Residual+f.SealTokens-1, f.Residual, f.Residual+f.SealTokens, f.ResidualSlotBytes)
	if len(info.Metadata) > 0 {
		fmt.Fprintln(w, "\nmetadata:")
		keys := make([]string, 0, len(info.Metadata))
		for k := range info.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, k := range keys {
			fmt.Fprintf(tw, "  %s\t%s\n", k, info.Metadata[k])
		}
		tw.Flush()
	}
	if len(info.Tensors) > 0 {
		fmt.Fprintf(w, "\ntensors (%d):\n", len(info.Tensors))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, t := range info.Tensors {
			fmt.Fprintf(tw, "  %s\t%s\t%v\t%s\n", t.Name, t.Type, t.Shape, human(int64(t.Bytes)))
		}
		tw.Flush()
	}
}

// printKVMap prints the KV source map and per-layer windows of a model
// that has them (docs/ARCHITECTURES.md): per layer its source, window and
// whether it owns a cache layer (and who reads it) or reads one.
func printKVMap(w io.Writer, c model.Config) {
	if c.KVSource == nil && c.LayerWindows == nil {
		return
	}
	owners := c.Owners()
	fmt.Fprintf(w, "KV source map (%s.%s, %s.%s): %d of %d layers own KV (the cache layers)\n",
		c.Arch, model.KeyKVSource, c.Arch, model.KeyLayerWindow, len(owners), c.Layers)
	readers := c.Readers()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  layer\tsource\twindow\tKV\n")
	for i := 0; i < c.Layers; i++ {
		win := "full"
		if wi := c.Window(i); wi > 0 {
			win = fmt.Sprint(wi)
		}
		cl := c.CacheLayer(i)
		var kv string
		switch src := c.Source(i); {
		case src == i:
			r := make([]string, len(readers[cl]))
			for j, l := range readers[cl] {
				r[j] = fmt.Sprint(l)
			}
			kv = fmt.Sprintf("owns cache layer %d, read by layers %s", cl, strings.Join(r, " "))
		case src < i:
			kv = fmt.Sprintf("reads layer %d's KV (cache layer %d)", src, cl)
		default:
			kv = fmt.Sprintf("reads later layer %d's KV (cache layer %d): masked diagonal, dummy KV", src, cl)
		}
		fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\n", i, c.Source(i), win, kv)
	}
	tw.Flush()
}

// layerRanges writes ascending layer indexes as ranges: 0-4, 6-10.
func layerRanges(ls []int) string {
	var parts []string
	for i := 0; i < len(ls); {
		j := i
		for j+1 < len(ls) && ls[j+1] == ls[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ls[i], ls[j]))
		} else {
			parts = append(parts, fmt.Sprint(ls[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}
