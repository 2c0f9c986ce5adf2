"""Dense key–value rows for the recall model (docs/ZOO.md, "Phase 6"):
rows of nothing but the recall suite's facts, each fact then asked again,
built from the suite's own pieces (eval/recall_tasks.go: its word pool,
digits, sentences) so that what the rows teach transfers to the suite.

A row is BOS, the facts, then the questions; the answers (the values
asked) are the answer mask, every token a target. The formats widen the
gap between a key and its value stage by stage (the model first copies
a value right after its key, the classic induction pattern, then learns
to match the key farther back):

  g0     KEY DDDD.                      (the value's boundary piece dropped)
  g1     KEY ▁DDDD.
  g2     KEY is ▁DDDD.
  key    The special number for KEY is ▁DDDD.      (niah_multikey's needle)
  are    key's facts, then two to four keys asked at once (niah_multiquery):
         The special numbers for A, B and C are ▁DDDD, ▁DDDD, ▁DDDD.
  multi  one to three facts per key, the facts shuffled, each key's values
         asked in the order they appear (niah_multivalue):
         The special numbers for KEY are ▁DDDD, ▁DDDD.
  vt     chains of one to three assignments, interleaved, each chain in
         order (vt): VAR A = ▁DDDD. VAR B = A. … then every name asked:
         The value of B is ▁DDDD.
  vt1    vt's rows with chains of one assignment; vt2: of one or two

Every key of a row is a distinct word; a row holds as many facts as fit.
Rows are drawn from a numpy Generator alone (train.py seeds it with
(seed, step)).
"""

import json
import subprocess

import numpy as np

import data
import recall

FORMATS = ("g0", "g1", "g2", "key", "are", "multi", "vt", "vt1", "vt2")
# The formats of the last stage ("mix"): the suite's four kinds of fact.
MIX = ("key", "are", "multi", "vt")


def enc(text):
    """The suite's enc: tok512 ids of text, no BOS."""
    return data.tokenize(text.encode())


def suite_words():
    """The suite's word pool in tok512, in its order: the ids of the words
    it encodes in at most two tokens (`kvlm eval recall-words`, from
    eval/recall_tasks.go's list, so the two never differ)."""
    out = subprocess.run([data.kvlm_bin(), "eval", "recall-words", "--tokenizer", data.tok512_path()],
                         capture_output=True, check=True).stdout
    return [w["ids"] for w in json.loads(out)]


class Pieces:
    """The token ids the rows are made of, encoded as the suite encodes
    them."""

    def __init__(self):
        d0 = [enc(str(d)) for d in range(10)]
        self.space = d0[0][0]
        if any(len(d) != 2 or d[0] != self.space for d in d0):
            raise SystemExit(f"dense: tok512 encodes the digits as {d0}, not a boundary piece and one digit")
        self.digits = [d[1] for d in d0]
        self.dot, self.comma = enc(".")[1], enc(",")[1]
        self.words = suite_words()
        self.fact = enc("The special number for")
        self.facts = enc("The special numbers for")
        self.is_, self.are, self.and_ = enc("is"), enc("are"), enc("and")
        self.var, self.eq = enc("VAR"), enc("=")
        self.value_of = enc("The value of")

    def value(self, rng):
        return [self.space] + [self.digits[d] for d in rng.integers(0, 10, 4)]


class _Row:
    """A row under construction: tokens and the spans of answer tokens."""

    def __init__(self):
        self.ids, self.answers = [data.BOS], []

    def add(self, *parts):
        for p in parts:
            self.ids += p

    def answer(self, ids):
        self.answers.append((len(self.ids), len(self.ids) + len(ids)))
        self.ids += ids


def _list(p, keys):
    """A, B and C: the suite's way of listing keys."""
    out = []
    for j, k in enumerate(keys):
        if j == len(keys) - 1 and j > 0:
            out += p.and_
        elif j > 0:
            out.append(p.comma)
        out += k
    return out


def _before(p, fmt, k):
    """The tokens of a key format's fact, and of its question, before the
    value."""
    if fmt in ("g0", "g1"):
        return k
    if fmt == "g2":
        return k + p.is_
    return p.fact + k + p.is_


