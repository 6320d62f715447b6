"""``nki.language`` (``nl``): tiles, memory movement, math and loops, with NKI's names.

Value-returning calls (``t = nl.exp(x)``) make a fresh SBUF tile for the result;
``nl.matmul`` gives a PSUM result that ``+=`` accumulates (``acc += nl.matmul(a, b,
transpose_x=True)``). Kernels in the destination-passing style use
``nl.ndarray`` with :mod:`trnsim.nki.isa`.
"""

from __future__ import annotations

import builtins
import math
from numbers import Real
from typing import Any, Iterator, Sequence

from trnsim import dtypes as _dt
from trnsim.isa import (
    ActivationFunc,
    AluOp,
    Engine,
    Memory,
    Memset,
    ReduceOp,
    Select,
    View,
)
from trnsim.nki import emit as _e
from trnsim.nki.tiles import Affine, BlockedTile, Mask, NkiTensor, ParDim, _Placement, ds, mgrid

__all__ = [
    "ndarray", "zeros", "ones", "full", "zeros_like", "empty_like", "load", "store", "copy", "matmul", "transpose",
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_apprx_tanh", "silu", "square", "abs",
    "sin", "cos", "erf", "sign", "reciprocal", "softplus", "gelu_dx", "silu_dx", "negative",
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal", "not_equal", "greater",
    "greater_equal", "less", "less_equal",
    "sum", "max", "min", "mean", "var", "softmax", "rms_norm", "where", "broadcast_to",
    "affine_range", "sequential_range", "static_range", "arange", "ds", "program_id", "num_programs", "program_ndim",
    "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "tile_size",
    "float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2", "int8", "uint8", "int16", "int32", "uint32",
    "tfloat32", "MatmulResult",
    "uint16", "bool_", "float8_e4m3fn", "float8_e8m0fnu", "float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4",
    "float32r", "fp32", "NkiTensor", "NKIObject", "mgrid", "par_dim", "nc", "spmd_dim", "static_cast", "device_print",
    "no_reorder", "fori_loop", "while_loop", "dynamic_range", "is_hbm", "is_sbuf", "is_psum", "is_on_chip",
    "bypass", "logical_and", "logical_or", "logical_xor", "logical_not", "abs_max", "abs_min", "tan",
    "mish", "gelu_apprx_sigmoid", "all", "floor", "ceil", "trunc", "mod", "fmod",
    "erf_dx", "gelu_apprx_sigmoid_dx", "arctan", "prod", "loop_reduce", "rand", "random_seed", "dropout", "expand_dims", "load_transpose2d", "shared_identity_matrix", "shared_constant",
]

# Memories.
sbuf = Memory.SBUF
psum = Memory.PSUM
hbm = Memory.HBM
shared_hbm = Memory.HBM
private_hbm = Memory.HBM

# Dtypes.
float32 = _dt.float32
tfloat32 = _dt.float32
bfloat16 = _dt.bfloat16
float16 = _dt.float16
float8_e4m3 = _dt.float8_e4m3
float8_e5m2 = _dt.float8_e5m2
int8 = _dt.int8
uint8 = _dt.uint8
int16 = _dt.int16
int32 = _dt.int32
uint32 = _dt.uint32


uint16 = _dt.uint16
bool_ = _dt.bool_
float8_e4m3fn = _dt.float8_e4m3
float8_e8m0fnu = _dt.float8_e8m0fnu
float8_e5m2_x4 = _dt.float8_e5m2_x4
float8_e4m3fn_x4 = _dt.float8_e4m3fn_x4
float4_e2m1fn_x4 = _dt.float4_e2m1fn_x4
#: fp32 matmul operands read in one pass (NKI's "fp32 replicated" performance mode).
float32r = _dt.float32


class fp32:  # noqa: N801 - NKI's spelling
    """FP32 constants (legacy ``nl.fp32``): ``min`` is the most negative finite fp32."""

    min = -3.4028234663852886e38
    max = 3.4028234663852886e38


class tile_size:  # noqa: N801 - NKI's spelling
    """Tile limits (NKI's ``nl.tile_size``), as NKI documents them for a NeuronCore
    with 128 partitions of 192 KiB SBUF and 16 KiB PSUM (8 banks of 2 KiB)."""

    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 8
    sbuf_fmax_bytes = 192 * 1024
    sbuf_fmax = sbuf_fmax_bytes // 4
    sbuf_size_bytes = 128 * sbuf_fmax_bytes
    total_available_sbuf_size = sbuf_fmax_bytes
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1


# -- creation ---------------------------------------------------------------

def _buffer(buffer: Any) -> Memory:
    if isinstance(buffer, Memory):
        return buffer
    raise _e.tracer().fail(f"buffer {buffer!r} is not one of nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm")


def ndarray(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str | None = None) -> Any:
    """An uninitialised tensor: a tile in SBUF/PSUM, or an HBM tensor (a kernel output
    when the kernel returns it). A tile shape with dimensions before ``nl.par_dim(n)``
    (legacy block dimensions) gives a :class:`~trnsim.nki.tiles.BlockedTile`."""
    memory = _buffer(buffer)
    shape = tuple(shape)
    k = next((i for i, s_ in enumerate(shape) if isinstance(s_, ParDim)), 0)
    if k and memory is not Memory.HBM:
        physical = (shape[k],) + shape[:k] + shape[k + 1:]
        return BlockedTile(_e.new_tensor(physical, dtype, memory, name), k, tuple(int(s_) for s_ in shape))
    return _e.new_tensor(shape, dtype, memory, name)


