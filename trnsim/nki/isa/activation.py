"""The scalar engine's activations of ``nki.isa``: ``activation`` (with its optional
reduction), ``activation_reduce``, ``activate2`` and ``exponential``."""

from __future__ import annotations

from numbers import Real
from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import ActivationFunc, AluOp, Engine, Memset, ReduceOp, TensorScalar
from trnsim.nki import emit as _e
from trnsim.nki.compute import prelu
from trnsim.nki.isa import accumulator
from trnsim.nki.isa.constants import reduce_cmd as reduce_cmd_enum
from trnsim.nki.isa._common import (IDLE, RESET_REDUCE, act, alu, fail, is_tile, needs_version, no_mask, only_reset,
                                    operand, out_tile, reduction, split_dst, take, tile)
from trnsim.nki.tiles import Mask, NkiTensor


def activation(*args: Any, bias: Any = None, scale: Any = 1.0, reduce_op: Any = None, reduce_res: Any = None,
               dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> NkiTensor:
    """``op(data * scale + bias)`` on the scalar engine; ``bias`` and a tile ``scale`` are
    [P, 1]. With ``reduce_op`` (nl.add), ``reduce_res`` [P, 1] gets the sum of the outputs."""
    dst, rest = split_dst(args, kwargs, lambda a: is_tile(a[0]), "data")
    only_reset("activation", kwargs.pop("reduce_cmd", None), (IDLE, RESET_REDUCE))
    op = kwargs.pop("op", rest[0] if rest else None)
    data = _e.readable(kwargs.pop("data", rest[1] if len(rest) > 1 else None), "activation data")
    out = out_tile(dst, data, dtype)
    if getattr(op, "__wrapped__", op) is prelu:   # nl.prelu is prelu taking a bool mask
        return _prelu(out, data, bias, scale, kwargs.pop("relu_param", None), reduce_op, mask)
    func = act(op)
    b = _e.readable(bias, "activation bias").view if bias is not None else None
    s = float(scale) if isinstance(scale, Real) else _e.readable(scale, "activation scale").view
    red = reduction(reduce_op) if reduce_op is not None else None
    if (red is None) != (reduce_res is None):
        raise _e.tracer().fail("activation: reduce_op and reduce_res go together")
    (d, src), (b, s, r) = _e.clip_rows(mask, [out, data], [b, s, reduce_res])
    b, s = _e.partition_rows(b, src.partitions), _e.partition_rows(s, src.partitions)
    _e.activation(d, src, func, b, s, red, r)
    return out


def _prelu(out: NkiTensor, data: NkiTensor, bias: Any, scale: Any, slope: Any, reduce_op: Any,
           mask: Mask | None) -> NkiTensor:
    """``activation(op=prelu, relu_param=slope)``: ``data * scale + bias`` on the scalar
    engine, then prelu's three vector-engine instructions into ``out``."""
    if slope is None or reduce_op is not None:
        raise _e.tracer().fail("activation with op=prelu needs relu_param= (the slope for negative inputs) "
                               "and takes no reduce_op in trnsim")
    pre = activation(op=ActivationFunc.IDENTITY, data=data, bias=bias, scale=scale, dtype=_dt.float32, mask=mask)
    return prelu(pre, slope, dtype=out.dtype, mask=mask, out=out)


def activation_reduce(*args: Any, **kwargs: Any) -> NkiTensor:
    """:func:`nki.isa.activation` with its reduction along the free axis into ``reduce_res`` [P, 1]."""
    if "reduce_op" not in kwargs or "reduce_res" not in kwargs:
        raise fail("activation_reduce needs reduce_op= and reduce_res=")
    return activation(*args, **kwargs)


_ACTIVATE2_PAIRS = {(AluOp.MULTIPLY, AluOp.ADD), (AluOp.MULTIPLY, AluOp.SUBTRACT), (AluOp.MULTIPLY, AluOp.BYPASS),
                    (AluOp.ADD, AluOp.BYPASS), (AluOp.SUBTRACT, AluOp.BYPASS), (AluOp.BYPASS, AluOp.BYPASS)}


def activate2(*args: Any, relu_param: Any = 0.0, reverse0: bool = False, reverse1: bool = False, dtype: Any = None,
              **kwargs: Any) -> NkiTensor:
    """``op((data op0 imm0) op1 imm1)`` on the scalar engine (NeuronCore-v4+), with optional
    ``reduce_op``/``reduce_res`` as :func:`nki.isa.activation`. Runs as a scalar-engine
    tensor_scalar then an activation."""
    no_mask(kwargs, "activate2")
    needs_version("activate2", 4)
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 3 and is_tile(a[2]), "data")
    op = take(kwargs, rest, 0, "op")
    data = tile(take(kwargs, rest, 1, "data"), "activate2 data")
    imm0, imm1 = take(kwargs, rest, 2, "imm0"), take(kwargs, rest, 3, "imm1")
    op0, op1 = alu(take(kwargs, rest, 4, "op0")), alu(take(kwargs, rest, 5, "op1"))
    if (op0, op1) not in _ACTIVATE2_PAIRS:
        raise fail(f"activate2: (op0, op1) = ({op0.value}, {op1.value}) is not one of the six supported pairs: "
                    "(multiply, add), (multiply, subtract), (multiply, bypass), (add, bypass), (subtract, bypass), "
                    "(bypass, bypass)")
    if not isinstance(relu_param, Real) or relu_param != 0.0:
        raise fail("activate2: relu_param (parameterised activations such as PReLU) is not modelled; leave it 0")
    if reverse1:
        raise fail("activate2: reverse1 is not supported; use op1=nl.add with a negated imm1 instead")
    source = data
    if op0 is not AluOp.BYPASS:
        source = _e.new_tensor(data.shape, _dt.float32)
        _e.emit(TensorScalar(source.view, data.view, op0, operand(imm0), None if op1 is AluOp.BYPASS else op1,
                             operand(imm1), bool(reverse0), engine=Engine.SCALAR))
    out = out_tile(dst, data, dtype)
    reduce = {k: kwargs.pop(k) for k in ("reduce_op", "reduce_res", "reduce_cmd") if k in kwargs}
    return activation(out, op, source, **reduce)


