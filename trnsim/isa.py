"""The NeuronCore instruction set: tensors, access patterns and instructions.

A Program (:class:`trnsim.program.Program`, importable from here too) owns tensors
(in HBM, SBUF or PSUM) and a list of instructions. Each instruction names the
engine (or DMA queue) that runs it and the earlier instructions it depends on.
Engines run their own instructions in program order; they wait on each other only
through those dependencies and through explicit semaphores.

Operands are :class:`View` objects: a tensor plus an element offset and up to
five ``(stride, count)`` dimensions. On SBUF and PSUM the first dimension is the
partition dimension (at most 128 partitions, step 1); up to four free dimensions
follow. Slicing a tensor (``t[0:64, 128:256]``) makes a View.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, TypeVar, cast

from trnsim.dtypes import DType
from trnsim.errors import ProgramError


class Memory(str, enum.Enum):
    """Where a tensor lives."""

    HBM = "hbm"
    SBUF = "sbuf"
    PSUM = "psum"


class Engine(str, enum.Enum):
    """The compute engines of a NeuronCore (DMA queues are tracks of their own)."""

    TENSOR = "tensor"
    VECTOR = "vector"
    SCALAR = "scalar"
    GPSIMD = "gpsimd"
    SYNC = "sync"


#: Free dimensions one instruction's access pattern walks (besides the partitions).
MAX_FREE_DIMS = 4
#: Dimensions a tensor may have: a tile of more than 1 + MAX_FREE_DIMS is accessed by
#: instructions split over its leading free dimensions (as NKI's compiler does).
MAX_TENSOR_DIMS = 8


def pe_rows(double_row: bool) -> int:
    """Contraction rows per processing element: 2 in the fp8 double-row matmul mode, else
    1. A double-row operand [K, 2, X] is X columns of 2K rows."""
    return 2 if double_row else 1

# Enum members' ``.value`` is a Python-level property; hot paths look names up here.
MEMORY_NAMES = {m: m.value for m in Memory}
ENGINE_NAMES = {e: e.value for e in Engine}

#: How a track of physical core ``n`` > 0 is named: its core-0 name, then ``@nc<n>``
#: (``vector@nc1``, ``dma.q3@nc1``); core 0's tracks keep their plain names.
CORE_MARK = "@nc"
_CORE_TRACKS: dict[tuple[str, int], str] = {}


def core_track(track: str, core: int) -> str:
    """The name of ``track`` (a core-0 track name) on physical core ``core``."""
    if not core:
        return track
    name = _CORE_TRACKS.get((track, core))
    if name is None:
        name = _CORE_TRACKS[(track, core)] = f"{track}{CORE_MARK}{core}"
    return name


def split_track(track: str) -> tuple[str, int]:
    """A track's core-0 name and its physical core: ``"vector@nc1"`` is ``("vector", 1)``."""
    base, mark, core = track.partition(CORE_MARK)
    return (base, int(core)) if mark and core.isdigit() else (track, 0)


