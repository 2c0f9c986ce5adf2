#!/usr/bin/python3
"""Prints the zoo's table (Markdown) from train/zoo/*/record.json, with
stories260K (llama2.c's, trained on the TinyStories train split) evaluated
by this trainer's forward pass on the same held-out windows for reference:

    /usr/bin/python3 train/table.py [ZOO_DIR]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
import gguf  # noqa: E402
from model import ARCHS, Config, Transformer  # noqa: E402


def stories260k_nll(windows):
    """stories260K's exact mean NLL on windows, its weights read from kvlm's
    conversion of it (data.vocab_metadata makes that file)."""
    import torch
    import train
    data.vocab_metadata()
    meta, t = gguf.read(os.path.join(data.CACHE, "stories260K.gguf"))
    u = lambda k: meta["llama." + k].value  # noqa: E731
    c = Config(dim=u("embedding_length"), layers=u("block_count"), heads=u("attention.head_count"),
               kv_heads=u("attention.head_count_kv"), hidden=u("feed_forward_length"), ctx=u("context_length"),
               vocab=t["token_embd.weight"].shape[0], arch="stories260K")
    m = Transformer(c)
    names = {"emb": "token_embd.weight", "out_norm": "output_norm.weight"}
    for i in range(c.layers):
        for ours, theirs in (("attn_norm", "attn_norm"), ("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"),
                             ("wo", "attn_output"), ("ffn_norm", "ffn_norm"), ("w_gate", "ffn_gate"),
                             ("w_up", "ffn_up"), ("w_down", "ffn_down")):
            names[f"blocks.{i}.{ours}"] = f"blk.{i}.{theirs}.weight"
    m.load_state_dict({k: torch.from_numpy(t[v]) for k, v in names.items()})
    return train.evaluate(m, windows), m.param_count(), c


def main():
    zoo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "zoo")
    rows = []
    for arch in ARCHS:
        path = os.path.join(zoo, arch, "record.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            r = json.load(f)
        c = Config(**r["config"])
        size = os.path.getsize(os.path.join(zoo, arch, "model.gguf"))
        rows.append((arch, c, r, size))
    print("| arch | KV heads | kv_source | layer_window | params | KV B/token (f32, unbounded layers) "
          "| KV bytes at 256 / 4096 tokens | held-out NLL | tokens | train min | GGUF |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    if rows:
        nll, params, c = stories260k_nll(rows[0][2]["heldout"]["windows"])
        print(f"| stories260K (reference) | {c.kv_heads} | — | — | {params:,} | {c.kv_bytes(1 << 30) // (1 << 30):,} "
              f"| {c.kv_bytes(256):,} / {c.kv_bytes(4096):,} | {nll:.4f} | (llama2.c) | — | — |")
    for arch, c, r, size in rows:
        per = c.kv_bytes(1 << 30) // (1 << 30)
        print(f"| {arch} | {c.kv_heads} | {c.kv_source or '—'} | {c.layer_window or '—'} | {r['params']:,} | {per:,} "
              f"| {c.kv_bytes(256):,} / {c.kv_bytes(4096):,} | {r['heldout']['mean_nll']:.4f} | {r['tokens_seen']:,} "
              f"| {r['train_seconds'] / 60:.1f} | {size / 1e6:.2f} MB |")


if __name__ == "__main__":
    main()
