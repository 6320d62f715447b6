"""Elementwise instructions of ``nki.isa`` on the vector engine (or GpSimd):
``tensor_tensor``, ``tensor_scalar``, ``scalar_tensor_tensor``, ``reciprocal``,
``tensor_copy`` and ``memset``."""

from __future__ import annotations

from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import Engine, Reciprocal, ScalarTensorTensor
from trnsim.nki import emit as _e
from trnsim.nki.isa._common import (alu, alu_operand, chosen_engine, is_tile, no_mask, not_both_psum, operand, out_tile,
                                    pick_engine, same_free, scalar_or_view, split_dst, take, tile)
from trnsim.nki.tiles import Mask, NkiTensor


def tensor_tensor(*args: Any, op: Any = None, dtype: Any = None, engine: Any = None, mask: Mask | None = None,
                  **kwargs: Any) -> NkiTensor:
    """``op(data1, data2)`` elementwise on the vector engine (or GpSimd)."""
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 3 and is_tile(a[2]), "data1")
    a = _e.readable(kwargs.pop("data1", rest[0] if rest else None), "tensor_tensor data1")
    b = _e.readable(kwargs.pop("data2", rest[1] if len(rest) > 1 else None), "tensor_tensor data2")
    if op is None and len(rest) > 2:
        op = rest[2]
    out = out_tile(dst, a, dtype)
    d, va, vb = _e.clip(mask, out, a, b)
    _e.tensor_tensor(d, va, vb, alu(op), chosen_engine(engine))
    return out


def tensor_scalar(*args: Any, op0: Any = None, operand0: Any = None, reverse0: bool = False, op1: Any = None,
                  operand1: Any = None, reverse1: bool = False, dtype: Any = None, engine: Any = None,
                  mask: Mask | None = None, **kwargs: Any) -> NkiTensor:
    """``op1(op0(data, operand0), operand1)``; operands are numbers or [P, 1] tiles."""
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2 and is_tile(a[1]), "data")
    data = _e.readable(kwargs.pop("data", rest[0] if rest else None), "tensor_scalar data")
    if op0 is None and len(rest) > 2:
        op0, operand0 = rest[1], rest[2]
    if reverse1:
        raise _e.tracer().fail("tensor_scalar: reverse1 is not supported; swap the operation instead")
    out = out_tile(dst, data, dtype)
    alu0, operand0 = alu_operand(op0, operand0, "tensor_scalar")
    alu1, operand1 = alu_operand(op1, operand1, "tensor_scalar") if op1 is not None else (None, operand(operand1))
    (d, src), (o0, o1) = _e.clip_rows(mask, [out, data], [operand0, operand1])
    o0, o1 = _e.partition_rows(o0, src.partitions), _e.partition_rows(o1, src.partitions)
    _e.tensor_scalar(d, src, alu0, o0, alu1, o1, reverse0, chosen_engine(engine))
    return out


def scalar_tensor_tensor(*args: Any, dtype: Any = None, reverse0: bool = False, reverse1: bool = False,
                         engine: Any = None, **kwargs: Any) -> NkiTensor:
    """``op1(op0(data, operand0), operand1)`` in one vector engine instruction: ``operand0`` a
    number or [P, 1] tile, ``operand1`` a tile of ``data``'s shape (not both it and data in PSUM)."""
    no_mask(kwargs, "scalar_tensor_tensor")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2 and is_tile(a[1]), "data")
    data = tile(take(kwargs, rest, 0, "data"), "scalar_tensor_tensor data")
    op0 = alu(take(kwargs, rest, 1, "op0"))
    operand0 = _e.partition_rows(scalar_or_view(take(kwargs, rest, 2, "operand0"), "scalar_tensor_tensor operand0"),
                                 data.view.partitions)
    op1 = alu(take(kwargs, rest, 3, "op1"))
    operand1 = tile(take(kwargs, rest, 4, "operand1"), "scalar_tensor_tensor operand1")
    not_both_psum(data, operand1, "scalar_tensor_tensor", "data", "operand1")
    out = out_tile(dst, data, dtype)
    same_free("scalar_tensor_tensor", out, data, operand1)
    _e.emit(ScalarTensorTensor(out.view, data.view, op0, operand0, op1, operand1.view, bool(reverse0), bool(reverse1),
                               engine=pick_engine(engine, Engine.VECTOR)))
    return out


def reciprocal(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``1 / data`` elementwise on the vector engine (fp32 math)."""
    no_mask(kwargs, "reciprocal")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2, "data")
    data = tile(take(kwargs, rest, 0, "data"), "reciprocal data")
    out = out_tile(dst, data, dtype)
    same_free("reciprocal", out, data)
    _e.emit(Reciprocal(out.view, data.view, engine=Engine.VECTOR))
    return out


def tensor_copy(*args: Any, dtype: Any = None, engine: Any = None, mask: Mask | None = None, **kwargs: Any) -> NkiTensor:
    """Copy ``src`` converting to the destination's dtype (vector engine by default)."""
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2, "src")
    src = _e.readable(kwargs.pop("src", rest[0] if rest else None), "tensor_copy src")
    out = out_tile(dst, src, dtype)
    d, s = _e.clip(mask, out, src)
    _e.copy_to(d, s, chosen_engine(engine))
    return out


def memset(*args: Any, value: Any = None, dtype: Any = None, engine: Any = None, **kwargs: Any) -> NkiTensor:
    """Fill a tile: ``memset(dst, value)`` or ``t = memset(shape, value, dtype)``."""
    dst = kwargs.pop("dst", None)
    rest = list(args)
    if dst is None and rest and is_tile(rest[0]):
        dst = rest.pop(0)
    if dst is None:
        shape = kwargs.pop("shape", rest.pop(0) if rest else None)
        if value is None:
            value = rest.pop(0) if rest else 0.0
        dst = _e.new_tensor(shape, _e.dtype_of(dtype or (rest.pop(0) if rest else None), _dt.float32))
    elif value is None:
        value = rest.pop(0) if rest else 0.0
    _e.memset(dst.view, float(value), chosen_engine(engine))
    return dst
