"""Ops at the edges of what a pure-Python device can be, each with its own handling in
the neuron fallback (entries of ``dispatch._SPECIAL``).

- ``_efficientzerotensor``: autograd's free zeros (a ZeroTensor has no memory). A
  ZeroTensor carries its own dispatch key, which Python cannot put on a neuron tensor,
  so neuron gives real zeros: the same values, paid for in memory and time.
- ``histc`` of an integer tensor: the CPU has only floating-point histograms, CUDA has
  integer ones too (transformers' mixture-of-experts layers count tokens per expert
  with it), so neuron computes them as CUDA does: :func:`integer_histc`.

And a repair of the arguments of a CPU call: :func:`wrap_numbers`, for the Python
numbers that PyTorch hands the fallback in ``Tensor`` arguments.
"""

from __future__ import annotations

import torch


def efficient_zeros(op, info, args: tuple, kwargs: dict) -> torch.Tensor:
    """``_efficientzerotensor(size, dtype=...)`` on neuron: a zero-filled neuron tensor."""
    size = args[0] if args else kwargs["size"]
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    return torch.zeros(size, dtype=dtype, device=kwargs.get("device") or "neuron")


def histc(op, info, args: tuple, kwargs: dict) -> torch.Tensor:
    """``histc`` and ``histc.out`` on neuron: the CPU's kernel for floating-point input,
    :func:`integer_histc` for integers."""
    from trnsim.backend import dispatch

    x = args[0] if args else kwargs["self"]
    host = None if x.dtype.is_floating_point or x.dtype.is_complex else integer_histc
    return dispatch._compute(op, info, args, kwargs, host_op=host)


def integer_histc(self: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0, *,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``histc`` of an integer CPU tensor, as CUDA computes it: ``bins`` equal bins over
    [``min``, ``max``] (the data's range where both are 0, widened by 1 each way where it
    is one value), element ``x`` counted in bin ``(x - min) * bins // (max - min)``
    (the last bin also takes ``max``), elements outside the range dropped; the counts
    have ``self``'s dtype."""
    if bins <= 0:
        raise RuntimeError(f"histc(): bins must be > 0, but got {bins}")
    if max < min:
        raise RuntimeError(f"histc(): max must be larger than min, got min={min} and max={max}")
    lo, hi = min, max
    if lo == hi and self.numel():
        lo, hi = self.min().item(), self.max().item()
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    x = self.reshape(-1).to(torch.int64)
    keep = (x >= lo) & (x <= hi)
    if isinstance(lo, int) and isinstance(hi, int):
        index = (x[keep] - lo) * bins // (hi - lo)
    else:
        index = ((x[keep].double() - lo) * bins / (hi - lo)).floor().to(torch.int64)
    counts = torch.bincount(index.clamp(max=bins - 1), minlength=bins).to(self.dtype)
    if out is None:
        return counts
    out.resize_(bins)
    return out.copy_(counts)


# -- Python numbers for Tensor arguments ----------------------------------------

_NUMBER_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
_tensor_slots: dict = {}


def _slots(op) -> tuple[tuple[int, str], ...]:
    """Positions and names of ``op``'s ``Tensor`` and ``Tensor?`` arguments (once per op)."""
    slots = _tensor_slots.get(op)
    if slots is None:
        slots = _tensor_slots[op] = tuple(
            (i, a.name) for i, a in enumerate(op._schema.arguments)
            if isinstance(a.type, torch.TensorType)
            or (isinstance(a.type, torch.OptionalType) and isinstance(a.type.getElementType(), torch.TensorType)))
    return slots


def wrap_numbers(op, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """``args``/``kwargs`` of a CPU call to ``op`` with each Python number that sits in a
    ``Tensor`` argument made a 0-dim CPU tensor, or None if there is none.

    A C++ kernel that calls another op with a scalar wraps it in a "wrapped number"
    tensor (``x % 4`` inside ``take_along_dim`` calls ``remainder.Tensor_out``); the
    boxed Python fallback receives it as a Python number, which the op's ``Tensor``
    argument then refuses. Python cannot mark a tensor as a wrapped number, and a
    wrapped number does not take part in type promotion the way a 0-dim tensor does,
    so the tensor gets the number's own dtype (int64, float64, ...) where that
    promotes with the first tensor argument as the number would, and otherwise the
    dtype the number would promote to.
    """
    args, kwargs, found = list(args), dict(kwargs), False
    ref = next((a for a in args if isinstance(a, torch.Tensor)), None)
    for i, name in _slots(op):
        if i < len(args):
            holder, key = args, i
        elif name in kwargs:
            holder, key = kwargs, name
        else:
            continue
        v = holder[key]
        dtype = _NUMBER_DTYPES.get(type(v))
        if dtype is None:
            continue
        t = torch.scalar_tensor(v, dtype=dtype)
        if ref is not None and torch.result_type(ref, v) != torch.result_type(ref, t):
            t = torch.scalar_tensor(v, dtype=torch.result_type(ref, v))
        holder[key] = t
        found = True
    return (tuple(args), kwargs) if found else None
