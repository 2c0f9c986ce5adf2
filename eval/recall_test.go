package eval

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvlm/kvlm/engine"
	"github.com/kvlm/kvlm/internal/shared"
	"github.com/kvlm/kvlm/kvcache/codec"
	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
	"github.com/kvlm/kvlm/tokenizer"
)

func recallVocab(t *testing.T) (*model.Model, tokenizer.Tokenizer, *RecallVocab) {
	t.Helper()
	m, tok, err := engine.Load(shared.Path(t, "models/stories260K/stories260K.bin"), shared.Path(t, "models/stories260K/tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	v, err := NewRecallVocab(tok, filepath.Dir(shared.Path(t, "data/"+HeldOutFile)))
	if err != nil {
		t.Fatal(err)
	}
	return m, tok, v
}

// TestWilson checks the interval against the roots of the quadratic it is
// defined by, (p̂ − p)² = z² p(1 − p)/n, and the sample count against a
// search over every k.
func TestWilson(t *testing.T) {
	for _, c := range []struct{ k, n int }{{0, 10}, {3, 10}, {10, 10}, {190, 381}, {1, 381}, {50, 100}} {
		t.Run("", func(t *testing.T) {
			n, ph, z := float64(c.n), float64(c.k)/float64(c.n), Z95
			// (1 + z²/n) p² − (2p̂ + z²/n) p + p̂² = 0
			a, b, cc := 1+z*z/n, -(2*ph + z*z/n), ph*ph
			r1 := (-b - math.Sqrt(b*b-4*a*cc)) / (2 * a)
			r2 := (-b + math.Sqrt(b*b-4*a*cc)) / (2 * a)
			lo, hi := Wilson(c.k, c.n, z)
			if math.Abs(lo-r1) > 1e-12 || math.Abs(hi-r2) > 1e-12 {
				t.Errorf("Wilson(%d, %d) = [%g, %g], roots [%g, %g]", c.k, c.n, lo, hi, r1, r2)
			}
		})
	}
	widest := func(n int) float64 {
		w := 0.0
		for k := 0; k <= n; k++ {
			lo, hi := Wilson(k, n, Z95)
			w = max(w, (hi-lo)/2)
		}
		return w
	}
	n := WilsonSamples(0.05, Z95)
	if widest(n) > 0.05 || widest(n-1) <= 0.05 {
		t.Errorf("WilsonSamples(0.05) = %d: half-widths %g at n, %g at n−1", n, widest(n), widest(n-1))
	}
	if n != 381 {
		t.Errorf("n = %d, want 381 (z/(2·0.05))² − z² = 380.3)", n)
	}
}

// TestRecallStop checks the margin's stopping rule: only at the looks
// (40, 80, 160, …) and only when the interval is within the margin; always
// at the most samples; never without a margin.
func TestRecallStop(t *testing.T) {
	for _, c := range []struct {
		correct, n, max int
		margin          float64
		want            bool
	}{
		{40, 40, 381, 0.05, true},    // 100%: [91.2, 100], ±4.4
		{0, 40, 381, 0.05, true},     // 0%: ±4.4
		{39, 40, 381, 0.05, false},   // 97.5%: [87.1, 99.6], ±6.3
		{78, 80, 381, 0.05, true},    // 97.5%: [91.3, 99.3], ±4.0
		{20, 40, 381, 0.05, false},   // 50%: ±14.6
		{41, 41, 381, 0.05, false},   // not a look
		{60, 60, 381, 0.05, false},   // not a look
		{39, 39, 381, 0.05, false},   // before the first look
		{160, 160, 381, 0.05, true},  // a later look
		{160, 320, 381, 0.05, false}, // 50% at 320: ±5.4
		{190, 381, 381, 0.05, true},  // the most samples
		{40, 40, 381, 0, false},      // no margin
		{7, 7, 7, 0, true},           // no margin: the most samples
	} {
		t.Run(fmt.Sprintf("%d-of-%d-max%d-margin%g", c.correct, c.n, c.max, c.margin), func(t *testing.T) {
			if got := recallStop(c.correct, c.n, c.max, c.margin); got != c.want {
				lo, hi := Wilson(c.correct, c.n, Z95)
				t.Errorf("stop %v, want %v (interval [%.3f, %.3f])", got, c.want, lo, hi)
			}
		})
	}
}

// TestRecallTasks checks each task's samples: they fit the context, are a
// function of the seed, hide the answer in the context before the
// question, and stay in the held-out text.
func TestRecallTasks(t *testing.T) {
	_, tok, v := recallVocab(t)
	spec := DefaultRecallSpec()
	if len(v.Words()) < spec.MinPool {
		t.Fatalf("pool %v", v.Words())
	}
	for _, task := range RecallTasks {
		t.Run(task, func(t *testing.T) {
			for _, ctx := range []int{256, 512, 1024} {
				for seed := range uint64(20) {
					d := -1.0
					if task == TaskNeedle {
						d = NeedleDepths[int(seed)%len(NeedleDepths)]
					}
					s, err := v.Sample(spec, task, ctx, d, seed)
					if err != nil {
						t.Fatal(err)
					}
					again, _ := v.Sample(spec, task, ctx, d, seed)
					if !slices.Equal(s.Prompt, again.Prompt) || !slices.Equal(s.Answer, again.Answer) {
						t.Fatal("not a function of the seed")
					}
					if n := len(s.Prompt) + len(s.Answer); n > ctx || (task != TaskCWE && n != ctx) {
						t.Fatalf("ctx %d: %d tokens", ctx, n)
					}
					if s.Prompt[0] != tok.BOS() || s.Question <= 0 || s.Question >= len(s.Prompt) {
						t.Fatalf("prompt head %d, question at %d", s.Prompt[0], s.Question)
					}
					body := s.Prompt[:s.Question]
					for _, p := range s.Parts {
						part := s.Answer[p[0]:p[1]]
						if !containsRun(body, part) {
							t.Fatalf("seed %d: answer part %v (%q) is not in the context", seed, part, tok.DecodeAll(part))
						}
					}
				}
			}
		})
	}
	t.Run("depth", func(t *testing.T) {
		// The needle's place follows its depth.
		prev := -1
		for _, d := range NeedleDepths {
			s, err := v.Sample(spec, TaskNeedle, 512, d, 7)
			if err != nil {
				t.Fatal(err)
			}
			at := indexRun(s.Prompt[:s.Question], s.Answer)
			frac := float64(at) / float64(s.Question)
			if at <= prev || math.Abs(frac-d) > 0.1 {
				t.Errorf("depth %g: needle at %d of %d", d, at, s.Question)
			}
			prev = at
		}
	})
	t.Run("seeds differ", func(t *testing.T) {
		a, _ := v.Sample(spec, TaskMultiKey, 512, -1, 1)
		b, _ := v.Sample(spec, TaskMultiKey, 512, -1, TrainSeedStart+1)
		if slices.Equal(a.Prompt, b.Prompt) {
			t.Error("an evaluation and a training seed give the same sample")
		}
	})
	t.Run("bad input", func(t *testing.T) {
		for _, c := range []struct {
			task  string
			ctx   int
			depth float64
		}{{"nope", 512, -1}, {TaskNeedle, 512, 1.5}, {TaskMultiKey, 20, -1}, {TaskCWE, 30, -1}, {TaskNeedle, 200000, 0}} {
			if _, err := v.Sample(spec, c.task, c.ctx, c.depth, 0); err == nil {
				t.Errorf("%+v: no error", c)
			}
		}
	})
}

func indexRun(xs, run []int) int {
	for i := 0; i+len(run) <= len(xs); i++ {
		if slices.Equal(xs[i:i+len(run)], run) {
			return i
		}
	}
	return -1
}

func containsRun(xs, run []int) bool { return indexRun(xs, run) >= 0 }

// TestRecallScoring is the must-show: the known answer scores
// 100%, a constant answer the chance rate (within the measured rate's
// Wilson interval), on every task, with the suite's sizes and with
// one-digit values (chance 1/10: a rate the test can miss).
func TestRecallScoring(t *testing.T) {
	_, _, v := recallVocab(t)
	one := DefaultRecallSpec()
	one.Digits = 1
	n := WilsonSamples(0.05, Z95)
	for name, spec := range map[string]RecallSpec{"suite": DefaultRecallSpec(), "one digit": one} {
		for _, task := range RecallTasks {
			t.Run(name+"/"+task, func(t *testing.T) {
				chance, partChance, err := v.ChanceRate(spec, task)
				if err != nil {
					t.Fatal(err)
				}
				var oracle, constant, parts, partsOK int
				for seed := range uint64(n) {
					d := -1.0
					if task == TaskNeedle {
						d = NeedleDepths[int(seed)%len(NeedleDepths)]
					}
					s, err := v.Sample(spec, task, 512, d, seed)
					if err != nil {
						t.Fatal(err)
					}
					if all, _ := Score(s, s.Answer); all {
						oracle++
					}
					all, right := Score(s, v.Constant(spec, s))
					if all {
						constant++
					}
					parts += len(s.Parts)
					partsOK += right
				}
				if oracle != n {
					t.Errorf("the known answer scored %d of %d", oracle, n)
				}
				lo, hi := Wilson(constant, n, Z95)
				if chance < lo || chance > hi {
					t.Errorf("constant answer: %d of %d, interval [%.4f, %.4f]; chance %.4f", constant, n, lo, hi, chance)
				}
				plo, phi := Wilson(partsOK, parts, Z95)
				if partChance < plo || partChance > phi {
					t.Errorf("constant answer's parts: %d of %d, interval [%.4f, %.4f]; chance %.4f", partsOK, parts, plo, phi, partChance)
				}
				t.Logf("chance %.4g, constant %d/%d [%.4f, %.4f]; parts %.4g, %d/%d", chance, constant, n, lo, hi, partChance, partsOK, parts)
			})
		}
	}
}

// TestRecallConfused: every sample names the context's values that no
// part asks for (Others: multi-key Keys−1, multi-query Keys−Queries, vt
// Chains−1, none otherwise), each of them in the context; Confused counts
// a wrong part that copies one of them or another part's value, and not a
// right part nor a value absent from the context.
func TestRecallConfused(t *testing.T) {
	_, _, v := recallVocab(t)
	spec := DefaultRecallSpec()
	want := map[string]int{TaskNeedle: 0, TaskMultiKey: spec.Keys - 1, TaskMultiValue: 0,
		TaskMultiQuery: spec.Keys - spec.Queries, TaskVarTrack: spec.Chains - 1, TaskCWE: 0}
	for _, task := range RecallTasks {
		t.Run(task, func(t *testing.T) {
			for seed := range uint64(30) {
				d := -1.0
				if task == TaskNeedle {
					d = 0.5
				}
				s, err := v.Sample(spec, task, 512, d, seed)
				if err != nil {
					t.Fatal(err)
				}
				if len(s.Others) != want[task] {
					t.Fatalf("seed %d: %d other values, want %d", seed, len(s.Others), want[task])
				}
				for _, o := range s.Others {
					if !containsRun(s.Prompt[:s.Question], o) {
						t.Fatalf("seed %d: other value %v not in the context", seed, o)
					}
				}
				if c := Confused(s, s.Answer); c != 0 {
					t.Fatalf("seed %d: the known answer has %d confused parts", seed, c)
				}
				lost := v.Constant(spec, s) // 0…0: in no context but by a 10^-4 chance
				if c := Confused(s, lost); c != 0 && task != TaskCWE && !containsRun(s.Prompt, lost[s.Parts[0][0]:s.Parts[0][1]]) {
					t.Fatalf("seed %d: a value absent from the context counted confused (%d)", seed, c)
				}
				got := slices.Clone(s.Answer)
				switch task {
				case TaskMultiKey, TaskVarTrack: // another key's or chain's value
					p := s.Parts[0]
					copy(got[p[0]:p[1]], s.Others[0])
					if all, _ := Score(s, got); all || Confused(s, got) != 1 {
						t.Fatalf("seed %d: another value scored %v, %d confused", seed, all, Confused(s, got))
					}
				case TaskMultiValue, TaskMultiQuery: // the first two parts swapped
					a, b := s.Parts[0], s.Parts[1]
					x, y := slices.Clone(s.Answer[a[0]:a[1]]), slices.Clone(s.Answer[b[0]:b[1]])
					if slices.Equal(x, y) {
						continue
					}
					copy(got[a[0]:a[1]], y)
					copy(got[b[0]:b[1]], x)
					if c := Confused(s, got); c != 2 {
						t.Fatalf("seed %d: swapped parts, %d confused", seed, c)
					}
				case TaskCWE:
					p := s.Parts[0]
					copy(got[p[0]:p[1]], lost[p[0]:min(p[1], len(lost))])
					if c := Confused(s, got); c != 0 {
						t.Fatalf("seed %d: cwe counted %d confused", seed, c)
					}
				}
			}
		})
	}
}

// TestRecallAnswer checks the generation against a plain greedy loop over
// the full sequence (the prompt and the tokens so far recomputed from
// scratch at every step), and that with the full cache both protocols
// give the same tokens.
func TestRecallAnswer(t *testing.T) {
	m, _, v := recallVocab(t)
	spec := DefaultRecallSpec()
	for _, task := range []string{TaskNeedle, TaskMultiQuery, TaskCWE} {
		t.Run(task, func(t *testing.T) {
			d := -1.0
			if task == TaskNeedle {
				d = 0.5
			}
			s, err := v.Sample(spec, task, 256, d, 3)
			if err != nil {
				t.Fatal(err)
			}
			ids := slices.Clone(s.Prompt)
			var want []int
			for range s.Answer {
				seq, err := m.NewStandaloneSequence(model.KVOptions{Tokens: len(ids)})
				if err != nil {
					t.Fatal(err)
				}
				logits, err := seq.Forward(ids, false)
				seq.Close()
				if err != nil {
					t.Fatal(err)
				}
				next := argmax(logits)
				want = append(want, next)
				ids = append(ids, next)
			}
			for _, proto := range []string{ProtoAware, ProtoAgnostic} {
				got, _, err := RecallAnswer(m, s, policy.Config{Method: "full"}, model.KVOptions{}, proto)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: %v, want %v", proto, got, want)
				}
			}
		})
	}
}

// TestUpdateSection checks that the recall section replaces itself and
// leaves the rest of the report alone.
func TestUpdateSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "R.md")
	const head, tail = "# R\n\nbefore\n", "\n## After\n\nafter\n"
	sec := func(x string) string { return RecallSectionBegin + "\n" + x + "\n" + RecallSectionEnd + "\n" }
	if err := os.WriteFile(path, []byte(head), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := UpdateSection(path, sec("one"), RecallSectionBegin, RecallSectionEnd); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if want := head + "\n" + sec("one"); string(b) != want {
		t.Fatalf("appended:\n%q\nwant\n%q", b, want)
	}
	if err := os.WriteFile(path, append(b[:len(b)-1], tail...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := UpdateSection(path, sec("two"), RecallSectionBegin, RecallSectionEnd); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	if want := head + "\n" + strings.TrimSuffix(sec("two"), "\n") + tail; string(b) != want {
		t.Fatalf("replaced:\n%q\nwant\n%q", b, want)
	}
	// The compress suite's rewrite keeps the section.
	if got, want := string(CarrySection(b, []byte("# new\n"))), "# new\n\n"+sec("two"); got != want {
		t.Errorf("carried:\n%q\nwant\n%q", got, want)
	}
	if got := string(CarrySection([]byte(head), []byte("# new\n"))); got != "# new\n" {
		t.Errorf("carried from a report without the section: %q", got)
	}
	// With the zoo suite's section too: both carried, in their order.
	zoo := ZooSectionBegin + "\nzoo\n" + ZooSectionEnd + "\n"
	if err := UpdateSection(path, zoo, ZooSectionBegin, ZooSectionEnd); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	if got, want := string(CarrySection(b, []byte("# new\n"))), "# new\n\n"+sec("two")+"\n"+zoo; got != want {
		t.Errorf("carried both:\n%q\nwant\n%q", got, want)
	}
	if got, want := string(CarrySection(b, []byte("# new\n\n"+zoo))), "# new\n\n"+zoo+"\n"+sec("two"); got != want {
		t.Errorf("carried the recall section after a report holding the zoo's:\n%q\nwant\n%q", got, want)
	}
	if err := os.WriteFile(path, []byte(head+RecallSectionBegin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := UpdateSection(path, sec("x"), RecallSectionBegin, RecallSectionEnd); err == nil {
		t.Error("a missing end marker is not refused")
	}
}

// TestRecallMethods runs one sample through every registered method under
// both schedules and protocols, in f16 and KIVI-2: the full suite's
// configurations all run (but those the policy refuses on grouped KIVI
// keys, which the suite reports as n/a), and each compressing one holds fewer bytes than
// the full cache.
func TestRecallMethods(t *testing.T) {
	m, _, v := recallVocab(t)
	s, err := v.Sample(DefaultRecallSpec(), TaskMultiKey, 256, -1, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, full, err := RecallAnswer(m, s, policy.Config{Method: "full"}, model.KVOptions{}, ProtoAware)
	if err != nil {
		t.Fatal(err)
	}
	for _, meth := range policy.Methods {
		if meth == "full" {
			continue
		}
		scheds := []string{SchedPrefill, SchedDecode}
		if mode, _ := MethodMode(meth); mode == modeSchedule {
			scheds = []string{SchedOwn}
		}
		for _, sched := range scheds {
			for _, cd := range []string{"f16", "kivi2"} {
				for _, proto := range []string{ProtoAware, ProtoAgnostic} {
					t.Run(meth+"/"+sched+"/"+cd+"/"+proto, func(t *testing.T) {
						n := len(s.Prompt)
						if proto == ProtoAgnostic {
							n = s.Question
						}
						pc, err := recallConfig(meth, 0.25, n, sched)
						if err != nil {
							t.Fatal(err)
						}
						kc, _ := codec.Parse(cd, codec.Keys)
						vc, _ := codec.Parse(cd, codec.Values)
						got, b, err := RecallAnswer(m, s, pc, model.KVOptions{K: kc, V: vc, MemBytes: poolHeadroom(m)}, proto)
						if err != nil && cd == "kivi2" && strings.Contains(err.Error(), "sealed in groups") {
							t.Skip(err) // the method cannot run on grouped keys: the suite reports n/a
						}
						if err != nil {
							t.Fatal(err)
						}
						if len(got) != len(s.Answer) || b <= 0 || b >= full {
							t.Errorf("%d tokens, %d bytes (full f32 %d)", len(got), b, full)
						}
					})
				}
			}
		}
	}
}

// TestRecallSectionChance checks the report's at-chance statement follows
// the full cache's cells: present when every interval holds the chance
// rate, absent when one does not.
func TestRecallSectionChance(t *testing.T) {
	cfg := DefaultRecall(true)
	cfg.Tasks, cfg.Methods = []string{TaskMultiKey, TaskVarTrack}, []string{"full"}
	mk := func(correct int) *RecallResults {
		r := &RecallResults{Config: cfg}
		for _, task := range cfg.Tasks {
			for _, pr := range cfg.Protocols {
				c := RecallCell{Model: "m", Method: "full", Ratio: 1, Codec: "f32", Schedule: "-", Protocol: pr, Task: task,
					Context: 256, Depth: -1, N: 381, Correct: correct, Chance: 1e-4}
				r.Cells = append(r.Cells, c)
			}
		}
		return r
	}
	const claim = "at the chance rate on every task"
	if s := WriteRecallSection(mk(0), nil, ReportInfo{}); !strings.Contains(s, claim) {
		t.Error("no at-chance statement for a model that scores 0")
	}
	r := mk(0)
	r.Cells[1].Correct = 300
	if s := WriteRecallSection(r, nil, ReportInfo{}); strings.Contains(s, claim) {
		t.Error("an at-chance statement though one cell is far above chance")
	}
}

// TestRecallHaystack: a trainer's samples (HaystackTrain) take their
// haystack from the train part only, bytes [0, HeldOutStart) tokenized on
// their own, and are otherwise the evaluation's samples: the same seed
// gives the same answer, question and length. Runs of 24 tokens that occur
// in the held-out part and nowhere in the train part are the test's
// witness: held-out samples contain them, train samples must not.
func TestRecallHaystack(t *testing.T) {
	_, tok, held := recallVocab(t)
	dir := filepath.Dir(shared.Path(t, "data/"+HeldOutFile))
	train, err := NewRecallVocabFrom(tok, dir, HaystackTrain)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, HeldOutFile))
	if err != nil {
		t.Fatal(err)
	}
	trainIDs := tok.Encode(string(b[:HeldOutStart]), false, false)
	heldIDs := tok.Encode(string(b[HeldOutStart:HeldOutEnd]), false, false)
	if !slices.Equal(train.hay, trainIDs) || !slices.Equal(held.hay, heldIDs) {
		t.Fatalf("haystacks: train %d tokens (want %d), held-out %d (want %d)", len(train.hay), len(trainIDs), len(held.hay), len(heldIDs))
	}
	const n = 24
	key := func(xs []int) string { return fmt.Sprint(xs) }
	inTrain := map[string]bool{}
	for i := 0; i+n <= len(trainIDs); i++ {
		inTrain[key(trainIDs[i:i+n])] = true
	}
	heldOnly := map[string]bool{}
	for i := 0; i+n <= len(heldIDs); i++ {
		if k := key(heldIDs[i : i+n]); !inTrain[k] {
			heldOnly[k] = true
		}
	}
	heldRuns := func(xs []int) int {
		c := 0
		for i := 0; i+n <= len(xs); i++ {
			if heldOnly[key(xs[i:i+n])] {
				c++
			}
		}
		return c
	}
	spec := DefaultRecallSpec()
	witnessed := 0
	for _, task := range RecallTasks {
		t.Run(task, func(t *testing.T) {
			for _, ctx := range []int{256, 512} {
				for i := range uint64(5) {
					seed := TrainSeedStart + i
					d := -1.0
					if task == TaskNeedle {
						d = NeedleDepths[int(i*3)%len(NeedleDepths)]
					}
					s, err := train.Sample(spec, task, ctx, d, seed)
					if err != nil {
						t.Fatal(err)
					}
					h, err := held.Sample(spec, task, ctx, d, seed)
					if err != nil {
						t.Fatal(err)
					}
					if len(s.Prompt) != len(h.Prompt) || !slices.Equal(s.Answer, h.Answer) || !slices.Equal(s.Prompt[s.Question:], h.Prompt[h.Question:]) {
						t.Fatalf("seed %d: the train haystack changed the sample beyond its haystack: answer %q against %q", seed, s.Text, h.Text)
					}
					if c := heldRuns(s.Prompt[:s.Question]); c > 0 {
						t.Fatalf("ctx %d seed %d: %d held-out-only runs of %d tokens in a train-haystack sample", ctx, seed, c, n)
					}
					witnessed += heldRuns(h.Prompt[:h.Question])
				}
			}
		})
	}
	if witnessed == 0 {
		t.Error("no held-out sample holds a held-out-only run: the check above cannot fail")
	}
	t.Run("needle at the end", func(t *testing.T) {
		// With the needle at depth 1 the haystack is one contiguous run
		// after BOS: it must be a run of the train part.
		s, err := train.Sample(spec, TaskNeedle, 512, 1, TrainSeedStart+7)
		if err != nil {
			t.Fatal(err)
		}
		at := indexRun(s.Prompt[:s.Question], tok.Encode("The pass key is", false, false))
		if at < 100 || !containsRun(trainIDs, s.Prompt[1:at]) {
			t.Fatalf("needle at %d; the haystack before it is not a run of the train part", at)
		}
	})
	if _, err := NewRecallVocabFrom(tok, dir, "test"); err == nil || !strings.Contains(err.Error(), "unknown haystack") {
		t.Errorf("haystack \"test\": err %v", err)
	}
}

// TestRankRecallBytes: the ranking puts the methods within OverBytes of
// the median KV bytes first, best accuracy first, then those keeping
// more, however accurate; RecallBytesShare is each method's bytes over
// the median.
func TestRankRecallBytes(t *testing.T) {
	cfg := RecallConfig{Methods: []string{"full", "a", "b", "c", "big"}, Tasks: []string{TaskNeedle, TaskVarTrack}, Codecs: []string{"f16"}, Schedules: []string{SchedPrefill}, Ratios: []float64{0.25}, Protocols: []string{ProtoAware}}
	r := &RecallResults{Config: cfg}
	for _, c := range []struct {
		m          string
		acc, bytes float64
	}{{"a", 0.4, 100}, {"b", 0.6, 110}, {"c", 0.2, 90}, {"big", 0.9, 400}} {
		for _, task := range cfg.Tasks {
			r.Cells = append(r.Cells, RecallCell{Model: "m", Method: c.m, Ratio: 0.25, Codec: "f16", Schedule: SchedPrefill, Protocol: ProtoAware,
				Task: task, N: 10, Correct: int(10 * c.acc), Acc: c.acc, KVBytes: c.bytes})
		}
	}
	if got, want := RankRecall(r, "m", 0.25), []string{"b", "a", "c", "big"}; !slices.Equal(got, want) {
		t.Fatalf("ranked %v, want %v", got, want)
	}
	// The median of 90, 100, 110 and 400 is 105.
	share := RecallBytesShare(r, "m", 0.25)
	for m, want := range map[string]float64{"a": 100.0 / 105, "b": 110.0 / 105, "c": 90.0 / 105, "big": 400.0 / 105} {
		if math.Abs(share[m]-want) > 1e-12 {
			t.Errorf("%s: bytes share %v, want %v", m, share[m], want)
		}
	}
	sec := WriteRecallSection(r, nil, ReportInfo{})
	if !strings.Contains(sec, "**b**") || !strings.Contains(sec, "**3.81** (over)") {
		t.Errorf("the section does not name b best and big over the bytes:\n%s", sec)
	}
}

// TestRecallConfusionTable: the report's confusion table pools each
// method's cells (parts wrong of all scored, the wrong ones that copy
// another value) and leaves cwe out.
func TestRecallConfusionTable(t *testing.T) {
	cfg := RecallConfig{Methods: []string{"full", "a"}, Tasks: []string{TaskMultiKey, TaskCWE}, Codecs: []string{"f16"},
		Schedules: []string{SchedPrefill}, Ratios: []float64{0.25}, Protocols: []string{ProtoAware}}
	r := &RecallResults{Config: cfg}
	for _, c := range []RecallCell{
		{Method: "full", Ratio: 1, Codec: "f32", Schedule: "-", Context: 256, Parts: 10, PartsOK: 7, PartsConfused: 3},
		{Method: "full", Ratio: 1, Codec: "f32", Schedule: "-", Context: 512, Parts: 10, PartsOK: 9, PartsConfused: 1},
		{Method: "a", Ratio: 0.25, Codec: "f16", Schedule: SchedPrefill, Context: 256, Parts: 10, PartsOK: 2, PartsConfused: 1},
		{Method: "a", Ratio: 0.25, Codec: "f16", Schedule: SchedPrefill, Context: 512, Parts: 10, PartsOK: 10},
	} {
		c.Model, c.Protocol, c.Task, c.N, c.Depth = "m", ProtoAware, TaskMultiKey, 10, -1
		c.Correct = c.PartsOK
		r.Cells = append(r.Cells, c)
		c.Task, c.Parts, c.PartsOK, c.PartsConfused, c.Correct = TaskCWE, 30, 3, 0, 1
		r.Cells = append(r.Cells, c)
	}
	if sec := WriteRecallSection(r, nil, ReportInfo{}); strings.Contains(sec, "another value") {
		t.Error("a confusion table for a run that did not count confused parts")
	}
	r.Confusion = true
	sec := WriteRecallSection(r, nil, ReportInfo{})
	for _, want := range []string{"| method | niah_multikey |", "| full | 4 of 20: 4 another value |", "| a | 8 of 20: 1 another value |"} {
		if !strings.Contains(sec, want) {
			t.Errorf("no %q in the section:\n%s", want, sec)
		}
	}
}

// TestAggregateRecall: a task's accuracy over its (context, depth) cells
// weighs each cell the same, so a cell that ran more samples (--margin
// stops the clear ones early) does not pull the mean its way; with every
// cell of n samples it is the pooled count and its Wilson interval.
func TestAggregateRecall(t *testing.T) {
	cell := func(depth float64, correct, n int) RecallCell {
		return RecallCell{Model: "m", Method: "window", Ratio: 0.25, Codec: "f16", Schedule: SchedPrefill, Protocol: ProtoAware,
			Task: TaskNeedle, Context: 512, Depth: depth, N: n, Correct: correct}
	}
	t.Run("equal samples: the pooled count", func(t *testing.T) {
		cells := []RecallCell{cell(0, 0, 40), cell(0.5, 27, 40), cell(1, 40, 40), cell(0.7, 13, 40)}
		a := AggregateRecall(cells)[0]
		lo, hi := Wilson(80, 160, Z95)
		if a.N != 160 || a.Correct != 80 || math.Abs(a.Acc-0.5) > 1e-12 || math.Abs(a.Lo-lo) > 1e-12 || math.Abs(a.Hi-hi) > 1e-12 {
			t.Errorf("%+v, want 80 of 160 in [%g, %g]", a, lo, hi)
		}
	})
	t.Run("unequal samples: each cell weighs the same", func(t *testing.T) {
		// Eight cells at 0 stopped at 40, one at 2/3 ran 381, two at 1 stopped at 40.
		var cells []RecallCell
		for d := range 8 {
			cells = append(cells, cell(float64(d)/10, 0, 40))
		}
		cells = append(cells, cell(0.8, 254, 381), cell(0.9, 40, 40), cell(1, 40, 40))
		a := AggregateRecall(cells)[0]
		want := (254.0/381 + 2) / 11
		if math.Abs(a.Acc-want) > 1e-12 {
			t.Errorf("accuracy %g, want the cells' mean %g (the pooled count gives %g)", a.Acc, want, float64(a.Correct)/float64(a.N))
		}
		// Its interval: Wilson's at the mean on at most the samples run.
		lo, hi := Wilson(int(math.Round(want*float64(a.N))), a.N, Z95)
		if a.Lo > want || a.Hi < want || a.Lo < lo-0.002 || a.Hi > hi+0.002 {
			t.Errorf("interval [%g, %g] for %g, the samples' own [%g, %g]", a.Lo, a.Hi, want, lo, hi)
		}
	})
	t.Run("a stratified variance sets the sample size", func(t *testing.T) {
		// Two cells near ½ with few samples and many: the effective size
		// is below the samples run, the interval wider than theirs.
		cells := []RecallCell{cell(0, 20, 40), cell(1, 190, 381)}
		a := AggregateRecall(cells)[0]
		p := (0.5 + 190.0/381) / 2
		v := (0.25/40 + (190.0/381)*(191.0/381)/381) / 4
		lo, hi := wilsonP(p, p*(1-p)/v, Z95)
		if math.Abs(a.Lo-lo) > 1e-12 || math.Abs(a.Hi-hi) > 1e-12 {
			t.Errorf("interval [%g, %g], want [%g, %g]", a.Lo, a.Hi, lo, hi)
		}
		if plo, phi := Wilson(a.Correct, a.N, Z95); a.Hi-a.Lo <= phi-plo {
			t.Errorf("interval [%g, %g] no wider than the pooled one [%g, %g]", a.Lo, a.Hi, plo, phi)
		}
	})
}

// TestRecallShared checks the sweep's shared prompts (recallPrefix): every
// method under both schedules and protocols, in f32, f16, q4 and KIVI-2,
// answers from a sample's prompt computed once what it answers from its
// whole prompt computed alone (the same tokens and cache bytes); the
// cached blocks are taken where the method allows (all but the last
// block for a window, none for H2O, none in a KIVI pool); and a sweep's
// cells on the recall model are the same either way.
func TestRecallShared(t *testing.T) {
	m, _, v := recallVocab(t)
	spec := DefaultRecallSpec()
	var samples []RecallSample
	for _, task := range []string{TaskMultiKey, TaskVarTrack} {
		s, err := v.Sample(spec, task, 256, -1, 0)
		if err != nil {
			t.Fatal(err)
		}
		samples = append(samples, s)
	}
	for _, cd := range []string{"f32", "f16", "q4", "kivi2"} {
		var kv model.KVOptions
		if cd != "f32" {
			var err error
			if kv, err = kvCodec(cd); err != nil {
				t.Fatal(err)
			}
			kv.MemBytes = poolHeadroom(m)
		}
		for si, s := range samples {
			pre, err := newRecallPrefix(m, s, kv)
			if err != nil {
				t.Fatal(err)
			}
			for _, meth := range policy.Methods {
				scheds := []string{SchedPrefill, SchedDecode}
				if mode, _ := MethodMode(meth); mode == modeSchedule {
					scheds = []string{SchedOwn}
				}
				for _, sched := range scheds {
					for _, proto := range []string{ProtoAware, ProtoAgnostic} {
						name := fmt.Sprintf("%s/%d/%s/%s/%s", cd, si, meth, sched, proto)
						n := len(s.Prompt)
						if proto == ProtoAgnostic {
							n = s.Question
						}
						pc, err := recallConfig(meth, 0.25, n, sched)
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						want, wb, werr := RecallAnswer(m, s, pc, kv, proto)
						r0 := pre.reused
						got, gb, gerr := pre.answer(s, pc, proto)
						took := pre.reused - r0
						if (werr != nil) != (gerr != nil) {
							t.Fatalf("%s: whole prompt: %v; shared: %v", name, werr, gerr)
						}
						if werr != nil {
							continue // refused alike (grouped KIVI keys)
						}
						if !slices.Equal(got, want) || gb != wb {
							t.Errorf("%s: shared prompt answers %v in %d bytes, the whole prompt %v in %d", name, got, gb, want, wb)
						}
						switch {
						case cd == "kivi2" && took != 0:
							t.Errorf("%s: %d tokens taken from a KIVI pool", name, took)
						case cd != "kivi2" && (meth == "full" || meth == "window") && took != (n-1)/16*16:
							t.Errorf("%s: %d tokens taken from the shared prompt, want %d", name, took, (n-1)/16*16)
						case (meth == "h2o" || meth == "pyramidinfer") && took != 0:
							t.Errorf("%s: %d tokens taken from the shared prompt, want none", name, took)
						}
					}
				}
			}
		}
	}

	// A sweep on the recall model (it answers most samples), every method,
	// both protocols: the same cells from shared and from whole prompts.
	rm, _, err := engine.Load("../train/recall/phase10/model.gguf", "")
	if err != nil {
		t.Fatal(err)
	}
	defer rm.Close()
	rv, err := NewRecallVocab(v.tok, filepath.Dir(shared.Path(t, "data/"+HeldOutFile)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultRecall(false)
	cfg.Tasks, cfg.Contexts, cfg.N, cfg.Ratios, cfg.Codecs, cfg.Schedules = []string{TaskMultiKey, TaskNeedle}, []int{512}, 3, []float64{0.25}, []string{"f16"}, []string{SchedPrefill}
	cfg.Depths = []float64{0.3} // Methods nil: the full cache and every registered method
	whole := cfg
	whole.whole = true
	a, err := RecallSweep(rm, "m", rv, whole)
	if err != nil {
		t.Fatal(err)
	}
	b, err := RecallSweep(rm, "m", rv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if a.PromptReuse != 0 || b.PromptReuse < 0.5 {
		t.Errorf("prompt reuse: whole %.3f, shared %.3f", a.PromptReuse, b.PromptReuse)
	}
	right := 0
	for i := range a.Cells {
		x, y := a.Cells[i], b.Cells[i]
		x.Seconds, y.Seconds = 0, 0
		if x != y {
			t.Errorf("cell %d: whole prompts %+v\nshared %+v", i, x, y)
		}
		right += x.Correct
	}
	if right == 0 {
		t.Error("the recall model answered nothing: the comparison shows little")
	}
}

// TestRecallBestByContext checks the ratio-0.25 best-against-window table
// gives, besides the contexts pooled, each context's own rates.
func TestRecallBestByContext(t *testing.T) {
	cfg := DefaultRecall(false)
	cfg.Tasks, cfg.Protocols, cfg.Contexts, cfg.Codecs, cfg.Schedules = []string{TaskMultiKey}, []string{ProtoAware}, []int{512, 1024}, []string{"f16"}, []string{SchedPrefill}
	cfg.Methods, cfg.Ratios = []string{"full", "keydiff", "window"}, []float64{0.25}
	r := &RecallResults{Config: cfg}
	for _, c := range []struct {
		method  string
		ctx     int
		correct int
	}{{"full", 512, 40}, {"full", 1024, 40}, {"keydiff", 512, 38}, {"keydiff", 1024, 20}, {"window", 512, 10}, {"window", 1024, 0}} {
		ratio, codec, sched := 0.25, "f16", SchedPrefill
		if c.method == "full" {
			ratio, codec, sched = 1, "f32", "-"
		}
		r.Cells = append(r.Cells, RecallCell{Model: "m", Method: c.method, Ratio: ratio, Codec: codec, Schedule: sched, Protocol: ProtoAware,
			Task: TaskMultiKey, Context: c.ctx, Depth: -1, N: 40, Correct: c.correct, Chance: 1e-4, KVBytes: 1000})
	}
	s := WriteRecallSection(r, nil, ReportInfo{})
	for _, row := range []string{
		"| niah_multikey | query-aware | all | 72.5 [", // (95 + 50) / 2
		"| niah_multikey | query-aware | 512 | 95.0 [",
		"| niah_multikey | query-aware | 1024 | 50.0 [",
	} {
		if !strings.Contains(s, row) {
			t.Errorf("no row %q in\n%s", row, s[strings.Index(s, "window-only"):])
		}
	}
	if !strings.Contains(s, "| 512 | 95.0 [83.5, 98.6] | 25.0 [") || !strings.Contains(s, "| 1024 | 50.0 [35.2, 64.8] | 0.0 [") {
		t.Errorf("the window's rates by context are missing:\n%s", s[strings.Index(s, "window-only"):])
	}
}
