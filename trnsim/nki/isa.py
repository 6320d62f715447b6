"""``nki.isa`` (``nisa``): one call per engine instruction, with NKI's names.

Each call works in both styles NKI kernels are written in: pass the destination
tile first (``nisa.tensor_copy(dst=t, src=s)``, ``nisa.nc_matmul(acc, a, b)``), or
leave it out and take the returned tile (``t = nisa.tensor_copy(s, dtype=...)``).
``engine=`` picks the engine where the instruction can run on several.
"""

from __future__ import annotations

from numbers import Real
from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import (
    BN_STATS_WIDTH,
    ActivationFunc,
    AffineSelect,
    AluOp,
    BnAggr,
    BnStats,
    Engine,
    Iota,
    Memory,
    Memset,
    ReduceOp,
)
from trnsim.nki import emit as _e
from trnsim.nki import language as nl
from trnsim.nki.tiles import Affine, Mask, NkiTensor

__all__ = [
    "nc_matmul", "nc_transpose", "activation", "tensor_tensor", "tensor_scalar", "tensor_reduce", "tensor_copy",
    "memset", "iota", "affine_select", "dma_copy", "bn_stats", "bn_aggr",
    "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine", "unknown_engine",
    # trnsim.nki.isa_constants
    "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version", "dma_engine", "constants",
    "get_nc_version", "get_nc_sub_version",
    # trnsim.nki.isa_more, isa_random, isa_refused, isa_world
    "tensor_tensor_scan", "tensor_scalar_cumulative", "scalar_tensor_tensor", "reciprocal", "tensor_scalar_reduce", "activation_reduce", "activate2",
    "exponential", "range_select", "select_reduce", "tensor_copy_predicated", "sequence_bounds", "max8",
    "nc_find_index8", "nc_match_replace8", "nc_stream_shuffle", "tensor_partition_reduce", "local_gather",
    "nc_n_gather", "nonzero_with_count", "dma_transpose", "rng", "rand2", "set_rng_seed", "rand_set_state", "rand_get_state", "dropout", "VirtualRegister",
    "register_alloc", "register_move", "core_barrier", "sendrecv",
]

tensor_engine = Engine.TENSOR
vector_engine = Engine.VECTOR
scalar_engine = Engine.SCALAR
gpsimd_engine = Engine.GPSIMD
unknown_engine = None

# numpy / nl functions that NKI passes as ``op``: map them to the engines' operations.
_ALU_NAMES = {"add": AluOp.ADD, "subtract": AluOp.SUBTRACT, "multiply": AluOp.MULTIPLY, "divide": AluOp.DIVIDE,
              "maximum": AluOp.MAXIMUM, "minimum": AluOp.MINIMUM, "power": AluOp.POW, "equal": AluOp.IS_EQUAL,
              "not_equal": AluOp.NOT_EQUAL, "greater": AluOp.IS_GT, "greater_equal": AluOp.IS_GE, "less": AluOp.IS_LT,
              "less_equal": AluOp.IS_LE, "bypass": AluOp.BYPASS,
              "bitwise_and": AluOp.BITWISE_AND, "bitwise_or": AluOp.BITWISE_OR, "bitwise_xor": AluOp.BITWISE_XOR,
              "left_shift": AluOp.LEFT_SHIFT, "right_shift": AluOp.RIGHT_SHIFT}
_REDUCE_NAMES = {"add": ReduceOp.ADD, "sum": ReduceOp.ADD, "maximum": ReduceOp.MAX, "max": ReduceOp.MAX, "amax": ReduceOp.MAX,
                 "minimum": ReduceOp.MIN, "min": ReduceOp.MIN, "amin": ReduceOp.MIN}
_ACT_NAMES = {f.value: f for f in ActivationFunc} | {"copy": ActivationFunc.IDENTITY, "gelu_apprx_tanh": ActivationFunc.GELU_TANH}


def _name(op: Any) -> str:
    return op.value if hasattr(op, "value") else getattr(op, "__name__", str(op))


