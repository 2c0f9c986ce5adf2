"""A tiny Llama-family transformer whose forward pass is kvlm's (model/).

- RMSNorm: x / sqrt(mean(x²) + eps) · w, before attention and FFN and at
  the output (eps 1e-5, kvlm's default when the GGUF has none).
- RoPE: GGUF architecture "llama", interleaved pairs (x[2j], x[2j+1]) of
  each head rotated by p·f_j, f_j = 1/θ^(2j/head_dim) in float32 as
  kvlm's Config.RopeFreqs computes it; the weights are stored unpermuted.
- Attention: GQA, query head h reads KV head h // (heads/kv_heads); scores
  divided by sqrt(head_dim); causal, and within a window W a key at
  position j is visible to the query at p iff 0 ≤ p − j < W.
- SwiGLU FFN: w_down(silu(w_gate x) · w_up x); residuals around both.
- The classifier is tied to the token embedding (no output.weight).

The KV source map (model/kvmap.go): layer i attends the KV of layer
src[i]; only owners (layers some layer reads) have K/V projections. src[i] <
i reads an earlier layer's KV, the current token included; src[i] > i
(Layer-Condensed KV) reads a later layer's KV with the diagonal masked
plus one dummy key and value of zeros (score 0, value 0).

Two forward passes:
- forward(): all positions at once. With src[i] > i somewhere it is
  Layer-Condensed KV's iterative parallel training (arXiv 2405.10637): the
  layers from the first backward reader up run `passes` times, pass k
  reading the KV its sources produced in pass k−1 (pass 0 reads zeros),
  gradients through the last `grad_passes` passes only.
- forward_sequential(): token by token over a KV cache, the exact
  computation (what kvlm runs); used for evaluation and as the reference.
"""

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    dim: int = 64            # embedding width
    layers: int = 6          # transformer blocks
    heads: int = 4           # query heads
    kv_heads: int = 2        # key/value heads
    hidden: int = 192        # SwiGLU inner width
    ctx: int = 256           # trained context length
    vocab: int = 512         # tok512
    eps: float = 1e-5        # RMSNorm epsilon
    theta: float = 10000.0   # RoPE base
    kv_source: list = None   # [layers] src[i]; None: identity
    layer_window: list = None  # [layers] window (0 full); None: all 0
    passes: int = 7          # Layer-Condensed KV: parallel passes m (training)
    grad_passes: int = 2     # Layer-Condensed KV: passes b with gradients
    arch: str = "gqa"        # the zoo name of the configuration

    @property
    def head_dim(self):
        return self.dim // self.heads

    def src(self, i):
        return i if self.kv_source is None else self.kv_source[i]

    def win(self, i):
        return 0 if self.layer_window is None else self.layer_window[i]

    def owns(self, i):
        return self.kv_source is None or i in self.kv_source

    def owners(self):
        return [i for i in range(self.layers) if self.owns(i)]

    def backward_readers(self):
        return [i for i in range(self.layers) if self.src(i) > i]

    def validate(self):
        if self.dim % self.heads or self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError(f"bad head shape: dim {self.dim}, heads {self.heads}, kv heads {self.kv_heads}")
        for name, v in (("kv_source", self.kv_source), ("layer_window", self.layer_window)):
            if v is not None and len(v) != self.layers:
                raise ValueError(f"{name} has {len(v)} entries for {self.layers} layers")
        for i in range(self.layers):
            s = self.src(i)
            if not 0 <= s < self.layers or self.src(s) != s:
                raise ValueError(f"kv_source[{i}] = {s}: a source must be a layer reading its own KV")
            if self.win(i) < 0:
                raise ValueError(f"layer_window[{i}] = {self.win(i)} is negative")
        if self.grad_passes < 1 or self.passes < self.grad_passes:
            raise ValueError(f"passes {self.passes} must be ≥ grad_passes {self.grad_passes} ≥ 1")

    def kv_bytes(self, tokens, bytes_per_value=4):
        """KV bytes of a sequence of `tokens` tokens: owner layers only, a
        cache layer read only by windowed layers holding at most its largest
        window (Config.CacheWindows in kvlm)."""
        total = 0
        for o in self.owners():
            readers = [i for i in range(self.layers) if self.src(i) == o]
            w = 0 if any(self.win(i) == 0 for i in readers) else max(self.win(i) for i in readers)
            total += min(tokens, w) if w else tokens
        return total * 2 * self.kv_heads * self.head_dim * bytes_per_value

    def to_dict(self):
        return asdict(self)


