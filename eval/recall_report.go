package eval

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// RecallAgg is the cells of one (model, method, ratio, codec, schedule,
// protocol, task) pooled over contexts and depths.
type RecallAgg struct {
	Model, Method, Codec, Schedule, Protocol, Task string
	Ratio                                          float64
	N, Correct                                     int
	Parts, PartsOK, Confused                       int // answer parts scored, right, wrong but another value of the context
	Acc, Lo, Hi, Chance, KVBytes                   float64
	Error                                          string
}

// AggregateRecall pools the cells over contexts and depths. The accuracy
// is the mean of the cells' (each context and depth weighs the same, however
// many samples its cell ran: with --margin a cell near ½ runs more), its
// interval Wilson's at that mean on the effective sample size of the
// stratified mean, p̄(1−p̄) / Σ pᵢ(1−pᵢ)/(nᵢ·C²) over C cells, at most the
// samples run. With every cell of n samples that is the pooled count's
// Wilson interval (the stratified variance is never above the pooled
// one).
func AggregateRecall(cells []RecallCell) []RecallAgg {
	var out []RecallAgg
	type strata struct {
		sum, vr float64 // Σ pᵢ, Σ pᵢ(1−pᵢ)/nᵢ
		c       int
	}
	var st []strata
	idx := map[string]int{}
	for _, c := range cells {
		k := fmt.Sprint(c.Model, c.Method, c.Ratio, c.Codec, c.Schedule, c.Protocol, c.Task)
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, RecallAgg{Model: c.Model, Method: c.Method, Codec: c.Codec, Schedule: c.Schedule,
				Protocol: c.Protocol, Task: c.Task, Ratio: c.Ratio, Chance: c.Chance})
			st = append(st, strata{})
		}
		a := &out[i]
		if c.Error != "" {
			a.Error = c.Error
			continue
		}
		a.KVBytes = (a.KVBytes*float64(a.N) + c.KVBytes*float64(c.N)) / float64(a.N+c.N)
		a.N += c.N
		a.Correct += c.Correct
		a.Parts += c.Parts
		a.PartsOK += c.PartsOK
		a.Confused += c.PartsConfused
		if c.N > 0 {
			p := float64(c.Correct) / float64(c.N)
			st[i].sum += p
			st[i].vr += p * (1 - p) / float64(c.N)
			st[i].c++
		}
	}
	for i := range out {
		a, s := &out[i], st[i]
		if a.N == 0 {
			continue
		}
		C := float64(s.c)
		a.Acc = s.sum / C
		n := float64(a.N)
		if v := s.vr / (C * C); v > 0 {
			n = min(n, a.Acc*(1-a.Acc)/v)
		}
		a.Lo, a.Hi = wilsonP(a.Acc, n, Z95)
	}
	return out
}

func findAgg(aggs []RecallAgg, model, method string, ratio float64, codec, sched, proto, task string) *RecallAgg {
	for i := range aggs {
		a := &aggs[i]
		if a.Model == model && a.Method == method && a.Task == task && a.Protocol == proto &&
			(method == "full" || (a.Ratio == ratio && a.Codec == codec && (a.Schedule == sched || a.Schedule == SchedOwn))) {
			return a
		}
	}
	return nil
}

func pct(a *RecallAgg) string {
	if a == nil {
		return "–"
	}
	if a.Error != "" || a.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f [%.1f, %.1f]", 100*a.Acc, 100*a.Lo, 100*a.Hi)
}

// recallView is the codec and schedule the tables and maps rank on: f16
// after the prompt, when measured.
func recallView(cfg RecallConfig) (codec, sched string) {
	codec, sched = "f16", SchedPrefill
	if len(cfg.Codecs) > 0 && !slices.Contains(cfg.Codecs, codec) {
		codec = cfg.Codecs[0]
	}
	if len(cfg.Schedules) > 0 && !slices.Contains(cfg.Schedules, sched) {
		sched = cfg.Schedules[0]
	}
	return
}

// OverBytes is how far past the ratio's bytes a method may keep and still
// rank among the ratio's methods: 1.25 times the median of their KV bytes.
const OverBytes = 1.25

// taskMean is the mean of f over the cells of method m at ratio, codec
// and schedule, query-aware, one per task of tasks; ok is false unless
// every task was measured.
func taskMean(aggs []RecallAgg, tasks []string, model, m string, ratio float64, codec, sched string, f func(*RecallAgg) float64) (mean float64, ok bool) {
	s, n := 0.0, 0
	for _, t := range tasks {
		if a := findAgg(aggs, model, m, ratio, codec, sched, ProtoAware, t); a != nil && a.Error == "" && a.N > 0 {
			s += f(a)
			n++
		}
	}
	if n == 0 || n < len(tasks) {
		return 0, false
	}
	return s / float64(n), true
}