def _lookup(op: Any, kind: type, names: dict[str, Any], what: str, choices: str) -> Any:
    """The engine operation ``op`` (an enum member, or an nl/numpy function) stands for."""
    if isinstance(op, kind):
        return op
    found = names.get(_name(op))
    if found is None:
        raise _e.tracer().fail(f"op {op!r} is not {what}; use {choices}")
    return found


def _alu(op: Any) -> AluOp:
    return _lookup(op, AluOp, _ALU_NAMES, "an ALU operation", "one of nl." + ", nl.".join(_ALU_NAMES))


def _red(op: Any) -> ReduceOp:
    return _lookup(op, ReduceOp, _REDUCE_NAMES, "a reduction", "nl.add, nl.maximum or nl.minimum")


def _act(op: Any) -> ActivationFunc:
    return _lookup(op, ActivationFunc, _ACT_NAMES, "an activation function",
                   "one of nl." + ", nl.".join(f.value for f in ActivationFunc))


def _split_dst(args: tuple, kwargs: dict, first_is_dst: Any, operand: str) -> tuple[NkiTensor | None, tuple]:
    """Destination-passing calls have ``dst=``, or a tile as first argument: one followed by
    the operands (``first_is_dst``), or one given beside the ``operand`` keyword."""
    if "dst" in kwargs:
        return kwargs.pop("dst"), args
    if args and (first_is_dst(args) or (operand in kwargs and _is_tile(args[0]))):
        return args[0], args[1:]
    return None, args


def _engine(engine: Any, default: Engine) -> Engine:
    return _e.tracer().engine_for(engine, default)


def _out(dst: NkiTensor | None, ref: NkiTensor, dtype: Any, shape: Any = None, buffer: Memory = Memory.SBUF) -> NkiTensor:
    if dst is not None:
        return dst
    return _e.new_tensor(shape or ref.shape, _e.dtype_of(dtype, ref.dtype if ref.buffer is Memory.SBUF else _dt.float32), buffer)


def _is_tile(x: Any) -> bool:
    return isinstance(x, NkiTensor)


def nc_matmul(*args: Any, **kwargs: Any) -> NkiTensor:
    """``stationary.T @ moving`` on the tensor engine: ``nc_matmul(dst, stationary, moving)``
    accumulates into the PSUM tile ``dst`` (the first matmul into fresh space starts the
    accumulation group); ``nc_matmul(stationary, moving)`` returns a fresh PSUM tile.
    stationary [K, M] (K <= 128 partitions, M <= 128), moving [K, N] (N <= 512)."""
    dst, rest = _split_dst(args, kwargs, lambda a: len(a) >= 3, "stationary")
    if kwargs.pop("is_transpose", False):
        raise _e.tracer().fail("nc_matmul: is_transpose=True is not supported; use nisa.nc_transpose")
    stationary = kwargs.pop("stationary", rest[0] if rest else None)
    moving = kwargs.pop("moving", rest[1] if len(rest) > 1 else None)
    result = nl.matmul(stationary, moving, transpose_x=True)
    if dst is None:
        return result.materialize()
    result.accumulate_into(dst)
    return dst


def nc_transpose(*args: Any, engine: Any = None, **kwargs: Any) -> NkiTensor:
    """[P, F] -> [F, P]: through the PE array (tensor engine, into PSUM) by default."""
    dst, rest = _split_dst(args, kwargs, lambda a: len(a) >= 2, "data")
    data = _e.readable(kwargs.pop("data", rest[0] if rest else None), "nc_transpose data")
    eng = _engine(engine, Engine.TENSOR)
    if eng is Engine.VECTOR:
        return _more.vector_transpose(dst, data)
    if eng is not Engine.TENSOR:
        raise _e.tracer().fail("nc_transpose runs on the tensor engine or (32x32 at most) the vector engine; "
                               "pass engine=nisa.tensor_engine or nisa.vector_engine")
    out = dst if dst is not None else _e.new_tensor((data.view.free_size, data.view.partitions), data.dtype, Memory.PSUM)
    _e.transpose(out.view, _e.flat2d(data.view))
    return out