def row_major_dims(shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The (step, count) dims of a contiguous row-major layout of ``shape``."""
    if len(shape) == 2:  # most tiles
        return ((shape[1], shape[0]), (1, shape[1]))
    dims = []
    acc = 1
    for n in reversed(shape):
        dims.append((acc, n))
        acc *= n
    return tuple(reversed(dims))


def _tensor_setattr(self: Tensor, name: str, value: object) -> None:
    raise ProgramError(f"tensor {self!r} cannot change its {name}: it is placed, and instructions were "
                       "checked against it; make a new tensor instead")


def _instruction_setattr(self: Instruction, name: str, value: object) -> None:
    if "_owner" in self.__dict__:
        raise ProgramError(f"instruction {self.index} {self.opcode} of program {self.owner!r} cannot change its {name}: "
                           "the program checked and timed it as added; build a new instruction and add that instead")
    object.__setattr__(self, name, value)


def _refuse_delete(self: object, name: str) -> None:
    raise ProgramError(f"{type(self).__name__} {name!r} cannot be deleted: every field of a tensor or instruction "
                       "is needed to check, time and run it; build a new one instead")


def _guard(cls: type, guard: Callable[[Any, str, object], None]) -> None:
    """Route writes to ``cls``'s attributes through ``guard`` once ``@dataclass(frozen=True)``
    has made its ``__init__``, which stores fields directly (no Python-level
    ``__setattr__`` per field, which made building one a large share of tracing): a
    tensor never changes, an instruction until a Program adds it; neither loses a field."""
    # replacing the frozen dataclass's own __setattr__/__delattr__ is the point
    cls.__setattr__ = guard  # type: ignore[method-assign, assignment]
    cls.__delattr__ = _refuse_delete  # type: ignore[method-assign, assignment]


_I = TypeVar("_I", bound="Instruction")


def _guarded(cls: type[_I]) -> type[_I]:
    """An instruction dataclass, guarded (see :func:`_guard`), with its operand fields listed."""
    _guard(cls, _instruction_setattr)
    cls._operand_fields = tuple(dict.fromkeys(cls.read_fields + cls.write_fields))
    return cls


@dataclass(eq=False, frozen=True)
class Tensor:
    """A named region of HBM, SBUF or PSUM with a shape and a dtype.

    On-chip tensors (SBUF, PSUM) are laid out ``shape[0]`` partitions from
    ``start_partition``, the free dimensions row-major within each partition at
    ``byte_offset``. HBM tensors are row-major from ``byte_offset``. An on-chip tensor
    is in the SBUF or PSUM of physical core ``core`` (0 but in a kernel launched over
    the cores of a logical NeuronCore); HBM is the chip's, shared by its cores.
    """

    name: str
    memory: Memory
    shape: tuple[int, ...]
    dtype: DType
    start_partition: int = 0
    byte_offset: int = 0
    core: int = 0
    #: Whether the tensor is in SBUF or PSUM.
    on_chip: bool = field(init=False)
    #: Elements in all.
    size: int = field(init=False)
    #: Elements per partition (on chip) or per leading row (HBM).
    row_elems: int = field(init=False)
    #: Bytes each partition holds of an on-chip tensor.
    partition_bytes: int = field(init=False)
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        # a tensor's shape never changes: its derived sizes (and its whole view's
        # dims) are worked out once; placed from then on (see _tensor_setattr)
        d = self.__dict__
        shape = self.shape
        d["on_chip"] = self.memory is not Memory.HBM
        d["row_elems"] = row = math.prod(shape[1:])
        d["size"] = row * shape[0]
        d["partition_bytes"] = row * self.dtype.itemsize
        d["nbytes"] = d["size"] * self.dtype.itemsize
        d["_whole"] = row_major_dims(shape)

    def view(self) -> View:
        """The whole tensor as a View."""
        return make_view(self, 0, self.__dict__["_whole"])

    def __getitem__(self, index: object) -> View:
        return self.view()[index]

    def __repr__(self) -> str:
        where = f"{self.memory.value}{CORE_MARK}{self.core}" if self.core else self.memory.value
        return f"{where}:{self.name}{list(self.shape)}:{self.dtype.name}"


_guard(Tensor, _tensor_setattr)


#: what calling a View does: NKI's ``t.view(dtype)``, set by :mod:`trnsim.nki.tiles`
VIEW_CALL: list[Callable[[View, object], Any]] = []


class View:
    """An access pattern on a tensor: element ``offset`` plus ``(stride, count)`` dims.

    Strides and offsets count elements of the tensor's dtype. On chip, ``dims[0]``
    walks partitions (its stride is the tensor's elements per partition). Views are
    values: make a new one (by slicing) rather than changing one.
    """

    __slots__ = ("tensor", "offset", "dims", "shape", "size", "free_size", "partitions")
    tensor: Tensor
    offset: int
    dims: tuple[tuple[int, int], ...]
    #: The count of each dimension.
    shape: tuple[int, ...]
    #: Elements in all.
    size: int
    #: Elements per partition.
    free_size: int
    partitions: int

    def __init__(self, tensor: Tensor, offset: int, dims: tuple[tuple[int, int], ...]) -> None:
        # callers may hand lists for the pairs: each becomes a tuple
        _fill(self, tensor, offset, cast("tuple[tuple[int, int], ...]", tuple(map(tuple, dims))))

    def __setattr__(self, name: str, value: object) -> None:
        raise ProgramError(f"view {self!r} cannot change its {name}: views are values; slice the tensor for a new one")

    def __call__(self, dtype: object) -> Any:
        """NKI's ``t.view(dtype)`` on a kernel's tensor, whose ``view`` is this access
        pattern (:data:`VIEW_CALL`, set by ``trnsim.nki``)."""
        if not VIEW_CALL:
            raise ProgramError(f"view {self!r} is an access pattern, not a function; inside an NKI kernel "
                               "t.view(dtype) reads a tensor as another dtype")
        return VIEW_CALL[0](self, dtype)

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    @property
    def memory(self) -> Memory:
        return self.tensor.memory

    @property
    def nbytes(self) -> int:
        return self.size * self.tensor.dtype.itemsize

    @property
    def start_partition(self) -> int:
        """Absolute first partition of an on-chip view."""
        return self.tensor.start_partition + self.offset // self.tensor.row_elems

    @property
    def free_offset(self) -> int:
        """Element offset inside each partition of an on-chip view."""
        return self.offset % self.tensor.row_elems

    def contiguous_run(self) -> int:
        """Length in elements of the longest contiguous chunk the view is made of.

        On chip, chunks never cross partitions.
        """
        run = 1
        start = 1 if self.tensor.on_chip else 0
        for stride, count in reversed(self.dims[start:]):
            if count == 1:
                continue
            if stride != run:
                break
            run *= count
        else:
            return run
        return run

    def max_free_stride_bytes(self) -> int:
        """Largest step in bytes between neighbouring elements of the innermost free dim."""
        for stride, count in reversed(self.dims[1:]):
            if count > 1:
                return stride * self.tensor.dtype.itemsize
        return self.tensor.dtype.itemsize

    def __getitem__(self, index: object) -> View:
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) > len(self.dims):
            raise ProgramError(f"too many indices ({len(index)}) for {self!r} with {len(self.dims)} dimensions")
        offset = self.offset
        dims: list[tuple[int, int]] = []
        nindex = len(index)
        for axis, dim in enumerate(self.dims):
            if axis >= nindex:
                dims.append(dim)
                continue
            stride, count = dim
            idx = index[axis]
            if isinstance(idx, slice):
                start, stop, step = idx.indices(count)
                if step <= 0:
                    raise ProgramError(f"slice step {step} on axis {axis} of {self!r}: only positive steps are supported")
                n = max(0, (stop - start + step - 1) // step)
                if (idx.start is not None and not -count <= idx.start <= count
                        or idx.stop is not None and not -count <= idx.stop <= count):
                    raise ProgramError(f"slice {idx.start}:{idx.stop} is out of bounds for axis {axis} "
                                       f"of size {count} in {self!r}")
                offset += start * stride
                dims.append((stride * step, n))
            elif isinstance(idx, int):
                if not -count <= idx < count:
                    raise ProgramError(f"index {idx} is out of bounds for axis {axis} of size {count} in {self!r}")
                offset += (idx % count) * stride
                if axis == 0 and self.tensor.on_chip:
                    dims.append((stride, 1))  # keep the partition dimension
            else:
                raise ProgramError(f"index {idx!r} on axis {axis}: use integers or slices")
        return make_view(self.tensor, offset, tuple(dims))

    def __repr__(self) -> str:
        return f"{self.tensor.memory.value}:{self.tensor.name}@{self.offset}{list(self.shape)}:{self.tensor.dtype.name}"


_new = object.__new__
_set = object.__setattr__


def _fill(v: View, tensor: Tensor, offset: int, dims: tuple[tuple[int, int], ...]) -> None:
    shape = tuple([count for _, count in dims])
    size = math.prod(shape)
    partitions = shape[0] if shape else 1
    _set(v, "tensor", tensor)
    _set(v, "offset", offset)
    _set(v, "dims", dims)
    _set(v, "shape", shape)
    _set(v, "partitions", partitions)
    _set(v, "size", size)
    _set(v, "free_size", size // partitions if partitions else 0)


def make_view(tensor: Tensor, offset: int, dims: tuple[tuple[int, int], ...]) -> View:
    """``View(tensor, offset, dims)`` for ``dims`` already a tuple of ``(stride, count)``
    tuples (what slicing makes): the constructor's normalising copy is skipped."""
    v = _new(View)
    _fill(v, tensor, offset, dims)
    return v


def dims_extent(dims: tuple[tuple[int, int], ...]) -> int:
    """Elements from the first element ``dims`` walk to one past the last."""
    return 1 + sum(s * (c - 1) for s, c in dims if c > 0)


Operand = View
Scalar = float


class ActivationFunc(str, enum.Enum):
    """Functions of the scalar engine's activation instruction."""

    IDENTITY = "identity"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    SQUARE = "square"
    ABS = "abs"
    SOFTPLUS = "softplus"
    SIN = "sin"
    COS = "cos"
    ERF = "erf"
    SIGN = "sign"
    GELU_DX = "gelu_dx"
    SILU_DX = "silu_dx"
    #: ``z * sigmoid(1.702 z)``
    GELU_APPRX_SIGMOID = "gelu_apprx_sigmoid"


class AluOp(str, enum.Enum):
    """Arithmetic and comparison operations of the vector and GpSimd engines."""

    ADD = "add"
    SUBTRACT = "subtract"
    MULTIPLY = "multiply"
    DIVIDE = "divide"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    POW = "pow"
    ABS_DIFF = "abs_diff"
    IS_EQUAL = "is_equal"
    NOT_EQUAL = "not_equal"
    IS_GT = "is_gt"
    IS_GE = "is_ge"
    IS_LT = "is_lt"
    IS_LE = "is_le"
    BYPASS = "bypass"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    LEFT_SHIFT = "left_shift"
    RIGHT_SHIFT = "right_shift"


class ReduceOp(str, enum.Enum):
    """Reductions along free dimensions."""

    ADD = "add"
    MAX = "max"
    MIN = "min"


@_guarded
@dataclass(eq=False, frozen=True)
class Instruction:
    """Base of every instruction: where it runs, what it waits for, where it came from."""

    engine: Engine = field(default=Engine.SYNC, kw_only=True)
    deps: tuple[int, ...] = field(default=(), kw_only=True)
    source: str = field(default="", kw_only=True)
    index: int = field(default=-1, kw_only=True)
    #: the physical core whose engine (or DMA queue) runs it
    core: int = field(default=0, kw_only=True)

    opcode: ClassVar[str] = "instruction"
    engines: ClassVar[tuple[Engine, ...]] = ()
    read_fields: ClassVar[tuple[str, ...]] = ()
    write_fields: ClassVar[tuple[str, ...]] = ()
    #: ``read_fields`` then ``write_fields``, each name once (set by :func:`_guarded`)
    _operand_fields: ClassVar[tuple[str, ...]]

    def __post_init__(self) -> None:
        # A whole tensor may stand wherever a View is expected.
        d = self.__dict__
        for name in self._operand_fields:
            value = d[name]
            if value.__class__ is not View and isinstance(value, Tensor):
                d[name] = value.view()

    def _seal(self, owner: str) -> None:
        """Fix every field, dependencies included: ``owner``'s checks and timing rely on them."""
        object.__setattr__(self, "_owner", owner)

    @property
    def owner(self) -> str | None:
        """Name of the Program this instruction was added to, or None."""
        return self.__dict__.get("_owner")

    @property
    def track(self) -> str:
        """Name of the timeline this instruction runs on."""
        name = ENGINE_NAMES[self.engine]
        return core_track(name, self.core) if self.core else name

    def reads(self) -> tuple[View, ...]:
        """The operands this instruction reads (fields named in ``read_fields`` that hold Views)."""
        d = self.__dict__
        return tuple([v for n in self.read_fields if isinstance(v := d[n], View)])

    def writes(self) -> tuple[View, ...]:
        """The operands this instruction writes (fields named in ``write_fields``)."""
        d = self.__dict__
        return tuple([v for n in self.write_fields if isinstance(v := d[n], View)])

    def describe(self) -> str:
        """One line: opcode and operands."""
        parts = [f"{v!r}" for v in self.writes()] + [f"{v!r}" for v in self.reads()]
        return f"{self.opcode} " + ", ".join(parts)


@_guarded
@dataclass(eq=False, frozen=True)
class LoadStationary(Instruction):
    """Load ``src`` [K, M] (SBUF) into the PE array as the stationary operand.

    ``double_row`` (NC-v3 and later, fp8 only): ``src`` is [K, 2, M] and the PE array
    holds a contraction of 2K rows, two fp8 values per processing element, row ``r * K
    + k`` from ``src[k, r]``; the load takes the time of an [K, M] one."""

    src: View
    double_row: bool = False
    opcode = "load_stationary"
    read_fields = ('src',)
    write_fields = ()
    engines = (Engine.TENSOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class MultiplyMoving(Instruction):
    """Stream ``src`` [K, N] (SBUF) past the stationary [K, M]; write stationary.T @ src
    [M, N] into ``dst`` (PSUM, fp32). ``accumulate=False`` starts an accumulation group
    (overwrites), ``True`` adds to it. ``double_row``: ``src`` is [K, 2, N], multiplied
    with a double-row stationary (see :class:`LoadStationary`) over 2K rows, in the
    time of a [K, N] multiply."""

    dst: View
    src: View
    accumulate: bool = False
    double_row: bool = False
    opcode = "multiply_moving"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.TENSOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class Transpose(Instruction):
    """Transpose ``src`` [P, F] (SBUF) through the PE array into ``dst`` [F, P] (PSUM)."""

    dst: View
    src: View
    opcode = "transpose"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.TENSOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class Activation(Instruction):
    """``dst = func(src * scale + bias)``; ``bias`` is a [P, 1] view or None, ``scale`` a
    number or a [P, 1] view. With ``reduce_op``, ``reduce_dst`` [P, 1] gets the reduction
    of the outputs along the free dimensions."""

    dst: View
    src: View
    func: ActivationFunc = ActivationFunc.IDENTITY
    bias: View | None = None
    scale: float | View = 1.0
    reduce_op: ReduceOp | None = None
    reduce_dst: View | None = None
    opcode = "activation"
    read_fields = ('src', 'bias', 'scale')
    write_fields = ('dst', 'reduce_dst')
    engines = (Engine.SCALAR,)


@_guarded
@dataclass(eq=False, frozen=True)
class TensorTensor(Instruction):
    """``dst = op(a, b)`` elementwise; ``a``, ``b`` and ``dst`` have one shape."""

    dst: View
    a: View
    b: View
    op: AluOp = AluOp.ADD
    opcode = "tensor_tensor"
    read_fields = ('a', 'b')
    write_fields = ('dst',)
    engines = (Engine.VECTOR, Engine.GPSIMD)


@_guarded
@dataclass(eq=False, frozen=True)
class TensorScalar(Instruction):
    """``dst = op1(op0(src, operand0), operand1)``; operands are numbers or [P, 1] views
    (one value per partition). ``op1=None`` applies ``op0`` only. ``reverse0`` swaps
    the operands of ``op0`` (``operand0 - src`` rather than ``src - operand0``). With
    ``reduce_op``, ``reduce_dst`` [P, 1] gets the reduction of the outputs along the free
    dimensions, in the same pass (``nisa.tensor_scalar_reduce``)."""

    dst: View
    src: View
    op0: AluOp
    operand0: float | View
    op1: AluOp | None = None
    operand1: float | View | None = None
    reverse0: bool = False
    reduce_op: ReduceOp | None = None
    reduce_dst: View | None = None
    opcode = "tensor_scalar"
    read_fields = ('src', 'operand0', 'operand1')
    write_fields = ('dst', 'reduce_dst')
    engines = (Engine.VECTOR, Engine.GPSIMD, Engine.SCALAR)


@_guarded
@dataclass(eq=False, frozen=True)
class TensorReduce(Instruction):
    """Reduce ``src`` along its last ``num_axes`` free dimensions into ``dst``; with
    ``negate``, the result's negative (one instruction, as ``nisa.tensor_reduce(negate=True)``
    is on the chip)."""

    dst: View
    src: View
    op: ReduceOp = ReduceOp.ADD
    num_axes: int = 1
    negate: bool = False
    opcode = "tensor_reduce"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.VECTOR, Engine.GPSIMD)


@_guarded
@dataclass(eq=False, frozen=True)
class TensorCopy(Instruction):
    """Copy ``src`` to ``dst``, converting to ``dst``'s dtype (round to nearest even)."""

    dst: View
    src: View
    opcode = "tensor_copy"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD)


@_guarded
@dataclass(eq=False, frozen=True)
class Memset(Instruction):
    """Fill ``dst`` with ``value``."""

    dst: View
    value: float = 0.0
    opcode = "memset"
    read_fields = ()
    write_fields = ('dst',)
    engines = (Engine.VECTOR, Engine.GPSIMD, Engine.SCALAR)


@_guarded
@dataclass(eq=False, frozen=True)
class Iota(Instruction):
    """``dst[p, i0, i1, ...] = offset + channel_multiplier * p + sum(steps[k] * ik)``."""

    dst: View
    steps: tuple[int, ...] = ()
    offset: int = 0
    channel_multiplier: int = 0
    opcode = "iota"
    read_fields = ()
    write_fields = ('dst',)
    engines = (Engine.GPSIMD,)


@_guarded
@dataclass(eq=False, frozen=True)
class Select(Instruction):
    """``dst = on_true where mask != 0 else on_false``; ``on_false`` may be a number."""

    dst: View
    mask: View
    on_true: View
    on_false: float | View = 0.0
    opcode = "select"
    read_fields = ('mask', 'on_true', 'on_false')
    write_fields = ('dst',)
    engines = (Engine.VECTOR, Engine.GPSIMD)


@_guarded
@dataclass(eq=False, frozen=True)
class AffineSelect(Instruction):
    """``dst = src where cmp(offset + channel_multiplier * p + sum(steps[k] * ik), 0)
    else fill`` (``cmp`` one of the comparison AluOps): masks such as causal attention."""

    dst: View
    src: View
    steps: tuple[int, ...] = ()
    offset: int = 0
    channel_multiplier: int = 0
    cmp: AluOp = AluOp.IS_GE
    fill: float = 0.0
    opcode = "affine_select"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.GPSIMD,)


