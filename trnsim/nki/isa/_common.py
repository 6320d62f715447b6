"""What the ``nki.isa`` instructions share: reading their arguments in both of NKI's
styles (``dst=`` or the destination tile first, else a returned tile), naming the
engines' operations for the nl/numpy functions kernels pass as ``op``, and the checks
several instructions make."""

from __future__ import annotations

from numbers import Real
from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import ActivationFunc, AluOp, Engine, Memory, ReduceOp, TensorReduce, View
from trnsim.nki import emit as _e
from trnsim.nki.isa.constants import get_nc_version
from trnsim.nki.isa.constants import reduce_cmd as reduce_cmd_enum
from trnsim.nki.tiles import NkiTensor
from trnsim.nki.tracer import KernelError

IDLE, RESET_REDUCE = reduce_cmd_enum.idle, reduce_cmd_enum.reset_reduce
COMPARISONS = (AluOp.IS_EQUAL, AluOp.NOT_EQUAL, AluOp.IS_GT, AluOp.IS_GE, AluOp.IS_LT, AluOp.IS_LE)


# numpy / nl functions that NKI passes as ``op``: map them to the engines' operations.
ALU_NAMES = {"add": AluOp.ADD, "subtract": AluOp.SUBTRACT, "multiply": AluOp.MULTIPLY, "divide": AluOp.DIVIDE,
             "maximum": AluOp.MAXIMUM, "minimum": AluOp.MINIMUM, "max": AluOp.MAXIMUM, "min": AluOp.MINIMUM,
             "amax": AluOp.MAXIMUM, "amin": AluOp.MINIMUM, "power": AluOp.POW, "equal": AluOp.IS_EQUAL,
             "not_equal": AluOp.NOT_EQUAL, "greater": AluOp.IS_GT, "greater_equal": AluOp.IS_GE, "less": AluOp.IS_LT,
             "less_equal": AluOp.IS_LE, "bypass": AluOp.BYPASS,
             "bitwise_and": AluOp.BITWISE_AND, "bitwise_or": AluOp.BITWISE_OR, "bitwise_xor": AluOp.BITWISE_XOR,
             "left_shift": AluOp.LEFT_SHIFT, "right_shift": AluOp.RIGHT_SHIFT}
REDUCE_NAMES = {"add": ReduceOp.ADD, "sum": ReduceOp.ADD, "maximum": ReduceOp.MAX, "max": ReduceOp.MAX, "amax": ReduceOp.MAX,
                "minimum": ReduceOp.MIN, "min": ReduceOp.MIN, "amin": ReduceOp.MIN}
ACT_NAMES = {f.value: f for f in ActivationFunc} | {"copy": ActivationFunc.IDENTITY, "gelu_apprx_tanh": ActivationFunc.GELU_TANH}


def op_name(op: Any) -> str:
    return op.value if hasattr(op, "value") else getattr(op, "__name__", str(op))


def lookup(op: Any, kind: type, names: dict[str, Any], what: str, choices: str) -> Any:
    """The engine operation ``op`` (an enum member, or an nl/numpy function) stands for."""
    if isinstance(op, kind):
        return op
    found = names.get(op_name(op))
    if found is None:
        raise _e.tracer().fail(f"op {op!r} is not {what}; use {choices}")
    return found


def alu(op: Any) -> AluOp:
    return lookup(op, AluOp, ALU_NAMES, "an ALU operation", "one of nl." + ", nl.".join(ALU_NAMES))


# unary operators an ALU instruction takes as op0 with an operand of None or 0 (NKI's
# tensor_scalar docs: "Must be None or 0 when op0 is a unary operator (e.g., nl.abs)"),
# as the binary operation that gives the same result against 0
UNARY_ALU = {"abs": AluOp.ABS_DIFF}


def alu_operand(op: Any, value: Any, what: str) -> tuple[AluOp, Any]:
    """An ALU operation and its scalar operand (a number or a [P, 1] view): a unary
    operator (``nl.abs``) takes None or 0 and computes against 0."""
    unary = UNARY_ALU.get(op_name(op))
    if unary is None:
        return alu(op), operand(value)
    if value is not None and not (isinstance(value, Real) and float(value) == 0.0):
        raise fail(f"{what}: nl.{op_name(op)} is a unary operator, so its operand must be None or 0 (as NKI "
                   f"documents), got {value!r}")
    return unary, 0.0


def reduction(op: Any) -> ReduceOp:
    return lookup(op, ReduceOp, REDUCE_NAMES, "a reduction", "nl.add, nl.maximum or nl.minimum")


def act(op: Any) -> ActivationFunc:
    return lookup(op, ActivationFunc, ACT_NAMES, "an activation function",
                   "one of nl." + ", nl.".join(f.value for f in ActivationFunc))


