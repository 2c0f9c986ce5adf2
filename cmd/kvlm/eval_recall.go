package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/internal/progress"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/tokenizer"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// recallArgs are the flags `kvlm eval --suite recall` reads.
type recallArgs struct {
	model, tok, out, report, zoo, data string
	from                               string // a saved recall.json to render again
	quick, noProgress                  bool
	samples, jobs                      int
	methods                            []string
	matrix                             recallMatrix
}

// recallMatrix is the part of the recall suite's matrix a run covers
// (each nil: the default's, or --quick's).
type recallMatrix struct {
	tasks, codecs, schedules, protocols []string
	ratios, depths                      []float64
	contexts                            []int
	margin                              float64 // points
}

// recallMatrixFlags are recallMatrix's flags (refused by --suite compress).
var recallMatrixFlags = []string{"tasks", "ratios", "codecs", "schedules", "protocols", "recall-contexts", "depths", "margin"}

func (m *recallMatrix) flags(f *pflag.FlagSet) {
	f.StringSliceVar(&m.tasks, "tasks", nil, "recall: the tasks (default all: "+strings.Join(eval.RecallTasks, ", ")+")")
	f.Float64SliceVar(&m.ratios, "ratios", nil, "recall: the ratios of kept tokens, each in (0, 1) (default 0.5,0.25,0.125,0.0625; --quick 0.25)")
	f.StringSliceVar(&m.codecs, "codecs", nil, "recall: the codecs the compressed caches store (default f16,q8,q4,kivi2; --quick f16)")
	f.StringSliceVar(&m.schedules, "schedules", nil, "recall: "+eval.SchedPrefill+" (compress once after the prompt) and/or "+eval.SchedDecode+" (and at every step) (default both; --quick prefill)")
	f.StringSliceVar(&m.protocols, "protocols", nil, "recall: "+eval.ProtoAware+" and/or "+eval.ProtoAgnostic+" (default both)")
	f.IntSliceVar(&m.contexts, "recall-contexts", nil, "recall: the context lengths (default 512,1024,2048 as the model fits; --quick 256)")
	f.Float64SliceVar(&m.depths, "depths", nil, "recall: niah_single's needle depths, each in [0, 1] (default 0,0.1,…,1; --quick 0,0.5,1)")
	f.Float64Var(&m.margin, "margin", 0, "recall: stop each cell at the first of 40, 80, 160, … or --samples samples where its 95% interval is within ± this many points (0: --samples in every cell)")
}