BN_STATS_WIDTH = 6   # (mean, sum of squared deviations, count, 0, 0, 0) per partition
BN_STATS_MAX_FREE = 512


@_guarded
@dataclass(eq=False, frozen=True)
class BnStats(Instruction):
    """Per-partition statistics of ``src`` [P, F] (F <= 512) into ``dst`` [P, 6]: the mean,
    the sum of squared deviations from it, and the count (then three zeros)."""

    dst: View
    src: View
    opcode = "bn_stats"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class BnAggr(Instruction):
    """Combine ``src`` [P, 6 * k] (k BnStats results side by side) into ``dst`` [P, 2]:
    mean and population variance over all k chunks."""

    dst: View
    src: View
    opcode = "bn_aggr"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class TensorTensorScan(Instruction):
    """A running scan along the free axis of ``a`` and ``b`` [P, F] (fp32 math):
    ``dst[:, i] = op1(op0(a[:, i], dst[:, i - 1]), b[:, i])`` with ``dst[:, -1] = initial``
    (a number or a [P, 1] view). ``reverse0``/``reverse1`` swap the operands of each op."""

    dst: View
    a: View
    b: View
    initial: float | View = 0.0
    op0: AluOp = AluOp.MULTIPLY
    op1: AluOp = AluOp.ADD
    reverse0: bool = False
    reverse1: bool = False
    opcode = "tensor_tensor_scan"
    read_fields = ('a', 'b', 'initial')
    write_fields = ('dst',)
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class ScalarTensorTensor(Instruction):
    """``dst = op1(op0(src, operand0), b)`` in one pass: ``operand0`` a number or a [P, 1]
    view, ``b`` of ``src``'s shape; ``reverse0``/``reverse1`` swap each op's operands."""

    dst: View
    src: View
    op0: AluOp
    operand0: float | View
    op1: AluOp
    b: View
    reverse0: bool = False
    reverse1: bool = False
    opcode = "scalar_tensor_tensor"
    read_fields = ('src', 'operand0', 'b')
    write_fields = ('dst',)
    engines = (Engine.VECTOR, Engine.GPSIMD)


