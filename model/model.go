package model

import (
	"fmt"

	"github.com/kvlm/kvlm/tensor"
)

// Layer is one transformer block's weights.
type Layer struct {
	AttnNorm []float32      // [Dim] RMSNorm weight before attention
	Wq       *tensor.Matrix // [Heads·HeadDim][Dim]
	Wk       *tensor.Matrix // [KVHeads·HeadDim][Dim]; nil in a layer that reads another's KV
	Wv       *tensor.Matrix // [KVHeads·HeadDim][Dim]; nil likewise
	Wo       *tensor.Matrix // [Dim][Heads·HeadDim]
	Bq       []float32      // [Heads·HeadDim] or nil (Qwen 2 has Q/K/V biases)
	Bk       []float32      // [KVHeads·HeadDim] or nil
	Bv       []float32      // [KVHeads·HeadDim] or nil
	QNorm    []float32      // [HeadDim] RMSNorm weight of every query head (Config.QKNorm), or nil
	KNorm    []float32      // [HeadDim] RMSNorm weight of every key head, or nil; nil in a layer that reads another's KV
	FFNNorm  []float32      // [Dim] RMSNorm weight before the FFN
	AttnPost []float32      // [Dim] RMSNorm weight of the attention output (Config.PostNorms), or nil
	FFNPost  []float32      // [Dim] RMSNorm weight of the FFN output (Config.PostNorms), or nil
	WGate    *tensor.Matrix // [HiddenDim][Dim] (llama2.c w1)
	WUp      *tensor.Matrix // [HiddenDim][Dim] (llama2.c w3)
	WDown    *tensor.Matrix // [Dim][HiddenDim] (llama2.c w2)
}

// Model is a loaded Llama-family model.
type Model struct {
	Config
	TokEmb  *tensor.Matrix // [Vocab][Dim]
	Layers  []Layer        // [Layers]
	OutNorm []float32      // [Dim] final RMSNorm weight
	Output  *tensor.Matrix // [Vocab][Dim]; the same matrix as TokEmb when tied

	freq      []float32    // RoPE frequencies [HeadDim/2] (RopeFreqs), set by check
	freqLocal []float32    // the windowed layers' RoPE frequencies [HeadDim/2] (LocalRopeTheta), or nil
	closer    func() error // releases the mapped file, if any
}

// Close releases the memory the weights live in. The model must not be used
// afterwards.
func (m *Model) Close() error {
	if m.closer == nil {
		return nil
	}
	c := m.closer
	m.closer = nil
	return c()
}

// WeightsBytes is the storage of all weight tensors.
func (m *Model) WeightsBytes() int64 {
	var n int64
	add := func(t *tensor.Matrix) {
		if t != nil {
			n += int64(len(t.Data))
		}
	}
	add(m.TokEmb)
	if m.Output != m.TokEmb {
		add(m.Output)
	}
	n += 4 * int64(len(m.OutNorm))
	for _, l := range m.Layers {
		for _, t := range []*tensor.Matrix{l.Wq, l.Wk, l.Wv, l.Wo, l.WGate, l.WUp, l.WDown} {
			add(t)
		}
		n += 4 * int64(len(l.AttnNorm)+len(l.FFNNorm)+len(l.Bq)+len(l.Bk)+len(l.Bv)+len(l.QNorm)+len(l.KNorm)+len(l.AttnPost)+len(l.FFNPost))
	}
	return n
}

// check verifies that every weight has the shape the config implies.
func (m *Model) check() error {
	c := m.Config
	want := func(name string, t *tensor.Matrix, rows, cols int) error {
		if t == nil {
			return fmt.Errorf("model: missing tensor %s", name)
		}
		if t.Rows != rows || t.Cols != cols {
			return fmt.Errorf("model: tensor %s is %d×%d, config implies %d×%d", name, t.Rows, t.Cols, rows, cols)
		}
		return nil
	}
	vec := func(name string, v []float32, n int, optional bool) error {
		if v == nil && optional {
			return nil
		}
		if len(v) != n {
			return fmt.Errorf("model: tensor %s has %d values, config implies %d", name, len(v), n)
		}
		return nil
	}
	// A layer that reads another's KV (Config.KVSource) has no K/V
	// projection; an owner has both.
	kvWeight := func(name string, t *tensor.Matrix, own bool) error {
		if own {
			return want(name, t, c.KVDim(), c.Dim)
		}
		if t != nil {
			return fmt.Errorf("model: layer reads another layer's KV but has tensor %s", name)
		}
		return nil
	}
	kvVec := func(name string, v []float32, own bool) error {
		if !own && v != nil {
			return fmt.Errorf("model: layer reads another layer's KV but has tensor %s", name)
		}
		return vec(name, v, c.KVDim(), true)
	}
	errs := []error{want("token_embd", m.TokEmb, c.Vocab, c.Dim), want("output", m.Output, c.Vocab, c.Dim),
		vec("output_norm", m.OutNorm, c.Dim, false)}
	if len(m.Layers) != c.Layers {
		return fmt.Errorf("model: %d layers loaded, config says %d", len(m.Layers), c.Layers)
	}
	for i, l := range m.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		if c.QKNorm {
			errs = append(errs, vec(p+"attn_q_norm", l.QNorm, c.HeadDim, false))
			if c.Owns(i) {
				errs = append(errs, vec(p+"attn_k_norm", l.KNorm, c.HeadDim, false))
			}
		} else if l.QNorm != nil || l.KNorm != nil {
			errs = append(errs, fmt.Errorf("model: layer %d has Q/K norm weights, but %s has no Q/K norm", i, c.Arch))
		}
		if c.PostNorms {
			errs = append(errs, vec(p+"post_attention_norm", l.AttnPost, c.Dim, false), vec(p+"post_ffw_norm", l.FFNPost, c.Dim, false))
		} else if l.AttnPost != nil || l.FFNPost != nil {
			errs = append(errs, fmt.Errorf("model: layer %d has post-norm weights, but %s has none", i, c.Arch))
		}
		if !c.Owns(i) && l.KNorm != nil {
			errs = append(errs, fmt.Errorf("model: layer reads another layer's KV but has tensor %sattn_k_norm", p))
		}
		errs = append(errs,
			vec(p+"attn_norm", l.AttnNorm, c.Dim, false),
			want(p+"attn_q", l.Wq, c.QDim(), c.Dim),
			kvWeight(p+"attn_k", l.Wk, c.Owns(i)),
			kvWeight(p+"attn_v", l.Wv, c.Owns(i)),
			want(p+"attn_output", l.Wo, c.Dim, c.QDim()),
			vec(p+"attn_q.bias", l.Bq, c.QDim(), true),
			kvVec(p+"attn_k.bias", l.Bk, c.Owns(i)),
			kvVec(p+"attn_v.bias", l.Bv, c.Owns(i)),
			vec(p+"ffn_norm", l.FFNNorm, c.Dim, false),
			want(p+"ffn_gate", l.WGate, c.HiddenDim, c.Dim),
			want(p+"ffn_up", l.WUp, c.HiddenDim, c.Dim),
			want(p+"ffn_down", l.WDown, c.Dim, c.HiddenDim))
	}
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	m.freq = c.RopeFreqs()
	if c.LocalRopeTheta > 0 {
		lc := c
		lc.RopeTheta = c.LocalRopeTheta
		lc.RopeFreqFactors, lc.RopeScale = nil, 0
		m.freqLocal = lc.RopeFreqs()
	}
	return nil
}
