"""The rest of ``nki.isa``: scans, fused two-op instructions, top-8 searches, selects,
gathers, shuffles and DMA transposes (random numbers: :mod:`trnsim.nki.isa_random`;
registers and refusals: :mod:`trnsim.nki.isa_refused`).

Each instruction works in both of NKI's styles, as in :mod:`trnsim.nki.isa`: pass
``dst=`` (or the destination tile first) or take the returned tile.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import numpy as np

from trnsim import dtypes as _dt
from trnsim.isa import (GATHER_GROUP, MAX8_WIDTH, SHUFFLE_KEEP, SHUFFLE_QUADRANT, ActivationFunc, AluOp, BlockTranspose,
                        Engine, FindIndex8, Gather, LocalGather, MatchReplace8, Max8, Memory, Memset, NonzeroWithCount,
                        PartitionReduce, RangeSelect, Reciprocal, ReduceOp, ScalarTensorTensor, Select, SequenceBounds, StreamShuffle, TensorReduce, TensorScalar, TensorTensorScan, View)
from trnsim.nki import emit as _e
from trnsim.nki import isa as _isa
from trnsim.nki.isa_constants import get_nc_version
from trnsim.nki.isa_constants import reduce_cmd as reduce_cmd_enum
from trnsim.nki.tiles import NkiTensor
from trnsim.nki.tracer import KernelError

FP32_MIN = float(np.finfo(np.float32).min)
MAX8_MAX_FREE = 16384
GATHER_ELEMS = (1, 2, 4, 8, 16, 32)
GATHER_MAX_PER_CORE = 4096
BLOCK_TRANSPOSE_MAX = 32


def _take(kwargs: dict, rest: tuple, index: int, name: str, default: Any = None) -> Any:
    """Argument ``name``: a keyword, else the ``index``-th positional one, else ``default``."""
    if name in kwargs:
        return kwargs.pop(name)
    return rest[index] if len(rest) > index else default


def _fail(message: str) -> KernelError:
    return _e.tracer().fail(message)


def _tile(x: Any, what: str) -> NkiTensor:
    return _e.readable(x, what)


def _is_tile(x: Any) -> bool:
    return isinstance(x, NkiTensor)


def _scalar_or_view(x: Any, what: str) -> float | View:
    if isinstance(x, Real):
        return float(x)
    return _tile(x, what).view


def _not_both_psum(a: NkiTensor, b: NkiTensor, name: str, first: str, second: str) -> None:
    if a.buffer is Memory.PSUM and b.buffer is Memory.PSUM:
        raise _fail(f"{name}: {first} and {second} cannot both be in PSUM; copy one of them to SBUF first")


def _same_free(name: str, out: NkiTensor, *tiles: NkiTensor) -> None:
    for t in tiles:
        if t.view.partitions != out.view.partitions or t.view.free_size != out.view.free_size:
            raise _fail(f"{name}: {t.name}{list(t.shape)} and {out.name}{list(out.shape)} must have the same partitions "
                        "and elements per partition")


def _needs_version(name: str, first: int) -> None:
    """Refuse an instruction the traced chip's NeuronCore generation lacks."""
    version = get_nc_version().value
    if version < first:
        raise _fail(f"{name} is available only on NeuronCore-v{first} and newer; the kernel is traced for "
                    f"{_e.tracer().chip.name} (NeuronCore-v{version}); pass chip= a newer chip")


def _no_mask(kwargs: dict, name: str) -> None:
    if kwargs.pop("mask", None) is not None:
        raise _fail(f"{name}: mask= is not supported here; slice the tiles to the region instead")


def _only_reset(name: str, cmd: Any, allowed: tuple[reduce_cmd_enum, ...]) -> None:
    """trnsim keeps no accumulator registers between instructions: each reduction starts afresh."""
    if cmd is not None and cmd not in allowed:
        raise _fail(f"{name}: reduce_cmd={cmd!r} carries the engine's accumulator registers across instructions, which "
                    f"trnsim does not model; use one of {', '.join(c.name for c in allowed)} and combine partial results "
                    "with nisa.tensor_tensor")