@_guarded
@dataclass(eq=False, frozen=True)
class Reciprocal(Instruction):
    """``dst = 1 / src`` elementwise (fp32 math), on the vector engine."""

    dst: View
    src: View
    opcode = "reciprocal"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.VECTOR,)


MAX8_WIDTH = 8


@_guarded
@dataclass(eq=False, frozen=True)
class Max8(Instruction):
    """The 8 largest values of each partition of ``src`` (8..16384 elements), descending, into ``dst`` [P, 8]."""

    dst: View
    src: View
    opcode = "max8"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class FindIndex8(Instruction):
    """Per partition, the index of the first occurrence in ``src`` of each of the 8 ``vals``
    (repeated values take the next occurrences, in order); all ones where none is left."""

    dst: View
    src: View
    vals: View
    opcode = "nc_find_index8"
    read_fields = ('src', 'vals')
    write_fields = ('dst',)
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class MatchReplace8(Instruction):
    """``dst`` = ``src`` with the first occurrence of each of the 8 ``vals`` per partition
    replaced by ``imm`` (vals taken last to first); ``dst_idx`` [P, 8] gets the positions."""

    dst: View
    src: View
    vals: View
    imm: float = 0.0
    dst_idx: View | None = None
    opcode = "nc_match_replace8"
    read_fields = ('src', 'vals')
    write_fields = ('dst', 'dst_idx')
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class RangeSelect(Instruction):
    """``dst = src where cmp0(start + i, bound0) and cmp1(start + i, bound1) else fill``, ``i``
    the free index and the bounds [P, 1]; ``reduce_dst`` [P, 1] (optional) gets the max of ``dst``."""

    dst: View
    src: View
    cmp0: AluOp
    cmp1: AluOp
    bound0: View
    bound1: View
    start: int = 0
    fill: float = -3.4028234663852886e38
    reduce_dst: View | None = None
    opcode = "range_select"
    read_fields = ('src', 'bound0', 'bound1')
    write_fields = ('dst', 'reduce_dst')
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class SequenceBounds(Instruction):
    """For segment ids ``src`` [1, N], ``dst`` [1, 2, N]: the first index and one past the
    last index of each element's segment; id 0 (padding) gets (N, -1)."""

    dst: View
    src: View
    opcode = "sequence_bounds"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.GPSIMD,)