def split_dst(args: tuple, kwargs: dict, first_is_dst: Any, operand: str) -> tuple[NkiTensor | None, tuple]:
    """Destination-passing calls have ``dst=``, or a tile as first argument: one followed by
    the operands (``first_is_dst``), or one given beside the ``operand`` keyword."""
    if "dst" in kwargs:
        return kwargs.pop("dst"), args
    if args and (first_is_dst(args) or (operand in kwargs and is_tile(args[0]))):
        return args[0], args[1:]
    return None, args


def pick_engine(engine: Any, default: Engine) -> Engine:
    return _e.tracer().engine_for(engine, default)


def chosen_engine(engine: Any) -> Engine | None:
    """NKI's ``engine=`` of an instruction the compiler places when it is not given
    (``nisa.unknown_engine``): the engine, or None for the compiler's choice."""
    return None if engine is None else _e.tracer().engine_for(engine, Engine.VECTOR)


def out_tile(dst: NkiTensor | None, ref: NkiTensor, dtype: Any, shape: Any = None, buffer: Memory = Memory.SBUF) -> NkiTensor:
    if dst is not None:
        return dst
    return _e.new_tensor(shape or ref.shape, _e.dtype_of(dtype, ref.dtype if ref.buffer is Memory.SBUF else _dt.float32), buffer)


def is_tile(x: Any) -> bool:
    return isinstance(x, NkiTensor)


def operand(v: Any) -> Any:
    if v is None or isinstance(v, Real):
        return None if v is None else float(v)
    return _e.readable(v, "tensor_scalar operand").view


def take(kwargs: dict, rest: tuple, index: int, name: str, default: Any = None) -> Any:
    """Argument ``name``: a keyword, else the ``index``-th positional one, else ``default``."""
    if name in kwargs:
        return kwargs.pop(name)
    return rest[index] if len(rest) > index else default


def fail(message: str) -> KernelError:
    return _e.tracer().fail(message)


def tile(x: Any, what: str) -> NkiTensor:
    return _e.readable(x, what)


def scalar_or_view(x: Any, what: str) -> float | View:
    if isinstance(x, Real):
        return float(x)
    return tile(x, what).view


def not_both_psum(a: NkiTensor, b: NkiTensor, name: str, first: str, second: str) -> None:
    if a.buffer is Memory.PSUM and b.buffer is Memory.PSUM:
        raise fail(f"{name}: {first} and {second} cannot both be in PSUM; copy one of them to SBUF first")


def same_free(name: str, out: NkiTensor, *tiles: NkiTensor) -> None:
    for t in tiles:
        if t.view.partitions != out.view.partitions or t.view.free_size != out.view.free_size:
            raise fail(f"{name}: {t.name}{list(t.shape)} and {out.name}{list(out.shape)} must have the same partitions "
                        "and elements per partition")


def needs_version(name: str, first: int) -> None:
    """Refuse an instruction the traced chip's NeuronCore generation lacks."""
    version = get_nc_version().value
    if version < first:
        raise fail(f"{name} is available only on NeuronCore-v{first} and newer; the kernel is traced for "
                    f"{_e.tracer().chip.name} (NeuronCore-v{version}); pass chip= a newer chip")


def no_mask(kwargs: dict, name: str) -> None:
    if kwargs.pop("mask", None) is not None:
        raise fail(f"{name}: mask= is not supported here; slice the tiles to the region instead")


def only_reset(name: str, cmd: Any, allowed: tuple[reduce_cmd_enum, ...]) -> None:
    """trnsim keeps no scalar-engine accumulator registers between instructions (the vector
    engine's are :mod:`trnsim.nki.isa.accumulator`): each reduction starts afresh."""
    if cmd is not None and cmd not in allowed:
        raise fail(f"{name}: reduce_cmd={cmd!r} carries the scalar engine's accumulator registers across instructions, "
                    f"which trnsim does not model; use one of {', '.join(c.name for c in allowed)} and combine partial "
                    "results with nisa.tensor_tensor")


def reduce_res_tile(name: str, reduce_res: Any, partitions: int) -> NkiTensor:
    """The tile an instruction named ``name`` writes its row reduction into: [partitions, 1]."""
    res = tile(reduce_res, f"{name} reduce_res")
    if res.view.partitions != partitions or res.view.free_size != 1:
        raise fail(f"{name}: reduce_res {res.name}{list(res.shape)} must be [{partitions}, 1]")
    return res


def reduce_into(name: str, reduce_res: Any, src: NkiTensor, op: ReduceOp, engine: Engine = Engine.VECTOR) -> None:
    res = reduce_res_tile(name, reduce_res, src.view.partitions)
    _e.emit(TensorReduce(res.view, _e.flat2d(src.view), op, 1, engine=engine))
