"""The recall model's data: kvlm's own recall-suite samples (`kvlm eval
recall-data`, eval/recall_tasks.go) mixed with plain story windows.

- Training samples: seeds ≥ 2^32 and the train haystack (`--haystack
  train`: story text from bytes [0, 700043), the trainer's own part), so
  that no evaluation sample (seeds < 2^32) and no held-out text is seen.
  Each (task, context[, depth]) cell is one `kvlm eval recall-data` call
  writing a JSONL under train/.cache/recall/ (kept out of git); the pool
  is a function of (task, context, depth, seeds) alone.
- The monitor: held-out samples (seeds 0.., `--haystack heldout`, the
  suite's own) scored by teacher forcing: greedy decoding produces the
  answer exactly iff the argmax at every answer position, given the
  answer's earlier tokens, is the answer's token — so one forward pass
  gives the suite's all-correct score.
- The curriculum (`context_at`, `depth_floor`): short contexts first, the
  single needle near the question first, then the full range.
"""

import json
import os
import subprocess

import numpy as np
import torch

import data

TASKS = ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe"]
# The share of recall rows each task gets (cwe, not a target, less; vt,
# the multi-hop one, more).
TASK_WEIGHT = {"niah_single": 1.0, "niah_multikey": 1.0, "niah_multivalue": 1.0, "niah_multiquery": 1.0,
               "vt": 1.5, "cwe": 0.5}
TRAIN_SEED = 1 << 32
# niah_single's training depths: a grid of 21 (0, 0.05, …, 1); the suite's
# 11 depths are on it, the samples are not (other seeds, other haystack).
DEPTHS = [round(0.05 * i, 2) for i in range(21)]
PAD = -100  # a target that takes no loss (cross_entropy's ignore_index)


def generate(task, ctx, seed, count, depth=None, haystack="train"):
    """count samples of (task, ctx[, depth]) from seed on, as kvlm writes
    them: a list of {prompt, question_start, answer, ...}; cached."""
    d = os.path.join(data.CACHE, "recall")
    os.makedirs(d, exist_ok=True)
    dep = "" if depth is None else f"-d{depth:.2f}"
    path = os.path.join(d, f"{haystack}-{task}-{ctx}{dep}-s{seed}-n{count}.jsonl")
    if not os.path.exists(path):
        cmd = [data.kvlm_bin(), "eval", "recall-data", "--tokenizer", data.tok512_path(),
               "--data", os.path.join(data.shared(), "data"), "--haystack", haystack, "--task", task,
               "--context", str(ctx), "--seed", str(seed), "--count", str(count), "--json"]
        if depth is not None:
            cmd += ["--depth", str(depth)]
        out = subprocess.run(cmd, capture_output=True, check=True).stdout
        with open(path + ".tmp", "wb") as f:
            f.write(out)
        os.replace(path + ".tmp", path)
    with open(path) as f:
        return [json.loads(line) for line in f]


def rows(samples, ctx):
    """Inputs [N, ctx], targets [N, ctx] (PAD past a short sample's end) and
    the answer mask [N, ctx] (targets that are answer tokens) of samples,
    each BOS + prompt + answer: input = seq[:-1], target = seq[1:]."""
    n = len(samples)
    x = np.zeros((n, ctx), dtype=np.int64)
    y = np.full((n, ctx), PAD, dtype=np.int64)
    ans = np.zeros((n, ctx), dtype=bool)
    for r, s in enumerate(samples):
        seq = s["prompt"] + s["answer"]
        if len(seq) > ctx + 1:
            raise SystemExit(f"recall sample of {len(seq)} tokens exceeds context {ctx}")
        m = len(seq) - 1
        x[r, :m] = seq[:-1]
        y[r, :m] = seq[1:]
        ans[r, len(s["prompt"]) - 1:m] = True
    return x, y, ans


