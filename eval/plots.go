package eval

import (
	"fmt"
	"image"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/kvlm/kvlm/policy"
)

// Figure is one plot written as PNG and SVG.
type Figure struct {
	Name  string `json:"name"` // file stem: Name.png, Name.svg
	Title string `json:"title"`
}

const pngDPI = 110

// saveFig draws a figure of w × h into dir/name.png and dir/name.svg.
func saveFig(dir, name string, w, h vg.Length, paint func(dc draw.Canvas)) error {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(pngDPI))
	paint(draw.New(img))
	if err := writeTo(filepath.Join(dir, name+".png"), vgimg.PngCanvas{Canvas: img}); err != nil {
		return err
	}
	svg := vgsvg.New(w, h)
	paint(draw.New(svg))
	return writeTo(filepath.Join(dir, name+".svg"), svg)
}

func writeTo(path string, c io.WriterTo) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// methodColors are distinct colours; a method keeps its colour in every
// figure (by its place in policy.Methods).
var methodColors = []color.RGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255},
	{188, 189, 34, 255}, {23, 190, 207, 255}, {0, 0, 128, 255}, {184, 134, 11, 255},
	{0, 100, 0, 255}, {128, 0, 0, 255},
}

var glyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.PyramidGlyph{},
	draw.CrossGlyph{}, draw.PlusGlyph{}, draw.RingGlyph{}, draw.BoxGlyph{}}

func methodIndex(m string) int {
	if i := slices.Index(policy.Methods, m); i >= 0 {
		return i
	}
	h := 0
	for _, c := range m {
		h = h*31 + int(c)
	}
	return len(policy.Methods) + (h&0xffff)%4
}

func methodStyle(m string) (draw.LineStyle, draw.GlyphStyle) {
	if m == "full" {
		return draw.LineStyle{Color: color.Black, Width: vg.Points(1.5)}, draw.GlyphStyle{Color: color.Black, Radius: vg.Points(4), Shape: draw.CircleGlyph{}}
	}
	i := methodIndex(m)
	c := methodColors[i%len(methodColors)]
	ls := draw.LineStyle{Color: c, Width: vg.Points(1.5)}
	if i >= 10 {
		ls.Dashes = []vg.Length{vg.Points(5), vg.Points(2)}
	}
	return ls, draw.GlyphStyle{Color: c, Radius: vg.Points(3.5), Shape: glyphs[i%len(glyphs)]}
}

func newPlot(title, xl, yl string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.X.Label.Text = xl
	p.Y.Label.Text = yl
	p.X.Label.TextStyle.Font.Size = vg.Points(11)
	p.Y.Label.TextStyle.Font.Size = vg.Points(11)
	p.X.Tick.Label.Font.Size = vg.Points(10)
	p.Y.Tick.Label.Font.Size = vg.Points(10)
	p.X.Tick.Marker, p.Y.Tick.Marker = ExactTicks{}, ExactTicks{}
	p.Add(plotter.NewGrid())
	return p
}

// ExactTicks is gonum's default ticker with each label written with the
// digits its value needs. DefaultTicks writes every label to the precision
// of its step's magnitude, so ticks at 2.15, 2.2 and 2.25 read "2.1",
// "2.2", "2.2" (the zoo's Pareto plot, until this ticker).
type ExactTicks struct{}

// Ticks implements plot.Ticker.
func (ExactTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'g', 10, 64)
		}
	}
	return ts
}

// legendBox draws a legend of entries in c, top left.
type legendEntry struct {
	name  string
	thumb []plot.Thumbnailer
}

func drawLegend(c draw.Canvas, title string, entries []legendEntry) {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.TextStyle.Font.Size = vg.Points(11)
	l.ThumbnailWidth = vg.Points(28)
	l.Padding = vg.Points(3)
	if title != "" {
		sty := l.TextStyle
		sty.XAlign = draw.XLeft
		sty.YAlign = draw.YTop
		c.FillText(sty, vg.Point{X: c.Min.X, Y: c.Max.Y}, title)
		c = draw.Crop(c, 0, 0, 0, -vg.Points(22))
	}
	for _, e := range entries {
		l.Add(e.name, e.thumb...)
	}
	l.Draw(c)
}

func lineThumb(ls draw.LineStyle, gs *draw.GlyphStyle) []plot.Thumbnailer {
	line, _ := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}})
	line.LineStyle = ls
	out := []plot.Thumbnailer{line}
	if gs != nil {
		sc, _ := plotter.NewScatter(plotter.XYs{{X: 0, Y: 0}})
		sc.GlyphStyle = *gs
		out = append(out, sc)
	}
	return out
}

