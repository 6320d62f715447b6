"""Selects of ``nki.isa`` on the vector engine: ``range_select``, ``select_reduce`` and
``tensor_copy_predicated``."""

from __future__ import annotations

from typing import Any

import numpy as np

from trnsim.isa import AluOp, Engine, Memset, RangeSelect, ReduceOp, Select, TensorReduce, View
from trnsim.nki import emit as _e
from trnsim.nki.isa import accumulator
from trnsim.nki.isa._common import (COMPARISONS, IDLE, RESET_REDUCE, alu, fail, is_tile, needs_version, no_mask,
                                    out_tile, reduce_into, reduction, same_free, scalar_or_view, split_dst,
                                    take, tile)
from trnsim.nki.tiles import NkiTensor

FP32_MIN = float(np.finfo(np.float32).min)


def range_select(*args: Any, reduce_cmd: Any = None, reduce_res: Any = None, reduce_op: Any = None,
                 range_start: int = 0, on_false_value: float = FP32_MIN, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``on_true_tile`` where ``comp_op0(range_start + i, bound0)`` and ``comp_op1(range_start + i,
    bound1)`` hold (``i`` the free index, bounds [P, 1] fp32), else ``on_false_value`` (must be
    FP32_MIN); ``reduce_res`` [P, 1] gets the row maximum (vector engine)."""
    no_mask(kwargs, "range_select")
    needs_version("range_select", 3)
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2 and is_tile(a[1]), "on_true_tile")
    src = tile(take(kwargs, rest, 0, "on_true_tile"), "range_select on_true_tile")
    cmp0, cmp1 = alu(take(kwargs, rest, 1, "comp_op0")), alu(take(kwargs, rest, 2, "comp_op1"))
    bound0 = tile(take(kwargs, rest, 3, "bound0"), "range_select bound0")
    bound1 = tile(take(kwargs, rest, 4, "bound1"), "range_select bound1")
    for op in (cmp0, cmp1):
        if op not in COMPARISONS:
            raise fail(f"range_select: {op.value} is not a comparison; use nl.equal, nl.less, nl.greater_equal, ...")
    if reduce_op is not None and reduction(reduce_op) is not ReduceOp.MAX:
        raise fail("range_select: reduce_op must be nl.maximum, the only reduction NKI supports here")
    if float(np.float32(on_false_value)) != FP32_MIN:
        raise fail(f"range_select: on_false_value must be FP32_MIN ({FP32_MIN}) due to hardware constraints, "
                    f"got {on_false_value}")
    out = out_tile(dst, src, dtype)
    same_free("range_select", out, src)
    parts = src.view.partitions
    bound0, bound1 = (NkiTensor(b._placement, _e.partition_rows(b, parts), b.bases) for b in (bound0, bound1))
    cmd = RESET_REDUCE if reduce_cmd is None else reduce_cmd
    if cmd is IDLE:
        res = tile(reduce_res, "range_select reduce_res").view if reduce_res is not None else None
        _e.emit(RangeSelect(_e.flat2d(out.view), _e.flat2d(src.view), cmp0, cmp1, bound0.view, bound1.view,
                            int(range_start), FP32_MIN, res, engine=Engine.VECTOR))
        accumulator.idle()
        return out
    begin = accumulator.start("range_select", cmd, AluOp.MAXIMUM, None, parts)
    part = accumulator.scratch(begin, AluOp.MAXIMUM, parts)
    _e.emit(RangeSelect(_e.flat2d(out.view), _e.flat2d(src.view), cmp0, cmp1, bound0.view, bound1.view, int(range_start),
                        FP32_MIN, part.view if part is not None else accumulator.registers(parts), engine=Engine.VECTOR))
    accumulator.finish("range_select", cmd, AluOp.MAXIMUM, begin, part.view if part is not None else None, reduce_res,
                       parts)
    return out


def select_reduce(*args: Any, reduce_res: Any = None, reduce_cmd: Any = None, reduce_op: Any = None,
                  reverse_pred: bool = False, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``on_true where predicate != 0 else on_false`` (``on_false`` a tile or number; swapped with
    ``reverse_pred``) on the vector engine; ``reduce_res`` [P, 1] gets the row reduction (max)."""
    no_mask(kwargs, "select_reduce")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 4 and is_tile(a[1]), "predicate")
    pred = tile(take(kwargs, rest, 0, "predicate"), "select_reduce predicate")
    on_true = tile(take(kwargs, rest, 1, "on_true"), "select_reduce on_true")
    on_false = take(kwargs, rest, 2, "on_false", 0.0)
    red = reduction(reduce_op) if reduce_op is not None else ReduceOp.MAX
    out = out_tile(dst, on_true, dtype)
    same_free("select_reduce", out, on_true, pred)
    first, second = _e.flat2d(on_true.view), _per_partition(on_false, out, "select_reduce on_false")
    if reverse_pred:
        if not isinstance(second, View):
            fill = _e.like(on_true)
            _e.emit(Memset(fill.view, second, engine=Engine.VECTOR))
            second = _e.flat2d(fill.view)
        first, second = second, first
    _e.emit(Select(_e.flat2d(out.view), _e.flat2d(pred.view), first, second, engine=Engine.VECTOR))
    cmd = IDLE if reduce_cmd is None else reduce_cmd
    if cmd is IDLE:
        if reduce_res is not None:
            reduce_into("select_reduce", reduce_res, out, red)
        accumulator.idle()
        return out
    op, parts = accumulator.COMBINE[red], out.view.partitions
    begin = accumulator.start("select_reduce", cmd, op, None, parts)
    part = accumulator.scratch(begin, op, parts)
    _e.emit(TensorReduce(part.view if part is not None else accumulator.registers(parts), _e.flat2d(out.view), red, 1,
                         engine=Engine.VECTOR))
    accumulator.finish("select_reduce", cmd, op, begin, part.view if part is not None else None, reduce_res, parts)
    return out


