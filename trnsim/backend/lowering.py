"""What every lowering of an aten op to a kernel shares: the op call being lowered
(:class:`Call`), placeholder operands, the chip dtype a torch dtype runs as, the split
of an op's work across the physical cores of a logical core (:class:`Shares`), and
running a kernel for its time (:func:`run_kernel`).

Timing (:mod:`trnsim.backend.opkernels`), instruction fidelity
(:mod:`trnsim.backend.instruction`), FlexAttention (:mod:`trnsim.backend.flextiming`)
and compiled graphs (:mod:`trnsim.backend.compile.lower`) lower ops with these, and
nothing here imports them.

On a chip whose logical NeuronCore spans several physical cores (trn2's LNC=2), the
physical cores split an op's independent work (batch, rows, heads, images), as the
Neuron compiler shards it: the Program traced is one physical core's share, and the
cores run their shares at the same time, so it is the op's time. Each split is made
through the call's :class:`Shares`, which returns the op's work over the share traced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from trnsim.backend import state
from trnsim.backend.opcost import OpCost

MAX_MULTIPLIES = 8192   # [128 x 128] x [128 x 512] multiplies a traced matmul may have before it is sliced

#: aten elementwise ops (by base name) and the kernels' function names for them
UNARY = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "reciprocal": "reciprocal",
         "tanh": "tanh", "sigmoid": "sigmoid", "relu": "relu", "gelu": "gelu", "silu": "silu", "abs": "abs",
         "neg": "identity", "sin": "sin", "cos": "cos", "erf": "erf", "sign": "sign", "softplus": "softplus",
         "square": "square"}
BINARY = {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide", "maximum": "maximum",
          "minimum": "minimum", "pow": "power", "eq": "equal", "ne": "not_equal", "gt": "greater",
          "ge": "greater_equal", "lt": "less", "le": "less_equal", "rsub": "subtract"}

_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.int32: np.int32, torch.int8: np.int8,
       torch.uint8: np.uint8, torch.int16: np.int16}
_TYPED = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}


def op_base(name: str) -> str:
    """``aten::add_.Tensor`` -> ``add``: the op's name without namespace, overload and
    in-place underscore."""
    base = name.removeprefix("aten::").split(".")[0]
    return base[:-1] if base.endswith("_") and not base.startswith("_") else base


def lnc() -> int:
    """Physical cores per logical core on the device's chip."""
    return state.chip().logical_core_size