func accuracy(a *RecallAgg) float64 { return a.Acc }
func kvBytes(a *RecallAgg) float64  { return a.KVBytes }

// RecallBytesShare is, for each compressing method of model at ratio, its
// mean KV bytes over the median of the methods' (1: the ratio's bytes). A
// method above OverBytes keeps more than the ratio asks (PyramidInfer's own
// schedule, MiniCache's merge) and ranks after the others.
func RecallBytesShare(r *RecallResults, model string, ratio float64) map[string]float64 {
	return bytesShare(r, AggregateRecall(r.Cells), model, ratio)
}

func bytesShare(r *RecallResults, aggs []RecallAgg, model string, ratio float64) map[string]float64 {
	codec, sched := recallView(r.Config)
	bytes := map[string]float64{}
	var all []float64
	for _, m := range r.Config.Methods {
		if m == "full" {
			continue
		}
		if b, ok := taskMean(aggs, r.Config.Tasks, model, m, ratio, codec, sched, kvBytes); ok && b > 0 {
			bytes[m] = b
			all = append(all, b)
		}
	}
	if len(all) == 0 {
		return bytes
	}
	slices.Sort(all)
	med := all[len(all)/2]
	if len(all)%2 == 0 {
		med = (all[len(all)/2-1] + all[len(all)/2]) / 2
	}
	for m := range bytes {
		bytes[m] /= med
	}
	return bytes
}

// RankRecall is the compressing methods of model at ratio, best mean
// accuracy over the tasks first (query-aware, the view's codec and
// schedule): first those within OverBytes of the ratio's bytes
// (RecallBytesShare), then those keeping more, so the best method is one
// that keeps what the ratio allows.
func RankRecall(r *RecallResults, model string, ratio float64) []string {
	return rankRecall(r, AggregateRecall(r.Cells), model, ratio)
}

func rankRecall(r *RecallResults, aggs []RecallAgg, model string, ratio float64) []string {
	codec, sched := recallView(r.Config)
	share := bytesShare(r, aggs, model, ratio)
	type ms struct {
		m    string
		s    float64
		over bool
	}
	var out []ms
	for _, m := range r.Config.Methods {
		if m == "full" {
			continue
		}
		if acc, ok := taskMean(aggs, r.Config.Tasks, model, m, ratio, codec, sched, accuracy); ok {
			out = append(out, ms{m, acc, share[m] > OverBytes})
		}
	}
	slices.SortStableFunc(out, func(a, b ms) int {
		if a.over != b.over {
			if a.over {
				return 1
			}
			return -1
		}
		return cmpF(b.s, a.s)
	})
	names := make([]string, len(out))
	for i, o := range out {
		names[i] = o.m
	}
	return names
}

// RecallSectionBegin and RecallSectionEnd delimit the section the command
// writes into a report; the rest of the file is left as it is.
const (
	RecallSectionBegin = "<!-- recall: begin (written by kvlm eval --suite recall; do not edit by hand) -->"
	RecallSectionEnd   = "<!-- recall: end -->"
)