// apply checks m and sets the parts of cfg it names.
func (m recallMatrix) apply(cfg *eval.RecallConfig) error {
	oneOf := func(flag string, got, allowed []string) ([]string, error) {
		var out []string
		for _, g := range got {
			if !slices.Contains(allowed, g) {
				return nil, fmt.Errorf("--%s: unknown %q (want %s)", flag, g, strings.Join(allowed, ", "))
			}
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
		return out, nil
	}
	var err error
	if m.margin < 0 || m.margin >= 50 {
		return fmt.Errorf("--margin %g: want points in [0, 50)", m.margin)
	}
	cfg.Margin = m.margin / 100
	if m.tasks != nil {
		if cfg.Tasks, err = oneOf("tasks", m.tasks, eval.RecallTasks); err != nil {
			return err
		}
	}
	if m.codecs != nil {
		if cfg.Codecs, err = oneOf("codecs", m.codecs, codec.Names); err != nil {
			return err
		}
	}
	if m.schedules != nil {
		if cfg.Schedules, err = oneOf("schedules", m.schedules, []string{eval.SchedPrefill, eval.SchedDecode}); err != nil {
			return err
		}
	}
	if m.protocols != nil {
		if cfg.Protocols, err = oneOf("protocols", m.protocols, []string{eval.ProtoAware, eval.ProtoAgnostic}); err != nil {
			return err
		}
	}
	if m.ratios != nil {
		for _, r := range m.ratios {
			if !(r > 0 && r < 1) {
				return fmt.Errorf("--ratios: %g is not in (0, 1)", r)
			}
		}
		cfg.Ratios = m.ratios
	}
	if m.depths != nil {
		for _, d := range m.depths {
			if !(d >= 0 && d <= 1) {
				return fmt.Errorf("--depths: %g is not in [0, 1]", d)
			}
		}
		cfg.Depths = m.depths
	}
	if m.contexts != nil {
		for _, c := range m.contexts {
			if c < 1 {
				return fmt.Errorf("--recall-contexts: %d is not positive", c)
			}
		}
		cfg.Contexts = m.contexts
	}
	return nil
}

// recallIgnored are eval's flags that the recall suite does not read.
var recallIgnored = []string{"text", "ood", "seed", "contexts", "stream-tokens", "dense-tokens"}

func recallData(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	if d := shared.Dir(); d != "" {
		return filepath.Join(d, "data"), nil
	}
	return "", errors.New("../shared not found: use --data DIR (the folder of " + eval.HeldOutFile + ")")
}

func runRecall(cmd *cobra.Command, a recallArgs) error {
	for _, n := range recallIgnored {
		if cmd.Flags().Changed(n) {
			return fmt.Errorf("--%s is not read by --suite recall", n)
		}
	}
	if a.out == "" {
		return errors.New("no output folder given: use --out DIR")
	}
	if a.from != "" {
		return renderRecall(cmd, a)
	}
	if a.model == "" {
		return errors.New("no model given: use -m MODEL")
	}
	if a.jobs < 1 {
		return fmt.Errorf("--jobs must be positive, got %d", a.jobs)
	}
	if cmd.Flags().Changed("samples") && a.samples < 1 {
		return fmt.Errorf("--samples must be positive, got %d", a.samples)
	}
	data, err := recallData(a.data)
	if err != nil {
		return err
	}
	p, err := resolveModel(a.model)
	if err != nil {
		return err
	}
	var zooModels []string
	if a.zoo != "" {
		zooModels, err = filepath.Glob(filepath.Join(a.zoo, "*", "model.gguf"))
		if err != nil || len(zooModels) == 0 {
			return fmt.Errorf("--zoo %s: no DIR/*/model.gguf", a.zoo)
		}
		sort.Strings(zooModels)
	}
	if err := os.MkdirAll(a.out, 0o755); err != nil {
		return err
	}
	if a.report == "" {
		a.report = filepath.Join(a.out, "RESULTS.md")
	}
	commit, dirty := gitCommit() // before this run rewrites its own outputs
	cfg := eval.DefaultRecall(a.quick)
	if a.samples > 0 {
		cfg.N = a.samples
	}
	cfg.Model, cfg.Workers = p, a.jobs
	if err := a.matrix.apply(&cfg); err != nil {
		return err
	}
	if a.methods != nil {
		cfg.Methods = []string{"full"}
		for _, m := range a.methods {
			if m == "full" {
				continue
			}
			if _, err := eval.MethodMode(m); err != nil {
				return fmt.Errorf("--methods: %w", err)
			}
			if !slices.Contains(cfg.Methods, m) {
				cfg.Methods = append(cfg.Methods, m)
			}
		}
	}
	var bar *evalBar
	if !a.noProgress && progress.IsTerminal(cmd.ErrOrStderr()) {
		bar = newEvalBar(cmd.ErrOrStderr())
		cfg.Progress = bar
	}
	one := func(path, name string, cfg eval.RecallConfig) (*eval.RecallResults, error) {
		m, tok, err := engine.Load(path, a.tok)
		if err != nil {
			return nil, err
		}
		defer m.Close()
		v, err := eval.NewRecallVocab(tok, data)
		if err != nil {
			return nil, err
		}
		r, err := eval.RecallSweep(m, name, v, cfg)
		if bar != nil {
			bar.finish()
		}
		return r, err
	}
	res, err := one(p, filepath.Base(p), cfg)
	if err != nil {
		return err
	}
	if len(zooModels) > 0 {
		best := eval.RankRecall(res, filepath.Base(p), 0.25)
		if len(best) == 0 {
			return errors.New("--zoo: the main run has no ranked method at ratio 0.25")
		}
		zc := cfg
		zc.Methods = append([]string{"full"}, best[:min(3, len(best))]...)
		zc.Codecs, zc.Schedules, zc.Contexts = cfg.Codecs[:1], cfg.Schedules[:1], nil
		for _, zm := range zooModels {
			a.tok = "" // the zoo's GGUFs carry tok512
			r, err := one(zm, filepath.Base(filepath.Dir(zm)), zc)
			if err != nil {
				return fmt.Errorf("%s: %w", zm, err)
			}
			res.Cells = append(res.Cells, r.Cells...)
			res.Wall += r.Wall
		}
	}
	res.Command, res.Commit, res.Dirty = commandLine(cmd), commit, dirty
	info := eval.ReportInfo{Command: commandLine(cmd), Commit: commit, Dirty: dirty}
	nfig, err := writeRecall(a, res, info)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s, %d figures in %s, and the recall section of %s  (%d cells, %.0f s)\n",
		filepath.Join(a.out, "recall.json"), nfig, a.out, a.report, len(res.Cells), res.Wall)
	return nil
}