def _build(p, rng, fmt, n):
    """A row of format fmt with n keys (n distinct words)."""
    keys = [p.words[i] for i in rng.permutation(len(p.words))[:n]]
    r = _Row()
    if fmt in ("g0", "g1", "g2", "key", "are"):
        kf = "key" if fmt == "are" else fmt  # are's facts are the needle sentence
        vals = [p.value(rng) for _ in keys]
        if kf == "g0":
            vals = [v[1:] for v in vals]  # the boundary piece dropped
        for k, v in zip(keys, vals):
            r.add(_before(p, kf, k), v, [p.dot])
        if fmt != "are":
            for j in rng.permutation(n):
                r.add(_before(p, fmt, keys[j]))
                r.answer(vals[j])
                r.add([p.dot])
        else:
            order = list(rng.permutation(n))
            while order:
                g = min(len(order), int(rng.integers(2, 5)))
                ask, order = order[:g], order[g:]
                r.add(p.facts, _list(p, [keys[j] for j in ask]), p.are)
                for j, i in enumerate(ask):
                    if j:
                        r.add([p.comma])
                    r.answer(vals[i])
                r.add([p.dot])
    elif fmt == "multi":
        vals = [[p.value(rng) for _ in range(int(rng.integers(1, 4)))] for _ in keys]
        facts = [(i, v) for i in range(n) for v in vals[i]]
        seen = [[] for _ in keys]  # each key's values in the order they appear
        for f in rng.permutation(len(facts)):
            i, v = facts[f]
            r.add(p.fact, keys[i], p.is_, v, [p.dot])
            seen[i].append(v)
        for i in rng.permutation(n):
            r.add(p.facts, keys[i], p.are)
            for j, v in enumerate(seen[i]):
                if j:
                    r.add([p.comma])
                r.answer(v)
            r.add([p.dot])
    elif fmt in ("vt", "vt1", "vt2"):
        hops = [int(rng.integers(1, {"vt": 4, "vt1": 2, "vt2": 3}[fmt])) for _ in range(n)]
        while sum(hops) > len(p.words):  # every name a distinct word
            hops[int(np.argmax(hops))] -= 1
        keys = [p.words[i] for i in rng.permutation(len(p.words))[:sum(hops)]]
        names, at = [], 0
        for h in hops:
            names.append(keys[at:at + h])
            at += h
        vals = [p.value(rng) for _ in range(n)]
        nxt = [0] * n
        for c in rng.permutation([c for c in range(n) for _ in range(hops[c])]):
            h = nxt[c]
            r.add(p.var, names[c][h], p.eq, vals[c] if h == 0 else names[c][h - 1], [p.dot])
            nxt[c] += 1
        asked = [(c, h) for c in range(n) for h in range(hops[c])]
        for q in rng.permutation(len(asked)):
            c, h = asked[q]
            r.add(p.value_of, names[c][h], p.is_)
            r.answer(vals[c])
            r.add([p.dot])
    else:
        raise SystemExit(f"dense: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    return r


# The fewest keys (chains, for vt) a row has: enough that a question has
# distractors.
LEAST = {"g0": 4, "g1": 4, "g2": 4, "key": 4, "are": 4, "multi": 2, "vt": 2, "vt1": 2, "vt2": 2}


def most(p, fmt, L):
    """The most keys (chains) a row of fmt fits in L + 1 tokens in the
    worst case (two-token words; three values a key, three hops a chain)."""
    w = max(len(x) for x in p.words)
    v = 5  # ▁DDDD
    fact = len(p.fact) + w + len(p.is_) + v + 1
    per = {"g0": 2 * (w + v), "g1": 2 * (w + v + 1), "g2": 2 * (w + len(p.is_) + v + 1),
           "key": 2 * fact,
           # a group of one (the last): its own sentence
           "are": fact + len(p.facts) + w + len(p.are) + v + 1 + 1,
           "multi": 3 * fact + len(p.facts) + w + len(p.are) + 3 * (v + 1),
           "vt": 3 * (len(p.var) + w + len(p.eq) + v + 1) + 3 * (len(p.value_of) + w + len(p.is_) + v + 1)}
    per["vt1"], per["vt2"] = per["vt"] // 3, 2 * per["vt"] // 3
    per = per[fmt]
    return max(0, min(len(p.words), L // per))


def row(p, rng, fmt, L):
    """One row of fmt at length L: inputs [L], targets [L] (PAD past its
    end) and the answer mask [L], as recall.rows makes them. The number of
    keys is uniform in [LEAST, most]."""
    hi = most(p, fmt, L)
    if hi < LEAST[fmt]:
        raise SystemExit(f"dense: a {fmt} row needs more than {L} tokens")
    r = _build(p, rng, fmt, int(rng.integers(LEAST[fmt], hi + 1)))
    if len(r.ids) > L + 1:
        raise AssertionError(f"dense: a {fmt} row of {len(r.ids)} tokens exceeds {L + 1}")
    m = len(r.ids) - 1
    x = np.zeros(L, dtype=np.int64)
    y = np.full(L, recall.PAD, dtype=np.int64)
    ans = np.zeros(L, dtype=bool)
    x[:m], y[:m] = r.ids[:-1], r.ids[1:]
    for s, e in r.answers:
        ans[s - 1:e - 1] = True  # target index t predicts ids[t + 1]
    return x, y, ans


def rows(p, rng, fmts, n, L):
    """n rows at length L, each of a format drawn uniformly from fmts:
    x, y, ans of shape [n, L]."""
    xs, ys, ans = zip(*[row(p, rng, fmts[int(rng.integers(len(fmts)))], L) for _ in range(n)])
    return np.stack(xs), np.stack(ys), np.stack(ans)


def parse_stages(text):
    """"g0:0.1,g1:0.2,g2:0.3,key:0.4,mix" → [("g0", 0.1), …, ("mix", 1.0)]:
    format g0 until 10% of the steps, …; the last stage runs to the end.
    "mix" is the mix's formats (MIX, or --dense-mix's), and only the last
    stage may be it."""
    out = []
    parts = text.split(",")
    for i, part in enumerate(parts):
        fmt, _, end = part.partition(":")
        last = i == len(parts) - 1
        try:
            end = 1.0 if last and not end else float(end)
        except ValueError:
            raise SystemExit(f"--dense {text!r}: want FORMAT:END,…,FORMAT")
        if fmt not in FORMATS + ("mix",) or (fmt == "mix" and not last) or (out and end <= out[-1][1]) \
                or (last and end != 1.0) or not 0 < end <= 1:
            raise SystemExit(f"--dense {text!r}: formats from {', '.join(FORMATS)} (mix only last), ends rising, "
                             "the last open")
        out.append((fmt, end))
    return out


def stage_at(stages, f):
    """The stage's format at training fraction f ("mix" in the last stage
    when it is mix)."""
    return next(fmt for fmt, end in stages if f < end or end == 1.0)


def parse_mix(text):
    """"key,are,multi,multi,vt" → the mix stage's formats, drawn uniformly
    (a format named twice is drawn twice as often)."""
    fmts = tuple(text.split(","))
    if not all(f in FORMATS for f in fmts):
        raise SystemExit(f"--dense-mix {text!r}: want FORMAT,… from {', '.join(FORMATS)}")
    return fmts