SHUFFLE_QUADRANT = 32
SHUFFLE_KEEP = 255


@_guarded
@dataclass(eq=False, frozen=True)
class StreamShuffle(Instruction):
    """Cross-partition copy inside each quadrant of 32 partitions: ``dst`` partition ``i``
    gets ``src`` partition ``mask[i]`` of the same quadrant; 255 leaves ``dst[i]`` as it is."""

    dst: View
    src: View
    mask: tuple[int, ...] = ()
    opcode = "nc_stream_shuffle"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class PartitionReduce(Instruction):
    """Reduce ``src`` [P, F] across its partitions into ``dst`` [1, F]."""

    dst: View
    src: View
    op: ReduceOp = ReduceOp.ADD
    opcode = "tensor_partition_reduce"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.GPSIMD,)


@_guarded
@dataclass(eq=False, frozen=True)
class RandomUniform(Instruction):
    """Fill ``dst`` with values drawn uniformly from [low, high) by the engine's generator
    (``bits=True``: raw 32-bit random integers truncated to ``dst``'s dtype instead)."""

    dst: View
    low: float = 0.0
    high: float = 1.0
    bits: bool = False
    opcode = "rand"
    read_fields = ()
    write_fields = ('dst',)
    engines = (Engine.VECTOR, Engine.GPSIMD)


