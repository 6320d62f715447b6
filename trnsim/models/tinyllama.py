"""A small Llama-style decoder in plain PyTorch, for demos, tests and benchmarks.

RMSNorm, rotary position embeddings, grouped-query attention through
``scaled_dot_product_attention`` (causal) and a SwiGLU MLP: the op mix of Llama models,
at sizes that train in seconds on the simulated device. Built from random weights;
nothing is downloaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    """Root-mean-square normalisation over the last dimension, with a learned scale."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotary(x, cos, sin):
    """Rotary position embedding of ``x`` [..., S, D] with tables ``cos``, ``sin`` [S, D]."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(torch.nn.Module):
    """One decoder layer: pre-norm grouped-query attention and a SwiGLU MLP, residuals."""

    def __init__(self, d: int, heads: int, kv_heads: int, ff: int) -> None:
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = torch.nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.gate = torch.nn.Linear(d, ff, bias=False)
        self.up = torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        rep = self.h // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(torch.nn.Module):
    """Token ids [B, S] (S at most ``seq``) to logits [B, S, vocab]."""

    def __init__(self, vocab=1000, d=256, layers=4, heads=8, kv_heads=2, ff=688, seq=64) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads, kv_heads, ff) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos())
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin())

    def forward(self, ids):
        s = ids.shape[1]
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x, self.cos[:s], self.sin[:s])
        return self.head(self.norm(x))


def causal_lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy of ``logits`` [B, S, V] against ``ids`` [B, S]."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
