package eval

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"

	"github.com/kvlm/kvlm/tokenizer"
)

// The recall tasks (RULER's, in a small vocabulary). docs/RECALL.md
// describes each prompt.
const (
	TaskNeedle     = "niah_single"     // one passkey at a given depth
	TaskMultiKey   = "niah_multikey"   // Keys needles, one asked
	TaskMultiValue = "niah_multivalue" // Values needles of one key, all asked
	TaskMultiQuery = "niah_multiquery" // Keys needles, Queries of them asked
	TaskVarTrack   = "vt"              // Chains chains of Hops assignments, one chain's value asked
	TaskCWE        = "cwe"             // the Top most frequent words of a list
)

// RecallTasks lists the tasks in report order.
var RecallTasks = []string{TaskNeedle, TaskMultiKey, TaskMultiValue, TaskMultiQuery, TaskVarTrack, TaskCWE}

// Seed ranges: a sample is a function of (task, context, depth, seed)
// alone. Evaluation uses seeds [0, EvalSeedEnd); training data for a recall
// model must use seeds ≥ TrainSeedStart, so the two never share a sample.
const (
	EvalSeedEnd    = uint64(1) << 32
	TrainSeedStart = uint64(1) << 32
)

// The haystack text's parts, as train/README.md splits
// tinystories_valid_head.txt: the evaluation's haystack is the held-out
// part, bytes [HeldOutStart, HeldOutEnd); a recall model's training
// samples take theirs from the train part, bytes [0, HeldOutStart), so
// that training never reads held-out text.
const (
	HeldOutFile  = "tinystories_valid_head.txt"
	HeldOutStart = 700043
	HeldOutEnd   = 794375
)

// The haystacks NewRecallVocabFrom accepts.
const (
	HaystackHeldOut = "heldout" // bytes [HeldOutStart, HeldOutEnd): the evaluation's
	HaystackTrain   = "train"   // bytes [0, HeldOutStart): training samples'
)

// NeedleDepths are the single needle's depths: 0%, 10%, …, 100%.
var NeedleDepths = []float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}

// RecallSpec sizes the tasks. DefaultRecallSpec is the suite's.
type RecallSpec struct {
	Digits  int `json:"digits"`   // digits of a value (each one token): chance 10^-Digits per value
	Keys    int `json:"keys"`     // needles of niah_multikey and niah_multiquery
	Values  int `json:"values"`   // values of niah_multivalue's key
	Queries int `json:"queries"`  // keys asked by niah_multiquery
	Hops    int `json:"hops"`     // assignments per vt chain
	Chains  int `json:"chains"`   // vt chains (one asked, the others distractors)
	Words   int `json:"words"`    // distinct words of a cwe list
	Top     int `json:"top"`      // cwe words asked, most frequent first
	MinPool int `json:"min_pool"` // fewest vocabulary words the tasks need
}

// DefaultRecallSpec is the suite's task sizing.
func DefaultRecallSpec() RecallSpec {
	return RecallSpec{Digits: 4, Keys: 4, Values: 3, Queries: 2, Hops: 3, Chains: 2, Words: 10, Top: 3, MinPool: 12}
}

// RecallSample is one prompt and its answer, in token ids.
type RecallSample struct {
	Task     string   `json:"task"`
	Context  int      `json:"context"` // len(Prompt)+len(Answer) ≤ Context
	Depth    float64  `json:"depth"`   // niah_single: the needle's depth (fraction of the haystack before it); −1 otherwise
	Seed     uint64   `json:"seed"`
	Prompt   []int    `json:"prompt"`         // BOS, context, question
	Question int      `json:"question_start"` // Prompt[Question:] is the question (query-agnostic appends it after compression)
	Answer   []int    `json:"answer"`         // the tokens greedy decoding must produce
	Parts    [][2]int `json:"parts"`          // [start, end) spans of Answer scored one by one (separators between them are not scored)
	// Others are the values in the context that no part asks for (the
	// other keys' and chains' values); with the parts, the values a wrong
	// part can copy from the context (Confused).
	Others [][]int `json:"others,omitempty"`
	Text   string  `json:"text,omitempty"` // the answer decoded, for reading
}