def _per_partition(x: Any, out: NkiTensor, what: str) -> float | View:
    """A number, a tile shaped as ``out``, or a [P, 1] tile read as one value per partition
    (a view that repeats it along the free axis)."""
    value = scalar_or_view(x, what)
    if not isinstance(value, View):
        return value
    v = _e.flat2d(value)
    if v.partitions == out.view.partitions and v.free_size == 1 and out.view.free_size > 1:
        return View(v.tensor, v.offset, (v.dims[0], (0, out.view.free_size)))
    if v.partitions != out.view.partitions or v.free_size != out.view.free_size:
        raise fail(f"{what} {list(x.shape)} must be a number, [{out.view.partitions}, 1] or shaped as dst "
                   f"{list(out.shape)}")
    return v


def tensor_copy_predicated(*args: Any, reverse_pred: bool = False, **kwargs: Any) -> NkiTensor:
    """Copy ``src`` (a tile or a number) into ``dst`` where ``predicate`` is nonzero (zero with
    ``reverse_pred``); ``dst`` keeps its values elsewhere (vector engine)."""
    no_mask(kwargs, "tensor_copy_predicated")
    dst = tile(take(kwargs, args, 0, "dst"), "tensor_copy_predicated dst")
    src = take(kwargs, args, 1, "src")
    pred = tile(take(kwargs, args, 2, "predicate"), "tensor_copy_predicated predicate")
    value = scalar_or_view(src, "tensor_copy_predicated src")
    if not isinstance(value, View):
        fill = _e.like(dst)
        _e.emit(Memset(fill.view, value, engine=Engine.VECTOR))
        value = fill.view
    first, second = (dst.view, value) if reverse_pred else (value, dst.view)
    _e.emit(Select(dst.view, pred.view, first, second, engine=Engine.VECTOR))
    return dst
