"""Export a trained model to a GGUF in kvlm's layout (general.architecture
"llama", interleaved RoPE, F32 weights, tied classifier).

- Tensors: token_embd, output_norm, blk.N.{attn_norm, attn_q, attn_k,
  attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}.weight; a
  row-major PyTorch weight [out, in] is GGUF dims [in, out], data as is.
  Non-owner layers have no attn_k/attn_v (CONTRACT21).
- The KV source map: llama.attention.kv_source (int32 [layers]) when some
  layer reads another's KV, llama.attention.layer_window (uint32
  [layers]) when some layer is windowed (model/kvmap.go's keys).
- The vocabulary: tok512's tokenizer.ggml.* exactly as `kvlm convert
  llama2c` writes it (data.vocab_metadata).
- The recipe: kvlm.train.* (data file and byte ranges, tokens seen, seed,
  steps, final held-out NLL, the whole recipe as JSON; for a recall model
  kvlm.train.recall, the recall mix).
"""

import json

import data
import gguf


def metadata(c, rec):
    A = "llama."
    m = {
        "general.architecture": gguf.string("llama"),
        "general.name": gguf.string("kvlm-recall" if rec["recipe"].get("recall") else f"kvlm-zoo-{c.arch}"),
        "general.file_type": gguf.u32(0),
        A + "context_length": gguf.u32(c.ctx),
        A + "embedding_length": gguf.u32(c.dim),
        A + "feed_forward_length": gguf.u32(c.hidden),
        A + "block_count": gguf.u32(c.layers),
        A + "attention.head_count": gguf.u32(c.heads),
        A + "attention.head_count_kv": gguf.u32(c.kv_heads),
        A + "attention.layer_norm_rms_epsilon": gguf.f32(c.eps),
        A + "rope.dimension_count": gguf.u32(c.head_dim),
        A + "rope.freq_base": gguf.f32(c.theta),
        A + "vocab_size": gguf.u32(c.vocab),
    }
    if c.kv_source is not None:
        m[A + "attention.kv_source"] = gguf.i32s(c.kv_source)
    if c.layer_window is not None:
        m[A + "attention.layer_window"] = gguf.u32s(c.layer_window)
    m.update(data.vocab_metadata())
    d = rec["data"]
    m.update({
        "kvlm.train.data": gguf.string(d["file"]),
        "kvlm.train.train_bytes": gguf.u32s(d["train_bytes"]),
        "kvlm.train.heldout_bytes": gguf.u32s(d["heldout_bytes"]),
        "kvlm.train.tokens": gguf.u64(rec["tokens_seen"]),
        "kvlm.train.seed": gguf.u32(rec["recipe"]["seed"]),
        "kvlm.train.steps": gguf.u32(rec.get("steps_done", rec["recipe"]["steps"])),
        "kvlm.train.heldout_nll": gguf.f32(rec["heldout"]["mean_nll"]),
        "kvlm.train.heldout_tokens": gguf.u32(sum(len(w) - 1 for w in rec["heldout"]["windows"])),
        "kvlm.train.recipe": gguf.string(json.dumps(rec["recipe"], sort_keys=True)),
    })
    if rec["recipe"].get("recall"):
        # The recall mix: its share of rows, answer weight, tasks and their
        # weights, seeds (≥ 2^32) and haystack (train), curriculum contexts.
        r = rec["recipe"]
        m["kvlm.train.recall"] = gguf.string(json.dumps({k: r[k] for k in sorted(r) if k.startswith("recall")},
                                                        sort_keys=True))
    if rec.get("init"):
        m["kvlm.train.init"] = gguf.string(rec["init"])
        m["kvlm.train.init_heldout_nll"] = gguf.f32(rec["init_heldout_nll"])
    return m


def tensors(model):
    c = model.c
    t = {"token_embd.weight": model.emb, "output_norm.weight": model.out_norm}
    for i, b in enumerate(model.blocks):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = b.attn_norm
        t[p + "attn_q.weight"] = b.wq
        if c.owns(i):
            t[p + "attn_k.weight"] = b.wk
            t[p + "attn_v.weight"] = b.wv
        t[p + "attn_output.weight"] = b.wo
        t[p + "ffn_norm.weight"] = b.ffn_norm
        t[p + "ffn_gate.weight"] = b.w_gate
        t[p + "ffn_up.weight"] = b.w_up
        t[p + "ffn_down.weight"] = b.w_down
    return {k: v.detach().numpy() for k, v in t.items()}


def load(path, model, grow=()):
    """Copies the weights of a GGUF in this layout (F32, kvlm's names) into
    model, whose shape must match the file's tensors. grow lists the
    model's layers that are not in the file (model has len(grow) more
    layers than it): the file's layers fill the others in order, and the
    grown layers keep model's own weights."""
    _, t = gguf.read(path)
    if grow:
        t = grown(t, model.c.layers, grow, path)
    want = tensors(model)
    for i in grow:
        want = {k: v for k, v in want.items() if not k.startswith(f"blk.{i}.")}
    missing = sorted(set(want) - set(t))
    extra = sorted(set(t) - set(want))
    if missing or extra:
        raise SystemExit(f"{path}: tensors do not fit --arch (missing {missing[:3]}, unexpected {extra[:3]})")
    params = dict(model.named_parameters())
    names = {"token_embd.weight": "emb", "output_norm.weight": "out_norm"}
    ours = {"attn_norm": "attn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo",
            "ffn_norm": "ffn_norm", "ffn_gate": "w_gate", "ffn_up": "w_up", "ffn_down": "w_down"}
    import torch
    with torch.no_grad():
        for name, a in t.items():
            if name in names:
                p = params[names[name]]
            else:
                _, i, kind, _ = name.split(".")
                p = params[f"blocks.{i}.{ours[kind]}"]
            if tuple(p.shape) != a.shape:
                raise SystemExit(f"{path}: tensor {name} has shape {a.shape}, --arch implies {tuple(p.shape)}")
            p.copy_(torch.from_numpy(a))


def grown(t, layers, grow, path):
    """The tensors t of a file with layers − len(grow) layers, renamed to
    the model's layer numbers with the layers in grow left out."""
    keep = [i for i in range(layers) if i not in set(grow)]
    have = {int(n.split(".")[1]) for n in t if n.startswith("blk.")}
    if have != set(range(len(keep))):
        raise SystemExit(f"{path}: {len(have)} layers; --grow {','.join(map(str, grow))} wants {len(keep)} "
                         f"(--layers {layers} less the {len(grow)} grown)")
    out = {}
    for name, a in t.items():
        if name.startswith("blk."):
            _, i, rest = name.split(".", 2)
            name = f"blk.{keep[int(i)]}.{rest}"
        out[name] = a
    return out


def write(path, model, rec):
    gguf.write(path, metadata(model.c, rec), tensors(model))