// RecallVocab is what the generator needs from a vocabulary.
type RecallVocab struct {
	tok    tokenizer.Tokenizer
	space  int     // the word-boundary piece a value's digits follow ("▁")
	digits [10]int // the digits' ids
	comma  int
	dot    int
	words  []string // whole words each encoded in ≤ 2 tokens
	wordID [][]int
	hay    []int // the haystack part's tokens (no BOS)
}

// recallWordCandidates are story words; the vocabulary keeps those it
// encodes in at most two tokens.
var recallWordCandidates = []string{
	"cat", "dog", "ball", "sun", "red", "hat", "car", "bed", "toy", "bear", "door", "star", "pig", "cow", "hen",
	"big", "mom", "dad", "tree", "bird", "cake", "box", "fish", "cup", "book", "boat", "frog", "duck", "moon",
	"milk", "bus", "egg", "sky", "rain", "blue", "green", "fun", "home", "park",
}

// NewRecallVocab reads the held-out text from dataDir and prepares tok's
// ids: the evaluation's vocabulary (NewRecallVocabFrom with
// HaystackHeldOut).
func NewRecallVocab(tok tokenizer.Tokenizer, dataDir string) (*RecallVocab, error) {
	return NewRecallVocabFrom(tok, dataDir, HaystackHeldOut)
}

// NewRecallVocabFrom reads the haystack part (HaystackHeldOut or
// HaystackTrain) from dataDir and prepares tok's ids. It refuses a
// vocabulary that does not encode each digit as one token after a
// word-boundary piece.
func NewRecallVocabFrom(tok tokenizer.Tokenizer, dataDir, haystack string) (*RecallVocab, error) {
	lo, hi := HeldOutStart, HeldOutEnd
	switch haystack {
	case HaystackHeldOut:
	case HaystackTrain:
		lo, hi = 0, HeldOutStart
	default:
		return nil, fmt.Errorf("recall: unknown haystack %q (known: %s, %s)", haystack, HaystackHeldOut, HaystackTrain)
	}
	b, err := os.ReadFile(dataDir + "/" + HeldOutFile)
	if err != nil {
		return nil, fmt.Errorf("recall: the haystack text: %w", err)
	}
	if len(b) < HeldOutEnd {
		return nil, fmt.Errorf("recall: %s has %d bytes, fewer than the held-out part's end %d", HeldOutFile, len(b), HeldOutEnd)
	}
	v := &RecallVocab{tok: tok, space: -1}
	for d := 0; d < 10; d++ {
		ids := tok.Encode(fmt.Sprint(d), false, false)
		if len(ids) != 2 || (v.space >= 0 && ids[0] != v.space) {
			return nil, fmt.Errorf("recall: the vocabulary encodes digit %d as %v, not as a boundary piece and one digit token", d, ids)
		}
		v.space, v.digits[d] = ids[0], ids[1]
	}
	for _, p := range []struct {
		s  string
		id *int
	}{{",", &v.comma}, {".", &v.dot}} {
		ids := tok.Encode(p.s, false, false)
		if len(ids) != 2 || ids[0] != v.space {
			return nil, fmt.Errorf("recall: the vocabulary encodes %q as %v", p.s, ids)
		}
		*p.id = ids[1]
	}
	v.words, v.wordID = RecallWords(tok)
	v.hay = tok.Encode(string(b[lo:hi]), false, false)
	return v, nil
}