// WriteRecallSection is the Markdown of r: the section between the markers.
func WriteRecallSection(r *RecallResults, figs []Figure, info ReportInfo) string {
	b := &strings.Builder{}
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	cfg := r.Config
	aggs := AggregateRecall(r.Cells)
	codec, sched := recallView(cfg)
	img := func(name string) string { return filepath.ToSlash(filepath.Join(info.ImgDir, name)) }
	models := []string{}
	for _, c := range r.Cells {
		if !slices.Contains(models, c.Model) {
			models = append(models, c.Model)
		}
	}
	p("%s\n\n## Long-context recall (RULER-style)\n\n", RecallSectionBegin)
	p("*Generated by `kvlm eval --suite recall`; do not edit by hand.* Command:\n\n```\n%s\n```\n\n", info.Command)
	commit := info.CommitText()
	p("Code: git commit %s. Raw numbers: [`recall.json`](%s). Wall time %.0f s with %d cells at a time.\n\n", commit, img("recall.json"), r.Wall, max(1, cfg.Workers))
	if info.Rendered != "" {
		p("The tables, ranking and figures were drawn again from that run's numbers by `%s`.\n\n", info.Rendered)
	}
	if cfg.Quick {
		p("**This is a `--quick` run (CI's): %d samples per cell, one method and the full cache; its intervals are wide. It shows the pipeline, not the results.**\n\n", cfg.N)
	}
	p("Models: %s. Contexts: %s tokens (prompt + answer). Tasks (docs/RECALL.md): %s; niah_single at depths %s. ",
		strings.Join(models, ", "), ints(cfg.Contexts), strings.Join(cfg.Tasks, ", "), floats(cfg.Depths))
	if cfg.Margin > 0 {
		lo, hi := cfg.N, 0
		for _, c := range r.Cells {
			if c.Error == "" {
				lo, hi = min(lo, c.N), max(hi, c.N)
			}
		}
		p("Samples per cell: each cell stopped at the first of %d, %d, %d, … or %d samples (evaluation seeds from 0) where its 95%% Wilson interval was within ±%g points; %d to %d here. (Stopping on the interval at a few fixed looks: the intervals are nominal.) ",
			RecallLook, 2*RecallLook, 4*RecallLook, cfg.N, 100*cfg.Margin, lo, hi)
	} else {
		p("%d samples per cell (evaluation seeds 0..%d): a 95%% Wilson interval of ±5 points or better needs %d. ", cfg.N, cfg.N-1, WilsonSamples(0.05, Z95))
	}
	p("A sample is correct when greedy decoding produces every part of its answer exactly (multi-value, multi-query, cwe: all parts). ")
	p("Protocols: %s. Schedules: %s (prefill: compressed once after the prompt; decode: also at every later step). Codecs: %s.\n\n",
		strings.Join(cfg.Protocols, ", "), strings.Join(cfg.Schedules, ", "), strings.Join(cfg.Codecs, ", "))
	if r.PromptReuse > 0 {
		p("Each sample's prompt was computed once per codec and its blocks reused by every method's run as the engine's prefix cache reuses them (a method computes at least the part it reads the queries of: its observation window, or the whole prompt for h2o, expected and pyramidinfer; none in KIVI pools): %.0f%% of the runs' prompt tokens came from it. The answers are those of whole prefills (TestRecallShared).\n\n", 100*r.PromptReuse)
	}

	for _, model := range models {
		if len(models) > 1 {
			p("### Model %s\n\n", model)
		}
		p("#### Full cache (f32)\n\n| task | chance | %s |\n|---|---|%s\n", strings.Join(cfg.Protocols, " | "), strings.Repeat("---|", len(cfg.Protocols)))
		for _, t := range cfg.Tasks {
			row := ""
			ch := 0.0
			for _, pr := range cfg.Protocols {
				a := findAgg(aggs, model, "full", 1, "", "", pr, t)
				row += " | " + pct(a)
				if a != nil {
					ch = a.Chance
				}
			}
			p("| %s | %.3g%%%s |\n", t, 100*ch, row)
		}
		p("\n")
		atChance, measured := true, 0
		for _, t := range cfg.Tasks {
			for _, pr := range cfg.Protocols {
				if a := findAgg(aggs, model, "full", 1, "", "", pr, t); a != nil && a.Error == "" && a.N > 0 {
					measured++
					atChance = atChance && a.Lo <= a.Chance
				}
			}
		}
		if measured > 0 && atChance {
			p("**The full cache itself is at the chance rate on every task and protocol (each interval holds it): %s does not retrieve, so these cells cannot tell the methods apart.** A model trained for recall (issue 27's) is the one to score.\n\n", model)
		}
		for _, ratio := range cfg.Ratios {
			ranked := rankRecall(r, aggs, model, ratio)
			if len(ranked) == 0 {
				continue
			}
			share := bytesShare(r, aggs, model, ratio)
			for _, pr := range cfg.Protocols {
				p("#### Ratio %g, %s, codec %s, schedule %s: accuracy %% [95%% interval], best mean first among the methods within %g× the ratio's KV bytes, then those keeping more\n\n", ratio, pr, codec, sched, OverBytes)
				p("| method | %s | mean | KV bytes ÷ the methods' median |\n|---|%s---|---|\n", strings.Join(cfg.Tasks, " | "), strings.Repeat("---|", len(cfg.Tasks)))
				for _, m := range append([]string{"full"}, ranked...) {
					row, s := "", 0.0
					for _, t := range cfg.Tasks {
						a := findAgg(aggs, model, m, ratio, codec, sched, pr, t)
						row += " | " + pct(a)
						if a != nil {
							s += a.Acc
						}
					}
					sh := "–"
					if v, ok := share[m]; ok {
						sh = fmt.Sprintf("%.2f", v)
						if v > OverBytes {
							sh = "**" + sh + "** (over)"
						}
					}
					p("| %s%s | %.1f | %s |\n", m, row, 100*s/float64(len(cfg.Tasks)), sh)
				}
				p("\n")
			}
		}
		if len(cfg.Codecs)*len(cfg.Schedules) > 1 {
			for _, ratio := range cfg.Ratios {
				p("#### Ratio %g, query-aware: mean accuracy over the tasks %% by codec and schedule\n\n| method |", ratio)
				var cols [][2]string
				for _, c := range cfg.Codecs {
					for _, s := range cfg.Schedules {
						cols = append(cols, [2]string{c, s})
						p(" %s %s |", c, s)
					}
				}
				p("\n|---|%s\n", strings.Repeat("---|", len(cols)))
				for _, m := range rankRecall(r, aggs, model, ratio) {
					p("| %s |", m)
					for _, c := range cols {
						if acc, ok := taskMean(aggs, cfg.Tasks, model, m, ratio, c[0], c[1], accuracy); ok {
							p(" %.1f |", 100*acc)
						} else {
							p(" n/a |")
						}
					}
					p("\n")
				}
				p("\n")
			}
		}
		if r.Confusion {
			writeConfusion(p, r, aggs, model, codec, sched)
		}
		if ranked := rankRecall(r, aggs, model, 0.25); len(ranked) > 0 {
			p("#### Ratio 0.25: the best method against the window-only baseline\n\n")
			win := "window"
			hasWin := slices.Contains(cfg.Methods, win)
			p("Best (mean query-aware accuracy among the methods within %g× the ratio's KV bytes, codec %s, schedule %s): **%s**.", OverBytes, codec, sched, ranked[0])
			if !hasWin {
				p(" The window baseline was not in this run.")
			}
			// The contexts pooled ("all"), then each on its own when
			// there are several.
			ctxs := []string{"all"}
			byCtx := map[string][]RecallAgg{"all": aggs}
			if len(cfg.Contexts) > 1 {
				p(" Pooled over the contexts (all), then at each context.")
				for _, c := range cfg.Contexts {
					k := strconv.Itoa(c)
					ctxs = append(ctxs, k)
					byCtx[k] = AggregateRecall(slices.DeleteFunc(slices.Clone(r.Cells), func(x RecallCell) bool { return x.Context != c }))
				}
			}
			p("\n\n| task | protocol | context | %s | %s | chance |\n|---|---|---|---|---|---|\n", ranked[0], win)
			for _, t := range cfg.Tasks {
				for _, pr := range cfg.Protocols {
					for _, c := range ctxs {
						best := findAgg(byCtx[c], model, ranked[0], 0.25, codec, sched, pr, t)
						w := findAgg(byCtx[c], model, win, 0.25, codec, sched, pr, t)
						ch := 0.0
						if best != nil {
							ch = best.Chance
						}
						p("| %s | %s | %s | %s | %s | %.3g%% |\n", t, pr, c, pct(best), pct(w), 100*ch)
					}
				}
			}
			p("\n")
		}
	}
	p("### Needle in a haystack: accuracy by depth and context\n\n")
	p("Query-aware, codec %s, schedule %s (the full cache in f32); one map per method and ratio.\n\n", codec, sched)
	for _, f := range figs {
		if strings.HasPrefix(f.Name, "recall_niah_") {
			p("![%s](%s)\n\n", f.Title, img(f.Name+".png"))
		}
	}
	p("### Accuracy against KV bytes, per task\n\n")
	p("Every measured (method, ratio, codec) query-aware, schedule %s, pooled over contexts; the grey line is the Pareto frontier.\n\n", sched)
	for _, f := range figs {
		if strings.HasPrefix(f.Name, "recall_pareto_") {
			p("![%s](%s)\n\n", f.Title, img(f.Name+".png"))
		}
	}
	p("%s\n", RecallSectionEnd)
	return b.String()
}

