"""Reductions of ``nki.isa``: along the free axes (``tensor_reduce``,
``tensor_scalar_reduce``), across partitions (``tensor_partition_reduce``) and the
batch-norm statistics (``bn_stats``, ``bn_aggr``)."""

from __future__ import annotations

from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import BN_STATS_WIDTH, AluOp, BnAggr, BnStats, Engine, PartitionReduce, TensorReduce, TensorScalar, View
from trnsim.nki import emit as _e
from trnsim.nki.isa import accumulator
from trnsim.nki.isa.constants import reduce_cmd as reduce_cmd_enum
from trnsim.nki.isa._common import (IDLE, RESET_REDUCE, alu_operand, fail, is_tile, no_mask, out_tile, pick_engine,
                                    reduce_into, reduce_res_tile, reduction, split_dst, take, tile)
from trnsim.nki.reductions import reduce_axes, reduced_last, reduced_shape
from trnsim.nki.tiles import NkiTensor


def tensor_reduce(*args: Any, axis: Any = None, dtype: Any = None, negate: bool = False, keepdims: bool = False,
                  engine: Any = None, **kwargs: Any) -> NkiTensor:
    """Reduce ``data`` along its trailing free axes with ``op`` (nl.add, nl.maximum,
    nl.minimum): as many as ``axis`` names, since the instruction encodes a count of
    trailing axes (NKI's docs: "the last contiguous free dimension(s), ending at the final
    dimension"), so AWS's kernels write ``axis=1`` for the last axis of a [P, A, B] tile."""
    dst, rest = split_dst(args, kwargs, lambda a: is_tile(a[0]), "data")
    op = kwargs.pop("op", rest[0] if rest else None)
    data = _e.readable(kwargs.pop("data", rest[1] if len(rest) > 1 else None), "tensor_reduce data")
    if axis is None:
        axis = kwargs.pop("axis", rest[2] if len(rest) > 2 else -1)
    nd = len(data.shape)
    axes = tuple(range(nd - len(reduce_axes(data, axis)), nd))
    out = out_tile(dst, data, dtype, reduced_shape(tuple(data.shape), axes, keepdims))
    _e.reduce(out.view, reduced_last(data, data.view, axes), reduction(op), len(axes), pick_engine(engine, Engine.VECTOR),
              negate=bool(negate))
    return out


def tensor_scalar_reduce(*args: Any, dtype: Any = None, reverse0: bool = False, reduce_cmd: Any = None,
                         reduce_init: Any = None, reduce_res_negate: bool = False, **kwargs: Any) -> NkiTensor:
    """``data op0 operand0`` (vector engine) and its reduction over all free axes into
    ``reduce_res`` [P, 1] (nl.add, nl.maximum or nl.minimum)."""
    no_mask(kwargs, "tensor_scalar_reduce")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2 and is_tile(a[1]), "data")
    data = tile(take(kwargs, rest, 0, "data"), "tensor_scalar_reduce data")
    op0, operand0 = alu_operand(take(kwargs, rest, 1, "op0"), take(kwargs, rest, 2, "operand0"),
                                "tensor_scalar_reduce")
    red = reduction(take(kwargs, rest, 3, "reduce_op"))
    reduce_res = take(kwargs, rest, 4, "reduce_res")
    cmd = RESET_REDUCE if reduce_cmd is None else reduce_cmd
    if reduce_init is not None and cmd is not reduce_cmd_enum.load_reduce:
        raise fail(f"tensor_scalar_reduce: reduce_init is set only with reduce_cmd=load_reduce (got {cmd!r}), as NKI "
                   "documents")
    out = out_tile(dst, data, dtype)
    fused = _fused_reduce_res(reduce_res, cmd, data.view.partitions) if not reduce_res_negate else None
    if fused is not None:
        # one instruction: the operation and its reduction in one pass, into reduce_res
        index = _e.emit(TensorScalar(out.view, data.view, op0, operand0, None, None, bool(reverse0), red, fused,
                                     engine=Engine.VECTOR))
        if cmd is IDLE or index < 0:
            accumulator.idle()
        else:
            accumulator.kept("tensor_scalar_reduce", fused, index)
        return out
    _e.emit(TensorScalar(out.view, data.view, op0, operand0, None, None, bool(reverse0), engine=Engine.VECTOR))
    if cmd is IDLE:
        if reduce_res is not None:
            reduce_into("tensor_scalar_reduce", reduce_res, out, red)
        accumulator.idle()
    else:
        op, parts = accumulator.COMBINE[red], data.view.partitions
        begin = accumulator.start("tensor_scalar_reduce", cmd, op, reduce_init, parts)
        part = accumulator.scratch(begin, op, parts)
        _e.emit(TensorReduce(part.view if part is not None else accumulator.registers(parts), _e.flat2d(out.view), red,
                             1, engine=Engine.VECTOR))
        accumulator.finish("tensor_scalar_reduce", cmd, op, begin, part.view if part is not None else None, reduce_res,
                           parts)
    if reduce_res is not None and reduce_res_negate:
        _e.tensor_scalar(reduce_res.view, reduce_res.view, AluOp.MULTIPLY, -1.0)
    return out


