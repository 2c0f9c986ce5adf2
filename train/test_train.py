"""Tests of the trainer: /usr/bin/python3 -m unittest discover -s train

- The forward pass against a float64 reference written plainly here (its
  own loops, masks, RoPE and dummy slot) for every architecture.
- The all-positions pass against the token-by-token one; Layer-Condensed
  KV's iterative passes converge to the exact result (and differ with too
  few passes, so the comparison can fail).
- Training is deterministic and a resumed run is bit for bit an unbroken one.
- The GGUF export round-trips and leaves non-owners without K/V.
"""

import json
import math
import os
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
import dense  # noqa: E402
import gguf  # noqa: E402
import recall  # noqa: E402
from model import ARCHS, Transformer, arch_config, rope_tables  # noqa: E402

torch.set_num_threads(1)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def small(arch, ctx=12, window=3, passes=7, grad_passes=2, scale=4.0, seed=0):
    """A model of arch at width 32 with random weights, scaled up so that
    attention is far from uniform."""
    c = arch_config(arch, dim=32, layers=6, heads=4, hidden=48, ctx=ctx, window=window,
                    passes=passes, grad_passes=grad_passes)
    m = Transformer(c)
    m.init_weights(torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.mul_(scale)
            else:
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + 1)))
    return m


