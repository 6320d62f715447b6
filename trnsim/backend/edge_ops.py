"""Ops at the edges of what a pure-Python device can be, each with its own handling in
the neuron fallback (entries of ``dispatch._SPECIAL``).

- ``_efficientzerotensor``: autograd's free zeros (a ZeroTensor has no memory). A
  ZeroTensor carries its own dispatch key, which Python cannot put on a neuron tensor,
  so neuron gives real zeros: the same values, paid for in memory and time.

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
