package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/internal/progress"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// evalSeedTables are the kvcalc tables the report carries.
var evalSeedTables = []struct{ title, args string }{
	{"LLaMA-2-7B, f16, batch × length", "kvcalc --preset llama2-7b --batch 1,4,16,64 --seq 512,2048,4096,32768"},
	{"GPT-3 175B, f16, 4096 tokens", "kvcalc --preset gpt3-175b --batch 4,16,64 --seq 4096"},
}

func newEval() *cobra.Command {
	var (
		modelPath, tokPath, out, report, text string
		ood                                   []string
		quick, noProgress                     bool
		seed                                  uint64
		contexts, streamTokens, denseTokens   int
		jobs                                  int
		suite, zoo, dataDir, from             string
		samples                               int
		methods                               []string
		matrix                                recallMatrix
	)
	c := &cobra.Command{
		Use:   "eval -m MODEL [--tokenizer T] --out DIR [--suite compress|recall] [--quick] | eval --suite zoo --zoo DIR --out DIR",
		Short: "Sweep the KV-cache methods and codecs; write results.json, plots and a Markdown report",
		Long: `Sweep the KV-cache methods and codecs on a model and write, into --out:
results.json (every number), PNG and SVG plots, and a Markdown report that
embeds them (--report, default OUT/RESULTS.md).

Measured: streaming perplexity (dense, window, streaming with 1/2/4/8 sinks,
lminfinite) on the in-domain text and the out-of-domain ones; compress-then-
continue for every method × ratio (0.5, 0.25, 0.125, 0.0625) × codec (f16,
q8, q4, kivi2): continuation NLL, top-1 and greedy agreement with the full
cache, per-layer attention-output error, KV bytes (pool and kvcalc) and
tokens per second; the positions each (layer, head) keeps; kvcalc tables.

--suite recall runs the RULER-style recall suite instead (docs/RECALL.md):
needle, multi-key, multi-value, multi-query, variable tracking and common
words, every method × ratio × codec × schedule × protocol; it writes
OUT/recall.json, heat maps and Pareto plots, and replaces the recall
section of --report, leaving the rest of that file as it is (--from
OUT/recall.json renders them again from a saved run, running nothing).
--zoo DIR adds
every DIR/*/model.gguf under the best three methods. kvlm eval recall-data
prints the suite's samples (for a trainer: seeds ≥ 2^32).

--suite zoo --zoo DIR scores every DIR/*/model.gguf of the trained zoo
(docs/ZOO.md; no -m) on the held-out windows of its record.json: kvlm's
full-cache f32 NLL must equal the trainer's within 1e-3 (else it fails),
then each window's first 192 tokens are prefilled (SnapKV: compressed) and
the rest scored, under the full cache in f32, f16, q8, q4 and kivi2 and
SnapKV at ratio 0.25 in f16 and q8, with the KV bytes per token each holds
(pool and kvcalc); an uptrained FROM-to-TO model adds the MHA→GQA
uptraining table (FROM converted in-process by convert kv-heads). It writes
OUT/zoo.json and OUT/zoo_pareto.png and replaces the zoo section of
--report. --quick scores 4 windows per model.

--quick runs a small sweep (seconds): what the tests run.
The committed docs/RESULTS.md comes from:
  kvlm eval -m ../shared/models/stories260K/stories260K.bin \
    --tokenizer ../shared/models/stories260K/tok512.bin \
    --out docs/results --report docs/RESULTS.md`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch suite {
			case "compress":
			case "recall":
				return runRecall(cmd, recallArgs{model: modelPath, tok: tokPath, out: out, report: report, quick: quick,
					zoo: zoo, data: dataDir, samples: samples, jobs: jobs, noProgress: noProgress, methods: methods,
					matrix: matrix, from: from})
			case "zoo":
				return runZoo(cmd, zooArgs{zoo: zoo, out: out, report: report, quick: quick, jobs: jobs, noProgress: noProgress})
			default:
				return fmt.Errorf("--suite must be compress, recall or zoo, got %q", suite)
			}
			if modelPath == "" {
				return errors.New("no model given: use -m MODEL")
			}
			if out == "" {
				return errors.New("no output folder given: use --out DIR")
			}
			if cmd.Flags().Changed("zoo") {
				return errors.New("--zoo belongs to --suite recall and --suite zoo")
			}
			for _, name := range append([]string{"data", "samples", "methods", "from"}, recallMatrixFlags...) {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s belongs to --suite recall", name)
				}
			}
			cfg := eval.DefaultSweep(quick)
			cfg.Model, cfg.Tokenizer = modelPath, tokPath
			flags := cmd.Flags()
			if flags.Changed("seed") {
				cfg.Seed = seed
			}
			if flags.Changed("contexts") {
				cfg.Contexts = contexts
			}
			if flags.Changed("stream-tokens") {
				cfg.StreamTokens = streamTokens
			}
			if flags.Changed("dense-tokens") {
				cfg.DenseTokens = denseTokens
			}
			if jobs < 1 {
				return fmt.Errorf("--jobs must be positive, got %d", jobs)
			}
			cfg.Workers = jobs
			if cfg.Contexts < 1 || cfg.StreamTokens < 2 || cfg.DenseTokens < 2 {
				return errors.New("--contexts, --stream-tokens and --dense-tokens must be positive")
			}
			data := shared.Dir()
			if text == "" {
				if data == "" {
					return errors.New("no text given and ../shared not found: use --text FILE")
				}
				text = filepath.Join(data, "data", "tinystories_valid_head.txt")
			}
			cfg.Text = eval.TextSpec{Name: textName(text), Path: text, Domain: "in-domain"}
			if !flags.Changed("ood") {
				ood = nil
				if !quick && data != "" {
					ood = []string{filepath.Join(data, "data", "sherlock_holmes_pg1661.txt"), filepath.Join(data, "data", "war_and_peace.txt")}
				}
			}
			for _, o := range ood {
				cfg.OOD = append(cfg.OOD, eval.TextSpec{Name: textName(o), Path: o, Domain: "out-of-domain"})
			}
			for _, t := range evalSeedTables {
				var buf bytes.Buffer
				if code := run(strings.Fields(t.args), &buf, io.Discard); code != 0 {
					return fmt.Errorf("kvlm %s failed", t.args)
				}
				cfg.Seeds = append(cfg.Seeds, eval.SeedTable{Title: t.title, Command: "kvlm " + t.args, Output: buf.String()})
			}
			p, err := resolveModel(modelPath)
			if err != nil {
				return err
			}
			modelPath, cfg.Model = p, p
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			if report == "" {
				report = filepath.Join(out, "RESULTS.md")
			}
			m, tok, err := engine.Load(modelPath, tokPath)
			if err != nil {
				return err
			}
			defer m.Close()
			if !noProgress && progress.IsTerminal(cmd.ErrOrStderr()) {
				cfg.Progress = newEvalBar(cmd.ErrOrStderr())
			}
			res, err := eval.Sweep(m, tok, cfg)
			if p, ok := cfg.Progress.(*evalBar); ok {
				p.finish()
			}
			if err != nil {
				return err
			}
			if err := eval.WriteResults(filepath.Join(out, "results.json"), res); err != nil {
				return err
			}
			figs, err := eval.PlotAll(out, res)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(filepath.Dir(report), out)
			if err != nil {
				rel = out
			}
			commit, dirty := gitCommit()
			info := eval.ReportInfo{Command: commandLine(cmd), Commit: commit, Dirty: dirty, ImgDir: rel}
			var md bytes.Buffer
			if err := eval.WriteReport(&md, res, figs, info); err != nil {
				return err
			}
			body := md.Bytes()
			if old, err := os.ReadFile(report); err == nil {
				body = eval.CarrySection(old, body) // keep the recall suite's section
			}
			if err := os.WriteFile(report, body, 0o644); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "wrote %s, %d figures (PNG and SVG) in %s, and %s  (%.0f s)\n",
				filepath.Join(out, "results.json"), len(figs), out, report, res.Timing.Total)
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&modelPath, "model", "m", "", "model file: GGUF, or a llama2.c checkpoint (then --tokenizer)")
	f.StringVar(&tokPath, "tokenizer", "", "llama2.c tokenizer.bin")
	f.StringVar(&out, "out", "", "output folder: results.json and the figures")
	f.StringVar(&report, "report", "", "Markdown report path (default OUT/RESULTS.md); figures are linked relative to it")
	f.BoolVar(&quick, "quick", false, "a small sweep (seconds), as the tests run (zoo: 4 windows per model)")
	f.StringVar(&text, "text", "", "held-out in-domain text (default ../shared/data/tinystories_valid_head.txt)")
	f.StringSliceVar(&ood, "ood", nil, "out-of-domain texts to stream (default: Sherlock Holmes and War and Peace from ../shared/data; none with --quick)")
	f.Uint64Var(&seed, "seed", 1, "seed of the context sampling")
	f.IntVar(&contexts, "contexts", 0, "compress-then-continue contexts (default 16; --quick 2)")
	f.IntVar(&streamTokens, "stream-tokens", 0, "tokens streamed through the bounded caches (default 20000; --quick 1200)")
	f.IntVar(&denseTokens, "dense-tokens", 0, "tokens streamed through the dense cache (default 4096; --quick 1200)")
	f.IntVar(&jobs, "jobs", runtime.NumCPU(), "trials run at once")
	f.StringVar(&suite, "suite", "compress", "compress: perplexity and compress-then-continue; recall: the RULER-style recall suite (docs/RECALL.md); zoo: every --zoo model × codec × SnapKV (docs/ZOO.md)")
	f.StringVar(&zoo, "zoo", "", "recall: also score every DIR/*/model.gguf with the best three methods; zoo: the models (DIR/*/model.gguf with record.json)")
	f.StringVar(&dataDir, "data", "", "recall: the folder of "+eval.HeldOutFile+" (default ../shared/data)")
	f.StringVar(&from, "from", "", "recall: render the figures and the section again from this saved recall.json (a run's, with its command and commit), running no model")
	f.IntVar(&samples, "samples", 0, "recall: samples per cell (default: the ±5-point Wilson count, 381; --quick 8)")
	f.StringSliceVar(&methods, "methods", nil, "recall: the methods to score besides the full cache (default: every registered method; --quick snapkv)")
	matrix.flags(f)
	f.BoolVar(&noProgress, "no-progress", false, "no progress bar on stderr (there is none unless stderr is a terminal)")
	c.AddCommand(newRecallData())
	c.AddCommand(newRecallWords())
	return c
}