def full(shape: Sequence[int], fill_value: float, dtype: Any, buffer: Any = sbuf, name: str | None = None) -> NkiTensor:
    """A tile filled with ``fill_value`` (vector engine memset)."""
    t = ndarray(shape, dtype, buffer, name)
    _e.emit(Memset(t.view, float(fill_value), engine=Engine.VECTOR))
    return t


def zeros(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str | None = None) -> NkiTensor:
    """A zero tile. In PSUM the zeroing is left to the first matmul into it (it starts
    an accumulation group), as the compiler does."""
    if _buffer(buffer) is Memory.PSUM:
        t = ndarray(shape, dtype, buffer, name)
        _e.tracer().zeros[id(t.tensor)] = t.tensor
        return t
    return full(shape, 0.0, dtype, buffer, name)


def ones(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str | None = None) -> NkiTensor:
    return full(shape, 1.0, dtype, buffer, name)


def zeros_like(a: NkiTensor, dtype: Any = None, buffer: Any = None) -> NkiTensor:
    return zeros(a.shape, dtype or a.dtype, buffer or a.buffer)


def empty_like(a: NkiTensor, dtype: Any = None, buffer: Any = None) -> NkiTensor:
    return ndarray(a.shape, dtype or a.dtype, buffer or a.buffer)


# -- memory -----------------------------------------------------------------

def load(src: NkiTensor, mask: Mask | None = None, dtype: Any = None) -> NkiTensor:
    """DMA ``src`` (HBM) into a fresh SBUF tile; ``dtype`` converts after the load."""
    tr = _e.tracer()
    if not isinstance(src, NkiTensor):
        raise tr.fail(f"nl.load needs an HBM tensor slice, got {src!r}")
    _e.check_overrun(src, mask, "nl.load")
    asked = tuple(s + o for s, o in zip(src.shape, src.overrun))
    shape = asked if len(asked) > 1 else (asked[0], 1)
    tile = _e.new_tensor(shape, src.dtype, Memory.SBUF, bases=src.bases if len(src.shape) > 1 else None)
    dst_v, src_v = _e.clip(mask, tile, src)
    if dst_v.size:  # a mask may leave nothing to move
        tr.dma(dst_v, src_v)
    if dtype is not None and _e.dtype_of(dtype) is not src.dtype:
        return copy(tile, dtype=dtype)
    return tile


def store(dst: NkiTensor, value: Any, mask: Mask | None = None) -> None:
    """DMA ``value`` (an SBUF tile; a PSUM tile is copied to SBUF first) into ``dst`` (HBM)."""
    tr = _e.tracer()
    if not isinstance(dst, NkiTensor) or dst.buffer is not Memory.HBM:
        raise tr.fail(f"nl.store needs an HBM tensor (or slice of one) as dst, got {dst!r}")
    if isinstance(value, Real):
        shape = dst.shape if len(dst.shape) > 1 else (dst.shape[0], 1)
        value = full(shape, float(value), dst.dtype)
    value = _e.readable(value, "nl.store value")
    _e.check_overrun(dst, mask, "nl.store")
    given = value
    if value.buffer is Memory.PSUM or value.dtype is not dst.dtype:
        value = copy(value, dtype=dst.dtype)
    dst_v, src_v = _e.clip(mask, dst, value)
    if src_v.size != dst_v.size:
        raise tr.fail(_store_mismatch(dst, given, src_v.size, dst_v.size))
    if dst_v.size:
        tr.dma(dst_v, src_v)


def _store_mismatch(dst: NkiTensor, value: NkiTensor, value_size: int, dst_size: int) -> str:
    """Why ``nl.store(dst, value)`` cannot be, and the two shapes that would fit."""
    fix = f"store a {list(dst.shape)} value into {dst.name}"
    if len(value.shape) == len(dst.shape) and builtins.all(v <= d for v, d in zip(value.shape, dst.shape)):
        fix += f", or store {value.name} into a slice of its shape, as in {dst.name}[{', '.join(f'0:{v}' for v in value.shape)}]"
    return (f"nl.store of {value.name}{list(value.shape)} ({value_size} elements) into {dst.name}{list(dst.shape)} "
            f"({dst_size} elements): the sizes differ; {fix}")


