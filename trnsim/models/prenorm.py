"""A pre-norm transformer block in plain PyTorch, for tests and benchmarks.

LayerNorm (or ``torch.nn.RMSNorm``), a fused QKV projection, ``scaled_dot_product_attention``,
an output projection and a GELU MLP, each half after its norm with a residual: the op
mix of a ViT or GPT-style block. Built from random weights; nothing is downloaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class PreNormBlock(torch.nn.Module):
    """One block of width ``d`` with ``heads`` attention heads; ``norm`` is ``"layernorm"``
    or ``"rmsnorm"``; ``causal`` masks attention to earlier positions."""

    def __init__(self, d: int = 128, heads: int = 4, norm: str = "layernorm", causal: bool = True) -> None:
        super().__init__()
        if norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm={norm!r}: use 'layernorm' or 'rmsnorm'")
        make = (lambda: torch.nn.LayerNorm(d)) if norm == "layernorm" else (lambda: torch.nn.RMSNorm(d))
        self.n1, self.n2 = make(), make()
        self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.heads, self.causal = heads, causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        return x + self.down(F.gelu(self.up(self.n2(x))))