def reference(m, tokens):
    """Logits [T, vocab] in float64, one token at a time, written plainly."""
    c = m.c
    W = {k: v.detach().double().numpy() for k, v in m.state_dict().items()}
    hd, G = c.head_dim, c.heads // c.kv_heads
    freq = [1.0 / c.theta ** (2 * j / hd) for j in range(hd // 2)]

    def norm(x, w):
        return x / math.sqrt(float(np.mean(x * x)) + c.eps) * w

    def rot(v, t):
        v = v.copy()
        for j, f in enumerate(freq):
            a, b = v[2 * j], v[2 * j + 1]
            co, si = math.cos(t * f), math.sin(t * f)
            v[2 * j], v[2 * j + 1] = a * co - b * si, a * si + b * co
        return v

    K = {o: [] for o in range(c.layers)}
    V = {o: [] for o in range(c.layers)}
    out = []
    for t, tok in enumerate(tokens):
        x = W["emb"][tok].copy()
        for i in range(c.layers):
            p = f"blocks.{i}."
            h = norm(x, W[p + "attn_norm"])
            q = (W[p + "wq"] @ h).reshape(c.heads, hd)
            q = np.stack([rot(q[j], t) for j in range(c.heads)])
            if c.owns(i):
                k = (W[p + "wk"] @ h).reshape(c.kv_heads, hd)
                K[i].append(np.stack([rot(k[j], t) for j in range(c.kv_heads)]))
                V[i].append((W[p + "wv"] @ h).reshape(c.kv_heads, hd))
            s, win = c.src(i), c.win(i)
            att = np.zeros((c.heads, hd))
            for hh in range(c.heads):
                g = hh // G
                scores, vals = [], []
                for j in range(len(K[s])):
                    visible = (j < t) if s > i else (j <= t)
                    if visible and (win == 0 or t - j < win):
                        scores.append(float(q[hh] @ K[s][j][g]) / math.sqrt(hd))
                        vals.append(V[s][j][g])
                if s > i:  # the dummy slot: key and value of zeros
                    scores.append(0.0)
                    vals.append(np.zeros(hd))
                e = np.exp(np.array(scores) - max(scores))
                att[hh] = (e / e.sum()) @ np.stack(vals)
            x = x + W[p + "wo"] @ att.reshape(-1)
            h = norm(x, W[p + "ffn_norm"])
            g_ = W[p + "w_gate"] @ h
            x = x + W[p + "w_down"] @ (g_ / (1 + np.exp(-g_)) * (W[p + "w_up"] @ h))
        out.append(W["emb"] @ norm(x, W["out_norm"]))
    return np.stack(out)


class ForwardTest(unittest.TestCase):
    def test_reference(self):
        """forward_sequential (and forward where exact) equal the float64
        reference for every architecture."""
        toks = [1, 5, 77, 300, 12, 9, 511, 42, 42, 3, 250, 7]
        for arch in ARCHS:
            with self.subTest(arch=arch):
                m = small(arch, passes=len(toks))
                want = reference(m, toks)
                t = torch.tensor([toks])
                got = m.forward_sequential(t)[0].double().numpy()
                scale = np.abs(want).max()
                self.assertGreater(scale, 1.0)
                self.assertLess(np.abs(got - want).max(), 1e-5 * scale, "sequential")
                with torch.no_grad():
                    par = m(t)[0].double().numpy()
                self.assertLess(np.abs(par - want).max(), 1e-5 * scale, "parallel")

    def test_reference_sees_the_map(self):
        """The reference is not blind to the map: a map architecture's
        logits differ from the plain ones computed as if every layer read
        its own KV (with its source's projections)."""
        toks = [1, 5, 77, 300, 12, 9, 511, 42]
        for arch in ("cla2", "yoco", "lckv", "local-global"):
            with self.subTest(arch=arch):
                m = small(arch, passes=len(toks))
                want = reference(m, toks)
                plain = small("gqa")
                sd = plain.state_dict()
                for k, v in m.state_dict().items():
                    if k in sd:
                        sd[k] = v
                for i in range(6):
                    s = m.c.src(i)
                    sd[f"blocks.{i}.wk"] = m.state_dict()[f"blocks.{s}.wk"]
                    sd[f"blocks.{i}.wv"] = m.state_dict()[f"blocks.{s}.wv"]
                plain.load_state_dict(sd)
                other = reference(plain, toks)
                self.assertGreater(np.abs(other - want).max(), 1e-2)

    def test_rope_tables(self):
        c = arch_config("gqa", ctx=300)
        cos, sin = rope_tables(c, 300)
        hd = c.head_dim
        for p in (0, 1, 17, 299):
            for j in range(hd // 2):
                a = p / c.theta ** (2 * j / hd)
                self.assertAlmostEqual(cos[p, j].item(), math.cos(a), delta=2e-5)
                self.assertAlmostEqual(sin[p, j].item(), math.sin(a), delta=2e-5)

    def test_lckv_passes(self):
        """Iterative parallel passes: exact after as many passes as tokens;
        one pass (every backward read sees zeros) is not."""
        T = 10
        m = small("lckv", ctx=T)
        t = torch.randint(0, 512, (2, T), generator=torch.Generator().manual_seed(3))
        seq = m.forward_sequential(t)
        with torch.no_grad():
            full = m(t, passes=T)
            one = m(t, passes=1, grad_passes=1)
        self.assertLess((full - seq).abs().max().item(), 1e-4)
        self.assertGreater((one - seq).abs().max().item(), 1e-2)

    def test_lckv_grad_passes(self):
        """The loss does not depend on how many passes carry gradients; the
        gradients do."""
        m = small("lckv", ctx=10, scale=1.0)
        t = torch.randint(0, 512, (2, 10), generator=torch.Generator().manual_seed(4))
        grads, losses = [], []
        for b in (1, 2):
            m.zero_grad()
            loss = m(t, passes=4, grad_passes=b).logsumexp(-1).mean()
            loss.backward()
            losses.append(loss.item())
            grads.append(m.blocks[5].wk.grad.clone())
        self.assertEqual(losses[0], losses[1])
        self.assertGreater((grads[0] - grads[1]).abs().max().item(), 0)


class TrainTest(unittest.TestCase):
    ARGS = ["--ctx", "32", "--batch", "2", "--eval-windows", "2", "--threads", "1", "--dim", "32", "--hidden", "48",
            "--window", "8", "--passes", "3", "--log-every", "1"]

    def run_train(self, out, arch, steps, *extra):
        import train
        train.main(["--arch", arch, "--out", out, "--steps", str(steps)] + self.ARGS + list(extra))

    def test_resume_is_bitwise(self):
        """A run stopped after step 2 and resumed ends bit for bit where an
        unbroken run does; two unbroken runs agree (seeded)."""
        with tempfile.TemporaryDirectory() as d:
            a, b, e = (os.path.join(d, n) for n in "abe")
            self.run_train(a, "lckv", 4, "--no-export")
            self.run_train(b, "lckv", 4, "--no-export")
            self.run_train(e, "lckv", 4, "--no-export", "--stop-after", "2")
            self.assertEqual(torch.load(os.path.join(e, "ckpt.pt"))["step"], 2)
            self.run_train(e, "lckv", 4, "--no-export", "--resume")
            ca, cb, ce = (torch.load(os.path.join(x, "ckpt.pt")) for x in (a, b, e))
            self.assertEqual(ce["step"], 4)
            for k, v in ca["model"].items():
                self.assertTrue(torch.equal(v, ce["model"][k]), "resumed " + k)
                self.assertTrue(torch.equal(v, cb["model"][k]), "rerun " + k)

    def test_refuses_other_recipe(self):
        with tempfile.TemporaryDirectory() as d:
            self.run_train(d, "gqa", 1, "--no-export")
            with self.assertRaises(SystemExit) as e:
                self.run_train(d, "gqa", 1, "--no-export", "--resume", "--lr", "1e-4")
            self.assertIn("another recipe", str(e.exception))
            with self.assertRaises(SystemExit) as e:
                self.run_train(d, "gqa", 1, "--no-export")
            self.assertIn("--resume", str(e.exception))

    def test_export(self):
        with tempfile.TemporaryDirectory() as d:
            self.run_train(d, "cla3", 1)
            meta, tensors = gguf.read(os.path.join(d, "model.gguf"))
            self.assertEqual(meta["llama.attention.kv_source"].value, [0, 0, 0, 3, 3, 3])
            self.assertNotIn("llama.attention.layer_window", meta)
            for i in range(6):
                self.assertEqual(f"blk.{i}.attn_k.weight" in tensors, i in (0, 3), i)
                self.assertEqual(f"blk.{i}.attn_v.weight" in tensors, i in (0, 3), i)
            self.assertNotIn("output.weight", tensors)
            ck = torch.load(os.path.join(d, "ckpt.pt"))
            np.testing.assert_array_equal(tensors["blk.3.attn_k.weight"], ck["model"]["blocks.3.wk"].numpy())
            np.testing.assert_array_equal(tensors["token_embd.weight"], ck["model"]["emb"].numpy())
            self.assertEqual(meta["tokenizer.ggml.tokens"].value[:3], ["<unk>", "<s>", "</s>"])
            self.assertEqual(meta["kvlm.train.heldout_bytes"].value, list(data.HELDOUT))
            self.assertEqual(meta["kvlm.train.tokens"].value, 1 * 2 * 32)

    def test_export_now(self):
        """--resume --export-now exports a stopped run's checkpoint as it
        is: its steps and tokens, not the recipe's."""
        with tempfile.TemporaryDirectory() as d:
            self.run_train(d, "gqa", 4, "--stop-after", "2")
            self.assertFalse(os.path.exists(os.path.join(d, "model.gguf")))
            self.run_train(d, "gqa", 4, "--resume", "--export-now")
            rec = read_json(os.path.join(d, "record.json"))
            meta, _ = gguf.read(os.path.join(d, "model.gguf"))
            self.assertEqual((rec["steps_done"], rec["tokens_seen"]), (2, 2 * 2 * 32))
            self.assertEqual(meta["kvlm.train.steps"].value, 2)
            with self.assertRaises(SystemExit):
                self.run_train(os.path.join(d, "x"), "gqa", 4, "--export-now")

    def test_init(self):
        """--init loads a GGUF's weights exactly: their held-out NLL before
        training is the NLL the exporting run recorded; a file of another
        shape is refused."""
        with tempfile.TemporaryDirectory() as d:
            a, b = os.path.join(d, "a"), os.path.join(d, "b")
            self.run_train(a, "gqa", 2)
            self.run_train(b, "gqa", 1, "--init", os.path.join(a, "model.gguf"))
            ra, rb = (read_json(os.path.join(x, "record.json")) for x in (a, b))
            self.assertEqual(rb["init_heldout_nll"], ra["heldout"]["mean_nll"])
            meta, _ = gguf.read(os.path.join(b, "model.gguf"))
            self.assertEqual(meta["kvlm.train.init"].value, os.path.join(a, "model.gguf"))
            with self.assertRaises(SystemExit) as e:
                self.run_train(os.path.join(d, "c"), "mha", 1, "--init", os.path.join(a, "model.gguf"))
            self.assertIn("shape", str(e.exception))

    def test_grow(self):
        """--grow places the file's layers at the model's other layers in
        order, leaves the grown ones to the model (the trainer zeroes their
        output projections, and a step trains them), records the grown
        layers in the recipe; a layer count that does not fit, and --grow
        without --init, are refused."""
        import train
        from export import load
        with tempfile.TemporaryDirectory() as d:
            a, b = os.path.join(d, "a"), os.path.join(d, "b")
            self.run_train(a, "gqa", 2, "--layers", "3")
            _, ta = gguf.read(os.path.join(a, "model.gguf"))
            g = train.parse(["--arch", "gqa", "--out", b, "--steps", "1", "--layers", "5", "--grow", "3,1",
                             "--init", os.path.join(a, "model.gguf")] + self.ARGS)
            self.assertEqual(g.grow_layers, [1, 3])
            m = Transformer(train.config_of(g))
            load(g.init, m, g.grow_layers)
            for new, old in ((0, 0), (2, 1), (4, 2)):
                for ours, theirs in (("wq", "attn_q"), ("wk", "attn_k"), ("w_down", "ffn_down")):
                    np.testing.assert_array_equal(getattr(m.blocks[new], ours).detach().numpy(),
                                                  ta[f"blk.{old}.{theirs}.weight"])
            self.run_train(b, "gqa", 1, "--layers", "5", "--grow", "1,3", "--init", os.path.join(a, "model.gguf"),
                           "--no-export")
            ck = torch.load(os.path.join(b, "ckpt.pt"))
            self.assertEqual(ck["recipe"]["grow"], [1, 3])
            self.assertGreater(float(ck["model"]["blocks.1.wo"].abs().max()), 0, "one step trains the grown layer")
            for bad in (["--layers", "4", "--grow", "1,3"], ["--layers", "5", "--grow", "1"],
                        ["--layers", "5", "--grow", "1,5"]):
                with self.assertRaises(SystemExit):
                    self.run_train(os.path.join(d, "c"), "gqa", 1, "--init", os.path.join(a, "model.gguf"),
                                   "--no-export", *bad)
            with self.assertRaises(SystemExit):
                self.run_train(os.path.join(d, "e"), "gqa", 1, "--layers", "5", "--grow", "1,3", "--no-export")

    def test_grow_starts_as_identity(self):
        """The trainer's step-0 model under --grow computes the file's
        logits: the NLL it records before training is the file's."""
        with tempfile.TemporaryDirectory() as d:
            a, b = os.path.join(d, "a"), os.path.join(d, "b")
            self.run_train(a, "mqa", 2, "--layers", "2")
            self.run_train(b, "mqa", 1, "--layers", "4", "--grow", "0,3", "--init", os.path.join(a, "model.gguf"))
            ra, rb = (read_json(os.path.join(x, "record.json")) for x in (a, b))
            self.assertAlmostEqual(rb["init_heldout_nll"], ra["heldout"]["mean_nll"], places=6)
            self.assertEqual(rb["recipe"]["grow"], [0, 3])
            meta, _ = gguf.read(os.path.join(b, "model.gguf"))
            self.assertEqual(json.loads(meta["kvlm.train.recipe"].value)["grow"], [0, 3])

    def test_split(self):
        self.assertEqual(data.TRAIN[1], data.HELDOUT[0])
        held = data.text_bytes(*data.HELDOUT)
        self.assertTrue(held.startswith(b"Once upon a time, there was a little girl. She liked to have fun and play."))
        self.assertTrue(data.text_bytes(0, data.TRAIN[1]).endswith(b"\n\n"))


class Oracle:
    """A stand-in model whose logits are one-hot on each sequence's true
    next token (the sequences it was given), for checking the scoring."""

    def __init__(self, seqs, vocab=512):
        self.seqs, self.vocab = seqs, vocab

    def exact_logits(self, x):
        out = torch.zeros(x.shape[0], x.shape[1], self.vocab)
        for b, row in enumerate(x.tolist()):
            seq = next((s for s in self.seqs if s[:len(row)] == row or s[:-1] == row[:len(s) - 1]), None)
            for t in range(min(len(row), len(seq) - 1)):
                out[b, t, seq[t + 1]] = 1.0
        return out


class RecallTest(unittest.TestCase):
    SAMPLES = [{"prompt": [1, 10, 11, 12, 13], "answer": [20, 21, 22]},
               {"prompt": [1, 30, 31], "answer": [40, 41]}]

    def test_rows(self):
        """Inputs are the sequence without its last token, targets shifted
        by one, PAD past a short sample's end; the answer mask selects
        exactly the answer's tokens as targets."""
        x, y, ans = recall.rows(self.SAMPLES, 8)
        self.assertEqual(x[0].tolist(), [1, 10, 11, 12, 13, 20, 21, 0])
        self.assertEqual(y[0].tolist(), [10, 11, 12, 13, 20, 21, 22, recall.PAD])
        self.assertEqual(y[1].tolist(), [30, 31, 40, 41] + [recall.PAD] * 4)
        for r, s in enumerate(self.SAMPLES):
            self.assertEqual(y[r][ans[r]].tolist(), s["answer"])
        with self.assertRaises(SystemExit):
            recall.rows(self.SAMPLES, 6)

    def test_accuracy_is_greedy_exact_match(self):
        """Teacher-forced scoring counts a sample right iff greedy decoding
        would produce its whole answer: an oracle scores 1, one whose
        answer differs in one (last) token scores 0 on that sample."""
        seqs = [s["prompt"] + s["answer"] for s in self.SAMPLES]
        self.assertEqual(recall.accuracy(Oracle(seqs), self.SAMPLES), 1.0)
        wrong = [seqs[0][:-1] + [23], seqs[1]]
        self.assertEqual(recall.accuracy(Oracle(wrong), self.SAMPLES), 0.5)

    def test_curriculum(self):
        """256-token rows for the first 30%, then the full context with
        every fourth step at 256; the single needle's depths start near
        the question and cover every depth from 30% on."""
        ctxs = [recall.step_context(s, 100, 512) for s in range(100)]
        self.assertEqual(set(ctxs[:30]), {256})
        self.assertEqual(ctxs[30:36], [512, 256, 512, 512, 512, 256])
        self.assertAlmostEqual(recall.depth_floor(0.0), 0.8)
        self.assertEqual(recall.depth_floor(0.3), 0.0)
        floors = [recall.depth_floor(f / 10) for f in range(11)]
        self.assertEqual(floors, sorted(floors, reverse=True))

    def test_custom_curriculum(self):
        """--recall-curriculum's stages, refused when malformed; a pool
        leaves out the tasks that do not fit its length (at 64 tokens only
        the single needle does)."""
        cur = recall.parse_curriculum("64:0.1,128:0.25,512", 512)
        self.assertEqual(cur, [(64, 0.1), (128, 0.25), (512, 1.0)])
        ctxs = [recall.step_context(s, 100, 512, cur) for s in range(100)]
        self.assertEqual((set(ctxs[:10]), set(ctxs[10:25]), ctxs[25:29]), ({64}, {128}, [512, 512, 256, 512]))
        for bad in ("64:0.5,128:0.2,512", "16:0.1,512", "64:0.1,1024", "64:0.1,128:0.5", "x,512"):
            with self.assertRaises(SystemExit, msg=bad):
                recall.parse_curriculum(bad, 512)
        self.assertEqual(recall.Pool(64, 21).tasks, ["niah_single"])

    def test_task_weights(self):
        """--recall-task-weight replaces the named tasks' shares and keeps
        the others'; a pool draws by them (a zero share never drawn)."""
        w = recall.parse_task_weights("niah_single=0,vt=2")
        self.assertEqual((w["niah_single"], w["vt"], w["cwe"]), (0.0, 2.0, recall.TASK_WEIGHT["cwe"]))
        for bad in ("nope=1", "vt", "vt=x", "vt=-1", ",".join(f"{t}=0" for t in recall.TASKS)):
            with self.assertRaises(SystemExit, msg=bad):
                recall.parse_task_weights(bad)
        pool = recall.Pool(64, 21)  # the single needle alone fits 64 tokens
        with self.assertRaises(SystemExit):  # its share 0: nothing to draw
            pool.draw(np.random.default_rng(0), 4, 0.0, w)
        x, _, _ = pool.draw(np.random.default_rng(0), 4, 0.0, recall.parse_task_weights("niah_single=3"))
        self.assertEqual(x.shape[0], 4)

    def test_recall_batch(self):
        """A recall batch holds batch·ctx/L rows of the curriculum's length
        L, the --recall share of them from the pool, and is a function of
        (seed, step)."""
        import train

        class FakePool:
            def draw(self, rng, n, floor, weights=None):
                x, y, a = recall.rows(RecallTest.SAMPLES * n, 256)
                return x[:n], y[:n], a[:n]

        a = train.parse(["--arch", "gqa", "--out", "/nonexistent", "--steps", "10", "--ctx", "512", "--batch", "4",
                         "--recall", "0.5"])
        ids = np.arange(5000) % 500
        x, y, ans = train.recall_batch(a, ids, {256: FakePool()}, 0)
        self.assertEqual(tuple(x.shape), (8, 256))
        self.assertEqual(int(ans.any(dim=1).sum()), 4)
        self.assertTrue(torch.equal(x[:4, 0], torch.full((4,), data.BOS)))
        x2, _, _ = train.recall_batch(a, ids, {256: FakePool()}, 0)
        self.assertTrue(torch.equal(x, x2))


class DenseTest(unittest.TestCase):
    """Dense key-value rows (dense.py): made of the suite's own pieces, and
    every answer is what the row's facts say, read back by a small reader
    written here."""

    @classmethod
    def setUpClass(cls):
        cls.p = dense.Pieces()

    def key_at(self, ids, end, pre, post):
        """The word w with ids[..end] ending in pre + w + post (the longest
        such word), or None."""
        for w in sorted(self.p.words, key=len, reverse=True):
            seq = pre + w + post
            if end >= len(seq) and ids[end - len(seq):end] == seq:
                return tuple(w)
        return None

    def facts(self, ids, pre, post, value_len):
        """[(word, value)] of every pre + w + post + value + dot in ids, in order."""
        out = []
        for w in self.p.words:
            seq = pre + w + post
            for i in range(len(ids) - len(seq) - value_len):
                if ids[i:i + len(seq)] == seq and ids[i + len(seq) + value_len] == self.p.dot:
                    out.append((i, tuple(w), ids[i + len(seq):i + len(seq) + value_len]))
        return [(w, v) for _, w, v in sorted(out, key=lambda e: e[0])]

    def spans(self, x, y, ans):
        """The row's ids (BOS + …) and its answer spans [s, e) in them."""
        m = int((y != recall.PAD).sum())
        ids = [int(t) for t in x[:1]] + [int(t) for t in y[:m]]
        out, t = [], 0
        while t < m:
            if ans[t]:
                s = t
                while t < m and ans[t]:
                    t += 1
                out.append((s + 1, t + 1))
            t += 1
        return ids, out

    def check(self, fmt, x, y, ans):
        p = self.p
        ids, spans = self.spans(x, y, ans)
        self.assertEqual(ids[0], data.BOS)
        self.assertTrue(spans, fmt)
        first = spans[0][0]
        head = ids[:first]  # the facts, and the first question
        if fmt in ("g0", "g1", "g2", "key"):
            pre = {"g0": [p.dot], "g1": [p.dot], "g2": [p.dot], "key": p.fact}[fmt]
            post = p.is_ if fmt in ("g2", "key") else []
            vlen = 4 if fmt == "g0" else 5
            facts = dict(self.facts(head, pre if fmt == "key" else [], post, vlen))
            for s, e in spans:
                w = self.key_at(ids, s, pre, post)
                self.assertIsNotNone(w, (fmt, s))
                self.assertEqual(ids[s:e], facts[w], fmt)
            self.assertEqual(len(spans), len(facts), fmt)  # every key asked once
        elif fmt == "multi":
            facts = self.facts(head, p.fact, p.is_, 5)
            asked = []
            i = 0
            while i < len(spans):
                w = self.key_at(ids, spans[i][0], p.facts, p.are)
                self.assertIsNotNone(w)
                want = [v for k, v in facts if k == w]
                got = [ids[s:e] for s, e in spans[i:i + len(want)]]
                self.assertEqual(got, want)
                asked.append(w)
                i += len(want)
            self.assertEqual(sorted(asked), sorted({k for k, _ in facts}))
        elif fmt == "are":
            facts = dict(self.facts(head, p.fact, p.is_, 5))
            i, asked = 0, []
            while i < len(spans):
                s = spans[i][0]
                self.assertEqual(ids[s - len(p.are):s], p.are)
                q = ids[:s - len(p.are)]
                start = max(j for j in range(len(q)) if q[j:j + len(p.facts)] == p.facts) + len(p.facts)
                keys = [k for k in q[start:] if k not in (p.comma, *p.and_)]
                words = []
                while keys:  # the listed words, longest match first
                    w = next(w for w in sorted(p.words, key=len, reverse=True) if keys[:len(w)] == w)
                    words.append(tuple(w))
                    keys = keys[len(w):]
                self.assertTrue(2 <= len(words) <= 4 or i + len(words) == len(spans))
                for w, (s, e) in zip(words, spans[i:i + len(words)]):
                    self.assertEqual(ids[s:e], facts[w])
                i += len(words)
                asked += words
            self.assertEqual(sorted(asked), sorted(facts))  # every key asked once
        elif fmt in ("vt", "vt1", "vt2"):
            assign = {}
            for i in range(len(head)):
                if head[i:i + len(p.var)] == p.var:
                    j = i + len(p.var)
                    w = tuple(next(w for w in sorted(p.words, key=len, reverse=True) if head[j:j + len(w)] == w))
                    j += len(w)
                    self.assertEqual(head[j:j + len(p.eq)], p.eq)
                    j += len(p.eq)
                    end = head.index(p.dot, j)
                    self.assertNotIn(w, assign)  # a name assigned once
                    assign[w] = head[j:end]
            for s, e in spans:
                w = self.key_at(ids, s, p.value_of, p.is_)
                v = assign[w]
                for _ in range(3):  # follow the chain (at most three hops)
                    if v[0] == p.space:
                        break
                    v = assign[tuple(v)]
                self.assertEqual(ids[s:e], v)
                self.assertEqual(v[0], p.space)

            def depth(v):  # assignments from a name's right-hand side to its value
                return 1 if v[0] == p.space else 1 + depth(assign[tuple(v)])
            self.assertLessEqual(max(depth(v) for v in assign.values()), {"vt": 3, "vt1": 1, "vt2": 2}[fmt])

    def reads_as(self, fmt, x, y, ans):
        """Whether check(fmt) accepts the row."""
        try:
            self.check(fmt, x, y, ans)
        except (AssertionError, KeyError, StopIteration, ValueError):
            return False
        return True

    def test_rows_answer_their_facts(self):
        """Every format at 256 and 512 tokens: the row fits, targets are the
        inputs shifted by one, and every answer is the value its facts
        give the asked key (name)."""
        rng = np.random.default_rng(5)
        for L in (256, 512):
            for fmt in dense.FORMATS:
                with self.subTest(L=L, fmt=fmt):
                    for _ in range(20):
                        x, y, ans = dense.row(self.p, rng, fmt, L)
                        m = int((y != recall.PAD).sum())
                        self.assertEqual(x[1:m].tolist(), y[:m - 1].tolist())
                        self.assertFalse(ans[m:].any())
                        self.check(fmt, x, y, ans)

    def test_reader_can_fail(self):
        """The reader above refuses a row whose answer is another key's."""
        x, y, ans = dense.row(self.p, np.random.default_rng(1), "key", 256)
        ids, spans = self.spans(x, y, ans)
        (s0, e0), (s1, e1) = spans[0], spans[1]
        y = y.copy()
        y[s0 - 1:e0 - 1], y[s1 - 1:e1 - 1] = ids[s1:e1], ids[s0:e0]
        with self.assertRaises(AssertionError):
            self.check("key", x, y, ans)

    def test_pieces_are_the_suites(self):
        """The rows' sentences are the suite's: a niah_multikey prompt ends
        with the question the key rows ask (fact + key + is) and holds the
        asked needle as a key row's fact; niah_multiquery's, multivalue's
        and vt's prompts end as the are, multi and vt rows' questions."""
        p = self.p
        s = recall.generate("niah_multikey", 256, 0, 1, haystack="heldout")[0]
        w = self.key_at(s["prompt"], len(s["prompt"]), p.fact, p.is_)
        self.assertIsNotNone(w)
        self.assertIn((w, s["answer"]), self.facts(s["prompt"], p.fact, p.is_, 5))
        s = recall.generate("niah_multiquery", 256, 0, 1, haystack="heldout")[0]
        self.assertEqual(s["prompt"][-len(p.are):], p.are)
        self.assertEqual(s["answer"][5], p.comma)
        s = recall.generate("niah_multivalue", 256, 0, 1, haystack="heldout")[0]
        self.assertIsNotNone(self.key_at(s["prompt"], len(s["prompt"]), p.facts, p.are))
        s = recall.generate("vt", 256, 0, 1, haystack="heldout")[0]
        w = self.key_at(s["prompt"], len(s["prompt"]), p.value_of, p.is_)
        self.assertIsNotNone(w)
        seq = p.var + list(w) + p.eq
        self.assertTrue(any(s["prompt"][i:i + len(seq)] == seq for i in range(len(s["prompt"]))))

    def test_stages(self):
        """--dense's stages, refused when malformed."""
        st = dense.parse_stages("g0:0.1,key:0.4,mix")
        self.assertEqual(st, [("g0", 0.1), ("key", 0.4), ("mix", 1.0)])
        self.assertEqual([dense.stage_at(st, f) for f in (0, 0.1, 0.39, 0.4, 0.99)], ["g0", "key", "key", "mix", "mix"])
        for bad in ("mix:0.5,key", "g0:0.5,g1:0.2,key", "nope:0.1,key", "g0:0.1,key:0.5", "g0:x,key"):
            with self.assertRaises(SystemExit, msg=bad):
                dense.parse_stages(bad)
        self.assertEqual(dense.parse_mix("vt2,multi,multi"), ("vt2", "multi", "multi"))
        import train
        base = ["--arch", "gqa", "--out", "/nonexistent", "--steps", "10", "--recall", "0.5"]
        a = train.parse(base + ["--dense", "g1:0.5,mix", "--dense-mix", "vt,vt2"])
        self.assertEqual((a.mix, a.dense_share), (("vt", "vt2"), 0.5))
        for bad in ([], ["--dense", "g1:0.5,key"]):  # no mix stage reads them: refused, not ignored
            for flag in (["--dense-share", "0.3"], ["--dense-mix", "vt"]):
                with self.assertRaises(SystemExit, msg=(bad, flag)):
                    train.parse(base + bad + flag)
        with self.assertRaises(SystemExit):
            dense.parse_mix("vt,mix")

    def test_recall_batch_dense(self):
        """With --dense, a dense stage's batch is all dense rows of its
        format; the mix stage's holds --dense-share dense rows, then the
        --recall rows; each a function of (seed, step)."""
        import train

        class FakePool:
            def draw(self, rng, n, floor, weights=None):
                x, y, a = recall.rows(RecallTest.SAMPLES * n, 256)
                return x[:n], y[:n], a[:n]

        a = train.parse(["--arch", "gqa", "--out", "/nonexistent", "--steps", "10", "--ctx", "256", "--batch", "8",
                         "--recall", "0.5", "--dense", "g1:0.5,mix", "--dense-share", "0.25"])
        ids = np.arange(5000) % 500
        x, y, ans = train.recall_batch(a, ids, {256: FakePool()}, 0, self.p)
        self.assertEqual(tuple(x.shape), (8, 256))
        for r in range(8):
            self.check("g1", x[r].numpy(), y[r].numpy(), ans[r].numpy())
        x, y, ans = train.recall_batch(a, ids, {256: FakePool()}, 7, self.p)
        for r in range(2):  # the dense rows: each reads back as one of the mix's formats
            self.assertTrue(any(self.reads_as(f, x[r].numpy(), y[r].numpy(), ans[r].numpy()) for f in dense.MIX))
        self.assertFalse(self.reads_as("key", x[2].numpy(), y[2].numpy(), ans[2].numpy()))  # a story window
        self.assertEqual(x[2:, 0].tolist(), [data.BOS] * 6)
        self.assertEqual(int(ans[2:].any(dim=1).sum()), 3)  # half of the six from the pool, three story windows
        x2, _, _ = train.recall_batch(a, ids, {256: FakePool()}, 7, self.p)
        self.assertTrue(torch.equal(x, x2))


if __name__ == "__main__":
    unittest.main()