// drawTiles lays plots out in rows × cols over c with a right-hand column
// of width side (for a legend), and returns that column's canvas.
func drawTiles(c draw.Canvas, plots [][]*plot.Plot, side vg.Length) draw.Canvas {
	main := draw.Crop(c, 0, -side, 0, 0)
	t := draw.Tiles{Rows: len(plots), Cols: len(plots[0]), PadX: vg.Points(18), PadY: vg.Points(18),
		PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
	cs := plot.Align(plots, t, main)
	for j := range plots {
		for i := range plots[j] {
			if plots[j][i] != nil {
				plots[j][i].Draw(cs[j][i])
			}
		}
	}
	return draw.Crop(c, c.Max.X-c.Min.X-side, 0, vg.Points(10), -vg.Points(10))
}

// streamLabels are the streaming runs in legend order.
func streamStyle(label string) (draw.LineStyle, draw.GlyphStyle) {
	switch label {
	case "dense":
		return methodStyle("full")
	case "window":
		return methodStyle("window")
	case "lminfinite":
		return methodStyle("lminfinite")
	}
	// streaming s=N: shades of the streaming colour, dashed by sinks.
	ls, gs := methodStyle("streaming")
	var s int
	fmt.Sscanf(label, "streaming s=%d", &s)
	base := ls.Color.(color.RGBA)
	f := 1 - 0.18*math.Log2(float64(max(1, s)))
	ls.Color = color.RGBA{uint8(float64(base.R) * f), uint8(float64(base.G) * f), uint8(float64(base.B) * f), 255}
	gs.Color = ls.Color
	ls.Dashes = []vg.Length{vg.Points(2 + float64(s)), vg.Points(2)}
	return ls, gs
}

// PlotStream draws the log-perplexity of each streaming run against
// position, one column per text; the lower row leaves dense attention out
// to show the bounded caches at their own scale.
func PlotStream(dir string, r *Results) (Figure, error) {
	fig := Figure{Name: "stream", Title: "Streaming perplexity: mean NLL against position"}
	var texts []string
	for _, s := range r.Stream {
		if !slices.Contains(texts, s.Text) {
			texts = append(texts, s.Text)
		}
	}
	plots := [][]*plot.Plot{make([]*plot.Plot, len(texts)), make([]*plot.Plot, len(texts))}
	var entries []legendEntry
	var seen []string
	for ti, t := range texts {
		for row := range 2 {
			every := r.Setup.StreamEvery
			p := newPlot(t+": log-perplexity", "position (tokens)", fmt.Sprintf("mean NLL of %d tokens (nats)", every))
			var base []float64 // row 1: the window's curve, subtracted
			if row == 1 {
				p = newPlot(t+": difference from the window", "position (tokens)", "NLL − window's NLL (nats)")
				for _, s := range r.Stream {
					if s.Text == t && s.Method == "window" && s.Error == "" {
						base = s.NLLByWindow
					}
				}
			}
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, s := range r.Stream {
				if s.Text != t || s.Error != "" || (row == 1 && (s.Method == "full" || base == nil)) {
					continue
				}
				xys := make(plotter.XYs, len(s.NLLByWindow))
				for i, v := range s.NLLByWindow {
					if base != nil {
						v -= base[i]
					}
					lo, hi = math.Min(lo, v), math.Max(hi, v)
					xys[i] = plotter.XY{X: float64(i*s.Every) + float64(s.Every)/2, Y: v}
				}
				line, err := plotter.NewLine(xys)
				if err != nil {
					return fig, err
				}
				ls, _ := streamStyle(s.Label)
				line.LineStyle = ls
				p.Add(line)
				if !slices.Contains(seen, s.Label) {
					seen = append(seen, s.Label)
					name := s.Label
					if s.Budget > 0 {
						name = fmt.Sprintf("%s (%d tokens)", s.Label, s.Budget)
					}
					entries = append(entries, legendEntry{name, lineThumb(ls, nil)})
				}
			}
			p.X.Min = 0
			padY(p, lo, hi)
			if row == 0 && len(r.Stream) > 0 {
				p.X.Max = float64(max(r.Setup.StreamTokens, r.Setup.DenseTokens))
			}
			plots[row][ti] = p
		}
	}
	w := vg.Length(4.2*float64(len(texts))+2.6) * vg.Inch
	err := saveFig(dir, fig.Name, w, 8*vg.Inch, func(dc draw.Canvas) {
		side := drawTiles(dc, plots, 2.6*vg.Inch)
		drawLegend(side, "cache", entries)
	})
	return fig, err
}

// padY leaves 5% of room above and below [lo, hi].
func padY(p *plot.Plot, lo, hi float64) {
	if hi > lo {
		d := 0.05 * (hi - lo)
		p.Y.Min, p.Y.Max = lo-d, hi+d
	}
}

// metric of a cell for the Pareto plots.
type metric struct {
	name, label string
	get         func(c CompressCell) float64
	higher      bool
}

var paretoMetrics = []metric{
	{"greedy", "greedy agreement (share of 32 tokens equal)", func(c CompressCell) float64 { return c.Greedy }, true},
	{"top1", "top-1 agreement (teacher forced)", func(c CompressCell) float64 { return c.Top1 }, true},
	{"nll", "continuation NLL (nats, lower is better)", func(c CompressCell) float64 { return c.NLL }, false},
}

// kibTicks labels a log axis at powers of two.
func kibTicks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log2(min)); e <= math.Ceil(math.Log2(max)); e++ {
		v := math.Exp2(e)
		ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		if e < math.Ceil(math.Log2(max)) {
			ts = append(ts, plot.Tick{Value: v * math.Sqrt2})
		}
	}
	return ts
}