class Pool:
    """The training samples of one context: per task, arrays of rows
    (niah_single also per depth). A task that does not fit the context
    (kvlm refuses: too few haystack tokens) is left out of it."""

    def __init__(self, ctx, count):
        self.ctx = ctx
        self.cells = {}  # (task, depth or None) -> (x, y, ans)
        self.tasks = []  # the tasks that fit ctx
        for task in TASKS:
            try:
                if task == "niah_single":
                    per = max(1, count // len(DEPTHS))
                    for dep in DEPTHS:
                        self.cells[(task, dep)] = rows(generate(task, ctx, TRAIN_SEED, per, dep), ctx)
                else:
                    self.cells[(task, None)] = rows(generate(task, ctx, TRAIN_SEED, count), ctx)
            except subprocess.CalledProcessError as e:
                if b"haystack tokens" not in e.stderr and b"too short" not in e.stderr:
                    raise
                continue
            self.tasks.append(task)
        if not self.tasks:
            raise SystemExit(f"recall: no task fits a context of {ctx}")

    def draw(self, rng, n, depth_floor, weights=None):
        """n rows: tasks (those that fit) by weights (TASK_WEIGHT by
        default), niah_single's depth uniform over DEPTHS ≥ depth_floor, a
        sample uniform in its cell."""
        weights = weights or TASK_WEIGHT
        w = np.array([weights[t] for t in self.tasks])
        if not w.sum():
            raise SystemExit(f"recall: every task that fits {self.ctx} tokens ({', '.join(self.tasks)}) has share 0")
        tasks = rng.choice(len(self.tasks), size=n, p=w / w.sum())
        deps = [d for d in DEPTHS if d >= depth_floor - 1e-9]
        xs, ys, ans = [], [], []
        for t in tasks:
            task = self.tasks[t]
            key = (task, deps[rng.integers(len(deps))]) if task == "niah_single" else (task, None)
            x, y, a = self.cells[key]
            i = rng.integers(len(x))
            xs.append(x[i]), ys.append(y[i]), ans.append(a[i])
        return np.stack(xs), np.stack(ys), np.stack(ans)


def parse_task_weights(text):
    """"niah_single=0.5,vt=2" → TASK_WEIGHT with those tasks' shares
    replaced; unknown tasks, negative shares and all-zero shares are
    refused."""
    out = dict(TASK_WEIGHT)
    for part in text.split(","):
        task, eq, w = part.partition("=")
        try:
            w = float(w)
        except ValueError:
            w = None
        if not eq or task not in TASK_WEIGHT or w is None or w < 0:
            raise SystemExit(f"--recall-task-weight {text!r}: want TASK=SHARE,… with TASK one of {', '.join(TASKS)}")
        out[task] = w
    if not any(out.values()):
        raise SystemExit(f"--recall-task-weight {text!r}: every share is 0")
    return out


def parse_curriculum(text, full):
    """"64:0.1,128:0.3,512" → [(64, 0.1), (128, 0.3), (512, 1.0)]: row
    length 64 until 10% of the steps, 128 until 30%, then 512 (the last
    entry has no end and is at most the context)."""
    out = []
    for i, part in enumerate(text.split(",")):
        L, _, end = part.partition(":")
        last = i == len(text.split(",")) - 1
        try:
            L, end = int(L), (1.0 if last and not end else float(end))
        except ValueError:
            raise SystemExit(f"--recall-curriculum {text!r}: want LEN:END,…,LEN")
        if L < 32 or L > full or (out and end <= out[-1][1]) or (last and end != 1.0) or not 0 < end <= 1:
            raise SystemExit(f"--recall-curriculum {text!r}: lengths in [32, --ctx], ends rising, the last open")
        out.append((L, end))
    return out


def context_at(f, full):
    """The curriculum's row length at training fraction f: 256 (the
    shortest context every task fits: multi-query's four needles need
    ~180 tokens) for the first 30%, then the full context."""
    return min(256, full) if f < 0.3 else full


def step_context(step, steps, full, curriculum=None):
    """Step `step`'s row length: context_at (or the parse_curriculum
    stages), with every fourth step of the full-context part at 256 (the
    quick suite's context)."""
    f = step / steps
    ctx = context_at(f, full) if curriculum is None else next(L for L, end in curriculum if f < end or end == 1.0)
    if ctx == full and full > 256 and step % 4 == 3:
        return 256
    return ctx


def depth_floor(f, until=0.3):
    """niah_single's shallowest depth at training fraction f: 0.8 at the
    start (the needle near the question), 0 (every depth) from `until` on."""
    return max(0.0, 0.8 * (1 - f / until))


def heldout_set(ctx, per_task, depths=(0.0, 0.25, 0.5, 0.75, 1.0)):
    """The monitor's held-out samples: the suite's own (seeds 0.., the
    held-out haystack), per task; niah_single per depth."""
    out = {}
    for task in TASKS:
        if task == "niah_single":
            for d in depths:
                out[f"{task}@{d:g}"] = generate(task, ctx, 0, per_task, d, haystack="heldout")
        else:
            out[task] = generate(task, ctx, 0, per_task, haystack="heldout")
    return out


@torch.no_grad()
def accuracy(model, samples, batch=16):
    """The share of samples whose answer greedy decoding produces exactly
    (teacher forcing: every answer position's argmax is the answer's
    token)."""
    x, y, ans = rows(samples, max(len(s["prompt"]) + len(s["answer"]) - 1 for s in samples))
    ok = 0
    for i in range(0, len(x), batch):
        xb = torch.from_numpy(x[i:i + batch])
        pred = model.exact_logits(xb).argmax(-1).numpy()
        a = ans[i:i + batch]
        good = np.where(a, pred == y[i:i + batch], True).all(axis=1)
        ok += int(good.sum())
    return ok / len(x)


def monitor(model, sets):
    """{cell: accuracy} over the held-out sets (model in eval mode)."""
    return {k: accuracy(model, v) for k, v in sets.items()}
