"""Reductions of ``nki.language`` along the free axes of a tile: ``sum``, ``max``, ``min``,
``mean``, ``var``, and the row-wise ``softmax`` and ``rms_norm`` built on them.

Reductions run along free axes on the vector engine: the access pattern walks the
reduced axes last, so any free axes may be reduced, as NKI's compiler allows; to reduce
across partitions, transpose first.
"""

from __future__ import annotations

import math
from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import ActivationFunc, AluOp, Memory, ReduceOp, View
from trnsim.nki import emit as _e
from trnsim.nki.compute import multiply, reciprocal, square, subtract
from trnsim.nki.tiles import Mask, NkiTensor


def free_axes(x: NkiTensor, axis: Any) -> int:
    """How many trailing free axes ``axis`` names (softmax and rms_norm run along the last)."""
    axes = reduce_axes(x, axis)
    if list(axes) != list(range(len(x.shape) - len(axes), len(x.shape))):
        raise _e.tracer().fail(f"reduce axes {list(axes)} of {list(x.shape)} must be the trailing free axes for "
                               "nl.var, nl.softmax and nl.rms_norm in trnsim (nl.sum, nl.max, nl.min and nl.mean take "
                               "any free axes)")
    return len(axes)


def reduce_axes(x: NkiTensor, axis: Any) -> tuple[int, ...]:
    """The free axes ``axis`` names, sorted; reductions run along free axes."""
    nd = len(x.shape)
    axes = tuple(sorted({a % nd for a in ((axis,) if isinstance(axis, int) else tuple(axis))}))
    if 0 in axes:
        raise _e.tracer().fail(f"reductions run along free axes; axis 0 of {list(x.shape)} is the partition axis "
                               "(nl.transpose to reduce across partitions)")
    return axes


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    """The shape of a reduction's result: the kept axes (with 1 for each reduced axis
    under ``keepdims``), and at least [P, 1]."""
    if keepdims:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    kept = tuple(s for i, s in enumerate(shape) if i not in axes)
    return kept if len(kept) > 1 else (kept[0], 1)


def reduced_last(x: NkiTensor, v: View, axes: tuple[int, ...]) -> View:
    """``v`` (a view of ``x``) walking the ``axes`` last, where the engines reduce."""
    nd = len(v.dims)
    if list(axes) == list(range(nd - len(axes), nd)):
        return v
    if nd != len(x.shape):
        raise _e.tracer().fail(f"reducing axes {list(axes)} of {x.name}{list(x.shape)}, whose access pattern has "
                               f"{nd} dimensions, not one per axis: copy it to a fresh tile first")
    kept = [d for i, d in enumerate(v.dims) if i not in axes]
    return View(v.tensor, v.offset, tuple(kept + [v.dims[i] for i in axes]))


def _reduce(op: ReduceOp, name: str):
    def fn(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, mask: Mask | None = None) -> NkiTensor:
        x = _e.readable(x)
        axes = reduce_axes(x, axis)
        shape = reduced_shape(tuple(x.shape), axes, keepdims)
        kept_bases = tuple(b for i, b in enumerate(x.bases) if i not in axes) if not keepdims else x.bases
        kept_bases = (kept_bases + (None,) * len(shape))[: len(shape)]
        out = _e.new_tensor(shape, dtype or (x.dtype if x.buffer is Memory.SBUF else _dt.float32), bases=kept_bases)
        src = reduced_last(x, _e.clip(mask, x)[0], axes)
        _e.reduce(_e.clip_result(mask, out, len(x.shape) - len(axes), _e.named_bases(x)), src, op, len(axes))
        return out

    fn.__name__ = name
    fn.__doc__ = f"{name} along free axes (vector engine)."
    return fn


sum = _reduce(ReduceOp.ADD, "sum")  # noqa: A001 - NKI's name
max = _reduce(ReduceOp.MAX, "max")  # noqa: A001
min = _reduce(ReduceOp.MIN, "min")  # noqa: A001


def mean(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, mask: Mask | None = None) -> NkiTensor:
    """Mean along free axes."""
    x = _e.readable(x)
    n = math.prod(x.shape[a] for a in reduce_axes(x, axis))
    total = sum(x, axis, dtype=_dt.float32, keepdims=keepdims, mask=mask)
    return multiply(total, 1.0 / n, dtype=dtype or _dt.float32)


def var(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, mask: Mask | None = None) -> NkiTensor:
    """Population variance along trailing free axes: mean((x - mean(x))^2)."""
    x = _e.restricted(_e.readable(x), mask)
    free_axes(x, axis)   # the mean is subtracted per partition
    m = mean(x, axis, keepdims=True)
    centred = subtract(x, _per_partition(m), dtype=_dt.float32)
    result = mean(square(centred), axis, dtype=dtype, keepdims=keepdims)
    if mask is None:
        return result
    out = _e.new_tensor(result.shape, result.dtype, bases=(x.bases + (None,) * len(result.shape))[: len(result.shape)])
    _e.copy_to(_e.clip_result(mask, out, len(x.shape) - free_axes(x, axis), _e.named_bases(x)), result.view, engine=None)
    return out


def _per_partition(t: NkiTensor) -> NkiTensor:
    """A [P, 1, 1...] tile seen as [P, 1]."""
    return t if len(t.shape) == 2 else NkiTensor(t._placement, View(t.view.tensor, t.view.offset, (t.view.dims[0], (1, 1))))


@_e.masked
def softmax(x: Any, axis: Any = -1, dtype: Any = None) -> NkiTensor:
    """``exp(x - max) / sum(exp(x - max))`` along the last free axis: a max reduction
    (vector), one exp with the negated max as bias and a running sum (scalar), a
    reciprocal and a scale."""
    x = _e.readable(x)
    free_axes(x, axis)
    row_max = max(x, axis)
    neg_max = multiply(row_max, -1.0, dtype=_dt.float32)
    e = _e.like(x, _dt.float32)
    total = _e.new_tensor((x.view.partitions, 1), _dt.float32)
    _e.activation(e.view, x.view, ActivationFunc.EXP, bias=neg_max.view, reduce_op=ReduceOp.ADD, reduce_dst=total.view)
    inv = reciprocal(total)
    return multiply(e, inv, dtype=dtype or x.dtype)


@_e.masked
def rms_norm(x: Any, w: Any, axis: Any = -1, n: int | None = None, epsilon: float = 1e-6, dtype: Any = None) -> NkiTensor:
    """``x / sqrt(mean(x^2) + epsilon) * w`` along the last free axis; ``w`` is a [1, F]
    tile (broadcast over partitions) or a tile shaped like ``x``."""
    x = _e.readable(x)
    free_axes(x, axis)
    count = n if n is not None else x.view.free_size
    sq = _e.like(x, _dt.float32)
    ss = _e.new_tensor((x.view.partitions, 1), _dt.float32)
    _e.activation(sq.view, x.view, ActivationFunc.SQUARE, reduce_op=ReduceOp.ADD, reduce_dst=ss.view)
    rstd = _e.new_tensor((x.view.partitions, 1), _dt.float32)
    _e.tensor_scalar(rstd.view, ss.view, AluOp.MULTIPLY, 1.0 / count, AluOp.ADD, float(epsilon))
    _e.activation(rstd.view, rstd.view, ActivationFunc.RSQRT)
    normed = multiply(x, rstd, dtype=_dt.float32)
    w = _e.readable(w, "rms_norm weight")
    return multiply(normed, w, dtype=dtype or x.dtype)