// RecallWords is the suite's word pool in tok's vocabulary: the story
// words it encodes in at most two tokens, in the suite's order, with their
// ids (what `kvlm eval recall-words` prints for a trainer).
func RecallWords(tok tokenizer.Tokenizer) (words []string, ids [][]int) {
	for _, w := range recallWordCandidates {
		if e := tok.Encode(w, false, false); len(e) <= 2 {
			words = append(words, w)
			ids = append(ids, e)
		}
	}
	return words, ids
}

// Words is the word pool: whole words encoded in ≤ 2 tokens.
func (v *RecallVocab) Words() []string { return v.words }

// sampleRNG is a sample's generator: its seed and its cell.
func sampleRNG(task string, ctx int, depth float64, seed uint64) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/%.4f", task, ctx, depth)
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// needle is a sentence to hide in the haystack at a depth.
type needle struct {
	ids   []int
	depth float64
}

// Sample generates one sample. depth is the single needle's (ignored, −1,
// for the other tasks).
func (v *RecallVocab) Sample(spec RecallSpec, task string, ctx int, depth float64, seed uint64) (RecallSample, error) {
	s := RecallSample{Task: task, Context: ctx, Depth: -1, Seed: seed}
	if err := spec.check(len(v.words)); err != nil {
		return s, err
	}
	if task == TaskNeedle {
		if depth < 0 || depth > 1 || math.IsNaN(depth) {
			return s, fmt.Errorf("recall: depth %g is not in [0, 1]", depth)
		}
		s.Depth = depth
	}
	rng := sampleRNG(task, ctx, s.Depth, seed)
	enc := func(text string) []int { return v.tok.Encode(text, false, false) }
	// encP encodes a segment that starts with punctuation, which follows
	// the word before it without a space.
	encP := func(text string) []int {
		ids := enc(text)
		if len(ids) > 1 && ids[0] == v.space {
			return ids[1:]
		}
		return ids
	}
	value := func() []int {
		ids := []int{v.space}
		for range spec.Digits {
			ids = append(ids, v.digits[rng.IntN(10)])
		}
		return ids
	}
	words := func(n int) []int { return rng.Perm(len(v.words))[:n] }
	join := func(xs ...[]int) []int { return slices.Concat(xs...) }
	dot := []int{v.dot}
	var needles []needle
	var question []int
	var parts [][]int // the answer's scored parts, joined by commas
	sep := []int{v.comma}
	switch task {
	case TaskNeedle:
		val := value()
		needles = []needle{{join(enc("The pass key is"), val, dot), depth}}
		question = enc("What is the pass key? The pass key is")
		parts = [][]int{val}
	case TaskMultiKey, TaskMultiQuery:
		keys := words(spec.Keys)
		vals := make([][]int, len(keys))
		for i, k := range keys {
			vals[i] = value()
			needles = append(needles, needle{join(enc("The special number for"), v.wordID[k], enc("is"), vals[i], dot), rng.Float64()})
		}
		if task == TaskMultiKey {
			i := rng.IntN(len(keys))
			question = join(enc("What is the special number for"), v.wordID[keys[i]], encP("? The special number for"), v.wordID[keys[i]], enc("is"))
			parts = [][]int{vals[i]}
			s.Others = slices.Delete(slices.Clone(vals), i, i+1)
			break
		}
		asked := rng.Perm(len(keys))[:spec.Queries]
		for i := range keys {
			if !slices.Contains(asked, i) {
				s.Others = append(s.Others, vals[i])
			}
		}
		var list []int
		for j, i := range asked {
			switch {
			case j == 0:
			case j == len(asked)-1:
				list = append(list, enc("and")...)
			default:
				list = append(list, v.comma)
			}
			list = append(list, v.wordID[keys[i]]...)
			parts = append(parts, vals[i])
		}
		question = join(enc("What are the special numbers for"), list, encP("? The special numbers for"), list, enc("are"))
	case TaskMultiValue:
		k := words(1)[0]
		for range spec.Values {
			val := value()
			needles = append(needles, needle{join(enc("The special number for"), v.wordID[k], enc("is"), val, dot), rng.Float64()})
			parts = append(parts, val)
		}
		// The values are asked in the order they appear.
		order := make([]int, len(needles))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmpF(needles[a].depth, needles[b].depth) })
		sorted := make([][]int, len(parts))
		for i, o := range order {
			sorted[i] = parts[o]
		}
		parts = sorted
		question = join(enc("What are all the special numbers for"), v.wordID[k], encP("? The special numbers for"), v.wordID[k], enc("are"))
	case TaskVarTrack:
		names := words(spec.Chains * spec.Hops)
		asked := rng.IntN(spec.Chains)
		for c := range spec.Chains {
			val := value()
			ds := make([]float64, spec.Hops)
			for h := range ds {
				ds[h] = rng.Float64()
			}
			slices.Sort(ds) // a chain's assignments in order
			for h := range spec.Hops {
				name := v.wordID[names[c*spec.Hops+h]]
				rhs := val
				if h > 0 {
					rhs = v.wordID[names[c*spec.Hops+h-1]]
				}
				needles = append(needles, needle{join(enc("VAR"), name, enc("="), rhs, dot), ds[h]})
			}
			if c == asked {
				last := v.wordID[names[c*spec.Hops+spec.Hops-1]]
				question = join(enc("What is the value of"), last, encP("? The value of"), last, enc("is"))
				parts = [][]int{val}
			} else {
				s.Others = append(s.Others, val)
			}
		}
	case TaskCWE:
		ws := words(spec.Words)
		count := make([]int, len(ws)) // the first Top words are the most frequent, in order
		question = join(enc("What are the"), enc(fmt.Sprint(spec.Top)), enc("most common words in the list? The"),
			enc(fmt.Sprint(spec.Top)), enc("most common words are"))
		head := enc("Here is a list of words:")
		per := 0
		for _, w := range ws {
			per += len(v.wordID[w])
		}
		budget := ctx - 1 - len(head) - len(question) - spec.Top*2 - 1
		a := 1 // the others' count; the top words have a + 2(Top−i)
		for {
			n := 0
			for i, w := range ws {
				n += (a + 1 + topExtra(i, spec.Top)) * len(v.wordID[w])
			}
			if n > budget {
				break
			}
			a++
		}
		if a == 1 {
			return s, fmt.Errorf("recall: context %d is too short for a cwe list", ctx)
		}
		var list []int
		for i := range ws {
			count[i] = a + topExtra(i, spec.Top)
			for range count[i] {
				list = append(list, i)
			}
		}
		rng.Shuffle(len(list), func(i, j int) { list[i], list[j] = list[j], list[i] })
		s.Prompt = append([]int{v.tok.BOS()}, head...)
		for _, i := range list {
			s.Prompt = append(s.Prompt, v.wordID[ws[i]]...)
		}
		s.Question = len(s.Prompt)
		s.Prompt = append(s.Prompt, question...)
		for i := range spec.Top {
			s.Parts = append(s.Parts, [2]int{len(s.Answer), len(s.Answer) + len(v.wordID[ws[i]])})
			s.Answer = append(s.Answer, v.wordID[ws[i]]...)
		}
		s.Text = v.tok.DecodeAll(s.Answer)
		return s, nil
	default:
		return s, fmt.Errorf("recall: unknown task %q (known: %s)", task, strings.Join(RecallTasks, ", "))
	}
	for i, p := range parts {
		if i > 0 {
			s.Answer = append(s.Answer, sep...)
		}
		s.Parts = append(s.Parts, [2]int{len(s.Answer), len(s.Answer) + len(p)})
		s.Answer = append(s.Answer, p...)
	}
	fill := ctx - 1 - len(question) - len(s.Answer)
	for _, n := range needles {
		fill -= len(n.ids)
	}
	if fill < 16 {
		return s, fmt.Errorf("recall: context %d leaves %d haystack tokens for %s", ctx, fill, task)
	}
	if fill > len(v.hay) {
		return s, fmt.Errorf("recall: context %d needs %d haystack tokens; the haystack text has %d", ctx, fill, len(v.hay))
	}
	start := rng.IntN(len(v.hay) - fill + 1)
	hay := v.hay[start : start+fill]
	// Needles go at sentence boundaries: the nearest to their depth.
	var bounds []int
	for i := 0; i <= len(hay); i++ {
		if i == 0 || i == len(hay) || hay[i-1] == v.dot {
			bounds = append(bounds, i)
		}
	}
	at := make([]int, len(needles))
	for i, n := range needles {
		target := n.depth * float64(len(hay))
		best := bounds[0]
		for _, b := range bounds {
			if math.Abs(float64(b)-target) < math.Abs(float64(best)-target) {
				best = b
			}
		}
		at[i] = best
	}
	order := make([]int, len(needles))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return at[a] - at[b] })
	s.Prompt = []int{v.tok.BOS()}
	prev := 0
	for _, i := range order {
		s.Prompt = append(s.Prompt, hay[prev:at[i]]...)
		s.Prompt = append(s.Prompt, needles[i].ids...)
		prev = at[i]
	}
	s.Prompt = append(s.Prompt, hay[prev:]...)
	s.Question = len(s.Prompt)
	s.Prompt = append(s.Prompt, question...)
	s.Text = v.tok.DecodeAll(s.Answer)
	return s, nil
}