def tensor_tensor_scan(*args: Any, dtype: Any = None, reverse0: bool = False, reverse1: bool = False,
                       **kwargs: Any) -> NkiTensor:
    """Running scan along the free axis (vector engine, fp32 math):
    ``dst[:, i] = op1(op0(data0[:, i], dst[:, i - 1]), data1[:, i])`` from ``initial`` (a
    number or a [P, 1] tile); ``data0``/``data1`` [P, F], not both in PSUM."""
    _no_mask(kwargs, "tensor_tensor_scan")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 4 and _is_tile(a[0])
                                and (_is_tile(a[3]) or isinstance(a[3], Real)), "data0")
    a = _tile(_take(kwargs, rest, 0, "data0"), "tensor_tensor_scan data0")
    b = _tile(_take(kwargs, rest, 1, "data1"), "tensor_tensor_scan data1")
    initial = _scalar_or_view(_take(kwargs, rest, 2, "initial", 0.0), "tensor_tensor_scan initial")
    op0, op1 = _isa._alu(_take(kwargs, rest, 3, "op0")), _isa._alu(_take(kwargs, rest, 4, "op1"))
    _not_both_psum(a, b, "tensor_tensor_scan", "data0", "data1")
    out = _isa._out(dst, a, dtype)
    _same_free("tensor_tensor_scan", out, a, b)
    _e.emit(TensorTensorScan(_e.flat2d(out.view), _e.flat2d(a.view), _e.flat2d(b.view), initial, op0, op1,
                             bool(reverse0), bool(reverse1), engine=Engine.VECTOR))
    return out


_IDENTITY = {AluOp.ADD: 0.0, AluOp.SUBTRACT: 0.0, AluOp.MULTIPLY: 1.0, AluOp.MAXIMUM: -math.inf, AluOp.MINIMUM: math.inf}


def tensor_scalar_cumulative(*args: Any, reduce_cmd: Any = None, reverse0: bool = False, dtype: Any = None,
                             **kwargs: Any) -> NkiTensor:
    """Running ``reg = op1(op0(src[i], imm0), reg)`` along the free axis, each step written to
    ``dst``; ``reg`` starts at op1's identity (reset_reduce) or ``imm1`` (load_reduce). Runs as
    a tensor_scalar then a tensor_tensor_scan on the vector engine."""
    _no_mask(kwargs, "tensor_scalar_cumulative")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 2 and _is_tile(a[1]), "src")
    src = _tile(_take(kwargs, rest, 0, "src"), "tensor_scalar_cumulative src")
    op0, op1 = _isa._alu(_take(kwargs, rest, 1, "op0")), _isa._alu(_take(kwargs, rest, 2, "op1"))
    imm0 = _isa._operand(_take(kwargs, rest, 3, "imm0"))
    imm1 = _take(kwargs, rest, 4, "imm1")
    if op1 not in _IDENTITY:
        raise _fail(f"tensor_scalar_cumulative: op1 {op1.value} must be add, subtract, multiply, maximum or minimum")
    _only_reset("tensor_scalar_cumulative", reduce_cmd, (_RESET_REDUCE, reduce_cmd_enum.load_reduce))
    if reduce_cmd is reduce_cmd_enum.load_reduce:
        if imm1 is None:
            raise _fail("tensor_scalar_cumulative: reduce_cmd=load_reduce starts from imm1; pass imm1=")
        initial = _scalar_or_view(imm1, "tensor_scalar_cumulative imm1")
    else:
        initial = _IDENTITY[op1]
    out = _isa._out(dst, src, dtype)
    _same_free("tensor_scalar_cumulative", out, src)
    step = _e.new_tensor((src.view.partitions, src.view.free_size), _dt.float32)
    _e.emit(TensorScalar(step.view, _e.flat2d(src.view), op0, imm0, None, None, bool(reverse0), engine=Engine.VECTOR))
    _e.emit(TensorTensorScan(_e.flat2d(out.view), step.view, step.view, initial, op1, AluOp.BYPASS,
                             engine=Engine.VECTOR))
    return out


def scalar_tensor_tensor(*args: Any, dtype: Any = None, reverse0: bool = False, reverse1: bool = False,
                         engine: Any = None, **kwargs: Any) -> NkiTensor:
    """``op1(op0(data, operand0), operand1)`` in one vector engine instruction: ``operand0`` a
    number or [P, 1] tile, ``operand1`` a tile of ``data``'s shape (not both it and data in PSUM)."""
    _no_mask(kwargs, "scalar_tensor_tensor")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 2 and _is_tile(a[1]), "data")
    data = _tile(_take(kwargs, rest, 0, "data"), "scalar_tensor_tensor data")
    op0 = _isa._alu(_take(kwargs, rest, 1, "op0"))
    operand0 = _scalar_or_view(_take(kwargs, rest, 2, "operand0"), "scalar_tensor_tensor operand0")
    op1 = _isa._alu(_take(kwargs, rest, 3, "op1"))
    operand1 = _tile(_take(kwargs, rest, 4, "operand1"), "scalar_tensor_tensor operand1")
    _not_both_psum(data, operand1, "scalar_tensor_tensor", "data", "operand1")
    out = _isa._out(dst, data, dtype)
    _same_free("scalar_tensor_tensor", out, data, operand1)
    _e.emit(ScalarTensorTensor(out.view, data.view, op0, operand0, op1, operand1.view, bool(reverse0), bool(reverse1),
                               engine=_isa._engine(engine, Engine.VECTOR)))
    return out