@_guarded
@dataclass(eq=False, frozen=True)
class Dropout(Instruction):
    """``dst = 0 where a uniform draw in [0, 1) < prob else src``; ``prob`` a number or [P, 1] view."""

    dst: View
    src: View
    prob: float | View = 0.5
    opcode = "dropout"
    read_fields = ('src', 'prob')
    write_fields = ('dst',)
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class RngSeed(Instruction):
    """Seed the engine's random generator from the values of ``src``."""

    src: View
    opcode = "set_rng_seed"
    read_fields = ('src',)
    write_fields = ()
    engines = (Engine.VECTOR, Engine.GPSIMD)


@_guarded
@dataclass(eq=False, frozen=True)
class RngState(Instruction):
    """Write the engine's random generator state into ``dst`` (uint32): the 32-bit words of
    the simulated generator's state, repeated along each partition's row, the same in every
    partition (the simulated generator is numpy's PCG64, not the hardware's XORWOW)."""

    dst: View
    opcode = "rand_get_state"
    read_fields = ()
    write_fields = ('dst',)
    engines = (Engine.VECTOR, Engine.GPSIMD)


GATHER_GROUP = 16


@_guarded
@dataclass(eq=False, frozen=True)
class LocalGather(Instruction):
    """GpSimd gather: each group of 16 partitions flattens its ``indices`` slice partition
    first and keeps the first ``valid`` indices; ``dst[p, k, e] = src[p, indices_k + e]`` for
    ``e < elems`` (``src`` per partition seen flat)."""

    dst: View
    src: View
    indices: View
    elems: int = 1
    valid: int = 0
    opcode = "local_gather"
    read_fields = ('src', 'indices')
    write_fields = ('dst',)
    engines = (Engine.GPSIMD,)