func topExtra(i, top int) int {
	if i < top {
		return 2 * (top - i)
	}
	return 0
}

func (spec RecallSpec) check(pool int) error {
	if spec.Digits < 1 || spec.Keys < 1 || spec.Values < 1 || spec.Queries < 1 || spec.Queries > spec.Keys ||
		spec.Hops < 1 || spec.Chains < 1 || spec.Top < 1 || spec.Top > spec.Words {
		return fmt.Errorf("recall: bad task sizes %+v", spec)
	}
	if need := max(spec.Keys, spec.Chains*spec.Hops, spec.Words, spec.MinPool); pool < need {
		return fmt.Errorf("recall: the vocabulary has %d words of ≤ 2 tokens; the tasks need %d", pool, need)
	}
	return nil
}

// Constant is a constant answer in s's format: every value 0…0, cwe's
// first Top pool words. Scoring it measures the chance rate.
func (v *RecallVocab) Constant(spec RecallSpec, s RecallSample) []int {
	if s.Task == TaskCWE {
		var out []int
		for i := range spec.Top {
			out = append(out, v.wordID[i]...)
		}
		return out
	}
	out := slices.Clone(s.Answer)
	for _, p := range s.Parts {
		for i := p[0] + 1; i < p[1]; i++ { // after the boundary piece
			out[i] = v.digits[0]
		}
	}
	return out
}

// ChanceRate is the probability that a constant answer is all correct
// (and, per part, the expected share of parts correct): the values'
// digits are uniform and independent, cwe's top words a uniform ordered
// choice from the pool.
func (v *RecallVocab) ChanceRate(spec RecallSpec, task string) (all, part float64, err error) {
	p := math.Pow(10, -float64(spec.Digits))
	switch task {
	case TaskNeedle, TaskMultiKey, TaskVarTrack:
		return p, p, nil
	case TaskMultiValue:
		return math.Pow(p, float64(spec.Values)), p, nil
	case TaskMultiQuery:
		return math.Pow(p, float64(spec.Queries)), p, nil
	case TaskCWE:
		// The constant's i-th word equals the i-th top word with
		// probability 1/P; all of them, 1/(P(P−1)…(P−Top+1)).
		P := float64(len(v.words))
		all := 1.0
		for i := range spec.Top {
			all /= P - float64(i)
		}
		return all, 1 / P, nil
	}
	return 0, 0, errors.New("recall: unknown task " + task)
}