// writeConfusion writes, per ratio (query-aware), how many answer parts
// each method got wrong and how many of those copy another value of the
// context (Confused): a method that loses a needle answers with no value
// of the context, a model that confuses needles with another's.
func writeConfusion(p func(string, ...any), r *RecallResults, aggs []RecallAgg, model, codec, sched string) {
	cfg := r.Config
	tasks := slices.DeleteFunc(slices.Clone(cfg.Tasks), func(t string) bool { return t == TaskCWE })
	if len(tasks) == 0 || !slices.Contains(cfg.Protocols, ProtoAware) {
		return
	}
	for _, ratio := range cfg.Ratios {
		methods := rankRecall(r, aggs, model, ratio)
		if len(methods) == 0 {
			continue
		}
		p("#### Ratio %g, query-aware: wrong answer parts, and how many of them are another value of the context\n\n", ratio)
		p("Each cell: wrong parts of all scored, then the wrong ones that copy another needle's value (another key's or chain's, or another asked part's); the rest match no value in the context, their needle lost.\n\n")
		p("| method | %s |\n|---|%s\n", strings.Join(tasks, " | "), strings.Repeat("---|", len(tasks)))
		for _, m := range append([]string{"full"}, methods...) {
			p("| %s |", m)
			for _, t := range tasks {
				var a *RecallAgg
				if m == "full" {
					a = findAgg(aggs, model, m, 1, "", "", ProtoAware, t)
				} else {
					a = findAgg(aggs, model, m, ratio, codec, sched, ProtoAware, t)
				}
				switch {
				case a == nil || a.Error != "" || a.Parts == 0:
					p(" n/a |")
				case a.PartsOK == a.Parts:
					p(" 0 of %d |", a.Parts)
				default:
					p(" %d of %d: %d another value |", a.Parts-a.PartsOK, a.Parts, a.Confused)
				}
			}
			p("\n")
		}
		p("\n")
	}
}