def reciprocal(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``1 / data`` elementwise on the vector engine (fp32 math)."""
    _no_mask(kwargs, "reciprocal")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 2, "data")
    data = _tile(_take(kwargs, rest, 0, "data"), "reciprocal data")
    out = _isa._out(dst, data, dtype)
    _same_free("reciprocal", out, data)
    _e.emit(Reciprocal(out.view, data.view, engine=Engine.VECTOR))
    return out


def _reduce_into(name: str, reduce_res: Any, src: NkiTensor, op: ReduceOp, engine: Engine = Engine.VECTOR) -> None:
    res = _tile(reduce_res, f"{name} reduce_res")
    if res.view.partitions != src.view.partitions or res.view.free_size != 1:
        raise _fail(f"{name}: reduce_res {res.name}{list(res.shape)} must be [{src.view.partitions}, 1]")
    _e.emit(TensorReduce(res.view, _e.flat2d(src.view), op, 1, engine=engine))


def tensor_scalar_reduce(*args: Any, dtype: Any = None, reverse0: bool = False, reduce_cmd: Any = None,
                         reduce_init: Any = None, reduce_res_negate: bool = False, **kwargs: Any) -> NkiTensor:
    """``data op0 operand0`` (vector engine) and its reduction over all free axes into
    ``reduce_res`` [P, 1] (nl.add, nl.maximum or nl.minimum)."""
    _no_mask(kwargs, "tensor_scalar_reduce")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 2 and _is_tile(a[1]), "data")
    data = _tile(_take(kwargs, rest, 0, "data"), "tensor_scalar_reduce data")
    op0 = _isa._alu(_take(kwargs, rest, 1, "op0"))
    operand0 = _isa._operand(_take(kwargs, rest, 2, "operand0"))
    red = _isa._red(_take(kwargs, rest, 3, "reduce_op"))
    reduce_res = _take(kwargs, rest, 4, "reduce_res")
    _only_reset("tensor_scalar_reduce", reduce_cmd, (_RESET_REDUCE,))
    if reduce_init is not None:
        raise _fail("tensor_scalar_reduce: reduce_init goes with reduce_cmd=load_reduce, which trnsim does not model")
    out = _isa._out(dst, data, dtype)
    _e.emit(TensorScalar(out.view, data.view, op0, operand0, None, None, bool(reverse0), engine=Engine.VECTOR))
    if reduce_res is not None:
        _reduce_into("tensor_scalar_reduce", reduce_res, out, red)
        if reduce_res_negate:
            _e.tensor_scalar(reduce_res.view, reduce_res.view, AluOp.MULTIPLY, -1.0)
    return out


def activation_reduce(*args: Any, **kwargs: Any) -> NkiTensor:
    """:func:`nki.isa.activation` with its reduction along the free axis into ``reduce_res`` [P, 1]."""
    if "reduce_op" not in kwargs or "reduce_res" not in kwargs:
        raise _fail("activation_reduce needs reduce_op= and reduce_res=")
    return _isa.activation(*args, **kwargs)


_ACTIVATE2_PAIRS = {(AluOp.MULTIPLY, AluOp.ADD), (AluOp.MULTIPLY, AluOp.SUBTRACT), (AluOp.MULTIPLY, AluOp.BYPASS),
                    (AluOp.ADD, AluOp.BYPASS), (AluOp.SUBTRACT, AluOp.BYPASS), (AluOp.BYPASS, AluOp.BYPASS)}


def activate2(*args: Any, relu_param: Any = 0.0, reverse0: bool = False, reverse1: bool = False, dtype: Any = None,
              **kwargs: Any) -> NkiTensor:
    """``op((data op0 imm0) op1 imm1)`` on the scalar engine (NeuronCore-v4+), with optional
    ``reduce_op``/``reduce_res`` as :func:`nki.isa.activation`. Runs as a scalar-engine
    tensor_scalar then an activation."""
    _no_mask(kwargs, "activate2")
    _needs_version("activate2", 4)
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 3 and _is_tile(a[2]), "data")
    op = _take(kwargs, rest, 0, "op")
    data = _tile(_take(kwargs, rest, 1, "data"), "activate2 data")
    imm0, imm1 = _take(kwargs, rest, 2, "imm0"), _take(kwargs, rest, 3, "imm1")
    op0, op1 = _isa._alu(_take(kwargs, rest, 4, "op0")), _isa._alu(_take(kwargs, rest, 5, "op1"))
    if (op0, op1) not in _ACTIVATE2_PAIRS:
        raise _fail(f"activate2: (op0, op1) = ({op0.value}, {op1.value}) is not one of the six supported pairs: "
                    "(multiply, add), (multiply, subtract), (multiply, bypass), (add, bypass), (subtract, bypass), "
                    "(bypass, bypass)")
    if not isinstance(relu_param, Real) or relu_param != 0.0:
        raise _fail("activate2: relu_param (parameterised activations such as PReLU) is not modelled; leave it 0")
    if reverse1:
        raise _fail("activate2: reverse1 is not supported; use op1=nl.add with a negated imm1 instead")
    source = data
    if op0 is not AluOp.BYPASS:
        source = _e.new_tensor(data.shape, _dt.float32)
        _e.emit(TensorScalar(source.view, data.view, op0, _isa._operand(imm0), None if op1 is AluOp.BYPASS else op1,
                             _isa._operand(imm1), bool(reverse0), engine=Engine.SCALAR))
    out = _isa._out(dst, data, dtype)
    reduce = {k: kwargs.pop(k) for k in ("reduce_op", "reduce_res", "reduce_cmd") if k in kwargs}
    return _isa.activation(out, op, source, **reduce)


def exponential(*args: Any, max_value: Any = 0.0, reduce_res: Any = None, reduce_cmd: Any = None,
                reduce_init: Any = 0.0, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``exp(src - max_value)`` (``max_value`` a number or [P, 1] tile); with ``reduce_res`` [P, 1]
    also the sum of the results. Runs as a scalar engine activation in trnsim."""
    _no_mask(kwargs, "exponential")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 2, "src")
    src = _tile(_take(kwargs, rest, 0, "src"), "exponential src")
    _only_reset("exponential", reduce_cmd, (_IDLE, _RESET_REDUCE))
    if not isinstance(reduce_init, Real) or reduce_init != 0.0:
        raise _fail("exponential: reduce_init goes with reduce_cmd=load_reduce, which trnsim does not model")
    out = _isa._out(dst, src, dtype)
    bias = _e.new_tensor((src.view.partitions, 1), _dt.float32)
    if isinstance(max_value, Real):
        _e.emit(Memset(bias.view, -float(max_value), engine=Engine.VECTOR))
    else:
        _e.tensor_scalar(bias.view, _tile(max_value, "exponential max_value").view, AluOp.MULTIPLY, -1.0)
    red = ReduceOp.ADD if reduce_res is not None else None
    _e.activation(out.view, src.view, ActivationFunc.EXP, bias.view, 1.0, red,
                  _tile(reduce_res, "exponential reduce_res").view if reduce_res is not None else None)
    return out