def activation(*args: Any, bias: Any = None, scale: Any = 1.0, reduce_op: Any = None, reduce_res: Any = None,
               dtype: Any = None, mask: Mask | None = None, **kwargs: Any) -> NkiTensor:
    """``op(data * scale + bias)`` on the scalar engine; ``bias`` and a tile ``scale`` are
    [P, 1]. With ``reduce_op`` (nl.add), ``reduce_res`` [P, 1] gets the sum of the outputs."""
    dst, rest = _split_dst(args, kwargs, lambda a: _is_tile(a[0]), "data")
    _more._only_reset("activation", kwargs.pop("reduce_cmd", None), (_more._IDLE, _more._RESET_REDUCE))
    op = kwargs.pop("op", rest[0] if rest else None)
    data = _e.readable(kwargs.pop("data", rest[1] if len(rest) > 1 else None), "activation data")
    out = _out(dst, data, dtype)
    if op is nl.prelu:
        return _prelu(out, data, bias, scale, kwargs.pop("relu_param", None), reduce_op, mask)
    func = _act(op)
    b = _e.readable(bias, "activation bias").view if bias is not None else None
    s = float(scale) if isinstance(scale, Real) else _e.readable(scale, "activation scale").view
    red = _red(reduce_op) if reduce_op is not None else None
    if (red is None) != (reduce_res is None):
        raise _e.tracer().fail("activation: reduce_op and reduce_res go together")
    d, src = _e.clip(mask, out, data)
    _e.activation(d, src, func, b, s, red, reduce_res.view if reduce_res is not None else None)
    return out


def _prelu(out: NkiTensor, data: NkiTensor, bias: Any, scale: Any, slope: Any, reduce_op: Any,
           mask: Mask | None) -> NkiTensor:
    """``activation(op=nl.prelu, relu_param=slope)``: ``data * scale + bias`` on the scalar
    engine, then nl.prelu's three vector-engine instructions into ``out``."""
    if slope is None or reduce_op is not None:
        raise _e.tracer().fail("activation with op=nl.prelu needs relu_param= (the slope for negative inputs) "
                               "and takes no reduce_op in trnsim")
    pre = activation(op=ActivationFunc.IDENTITY, data=data, bias=bias, scale=scale, dtype=_dt.float32, mask=mask)
    return nl.prelu(pre, slope, dtype=out.dtype, mask=mask, out=out)


def tensor_tensor(*args: Any, op: Any = None, dtype: Any = None, engine: Any = None, mask: Mask | None = None,
                  **kwargs: Any) -> NkiTensor:
    """``op(data1, data2)`` elementwise on the vector engine (or GpSimd)."""
    dst, rest = _split_dst(args, kwargs, lambda a: len(a) >= 3 and _is_tile(a[2]), "data1")
    a = _e.readable(kwargs.pop("data1", rest[0] if rest else None), "tensor_tensor data1")
    b = _e.readable(kwargs.pop("data2", rest[1] if len(rest) > 1 else None), "tensor_tensor data2")
    if op is None and len(rest) > 2:
        op = rest[2]
    out = _out(dst, a, dtype)
    d, va, vb = _e.clip(mask, out, a, b)
    _e.tensor_tensor(d, va, vb, _alu(op), _engine(engine, Engine.VECTOR))
    return out


def _operand(v: Any) -> Any:
    if v is None or isinstance(v, Real):
        return None if v is None else float(v)
    return _e.readable(v, "tensor_scalar operand").view