// UpdateSection replaces the section between begin and end in the file
// at path (appending it when the file has none, creating the file when
// there is none) and leaves the rest of the file as it is.
func UpdateSection(path, section, begin, end string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(old)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	switch {
	case i >= 0 && j > i:
		s = s[:i] + strings.TrimSuffix(section, "\n") + s[j+len(end):]
	case i >= 0 || j >= 0:
		return fmt.Errorf("%s: one of the markers %q and %q is missing", path, begin, end)
	default:
		if s != "" && !strings.HasSuffix(s, "\n\n") {
			s = strings.TrimRight(s, "\n") + "\n\n"
		}
		s += section
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

// PlotRecall draws the needle heat maps and the Pareto plots into dir.
func PlotRecall(dir string, r *RecallResults) ([]Figure, error) {
	var figs []Figure
	cfg := r.Config
	codec, sched := recallView(cfg)
	if len(r.Cells) == 0 {
		return nil, nil
	}
	model := r.Cells[0].Model
	cmap := moreland.SmoothBlueRed()
	cmap.SetMin(0)
	cmap.SetMax(1)
	pal := cmap.Palette(256)
	heat := func(method string, ratio float64) error {
		z := make([][]float64, len(cfg.Contexts))
		var lab plotter.XYLabels
		found := false
		for ri, ctx := range cfg.Contexts {
			z[ri] = make([]float64, len(cfg.Depths))
			for di, d := range cfg.Depths {
				z[ri][di] = math.NaN()
				for _, c := range r.Cells {
					if c.Model == model && c.Method == method && c.Task == TaskNeedle && c.Protocol == ProtoAware && c.Context == ctx && c.Depth == d &&
						(method == "full" || (c.Ratio == ratio && c.Codec == codec && (c.Schedule == sched || c.Schedule == SchedOwn))) && c.Error == "" && c.N > 0 {
						z[ri][di] = c.Acc
						found = true
						lab.XYs = append(lab.XYs, plotter.XY{X: float64(di), Y: float64(len(cfg.Contexts) - 1 - ri)})
						lab.Labels = append(lab.Labels, strconv.Itoa(int(math.Round(100*c.Acc))))
					}
				}
			}
		}
		if !found {
			return nil
		}
		name := fmt.Sprintf("recall_niah_%s_%g", method, ratio)
		title := fmt.Sprintf("niah_single, %s at ratio %g", method, ratio)
		if method == "full" {
			name, title = "recall_niah_full", "niah_single, full cache"
		}
		name = strings.ReplaceAll(name, ".", "p")
		pl := newPlot(title, "needle depth (%)", "context (tokens)")
		hm := plotter.NewHeatMap(grid{z}, pal)
		hm.Min, hm.Max = 0, 1
		hm.NaN = color.Gray{220}
		pl.Add(hm)
		labels, err := plotter.NewLabels(lab)
		if err != nil {
			return err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].XAlign, labels.TextStyle[i].YAlign = draw.XCenter, draw.YCenter
		}
		pl.Add(labels)
		xt := make([]plot.Tick, len(cfg.Depths))
		for i, d := range cfg.Depths {
			xt[i] = plot.Tick{Value: float64(i), Label: strconv.Itoa(int(math.Round(100 * d)))}
		}
		yt := make([]plot.Tick, len(cfg.Contexts))
		for i, c := range cfg.Contexts {
			yt[i] = plot.Tick{Value: float64(len(cfg.Contexts) - 1 - i), Label: strconv.Itoa(c)}
		}
		pl.X.Tick.Marker, pl.Y.Tick.Marker = plot.ConstantTicks(xt), plot.ConstantTicks(yt)
		err = saveFig(dir, name, 8*vg.Inch, vg.Length(1.6+0.5*float64(len(cfg.Contexts)))*vg.Inch, func(dc draw.Canvas) { pl.Draw(dc) })
		if err != nil {
			return err
		}
		figs = append(figs, Figure{Name: name, Title: title + " (% correct)"})
		return nil
	}
	if err := heat("full", 1); err != nil {
		return nil, err
	}
	for _, m := range cfg.Methods {
		if m == "full" {
			continue
		}
		for _, ratio := range cfg.Ratios {
			if err := heat(m, ratio); err != nil {
				return nil, err
			}
		}
	}
	aggs := AggregateRecall(r.Cells)
	for _, t := range cfg.Tasks {
		name := "recall_pareto_" + t
		pl := newPlot(t+": accuracy against KV bytes (query-aware)", "KV bytes after compression (KiB, log scale)", "accuracy")
		pl.X.Scale = plot.LogScale{}
		pl.X.Tick.Marker = plot.TickerFunc(kibTicks)
		var all plotter.XYs
		var entries []legendEntry
		for _, m := range cfg.Methods {
			var pts plotter.XYs
			for _, a := range aggs {
				if a.Model == model && a.Method == m && a.Task == t && a.Protocol == ProtoAware && a.Error == "" && a.N > 0 &&
					(m == "full" || a.Schedule == sched || a.Schedule == SchedOwn) {
					pts = append(pts, plotter.XY{X: a.KVBytes / 1024, Y: a.Acc})
				}
			}
			if len(pts) == 0 {
				continue
			}
			all = append(all, pts...)
			ls, gs := methodStyle(m)
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return nil, err
			}
			sc.GlyphStyle = gs
			pl.Add(sc)
			entries = append(entries, legendEntry{m, lineThumb(ls, &gs)})
		}
		if len(all) == 0 {
			continue
		}
		fl, _ := plotter.NewLine(frontier(all, true))
		fl.LineStyle = draw.LineStyle{Color: color.Gray{150}, Width: vg.Points(2), Dashes: []vg.Length{vg.Points(6), vg.Points(3)}}
		pl.Add(fl)
		lo, hi := all[0].X, all[0].X
		for _, q := range all {
			lo, hi = math.Min(lo, q.X), math.Max(hi, q.X)
		}
		pl.X.Min, pl.X.Max, pl.Y.Min, pl.Y.Max = lo/1.25, hi*1.25, 0, 1.03
		err := saveFig(dir, name, 10*vg.Inch, 4.5*vg.Inch, func(dc draw.Canvas) {
			side := drawTiles(dc, [][]*plot.Plot{{pl}}, 2*vg.Inch)
			drawLegend(side, "method", entries)
		})
		if err != nil {
			return nil, err
		}
		figs = append(figs, Figure{Name: name, Title: t + ": accuracy against KV bytes"})
	}
	return figs, nil
}

// CarrySection is report with old's sections written by the other suites
// (recall, zoo; each kept if report lacks it) appended in their order in
// old: the compress suite rewrites its report whole and must not drop them.
func CarrySection(old, report []byte) []byte {
	s, out := string(old), strings.TrimRight(string(report), "\n")
	type sec struct {
		at   int
		text string
	}
	var secs []sec
	for _, m := range [][2]string{{RecallSectionBegin, RecallSectionEnd}, {ZooSectionBegin, ZooSectionEnd}} {
		i, j := strings.Index(s, m[0]), strings.Index(s, m[1])
		if i < 0 || j < i || strings.Contains(string(report), m[0]) {
			continue
		}
		secs = append(secs, sec{i, s[i : j+len(m[1])]})
	}
	if len(secs) == 0 {
		return report
	}
	slices.SortFunc(secs, func(a, b sec) int { return a.at - b.at })
	for _, x := range secs {
		out += "\n\n" + x.text
	}
	return []byte(out + "\n")
}