def pattern_view(view: View, pattern: Any, name: str) -> View:
    """``view`` seen with the free dims of an access ``pattern`` ``[[step, num], ...]``."""
    try:
        counts = tuple(int(num) for _, num in pattern)
    except (TypeError, ValueError):
        raise _fail(f"{name}: pattern {pattern!r} is not a list of [step, num] pairs") from None
    if not 1 <= len(counts) <= 4:
        raise _fail(f"{name}: pattern has {len(counts)} dimensions; give 1 to 4 [step, num] pairs")
    if math.prod(counts) != view.free_size:
        raise _fail(f"{name}: pattern covers {math.prod(counts)} elements per partition, but the tile has {view.free_size}")
    if view.shape[1:] == counts:
        return view
    flat = _e.flat2d(view)
    strides = [math.prod(counts[k + 1:]) for k in range(len(counts))]
    return View(flat.tensor, flat.offset, (flat.dims[0], *zip(strides, counts)))


def pattern_steps(pattern: Any) -> tuple[int, ...]:
    """The steps of an access pattern ``[[step, num], ...]``."""
    return tuple(int(step) for step, _ in pattern)


def vector_transpose(dst: NkiTensor | None, data: NkiTensor) -> NkiTensor:
    """[P, F] -> [F, P] on the vector engine, for P and F at most 32."""
    v = _e.flat2d(data.view)
    if v.partitions > BLOCK_TRANSPOSE_MAX or v.free_size > BLOCK_TRANSPOSE_MAX:
        raise _fail(f"nc_transpose on the vector engine handles at most {BLOCK_TRANSPOSE_MAX}x{BLOCK_TRANSPOSE_MAX}, "
                    f"got {list(data.shape)}; use the tensor engine (the default) for larger tiles")
    out = dst if dst is not None else _e.new_tensor((v.free_size, v.partitions), data.dtype)
    _e.emit(BlockTranspose(out.view, v, engine=Engine.VECTOR))
    return out


