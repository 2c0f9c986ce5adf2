package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kvlm/kvlm/convert"
	"github.com/kvlm/kvlm/eval"
	"github.com/kvlm/kvlm/internal/progress"
	"github.com/kvlm/kvlm/kvcalc"
	"github.com/spf13/cobra"
)

// zooArgs are the flags `kvlm eval --suite zoo` reads.
type zooArgs struct {
	zoo, out, report  string
	quick, noProgress bool
	jobs              int
}

// zooIgnored are eval's flags that the zoo suite does not read.
var zooIgnored = append([]string{"model", "tokenizer", "text", "ood", "seed", "contexts", "stream-tokens", "dense-tokens",
	"data", "samples", "methods"}, recallMatrixFlags...)

// zooInputs reads every DIR/*/model.gguf with its record.json, sorted by
// folder; an uptrained model's folder FROM-to-TO (train/uptrain.sh: the
// zoo's FROM converted to TO's KV heads, then trained) gives the
// uptraining table's roles: FROM, FROM converted (written into tmp by
// convert.KVHeadsFile, scored against the record's init_heldout_nll), the
// uptrained model and TO trained from scratch.
func zooInputs(dir, tmp string) ([]eval.ZooInput, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*", "model.gguf"))
	if err != nil || len(paths) == 0 {
		return nil, fmt.Errorf("--zoo %s: no DIR/*/model.gguf", dir)
	}
	sort.Strings(paths)
	var ins []eval.ZooInput
	var recs []eval.ZooRecord
	for _, p := range paths {
		rec, err := eval.ReadZooRecord(filepath.Dir(p))
		if err != nil {
			return nil, err
		}
		ins = append(ins, eval.ZooInput{Name: filepath.Base(filepath.Dir(p)), Path: p, Windows: rec.Heldout.Windows, Trainer: rec.Heldout.MeanNLL})
		recs = append(recs, rec)
	}
	role := func(name, r string) {
		for i := range ins {
			if ins[i].Name == name {
				ins[i].Role = r
			}
		}
	}
	for k, rec := range recs {
		if rec.InitNLL == nil {
			continue
		}
		up := ins[k]
		from, to, ok := strings.Cut(up.Name, "-to-")
		if !ok {
			return nil, fmt.Errorf("%s: an uptrained model (its record has init_heldout_nll) must be named FROM-to-TO", filepath.Dir(up.Path))
		}
		src := filepath.Join(dir, from, "model.gguf")
		if !slices.Contains(paths, src) {
			return nil, fmt.Errorf("%s: the uptrained model's source %s is not in the zoo", filepath.Dir(up.Path), src)
		}
		km, err := kvcalc.FromGGUF(up.Path)
		if err != nil {
			return nil, err
		}
		conv := filepath.Join(tmp, fmt.Sprintf("%s-kv%d.gguf", from, km.KVHeads))
		if _, err := convert.KVHeadsFile(src, "", conv, km.KVHeads); err != nil {
			return nil, fmt.Errorf("converting %s to %d KV heads: %w", src, km.KVHeads, err)
		}
		role(up.Name, eval.ZooRoleUptrained)
		role(from, eval.ZooRoleSource)
		role(to, eval.ZooRoleScratch)
		ins = append(ins, eval.ZooInput{Name: from + " converted", Path: conv, Windows: rec.Heldout.Windows, Trainer: *rec.InitNLL, Only: true,
			Role: eval.ZooRoleConverted, Source: fmt.Sprintf("`kvlm convert kv-heads %s --kv-heads %d`", filepath.ToSlash(filepath.Join(dir, from, "model.gguf")), km.KVHeads)})
	}
	return ins, nil
}

func runZoo(cmd *cobra.Command, a zooArgs) error {
	for _, n := range zooIgnored {
		if cmd.Flags().Changed(n) {
			return fmt.Errorf("--%s is not read by --suite zoo (its models are --zoo DIR's, their texts the records' held-out windows)", n)
		}
	}
	if a.zoo == "" {
		return errors.New("--suite zoo needs --zoo DIR (the folder of ARCH/model.gguf with record.json, e.g. train/zoo)")
	}
	if a.out == "" {
		return errors.New("no output folder given: use --out DIR")
	}
	if a.jobs < 1 {
		return fmt.Errorf("--jobs must be positive, got %d", a.jobs)
	}
	commit, dirty := gitCommit() // before this run rewrites its own outputs
	tmp, err := os.MkdirTemp("", "kvlm-zoo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ins, err := zooInputs(a.zoo, tmp)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(a.out, 0o755); err != nil {
		return err
	}
	if a.report == "" {
		a.report = filepath.Join(a.out, "RESULTS.md")
	}
	cfg := eval.DefaultZoo(a.quick)
	cfg.Workers = a.jobs
	var bar *evalBar
	if !a.noProgress && progress.IsTerminal(cmd.ErrOrStderr()) {
		bar = newEvalBar(cmd.ErrOrStderr())
		cfg.Progress = bar
	}
	res, err := eval.ZooSweep(ins, cfg)
	if bar != nil {
		bar.finish()
	}
	if err != nil {
		return err
	}
	for i := range res.Models { // the converted file lived in tmp
		if res.Models[i].Role == eval.ZooRoleConverted {
			res.Models[i].Path = ""
		}
	}
	info := eval.ReportInfo{Command: commandLine(cmd), Commit: commit, Dirty: dirty}
	nfig, err := writeSuite(a.out, a.report, "zoo.json", res, info,
		func() ([]eval.Figure, error) { return eval.PlotZoo(a.out, res) },
		func(figs []eval.Figure, info eval.ReportInfo) string { return eval.WriteZooSection(res, figs, info) },
		eval.ZooSectionBegin, eval.ZooSectionEnd)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s, %d figures in %s, and the zoo section of %s  (%d models, %.0f s)\n",
		filepath.Join(a.out, "zoo.json"), nfig, a.out, a.report, len(res.Models), res.Wall)
	return nil
}
