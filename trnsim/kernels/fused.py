"""Fused kernels: what ``torch.compile(backend="neuron")`` lowers a graph's fusions into.

A fusion is described by a :class:`Recipe`, a small straight-line program of
:class:`Step` s over one 2-D domain [N, D] (rows on partitions, 128 at a time; D along
the free axis). The compile backend (``trnsim.backend.compile``) builds recipes from FX
graphs; this module knows nothing of torch.

Operands (the kernel's inputs after the matmul operands, if any) each have a layout:

- ``"full"``: [N, D] in HBM, one value per element of the domain;
- ``"row"``: [D] in HBM, broadcast over the rows (a bias, a norm weight);
- ``"col"``: [N, 1] in HBM, broadcast along each row (per-row statistics);
- ``"scalar"``: [1] in HBM, one value broadcast everywhere.

A :class:`Ref` names a step's argument: an operand (``Ref("in", i)``), an earlier
step's value (``Ref("step", j)``), a constant known when the kernel is traced
(``Ref("const", value=x)``), or, in :func:`fused_matmul_kernel`, the matmul's product
(``Ref("mm")``, fp32 as PSUM holds it).

Step values are "full" ([128, D] tiles) or, after a reduction over D, "col" ([128, 1]
tiles). Every step computes in fp32 and rounds its result to ``Step.dtype`` (as each
eager op rounds its result). Values live in SBUF; only operands are loaded from HBM and
only :attr:`Recipe.outputs` are stored to it.

Step ops (``Step.op``):

- unary, one argument: exp, log, sqrt, rsqrt, reciprocal, tanh, sigmoid, relu, gelu,
  gelu_tanh, silu, abs, neg, sin, cos, erf, sign, square, copy (a cast when ``dtype``
  differs);
- binary, two arguments (full, col or scalar values, constants broadcast): add,
  subtract, multiply, divide, maximum, minimum, power, and the comparisons equal,
  not_equal, greater, greater_equal, less, less_equal (1.0 where true, 0.0 where not);
- ``where``, three arguments: ``a if cond != 0 else b``;
- reductions over D, one full argument, giving a col value: sum, max, min, mean.
"""

from __future__ import annotations

from dataclasses import dataclass

UNARY_OPS = frozenset({"exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh",
                       "silu", "abs", "neg", "sin", "cos", "erf", "sign", "square", "copy"})
BINARY_OPS = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal",
                        "not_equal", "greater", "greater_equal", "less", "less_equal"})
REDUCE_OPS = frozenset({"sum", "max", "min", "mean"})
LAYOUTS = ("full", "row", "col", "scalar")


@dataclass(frozen=True)
class Ref:
    """An argument of a :class:`Step`: ``kind`` is ``"in"`` (operand ``index``),
    ``"step"`` (the value of step ``index``), ``"const"`` (the number ``value``) or
    ``"mm"`` (the matmul product of :func:`fused_matmul_kernel`)."""

    kind: str
    index: int = 0
    value: float = 0.0


@dataclass(frozen=True)
class Step:
    """One op of a fusion: ``op`` applied to ``args``, rounded to ``dtype`` (a chip
    dtype name: float32, bfloat16, float16, float8_e4m3, float8_e5m2)."""

    op: str
    args: tuple[Ref, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class Recipe:
    """A fusion: ``steps`` in order over operands of ``layouts``; the values of the
    steps listed in ``outputs`` are the kernel's results, in that order."""

    layouts: tuple[str, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