func textName(path string) string {
	base := filepath.Base(path)
	switch {
	case strings.HasPrefix(base, "tinystories"):
		return "TinyStories (valid)"
	case strings.HasPrefix(base, "sherlock"):
		return "Sherlock Holmes"
	case strings.HasPrefix(base, "war_and_peace"):
		return "War and Peace"
	}
	return strings.TrimSuffix(base, filepath.Ext(base))
}

// commandLine is the command as given, flags in a fixed order.
func commandLine(cmd *cobra.Command) string {
	parts := []string{"kvlm", "eval"}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !f.Changed || f.Name == "no-progress" || f.Name == "jobs" {
			return
		}
		if f.Value.Type() == "bool" {
			parts = append(parts, "--"+f.Name)
			return
		}
		v := f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			v = strings.Join(sv.GetSlice(), ",")
		}
		parts = append(parts, "--"+f.Name, v)
	})
	return strings.Join(parts, " ")
}

// gitCommit is the short commit of the working tree, and whether tracked
// files differ from it.
func gitCommit() (string, bool) {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "", false
	}
	st, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	return strings.TrimSpace(string(out)), len(bytes.TrimSpace(st)) > 0
}

// evalBar is the progress bar on stderr (a terminal).
type evalBar struct {
	w   io.Writer
	bar *progress.Bar
}

func newEvalBar(w io.Writer) *evalBar { return &evalBar{w: w} }

func (b *evalBar) Start(total int64) { b.bar = progress.New(b.w, total, "eval", false) }

func (b *evalBar) Add(n int64, what string) {
	b.bar.Describe(what)
	b.bar.Add64(n)
}

func (b *evalBar) finish() { b.bar.Finish(true) }
