#!/usr/bin/python3
"""Train a tiny Llama-family model of one KV-source-map architecture on the
TinyStories split (data.py), then evaluate it, record what kvlm must
reproduce, and export it to GGUF.

    /usr/bin/python3 train/train.py --arch cla2 --out train/zoo/cla2 --steps 600

Writes into --out:
  ckpt.pt       model, optimizer and step (every --ckpt-every steps and at
                the end); --resume continues from it, bit for bit as if
                never stopped (each step's batch is drawn from (seed, step))
  train.log     one line per --log-every steps: step, loss, lr, tokens/s
  record.json   the trainer's exact held-out NLL on fixed windows of the
                held-out part (their token ids included), and its logits
                on a fixed prompt: what cmd/kvlm's TestZoo checks kvlm against
  model.gguf    the model in kvlm's layout (export.py)
"""

import argparse
import json
import math
import os
import sys
import time

# OpenMP's default busy-waiting makes two threads four times slower than one
# on a loaded machine (measured: 258 against 930 tokens/s); passive waiting
# costs nothing when the cores are free. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
import dense  # noqa: E402
import export  # noqa: E402
import recall  # noqa: E402
from model import ARCHS, Config, Transformer, arch_config  # noqa: E402

# The fixed prompt whose logits kvlm must reproduce: longer than the zoo's
# window (64), so that the windowed layers' masks take part.
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with her red ball. "
          "One day, the ball rolled under a big tree and a small dog found it. The dog wagged its tail and brought "
          "the ball back to Lily. Lily smiled and said, \"Thank you, dog! Do you want to play with me?\" The dog")


