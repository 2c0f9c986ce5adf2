package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kvlm/kvlm/eval"
	"github.com/spf13/cobra"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The markers between which kvlm bench report writes its tables into a
// Markdown file (--doc).
const (
	reportBegin = "<!-- kvlm bench report: begin (generated: do not edit by hand) -->"
	reportEnd   = "<!-- kvlm bench report: end -->"
)

// sweepPlotName is the throughput-vs-batch figure's file name.
const sweepPlotName = "bench_sweep.png"

// llamaBench is the part of one llama-bench -o json result the report
// reads.
type llamaBench struct {
	BuildCommit string  `json:"build_commit"`
	Model       string  `json:"model_filename"`
	ModelType   string  `json:"model_type"`
	NPrompt     int     `json:"n_prompt"`
	NGen        int     `json:"n_gen"`
	NDepth      int     `json:"n_depth"`
	TypeK       string  `json:"type_k"`
	TypeV       string  `json:"type_v"`
	AvgTS       float64 `json:"avg_ts"`
}

// benchFile is one input of the report.
type benchFile struct {
	path  string
	kvlm  *benchJSON
	llama []llamaBench
}

func newBenchReport() *cobra.Command {
	var doc, plots string
	c := &cobra.Command{
		Use:   "report FILE.json... [--doc docs/PERFORMANCE.md] [--plots docs/]",
		Short: "Turn kvlm bench --json files (and llama-bench -o json files) into Markdown tables and the throughput-vs-batch PNG",
		Long: `Reads kvlm bench --json outputs and llama-bench -o json outputs (told
apart by their shape) and writes Markdown tables: kvlm beside llama.cpp
(matched by model file name, test — prefill of N tokens, or N tokens
decoded after a context of D — and KV type), prefill and decode, long
contexts with attention's share, compression against the full cache
(predicted and measured speed-ups), throughput at fixed KV memory. Files
of the same configuration are rounds: each table cell is their median.
With --doc the tables replace what stands between the markers
` + reportBegin + ` and ` + reportEnd + ` in that file; without, they
are printed. With --plots the sweep's throughput against batch size is
drawn into DIR/` + sweepPlotName + `.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			files, err := readBenchFiles(args)
			if err != nil {
				return err
			}
			var md bytes.Buffer
			plotRef := ""
			if plots != "" {
				plotRef = sweepPlotName
				if doc != "" {
					if rel, err := filepath.Rel(filepath.Dir(doc), filepath.Join(plots, sweepPlotName)); err == nil {
						plotRef = rel
					}
				}
			}
			drawn, err := writeReport(&md, files, plots, plotRef)
			if err != nil {
				return err
			}
			if plots != "" && !drawn {
				return errors.New("--plots: no file has a --sweep-batch result to plot")
			}
			if doc == "" {
				_, err := cmd.OutOrStdout().Write(md.Bytes())
				return err
			}
			return replaceBetween(doc, md.Bytes())
		},
	}
	c.Flags().StringVar(&doc, "doc", "", "Markdown file whose generated section (between the report's markers) is replaced")
	c.Flags().StringVar(&plots, "plots", "", "directory to write "+sweepPlotName+" into")
	return c
}

func readBenchFiles(paths []string) ([]benchFile, error) {
	var out []benchFile
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		f := benchFile{path: p}
		trim := bytes.TrimSpace(data)
		switch {
		case len(trim) > 0 && trim[0] == '[':
			if err := json.Unmarshal(trim, &f.llama); err != nil {
				return nil, fmt.Errorf("%s: not llama-bench -o json output: %v", p, err)
			}
		default:
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(trim, &raw); err != nil {
				return nil, fmt.Errorf("%s: not a JSON object or array: %v", p, err)
			}
			if _, ok := raw["decode_tok_s"]; !ok {
				return nil, fmt.Errorf("%s: not kvlm bench --json output (no decode_tok_s)", p)
			}
			f.kvlm = &benchJSON{}
			if err := json.Unmarshal(trim, f.kvlm); err != nil {
				return nil, fmt.Errorf("%s: %v", p, err)
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// replaceBetween writes body between the report's markers in the file at
// path.
func replaceBetween(path string, body []byte) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := bytes.Index(old, []byte(reportBegin)), bytes.Index(old, []byte(reportEnd))
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q … %q section to replace", path, reportBegin, reportEnd)
	}
	var b bytes.Buffer
	b.Write(old[:i+len(reportBegin)])
	b.WriteString("\n\n")
	b.Write(body)
	b.WriteString("\n")
	b.Write(old[j:])
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// cells collects the rounds of one table row: the values of each column,
// whose median the row shows.
type cells struct {
	label []string
	vals  [][]float64
}

// table is rows keyed by their labels, in the order first seen.
type table struct {
	order []string
	rows  map[string]*cells
}

func (t *table) add(label []string, vals ...float64) {
	if t.rows == nil {
		t.rows = map[string]*cells{}
	}
	k := strings.Join(label, "\x00")
	r := t.rows[k]
	if r == nil {
		r = &cells{label: label, vals: make([][]float64, len(vals))}
		t.rows[k] = r
		t.order = append(t.order, k)
	}
	for i, v := range vals {
		r.vals[i] = append(r.vals[i], v)
	}
}

// med is the median of a column (the lower middle value of an even count,
// as bench's medians).
func (c *cells) med(i int) float64 {
	if len(c.vals[i]) == 0 {
		return 0
	}
	return median(c.vals[i])
}

func (c *cells) n() int { return len(c.vals[0]) }

func mdRow(w io.Writer, cols ...string) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(cols, " | "))
}

func mdHeader(w io.Writer, cols ...string) {
	mdRow(w, cols...)
	sep := make([]string, len(cols))
	for i := range sep {
		sep[i] = "---"
	}
	mdRow(w, sep...)
}

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }
func pct(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", 100*v)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func sum(x []float64) float64 {
	s := 0.0
	for _, v := range x {
		s += v
	}
	return s
}

func modelName(p string) string { return filepath.Base(p) }

// llamaKV is a llama.cpp cache type in kvlm's codec names (q8_0 → q8).
func llamaKV(k, v string) string {
	name := func(s string) string { return strings.TrimSuffix(strings.TrimSuffix(s, "_0"), "_1") }
	return name(k) + "/" + name(v)
}

// writeReport writes the tables of files to w and, when dir is set, the
// sweep's plot; it returns whether a plot was drawn.
func writeReport(w io.Writer, files []benchFile, dir, plotRef string) (bool, error) {
	var side, runs, long, comp, sweep table
	var commits []string
	// llama.cpp's results by (model, test, KV).
	for _, f := range files {
		for _, l := range f.llama {
			kv := llamaKV(l.TypeK, l.TypeV)
			m := modelName(l.Model)
			switch {
			case l.NGen == 0 && l.NPrompt > 0 && l.NDepth == 0:
				side.add([]string{m, fmt.Sprintf("prefill %d", l.NPrompt), kv}, l.AvgTS, -1)
			case l.NPrompt == 0 && l.NGen > 0:
				side.add([]string{m, fmt.Sprintf("decode %d @%d", l.NGen, l.NDepth), kv}, l.AvgTS, -1)
			}
			if l.BuildCommit != "" && !slices.Contains(commits, l.BuildCommit) {
				commits = append(commits, l.BuildCommit)
			}
		}
	}
	for _, f := range files {
		r := f.kvlm
		if r == nil {
			continue
		}
		m := modelName(r.Model)
		// kvlm's side of a llama.cpp row (only where llama.cpp has it).
		sideAdd := func(test string, v float64) {
			k := strings.Join([]string{m, test, r.KVType}, "\x00")
			if row := side.rows[k]; row != nil {
				row.vals[1] = append(row.vals[1], v)
			}
		}
		if r.Policy == "full" {
			sideAdd(fmt.Sprintf("prefill %d", r.PromptTokens), r.PrefillTokS)
			depth := r.PromptTokens
			if depth <= 1 {
				depth = 0 // one token from BOS: llama-bench's empty context
			}
			sideAdd(fmt.Sprintf("decode %d @%d", r.GenTokens, depth), r.DecodeTokS)
			for _, d := range r.DecodeAt {
				sideAdd(fmt.Sprintf("decode %d @%d", r.CtxGen, d.Context), d.TokS)
			}
		}
		runs.add([]string{m, r.KVType, r.Policy, fmt.Sprint(r.PromptTokens), fmt.Sprint(r.GenTokens)}, r.PrefillTokS, r.DecodeTokS)
		note := ""
		if r.PastTrained {
			note = fmt.Sprintf("past trained %d", r.TrainedCtx)
		}
		for _, d := range r.DecodeAt {
			above := d.ContextShare
			if r.DecodeBaseMS == 0 {
				above = math.NaN() // no base step was measured
			}
			long.add([]string{m, r.KVType, fmt.Sprint(d.Context), note}, d.TokS, d.StepMS, d.AttnMS, d.AttnShare, above, float64(d.KVBytes))
		}
		if c := r.Compression; c != nil {
			p := c.Prediction
			comp.add([]string{m, c.Policy, c.KVType, p.FullKVType, fmt.Sprint(r.PromptTokens), fmt.Sprint(r.GenTokens)},
				p.FullKVBytesDecodeMean, c.KVBytesDecodeMean, p.BytesRatio, p.FullDecodeTokS, c.DecodeTokS,
				p.PredictedSpeedup, p.MeasuredSpeedup, p.GainFraction, c.CompressMS, c.CompressMSPerToken, p.SpeedupWithCompress, p.FullKVShare,
				c.PrefillMS, p.FullPrefillMS, b2f(p.FitOK))
		}
		if s := r.Sweep; s != nil {
			for _, pt := range s.Points {
				sweep.add([]string{m, s.Policy, s.KVType, human(s.KVMem), fmt.Sprint(s.PromptTokens), fmt.Sprint(s.GenTokens), fmt.Sprint(pt.Batch)},
					pt.TokS, pt.DecodeTokS, float64(pt.PeakRunning), pt.MeanRunning, float64(pt.PeakWaiting), float64(pt.Preemptions), float64(pt.Requests))
			}
		}
	}
	if len(side.order) > 0 {
		fmt.Fprintf(w, "#### kvlm beside llama.cpp\n\n")
		if len(commits) > 0 {
			fmt.Fprintf(w, "llama.cpp build %s. ", strings.Join(commits, ", "))
		}
		fmt.Fprintf(w, "tok/s, medians of the rounds (files) given; × is kvlm over llama.cpp.\n\n")
		mdHeader(w, "model", "test", "KV", "llama.cpp", "kvlm", "×", "rounds")
		for _, k := range side.order {
			r := side.rows[k]
			l, kv := median(r.vals[0]), "–"
			ratio := "–"
			var kvals []float64
			for _, v := range r.vals[1] {
				if v >= 0 {
					kvals = append(kvals, v)
				}
			}
			if len(kvals) > 0 {
				kv = f1(median(kvals))
				ratio = f2(median(kvals) / l)
			}
			mdRow(w, r.label[0], r.label[1], r.label[2], f1(l), kv, ratio, fmt.Sprintf("%d / %d", len(r.vals[0]), len(kvals)))
		}
		fmt.Fprintln(w)
	}
	if len(runs.order) > 0 {
		fmt.Fprintf(w, "#### Prefill and decode\n\n")
		mdHeader(w, "model", "KV", "policy", "prompt", "gen", "prefill tok/s", "decode tok/s", "rounds")
		for _, k := range runs.order {
			r := runs.rows[k]
			mdRow(w, append(slices.Clone(r.label), f1(r.med(0)), f1(r.med(1)), fmt.Sprint(r.n()))...)
		}
		fmt.Fprintln(w)
	}
	if len(long.order) > 0 {
		fmt.Fprintf(w, "#### Decode at long contexts\n\n")
		fmt.Fprintf(w, "attention: the attention kernels alone over the cache (every layer, one query), as a share of the step; above base: the step's time beyond a step at --weights-ctx tokens, as a share.\n\n")
		mdHeader(w, "model", "KV", "context", "note", "decode tok/s", "step ms", "attention ms", "attention", "above base", "KV", "rounds")
		for _, k := range long.order {
			r := long.rows[k]
			mdRow(w, append(slices.Clone(r.label), f1(r.med(0)), f2(r.med(1)), f2(r.med(2)), pct(r.med(3)), pct(r.med(4)), human(int64(r.med(5))), fmt.Sprint(r.n()))...)
		}
		fmt.Fprintln(w)
	}
	if len(comp.order) > 0 {
		fmt.Fprintf(w, "#### The speed-ups compression buys\n\n")
		fmt.Fprintf(w, "Predicted: a step's time t0 + τ·bytes, t0 and τ fitted on the full cache (decode after --weights-ctx tokens and after the prompt), at the bytes the compressed cache kept; gain: (measured − 1)/(predicted − 1). KV: the mean bytes a decode step read. Prefill: the compressed run's prompt (its compression step apart) and the full cache's. Fit ok: the rounds whose fit had τ > 0 and t0 > 0 (others mean a load change between the runs).\n\n")
		mdHeader(w, "model", "policy", "KV", "full KV", "prompt", "gen", "KV full", "KV kept", "bytes ÷", "full tok/s", "tok/s", "predicted ×", "measured ×", "gain", "compress ms", "ms/token", "× with step", "KV share (full)", "prefill ms", "full prefill ms", "fit ok", "rounds")
		for _, k := range comp.order {
			r := comp.rows[k]
			mdRow(w, append(slices.Clone(r.label), human(int64(r.med(0))), human(int64(r.med(1))), f2(r.med(2)), f1(r.med(3)), f1(r.med(4)),
				f2(r.med(5)), f2(r.med(6)), pct(r.med(7)), f1(r.med(8)), fmt.Sprintf("%.3f", r.med(9)), f2(r.med(10)), pct(r.med(11)),
				f1(r.med(12)), f1(r.med(13)), fmt.Sprintf("%.0f/%d", sum(r.vals[14]), r.n()), fmt.Sprint(r.n()))...)
		}
		fmt.Fprintln(w)
	}
	drawn := false
	if len(sweep.order) > 0 {
		fmt.Fprintf(w, "#### Throughput at fixed KV memory\n\n")
		fmt.Fprintf(w, "Through the engine: tok/s is every generated token over the wall time (prefill included); decode-step tok/s counts the steps that ran no prompt tokens; decoded: the most (mean) tokens a scheduler step generated, about the samples decoded together; waiting: the most requests and preempted samples waiting after a step.\n\n")
		if dir != "" {
			if err := plotSweep(filepath.Join(dir, sweepPlotName), &sweep); err != nil {
				return false, err
			}
			drawn = true
			fmt.Fprintf(w, "![throughput against batch size](%s)\n\n", plotRef)
		}
		mdHeader(w, "model", "policy", "KV", "KV memory", "prompt", "gen", "batch", "tok/s", "decode-step tok/s", "decoded", "waiting", "preemptions", "requests", "rounds")
		for _, k := range sweep.order {
			r := sweep.rows[k]
			mdRow(w, append(slices.Clone(r.label), f1(r.med(0)), f1(r.med(1)), fmt.Sprintf("%.0f (%.1f)", r.med(2), r.med(3)),
				fmt.Sprintf("%.0f", r.med(4)), fmt.Sprintf("%.0f", r.med(5)), fmt.Sprintf("%.0f", r.med(6)), fmt.Sprint(r.n()))...)
		}
		fmt.Fprintln(w)
	}
	return drawn, nil
}

var sweepColors = []color.RGBA{
	{0, 0, 0, 255}, {31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255},
}

// plotSweep draws tok/s against batch size (log 2), one line per
// configuration (model, policy, KV, memory, prompt, gen).
func plotSweep(path string, t *table) error {
	series := map[string]plotter.XYs{}
	var names []string
	for _, k := range t.order {
		r := t.rows[k]
		name := fmt.Sprintf("%s, %s, %s", r.label[1], r.label[2], r.label[3])
		if _, ok := series[name]; !ok {
			names = append(names, name)
		}
		var b float64
		fmt.Sscan(r.label[6], &b)
		series[name] = append(series[name], plotter.XY{X: b, Y: r.med(0)})
	}
	p := plot.New()
	p.Title.Text = "Generated tokens/s against batch size at fixed KV memory"
	p.X.Label.Text = "batch (requests at once, at most running)"
	p.Y.Label.Text = "generated tokens/s (prefill included)"
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, xy := range series {
		for _, pt := range xy {
			if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == pt.X }) {
				ticks = append(ticks, plot.Tick{Value: pt.X, Label: fmt.Sprint(pt.X)})
			}
		}
	}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.ConstantTicks(ticks), eval.ExactTicks{}
	p.Add(plotter.NewGrid())
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = false, false
	for i, name := range names {
		xy := series[name]
		sort.Slice(xy, func(a, b int) bool { return xy[a].X < xy[b].X })
		l, s, err := plotter.NewLinePoints(xy)
		if err != nil {
			return err
		}
		c := sweepColors[i%len(sweepColors)]
		l.LineStyle = draw.LineStyle{Color: c, Width: vg.Points(1.5)}
		s.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(3), Shape: draw.CircleGlyph{}}
		p.Add(l, s)
		p.Legend.Add(name, l, s)
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}
