package eval

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/kvlm/kvlm/kvcalc"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// The zoo suite (`kvlm eval --suite zoo`): every model of the trained zoo
// (train/zoo/ARCH/model.gguf, docs/ZOO.md) scored on the trainer's own
// held-out windows under each storage codec and under SnapKV, with the KV
// bytes each holds: held-out NLL against KV bytes per token for every
// architecture × codec × method.

// ZooRecordTol is how far kvlm's full-cache f32 held-out NLL may be from
// the trainer's record (nats): the suite refuses to report a model it does
// not reproduce.
const ZooRecordTol = 1e-3

// ZooRecord is what the suite reads of the trainer's record.json.
type ZooRecord struct {
	Arch    string `json:"arch"`
	Heldout struct {
		Windows [][]int `json:"windows"`  // BOS + 255 tokens each (train/data.py)
		MeanNLL float64 `json:"mean_nll"` // the trainer's mean over every prediction of every window
	} `json:"heldout"`
	// An uptrained model's start (train/uptrain.sh): the converted file
	// and the trainer's held-out NLL of it before training.
	Init    string   `json:"init"`
	InitNLL *float64 `json:"init_heldout_nll"`
}

// ReadZooRecord reads DIR/record.json beside DIR/model.gguf.
func ReadZooRecord(dir string) (ZooRecord, error) {
	var r ZooRecord
	path := filepath.Join(dir, "record.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("%s has no record.json (the trainer's held-out windows and NLL, train/train.py)", dir)
	}
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %v", path, err)
	}
	if len(r.Heldout.Windows) == 0 || !(r.Heldout.MeanNLL > 0) {
		return r, fmt.Errorf("%s: no held-out windows or mean NLL", path)
	}
	return r, nil
}

// HeldoutNLL is the mean NLL over every prediction of every window, each
// window run through a fresh sequence of m with the cache kv (as the
// trainer scores them: every window from its BOS, all its predictions).
func HeldoutNLL(m *model.Model, windows [][]int, kv model.KVOptions) (mean float64, predictions int, err error) {
	var sum float64
	for i, w := range windows {
		seq, err := m.NewStandaloneSequence(kv)
		if err != nil {
			return 0, 0, err
		}
		r, err := Perplexity(seq, w)
		seq.Close()
		if err != nil {
			return 0, 0, fmt.Errorf("window %d: %w", i, err)
		}
		sum += r.MeanNLL * float64(r.Predictions)
		predictions += r.Predictions
	}
	return sum / float64(predictions), predictions, nil
}

// ZooVariant is one column of the suite: a cache's codec (keys and values)
// and method.
type ZooVariant struct {
	Name   string  `json:"name"`
	Codec  string  `json:"codec"`
	Method string  `json:"method"`          // "full" or a policy
	Ratio  float64 `json:"ratio,omitempty"` // of the prefix's tokens kept
}

// ZooVariants are the suite's columns: the full cache in every codec the
// issue names, SnapKV at ratio 0.25 in f16 and in q8.
var ZooVariants = []ZooVariant{
	{"f32", "f32", "full", 0},
	{"f16", "f16", "full", 0},
	{"q8", "q8", "full", 0},
	{"q4", "q4", "full", 0},
	{"kivi2", "kivi2", "full", 0},
	{"snapkv 0.25 f16", "f16", "snapkv", 0.25},
	{"snapkv 0.25 q8", "q8", "snapkv", 0.25},
}

// ZooConfig is one run of the suite.
type ZooConfig struct {
	// Prefix is the tokens of each window (BOS first) prefilled (and, for a
	// policy, compressed) before the rest is scored token by token.
	Prefix int `json:"prefix"`
	// Windows is how many of each record's windows the variants score
	// (the first ones; 0: all). The record check always uses all.
	Windows  int          `json:"windows"`
	Variants []ZooVariant `json:"variants"`
	Quick    bool         `json:"quick"`
	Workers  int          `json:"workers"`
	Progress Progress     `json:"-"`
}

// DefaultZoo is the suite's configuration; quick scores 4 windows.
func DefaultZoo(quick bool) ZooConfig {
	c := ZooConfig{Prefix: 192, Variants: ZooVariants, Quick: quick, Workers: 1}
	if quick {
		c.Windows = 4
	}
	return c
}

// ZooInput is one model to score.
type ZooInput struct {
	Name    string  // the zoo folder's name (the architecture)
	Path    string  // its model.gguf
	Windows [][]int // the held-out windows
	Trainer float64 // the trainer's NLL over Windows, to reproduce within ZooRecordTol
	Only    bool    // the record check alone, no variants (a converted file)
	Role    string  // the uptraining table's row, if any (ZooRole*)
	Source  string  // what the model was made from (informative)
}

// The uptraining table's rows.
const (
	ZooRoleSource    = "source"
	ZooRoleConverted = "converted"
	ZooRoleUptrained = "uptrained"
	ZooRoleScratch   = "scratch"
)

// ZooResults is everything the suite measured.
type ZooResults struct {
	Config ZooConfig  `json:"config"`
	Models []ZooModel `json:"models"`
	Wall   float64    `json:"wall_s"`
}