def tensor_scalar(*args: Any, op0: Any = None, operand0: Any = None, reverse0: bool = False, op1: Any = None,
                  operand1: Any = None, reverse1: bool = False, dtype: Any = None, engine: Any = None,
                  mask: Mask | None = None, **kwargs: Any) -> NkiTensor:
    """``op1(op0(data, operand0), operand1)``; operands are numbers or [P, 1] tiles."""
    dst, rest = _split_dst(args, kwargs, lambda a: len(a) >= 2 and _is_tile(a[1]), "data")
    data = _e.readable(kwargs.pop("data", rest[0] if rest else None), "tensor_scalar data")
    if op0 is None and len(rest) > 2:
        op0, operand0 = rest[1], rest[2]
    if reverse1:
        raise _e.tracer().fail("tensor_scalar: reverse1 is not supported; swap the operation instead")
    out = _out(dst, data, dtype)
    d, src = _e.clip(mask, out, data)
    _e.tensor_scalar(d, src, _alu(op0), _operand(operand0), _alu(op1) if op1 is not None else None, _operand(operand1),
                     reverse0, _engine(engine, Engine.VECTOR))
    return out


def tensor_reduce(*args: Any, axis: Any = None, dtype: Any = None, negate: bool = False, keepdims: bool = False,
                  engine: Any = None, **kwargs: Any) -> NkiTensor:
    """Reduce ``data`` along trailing free axes with ``op`` (nl.add, nl.maximum, nl.minimum)."""
    dst, rest = _split_dst(args, kwargs, lambda a: _is_tile(a[0]), "data")
    op = kwargs.pop("op", rest[0] if rest else None)
    data = _e.readable(kwargs.pop("data", rest[1] if len(rest) > 1 else None), "tensor_reduce data")
    if axis is None:
        axis = kwargs.pop("axis", rest[2] if len(rest) > 2 else -1)
    n = nl._axes(data, axis)
    kept = data.shape[: len(data.shape) - n]
    shape = kept + (1,) * n if keepdims else (kept if len(kept) > 1 else (kept[0], 1))
    out = _out(dst, data, dtype, shape)
    _e.reduce(out.view, data.view, _red(op), n, _engine(engine, Engine.VECTOR))
    if negate:
        _e.tensor_scalar(out.view, out.view, AluOp.MULTIPLY, -1.0)
    return out


def tensor_copy(*args: Any, dtype: Any = None, engine: Any = None, mask: Mask | None = None, **kwargs: Any) -> NkiTensor:
    """Copy ``src`` converting to the destination's dtype (vector engine by default)."""
    dst, rest = _split_dst(args, kwargs, lambda a: len(a) >= 2, "src")
    src = _e.readable(kwargs.pop("src", rest[0] if rest else None), "tensor_copy src")
    out = _out(dst, src, dtype)
    d, s = _e.clip(mask, out, src)
    _e.copy_to(d, s, _engine(engine, Engine.VECTOR))
    return out


def memset(*args: Any, value: Any = None, dtype: Any = None, engine: Any = None, **kwargs: Any) -> NkiTensor:
    """Fill a tile: ``memset(dst, value)`` or ``t = memset(shape, value, dtype)``."""
    dst = kwargs.pop("dst", None)
    rest = list(args)
    if dst is None and rest and _is_tile(rest[0]):
        dst = rest.pop(0)
    if dst is None:
        shape = kwargs.pop("shape", rest.pop(0) if rest else None)
        if value is None:
            value = rest.pop(0) if rest else 0.0
        dst = _e.new_tensor(shape, _e.dtype_of(dtype or (rest.pop(0) if rest else None), _dt.float32))
    elif value is None:
        value = rest.pop(0) if rest else 0.0
    _e.emit(Memset(dst.view, float(value), engine=_engine(engine, Engine.VECTOR)))
    return dst


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
    dst, rest = _split_dst(args, kwargs, lambda a: _is_tile(a[0]), "expr")
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
    out = dst if dst is not None else _e.new_tensor(_grid_shape(expr), _e.dtype_of(dtype, _dt.int32))
    steps, offset, cm = _affine_pattern(expr, out.shape)
    _e.emit(Iota(out.view, steps, offset, cm, engine=Engine.GPSIMD))
    return out