def range_select(*args: Any, reduce_cmd: Any = None, reduce_res: Any = None, reduce_op: Any = None,
                 range_start: int = 0, on_false_value: float = FP32_MIN, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``on_true_tile`` where ``comp_op0(range_start + i, bound0)`` and ``comp_op1(range_start + i,
    bound1)`` hold (``i`` the free index, bounds [P, 1] fp32), else ``on_false_value`` (must be
    FP32_MIN); ``reduce_res`` [P, 1] gets the row maximum (vector engine)."""
    _no_mask(kwargs, "range_select")
    _needs_version("range_select", 3)
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 2 and _is_tile(a[1]), "on_true_tile")
    src = _tile(_take(kwargs, rest, 0, "on_true_tile"), "range_select on_true_tile")
    cmp0, cmp1 = _isa._alu(_take(kwargs, rest, 1, "comp_op0")), _isa._alu(_take(kwargs, rest, 2, "comp_op1"))
    bound0 = _tile(_take(kwargs, rest, 3, "bound0"), "range_select bound0")
    bound1 = _tile(_take(kwargs, rest, 4, "bound1"), "range_select bound1")
    for op in (cmp0, cmp1):
        if op not in _COMPARISONS:
            raise _fail(f"range_select: {op.value} is not a comparison; use nl.equal, nl.less, nl.greater_equal, ...")
    if reduce_op is not None and _isa._red(reduce_op) is not ReduceOp.MAX:
        raise _fail("range_select: reduce_op must be nl.maximum, the only reduction NKI supports here")
    if float(np.float32(on_false_value)) != FP32_MIN:
        raise _fail(f"range_select: on_false_value must be FP32_MIN ({FP32_MIN}) due to hardware constraints, "
                    f"got {on_false_value}")
    _only_reset("range_select", reduce_cmd, (_IDLE, _RESET_REDUCE))
    out = _isa._out(dst, src, dtype)
    _same_free("range_select", out, src)
    res = _tile(reduce_res, "range_select reduce_res").view if reduce_res is not None else None
    _e.emit(RangeSelect(_e.flat2d(out.view), _e.flat2d(src.view), cmp0, cmp1, bound0.view, bound1.view, int(range_start),
                        FP32_MIN, res, engine=Engine.VECTOR))
    return out


def select_reduce(*args: Any, reduce_res: Any = None, reduce_cmd: Any = None, reduce_op: Any = None,
                  reverse_pred: bool = False, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``on_true where predicate != 0 else on_false`` (``on_false`` a tile or number; swapped with
    ``reverse_pred``) on the vector engine; ``reduce_res`` [P, 1] gets the row reduction (max)."""
    _no_mask(kwargs, "select_reduce")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 4 and _is_tile(a[1]), "predicate")
    pred = _tile(_take(kwargs, rest, 0, "predicate"), "select_reduce predicate")
    on_true = _tile(_take(kwargs, rest, 1, "on_true"), "select_reduce on_true")
    on_false = _take(kwargs, rest, 2, "on_false", 0.0)
    _only_reset("select_reduce", reduce_cmd, (_IDLE, _RESET_REDUCE))
    red = _isa._red(reduce_op) if reduce_op is not None else ReduceOp.MAX
    out = _isa._out(dst, on_true, dtype)
    first, second = on_true.view, _scalar_or_view(on_false, "select_reduce on_false")
    if reverse_pred:
        if not isinstance(second, View):
            fill = _e.like(on_true)
            _e.emit(Memset(fill.view, second, engine=Engine.VECTOR))
            second = fill.view
        first, second = second, first
    _e.emit(Select(out.view, pred.view, first, second, engine=Engine.VECTOR))
    if reduce_res is not None:
        _reduce_into("select_reduce", reduce_res, out, red)
    return out


def tensor_copy_predicated(*args: Any, reverse_pred: bool = False, **kwargs: Any) -> NkiTensor:
    """Copy ``src`` (a tile or a number) into ``dst`` where ``predicate`` is nonzero (zero with
    ``reverse_pred``); ``dst`` keeps its values elsewhere (vector engine)."""
    _no_mask(kwargs, "tensor_copy_predicated")
    dst = _tile(_take(kwargs, args, 0, "dst"), "tensor_copy_predicated dst")
    src = _take(kwargs, args, 1, "src")
    pred = _tile(_take(kwargs, args, 2, "predicate"), "tensor_copy_predicated predicate")
    value = _scalar_or_view(src, "tensor_copy_predicated src")
    if not isinstance(value, View):
        fill = _e.like(dst)
        _e.emit(Memset(fill.view, value, engine=Engine.VECTOR))
        value = fill.view
    first, second = (dst.view, value) if reverse_pred else (value, dst.view)
    _e.emit(Select(dst.view, pred.view, first, second, engine=Engine.VECTOR))
    return dst


