"""Scans of ``nki.isa`` along the free axis: ``tensor_tensor_scan``,
``tensor_scalar_cumulative``, and the segment bounds of ``sequence_bounds``."""

from __future__ import annotations

from numbers import Real
from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import AluOp, Engine, SequenceBounds, TensorScalar, TensorTensorScan, View
from trnsim.nki import emit as _e
from trnsim.nki.isa import accumulator
from trnsim.nki.isa._common import (IDLE, RESET_REDUCE, alu, fail, is_tile, no_mask, not_both_psum, operand, out_tile,
                                    same_free, scalar_or_view, split_dst, take, tile)
from trnsim.nki.tiles import NkiTensor


def tensor_tensor_scan(*args: Any, dtype: Any = None, reverse0: bool = False, reverse1: bool = False,
                       **kwargs: Any) -> NkiTensor:
    """Running scan along the free axis (vector engine, fp32 math):
    ``dst[:, i] = op1(op0(data0[:, i], dst[:, i - 1]), data1[:, i])`` from ``initial`` (a
    number or a [P, 1] tile); ``data0``/``data1`` [P, F], not both in PSUM."""
    no_mask(kwargs, "tensor_tensor_scan")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 4 and is_tile(a[0])
                                and (is_tile(a[3]) or isinstance(a[3], Real)), "data0")
    a = tile(take(kwargs, rest, 0, "data0"), "tensor_tensor_scan data0")
    b = tile(take(kwargs, rest, 1, "data1"), "tensor_tensor_scan data1")
    initial = scalar_or_view(take(kwargs, rest, 2, "initial", 0.0), "tensor_tensor_scan initial")
    op0, op1 = alu(take(kwargs, rest, 3, "op0")), alu(take(kwargs, rest, 4, "op1"))
    not_both_psum(a, b, "tensor_tensor_scan", "data0", "data1")
    out = out_tile(dst, a, dtype)
    same_free("tensor_tensor_scan", out, a, b)
    _e.emit(TensorTensorScan(_e.flat2d(out.view), _e.flat2d(a.view), _e.flat2d(b.view), initial, op0, op1,
                             bool(reverse0), bool(reverse1), engine=Engine.VECTOR))
    return out


def tensor_scalar_cumulative(*args: Any, reduce_cmd: Any = None, reverse0: bool = False, dtype: Any = None,
                             **kwargs: Any) -> NkiTensor:
    """Running ``reg = op1(op0(src[i], imm0), reg)`` along the free axis, each step written to
    ``dst``; ``reg`` (the vector engine's accumulator) starts at op1's identity (reset_reduce),
    ``imm1`` (load_reduce, a number or [P, 1] tile) or what the last accumulating instruction
    left (reduce). Runs as a tensor_scalar then a tensor_tensor_scan on the vector engine."""
    no_mask(kwargs, "tensor_scalar_cumulative")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2 and is_tile(a[1]), "src")
    src = tile(take(kwargs, rest, 0, "src"), "tensor_scalar_cumulative src")
    op0, op1 = alu(take(kwargs, rest, 1, "op0")), alu(take(kwargs, rest, 2, "op1"))
    imm0 = operand(take(kwargs, rest, 3, "imm0"))
    imm1 = take(kwargs, rest, 4, "imm1")
    if op1 not in accumulator.IDENTITY:
        raise fail(f"tensor_scalar_cumulative: op1 {op1.value} must be add, subtract, multiply, maximum or minimum")
    cmd = RESET_REDUCE if reduce_cmd is None else reduce_cmd
    if cmd is IDLE:
        raise fail("tensor_scalar_cumulative: reduce_cmd=idle leaves the accumulator undefined; use reset_reduce, "
                   "load_reduce or reduce")
    parts = src.view.partitions
    initial = accumulator.start("tensor_scalar_cumulative", cmd, op1, imm1, parts)
    out = out_tile(dst, src, dtype)
    same_free("tensor_scalar_cumulative", out, src)
    step = _e.new_tensor((parts, src.view.free_size), _dt.float32)
    _e.emit(TensorScalar(step.view, _e.flat2d(src.view), op0, imm0, None, None, bool(reverse0), engine=Engine.VECTOR))
    # the running value stays fp32 in the registers whatever dst's dtype
    scan = out if out.dtype is _dt.float32 else _e.new_tensor((parts, src.view.free_size), _dt.float32)
    _e.emit(TensorTensorScan(_e.flat2d(scan.view), step.view, step.view, initial, op1, AluOp.BYPASS,
                             engine=Engine.VECTOR))
    if scan is not out:
        _e.copy_to(_e.flat2d(out.view), scan.view)
    v = _e.flat2d(scan.view)
    last = View(v.tensor, v.offset + (v.free_size - 1) * v.dims[1][0], (v.dims[0], (1, 1)))
    accumulator.finish("tensor_scalar_cumulative", cmd, op1, accumulator.IDENTITY[op1], last, None, parts)
    return out


def sequence_bounds(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Segment bounds of ``segment_ids`` [1, N] (fp32 or int32) into [1, 2, N]: the start and
    one past the end of each element's segment; padding (id 0) gets (N, -1). GpSimd."""
    no_mask(kwargs, "sequence_bounds")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2, "segment_ids")
    ids = tile(take(kwargs, rest, 0, "segment_ids"), "sequence_bounds segment_ids")
    if ids.view.partitions != 1:
        raise fail(f"sequence_bounds: the partition dimension must be 1, got {ids.view.partitions}")
    for t in (ids, dst):
        if t is not None and t.dtype not in (_dt.float32, _dt.int32):
            raise fail(f"sequence_bounds: {t.name} is {t.dtype.name}; segment ids and bounds must be float32 or int32")
    n = ids.view.free_size
    out = dst if dst is not None else _e.new_tensor((1, 2, n), _e.dtype_of(dtype, ids.dtype))
    if out.view.free_size != 2 * n:
        raise fail(f"sequence_bounds: dst {list(out.shape)} must hold [1, 2, {n}]")
    _e.emit(SequenceBounds(out.view, ids.view, engine=Engine.GPSIMD))
    return out