def exponential(*args: Any, max_value: Any = 0.0, reduce_res: Any = None, reduce_cmd: Any = None,
                reduce_init: Any = 0.0, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``exp(src - max_value)`` (``max_value`` a number or [P, 1] tile); with ``reduce_res`` [P, 1]
    also the sum of the results. Runs as a scalar engine activation in trnsim."""
    no_mask(kwargs, "exponential")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2, "src")
    src = tile(take(kwargs, rest, 0, "src"), "exponential src")
    cmd = IDLE if reduce_cmd is None else reduce_cmd
    if cmd is not reduce_cmd_enum.load_reduce and (not isinstance(reduce_init, Real) or reduce_init != 0.0):
        raise fail(f"exponential: reduce_init must be unset or 0.0 unless reduce_cmd=load_reduce (got {cmd!r}), as NKI "
                   "documents")
    out = out_tile(dst, src, dtype)
    bias = _e.new_tensor((src.view.partitions, 1), _dt.float32)
    if isinstance(max_value, Real):
        _e.emit(Memset(bias.view, -float(max_value), engine=Engine.VECTOR))
    else:
        _e.tensor_scalar(bias.view, tile(max_value, "exponential max_value").view, AluOp.MULTIPLY, -1.0)
    if cmd is IDLE:
        red = ReduceOp.ADD if reduce_res is not None else None
        _e.activation(out.view, src.view, ActivationFunc.EXP, bias.view, 1.0, red,
                      tile(reduce_res, "exponential reduce_res").view if reduce_res is not None else None)
        accumulator.idle()
        return out
    parts = src.view.partitions
    begin = accumulator.start("exponential", cmd, AluOp.ADD, reduce_init, parts)
    part = accumulator.scratch(begin, AluOp.ADD, parts)
    _e.activation(out.view, src.view, ActivationFunc.EXP, bias.view, 1.0, ReduceOp.ADD,
                  part.view if part is not None else accumulator.registers(parts))
    accumulator.finish("exponential", cmd, AluOp.ADD, begin, part.view if part is not None else None, reduce_res, parts)
    return out
