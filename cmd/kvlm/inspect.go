package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/model"
	"github.com/spf13/cobra"
)

type inspectJSON struct {
	Format          string            `json:"format"`
	Version         uint32            `json:"version,omitempty"`
	Config          model.Config      `json:"config"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	Tensors         []tensorJSON      `json:"tensors,omitempty"`
	WeightsBytes    int64             `json:"weights_bytes"`
	KVBytesPerToken map[string]int64  `json:"kv_bytes_per_token"`
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
			perValue := map[string]int64{"f32": 4, "f16": 2}
			info.KVBytesPerToken = map[string]int64{}
			for name, b := range perValue {
				info.KVBytesPerToken[name] = 2 * int64(info.Config.Layers) * int64(info.Config.KVHeads) * int64(info.Config.HeadDim) * b
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
	fmt.Fprintf(w, "architecture %s: dim %d, hidden %d, %d layers, %d heads, %d KV heads, head dim %d, vocab %d, context %d, rope %s θ=%g, eps %g\n",
		c.Arch, c.Dim, c.HiddenDim, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.Vocab, c.CtxLen, c.Rope, c.RopeTheta, c.NormEps)
	fmt.Fprintf(w, "weights %s; KV cache per token: %d B in f32, %d B in f16 (2 · %d layers · %d KV heads · %d dims · bytes)\n",
		human(info.WeightsBytes), info.KVBytesPerToken["f32"], info.KVBytesPerToken["f16"], c.Layers, c.KVHeads, c.HeadDim)
	fmt.Fprintf(w, "KV cache at the full context of %d tokens: %s in f32, %s in f16\n", c.CtxLen,
		human(info.KVBytesPerToken["f32"]*int64(c.CtxLen)), human(info.KVBytesPerToken["f16"]*int64(c.CtxLen)))
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