def _iota_pattern(dst: NkiTensor | None, pattern: Any, offset: int = 0, channel_multiplier: int = 0) -> NkiTensor:
    """New-style ``iota(dst, pattern=[[step, num], ...], offset, channel_multiplier)``."""
    if dst is None:
        raise _e.tracer().fail("iota with pattern= writes into dst=; pass the destination tile")
    view = _more.pattern_view(dst.view, pattern, "iota")
    _e.emit(Iota(view, _more.pattern_steps(pattern), int(offset), int(channel_multiplier), engine=Engine.GPSIMD))
    return dst


def _affine_select_pattern(dst: NkiTensor | None, pattern: Any, channel_multiplier: int, on_true_tile: Any,
                           on_false_value: float, cmp_op: Any = None, offset: int = 0, dtype: Any = None) -> NkiTensor:
    """New-style ``affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op, offset)``:
    ``on_true_tile`` where ``cmp_op(offset + channel_multiplier * p + sum(step * i), 0)`` holds."""
    src = _e.readable(on_true_tile, "affine_select on_true_tile")
    out = _out(dst, src, dtype)
    cmp = _alu(cmp_op) if cmp_op is not None else AluOp.IS_EQUAL
    if cmp not in _more._COMPARISONS:
        raise _e.tracer().fail(f"affine_select: cmp_op {cmp.value} is not a comparison; use nl.equal, nl.greater_equal, ...")
    d, s = _more.pattern_view(out.view, pattern, "affine_select"), _more.pattern_view(src.view, pattern, "affine_select")
    _e.emit(AffineSelect(d, s, _more.pattern_steps(pattern), int(offset), int(channel_multiplier), cmp,
                         float(on_false_value), engine=Engine.GPSIMD))
    return out


_CMP = {"lt": AluOp.IS_LT, "le": AluOp.IS_LE, "gt": AluOp.IS_GT, "ge": AluOp.IS_GE}


def affine_select(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``on_true`` where an affine condition of the indices holds, else ``on_false_value``
    (GpSimd): ``nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=t, on_false_value=-inf)``."""
    dst, rest = _split_dst(args, kwargs, lambda a: _is_tile(a[0]), "on_true_tile")
    if "pattern" in kwargs or (rest and isinstance(rest[0], (list, tuple))):
        kwargs.pop("name", None)
        return _affine_select_pattern(dst, *rest, dtype=dtype, **kwargs)
    pred = kwargs.pop("pred", rest[0] if rest else None)
    src = _e.readable(kwargs.pop("on_true_tile", rest[1] if len(rest) > 1 else None), "affine_select on_true_tile")
    fill = kwargs.pop("on_false_value", rest[2] if len(rest) > 2 else 0.0)
    if not isinstance(pred, Mask) or len(pred.conds) != 1:
        raise _e.tracer().fail("affine_select needs one affine condition of nl.arange indices, such as (i_p - i_f >= 0)")
    expr, op = pred.conds[0]
    out = _out(dst, src, dtype)
    steps, offset, cm = _affine_pattern(expr, src.shape)
    _e.emit(AffineSelect(out.view, src.view, steps, offset, cm, _CMP[op], float(fill), engine=Engine.GPSIMD))
    return out


def _oob_error(mode: Any, name: str) -> None:
    """trnsim checks every DMA access against its tensor, as ``oob_mode.error`` asks."""
    if mode is not None and getattr(mode, "name", mode) != "error":
        raise _e.tracer().fail(f"{name}: oob_mode={mode!r} is not supported; trnsim refuses out-of-bounds accesses "
                               "(oob_mode.error); mask the access instead")


def dma_copy(*args: Any, **kwargs: Any) -> NkiTensor:
    """Copy ``src`` to ``dst`` by DMA (HBM, SBUF or PSUM on either side); between float
    dtypes the DMA converts through fp32 (an fp32 tile into a bf16 HBM tensor rounds).
    ``dge_mode``, ``priority`` and ``engine`` are accepted; every mode is timed alike."""
    dst = kwargs.pop("dst", args[0] if args else None)
    src = kwargs.pop("src", args[1] if len(args) > 1 else None)
    rmw = kwargs.pop("dst_rmw_op", args[2] if len(args) > 2 else None)
    _oob_error(kwargs.pop("oob_mode", None), "dma_copy")
    tr = _e.tracer()
    if not isinstance(dst, NkiTensor) or not isinstance(src, NkiTensor):
        raise tr.fail("dma_copy needs dst= and src= tensors")
    if src.view.size != dst.view.size:
        raise tr.fail(f"dma_copy of {list(src.shape)} into {list(dst.shape)}: sizes differ")
    if rmw is not None:   # dst = dst + src, added by the DMA (trnsim.nki.isa_dma)
        from trnsim.nki.isa_dma import add_into, check_add

        check_add(rmw, "dma_copy(dst_rmw_op=)")
        return add_into(dst, [dst, src], "dma_copy(dst_rmw_op=)")
    tr.dma(dst.view, src.view)
    return dst


def bn_stats(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Per-partition statistics of ``data`` [P, F] (F <= 512) for :func:`bn_aggr`, one vector
    engine instruction: [P, 6] holding the mean, the sum of squared deviations and the count."""
    dst, rest = _split_dst(args, kwargs, lambda a: len(a) >= 2, "data")
    data = _e.readable(kwargs.pop("data", rest[0] if rest else None), "bn_stats data")
    out = dst if dst is not None else _e.new_tensor((data.view.partitions, BN_STATS_WIDTH), _e.dtype_of(dtype, _dt.float32))
    _e.emit(BnStats(out.view, _e.flat2d(data.view), engine=Engine.VECTOR))
    return out


