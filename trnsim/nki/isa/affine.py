"""Affine index patterns on GpSimd: ``iota`` fills a tile with an affine expression of
its indices, ``affine_select`` keeps a tile where one holds. Both take NKI's ``nl.arange``
expressions or the newer ``pattern=[[step, num], ...]`` access patterns."""

from __future__ import annotations

import math
from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import AffineSelect, AluOp, Engine, Iota, View
from trnsim.nki import emit as _e
from trnsim.nki.isa._common import COMPARISONS, alu, fail, is_tile, out_tile, split_dst
from trnsim.nki.tiles import Affine, Mask, NkiTensor


def _affine_pattern(expr: Affine, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int, int]:
    """Steps per free axis, offset and channel multiplier of an index expression over a tile."""
    tr = _e.tracer()
    steps = [0] * (len(shape) - 1)
    cm = 0
    for b, c in expr.terms.items():
        axis = expr.axes.get(b, 0)
        if axis == 0:
            cm += c
        elif axis - 1 < len(steps):
            steps[axis - 1] += c
        else:
            raise tr.fail(f"index expression uses axis {axis}, but the tile has shape {list(shape)}")
    return tuple(steps), expr.const, cm


def _grid_shape(expr: Affine) -> tuple[int, ...]:
    dims: dict[int, int] = {}
    for b in expr.terms:
        dims[expr.axes.get(b, 0)] = expr.sizes[b]
    n = max(dims) + 1 if dims else 2
    return tuple(dims.get(i, 1) for i in range(max(n, 2)))


def iota(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Fill a tile with an affine index expression of ``nl.arange`` values (GpSimd):
    ``t = nisa.iota(i_p * 64 + i_f, dtype=nl.int32)`` or ``nisa.iota(dst, expr)``."""
    dst, rest = split_dst(args, kwargs, lambda a: is_tile(a[0]), "expr")
    if "pattern" in kwargs or (dst is not None and rest and isinstance(rest[0], (list, tuple))):
        kwargs.pop("name", None)
        if "pattern" in kwargs:
            return _iota_pattern(dst, kwargs.pop("pattern"), *rest, **kwargs)
        return _iota_pattern(dst, *rest, **kwargs)
    expr = kwargs.pop("expr", rest[0] if rest else None)
    if isinstance(expr, int):
        expr = Affine({}, expr, {}, {})
    if not isinstance(expr, Affine):
        raise _e.tracer().fail(f"iota needs an nl.arange expression, got {expr!r}")
    if dst is None:
        # the tile is indexed by the expression's nl.arange bases, so a mask on them clips
        # it (an iota of row indices masked as the rows it chooses: resize kernels)
        shape = _grid_shape(expr)
        bases: list[int | None] = [None] * len(shape)
        for base in expr.terms:
            bases[expr.axes.get(base, 0)] = base
        dst = _e.new_tensor(shape, _e.dtype_of(dtype, _dt.int32), bases=tuple(bases))
    out = dst
    steps, offset, cm = _affine_pattern(expr, out.shape)
    _e.emit(Iota(out.view, steps, offset, cm, engine=Engine.GPSIMD))
    return out


def _iota_pattern(dst: NkiTensor | None, pattern: Any, offset: int = 0, channel_multiplier: int = 0) -> NkiTensor:
    """New-style ``iota(dst, pattern=[[step, num], ...], offset, channel_multiplier)``."""
    if dst is None:
        raise _e.tracer().fail("iota with pattern= writes into dst=; pass the destination tile")
    view = pattern_view(dst.view, pattern, "iota")
    _e.emit(Iota(view, pattern_steps(pattern), int(offset), int(channel_multiplier), engine=Engine.GPSIMD))
    return dst


def pattern_view(view: View, pattern: Any, name: str) -> View:
    """``view`` seen with the free dims of an access ``pattern`` ``[[step, num], ...]``."""
    try:
        counts = tuple(int(num) for _, num in pattern)
    except (TypeError, ValueError):
        raise fail(f"{name}: pattern {pattern!r} is not a list of [step, num] pairs") from None
    if not 1 <= len(counts) <= 4:
        raise fail(f"{name}: pattern has {len(counts)} dimensions; give 1 to 4 [step, num] pairs")
    if math.prod(counts) != view.free_size:
        raise fail(f"{name}: pattern covers {math.prod(counts)} elements per partition, but the tile has {view.free_size}")
    if view.shape[1:] == counts:
        return view
    flat = _e.flat2d(view)
    strides = [math.prod(counts[k + 1:]) for k in range(len(counts))]
    return View(flat.tensor, flat.offset, (flat.dims[0], *zip(strides, counts)))


def pattern_steps(pattern: Any) -> tuple[int, ...]:
    """The steps of an access pattern ``[[step, num], ...]``."""
    return tuple(int(step) for step, _ in pattern)


def _affine_select_pattern(dst: NkiTensor | None, pattern: Any, channel_multiplier: int, on_true_tile: Any,
                           on_false_value: float, cmp_op: Any = None, offset: int = 0, dtype: Any = None) -> NkiTensor:
    """New-style ``affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op, offset)``:
    ``on_true_tile`` where ``cmp_op(offset + channel_multiplier * p + sum(step * i), 0)`` holds."""
    src = _e.readable(on_true_tile, "affine_select on_true_tile")
    out = out_tile(dst, src, dtype)
    cmp = alu(cmp_op) if cmp_op is not None else AluOp.IS_EQUAL
    if cmp not in COMPARISONS:
        raise _e.tracer().fail(f"affine_select: cmp_op {cmp.value} is not a comparison; use nl.equal, nl.greater_equal, ...")
    d, s = pattern_view(out.view, pattern, "affine_select"), pattern_view(src.view, pattern, "affine_select")
    _e.emit(AffineSelect(d, s, pattern_steps(pattern), int(offset), int(channel_multiplier), cmp,
                         float(on_false_value), engine=Engine.GPSIMD))
    return out


_CMP = {"lt": AluOp.IS_LT, "le": AluOp.IS_LE, "gt": AluOp.IS_GT, "ge": AluOp.IS_GE}


def affine_select(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``on_true`` where an affine condition of the indices holds, else ``on_false_value``
    (GpSimd): ``nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=t, on_false_value=-inf)``."""
    dst, rest = split_dst(args, kwargs, lambda a: is_tile(a[0]), "on_true_tile")
    if "pattern" in kwargs or (rest and isinstance(rest[0], (list, tuple))):
        kwargs.pop("name", None)
        return _affine_select_pattern(dst, *rest, dtype=dtype, **kwargs)
    pred = kwargs.pop("pred", rest[0] if rest else None)
    src = _e.readable(kwargs.pop("on_true_tile", rest[1] if len(rest) > 1 else None), "affine_select on_true_tile")
    fill = kwargs.pop("on_false_value", rest[2] if len(rest) > 2 else 0.0)
    if not isinstance(pred, Mask) or len(pred.conds) != 1:
        raise _e.tracer().fail("affine_select needs one affine condition of nl.arange indices, such as (i_p - i_f >= 0)")
    expr, op = pred.conds[0]
    out = out_tile(dst, src, dtype)
    steps, offset, cm = _affine_pattern(expr, src.shape)
    _e.emit(AffineSelect(out.view, src.view, steps, offset, cm, _CMP[op], float(fill), engine=Engine.GPSIMD))
    return out
