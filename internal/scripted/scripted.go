// Package scripted writes GGUF models whose greedy reply is a given token
// sequence: one-layer Llama models with one-hot embeddings and zero
// attention and feed-forward outputs, whose output matrix maps each token
// to the next of a script. Tests of the server (tool calls, whose text no
// trained model here writes) serve them.
package scripted

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/kvlm/kvlm/gguf"
	"github.com/kvlm/kvlm/tensor"
	"github.com/kvlm/kvlm/tokenizer"
)

// Spec is a scripted model.
type Spec struct {
	Template string // tokenizer.chat_template
	// After is where the script starts: the reply to any prompt whose last
	// token is After (one byte, or one of Specials) is Script.
	After string
	// Script is the reply, one token per piece (a normal token holding the
	// piece's text; a control token where the piece starts with "!", the
	// "!" dropped), then EOS.
	Script   []string
	Specials []string // control tokens of the vocabulary besides the script's
	EOS      string   // one of Specials: the end of the reply
}

// Dim is the models' width: the vocabulary (256 byte tokens, the script's
// pieces and the specials) must fit in it.
const Dim = 320

// Write writes the model of s to path: a byte-level BPE vocabulary (no
// merges: text encodes byte by byte), F32 weights.
func Write(path string, s Spec) error {
	var tokens []string
	var types []int32
	for b := range 256 {
		tokens = append(tokens, tokenizer.ByteLevelEncode(string([]byte{byte(b)})))
		types = append(types, tokenizer.TypeNormal)
	}
	id := map[string]int{}
	add := func(p string, typ int32) int {
		if i, ok := id[p]; ok {
			return i
		}
		id[p] = len(tokens)
		if typ == tokenizer.TypeNormal {
			tokens = append(tokens, tokenizer.ByteLevelEncode(p))
		} else {
			tokens = append(tokens, p)
		}
		types = append(types, typ)
		return id[p]
	}
	var chain []int
	for _, p := range s.Script {
		if c, ok := strings.CutPrefix(p, "!"); ok {
			chain = append(chain, add(c, tokenizer.TypeControl))
		} else {
			chain = append(chain, add(p, tokenizer.TypeNormal))
		}
	}
	for _, sp := range s.Specials {
		add(sp, tokenizer.TypeControl)
	}
	eos, ok := id[s.EOS]
	if !ok {
		return fmt.Errorf("scripted: EOS %q is not among the specials", s.EOS)
	}
	start, ok := id[s.After]
	if !ok {
		if len(s.After) != 1 {
			return fmt.Errorf("scripted: After %q is neither one byte nor a special", s.After)
		}
		start = int(s.After[0])
	}
	vocab := len(tokens)
	const heads, hidden = 4, 32
	if vocab > Dim {
		return fmt.Errorf("scripted: vocabulary of %d tokens exceeds %d", vocab, Dim)
	}
	next := make([]int, vocab) // each token's successor: EOS but along the script
	for i := range next {
		next[i] = eos
	}
	prev := start
	for _, c := range chain {
		next[prev] = c
		prev = c
	}
	w := gguf.NewWriter()
	for _, kv := range []struct {
		k string
		v any
	}{
		{"general.architecture", "llama"}, {"general.name", "kvlm scripted"},
		{"llama.vocab_size", uint32(vocab)}, {"llama.context_length", uint32(4096)},
		{"llama.embedding_length", uint32(Dim)}, {"llama.block_count", uint32(1)}, {"llama.feed_forward_length", uint32(hidden)},
		{"llama.rope.dimension_count", uint32(Dim / heads)}, {"llama.attention.head_count", uint32(heads)},
		{"llama.attention.head_count_kv", uint32(heads)}, {"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"tokenizer.ggml.model", "gpt2"}, {"tokenizer.ggml.pre", "qwen2"}, {"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.token_type", types}, {"tokenizer.ggml.merges", []string{}},
		{"tokenizer.ggml.eos_token_id", uint32(eos)}, {"tokenizer.chat_template", s.Template},
	} {
		if err := w.Set(kv.k, kv.v); err != nil {
			return err
		}
	}
	var err error
	f32 := func(name string, shape []uint64, v []float32) {
		if err != nil {
			return
		}
		data := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
		}
		err = w.AddTensor(name, tensor.F32, shape, data)
	}
	ones := make([]float32, Dim)
	for i := range ones {
		ones[i] = 1
	}
	// Embedding row i is e_i; output row j has 1 at every i whose successor
	// is j: the final RMSNorm scales e_i by √Dim, so the successor's logit
	// is √Dim and every other 0.
	emb := make([]float32, vocab*Dim) // [vocab][Dim]
	out := make([]float32, vocab*Dim) // [vocab][Dim]
	for i := range vocab {
		emb[i*Dim+i] = 1
		out[next[i]*Dim+i] = 1
	}
	f32("token_embd.weight", []uint64{Dim, uint64(vocab)}, emb)
	f32("output.weight", []uint64{Dim, uint64(vocab)}, out)
	f32("output_norm.weight", []uint64{Dim}, ones)
	f32("blk.0.attn_norm.weight", []uint64{Dim}, ones)
	f32("blk.0.ffn_norm.weight", []uint64{Dim}, ones)
	for _, n := range []string{"attn_q", "attn_k", "attn_v", "attn_output"} {
		f32("blk.0."+n+".weight", []uint64{Dim, Dim}, make([]float32, Dim*Dim)) // [Dim][Dim], zero
	}
	f32("blk.0.ffn_gate.weight", []uint64{Dim, hidden}, make([]float32, Dim*hidden)) // [hidden][Dim], zero
	f32("blk.0.ffn_up.weight", []uint64{Dim, hidden}, make([]float32, Dim*hidden))   // [hidden][Dim], zero
	f32("blk.0.ffn_down.weight", []uint64{hidden, Dim}, make([]float32, Dim*hidden)) // [Dim][hidden], zero
	if err != nil {
		return err
	}
	return w.WriteFile(path)
}