def bn_aggr(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Combine :func:`bn_stats` results [P, 6 * k] into [P, 2]: mean and population variance
    (one vector engine instruction)."""
    dst, rest = _split_dst(args, kwargs, lambda a: len(a) >= 2, "data")
    data = _e.readable(kwargs.pop("data", rest[0] if rest else None), "bn_aggr data")
    out = dst if dst is not None else _e.new_tensor((data.view.partitions, 2), _e.dtype_of(dtype, _dt.float32))
    _e.emit(BnAggr(out.view, _e.flat2d(data.view), engine=Engine.VECTOR))
    return out


# The rest of nki.isa lives beside this module; importing it here gives one ``nisa`` namespace.
from trnsim.nki import isa_more as _more  # noqa: E402
from trnsim.nki.isa_constants import (constants, dge_mode, dma_engine, engine, get_nc_sub_version,  # noqa: E402, F401
                                      get_nc_version, matmul_perf_mode, nc_version, oob_mode, reduce_cmd)
from trnsim.nki.isa_more import (activate2, activation_reduce, dma_transpose, exponential,  # noqa: E402, F401
                                 local_gather, max8, nc_find_index8, nc_match_replace8, nc_n_gather, nonzero_with_count,
                                 nc_stream_shuffle, range_select, reciprocal, scalar_tensor_tensor, select_reduce,
                                 sequence_bounds, tensor_copy_predicated, tensor_partition_reduce, tensor_scalar_cumulative,
                                 tensor_scalar_reduce, tensor_tensor_scan)
from trnsim.nki.isa_random import dropout, rand2, rand_get_state, rand_set_state, rng, set_rng_seed  # noqa: E402, F401
from trnsim.nki.isa_refused import (DIFFERENCES, REFUSED, VirtualRegister, register_alloc,  # noqa: E402, F401
                                    register_move)
from trnsim.nki.isa_world import core_barrier, sendrecv  # noqa: E402, F401
from trnsim.nki.isa_dma import dma_compute  # noqa: E402, F401

# Refused by name: each raises KernelError naming itself and saying why (see REFUSED).
globals().update(REFUSED)
__all__ += list(REFUSED)