def sequence_bounds(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Segment bounds of ``segment_ids`` [1, N] (fp32 or int32) into [1, 2, N]: the start and
    one past the end of each element's segment; padding (id 0) gets (N, -1). GpSimd."""
    _no_mask(kwargs, "sequence_bounds")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 2, "segment_ids")
    ids = _tile(_take(kwargs, rest, 0, "segment_ids"), "sequence_bounds segment_ids")
    if ids.view.partitions != 1:
        raise _fail(f"sequence_bounds: the partition dimension must be 1, got {ids.view.partitions}")
    for t in (ids, dst):
        if t is not None and t.dtype not in (_dt.float32, _dt.int32):
            raise _fail(f"sequence_bounds: {t.name} is {t.dtype.name}; segment ids and bounds must be float32 or int32")
    n = ids.view.free_size
    out = dst if dst is not None else _e.new_tensor((1, 2, n), _e.dtype_of(dtype, ids.dtype))
    if out.view.free_size != 2 * n:
        raise _fail(f"sequence_bounds: dst {list(out.shape)} must hold [1, 2, {n}]")
    _e.emit(SequenceBounds(out.view, ids.view, engine=Engine.GPSIMD))
    return out


def _check_search(name: str, src: NkiTensor) -> None:
    if not MAX8_WIDTH <= src.view.free_size <= MAX8_MAX_FREE:
        raise _fail(f"{name}: {src.name} has {src.view.free_size} elements per partition; it must have "
                    f"{MAX8_WIDTH} to {MAX8_MAX_FREE}")


def _eight(name: str, t: NkiTensor | None, partitions: int) -> None:
    if t is not None and (t.view.partitions != partitions or t.view.free_size != MAX8_WIDTH):
        raise _fail(f"{name}: {t.name}{list(t.shape)} must be [{partitions}, {MAX8_WIDTH}]")


def max8(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """The 8 largest values of each partition of ``src`` (8..16384 elements), descending, [P, 8] (vector engine)."""
    _no_mask(kwargs, "max8")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 2, "src")
    src = _tile(_take(kwargs, rest, 0, "src"), "max8 src")
    _check_search("max8", src)
    out = dst if dst is not None else _e.new_tensor((src.view.partitions, MAX8_WIDTH), _e.dtype_of(dtype, src.dtype))
    _eight("max8", out, src.view.partitions)
    _e.emit(Max8(out.view, _e.flat2d(src.view), engine=Engine.VECTOR))
    return out


def nc_find_index8(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Index of the first occurrence of each of the 8 ``vals`` [P, 8] in each partition of ``data``
    (uint32 [P, 8] by default; all ones where a value is absent). Vector engine."""
    _no_mask(kwargs, "nc_find_index8")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 3, "data")
    data = _tile(_take(kwargs, rest, 0, "data"), "nc_find_index8 data")
    vals = _tile(_take(kwargs, rest, 1, "vals"), "nc_find_index8 vals")
    _check_search("nc_find_index8", data)
    _eight("nc_find_index8", vals, data.view.partitions)
    out = dst if dst is not None else _e.new_tensor((data.view.partitions, MAX8_WIDTH), _e.dtype_of(dtype, _dt.uint32))
    _eight("nc_find_index8", out, data.view.partitions)
    if out.dtype.is_float:
        raise _fail(f"nc_find_index8: dst is {out.dtype.name}; indices are written as uint32 (or another integer dtype)")
    _e.emit(FindIndex8(out.view, _e.flat2d(data.view), vals.view, engine=Engine.VECTOR))
    return out


def nc_match_replace8(*args: Any, imm: Any = None, dst_idx: Any = None, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``data`` with the first occurrence of each of the 8 ``vals`` per partition replaced by
    ``imm``; ``dst_idx`` [P, 8] (optional) gets their positions. Vector engine."""
    _no_mask(kwargs, "nc_match_replace8")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 3 and _is_tile(a[2]), "data")
    data = _tile(_take(kwargs, rest, 0, "data"), "nc_match_replace8 data")
    vals = _tile(_take(kwargs, rest, 1, "vals"), "nc_match_replace8 vals")
    if imm is None:
        imm = _take(kwargs, rest, 2, "imm", 0.0)
    _check_search("nc_match_replace8", data)
    _eight("nc_match_replace8", vals, data.view.partitions)
    idx = _tile(dst_idx, "nc_match_replace8 dst_idx") if dst_idx is not None else None
    _eight("nc_match_replace8", idx, data.view.partitions)
    out = _isa._out(dst, data, dtype)
    _same_free("nc_match_replace8", out, data)
    _e.emit(MatchReplace8(_e.flat2d(out.view), _e.flat2d(data.view), vals.view, float(imm),
                          idx.view if idx is not None else None, engine=Engine.VECTOR))
    return out