class Shares:
    """The splits of one op's work across the physical cores of a logical core, made
    while lowering it: each split returns one core's share, and :attr:`factor` is the
    op's work over the share traced (1 where no split was made)."""

    def __init__(self) -> None:
        self.factors: list[float] = []

    @property
    def factor(self) -> float:
        return math.prod(self.factors)

    def split(self, n: int) -> int:
        """One physical core's share of ``n`` independent pieces of work (rows, heads, ...)."""
        share = max(1, math.ceil(n / lnc()))
        self.factors.append(max(n, 1) / share)
        return share

    def per_core(self, shape: Any) -> tuple[int, ...]:
        """One physical core's share of an elementwise op over ``shape``, for the flat
        elementwise kernels (``flat_views``: 128-partition columns, then a row of the last
        ``numel % 128``). A share that fits one row is that row; a bigger one is half the
        columns, and one core also takes the last row, so a share is never laid out worse
        than the whole (a split of the first axis can be: [129, 7] is 7 columns and a row of
        7, while [65, 7] is 3 columns and a row of 71). Unchanged with LNC=1."""
        shape = tuple(int(s) for s in shape)
        cores = lnc()
        numel = math.prod(shape)
        if cores == 1 or numel < cores:
            return shape
        share = math.ceil(numel / cores)
        if share >= 128:
            cols, rest = divmod(numel, 128)
            share = 128 * math.ceil(cols / cores) + rest
        self.factors.append(numel / share)
        return (share,)

    def images(self, shape: Any) -> tuple[int, ...]:
        """One physical core's share of an [N, C, ...] tensor: a share of the images."""
        return (self.split(shape[0]),) + tuple(shape[1:])

    def matmul(self, b: int, m: int, k: int, n: int) -> tuple[int, int, int, int]:
        """One physical core's share of a matmul [b, m, k] x [b, k, n], as traced: (b, m,
        n, scale), the slab of at most :data:`MAX_MULTIPLIES` multiplies whose Program,
        run ``scale`` times, times the share. Very large matmuls are traced on a slab of
        their batch, rows or columns and repeated (``OpCost.scale``)."""
        m, k, n = max(m, 1), max(k, 1), max(n, 1)
        cores = lnc()
        if cores > 1:   # the physical cores of a logical core take a share of the batch, rows or columns each
            if b >= cores:
                b = self.split(b)
            elif m >= 128 * cores or (n < 512 * cores and m >= cores):
                m = self.split(m)
            else:
                n = self.split(n)
        steps = math.ceil(k / 128)
        scale = 1
        # trace at most MAX_MULTIPLIES multiplies: slice the batch, then rows, then columns
        for axis in ("b", "m", "n"):
            mults = b * math.ceil(m / 128) * math.ceil(n / 512) * steps
            if mults <= MAX_MULTIPLIES:
                break
            if axis == "b" and b > 1:
                keep = max(1, b * MAX_MULTIPLIES // mults)
                scale *= math.ceil(b / keep)
                b = keep
            elif axis == "m" and m > 128:
                keep = max(128, (m * MAX_MULTIPLIES // mults) // 128 * 128)
                scale *= math.ceil(m / keep)
                m = keep
            elif axis == "n" and n > 512:
                keep = max(512, (n * MAX_MULTIPLIES // mults) // 512 * 512)
                scale *= math.ceil(n / keep)
                n = keep
        return b, m, n, scale


@dataclass(frozen=True)
class Call:
    """One op call being lowered: its name, arguments (also flattened) and results; the
    splits its lowering makes across physical cores (``shares``); and ``cost_of``, the
    caller's (memoized) costing of another op, for ops made of others (``_foreach_*``)."""

    name: str
    args: tuple
    kwargs: dict
    flat: list
    out: Any
    cost_of: Callable[..., OpCost] | None = field(default=None, repr=False, compare=False)
    shares: Shares = field(default_factory=Shares, repr=False, compare=False)

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        if index < len(self.args):
            return self.args[index]
        return self.kwargs.get(name, default)


def placeholder(shape: Any, dtype: torch.dtype) -> Any:
    """A zero-memory placeholder array standing for a tensor of ``shape`` and ``dtype``."""
    import trnsim.nki as nki

    shape = tuple(int(s) for s in shape) or (1,)
    if dtype in _TYPED:
        return nki.typed(np.broadcast_to(np.zeros((), np.float32), shape), _TYPED[dtype])
    np_dtype = _NP.get(dtype)
    if np_dtype is None:   # int64, bool, float64: timed as the chip's 32-bit or 8-bit types
        np_dtype = np.uint8 if dtype == torch.bool else (np.float32 if dtype.is_floating_point else np.int32)
    return np.broadcast_to(np.zeros((), np_dtype), shape)


def row_major(t: torch.Tensor) -> bool:
    """Whether a matmul's left operand ``t`` [..., M, K] lies in memory in rows (its K
    contiguous), as an activation does, rather than as a transposed view ([K, M] in
    memory, as ``x.t()`` of a row-major ``x``)."""
    return t.dim() >= 2 and t.stride(-1) == 1 and (t.shape[-1] > 1 or t.shape[-2] == 1)


def chip_dtype(dtype: torch.dtype) -> str:
    """The chip dtype a kernel computes ``dtype`` in."""
    if dtype in _TYPED:
        return _TYPED[dtype]
    if dtype in (torch.float16,):
        return "float16"
    return "float32" if dtype.is_floating_point else "int32"


def run_kernel(kernel: Callable, name: str, *args: Any, repeat: int = 1, **kwargs: Any) -> OpCost:
    """The time of ``kernel`` traced on ``args`` for the device's chip and simulated
    (timing only), ``repeat`` times: the op's cost as the kernel named ``name``."""
    from trnsim.nki.launch import launch

    run = launch(kernel, args, kwargs, chip=state.chip(), numerics=False).run
    return OpCost(ps=run.total_ps * repeat, source="kernel", kernel=name, run=run, scale=repeat,
                  call=(kernel, args, kwargs))
