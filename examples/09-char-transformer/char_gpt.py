# SPDX-License-Identifier: Apache-2.0
"""PyTorch's twin of gpt.hpp's char_gpt: the same character-level GPT, parameter for parameter.

    sys.path.insert(0, "examples/09-char-transformer"); from char_gpt import Config, CharGPT

Same names, shapes and order as char_gpt::parameters() (tok_emb, pos_emb, h<l>.ln1.g, ...,
head.b); a weight `w` is [in x out] (y = x @ w + b, not nn.Linear's [out x in]); LayerNorm eps
1e-5; GELU approximate='tanh'; the loss is the mean next-token cross-entropy over all B x ctx
positions. `init_(model, seed)` draws the weights exactly as gpt.hpp does (splitmix64 per tensor,
Box-Muller, normal(0, 0.02); biases 0, gains 1), so both sides start from the same values.
tests/integration/char_transformer_twin.py checks loss and gradients against the C++ model.
"""
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    vocab: int = 256
    ctx: int = 128
    d: int = 256
    layers: int = 4
    heads: int = 8
    seed: int = 1


class Linear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.w = nn.Parameter(torch.empty(n_in, n_out))
        self.b = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.b, x.reshape(-1, x.shape[-1]), self.w).reshape(*x.shape[:-1], -1)


class LayerNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.g, self.b, 1e-5)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.qkv = Linear(c.d, 3 * c.d)
        self.proj = Linear(c.d, c.d)
        self.register_buffer("mask", torch.ones(c.ctx, c.ctx, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        B, T, D = x.shape
        hd = D // self.heads
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = Linear(c.d, 4 * c.d)
        self.proj = Linear(4 * c.d, c.d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = LayerNorm(c.d)
        self.attn = Attention(c)
        self.ln2 = LayerNorm(c.d)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.tok_emb = nn.Parameter(torch.empty(c.vocab, c.d))
        self.pos_emb = nn.Parameter(torch.empty(c.ctx, c.d))
        for l in range(c.layers):
            self.add_module(f"h{l}", Block(c))
        self.ln_f = LayerNorm(c.d)
        self.head = Linear(c.d, c.vocab)
        init_(self, c.seed)

    def blocks(self):
        return [getattr(self, f"h{l}") for l in range(self.config.layers)]

    def forward(self, idx, targets=None):
        """idx, targets: [B, T] token ids. Returns the logits [B, T, vocab] and, with targets,
        the mean cross-entropy over the B x T positions."""
        T = idx.shape[1]
        x = self.tok_emb[idx] + self.pos_emb[:T]
        for b in self.blocks():
            x = b(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


_MASK = (1 << 64) - 1


def _splitmix64(state, count):
    """`count` outputs of splitmix64 from `state` (numpy uint64, wrapping as in C++)."""
    with np.errstate(over="ignore"):
        z = np.uint64(state) + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@torch.no_grad()
def init_(model, seed):
    """gpt.hpp's initialisation: tensor i (in parameter order) from splitmix64 seeded with
    seed ^ ((i + 1) * 0x9E3779B97F4A7C15); weights normal(0, 0.02) by Box-Muller from two draws
    per value; biases (.b) 0, LayerNorm gains (.g) 1."""
    for i, (name, p) in enumerate(model.named_parameters()):
        if name.endswith(".g"):
            p.fill_(1.0)
        elif name.endswith(".b"):
            p.zero_()
        else:
            n = p.numel()
            z = _splitmix64((seed ^ (((i + 1) * 0x9E3779B97F4A7C15) & _MASK)) & _MASK, 2 * n)
            u1 = ((z[0::2] >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53
            u2 = (z[1::2] >> np.uint64(11)).astype(np.float64) * 2.0**-53
            v = 0.02 * np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)
            p.copy_(torch.from_numpy(v.astype(np.float32)).view_as(p))