def copy(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """A copy of ``x`` in a fresh SBUF tile, converted to ``dtype``."""
    x = _e.readable(x)
    out = _e.like(x, dtype)
    dst, src = _e.clip(mask, out, x)
    _e.copy_to(dst, src)
    return out


def copy_into(target: NkiTensor, value: Any) -> None:
    """``tile[...] = value``: a copy (or fill, for a number) into part of a tile."""
    if isinstance(value, Real):
        _e.emit(Memset(target.view, float(value), engine=Engine.VECTOR))
        return
    value = _e.readable(value)
    if value.view.size != target.view.size:
        raise _e.tracer().fail(f"assigning {list(value.shape)} elements to {list(target.shape)}: sizes differ")
    _e.copy_to(target.view, value.view)


# -- matmul and transpose ---------------------------------------------------

class MatmulResult:
    """``nl.matmul``'s result before it lands: ``+=`` accumulates it into a PSUM tile,
    any other use puts it in a fresh PSUM tile."""

    def __init__(self, stationary: View, moving: View, keep: tuple[NkiTensor, ...] = ()) -> None:
        self.stationary = stationary
        self.moving = moving
        self._keep = keep  # the operand tiles stay placed until the result lands
        self.shape = (stationary.free_size, moving.free_size)
        self.dtype = _dt.float32
        self._tile: NkiTensor | None = None

    def write_into(self, dst: NkiTensor, accumulate: bool) -> None:
        tr = _e.tracer()
        if dst.buffer is not Memory.PSUM:
            raise tr.fail(f"matmul results accumulate in PSUM; {dst.name} is in {dst.buffer.value.upper()} "
                          "(PSUM accumulation group misuse): make the accumulator with buffer=nl.psum")
        if dst.view.partitions != self.shape[0] or dst.view.free_size != self.shape[1]:
            raise tr.fail(f"matmul result is {list(self.shape)} but the accumulator {dst.name} slice is "
                          f"[{dst.view.partitions}, {dst.view.free_size}] (PSUM accumulation group misuse)")
        if id(dst.tensor) in tr.zeros:
            # a zero accumulator: the first matmul over all of it starts the group; a
            # matmul into part of it adds to the zeros the tracer writes first
            accumulate = not tr.covers_whole(dst.view)
        elif accumulate and not tr.hazards.written(dst.view):
            accumulate = False
        _e.matmul(dst.view, self.stationary, self.moving, accumulate)

    def accumulate_into(self, dst: NkiTensor) -> None:
        self.write_into(dst, accumulate=True)

    def materialize(self) -> NkiTensor:
        if self._tile is None:
            self._tile = _e.new_tensor(self.shape, _dt.float32, Memory.PSUM)
            self.write_into(self._tile, accumulate=False)
        return self._tile


def _stationary_of(x: NkiTensor, transpose_x: bool) -> NkiTensor:
    """``x`` [K, M] as is, or ``x`` [M, K] through the PE array and back into SBUF."""
    if transpose_x:
        return x
    return copy(transpose(x), dtype=x.dtype)


def _restricted(t: Any, mask: Mask | None) -> Any:
    """Tile ``t`` restricted to where ``mask`` holds (by ``t``'s own index bases); other
    values pass through."""
    if mask is None or not isinstance(t, NkiTensor):
        return t
    return NkiTensor(t._placement, _clip_result(mask, t), t.bases)


def _masked(fn: Any) -> Any:
    """``fn`` with ``mask=``: it runs on the tiles restricted to the mask, and its result
    lands in the masked part of a full-size tile (elements outside are not written)."""
    def wrapper(*args: Any, mask: Mask | None = None, **kwargs: Any) -> NkiTensor:
        if mask is None:
            return fn(*args, **kwargs)
        args = tuple(_e.readable(a) if isinstance(a, MatmulResult) else a for a in args)
        part = fn(*(_restricted(a, mask) for a in args), **kwargs)
        ref = next(a for a in args if isinstance(a, NkiTensor))
        out = _e.like(ref, part.dtype)
        _e.copy_to(_clip_result(mask, out), part.view)
        return out

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def matmul(x: Any, y: Any, transpose_x: bool = False, mask: Mask | None = None) -> MatmulResult:
    """``x @ y`` on the tensor engine (fp32 in PSUM). With ``transpose_x=True``, ``x`` is
    already [K, M] (contraction on partitions) and the result is ``x.T @ y``; otherwise
    ``x`` [M, K] goes through the PE array's transpose first."""
    x = _restricted(_e.readable(x, "matmul x"), mask)
    y = _restricted(_e.readable(y, "matmul y"), mask)
    st_tile = _stationary_of(x, transpose_x)
    st = st_tile.view
    tr = _e.tracer()
    if st.partitions != y.view.partitions:
        raise tr.fail(f"matmul contraction sizes differ: x gives K={st.partitions}, y has K={y.view.partitions} partitions")
    if st.free_size > tile_size.gemm_stationary_fmax:
        raise tr.fail(f"matmul M={st.free_size} exceeds nl.tile_size.gemm_stationary_fmax ({tile_size.gemm_stationary_fmax}); tile M")
    if y.view.free_size > tile_size.gemm_moving_fmax:
        raise tr.fail(f"moving free size {y.view.free_size} exceeds nl.tile_size.gemm_moving_fmax ({tile_size.gemm_moving_fmax}); tile N into pieces of 512")
    return MatmulResult(st, _e.flat2d(y.view), keep=(st_tile, y))


def transpose(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """[P, F] -> [F, P] through the PE array (result in PSUM)."""
    x = _restricted(_e.readable(x, "transpose input"), mask)
    out = _e.new_tensor((x.view.free_size, x.view.partitions), dtype or x.dtype, Memory.PSUM)
    _e.transpose(out.view, _e.flat2d(x.view))
    return out


# -- elementwise ------------------------------------------------------------

def _unary(func: ActivationFunc):
    def op(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
        x = _e.readable(x)
        out = _e.like(x, dtype if dtype is not None else (x.dtype if x.buffer is Memory.SBUF else _dt.float32))
        dst, src = _e.clip(mask, out, x)
        _e.activation(dst, src, func)
        return out

    op.__name__ = func.value
    op.__doc__ = f"Elementwise {func.value} on the scalar engine, into a fresh SBUF tile."
    return op


exp = _unary(ActivationFunc.EXP)
log = _unary(ActivationFunc.LOG)
sqrt = _unary(ActivationFunc.SQRT)
rsqrt = _unary(ActivationFunc.RSQRT)
tanh = _unary(ActivationFunc.TANH)
sigmoid = _unary(ActivationFunc.SIGMOID)
relu = _unary(ActivationFunc.RELU)
gelu = _unary(ActivationFunc.GELU)
gelu_apprx_tanh = _unary(ActivationFunc.GELU_TANH)
silu = _unary(ActivationFunc.SILU)
square = _unary(ActivationFunc.SQUARE)
abs = _unary(ActivationFunc.ABS)  # noqa: A001 - NKI's name
sin = _unary(ActivationFunc.SIN)
cos = _unary(ActivationFunc.COS)
erf = _unary(ActivationFunc.ERF)
sign = _unary(ActivationFunc.SIGN)
reciprocal = _unary(ActivationFunc.RECIPROCAL)
softplus = _unary(ActivationFunc.SOFTPLUS)
gelu_dx = _unary(ActivationFunc.GELU_DX)
silu_dx = _unary(ActivationFunc.SILU_DX)


def negative(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``-x`` (vector engine)."""
    return multiply(x, -1.0, dtype=dtype, mask=mask)


def _scalar_operand(v: Any, out: NkiTensor) -> Any:
    if isinstance(v, Real):
        return float(v)
    return v.view


def _binary(alu: AluOp, name: str):
    def op(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None, out: NkiTensor | None = None) -> NkiTensor:
        tr = _e.tracer()
        xs, ys = isinstance(x, Real), isinstance(y, Real)
        if xs and ys:
            raise tr.fail(f"nl.{name} needs at least one tile")
        a = None if xs else _e.readable(x)
        b = None if ys else _e.readable(y)
        if a is not None and b is not None:
            a, b = _broadcast_pair(a, b, name)
        # the result takes the shape of the larger operand (partitions first, then free size)
        ref = a if a is not None and (b is None or (a.view.partitions, a.view.free_size) >= (b.view.partitions, b.view.free_size)) else b
        default = ref.dtype if ref.buffer is Memory.SBUF else _dt.float32
        result = out if out is not None else _e.like(ref, dtype if dtype is not None else default)
        if a is not None and b is not None and a.view.free_size == b.view.free_size and a.view.partitions == b.view.partitions:
            dst, va, vb = _e.clip(mask, result, a, b)
            _e.tensor_tensor(dst, va, vb, alu)
            return result
        # one side is a number or one value per partition: tensor_scalar
        tile, other, reverse = (a, b if b is not None else y, False) if ref is a else (b, a if a is not None else x, True)
        if isinstance(other, NkiTensor):
            if other.view.free_size != 1 or other.view.partitions != tile.view.partitions:
                if other.view.partitions == 1 and other.view.free_size == tile.view.free_size:
                    other = broadcast_to(other, tile.shape)
                    dst, va, vb = _e.clip(mask, result, tile, other)
                    _e.tensor_tensor(dst, vb, va, alu) if reverse else _e.tensor_tensor(dst, va, vb, alu)
                    return result
                raise tr.fail(f"nl.{name} of {list(tile.shape)} and {list(other.shape)}: shapes must match, or one must be "
                              f"[P, 1] (one value per partition) or [1, F] (broadcast over partitions)")
        dst, src = _e.clip(mask, result, tile)
        _e.tensor_scalar(dst, src, alu, _scalar_operand(other, tile), reverse0=reverse)
        return result

    op.__name__ = name
    op.__doc__ = f"Elementwise {name} of two tiles, or a tile and a number or a [P, 1] tile (vector engine)."
    return op


def _broadcast_pair(a: NkiTensor, b: NkiTensor, name: str) -> tuple[NkiTensor, NkiTensor]:
    """``a`` and ``b`` brought to one [P, F] size by numpy's rules on (partitions, free
    size), except that a [P, 1] beside a full [P, F] stays a per-partition scalar."""
    pa, fa = a.view.partitions, a.view.free_size
    pb, fb = b.view.partitions, b.view.free_size
    if (pa, fa) == (pb, fb):
        return a, b
    p, f = builtins.max(pa, pb), builtins.max(fa, fb)

    def fit(t: NkiTensor, pt: int, ft: int, other_full: bool) -> NkiTensor:
        if (pt, ft) == (p, f) or (pt == p and ft == 1 and other_full):
            return t
        if pt in (1, p) and ft in (1, f):
            return broadcast_to(t, (p, f))
        raise _e.tracer().fail(f"nl.{name} of {list(a.shape)} and {list(b.shape)}: the shapes do not broadcast; "
                               "each operand's partitions and free size must match the other's or be 1")

    return fit(a, pa, fa, (pb, fb) == (p, f)), fit(b, pb, fb, (pa, fa) == (p, f))


add = _binary(AluOp.ADD, "add")
subtract = _binary(AluOp.SUBTRACT, "subtract")
multiply = _binary(AluOp.MULTIPLY, "multiply")
divide = _binary(AluOp.DIVIDE, "divide")
maximum = _binary(AluOp.MAXIMUM, "maximum")
minimum = _binary(AluOp.MINIMUM, "minimum")
power = _binary(AluOp.POW, "power")
equal = _binary(AluOp.IS_EQUAL, "equal")
not_equal = _binary(AluOp.NOT_EQUAL, "not_equal")
greater = _binary(AluOp.IS_GT, "greater")
greater_equal = _binary(AluOp.IS_GE, "greater_equal")
less = _binary(AluOp.IS_LT, "less")
less_equal = _binary(AluOp.IS_LE, "less_equal")


def _bitwise(alu: AluOp, name: str):
    """``_binary(alu, name)`` for integer tiles only, as NKI requires of its bitwise and shift ops."""
    base = _binary(alu, name)

    def op(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None, out: NkiTensor | None = None) -> NkiTensor:
        for v in (x, y):
            if isinstance(v, NkiTensor) and v.dtype.is_float:
                raise _e.tracer().fail(f"nl.{name} of a {v.dtype.name} tile: NKI's bitwise and shift operations take "
                                       "integer tiles only; convert it first (nl.copy(x, dtype=nl.int32))")
            if isinstance(v, Real) and v != int(v):
                raise _e.tracer().fail(f"nl.{name} of the number {v!r}: bitwise and shift operands must be integers")
        return base(x, y, dtype=dtype, mask=mask, out=out)

    op.__name__ = name
    op.__doc__ = (f"Elementwise {name} of integer tiles, or an integer tile and an integer or a [P, 1] tile "
                  "(vector engine); float tiles are refused.")
    return op


bitwise_and = _bitwise(AluOp.BITWISE_AND, "bitwise_and")
bitwise_or = _bitwise(AluOp.BITWISE_OR, "bitwise_or")
bitwise_xor = _bitwise(AluOp.BITWISE_XOR, "bitwise_xor")
left_shift = _bitwise(AluOp.LEFT_SHIFT, "left_shift")
right_shift = _bitwise(AluOp.RIGHT_SHIFT, "right_shift")


def invert(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """Bitwise NOT of an integer tile: XOR with all ones of its dtype (vector engine)."""
    if isinstance(x, NkiTensor) and not x.dtype.is_float:
        low, high = _dt.int_range(x.dtype)
        ones = -1 if low < 0 else high
    else:
        ones = -1
    return bitwise_xor(x, ones, dtype=dtype, mask=mask)


def broadcast_to(x: Any, shape: Sequence[int]) -> NkiTensor:
    """Copy a [1, F] tile to every partition of a [P, F] tile (one DMA that reads the row
    once per partition), or a [P, 1] tile along the free dimension (vector engine)."""
    x = _e.readable(x)
    tr = _e.tracer()
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    if x.view.partitions == 1 and x.view.free_size == 1 and shape[0] > 1 and math.prod(shape[1:]) > 1:
        x = broadcast_to(x, (shape[0], 1))  # over partitions first, then along the free dimension
    out = _e.new_tensor(shape, x.dtype, Memory.SBUF)
    if x.view.partitions == 1 and x.view.free_size == out.view.free_size:
        row = _e.flat2d(x.view)
        # one DMA rather than one per row: rows 1, 2, ... start on misaligned partitions
        src = View(row.tensor, row.offset, (row.dims[0], (0, shape[0]), row.dims[1]))
        tr.dma(_e.flat2d(out.view), src)
        return out
    if x.view.free_size == 1 and x.view.partitions == shape[0]:
        zero = full(shape, 0.0, x.dtype)
        _e.tensor_scalar(out.view, zero.view, AluOp.ADD, x.view)
        return out
    raise tr.fail(f"nl.broadcast_to cannot broadcast {list(x.shape)} to {list(shape)}; broadcast [1, F] over partitions or [P, 1] over the free dimension")


@_masked
def where(condition: Any, x: Any, y: Any, dtype: Any = None) -> NkiTensor:
    """``x`` where ``condition`` is non-zero, else ``y`` (a tile or a number)."""
    cond = _e.readable(condition, "nl.where condition")
    xt = _e.readable(x, "nl.where x") if not isinstance(x, Real) else full(cond.shape, x, dtype or _dt.float32)
    out = _e.like(xt, dtype)
    other = float(y) if isinstance(y, Real) else _e.readable(y, "nl.where y").view
    _e.emit(Select(out.view, cond.view, xt.view, other, engine=Engine.VECTOR))
    return out


# -- reductions -------------------------------------------------------------

def _axes(x: NkiTensor, axis: Any) -> int:
    """How many trailing free axes ``axis`` names; reductions run along free axes."""
    nd = len(x.shape)
    axes = sorted({a % nd for a in ((axis,) if isinstance(axis, int) else tuple(axis))})
    tr = _e.tracer()
    if 0 in axes:
        raise tr.fail(f"reductions run along free axes; axis 0 of {list(x.shape)} is the partition axis (nl.transpose to reduce across partitions)")
    if axes != list(range(nd - len(axes), nd)):
        raise tr.fail(f"reduce axes {axes} of {list(x.shape)} must be the trailing free axes")
    return len(axes)


def _reduce(op: ReduceOp, name: str):
    def fn(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, mask: Mask | None = None) -> NkiTensor:
        x = _e.readable(x)
        n = _axes(x, axis)
        kept = x.shape[: len(x.shape) - n]
        shape = kept + (1,) * n if keepdims else (kept if len(kept) > 1 else (kept[0], 1))
        kept_bases = (x.bases[: len(x.shape) - n] + (None,) * len(shape))[: len(shape)]
        out = _e.new_tensor(shape, dtype or (x.dtype if x.buffer is Memory.SBUF else _dt.float32), bases=kept_bases)
        src = _e.clip(mask, x)[0]
        _e.reduce(_clip_result(mask, out), src, op, n)
        return out

    fn.__name__ = name
    fn.__doc__ = f"{name} along trailing free axes (vector engine)."
    return fn


def _clip_result(mask: Mask | None, out: NkiTensor) -> View:
    """The part of a reduction's result that a mask keeps: the rows (or kept free
    indices) the mask leaves out are not written, as on the chip."""
    if mask is None:
        return out.view
    ranges = mask.ranges()
    if not any(b in ranges for b in out.bases if b is not None):
        return out.view
    return out.view[tuple(slice(*ranges[b]) if b in ranges else slice(None) for b in out.bases)]


sum = _reduce(ReduceOp.ADD, "sum")  # noqa: A001 - NKI's name
max = _reduce(ReduceOp.MAX, "max")  # noqa: A001
min = _reduce(ReduceOp.MIN, "min")  # noqa: A001


def mean(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, mask: Mask | None = None) -> NkiTensor:
    """Mean along trailing free axes."""
    x = _e.readable(x)
    n = math.prod(x.shape[len(x.shape) - _axes(x, axis):])
    total = sum(x, axis, dtype=_dt.float32, keepdims=keepdims, mask=mask)
    return multiply(total, 1.0 / n, dtype=dtype or _dt.float32)


def var(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, mask: Mask | None = None) -> NkiTensor:
    """Population variance along trailing free axes: mean((x - mean(x))^2)."""
    x = _restricted(_e.readable(x), mask)
    m = mean(x, axis, keepdims=True)
    centred = subtract(x, _per_partition(m), dtype=_dt.float32)
    result = mean(square(centred), axis, dtype=dtype, keepdims=keepdims)
    if mask is None:
        return result
    out = _e.new_tensor(result.shape, result.dtype, bases=(x.bases + (None,) * len(result.shape))[: len(result.shape)])
    _e.copy_to(_clip_result(mask, out), result.view)
    return out


def _per_partition(t: NkiTensor) -> NkiTensor:
    """A [P, 1, 1...] tile seen as [P, 1]."""
    return t if len(t.shape) == 2 else NkiTensor(t._placement, View(t.view.tensor, t.view.offset, (t.view.dims[0], (1, 1))))


@_masked
def softmax(x: Any, axis: Any = -1, dtype: Any = None) -> NkiTensor:
    """``exp(x - max) / sum(exp(x - max))`` along the last free axis: a max reduction
    (vector), one exp with the negated max as bias and a running sum (scalar), a
    reciprocal and a scale."""
    x = _e.readable(x)
    _axes(x, axis)
    row_max = max(x, axis)
    neg_max = multiply(row_max, -1.0, dtype=_dt.float32)
    e = _e.like(x, _dt.float32)
    total = _e.new_tensor((x.view.partitions, 1), _dt.float32)
    _e.activation(e.view, x.view, ActivationFunc.EXP, bias=neg_max.view, reduce_op=ReduceOp.ADD, reduce_dst=total.view)
    inv = reciprocal(total)
    return multiply(e, inv, dtype=dtype or x.dtype)


@_masked
def rms_norm(x: Any, w: Any, axis: Any = -1, n: int | None = None, epsilon: float = 1e-6, dtype: Any = None) -> NkiTensor:
    """``x / sqrt(mean(x^2) + epsilon) * w`` along the last free axis; ``w`` is a [1, F]
    tile (broadcast over partitions) or a tile shaped like ``x``."""
    x = _e.readable(x)
    _axes(x, axis)
    count = n if n is not None else x.view.free_size
    sq = _e.like(x, _dt.float32)
    ss = _e.new_tensor((x.view.partitions, 1), _dt.float32)
    _e.activation(sq.view, x.view, ActivationFunc.SQUARE, reduce_op=ReduceOp.ADD, reduce_dst=ss.view)
    rstd = _e.new_tensor((x.view.partitions, 1), _dt.float32)
    _e.tensor_scalar(rstd.view, ss.view, AluOp.MULTIPLY, 1.0 / count, AluOp.ADD, float(epsilon))
    _e.activation(rstd.view, rstd.view, ActivationFunc.RSQRT)
    normed = multiply(x, rstd, dtype=_dt.float32)
    w = _e.readable(w, "rms_norm weight")
    return multiply(normed, w, dtype=dtype or x.dtype)


# -- loops and launch grid --------------------------------------------------

def affine_range(*args: int) -> Iterator[int]:
    """Iterations with no loop-carried dependency; the schedule may overlap them."""
    return iter(range(*args))


def static_range(*args: int) -> Iterator[int]:
    """A loop unrolled at trace time (every loop is, in trnsim)."""
    return iter(range(*args))


def sequential_range(*args: int) -> Iterator[int]:
    """Iterations that run one after another: each starts after the last one ended."""
    tr = _e.tracer()
    for i in range(*args):
        if i != range(*args)[0]:
            tr.barrier()
        yield i


def arange(*args: int) -> Affine:
    """An index range for ``x[i_p, i_f]`` indexing and masks (``nl.arange(128)[:, None]``)."""
    r = range(*args)
    if r.step != 1:
        return Affine.base(len(r)) * r.step + r.start
    return Affine.base(len(r)) + r.start


def program_id(axis: int = 0) -> int:
    """This instance's index along ``axis`` of the launch grid."""
    tr = _e.tracer()
    if not 0 <= axis < builtins.max(len(tr.grid), 1):
        raise tr.fail(f"program_id({axis}): the launch grid has {len(tr.grid)} axes")
    return tr.program_ids[axis] if tr.grid else 0


def num_programs(axis: int = 0) -> int:
    """Size of the launch grid along ``axis``."""
    tr = _e.tracer()
    return tr.grid[axis] if tr.grid else 1


def program_ndim() -> int:
    return len(_e.tracer().grid)


def fori_loop(lower: int, upper: int, body_fun: Any, step: int = 1) -> None:
    """``body_fun(i)`` for ``i`` in ``range(lower, upper, step)``, one iteration after
    another (the bounds must be known when the kernel is traced)."""
    for i in sequential_range(int(lower), int(upper), int(step)):
        body_fun(i)


def while_loop(init: Any, body_fun: Any) -> None:
    """``r = init; while r != 0: r = body_fun(r)``, traced iteration by iteration, so the
    condition must be known when the kernel is traced."""
    r = init
    while int(r) != 0:
        r = body_fun(r)
        _e.tracer().barrier()


def dynamic_range(start: int, stop: int | None = None, step: int = 1) -> Iterator[int]:
    """A loop with bounds the device reads at run time; trnsim traces it as
    :func:`sequential_range` over the bounds known when the kernel is traced."""
    return sequential_range(*((start,) if stop is None else (start, stop, step)))


# -- launch grid: logical cores and SPMD dimensions ---------------------------

class nc(int):  # noqa: N801 - NKI's spelling
    """``nl.nc(2)``: a launch-grid axis spread over 2 logical NeuronCores. trnsim runs
    the instances on its one simulated core in turn, so it is the plain size."""


def spmd_dim(*sizes: int) -> int:
    """``kernel[nl.spmd_dim(nl.nc(2), 4)]``: one grid axis of ``2 * 4`` instances."""
    return math.prod(int(n) for n in sizes)


def par_dim(size: int) -> int:
    """Marks the partition dimension of a tile shape: ``(nl.par_dim(128), 512)``, or
    ``(4, nl.par_dim(128), 512)`` for four [128, 512] tiles (legacy block dimensions)."""
    return ParDim(int(size))


class NKIObject:
    """Base class for kernel configuration objects: keyword arguments become attributes."""

    def __init__(self, **kwargs: Any) -> None:
        for key, value in kwargs.items():
            setattr(self, key, value)


def static_cast(value: Any, dtype: Any) -> Any:
    """``value`` converted to ``dtype``: a tile is copied (vector engine); a number or
    array known at trace time is converted on the host with numpy's ``astype``."""
    if isinstance(value, (NkiTensor, MatmulResult)):
        return copy(value, dtype=dtype)
    import numpy as np

    return np.asarray(value).astype(_e.dtype_of(dtype).dtype)


def device_print(print_prefix: str, tensor: Any, mask: Mask | None = None) -> None:
    """Print ``print_prefix`` and a description of ``tensor`` when the kernel is traced.
    trnsim knows values only after simulating the whole kernel, so it prints the
    tile's name, shape, dtype and memory rather than its values."""
    print(f"{print_prefix} {tensor!r}")


def no_reorder() -> Any:
    """``with nl.no_reorder():`` keeps the block in program order; trnsim's queues keep
    program order per engine already, so the block runs as written."""
    from trnsim.nki.compiler import no_reorder as block

    return block()


def is_hbm(buffer: Any) -> bool:
    """Whether ``buffer`` is HBM (``nl.hbm``, ``nl.shared_hbm``, ``nl.private_hbm``)."""
    return buffer is Memory.HBM


def is_sbuf(buffer: Any) -> bool:
    return buffer is Memory.SBUF


def is_psum(buffer: Any) -> bool:
    return buffer is Memory.PSUM


def is_on_chip(buffer: Any) -> bool:
    return buffer in (Memory.SBUF, Memory.PSUM)


# -- ALU operators used as ``op=`` of nki.isa calls ---------------------------

bypass = AluOp.BYPASS


def expand_dims(x: NkiTensor, axis: int) -> NkiTensor:
    """A view of ``x`` with a new axis of size 1 at ``axis`` (not the partition axis)."""
    shape = list(x.shape)
    axis = axis if axis >= 0 else len(shape) + 1 + axis
    if axis == 0 and x.tensor.on_chip:
        raise _e.tracer().fail("nl.expand_dims cannot add an axis before the partition axis of a tile")
    shape.insert(axis, 1)
    return x.reshape(shape)


def load_transpose2d(src: NkiTensor, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """Load an HBM [F, P] tensor as an SBUF [P, F] tile: a DMA that walks ``src`` transposed."""
    tr = _e.tracer()
    if not isinstance(src, NkiTensor) or src.buffer is not Memory.HBM or len(src.shape) != 2:
        raise tr.fail(f"nl.load_transpose2d needs a 2-D HBM tensor, got {src!r}")
    v = src.view
    tile = _e.new_tensor((v.shape[1], v.shape[0]), src.dtype, Memory.SBUF, bases=(src.bases[1], src.bases[0]))
    walked = NkiTensor(src._placement, View(v.tensor, v.offset, (v.dims[1], v.dims[0])), tile.bases)
    tr.dma(_clip_result(mask, tile), _clip_result(mask, walked))
    if dtype is not None and _e.dtype_of(dtype) is not src.dtype:
        return copy(tile, dtype=dtype)
    return tile


def shared_constant(constant: Any, dtype: Any = None) -> NkiTensor:
    """An HBM tensor holding ``constant`` (an array, or the path of a ``.npy`` file),
    given to the kernel as an input; float64 data is stored as float32."""
    import numpy as np

    tr = _e.tracer()
    data = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    if data.dtype == np.float64:
        data = data.astype(np.float32)
    chip_dtype = _e.dtype_of(dtype if dtype is not None else data.dtype)
    shape = data.shape if data.ndim else (1,)
    t = tr.program.hbm(shape, chip_dtype, tr.fresh_name("constant"), kind="input")
    tr.hazards.register(t)
    tr.constants[t.name] = data.reshape(shape)
    return NkiTensor(_Placement(tr, t), t.view())


def shared_identity_matrix(n: int, dtype: Any = _dt.uint8, dst: NkiTensor | None = None) -> NkiTensor:
    """An [n, n] identity matrix in SBUF (``nisa.iota`` of ``p - f`` compared with 0)."""
    from trnsim.nki import isa as nisa

    i_p = arange(n)[:, None]
    i_f = arange(n)[None, :]
    diff = nisa.iota(i_p - i_f, dtype=_dt.float32)
    out = equal(diff, 0.0, dtype=dtype)
    if dst is not None:
        copy_into(dst, out)
        return dst
    return out


# -- documented names trnsim refuses ------------------------------------------

def _refuse(name: str, reason: str) -> Any:
    from trnsim.nki.refused import Refused

    return Refused(f"nki.language.{name}", reason)


atomic_rmw = _refuse("atomic_rmw", "atomic HBM updates with indirect indices are not modelled yet")
all_reduce = _refuse("all_reduce", "a trnsim kernel runs on one simulated NeuronCore; there are no other ranks")


_COMPOSED = "built from {} simulated instructions, so it costs more than NKI's single instruction"
_F32_HOST = "numpy has no {0}: np.dtype(nl.{0}) is float32 on the host; values are rounded to {0} when a kernel reads them"
_PACKED = "held and moved as bit patterns (numpy sees {}); no simulated engine computes with it yet"

#: Documented names that trnsim implements with a difference (read by ``trnsim.nki.apitable``).
DIFFERENCES: dict[str, str] = {
    "device_print": "prints the tile's name, shape, dtype and memory at trace time, not its values",
    "nc": "a plain grid size: trnsim runs every instance on one simulated core, one after another",
    "spmd_dim": "the product of its sizes as one grid axis; instances run on one simulated core in turn",
    "fori_loop": "the bounds must be known when the kernel is traced (no register-valued bounds)",
    "while_loop": "the condition must be known when the kernel is traced (no register-valued conditions)",
    "dynamic_range": "traced as nl.sequential_range: the bounds must be known when the kernel is traced",
    "hbm": "nl.hbm, nl.shared_hbm and nl.private_hbm are one memory in trnsim",
    "private_hbm": "nl.hbm, nl.shared_hbm and nl.private_hbm are one memory in trnsim",
    "NkiTensor": "indexing and the view methods work; ``t.view`` is trnsim's access pattern, so ``t.view(dtype)`` "
                 "is not available; indirect addressing (a tile as index, select with a tile, vector_select, "
                 "indirect) and rearrange are refused with the reason",
    "tfloat32": "computed as float32",
    "float32r": "computed as float32",
    "float8_e4m3": "the finite-only e4m3 format (largest value 448), the same as float8_e4m3fn",
    "bfloat16": _F32_HOST.format("bfloat16"),
    "float8_e5m2": _F32_HOST.format("float8_e5m2"),
    "float8_e4m3fn": _F32_HOST.format("float8_e4m3fn"),
    "float8_e8m0fnu": _PACKED.format("uint8"),
    "float8_e5m2_x4": _PACKED.format("uint32"),
    "float8_e4m3fn_x4": _PACKED.format("uint32"),
    "float4_e2m1fn_x4": _PACKED.format("uint16"),
    "logical_and": _COMPOSED.format(3), "logical_or": _COMPOSED.format(3), "logical_xor": _COMPOSED.format(3),
    "logical_not": _COMPOSED.format(1), "abs_max": _COMPOSED.format(3), "abs_min": _COMPOSED.format(3),
    "tan": _COMPOSED.format(3), "mish": _COMPOSED.format(3), "gelu_apprx_sigmoid": _COMPOSED.format(3),
    "all": _COMPOSED.format(2), "erf_dx": _COMPOSED.format(4), "gelu_apprx_sigmoid_dx": _COMPOSED.format(7),
    "arctan": _COMPOSED.format(30) + "; a series accurate to about 1e-6",
    "prod": _COMPOSED.format("about 15") + "; exp(sum(log|x|)), so about 1e-6 relative error",
    **{n: _COMPOSED.format("3 to 10") + "; exact for |x| below 2**31 (rounding goes through int32)"
       for n in ("floor", "ceil", "trunc", "mod", "fmod")},
    "rand": "values from numpy's generator drawn at trace time, loaded with one DMA; not the chip's generator",
    "random_seed": "a number seeds numpy's generator; a seed tile (its value unknown while tracing) restarts it "
                   "from one fixed state",
    "dropout": "its random values come from nl.rand (numpy's generator, drawn at trace time)",
    "loop_reduce": "the running result is kept per call line and restarts from zeros when every loop index is 0",
    "static_cast": "a tile is copied on the vector engine; a number or array is converted on the host",
    "prelu": "nisa.activation's op (with relu_param=) and a function prelu(x, alpha): three vector-engine "
             "instructions (after the scalar engine's scale and bias), so it costs more than NKI's one",
    "gather_flattened": "axis=0 and no mask only; one GpSimd gather (nisa.nc_n_gather)",
}


# Ops built from the ones above, and random numbers, live in their own modules; they
# are nki.language names, so they are imported here (after everything they use).
from trnsim.nki.composed import (  # noqa: E402
    abs_max, abs_min, all, arctan, ceil, erf_dx, floor, fmod, gelu_apprx_sigmoid, gelu_apprx_sigmoid_dx,
    gather_flattened, logical_and, logical_not, logical_or, logical_xor, loop_reduce, mish, mod, prelu, prod, tan,
    trunc,
)
from trnsim.nki.rng import dropout, rand, random_seed  # noqa: E402
