package model

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// recorder is a Compressor that logs its calls with the sequence's position
// at the time.
type recorder struct {
	seq   *Sequence
	calls []string
	fail  error // returned by Before and Compress when set
}

func (r *recorder) BeginPrefill(n int) {
	r.calls = append(r.calls, fmt.Sprintf("begin(%d)@%d", n, r.seq.Pos()))
}

func (r *recorder) Compress() error {
	r.calls = append(r.calls, fmt.Sprintf("compress@%d", r.seq.Pos()))
	return r.fail
}

func (r *recorder) Before(n int) error {
	r.calls = append(r.calls, fmt.Sprintf("before(%d)@%d", n, r.seq.Pos()))
	return r.fail
}

// TestSequenceDrivesPolicy: once installed, the policy is called by the
// forward pass itself: BeginPrefill when a prompt is announced, Compress
// once after its last token however many Forward calls it takes, Before
// before every other step (Forward and DecodeBatch), once when Prepare ran
// it ahead.
func TestSequenceDrivesPolicy(t *testing.T) {
	m := loadStories(t)
	type op struct {
		kind string // "prompt", "fwd", "batch", "prepare"
		n    int
	}
	cases := []struct {
		name string
		ops  []op
		want []string
	}{
		{"prompt in one step, then decode", []op{{"prompt", 5}, {"fwd", 5}, {"fwd", 1}, {"fwd", 1}},
			[]string{"begin(5)@0", "compress@5", "before(1)@5", "before(1)@6"}},
		{"prompt in chunks over several calls", []op{{"prompt", 7}, {"fwd", 3}, {"fwd", 2}, {"fwd", 2}, {"fwd", 1}},
			[]string{"begin(7)@0", "compress@7", "before(1)@7"}},
		{"batched decode after the prompt", []op{{"prompt", 4}, {"fwd", 4}, {"batch", 1}, {"batch", 1}},
			[]string{"begin(4)@0", "compress@4", "before(1)@4", "before(1)@5"}},
		{"prepared step runs Before once", []op{{"prompt", 4}, {"fwd", 4}, {"prepare", 1}, {"prepare", 1}, {"batch", 1}, {"fwd", 1}},
			[]string{"begin(4)@0", "compress@4", "before(1)@4", "before(1)@5"}},
		{"no prompt: every step makes room", []op{{"fwd", 3}, {"fwd", 2}},
			[]string{"before(3)@0", "before(2)@3"}},
		{"prepare inside a prompt does nothing", []op{{"prompt", 3}, {"prepare", 1}, {"fwd", 3}},
			[]string{"begin(3)@0", "compress@3"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seq, err := m.NewStandaloneSequence(KVOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			seq.Chunk = 2 // a Forward of several tokens runs several steps
			r := &recorder{seq: seq}
			seq.SetPolicy(r)
			tok := 1
			for _, o := range c.ops {
				switch o.kind {
				case "prompt":
					seq.Prompt(o.n)
				case "prepare":
					err = seq.Prepare(o.n)
				case "fwd":
					ids := make([]int, o.n)
					for i := range ids {
						ids[i], tok = tok, tok+1
					}
					_, err = seq.Forward(ids, false)
				case "batch":
					_, err = m.DecodeBatch([]*Sequence{seq}, []int{tok})
					tok++
				}
				if err != nil {
					t.Fatalf("%s(%d): %v", o.kind, o.n, err)
				}
			}
			if !slices.Equal(r.calls, c.want) {
				t.Fatalf("calls %v, want %v", r.calls, c.want)
			}
		})
	}
}

// TestSequencePolicyErrors: misuse of an announced prompt or a prepared
// step is a clear error, and a policy's error is the step's.
func TestSequencePolicyErrors(t *testing.T) {
	m := loadStories(t)
	boom := errors.New("boom")
	cases := []struct {
		name string
		run  func(seq *Sequence, r *recorder) error
		want string
	}{
		{"forward past the prompt", func(seq *Sequence, _ *recorder) error {
			seq.Prompt(2)
			_, err := seq.Forward([]int{1, 2, 3}, false)
			return err
		}, "run past the prompt's last 2"},
		{"batch inside the prompt", func(seq *Sequence, _ *recorder) error {
			seq.Prompt(2)
			_, err := m.DecodeBatch([]*Sequence{seq}, []int{1})
			return err
		}, "inside its prompt (2 tokens left)"},
		{"prepared for another count", func(seq *Sequence, _ *recorder) error {
			if err := seq.Prepare(1); err != nil {
				return err
			}
			_, err := seq.Forward([]int{1, 2}, false)
			return err
		}, "prepared for 1 tokens runs 2"},
		{"Before fails", func(seq *Sequence, r *recorder) error {
			r.fail = boom
			_, err := seq.Forward([]int{1}, false)
			return err
		}, "boom"},
		{"Before fails in a batch", func(seq *Sequence, r *recorder) error {
			r.fail = boom
			_, err := m.DecodeBatch([]*Sequence{seq}, []int{1})
			return err
		}, "batch sequence 0: boom"},
		{"Compress fails", func(seq *Sequence, r *recorder) error {
			seq.Prompt(1)
			r.fail = boom
			_, err := seq.Forward([]int{1}, false)
			return err
		}, "boom"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seq, err := m.NewStandaloneSequence(KVOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer seq.Close()
			r := &recorder{seq: seq}
			seq.SetPolicy(r)
			err = c.run(seq, r)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}