def nc_stream_shuffle(*args: Any, **kwargs: Any) -> NkiTensor:
    """Cross-partition copy within each quadrant of 32 partitions (vector engine): ``dst``
    partition ``i`` takes ``src`` partition ``shuffle_mask[i]``; 255 leaves it unchanged."""
    _no_mask(kwargs, "nc_stream_shuffle")
    dst = _tile(_take(kwargs, args, 0, "dst"), "nc_stream_shuffle dst")
    src = _tile(_take(kwargs, args, 1, "src"), "nc_stream_shuffle src")
    mask = _take(kwargs, args, 2, "shuffle_mask")
    try:
        mask = tuple(int(m) for m in mask)
    except (TypeError, ValueError):
        raise _fail(f"nc_stream_shuffle: shuffle_mask {mask!r} must be a list of {SHUFFLE_QUADRANT} integers") from None
    if len(mask) != SHUFFLE_QUADRANT or any(not (0 <= m < SHUFFLE_QUADRANT or m == SHUFFLE_KEEP) for m in mask):
        raise _fail(f"nc_stream_shuffle: shuffle_mask must hold {SHUFFLE_QUADRANT} partitions 0..31 (or 255 to keep), "
                    f"got {list(mask)}")
    if dst.dtype is not src.dtype:
        raise _fail(f"nc_stream_shuffle: dst must have the same data type as src ({dst.dtype.name} vs {src.dtype.name})")
    if dst.view.free_size != src.view.free_size:
        raise _fail("nc_stream_shuffle: dst must have the same number of elements per partition as src")
    active = math.ceil(max(dst.view.partitions, src.view.partitions) / SHUFFLE_QUADRANT) * SHUFFLE_QUADRANT
    for t in (src, dst):
        start = t.view.start_partition
        if start % active if active < 96 else start:
            raise _fail(f"nc_stream_shuffle: {t.name} starts at partition {start}; with {active} active partitions "
                        f"it must start at a multiple of {active if active < 96 else 128}")
    _e.emit(StreamShuffle(_e.flat2d(dst.view), _e.flat2d(src.view), mask, engine=Engine.VECTOR))
    return dst