// frontier is the Pareto frontier of (bytes, quality) points: the points
// no other point beats with fewer or equal bytes.
func frontier(pts plotter.XYs, higher bool) plotter.XYs {
	s := append(plotter.XYs(nil), pts...)
	slices.SortFunc(s, func(a, b plotter.XY) int {
		switch {
		case a.X < b.X:
			return -1
		case a.X > b.X:
			return 1
		case higher && a.Y > b.Y, !higher && a.Y < b.Y:
			return -1
		}
		return 1
	})
	var out plotter.XYs
	for _, p := range s {
		if len(out) == 0 || (higher && p.Y > out[len(out)-1].Y) || (!higher && p.Y < out[len(out)-1].Y) {
			out = append(out, p)
		}
	}
	return out
}

// Frontier is the Pareto frontier of cells under a metric ("greedy",
// "top1", "nll"), cheapest first.
func Frontier(cells []CompressCell, name string) []CompressCell {
	var m metric
	for _, x := range paretoMetrics {
		if x.name == name {
			m = x
		}
	}
	var ok []CompressCell
	for _, c := range cells {
		if c.Contexts > 0 {
			ok = append(ok, c)
		}
	}
	slices.SortStableFunc(ok, func(a, b CompressCell) int {
		switch {
		case a.KVBytes < b.KVBytes:
			return -1
		case a.KVBytes > b.KVBytes:
			return 1
		}
		va, vb := m.get(a), m.get(b)
		if (m.higher && va > vb) || (!m.higher && va < vb) {
			return -1
		}
		return 0
	})
	var out []CompressCell
	for _, c := range ok {
		v := m.get(c)
		if len(out) == 0 {
			out = append(out, c)
			continue
		}
		last := m.get(out[len(out)-1])
		if (m.higher && v > last) || (!m.higher && v < last) {
			out = append(out, c)
		}
	}
	return out
}