// ZooModel is one model's measurements.
type ZooModel struct {
	Name         string `json:"name"`
	Path         string `json:"path"`
	Role         string `json:"role,omitempty"`
	Source       string `json:"source,omitempty"`
	Layers       int    `json:"layers"`
	KVHeads      int    `json:"kv_heads"`
	CacheLayers  int    `json:"cache_layers"` // KV owners: the layers the cache holds
	KVSource     []int  `json:"kv_source,omitempty"`
	LayerWindows []int  `json:"layer_window,omitempty"`
	// The record check: kvlm's full-cache f32 NLL over every window and
	// prediction, and the trainer's.
	TrainerNLL  float64 `json:"trainer_nll"`
	HeldoutNLL  float64 `json:"heldout_nll"`
	Predictions int     `json:"heldout_predictions"`
	// kvcalc, f32: pool bytes per token of the layers without a window
	// (kvcalc.Calc.BytesPerToken) and the most the window-bounded layers
	// ever hold (BoundBytes).
	KVCalcPerTokenF32 float64  `json:"kvcalc_bytes_per_token_f32"`
	KVCalcBoundF32    int64    `json:"kvcalc_bound_bytes_f32"`
	Rows              []ZooRow `json:"rows,omitempty"`
}

// ZooRow is one model under one variant, over the scored windows.
type ZooRow struct {
	Variant     string  `json:"variant"`
	Codec       string  `json:"codec"`
	Method      string  `json:"method"`
	Ratio       float64 `json:"ratio,omitempty"`
	Policy      string  `json:"policy,omitempty"` // the normalized policy
	Windows     int     `json:"windows"`
	Predictions int     `json:"predictions"`
	// NLL is the mean NLL of the continuation's predictions (every window
	// scores the same number); Delta its paired difference from the f32
	// full cache's and DeltaSE that difference's standard error over the
	// windows.
	NLL     float64 `json:"nll"`
	Delta   float64 `json:"delta_vs_f32"`
	DeltaSE float64 `json:"delta_se"`
	// Top1 is the share of predictions whose argmax is the f32 full
	// cache's.
	Top1 float64 `json:"top1_agreement"`
	// KVBytes is the pool's bytes holding the prefix (after compression),
	// mean over windows; KVBytesPerToken = KVBytes / Prefix; KVBytesPeak
	// the most the sequence held (a policy's prefix before it compressed
	// it included).
	KVBytes         float64 `json:"kv_bytes"`
	KVBytesPerToken float64 `json:"kv_bytes_per_token"`
	KVBytesPeak     float64 `json:"kv_bytes_peak"`
	// kvcalc on the file for the same prefix, codec and ratio: the pool's
	// bytes (kvcalc.Row.TotalBytes) and the textbook formula's.
	KVCalcBytes    int64     `json:"kvcalc_bytes"`
	KVFormulaBytes int64     `json:"kvcalc_formula_bytes"`
	PerWindow      []float64 `json:"nll_per_window"`
}

// Row is the model's row of a variant, or nil.
func (z *ZooModel) Row(variant string) *ZooRow {
	for i := range z.Rows {
		if z.Rows[i].Variant == variant {
			return &z.Rows[i]
		}
	}
	return nil
}

// ZooSweep scores every input: the record check on all its windows, then
// (unless Only) every variant on the first cfg.Windows.
func ZooSweep(inputs []ZooInput, cfg ZooConfig) (*ZooResults, error) {
	t0 := time.Now()
	if len(inputs) == 0 {
		return nil, errors.New("eval: the zoo suite has no models")
	}
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	if cfg.Variants == nil {
		cfg.Variants = ZooVariants
	}
	if len(cfg.Variants) == 0 || cfg.Variants[0].Codec != "f32" || cfg.Variants[0].Method != "full" {
		return nil, errors.New("eval: the zoo suite's first variant must be the full f32 cache (the others are compared with it)")
	}
	res := &ZooResults{Config: cfg}
	if cfg.Progress != nil {
		var total int64
		for _, in := range inputs {
			total += int64(len(in.Windows))
			if !in.Only {
				total += int64(zooWindows(in, cfg) * (len(cfg.Variants) + 1))
			}
		}
		cfg.Progress.Start(total)
	}
	for _, in := range inputs {
		zm, err := zooModel(in, cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in.Name, err)
		}
		res.Models = append(res.Models, zm)
	}
	res.Wall = time.Since(t0).Seconds()
	return res, nil
}

func zooWindows(in ZooInput, cfg ZooConfig) int {
	if cfg.Windows > 0 {
		return min(cfg.Windows, len(in.Windows))
	}
	return len(in.Windows)
}

