"""Ops at the edges of what a pure-Python device can be, each with its own handling in
the neuron fallback (entries of ``dispatch._SPECIAL``). A handler returns the op's
result, or :class:`OnHost`: compute the op as any other, with the host function given.

- ``_efficientzerotensor``: autograd's free zeros (a ZeroTensor has no memory). A
  ZeroTensor carries its own dispatch key, which Python cannot put on a neuron tensor,
  so neuron gives real zeros: the same values, paid for in memory and time.
- ``histc`` of an integer tensor: the CPU has only floating-point histograms, CUDA has
  integer ones too (transformers' mixture-of-experts layers count tokens per expert
  with it), so neuron computes them as CUDA does: :func:`integer_histc`.
- ``_thnn_fused_lstm_cell``, ``_thnn_fused_gru_cell`` and their backwards: PyTorch's
  recurrent layers take these fused cells on every accelerator but the CPU, and only
  CUDA has kernels for them, so neuron computes them from plain ops, with CUDA's
  gate order and workspace layout (:func:`rnn_cell`).

And a repair of the arguments of a CPU call: :func:`wrap_numbers`, for the Python
numbers that PyTorch hands the fallback in ``Tensor`` arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class OnHost:
    """A special op's answer to the fallback: compute the op as any other, running
    ``host_op`` on the host aliases of its arguments (None: the op itself)."""

    host_op: Callable | None


def efficient_zeros(op, info, args: tuple, kwargs: dict) -> torch.Tensor:
    """``_efficientzerotensor(size, dtype=...)`` on neuron: a zero-filled neuron tensor."""
    size = args[0] if args else kwargs["size"]
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    return torch.zeros(size, dtype=dtype, device=kwargs.get("device") or "neuron")


def histc(op, info, args: tuple, kwargs: dict) -> torch.Tensor:
    """``histc`` and ``histc.out`` on neuron: the CPU's kernel for floating-point input,
    :func:`integer_histc` for integers."""
    x = args[0] if args else kwargs["self"]
    return OnHost(None if x.dtype.is_floating_point or x.dtype.is_complex else integer_histc)


def integer_histc(self: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0, *,  # noqa: A002 - aten::histc's keywords
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


def rnn_cell(op, info, args: tuple, kwargs: dict):
    """A fused LSTM or GRU cell op on neuron: its host version from :data:`_RNN_CELLS`."""
    return OnHost(_RNN_CELLS[op.name().removeprefix("aten::")])


def _gates(input_gates: torch.Tensor, hidden_gates: torch.Tensor, input_bias, hidden_bias, chunks: int):
    i = input_gates if input_bias is None else input_gates + input_bias
    h = hidden_gates if hidden_bias is None else hidden_gates + hidden_bias
    return i.chunk(chunks, 1), h.chunk(chunks, 1)


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``(hy, cy, workspace)`` of one LSTM step from the gate pre-activations [B, 4H]
    (input, forget, cell, output); the workspace holds the four activated gates."""
    (i, f, g, o), (hi, hf, hg, ho) = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 4)
    i, f, g, o = (i + hi).sigmoid(), (f + hf).sigmoid(), (g + hg).tanh(), (o + ho).sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """``(grad_gates, grad_cx, grad_bias)`` of :func:`lstm_cell` (the bias gradient is
    the gates' summed over the batch, and empty without a bias)."""
    i, f, g, o = workspace.chunk(4, 1)
    go = torch.zeros_like(cy) if grad_hy is None else grad_hy
    gc = torch.zeros_like(cy) if grad_cy is None else grad_cy
    tanh_cy = cy.tanh()
    gcx = go * o * (1 - tanh_cy * tanh_cy) + gc
    gates = torch.cat([gcx * g * (1 - i) * i, gcx * cx * (1 - f) * f, gcx * i * (1 - g * g),
                       go * tanh_cy * (1 - o) * o], 1)
    return gates, gcx * f, gates.sum(0) if has_bias else torch.empty(0, dtype=gates.dtype)


def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """``(hy, workspace)`` of one GRU step from the gate pre-activations [B, 3H] (reset,
    update, new); the workspace holds reset, update, new, hx and the hidden new gate."""
    (ir, iz, in_), (hr, hz, hn) = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 3)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def gru_cell_backward(grad_hy, workspace, has_bias):
    """``(grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias,
    grad_hidden_bias)`` of :func:`gru_cell`."""
    r, z, n, hx, hn = workspace.chunk(5, 1)
    gz = grad_hy * (hx - n) * (1 - z) * z
    gn = grad_hy * (1 - z) * (1 - n * n)
    gr = gn * hn * (1 - r) * r
    gi, gh = torch.cat([gr, gz, gn], 1), torch.cat([gr, gz, gn * r], 1)
    empty = torch.empty(0, dtype=gi.dtype)
    return gi, gh, grad_hy * z, gi.sum(0) if has_bias else empty, gh.sum(0) if has_bias else empty


_RNN_CELLS = {
    "_thnn_fused_lstm_cell": lstm_cell, "_thnn_fused_lstm_cell_backward_impl": lstm_cell_backward,
    "_thnn_fused_gru_cell": gru_cell, "_thnn_fused_gru_cell_backward": gru_cell_backward,
}