// PlotPareto draws, per codec, each method's quality against the KV bytes
// it keeps (one line per method through its ratios), the full caches, and
// the Pareto frontier over every configuration of every codec.
func PlotPareto(dir string, r *Results) ([]Figure, error) {
	var figs []Figure
	codecs := r.Setup.Codecs
	cols := min(2, len(codecs))
	rows := (len(codecs) + cols - 1) / cols
	var methods []string
	for _, c := range r.Compress {
		if c.Method != "full" && !slices.Contains(methods, c.Method) {
			methods = append(methods, c.Method)
		}
	}
	for _, m := range paretoMetrics {
		fig := Figure{Name: "pareto_" + m.name, Title: "Compress-then-continue: " + m.label + " against KV bytes"}
		var all plotter.XYs
		for _, c := range r.Compress {
			if c.Contexts > 0 {
				all = append(all, plotter.XY{X: c.KVBytes / 1024, Y: m.get(c)})
			}
		}
		front := frontier(all, m.higher)
		xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
		for _, q := range all {
			xlo, xhi, ylo, yhi = math.Min(xlo, q.X), math.Max(xhi, q.X), math.Min(ylo, q.Y), math.Max(yhi, q.Y)
		}
		if m.higher {
			ylo, yhi = math.Max(0, ylo-0.05), 1.03
		} else {
			d := 0.05 * (yhi - ylo)
			ylo, yhi = ylo-d, yhi+d
		}
		plots := make([][]*plot.Plot, rows)
		for i := range plots {
			plots[i] = make([]*plot.Plot, cols)
		}
		var entries []legendEntry
		for ci, cd := range codecs {
			p := newPlot("KV codec "+cd, "KV bytes after compression (KiB, log scale)", m.label)
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = plot.TickerFunc(kibTicks)
			p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = xlo/1.25, xhi*1.25, ylo, yhi
			fl, _ := plotter.NewLine(front)
			fl.LineStyle = draw.LineStyle{Color: color.Gray{150}, Width: vg.Points(3), Dashes: []vg.Length{vg.Points(6), vg.Points(3)}}
			p.Add(fl)
			if ci == 0 {
				entries = append(entries, legendEntry{"Pareto frontier (all codecs)", lineThumb(fl.LineStyle, nil)})
			}
			for _, meth := range methods {
				var pts plotter.XYs
				for _, c := range r.Compress {
					if c.Method == meth && c.Codec == cd && c.Contexts > 0 {
						pts = append(pts, plotter.XY{X: c.KVBytes / 1024, Y: m.get(c)})
					}
				}
				ls, gs := methodStyle(meth)
				if ci == 0 {
					entries = append(entries, legendEntry{meth, lineThumb(ls, &gs)})
				}
				if len(pts) == 0 {
					continue
				}
				slices.SortFunc(pts, func(a, b plotter.XY) int { return cmpF(a.X, b.X) })
				line, sc, err := plotter.NewLinePoints(pts)
				if err != nil {
					return nil, err
				}
				line.LineStyle, sc.GlyphStyle = ls, gs
				p.Add(line, sc)
			}
			for _, c := range r.Compress {
				if c.Method != "full" || c.Contexts == 0 || (c.Codec != cd && c.Codec != "f32") {
					continue
				}
				sc, _ := plotter.NewScatter(plotter.XYs{{X: c.KVBytes / 1024, Y: m.get(c)}})
				sc.GlyphStyle = draw.GlyphStyle{Color: color.Black, Radius: vg.Points(5), Shape: draw.RingGlyph{}}
				if c.Codec != "f32" {
					sc.GlyphStyle.Shape = draw.BoxGlyph{}
				}
				p.Add(sc)
			}
			plots[ci/cols][ci%cols] = p
		}
		ring := draw.GlyphStyle{Color: color.Black, Radius: vg.Points(5), Shape: draw.RingGlyph{}}
		box := draw.GlyphStyle{Color: color.Black, Radius: vg.Points(5), Shape: draw.BoxGlyph{}}
		entries = append(entries, legendEntry{"full cache, f32", glyphThumb(ring)}, legendEntry{"full cache, panel's codec", glyphThumb(box)})
		err := saveFig(dir, fig.Name, 13*vg.Inch, vg.Length(4.3*float64(rows)+0.4)*vg.Inch, func(dc draw.Canvas) {
			side := drawTiles(dc, plots, 2.7*vg.Inch)
			drawLegend(side, "method (points: ratios)", entries)
		})
		if err != nil {
			return nil, err
		}
		figs = append(figs, fig)
	}
	return figs, nil
}