def _fused_reduce_res(reduce_res: Any, cmd: Any, partitions: int) -> View | None:
    """Where a tensor_scalar_reduce writes its reduction as one instruction: its
    ``reduce_res`` ([P, 1]) when the reduction starts afresh and nothing reads the
    registers first (``reset_reduce``, into fp32, which the registers are taken to hold
    after; or ``idle``, into any dtype); None otherwise (the registers' own path)."""
    if reduce_res is None or (cmd is not IDLE and cmd is not RESET_REDUCE):
        return None
    res = reduce_res_tile("tensor_scalar_reduce", reduce_res, partitions)
    if cmd is RESET_REDUCE and res.dtype is not _dt.float32:
        return None
    return _e.flat2d(res.view)


def tensor_partition_reduce(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Reduce ``data`` [P, F] across partitions into [1, F] on GpSimd (nl.add, nl.maximum, nl.minimum)."""
    no_mask(kwargs, "tensor_partition_reduce")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 3, "data")
    op = reduction(take(kwargs, rest, 0, "op"))
    data = tile(take(kwargs, rest, 1, "data"), "tensor_partition_reduce data")
    v = _e.flat2d(data.view)
    out = dst if dst is not None else _e.new_tensor((1, v.free_size), _e.dtype_of(dtype, data.dtype))
    if out.view.free_size != v.free_size or out.view.partitions != 1:
        raise fail(f"tensor_partition_reduce: dst {list(out.shape)} must be [1, {v.free_size}]")
    _e.emit(PartitionReduce(_e.flat2d(out.view), v, op, engine=Engine.GPSIMD))
    return out


def bn_stats(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Per-partition statistics of ``data`` [P, F] (F <= 512) for :func:`bn_aggr`, one vector
    engine instruction: [P, 6] holding the mean, the sum of squared deviations and the count."""
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2, "data")
    data = _e.readable(kwargs.pop("data", rest[0] if rest else None), "bn_stats data")
    out = dst if dst is not None else _e.new_tensor((data.view.partitions, BN_STATS_WIDTH), _e.dtype_of(dtype, _dt.float32))
    _e.emit(BnStats(out.view, _e.flat2d(data.view), engine=Engine.VECTOR))
    return out


def bn_aggr(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Combine :func:`bn_stats` results [P, 6 * k] into [P, 2]: mean and population variance
    (one vector engine instruction)."""
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2, "data")
    data = _e.readable(kwargs.pop("data", rest[0] if rest else None), "bn_aggr data")
    out = dst if dst is not None else _e.new_tensor((data.view.partitions, 2), _e.dtype_of(dtype, _dt.float32))
    _e.emit(BnAggr(out.view, _e.flat2d(data.view), engine=Engine.VECTOR))
    return out