def arch_config(arch, dim=64, layers=6, heads=4, hidden=192, ctx=256, window=64, passes=7, grad_passes=2):
    """The zoo's configurations of the KV source map (CONTRACT21's gen-model
    shapes): every one on the same width, depth and heads; the map ones on
    GQA (kv_heads = heads/2) unless named -mqa."""
    L = layers
    kvh, src, win = heads // 2, None, None
    if arch == "mha":
        kvh = heads
    elif arch == "gqa":
        pass
    elif arch == "mqa":
        kvh = 1
    elif arch in ("cla2", "cla3", "cla2-mqa"):
        g = 3 if arch == "cla3" else 2
        src = [i - i % g for i in range(L)]
        if arch == "cla2-mqa":
            kvh = 1
    elif arch == "yoco":
        # Self-decoder: the lower half, sliding window; cross-decoder: the
        # first upper layer owns one global KV that every later layer reads.
        h = L // 2
        src = [i if i <= h else h for i in range(L)]
        win = [window if i < h else 0 for i in range(L)]
    elif arch == "lckv":
        # Two warmup layers at the bottom; every other layer reads the top.
        src = [i if i < 2 or i == L - 1 else L - 1 for i in range(L)]
    elif arch == "local-global":
        # Gemma-style 5:1: every sixth layer global, the others windowed.
        win = [0 if i % 6 == 5 else window for i in range(L)]
    else:
        raise ValueError(f"unknown architecture {arch!r} (known: {', '.join(ARCHS)})")
    c = Config(dim=dim, layers=L, heads=heads, kv_heads=kvh, hidden=hidden, ctx=ctx,
               kv_source=src, layer_window=win, passes=passes, grad_passes=grad_passes, arch=arch)
    c.validate()
    return c


ARCHS = ["mha", "gqa", "mqa", "cla2", "cla3", "cla2-mqa", "yoco", "lckv", "local-global"]