func glyphThumb(gs draw.GlyphStyle) []plot.Thumbnailer {
	sc, _ := plotter.NewScatter(plotter.XYs{{X: 0, Y: 0}})
	sc.GlyphStyle = gs
	return []plot.Thumbnailer{sc}
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// grid is a heat map's values, row 0 drawn at the top.
type grid struct{ z [][]float64 }

func (g grid) Dims() (int, int)   { return len(g.z[0]), len(g.z) }
func (g grid) Z(c, r int) float64 { return g.z[len(g.z)-1-r][c] }
func (g grid) X(c int) float64    { return float64(c) }
func (g grid) Y(r int) float64    { return float64(r) }

// heatCodec is the codec whose compressed cells the heat map shows: f16
// when swept (its own error is tiny), else the first.
func heatCodec(r *Results) string {
	if slices.Contains(r.Setup.Codecs, "f16") {
		return "f16"
	}
	return r.Setup.Codecs[0]
}

// HeatRows are the heat map's rows at a ratio: each method at the heat
// codec (schedule methods at their own size), then the full cache in each
// codec.
func HeatRows(r *Results, ratio float64) (names []string, cells []CompressCell) {
	hc := heatCodec(r)
	for _, c := range r.Compress {
		if c.Method == "full" || c.Codec != hc || c.Contexts == 0 {
			continue
		}
		if c.Ratio == ratio || c.Ratio == 0 {
			n := c.Method
			if c.Ratio == 0 {
				n += fmt.Sprintf(" (own, %.2f)", c.KeptFrac)
			}
			names, cells = append(names, n), append(cells, c)
		}
	}
	for _, c := range r.Compress {
		if c.Method == "full" && c.Codec != "f32" && c.Contexts > 0 {
			names, cells = append(names, "full cache, "+c.Codec), append(cells, c)
		}
	}
	return names, cells
}

// PlotAttention draws the heat map of per-layer attention-output error,
// method × layer, one panel per ratio, values written in the cells.
func PlotAttention(dir string, r *Results) (Figure, error) {
	fig := Figure{Name: "attention_error", Title: "Attention-output relative error per layer"}
	ratios := r.Setup.Ratios
	cols := min(2, len(ratios))
	rows := (len(ratios) + cols - 1) / cols
	const lo, hi = -4.0, 0.5
	cmap := moreland.SmoothBlueRed()
	cmap.SetMin(lo)
	cmap.SetMax(hi)
	pal := cmap.Palette(256)
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, cols)
	}
	nrows := 0
	for ri, ratio := range ratios {
		names, cells := HeatRows(r, ratio)
		if len(cells) == 0 {
			continue
		}
		nrows = max(nrows, len(cells))
		L := len(cells[0].AttnErr)
		z := make([][]float64, len(cells))
		var lab plotter.XYLabels
		for i, c := range cells {
			z[i] = make([]float64, L)
			for l, e := range c.AttnErr {
				z[i][l] = math.Log10(math.Max(e, 1e-6))
				lab.XYs = append(lab.XYs, plotter.XY{X: float64(l), Y: float64(len(cells) - 1 - i)})
				lab.Labels = append(lab.Labels, fmtErr(e))
			}
		}
		p := newPlot(fmt.Sprintf("ratio %g (codec %s)", ratio, heatCodec(r)), "layer", "")
		hm := plotter.NewHeatMap(grid{z}, pal)
		hm.Min, hm.Max = lo, hi
		hm.Underflow, hm.Overflow = pal.Colors()[0], pal.Colors()[255]
		p.Add(hm)
		labels, err := plotter.NewLabels(lab)
		if err != nil {
			return fig, err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].XAlign = draw.XCenter
			labels.TextStyle[i].YAlign = draw.YCenter
			labels.TextStyle[i].Font.Size = vg.Points(9)
		}
		p.Add(labels)
		ticks := make([]plot.Tick, len(names))
		for i, n := range names {
			ticks[i] = plot.Tick{Value: float64(len(names) - 1 - i), Label: n}
		}
		p.Y.Tick.Marker = plot.ConstantTicks(ticks)
		xt := make([]plot.Tick, L)
		for l := range xt {
			xt[l] = plot.Tick{Value: float64(l), Label: strconv.Itoa(l)}
		}
		p.X.Tick.Marker = plot.ConstantTicks(xt)
		p.Y.Tick.Label.Font.Size = vg.Points(10)
		plots[ri/cols][ri%cols] = p
	}
	cb := newPlot("", "", "log10 relative error")
	cb.Add(&plotter.ColorBar{ColorMap: cmap, Vertical: true})
	cb.HideX()
	cb.Y.Min, cb.Y.Max = lo, hi
	h := vg.Length(max(4.5, 0.28*float64(nrows)+1.2)*float64(rows)) * vg.Inch
	err := saveFig(dir, fig.Name, 14*vg.Inch, h, func(dc draw.Canvas) {
		side := drawTiles(dc, plots, 1.3*vg.Inch)
		cbc := draw.Crop(side, vg.Points(10), 0, (side.Max.Y-side.Min.Y)/4, -(side.Max.Y-side.Min.Y)/4)
		cb.Draw(cbc)
	})
	return fig, err
}

func fmtErr(e float64) string {
	switch {
	case e == 0:
		return "0"
	case e >= 0.1:
		return fmt.Sprintf("%.2f", e)
	case e >= 0.001:
		return fmt.Sprintf("%.3f", e)
	}
	return fmt.Sprintf("%.0e", e)
}