func zooModel(in ZooInput, cfg ZooConfig) (ZooModel, error) {
	zm := ZooModel{Name: in.Name, Path: in.Path, Role: in.Role, Source: in.Source, TrainerNLL: in.Trainer}
	m, _, err := model.LoadGGUF(in.Path)
	if err != nil {
		return zm, err
	}
	defer m.Close()
	c := m.Config
	zm.Layers, zm.KVHeads, zm.CacheLayers = c.Layers, c.KVHeads, m.KVLayout().Layers
	zm.KVSource, zm.LayerWindows = c.KVSource, c.LayerWindows
	for i, w := range in.Windows {
		if len(w) < cfg.Prefix+2 && !in.Only {
			return zm, fmt.Errorf("held-out window %d has %d tokens, fewer than the prefix %d + 2", i, len(w), cfg.Prefix)
		}
	}
	km, err := kvcalc.FromGGUF(in.Path)
	if err != nil {
		return zm, err
	}
	calc, err := kvcalc.New(km, kvcalc.Options{K: kvcalc.F32, V: kvcalc.F32})
	if err != nil {
		return zm, err
	}
	zm.KVCalcPerTokenF32, zm.KVCalcBoundF32 = calc.BytesPerToken(), calc.BoundBytes()

	// The record check: every window, full f32 cache, every prediction.
	per := make([]PPLResult, len(in.Windows))
	var jobs []job
	for i, w := range in.Windows {
		jobs = append(jobs, job{1, fmt.Sprintf("%s held-out window %d", in.Name, i), func() error {
			seq, err := m.NewStandaloneSequence(model.KVOptions{})
			if err != nil {
				return err
			}
			defer seq.Close()
			per[i], err = Perplexity(seq, w)
			return err
		}})
	}
	// The variants: a reference per window, then each variant on it.
	nw := zooWindows(in, cfg)
	if in.Only {
		nw = 0
	}
	nv := len(cfg.Variants)
	outs := make([][]TrialResult, nw) // [window][variant]
	pols := make([]string, nv)
	for wi := range nw {
		outs[wi] = make([]TrialResult, nv)
		w := in.Windows[wi]
		tr := Trial{Context: w[:cfg.Prefix], Continue: w[cfg.Prefix:]}
		jobs = append(jobs, job{int64(nv + 1), fmt.Sprintf("%s window %d", in.Name, wi), func() error {
			ref, err := NewReference(m, tr)
			if err != nil {
				return err
			}
			for vi, v := range cfg.Variants {
				t := tr
				if v.Method != "full" {
					t.Policy = policy.Config{Method: v.Method, Ratio: v.Ratio}
					if wi == 0 {
						if n, err := t.Policy.Normalize(); err == nil {
							pols[vi] = n.String()
						}
					}
				}
				kv, err := kvCodec(v.Codec)
				if err != nil {
					return err
				}
				t.KV = kv
				if outs[wi][vi], err = Run(m, t, ref); err != nil {
					return fmt.Errorf("%s: %w", v.Name, err)
				}
			}
			return nil
		}})
	}
	if err := runJobs(jobs, cfg.Workers, cfg.Progress); err != nil {
		return zm, err
	}
	var sum float64
	for _, r := range per {
		sum += r.MeanNLL * float64(r.Predictions)
		zm.Predictions += r.Predictions
	}
	zm.HeldoutNLL = sum / float64(zm.Predictions)
	if d := math.Abs(zm.HeldoutNLL - in.Trainer); !(d <= ZooRecordTol) {
		return zm, fmt.Errorf("kvlm's full-cache f32 held-out NLL %.6f is not the trainer's %.6f (difference %.3g > %g): kvlm does not reproduce this model, so its rows would mean nothing",
			zm.HeldoutNLL, in.Trainer, d, ZooRecordTol)
	}
	if nw == 0 {
		return zm, nil
	}
	for vi, v := range cfg.Variants {
		row := ZooRow{Variant: v.Name, Codec: v.Codec, Method: v.Method, Ratio: v.Ratio, Policy: pols[vi], Windows: nw}
		var nll, delta, top1, kvb, peak []float64
		for wi := range nw {
			r := outs[wi][vi]
			nll = append(nll, r.NLL)
			delta = append(delta, r.NLL-outs[wi][0].NLL)
			top1 = append(top1, r.Top1)
			kvb = append(kvb, float64(r.KVBytes))
			peak = append(peak, float64(r.PeakKVBytes))
			row.Predictions += len(in.Windows[wi]) - cfg.Prefix - 1
		}
		row.NLL, _ = meanSE(nll)
		row.Delta, row.DeltaSE = meanSE(delta)
		row.Top1, _ = meanSE(top1)
		row.KVBytes, _ = meanSE(kvb)
		row.KVBytesPeak, _ = meanSE(peak)
		row.KVBytesPerToken = row.KVBytes / float64(cfg.Prefix)
		row.PerWindow = nll
		cc, err := kvcalc.ParseCodec(v.Codec)
		if err != nil {
			return zm, err
		}
		o := kvcalc.Options{K: cc, V: cc}
		if v.Method != "full" {
			o.Ratio = v.Ratio
		}
		kr, err := kvcalc.Compute(km, o, 1, cfg.Prefix)
		if err != nil {
			return zm, err
		}
		row.KVCalcBytes, row.KVFormulaBytes = kr.TotalBytes, kr.FormulaTotalBytes
		zm.Rows = append(zm.Rows, row)
	}
	return zm, nil
}