// renderRecall is --suite recall --from FILE: the figures and the section
// of a saved run, drawn again by this build (its ranking and tables) from
// the saved numbers, with the run's own command and commit and a line
// saying it was rendered again. Flags that would change the run are
// refused: nothing runs.
func renderRecall(cmd *cobra.Command, a recallArgs) error {
	for _, n := range append([]string{"model", "tokenizer", "zoo", "data", "samples", "methods", "quick"}, recallMatrixFlags...) {
		if cmd.Flags().Changed(n) {
			return fmt.Errorf("--%s is not read with --from (it renders a saved run; nothing runs)", n)
		}
	}
	b, err := os.ReadFile(a.from)
	if err != nil {
		return err
	}
	var res eval.RecallResults
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("--from %s: %w", a.from, err)
	}
	if len(res.Cells) == 0 {
		return fmt.Errorf("--from %s: no cells", a.from)
	}
	if res.Command == "" {
		return fmt.Errorf("--from %s: the saved run records no command and commit (a file from before they were saved)", a.from)
	}
	if err := os.MkdirAll(a.out, 0o755); err != nil {
		return err
	}
	if a.report == "" {
		a.report = filepath.Join(a.out, "RESULTS.md")
	}
	commit, dirty := gitCommit()
	info := eval.ReportInfo{Command: res.Command, Commit: res.Commit, Dirty: res.Dirty,
		Rendered: commandLine(cmd) + " (at commit " + eval.ReportInfo{Commit: commit, Dirty: dirty}.CommitText() + ")"}
	nfig, err := writeRecall(a, &res, info)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "rendered %s again: %d figures in %s, and the recall section of %s  (%d cells)\n",
		a.from, nfig, a.out, a.report, len(res.Cells))
	return nil
}

// writeRecall writes the recall suite's results through writeSuite:
// OUT/recall.json, the figures and the recall section of --report.
func writeRecall(a recallArgs, res *eval.RecallResults, info eval.ReportInfo) (int, error) {
	return writeSuite(a.out, a.report, "recall.json", res, info,
		func() ([]eval.Figure, error) { return eval.PlotRecall(a.out, res) },
		func(figs []eval.Figure, info eval.ReportInfo) string { return eval.WriteRecallSection(res, figs, info) },
		eval.RecallSectionBegin, eval.RecallSectionEnd)
}

// writeSuite writes a suite's results: res as OUT/name (indented JSON),
// the figures plot draws, and the section that section builds from them,
// put between begin and end in report (the rest of that file kept). It
// returns the number of figures.
func writeSuite(out, report, name string, res any, info eval.ReportInfo, plot func() ([]eval.Figure, error),
	section func([]eval.Figure, eval.ReportInfo) string, begin, end string) (int, error) {
	b, err := json.MarshalIndent(res, "", " ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(out, name), append(b, '\n'), 0o644); err != nil {
		return 0, err
	}
	figs, err := plot()
	if err != nil {
		return 0, err
	}
	if info.ImgDir, err = filepath.Rel(filepath.Dir(report), out); err != nil {
		info.ImgDir = out
	}
	return len(figs), eval.UpdateSection(report, section(figs, info), begin, end)
}

// recallTokenizer is the vocabulary of recall-data and recall-words: the
// model's (-m) or a tokenizer file's (--tokenizer).
func recallTokenizer(modelPath, tokPath string) (tokenizer.Tokenizer, error) {
	if modelPath == "" && tokPath == "" {
		return nil, errors.New("no vocabulary given: use -m MODEL or --tokenizer T")
	}
	if modelPath != "" {
		var err error
		if modelPath, err = resolveModel(modelPath); err != nil {
			return nil, err
		}
	}
	return loadTokenizer(modelPath, tokPath)
}