def rope_tables(c, n):
    """cos, sin [n, head_dim/2] float32, computed as kvlm does: f_j =
    1/float32(θ^(float32(2j)/float32(hd))), angle float32(p)·f_j in float32,
    cos/sin in float64 of that angle, rounded to float32."""
    hd = c.head_dim
    j = np.arange(hd // 2)
    expo = (np.float32(2) * j.astype(np.float32) / np.float32(hd)).astype(np.float64)
    freq = np.float32(1) / np.power(np.float64(np.float32(c.theta)), expo).astype(np.float32)
    ang = np.arange(n, dtype=np.float32)[:, None] * freq[None, :]
    return (torch.from_numpy(np.cos(ang.astype(np.float64)).astype(np.float32)),
            torch.from_numpy(np.sin(ang.astype(np.float64)).astype(np.float32)))


def rope(x, cos, sin):
    """Rotates interleaved pairs of x [..., T, heads, hd] by cos/sin [T, hd/2]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def attend(q, k, v, bias, dummy, kvh):
    """q [B, T, H, hd], k, v [B, S, KVH, hd], bias [T, S] (0 or -inf);
    dummy adds one key and value of zeros. Returns [B, T, H·hd]."""
    B, T, H, hd = q.shape
    S, G = k.shape[1], H // kvh
    qg = q.view(B, T, kvh, G, hd).permute(0, 2, 3, 1, 4).reshape(B, kvh, G * T, hd)
    kt = k.permute(0, 2, 3, 1)  # [B, KVH, hd, S]
    vt = v.permute(0, 2, 1, 3)  # [B, KVH, S, hd]
    sc = torch.matmul(qg, kt) / math.sqrt(hd)  # [B, KVH, G·T, S]
    sc = (sc.view(B, kvh, G, T, S) + bias).view(B, kvh, G * T, S)
    if dummy:
        sc = torch.cat((sc, sc.new_zeros(B, kvh, G * T, 1)), dim=-1)
        p = torch.softmax(sc, dim=-1)[..., :S]
    else:
        p = torch.softmax(sc, dim=-1)
    o = torch.matmul(p, vt)  # [B, KVH, G·T, hd]
    return o.view(B, kvh, G, T, hd).permute(0, 3, 1, 2, 4).reshape(B, T, H * hd)


def mask_bias(q_pos, k_pos, window, strict):
    """[len(q_pos), len(k_pos)] additive mask: 0 where the key at j is
    visible to the query at p (j ≤ p, or j < p when strict; p − j < W when
    windowed), −inf elsewhere."""
    d = q_pos[:, None] - k_pos[None, :]
    ok = d > 0 if strict else d >= 0
    if window:
        ok &= d < window
    return torch.zeros(ok.shape).masked_fill(~ok, float("-inf"))


class Block(nn.Module):
    def __init__(self, c, owner):
        super().__init__()
        hd = c.head_dim
        self.attn_norm = nn.Parameter(torch.ones(c.dim))            # [dim]
        self.wq = nn.Parameter(torch.empty(c.heads * hd, c.dim))     # [heads·hd, dim]
        if owner:
            self.wk = nn.Parameter(torch.empty(c.kv_heads * hd, c.dim))  # [kv·hd, dim]
            self.wv = nn.Parameter(torch.empty(c.kv_heads * hd, c.dim))  # [kv·hd, dim]
        self.wo = nn.Parameter(torch.empty(c.dim, c.heads * hd))     # [dim, heads·hd]
        self.ffn_norm = nn.Parameter(torch.ones(c.dim))              # [dim]
        self.w_gate = nn.Parameter(torch.empty(c.hidden, c.dim))     # [hidden, dim]
        self.w_up = nn.Parameter(torch.empty(c.hidden, c.dim))       # [hidden, dim]
        self.w_down = nn.Parameter(torch.empty(c.dim, c.hidden))     # [dim, hidden]


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        c.validate()
        self.c = c
        self.emb = nn.Parameter(torch.empty(c.vocab, c.dim))  # [vocab, dim], tied classifier
        self.blocks = nn.ModuleList(Block(c, c.owns(i)) for i in range(c.layers))
        self.out_norm = nn.Parameter(torch.ones(c.dim))       # [dim]
        cos, sin = rope_tables(c, c.ctx)
        self.register_buffer("cos", cos, persistent=False)    # [ctx, hd/2]
        self.register_buffer("sin", sin, persistent=False)    # [ctx, hd/2]

    def init_weights(self, gen):
        """N(0, 0.02²); the projections into the residual stream (wo,
        w_down) scaled by 1/sqrt(2·layers) (GPT-2, llama2.c)."""
        std = 0.02
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    p.fill_(1.0)
                else:
                    s = std / math.sqrt(2 * self.c.layers) if name.endswith(("wo", "w_down")) else std
                    p.copy_(torch.randn(p.shape, generator=gen) * s)

    # One layer over all positions. kv holds each owner's rotated (k, v)
    # [B, T, KVH, hd] of this pass; prev those of the previous pass (for
    # backward readers).
    def _layer(self, i, x, kv, prev, biases):
        c, L = self.c, self.blocks[i]
        B, T, _ = x.shape
        hd = c.head_dim
        cos, sin = self.cos[:T], self.sin[:T]
        h = rmsnorm(x, L.attn_norm, c.eps)
        q = rope((h @ L.wq.t()).view(B, T, c.heads, hd), cos, sin)
        if c.owns(i):
            k = rope((h @ L.wk.t()).view(B, T, c.kv_heads, hd), cos, sin)
            v = (h @ L.wv.t()).view(B, T, c.kv_heads, hd)
            kv[i] = (k, v)
        s = c.src(i)
        strict = s > i
        k, v = prev[s] if strict else kv[s]
        a = attend(q, k, v, biases[(c.win(i), strict)], strict, c.kv_heads)
        x = x + a @ L.wo.t()
        h = rmsnorm(x, L.ffn_norm, c.eps)
        return x + (F.silu(h @ L.w_gate.t()) * (h @ L.w_up.t())) @ L.w_down.t()

    def _biases(self, T):
        pos = torch.arange(T)
        c = self.c
        return {(c.win(i), c.src(i) > i): mask_bias(pos, pos, c.win(i), c.src(i) > i) for i in range(c.layers)}

    def logits(self, x):
        return rmsnorm(x, self.out_norm, self.c.eps) @ self.emb.t()

    def forward(self, tokens, passes=None, grad_passes=None):
        """Logits [B, T, vocab] of tokens [B, T], all positions at once (the
        iterative parallel passes for backward readers)."""
        c = self.c
        B, T = tokens.shape
        biases = self._biases(T)
        x = self.emb[tokens]
        back = c.backward_readers()
        if not back:
            kv = {}
            for i in range(c.layers):
                x = self._layer(i, x, kv, None, biases)
            return self.logits(x)
        m = c.passes if passes is None else passes
        b = min(m, c.grad_passes if grad_passes is None else grad_passes)
        first = min(back)
        kv = {}
        for i in range(first):
            x = self._layer(i, x, kv, None, biases)
        low = dict(kv)
        sources = {c.src(i) for i in back}
        zeros = x.new_zeros(B, T, c.kv_heads, c.head_dim)
        prev = {s: (zeros, zeros) for s in sources}
        grad = torch.is_grad_enabled()
        for it in range(m):
            with torch.set_grad_enabled(grad and it >= m - b):
                kv = dict(low)
                y = x
                for i in range(first, c.layers):
                    y = self._layer(i, y, kv, prev, biases)
            prev = {s: kv[s] for s in sources}
        return self.logits(y)

    @torch.no_grad()
    def forward_sequential(self, tokens):
        """Logits [B, T, vocab] of tokens [B, T] computed token by token over
        a KV cache: the exact computation kvlm runs (decode)."""
        c = self.c
        B, T = tokens.shape
        hd = c.head_dim
        cache = {o: (torch.zeros(B, T, c.kv_heads, hd), torch.zeros(B, T, c.kv_heads, hd)) for o in c.owners()}
        out = torch.empty(B, T, c.vocab)
        pos = torch.arange(T)
        for t in range(T):
            x = self.emb[tokens[:, t:t + 1]]  # [B, 1, dim]
            cos, sin = self.cos[t:t + 1], self.sin[t:t + 1]
            for i in range(c.layers):
                L = self.blocks[i]
                h = rmsnorm(x, L.attn_norm, c.eps)
                q = rope((h @ L.wq.t()).view(B, 1, c.heads, hd), cos, sin)
                if c.owns(i):
                    cache[i][0][:, t:t + 1] = rope((h @ L.wk.t()).view(B, 1, c.kv_heads, hd), cos, sin)
                    cache[i][1][:, t:t + 1] = (h @ L.wv.t()).view(B, 1, c.kv_heads, hd)
                s = c.src(i)
                strict = s > i
                hi = t if strict else t + 1  # slots written so far that the query may see
                k, v = cache[s][0][:, :max(hi, 1)], cache[s][1][:, :max(hi, 1)]
                bias = mask_bias(pos[t:t + 1], pos[:max(hi, 1)], c.win(i), strict)
                a = attend(q, k, v, bias, strict, c.kv_heads)
                x = x + a @ L.wo.t()
                h = rmsnorm(x, L.ffn_norm, c.eps)
                x = x + (F.silu(h @ L.w_gate.t()) * (h @ L.w_up.t())) @ L.w_down.t()
            out[:, t] = self.logits(x)[:, 0]
        return out

    def exact_logits(self, tokens):
        """The exact logits: the parallel pass where it is exact (no
        backward reader), the sequential one otherwise."""
        if self.c.backward_readers():
            return self.forward_sequential(tokens)
        with torch.no_grad():
            return self.forward(tokens)

    def param_count(self):
        return sum(p.numel() for p in self.parameters())