@_guarded
@dataclass(eq=False, frozen=True)
class Gather(Instruction):
    """``dst[p, j] = src[p, indices[p, j]]`` within each partition (``src`` seen flat)."""

    dst: View
    src: View
    indices: View
    opcode = "nc_n_gather"
    read_fields = ('src', 'indices')
    write_fields = ('dst',)
    engines = (Engine.GPSIMD,)


@_guarded
@dataclass(eq=False, frozen=True)
class NonzeroWithCount(Instruction):
    """On the first partition of each group of 16: the positions (plus ``offset``) of the
    nonzero elements of ``src`` [P, T], then ``padding``, then their count, into ``dst``
    [P, T + 1]; the other partitions of ``dst`` keep their values."""

    dst: View
    src: View
    offset: int = 0
    padding: int = -1
    opcode = "nonzero_with_count"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.GPSIMD,)


@_guarded
@dataclass(eq=False, frozen=True)
class BlockTranspose(Instruction):
    """Transpose ``src`` [P, F] (both at most 32) into ``dst`` [F, P] on the vector engine."""

    dst: View
    src: View
    opcode = "vector_transpose"
    read_fields = ('src',)
    write_fields = ('dst',)
    engines = (Engine.VECTOR,)


@_guarded
@dataclass(eq=False, frozen=True)
class DmaCopy(Instruction):
    """Copy ``src`` to ``dst`` (HBM, SBUF or PSUM) on DMA queue ``queue``; between float
    dtypes the DMA converts through fp32 (round to nearest even)."""

    dst: View
    src: View
    queue: int = 0
    #: a transfer the compiler leaves out in a compiled graph, the data staying in SBUF: a
    #: load of an earlier kernel's result into the partitions it was stored from, or a
    #: store of a result only such loads read; it moves nothing (:mod:`trnsim.nki.forwarding`)
    forwarded: bool = field(default=False, kw_only=True)
    opcode = "dma_copy"
    read_fields: ClassVar[tuple[str, ...]] = ('src',)
    write_fields = ('dst',)

    @property
    def track(self) -> str:
        name = _QUEUE_TRACKS.get(self.queue)
        if name is None:
            name = _QUEUE_TRACKS[self.queue] = f"dma.q{self.queue}"
        return core_track(name, self.core) if self.core else name