def tensor_partition_reduce(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Reduce ``data`` [P, F] across partitions into [1, F] on GpSimd (nl.add, nl.maximum, nl.minimum)."""
    _no_mask(kwargs, "tensor_partition_reduce")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 3, "data")
    op = _isa._red(_take(kwargs, rest, 0, "op"))
    data = _tile(_take(kwargs, rest, 1, "data"), "tensor_partition_reduce data")
    v = _e.flat2d(data.view)
    out = dst if dst is not None else _e.new_tensor((1, v.free_size), _e.dtype_of(dtype, data.dtype))
    if out.view.free_size != v.free_size or out.view.partitions != 1:
        raise _fail(f"tensor_partition_reduce: dst {list(out.shape)} must be [1, {v.free_size}]")
    _e.emit(PartitionReduce(_e.flat2d(out.view), v, op, engine=Engine.GPSIMD))
    return out


def local_gather(*args: Any, num_elem_per_idx: int = 1, num_valid_indices: int | None = None, **kwargs: Any) -> NkiTensor:
    """GpSimd gather inside each group of 16 partitions: the group's ``index`` slice, flattened
    partition first, gives element offsets into each partition of ``src_buffer``; every
    offset reads ``num_elem_per_idx`` elements. Returns [P, num_valid_indices, num_elem_per_idx]."""
    _no_mask(kwargs, "local_gather")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 3 and _is_tile(a[2]), "src_buffer")
    src = _tile(_take(kwargs, rest, 0, "src_buffer"), "local_gather src_buffer")
    index = _tile(_take(kwargs, rest, 1, "index"), "local_gather index")
    elems = int(rest[2] if len(rest) > 2 else num_elem_per_idx)
    num_valid_indices = rest[3] if len(rest) > 3 else num_valid_indices
    p = src.view.partitions
    if index.view.partitions != p or p % GATHER_GROUP:
        raise _fail(f"local_gather: src_buffer and index must have the same partitions, a multiple of {GATHER_GROUP} "
                    f"(got {p} and {index.view.partitions})")
    if elems not in GATHER_ELEMS:
        raise _fail(f"local_gather: num_elem_per_idx must be one of {list(GATHER_ELEMS)}, got {elems}")
    per_core = index.view.free_size * min(p, GATHER_GROUP)
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= min(per_core, GATHER_MAX_PER_CORE):
        raise _fail(f"local_gather: num_valid_indices {valid} must be 1..{min(per_core, GATHER_MAX_PER_CORE)} (the indices "
                    "of a 16-partition index slice, at most 4096)")
    if index.dtype.is_float:
        raise _fail(f"local_gather: index is {index.dtype.name}; indices must be integers (uint16 on the hardware)")
    out = dst if dst is not None else _e.new_tensor((p, valid, elems), src.dtype)
    if out.dtype is not src.dtype:
        raise _fail(f"local_gather preserves src_buffer's data type: dst is {out.dtype.name}, src_buffer {src.dtype.name}")
    if out.view.free_size != valid * elems:
        raise _fail(f"local_gather: dst {list(out.shape)} must hold {valid * elems} elements per partition")
    _e.emit(LocalGather(_e.flat2d(out.view), _e.flat2d(src.view), _e.flat2d(index.view), elems, valid,
                        engine=Engine.GPSIMD))
    return out


def nonzero_with_count(*args: Any, index_offset: int = 0, padding_val: int = -1, **kwargs: Any) -> NkiTensor:
    """On partitions 0, 16, ..., 112 (one per GpSimd core): the positions of the nonzero
    elements of ``src`` [P, T] plus ``index_offset``, then ``padding_val``, then their count,
    into ``dst`` [P, T + 1] (int32); other partitions of ``dst`` are left as they are."""
    _no_mask(kwargs, "nonzero_with_count")
    _needs_version("nonzero_with_count", 3)
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 2, "src")
    src = _tile(_take(kwargs, rest, 0, "src"), "nonzero_with_count src")
    v = _e.flat2d(src.view)
    out = dst if dst is not None else _e.new_tensor((v.partitions, v.free_size + 1), _dt.int32)
    if src.dtype not in (_dt.float32, _dt.int32) or out.dtype is not _dt.int32:
        raise _fail(f"nonzero_with_count: src must be float32 or int32 and dst int32 (got {src.dtype.name}, {out.dtype.name})")
    if out.view.partitions != v.partitions or out.view.free_size != v.free_size + 1:
        raise _fail(f"nonzero_with_count: dst {list(out.shape)} must be [{v.partitions}, {v.free_size + 1}]: one more "
                    "element than src for the count")
    for t in (src, out):
        if t.buffer is not Memory.SBUF:
            raise _fail(f"nonzero_with_count: {t.name} must be in SBUF")
    _e.emit(NonzeroWithCount(_e.flat2d(out.view), v, int(index_offset), int(padding_val), engine=Engine.GPSIMD))
    return out


def nc_n_gather(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``dst[p, j] = data[p, indices[p, j]]`` within each partition (``data`` seen flat), on GpSimd."""
    _no_mask(kwargs, "nc_n_gather")
    dst, rest = _isa._split_dst(args, kwargs, lambda a: len(a) >= 3, "data")
    data = _tile(_take(kwargs, rest, 0, "data"), "nc_n_gather data")
    idx = _tile(_take(kwargs, rest, 1, "indices"), "nc_n_gather indices")
    out = dst if dst is not None else _e.new_tensor(idx.shape, _e.dtype_of(dtype, data.dtype))
    _same_free("nc_n_gather", out, idx)
    _e.emit(Gather(_e.flat2d(out.view), _e.flat2d(data.view), _e.flat2d(idx.view), engine=Engine.GPSIMD))
    return out


def dma_transpose(*args: Any, axes: Any = None, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Transpose a 2-D ``src`` [A, B] into ``dst`` [B, A] by DMA (an SBUF tile by default)."""
    if "src" in kwargs:
        src, dst = kwargs.pop("src"), kwargs.pop("dst", args[0] if args else None)
    elif len(args) >= 2:
        dst, src = args[0], args[1]
    else:
        src, dst = args[0] if args else None, kwargs.pop("dst", None)
    for key in ("priority", "dge_mode", "name"):
        kwargs.pop(key, None)
    _isa._oob_error(kwargs.pop("oob_mode", None), "dma_transpose")
    if not _is_tile(src):
        raise _fail(f"dma_transpose needs a tensor src, got {src!r}")
    v = src.view
    if len(v.dims) != 2 or axes not in (None, (1, 0), [1, 0]):
        raise _fail(f"dma_transpose: trnsim transposes 2-D access patterns with axes=(1, 0); got shape {list(v.shape)} "
                    f"and axes={axes!r}")
    out = dst if dst is not None else _e.new_tensor((v.shape[1], v.shape[0]), _e.dtype_of(dtype, src.dtype))
    d = out.view
    if d.shape != (v.shape[1], v.shape[0]):
        raise _fail(f"dma_transpose of {list(v.shape)} into {list(out.shape)}: dst must be [{v.shape[1]}, {v.shape[0]}]")
    tr = _e.tracer()
    if v.tensor.on_chip:
        # an on-chip access cannot step over partitions element by element: trnsim bounces
        # the tile through an HBM scratch tensor (assumption: two DMAs where the hardware's
        # DMA transpose makes one transfer)
        scratch = tr.place(v.shape, src.dtype, Memory.HBM, "dma_transpose").view()
        tr.dma(scratch, v)
        v = scratch
    tr.dma(d, View(v.tensor, v.offset, (v.dims[1], v.dims[0])))
    return out


_IDLE, _RESET_REDUCE = reduce_cmd_enum.idle, reduce_cmd_enum.reset_reduce
_COMPARISONS = (AluOp.IS_EQUAL, AluOp.NOT_EQUAL, AluOp.IS_GT, AluOp.IS_GE, AluOp.IS_LT, AluOp.IS_LE)