// newRecallWords is `kvlm eval recall-words`: the suite's word pool, for
// a trainer that builds rows of the suite's own pieces (train/dense.py).
func newRecallWords() *cobra.Command {
	var modelPath, tokPath string
	c := &cobra.Command{
		Use:   "recall-words -m MODEL | --tokenizer T",
		Short: "Print the recall suite's word pool in the model's vocabulary (JSON)",
		Long: `Print the words the recall suite draws its keys and variable names from:
the story words the vocabulary encodes in at most two tokens, in the suite's
order, as a JSON array of {"word", "ids"} (ids without BOS).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := recallTokenizer(modelPath, tokPath)
			if err != nil {
				return err
			}
			type word struct {
				Word string `json:"word"`
				IDs  []int  `json:"ids"`
			}
			words, ids := eval.RecallWords(t)
			out := make([]word, len(words))
			for i := range words {
				out[i] = word{words[i], ids[i]}
			}
			b, err := json.Marshal(out)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
			return nil
		},
	}
	c.Flags().StringVarP(&modelPath, "model", "m", "", "model (its vocabulary): GGUF, or a llama2.c checkpoint with --tokenizer")
	c.Flags().StringVar(&tokPath, "tokenizer", "", "llama2.c tokenizer.bin (or a GGUF)")
	return c
}

// newRecallData is `kvlm eval recall-data`: the suite's samples, for a
// trainer (seeds ≥ 2^32) or for reading.
func newRecallData() *cobra.Command {
	var (
		modelPath, tokPath, task, dataDir, haystack string
		ctx, count                                  int
		depth                                       float64
		seed                                        uint64
		asJSON                                      bool
	)
	c := &cobra.Command{
		Use:   "recall-data -m MODEL --task T --context N --seed S [--count K] [--depth D] [--json]",
		Short: "Print recall-suite samples (prompt and answer token ids) for seeds S..S+K−1",
		Long: fmt.Sprintf(`Print the recall suite's samples: the prompts and answers kvlm eval --suite
recall scores, in the model's vocabulary, one JSON object a line with --json.
A sample is a function of (task, context, depth, seed) alone. The evaluation
uses seeds [0, %d) and the held-out haystack (--haystack heldout, bytes
[%d, %d) of %s); a recall model must be trained on seeds ≥ %d and
--haystack train (bytes [0, %d)), so that it never sees an evaluation
sample nor held-out text. Tasks: %s.`, eval.EvalSeedEnd, eval.HeldOutStart, eval.HeldOutEnd, eval.HeldOutFile,
			eval.TrainSeedStart, eval.HeldOutStart, strings.Join(eval.RecallTasks, ", ")),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if count < 1 {
				return fmt.Errorf("--count must be positive, got %d", count)
			}
			if ctx < 1 {
				return errors.New("no context given: use --context N")
			}
			if seed < eval.EvalSeedEnd && seed+uint64(count) > eval.EvalSeedEnd {
				return fmt.Errorf("seeds %d..%d straddle the evaluation range's end %d", seed, seed+uint64(count)-1, eval.EvalSeedEnd)
			}
			if (task == eval.TaskNeedle) != cmd.Flags().Changed("depth") {
				if task == eval.TaskNeedle {
					return errors.New("niah_single needs --depth D (0 to 1)")
				}
				return fmt.Errorf("--depth is niah_single's; %s places its needles itself", task)
			}
			if task != eval.TaskNeedle {
				depth = -1
			}
			data, err := recallData(dataDir)
			if err != nil {
				return err
			}
			t, err := recallTokenizer(modelPath, tokPath)
			if err != nil {
				return err
			}
			v, err := eval.NewRecallVocabFrom(t, data, haystack)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			spec := eval.DefaultRecallSpec()
			for i := range uint64(count) {
				s, err := v.Sample(spec, task, ctx, depth, seed+i)
				if err != nil {
					return err
				}
				if asJSON {
					b, err := json.Marshal(s)
					if err != nil {
						return err
					}
					fmt.Fprintf(w, "%s\n", b)
					continue
				}
				q := t.DecodeAll(s.Prompt[s.Question:])
				fmt.Fprintf(w, "seed %d: %d prompt tokens; question %q; answer %q\n", s.Seed, len(s.Prompt), strings.TrimSpace(q), s.Text)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&modelPath, "model", "m", "", "model (its vocabulary): GGUF, or a llama2.c checkpoint with --tokenizer")
	f.StringVar(&tokPath, "tokenizer", "", "llama2.c tokenizer.bin (or a GGUF)")
	f.StringVar(&task, "task", "", "task: "+strings.Join(eval.RecallTasks, ", "))
	f.IntVar(&ctx, "context", 0, "tokens of prompt + answer")
	f.Float64Var(&depth, "depth", 0, "niah_single: the needle's depth, 0 to 1")
	f.Uint64Var(&seed, "seed", 0, "first seed (evaluation: < 2^32; training: ≥ 2^32)")
	f.IntVar(&count, "count", 1, "samples: seeds seed..seed+count−1")
	f.BoolVar(&asJSON, "json", false, "one JSON object a line: task, context, depth, seed, prompt, question_start, answer, parts")
	f.StringVar(&dataDir, "data", "", "the folder of "+eval.HeldOutFile+" (default ../shared/data)")
	f.StringVar(&haystack, "haystack", eval.HaystackHeldOut, "the haystack text: heldout (the evaluation's) or train (a trainer's: bytes before the held-out part)")
	return c
}