_QUEUE_TRACKS: dict[int, str] = {}


@_guarded
@dataclass(eq=False, frozen=True)
class DmaIndirect(DmaCopy):
    """A DMA gather (``scatter`` False: ``src`` is indirect) or scatter (``dst`` indirect)
    through an index tile, generated by software DGE.

    The indirect side is an HBM view whose dim ``dim`` has stride 0 (every index 0: what
    the access would be if all indices were 0) and count ``n``; position ``j`` on that dim
    addresses ``indices[j] * step`` elements past the view's offset. ``indices`` is an
    on-chip integer view of ``n`` elements. An index is in bounds when it is in
    ``0..bound - 1``; out of bounds, the DMA fails, or with ``skip`` moves nothing for that
    index (the other side keeps its values there).
    """

    indices: View = field(default=cast(View, None))
    dim: int = 0
    step: int = 0
    bound: int = 0
    scatter: bool = False
    skip: bool = False
    opcode = "dma_indirect"
    read_fields: ClassVar[tuple[str, ...]] = ('src', 'indices')
    write_fields = ('dst',)

    @property
    def indirect(self) -> View:
        """The HBM view whose dim ``dim`` the indices choose."""
        return self.dst if self.scatter else self.src

    def span(self) -> View:
        """All the indirect side can reach: its dim ``dim`` walked over every index in bounds."""
        v = self.indirect
        dims = list(v.dims)
        dims[self.dim] = (self.step, self.bound)
        return make_view(v.tensor, v.offset, tuple(dims))

    def reads(self) -> tuple[View, ...]:
        return (self.src, self.indices) if self.scatter else (self.src, self.indices, self.span())

    def writes(self) -> tuple[View, ...]:
        return (self.dst, self.span()) if self.scatter else (self.dst,)


@_guarded
@dataclass(eq=False, frozen=True)
class SemaphoreSignal(Instruction):
    """Add one to semaphore ``sem`` when every earlier instruction on this engine is done."""

    sem: str = "sem"
    opcode = "semaphore_signal"
    engines = tuple(Engine)

    def describe(self) -> str:
        return f"{self.opcode} {self.sem}"


@_guarded
@dataclass(eq=False, frozen=True)
class SemaphoreWait(Instruction):
    """Block this engine until semaphore ``sem`` has reached ``count``."""

    sem: str = "sem"
    count: int = 1
    opcode = "semaphore_wait"
    engines = tuple(Engine)

    def describe(self) -> str:
        return f"{self.opcode} {self.sem} >= {self.count}"


ALU_COMPARISONS = (AluOp.IS_EQUAL, AluOp.NOT_EQUAL, AluOp.IS_GT, AluOp.IS_GE, AluOp.IS_LT, AluOp.IS_LE)
