package eval

import (
	"fmt"
	"math"
	"time"

	"github.com/kvlm/kvlm/model"
	"github.com/kvlm/kvlm/policy"
)

// Trial is one compress-then-continue measurement: prefill Context,
// compress the cache with Policy, then
//   - score the real continuation (teacher forced): mean NLL of its
//     predictions and the share whose argmax equals the full cache's;
//   - generate Greedy tokens greedily and count those equal, position by
//     position, to the full cache's greedy continuation;
//   - compare each layer's attention output on the continuation with the
//     full cache's (relative error).
type Trial struct {
	Context  []int           // prompt tokens, BOS first
	Continue []int           // the text's next tokens
	Greedy   int             // greedy tokens for the agreement measure
	Policy   policy.Config   // the compression
	KV       model.KVOptions // storage codecs
}

// TrialResult is what one trial measured.
type TrialResult struct {
	NLL          float64   `json:"nll"`            // mean NLL of the continuation predictions made after compression
	Top1         float64   `json:"top1_agreement"` // share of continuation steps whose argmax equals the full cache's
	Greedy       float64   `json:"greedy_agreement"`
	AttnErr      []float64 `json:"attn_rel_error"` // per layer: ‖a − a_full‖ / ‖a_full‖ over the continuation
	PeakKVBytes  int64     `json:"kv_bytes_peak"`  // the most KV memory the compressed sequence held
	KVBytes      int64     `json:"kv_bytes"`       // KV memory right after compression
	KeptPerLayer []int     `json:"kept_per_layer"` // tokens per layer after compression (over heads)
	TokS         float64   `json:"tok_s"`          // continuation tokens per second (teacher forced)
}

// Reference is the full cache's behaviour on a trial's text, computed once
// and shared by every policy tried on it.
type Reference struct {
	argmax  []int       // argmax of each continuation step's logits
	greedy  []int       // the full cache's greedy continuation
	attn    [][]float32 // [layer] attention outputs over the continuation steps
	nll     float64
	kvBytes int64
}

// NewReference runs the full cache (f32, no policy) on the trial's text.
func NewReference(m *model.Model, t Trial) (*Reference, error) {
	ref := &Reference{}
	full := t
	full.Policy = policy.Config{Method: "full"}
	full.KV = model.KVOptions{}
	r, err := run(m, full, nil, ref)
	if err != nil {
		return nil, err
	}
	ref.nll = r.NLL
	ref.kvBytes = r.KVBytes
	return ref, nil
}

// NLL is the full cache's mean continuation NLL.
func (r *Reference) NLL() float64 { return r.nll }

// KVBytes is the full cache's memory after the context.
func (r *Reference) KVBytes() int64 { return r.kvBytes }

// Run measures one policy against the reference.
func Run(m *model.Model, t Trial, ref *Reference) (TrialResult, error) {
	return run(m, t, ref, nil)
}

// run measures a trial; with record set it fills the reference instead of
// comparing with one.
func run(m *model.Model, t Trial, ref, record *Reference) (TrialResult, error) {
	var res TrialResult
	if len(t.Context) == 0 || len(t.Continue) < 2 {
		return res, fmt.Errorf("eval: a trial needs a context and at least 2 continuation tokens")
	}
	opt := t.KV
	opt.Tokens = max(m.CtxLen, len(t.Context)+len(t.Continue)+t.Greedy)
	seq, err := m.NewStandaloneSequence(opt)
	if err != nil {
		return res, err
	}
	defer seq.Close()
	var st *policy.State
	if t.Policy.Method != "" && t.Policy.Method != "full" {
		if st, err = policy.New(t.Policy, seq); err != nil {
			return res, err
		}
		seq.SetPolicy(st) // the forward pass drives it
		seq.Prompt(len(t.Context))
	}
	if _, err := seq.Forward(t.Context, false); err != nil {
		return res, err
	}
	res.PeakKVBytes = seq.StepBytes // before the policy compressed the prompt
	if st != nil {
		res.KeptPerLayer = st.KeptPerLayer()
	}
	res.KVBytes = seq.Cache().Bytes()
	L := m.Config.Layers
	var attn [][]float32
	if record != nil || ref != nil {
		attn = make([][]float32, L)
		seq.AttnTap = func(layer int, out []float32) { attn[layer] = append(attn[layer], out...) }
	}
	// Teacher-forced continuation: the prediction of Continue[i+1] is made
	// after Continue[i] went through the compressed cache.
	fork := len(t.Continue) - 1
	var nll float64
	agree := 0
	start := time.Now()
	for i := 0; i < fork; i++ {
		logits, err := seq.Forward(t.Continue[i:i+1], false)
		if err != nil {
			return res, err
		}
		res.PeakKVBytes = max(res.PeakKVBytes, seq.Cache().Bytes())
		nll += NLL(logits, t.Continue[i+1])
		am := argmax(logits)
		if record != nil {
			record.argmax = append(record.argmax, am)
		} else if ref != nil && i < len(ref.argmax) && ref.argmax[i] == am {
			agree++
		}
	}
	res.TokS = float64(fork) / time.Since(start).Seconds()
	res.NLL = nll / float64(fork)
	res.Top1 = float64(agree) / float64(fork)
	seq.AttnTap = nil
	if record != nil {
		record.attn = attn
		res.Top1 = 1
	} else if ref != nil {
		res.AttnErr = make([]float64, L)
		for l := range attn {
			res.AttnErr[l] = relErr(attn[l], ref.attn[l])
		}
	}
	// Free-running greedy continuation.
	if t.Greedy > 0 {
		next := t.Continue[fork]
		same := 0
		for i := 0; i < t.Greedy; i++ {
			logits, err := seq.Forward([]int{next}, false)
			if err != nil {
				return res, err
			}
			res.PeakKVBytes = max(res.PeakKVBytes, seq.Cache().Bytes())
			next = argmax(logits)
			if record != nil {
				record.greedy = append(record.greedy, next)
			} else if ref != nil && i < len(ref.greedy) && ref.greedy[i] == next {
				same++
			}
		}
		res.Greedy = float64(same) / float64(t.Greedy)
		if record != nil {
			res.Greedy = 1
		}
	}
	return res, nil
}

func relErr(a, b []float32) float64 {
	var num, den float64
	for i := range b {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if den == 0 {
		return 0
	}
	return math.Sqrt(num / den)
}

func argmax(x []float32) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}
