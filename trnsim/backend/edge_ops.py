"""Ops at the edges of what a pure-Python device can be, each with its own handling in
the neuron fallback (entries of ``dispatch._SPECIAL``).

- ``_efficientzerotensor``: autograd's free zeros (a ZeroTensor has no memory). A
  ZeroTensor carries its own dispatch key, which Python cannot put on a neuron tensor,
  so neuron gives real zeros: the same values, paid for in memory and time.
"""

from __future__ import annotations

import torch


def efficient_zeros(op, info, args: tuple, kwargs: dict) -> torch.Tensor:
    """``_efficientzerotensor(size, dtype=...)`` on neuron: a zero-filled neuron tensor."""
    size = args[0] if args else kwargs["size"]
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    return torch.zeros(size, dtype=dtype, device=kwargs.get("device") or "neuron")