// PlotKept draws which prompt positions each (layer, KV head) keeps under
// each method: position on x, one band of layers × heads per method.
func PlotKept(dir string, r *Results) (Figure, error) {
	k := r.Kept
	fig := Figure{Name: "kept_tokens", Title: fmt.Sprintf("Kept tokens at ratio %g", k.Ratio)}
	var ms []KeptMethod
	for _, m := range k.Methods {
		if m.Error == "" && len(m.Kept) > 0 {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		return fig, fmt.Errorf("eval: no kept-token data")
	}
	L, H := len(ms[0].Kept), len(ms[0].Kept[0])
	band := L * H
	gap := 2
	rows := len(ms)*(band+gap) - gap
	img := image.NewRGBA(image.Rect(0, 0, k.Length, rows))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	var ticks []plot.Tick
	for mi, m := range ms {
		ls, _ := methodStyle(m.Method)
		col := ls.Color.(color.RGBA)
		top := mi * (band + gap)
		for l := range m.Kept {
			for h := range m.Kept[l] {
				y := top + l*H + h
				bg := color.RGBA{255, 255, 255, 255}
				if l%2 == 1 {
					bg = color.RGBA{236, 236, 236, 255}
				}
				for x := 0; x < k.Length; x++ {
					img.SetRGBA(x, y, bg)
				}
				for _, p := range m.Kept[l][h] {
					if int(p) < k.Length {
						img.SetRGBA(int(p), y, col)
					}
				}
			}
		}
		if mi < len(ms)-1 {
			for g := 0; g < gap; g++ {
				for x := 0; x < k.Length; x++ {
					img.SetRGBA(x, top+band+g, color.RGBA{60, 60, 60, 255})
				}
			}
		}
		ticks = append(ticks, plot.Tick{Value: float64(rows) - float64(top) - float64(band)/2, Label: m.Method})
	}
	p := newPlot(fmt.Sprintf("Positions kept after one compression of a %d-token prompt to ratio %g (codec %s)", k.Length, k.Ratio, k.Codec),
		"token position in the prompt", fmt.Sprintf("method: %d layers × %d KV heads each (layer 0 on top; shaded rows: odd layers)", L, H))
	p.Add(plotter.NewImage(upscale(img, 4), 0, 0, float64(k.Length), float64(rows)))
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Tick.Label.Font.Size = vg.Points(11)
	p.X.Min, p.X.Max = 0, float64(k.Length)
	p.Y.Min, p.Y.Max = 0, float64(rows)
	var xt []plot.Tick
	for x := 0; x <= k.Length; x += 10 {
		t := plot.Tick{Value: float64(x)}
		if x%50 == 0 {
			t.Label = strconv.Itoa(x)
		}
		xt = append(xt, t)
	}
	p.X.Tick.Marker = plot.ConstantTicks(xt)
	h := vg.Length(max(5, 0.05*float64(rows)+1.5)) * vg.Inch
	err := saveFig(dir, fig.Name, 13*vg.Inch, h, func(dc draw.Canvas) {
		p.Draw(draw.Crop(dc, vg.Points(6), -vg.Points(12), vg.Points(6), -vg.Points(10)))
	})
	return fig, err
}

// upscale repeats each pixel f × f times, so that drawing the image at
// its size on the page does not blur the cells.
func upscale(src *image.RGBA, f int) *image.RGBA {
	b := src.Bounds()
	dst := image.NewRGBA(image.Rect(0, 0, b.Dx()*f, b.Dy()*f))
	for y := 0; y < b.Dy()*f; y++ {
		for x := 0; x < b.Dx()*f; x++ {
			dst.SetRGBA(x, y, src.RGBAAt(x/f, y/f))
		}
	}
	return dst
}

// PlotAll writes every figure into dir.
func PlotAll(dir string, r *Results) ([]Figure, error) {
	var figs []Figure
	f, err := PlotStream(dir, r)
	if err != nil {
		return nil, fmt.Errorf("stream plot: %w", err)
	}
	figs = append(figs, f)
	ps, err := PlotPareto(dir, r)
	if err != nil {
		return nil, fmt.Errorf("pareto plot: %w", err)
	}
	figs = append(figs, ps...)
	if f, err = PlotAttention(dir, r); err != nil {
		return nil, fmt.Errorf("attention plot: %w", err)
	}
	figs = append(figs, f)
	if f, err = PlotKept(dir, r); err != nil {
		return nil, fmt.Errorf("kept plot: %w", err)
	}
	figs = append(figs, f)
	return figs, nil
}