def f32list(t):
    """A float32 tensor as a nested list of the shortest decimals that read
    back as the same float32 values."""
    return [[float(str(np.float32(v))) for v in row] for row in t.numpy()]


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", required=True, choices=ARCHS)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--ctx", type=int, default=256, help="training context (tokens per sample, BOS included)")
    p.add_argument("--window", type=int, default=64, help="sliding window of YOCO's self-decoder and the local layers")
    p.add_argument("--passes", type=int, default=7, help="Layer-Condensed KV: parallel training passes m")
    p.add_argument("--grad-passes", type=int, default=2, help="Layer-Condensed KV: passes b with gradients")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=0, help="warmup steps (default 5%% of --steps)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--init", help="start from this GGUF's weights (e.g. an MHA model converted by kvlm convert kv-heads)")
    p.add_argument("--grow", default="",
                   help="I,J,… : with --init, the layers of this model that the --init file lacks (it has that many "
                        "fewer): they start as the identity (output projections zero), the file's layers fill the rest")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-windows", type=int, default=16, help="held-out windows of --ctx tokens to evaluate")
    p.add_argument("--ckpt-every", type=int, default=200)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume", action="store_true", help="continue from --out/ckpt.pt")
    p.add_argument("--no-export", action="store_true", help="stop after training and the checkpoint")
    p.add_argument("--stop-after", type=int, default=0, help="stop after this step (checkpointed; --resume continues)")
    p.add_argument("--export-now", action="store_true",
                   help="with --resume: train no further; evaluate, record and export the checkpoint as it is")
    p.add_argument("--recall", type=float, default=0.0,
                   help="share of rows that are recall-suite samples (recall.py; 0: story text only); with it, "
                        "a curriculum of row lengths 256, then --ctx")
    p.add_argument("--recall-curriculum", default="",
                   help="row lengths LEN:END,…,LEN (END a fraction of --steps; the last runs to the end), e.g. "
                        "64:0.1,128:0.25,192:0.4,256:0.55,512; tasks that do not fit a length sit it out "
                        "(default 256:0.3,--ctx); niah_single's depths widen until the first full-context stage")
    p.add_argument("--recall-weight", type=float, default=1.0,
                   help="the loss adds this times the mean NLL of the batch's answer tokens")
    p.add_argument("--recall-task-weight", default="",
                   help="TASK=SHARE,… : the recall rows' task shares, replacing recall.TASK_WEIGHT's for those "
                        "tasks (e.g. niah_single=0.5,niah_multikey=1.5)")
    p.add_argument("--dense", default="",
                   help="with --recall: stages of dense key-value rows (dense.py) FORMAT:END,…,FORMAT (END a fraction "
                        "of --steps), e.g. g0:0.1,g1:0.2,g2:0.3,key:0.4,mix; in a FORMAT stage every row is a dense "
                        "row of it, in a last stage mix a --dense-share of the rows are (of the --dense-mix formats) "
                        "and the rest as --recall")
    p.add_argument("--dense-share", type=float, help="the share of dense rows in --dense's mix stage (default 0.5)")
    p.add_argument("--dense-mix", help="the mix stage's dense formats, drawn uniformly (one named twice drawn twice "
                                       "as often; default " + ",".join(dense.MIX) + ")")
    p.add_argument("--recall-pool", type=int, default=2000, help="training samples per task and context")
    p.add_argument("--recall-eval-every", type=int, default=100, help="steps between held-out recall checks")
    p.add_argument("--recall-eval-n", type=int, default=12, help="held-out samples per task (and depth) per check")
    a = p.parse_args(argv)
    if a.export_now and not a.resume:
        p.error("--export-now needs --resume")
    if not 0 <= a.recall <= 1:
        p.error("--recall must be in [0, 1]")
    try:
        a.grow_layers = sorted({int(x) for x in a.grow.split(",")}) if a.grow else []
    except ValueError:
        p.error(f"--grow {a.grow!r}: want layer numbers I,J,…")
    if a.grow_layers and (not a.init or a.grow_layers[0] < 0 or a.grow_layers[-1] >= a.layers
                          or len(a.grow_layers) >= a.layers):
        p.error("--grow needs --init and layer numbers in [0, --layers), fewer than --layers")
    a.curriculum = recall.parse_curriculum(a.recall_curriculum, a.ctx) if a.recall_curriculum else None
    a.dense_stages = dense.parse_stages(a.dense) if a.dense else None
    if a.dense and not a.recall:
        p.error("--dense needs --recall")
    if (a.dense_share is not None or a.dense_mix is not None) and not (a.dense_stages and
                                                                      a.dense_stages[-1][0] == "mix"):
        p.error("--dense-share and --dense-mix need a --dense whose last stage is mix")
    a.dense_share = 0.5 if a.dense_share is None else a.dense_share
    a.mix = dense.parse_mix(a.dense_mix) if a.dense_mix is not None else dense.MIX
    if not 0 <= a.dense_share <= 1:
        p.error("--dense-share must be in [0, 1]")
    a.task_weight = recall.parse_task_weights(a.recall_task_weight) if a.recall_task_weight else recall.TASK_WEIGHT
    if a.recall and (a.recall_pool < 21 or a.recall_eval_every < 1 or a.recall_eval_n < 1 or a.ctx < 256):
        p.error("--recall needs --recall-pool ≥ 21, positive --recall-eval-every and --recall-eval-n, --ctx ≥ 256")
    for name in ("steps", "batch", "ctx", "threads", "eval_windows", "ckpt_every", "log_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if a.ctx < 2:
        p.error("--ctx must be at least 2")
    return a


def lr_at(a, step):
    """Linear warmup to --lr, then cosine decay to --lr/10 at --steps."""
    warm = a.warmup or max(1, a.steps // 20)
    if step < warm:
        return a.lr * (step + 1) / warm
    t = (step - warm) / max(1, a.steps - warm)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def batch(a, ids, step):
    """The batch of step `step`: --batch samples [BOS, s[o], …, s[o+ctx−2]]
    with targets s[o … o+ctx−1], offsets o drawn from (seed, step) alone."""
    rng = np.random.default_rng([a.seed, step])
    off = rng.integers(0, len(ids) - a.ctx, size=a.batch)
    rows = np.stack([ids[o:o + a.ctx] for o in off])  # [B, ctx]
    x = np.concatenate([np.full((a.batch, 1), data.BOS, dtype=np.int64), rows[:, :-1]], axis=1)
    return torch.from_numpy(x), torch.from_numpy(rows.astype(np.int64))


def recall_contexts(a):
    """The row lengths the curriculum uses (recall.step_context)."""
    return sorted({recall.step_context(s, a.steps, a.ctx, a.curriculum) for s in range(a.steps)})


def recall_depth_floor(a, step):
    """niah_single's shallowest depth at step: widening until 30% of the
    steps, or until the custom curriculum's last stage starts."""
    until = 0.3 if a.curriculum is None else a.curriculum[-2][1] if len(a.curriculum) > 1 else 0.3
    return recall.depth_floor(step / a.steps, until)


def recall_batch(a, ids, pools, step, pieces=None):
    """The batch of step `step` with --recall: row length L from the
    curriculum, batch·ctx/L rows of which a --recall share are recall
    samples (the rest story windows as batch()), all drawn from (seed,
    step) alone. With --dense, a dense stage's rows are all dense rows of
    its format, and the mix stage's first --dense-share of them are dense
    (dense.py, built from pieces). Returns x, y (PAD where no loss) and the
    answer mask."""
    L = recall.step_context(step, a.steps, a.ctx, a.curriculum)
    n = a.batch * a.ctx // L
    rng = np.random.default_rng([a.seed, step])
    fmt = dense.stage_at(a.dense_stages, step / a.steps) if a.dense_stages else None
    if fmt is None:
        parts = [recall_rows(a, ids, pools, step, rng, n, L)]
    elif fmt != "mix":
        parts = [dense.rows(pieces, rng, (fmt,), n, L)]
    else:
        nd = int(round(n * a.dense_share))
        parts = [dense.rows(pieces, rng, a.mix, nd, L), recall_rows(a, ids, pools, step, rng, n - nd, L)]
    return tuple(torch.from_numpy(np.concatenate(p)) for p in zip(*parts))


def recall_rows(a, ids, pools, step, rng, n, L):
    """n rows of length L from rng: a --recall share recall samples, the
    rest story windows."""
    nr = int(round(n * a.recall))
    off = rng.integers(0, len(ids) - L, size=n - nr)
    rows = np.stack([ids[o:o + L] for o in off]) if n > nr else np.zeros((0, L), dtype=np.int64)
    x = np.concatenate([np.full((n - nr, 1), data.BOS, dtype=np.int64), rows[:, :-1]], axis=1)
    y, ans = rows.astype(np.int64), np.zeros(rows.shape, dtype=bool)
    if nr:
        rx, ry, ra = pools[L].draw(rng, nr, recall_depth_floor(a, step), a.task_weight)
        x, y, ans = np.concatenate([x, rx]), np.concatenate([y, ry]), np.concatenate([ans, ra])
    return x, y, ans


def mean_nll(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1), reduction="mean").item()


def evaluate(model, windows):
    """Exact mean NLL (nats/prediction) of the windows' ctx−1 predictions."""
    t = torch.tensor(windows, dtype=torch.int64)
    logits = model.exact_logits(t[:, :-1])
    return mean_nll(logits, t[:, 1:])


class Progress:
    """A one-line progress bar on a terminal (stderr); nothing otherwise."""

    def __init__(self, total):
        self.total, self.on = total, sys.stderr.isatty()

    def show(self, step, loss, tps):
        if not self.on:
            return
        w = 30
        done = int(w * step / self.total)
        sys.stderr.write(f"\r[{'=' * done}{' ' * (w - done)}] {step}/{self.total}  loss {loss:.4f}  {tps:,.0f} tok/s ")
        sys.stderr.flush()

    def end(self):
        if self.on:
            sys.stderr.write("\n")


def config_of(a):
    return arch_config(a.arch, dim=a.dim, layers=a.layers, heads=a.heads, hidden=a.hidden, ctx=a.ctx,
                       window=a.window, passes=a.passes, grad_passes=a.grad_passes)


def optimizer(model, a):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    keep = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                              {"params": keep, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)


RECIPE_KEYS = ("arch", "dim", "layers", "heads", "hidden", "ctx", "window", "passes", "grad_passes", "batch",
               "steps", "lr", "warmup", "weight_decay", "seed")


def main(argv=None):
    a = parse(argv)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    os.makedirs(a.out, exist_ok=True)
    ckpt_path = os.path.join(a.out, "ckpt.pt")
    c = config_of(a)
    recipe = {k: getattr(a, k) for k in RECIPE_KEYS}
    if a.init:
        recipe["init"] = a.init
    if a.grow_layers:
        recipe["grow"] = a.grow_layers
    if a.recall:
        recipe.update({"recall": a.recall, "recall_weight": a.recall_weight, "recall_pool": a.recall_pool,
                       "recall_tasks": recall.TASKS, "recall_task_weight": a.task_weight,
                       "recall_seed": recall.TRAIN_SEED, "recall_haystack": "train",
                       "recall_contexts": recall_contexts(a)})
        if a.curriculum:
            recipe["recall_curriculum"] = a.recall_curriculum
        if a.dense:
            recipe.update({"dense": a.dense, "dense_share": a.dense_share})
            if a.mix != dense.MIX:
                recipe["dense_mix"] = a.dense_mix
    train_ids, held_ids = data.split_ids()
    train_ids = np.asarray(train_ids, dtype=np.int64)
    windows = data.heldout_windows(held_ids, a.ctx, a.eval_windows)

    torch.manual_seed(a.seed)
    model = Transformer(c)
    model.init_weights(torch.Generator().manual_seed(a.seed))
    init_nll = None
    if a.init:
        export.load(a.init, model, a.grow_layers)
        with torch.no_grad():
            for i in a.grow_layers:  # a grown layer adds nothing to the residual stream until trained
                model.blocks[i].wo.zero_()
                model.blocks[i].w_down.zero_()
        model.eval()
        init_nll = evaluate(model, windows)
        model.train()
    opt = optimizer(model, a)
    step, seconds = 0, 0.0
    if a.resume:
        if not os.path.exists(ckpt_path):
            raise SystemExit(f"--resume: {ckpt_path} does not exist")
        ck = torch.load(ckpt_path)
        if ck["recipe"] != recipe:
            diff = {k: (ck["recipe"].get(k), v) for k, v in recipe.items() if ck["recipe"].get(k) != v}
            raise SystemExit(f"--resume: the checkpoint was trained with another recipe: {diff}")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, seconds = ck["step"], ck["seconds"]
    elif os.path.exists(ckpt_path):
        raise SystemExit(f"{ckpt_path} exists: give --resume to continue it, or another --out")

    pools, checks, curve, pieces = None, None, [], None
    if a.dense:
        pieces = dense.Pieces()
    if a.recall:
        pools = {L: recall.Pool(L, a.recall_pool) for L in recall_contexts(a)}
        checks = recall.heldout_set(a.ctx, a.recall_eval_n)
        curve_path = os.path.join(a.out, "recall_curve.json")
        if a.resume and os.path.exists(curve_path):
            with open(curve_path) as f:
                curve = [e for e in json.load(f) if e["step"] <= step]
    log = open(os.path.join(a.out, "train.log"), "a")
    try:
        run(a, c, recipe, model, opt, step, seconds, train_ids, windows, ckpt_path, log, init_nll, pools, checks, curve,
            pieces)
    finally:
        log.close()


def run(a, c, recipe, model, opt, step, seconds, train_ids, windows, ckpt_path, log, init_nll, pools=None, checks=None,
        curve=None, pieces=None):
    def say(line):
        log.write(line + "\n")
        log.flush()
        if not sys.stderr.isatty():
            print(line, flush=True)

    if step == 0:
        say(f"# arch {a.arch}  params {model.param_count()}  kv_source {c.kv_source}  layer_window {c.layer_window}  "
            f"recipe {json.dumps(recipe)}  torch {torch.__version__} threads {a.threads}")
        if init_nll is not None:
            say(f"# initialized from {a.init}: held-out NLL {init_nll:.6f}")
    else:
        say(f"# resumed at step {step}  torch {torch.__version__} threads {a.threads}")

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seconds": seconds,
                    "recipe": recipe, "config": c.to_dict()}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    bar = Progress(a.steps)
    tok_per_step = a.batch * a.ctx
    t_win, n_win, loss_sum = time.time(), 0, 0.0
    model.train()
    if a.export_now:
        say(f"# --export-now at step {step} of {a.steps}")
    while step < a.steps and not a.export_now:
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(a, step)
        if pools is None:
            x, y = batch(a, train_ids, step)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, c.vocab), y.reshape(-1))
        else:
            x, y, ans = recall_batch(a, train_ids, pools, step, pieces)
            logits = model(x).reshape(-1, c.vocab)
            y, ans = y.reshape(-1), ans.reshape(-1)
            loss = F.cross_entropy(logits, y, ignore_index=recall.PAD)
            if ans.any():
                loss = loss + a.recall_weight * F.cross_entropy(logits[ans], y[ans])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seconds += time.time() - t0
        loss_sum, n_win = loss_sum + loss.item(), n_win + 1
        tps = n_win * tok_per_step / max(time.time() - t_win, 1e-9)
        bar.show(step, loss.item(), tps)
        if step % a.log_every == 0 or step == a.steps:
            say(f"step {step} loss {loss_sum / n_win:.4f} lr {lr_at(a, step - 1):.2e} tok/s {tps:.0f} tokens {step * tok_per_step}")
            t_win, n_win, loss_sum = time.time(), 0, 0.0
        if checks is not None and (step % a.recall_eval_every == 0 or step == a.steps):
            model.eval()
            acc = recall.monitor(model, checks)
            model.train()
            curve.append({"step": step, "tokens": step * tok_per_step, "seconds": round(seconds, 1), "acc": acc})
            with open(os.path.join(a.out, "recall_curve.json"), "w") as f:
                json.dump(curve, f)
            say(f"recall step {step} " + " ".join(f"{k} {v:.2f}" for k, v in acc.items()))
        if step % a.ckpt_every == 0 or step == a.steps or step == a.stop_after:
            save()
        if step == a.stop_after:
            say(f"# stopped after step {step} (--stop-after)")
            bar.end()
            return
    bar.end()
    if a.no_export:
        return
    model.eval()
    nll = evaluate(model, windows)
    prompt_ids = ([data.BOS] + data.tokenize(PROMPT.encode()))[:a.ctx]  # at most the context
    with torch.no_grad():
        plog = model.exact_logits(torch.tensor([prompt_ids]))[0]
    rec = {
        "arch": a.arch,
        "config": c.to_dict(),
        "recipe": recipe,
        "params": model.param_count(),
        "kv_bytes_per_token_f32": c.kv_bytes(1 << 30) / (1 << 30),
        "kv_bytes_at_ctx_f32": c.kv_bytes(a.ctx),
        "tokens_seen": step * tok_per_step,
        "steps_done": step,
        "train_seconds": round(seconds, 1),
        "data": {"file": data.TEXT, "train_bytes": list(data.TRAIN), "heldout_bytes": list(data.HELDOUT)},
        "heldout": {"windows": windows, "mean_nll": nll},
        "init": a.init,
        "init_heldout_nll": init_nll,
        "prompt": {"text": PROMPT, "ids": prompt_ids, "logits": f32list(plog)},
    }
    if checks is not None:
        rec["recall"] = {"curve": curve, "heldout_n": a.recall_eval_n, "prompt": recall_prompt(model, a.ctx)}
    with open(os.path.join(a.out, "record.json"), "w") as f:
        json.dump(rec, f)
    export.write(os.path.join(a.out, "model.gguf"), model, rec)
    say(f"# done: steps {step} tokens {step * tok_per_step} train minutes {seconds / 60:.2f} held-out NLL {nll:.6f} "
        f"({a.eval_windows} windows of {a.ctx})")


def recall_prompt(model, ctx, tail=24):
    """A held-out recall prompt (the suite's niah_multikey seed 0 at --ctx),
    PyTorch's logits at its last `tail` positions and its greedy answer
    (decoded token by token, as kvlm decodes)."""
    s = recall.generate("niah_multikey", ctx, 0, 1, haystack="heldout")[0]
    ids = list(s["prompt"])
    with torch.no_grad():
        lg = model.exact_logits(torch.tensor([ids]))[0]
        out = []
        for _ in range(len(s["answer"])):
            nxt = int(model.exact_logits(torch.tensor([ids + out]))[0, -1].argmax())
            out.append(nxt)
    return {"task": s["task"], "context": ctx, "seed": s["seed"], "ids": ids, "answer": s["answer"],
            "tail": tail, "logits_tail": f32list(lg[-tail:]), "greedy": out}


if __name__ == "__main__":
    main()
