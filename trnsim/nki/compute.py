"""Math on tiles of ``nki.language``: matmul and transpose on the tensor engine, and the
elementwise operations of the scalar (activations) and vector engines.

``nl.matmul`` gives a PSUM result that ``+=`` accumulates (``acc += nl.matmul(a, b,
transpose_x=True)``); every other call makes a fresh tile for its result.
"""

from __future__ import annotations

import builtins
import math
from numbers import Real
from typing import Any, Sequence

import numpy as np

from trnsim import dtypes as _dt
from trnsim.isa import ActivationFunc, AluOp, Engine, Memory, Select, View, pe_rows
from trnsim.nki import emit as _e
from trnsim.nki.emit import MatmulResult
from trnsim.nki.memory import copy, full
from trnsim.nki.tiles import Mask, NkiTensor, tile_size
from trnsim.program import double_row_problem


def _stationary_of(x: NkiTensor, transpose_x: bool) -> NkiTensor:
    """``x`` [K, M] as is, or ``x`` [M, K] through the PE array and back into SBUF."""
    if transpose_x:
        return x
    return copy(transpose(x), dtype=x.dtype)



def _in_sbuf(t: NkiTensor) -> NkiTensor:
    """The PE array reads SBUF: a PSUM operand (an ``nl.transpose`` result) is copied
    there first, as NKI's compiler does for ``nl.matmul``."""
    return copy(t) if t.buffer is Memory.PSUM else t


def matmul(x: Any, y: Any, transpose_x: bool = False, mask: Mask | None = None, transpose_mode: bool = False,
           double_row: bool = False) -> MatmulResult:
    """``x @ y`` on the tensor engine (fp32 in PSUM). With ``transpose_x=True``, ``x`` is
    already [K, M] (contraction on partitions) and the result is ``x.T @ y``; otherwise
    ``x`` [M, K] goes through the PE array's transpose first. Operands in PSUM are
    copied to SBUF first (one vector-engine copy each). ``double_row`` (fp8, NC-v3 and
    later, with ``transpose_x``): ``x`` [K, 2, M] and ``y`` [K, 2, N] contract over 2K."""
    x, y = _e.readable(x, "matmul x"), _e.readable(y, "matmul y")
    named = _e.named_bases(x, y)
    x, y = _in_sbuf(_e.restricted(x, mask, named)), _in_sbuf(_e.restricted(y, mask, named))
    st_tile = _stationary_of(x, transpose_x)
    st = st_tile.view
    tr = _e.tracer()
    if st.partitions != y.view.partitions:
        raise tr.fail(f"matmul contraction sizes differ: x gives K={st.partitions}, y has K={y.view.partitions} partitions")
    rows = pe_rows(double_row)
    if double_row:
        _check_double_row(st, y.view, transpose_mode)
    if st.free_size // rows > tile_size.gemm_stationary_fmax:
        raise tr.fail(f"matmul M={st.free_size // rows} exceeds nl.tile_size.gemm_stationary_fmax "
                      f"({tile_size.gemm_stationary_fmax}); tile M")
    if y.view.free_size // rows > tile_size.gemm_moving_fmax:
        raise tr.fail(f"moving free size {y.view.free_size // rows} exceeds nl.tile_size.gemm_moving_fmax "
                      f"({tile_size.gemm_moving_fmax}); tile N into pieces of 512")
    if transpose_mode and y.view.partitions != y.view.free_size:
        raise tr.fail(f"nc_matmul(is_transpose=True) moves the stationary through an identity: moving must be square "
                      f"[{st.partitions}, {st.partitions}], got {list(y.shape)}")
    moving = y.view if double_row else _e.flat2d(y.view)
    return MatmulResult(st, moving, keep=(st_tile, y), transpose=transpose_mode, double_row=double_row)


def _check_double_row(stationary: View, moving: View, transpose_mode: bool) -> None:
    """NKI's rules for ``perf_mode=double_row`` (the Program's, :func:`trnsim.program.double_row_problem`,
    said before any instruction is made), and not with ``is_transpose``."""
    tr = _e.tracer()
    if transpose_mode:
        raise tr.fail("nc_matmul perf_mode=double_row cannot be combined with is_transpose=True")
    for what, v in (("stationary", stationary), ("moving", moving)):
        problem = double_row_problem(tr.program.chip, v, what)
        if problem is not None:
            raise tr.fail(f"nc_matmul perf_mode=double_row: {problem}")


def transpose(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """[P, F] -> [F, P] through the PE array (result in PSUM)."""
    x = _e.restricted(_e.readable(x, "transpose input"), mask)
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
        larger = b is None or (a is not None and
                               (a.view.partitions, a.view.free_size) >= (b.view.partitions, b.view.free_size))
        ref = a if a is not None and larger else b
        default = ref.dtype if ref.buffer is Memory.SBUF else _dt.float32
        result = out if out is not None else _e.like(ref, dtype if dtype is not None else default)
        if a is not None and b is not None and a.view.free_size == b.view.free_size and a.view.partitions == b.view.partitions:
            dst, va, vb = _e.clip(mask, result, a, b)
            _e.tensor_tensor(dst, va, vb, alu, engine=None)
            return result
        # one side is a number or one value per partition: tensor_scalar
        tile, other, reverse = (a, b if b is not None else y, False) if ref is a else (b, a if a is not None else x, True)
        if isinstance(other, NkiTensor):
            if other.view.free_size != 1 or other.view.partitions != tile.view.partitions:
                if other.view.partitions == 1 and other.view.free_size == tile.view.free_size:
                    other = broadcast_to(other, tile.shape)
                    dst, va, vb = _e.clip(mask, result, tile, other)
                    _e.tensor_tensor(dst, *((vb, va) if reverse else (va, vb)), alu, engine=None)
                    return result
                raise tr.fail(f"nl.{name} of {list(tile.shape)} and {list(other.shape)}: shapes must match, or one must be "
                              f"[P, 1] (one value per partition) or [1, F] (broadcast over partitions)")
        # a masked op reads a per-partition operand on the partitions it keeps
        (dst, src), (scalar,) = _e.clip_rows(mask, [result, tile], [_scalar_operand(other, tile)])
        _e.tensor_scalar(dst, src, alu, _e.partition_rows(scalar, src.partitions), reverse0=reverse, engine=None)
        return result

    op.__name__ = name
    op.__doc__ = f"Elementwise {name} of two tiles, or a tile and a number or a [P, 1] tile (vector engine)."
    return op


def _broadcast_pair(a: NkiTensor, b: NkiTensor, name: str) -> tuple[NkiTensor, NkiTensor]:
    """``a`` and ``b`` brought to one shape by numpy's rules, except that a [P, 1] beside a
    full [P, F] stays a per-partition scalar. Tiles of one rank broadcast axis by axis (a
    [P, 4, 1] beside a [P, 4, 8]); otherwise on (partitions, free size)."""
    pa, fa = a.view.partitions, a.view.free_size
    pb, fb = b.view.partitions, b.view.free_size
    if tuple(a.shape) == tuple(b.shape) or ((pa, fa) == (pb, fb) and len(a.shape) != len(b.shape)):
        return a, b
    p, f = builtins.max(pa, pb), builtins.max(fa, fb)
    if pa == pb and (fa == 1 or fb == 1):  # one value per partition beside a full tile
        return a, b
    if len(a.shape) == len(b.shape) > 2:
        try:
            shape = tuple(int(n) for n in np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
        except ValueError:
            shape = ()
        if shape:
            return _axis_broadcast(a, shape), _axis_broadcast(b, shape)

    def fit(t: NkiTensor, pt: int, ft: int, other_full: bool) -> NkiTensor:
        if (pt, ft) == (p, f) or (pt == p and ft == 1 and other_full):
            return t
        if pt in (1, p) and ft in (1, f):
            return broadcast_to(t, (p, f))
        raise _e.tracer().fail(f"nl.{name} of {list(a.shape)} and {list(b.shape)}: the shapes do not broadcast; "
                               "each axis of one operand must match the other's or be 1")

    return fit(a, pa, fa, (pb, fb) == (p, f)), fit(b, pb, fb, (pa, fa) == (p, f))


def _axis_broadcast(t: NkiTensor, shape: tuple[int, ...]) -> NkiTensor:
    """``t`` repeated along each size-1 axis to ``shape``: over partitions by one DMA
    (engines read a tile partition by partition), along free axes by a stride-0 view, which
    the engines read with no copy."""
    if t.shape[0] != shape[0]:
        t = broadcast_to(t, (shape[0],) + tuple(t.shape[1:]))
    for d in range(1, len(shape)):
        if t.shape[d] != shape[d]:
            t = t.broadcast(d, shape[d])
    return t


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
    """Copy a [1, F] tile to every partition of a [P, F] tile, or a [P, 1] tile along the
    free dimension (vector engine).

    Over partitions a float row goes through the tensor engine, as NKI does it ("NKI
    invokes such matmul under the hood when ``broadcast_to`` is called", the architecture
    guide's Partition Broadcast; the Mamba tutorial counts it as "an extra TensorE
    instruction"): a [1, P] tile of ones is the stationary and the row streams through
    in pieces of at most 512 columns. The result is the PSUM tile they land in (the
    first columns of whole banks), for an fp32 row (a matmul writes fp32 PSUM) that fits
    in PSUM's free space; else each piece is copied from PSUM into an SBUF result of the
    row's dtype. An integer row (the PE array multiplies floats), a row not on SBUF
    partition 0, or any row while PSUM has no room for a piece, is copied into SBUF by
    one DMA that reads the row once per partition; so is every row of a kernel that runs
    out of PSUM otherwise (traced again so: PSUM is never spilled). A -0.0 comes out
    +0.0 through the PE array, as a sum from zero gives it."""
    x = _e.readable(x)
    tr = _e.tracer()
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    if x.view.partitions == 1 and x.view.free_size == 1 and shape[0] > 1 and math.prod(shape[1:]) > 1:
        x = broadcast_to(x, (shape[0], 1))  # over partitions first, then along the free dimension
    if x.view.partitions == 1 and x.view.free_size == math.prod(shape[1:]):
        row = _e.flat2d(x.view)
        # the PE array streams a row of SBUF partition 0 past the ones (the stationary's
        # one contraction row); a row elsewhere takes the DMA
        if x.dtype.is_float and x.buffer is Memory.SBUF and row.start_partition == 0:
            on_pe = _pe_broadcast(shape, row)
            if on_pe is not None:
                return on_pe
        out = _e.new_tensor(shape, x.dtype, Memory.SBUF)
        # one DMA rather than one per row: rows 1, 2, ... start on misaligned partitions
        src = View(row.tensor, row.offset, (row.dims[0], (0, shape[0]), row.dims[1]))
        tr.dma(_e.flat2d(out.view), src)
        return out
    if x.view.free_size == 1 and x.view.partitions == shape[0]:
        out = _e.new_tensor(shape, x.dtype, Memory.SBUF)
        zero = full(shape, 0.0, x.dtype)
        _e.tensor_scalar(out.view, zero.view, AluOp.ADD, x.view, engine=None)
        return out
    raise tr.fail(f"nl.broadcast_to cannot broadcast {list(x.shape)} to {list(shape)}; broadcast [1, F] over "
                  "partitions or [P, 1] over the free dimension")


def _pe_broadcast(shape: tuple[int, ...], row: View) -> NkiTensor | None:
    """``row`` [1, F] in every partition of a [P, F] tile (``shape``) through the PE array
    (see :func:`broadcast_to`); None, with nothing emitted, when PSUM has no room even for
    one piece."""
    tr = _e.tracer()
    parts, size = shape[0], row.free_size
    width = min(size, tile_size.gemm_moving_fmax)
    alloc = tr.program.psum_alloc

    # a PSUM tile over one bank is whole banks (512 fp32 columns each): a 2-D result of
    # another width is the first columns of one
    banked = size if size <= width else -(-size // width) * width
    in_psum_shape = shape if banked == size else (parts, banked) if len(shape) == 2 else None

    def where() -> str:
        if row.dtype is _dt.float32 and in_psum_shape is not None and \
                alloc.fits(0, parts, banked * row.dtype.itemsize):
            return "psum"
        return "pieces" if alloc.fits(0, parts, width * _dt.float32.itemsize) else "dma"

    place = tr.decide(where, lambda choice: None if choice == "dma" else "dma")
    if place == "dma":
        return None
    whole = place == "psum"
    ones = _e.new_tensor((1, parts), row.dtype)
    _e.memset(ones.view, 1.0, engine=None)
    if whole:
        assert in_psum_shape is not None
        banks = _e.new_tensor(in_psum_shape, row.dtype, Memory.PSUM)
        out = banks if banked == size else banks[:, 0:size]
    else:
        out = _e.new_tensor(shape, row.dtype, Memory.SBUF)
    flat = _e.flat2d(out.view)
    for c0 in range(0, size, width):
        w = min(width, size - c0)
        if whole:
            _e.matmul(flat[:, c0:c0 + w], ones.view, row[:, c0:c0 + w], accumulate=False)
            continue
        piece = _e.new_tensor((parts, w), _dt.float32, Memory.PSUM)
        _e.matmul(piece.view, ones.view, row[:, c0:c0 + w], accumulate=False)
        _e.copy_to(flat[:, c0:c0 + w], piece.view, engine=None)
    return out


@_e.masked
def where(condition: Any, x: Any, y: Any, dtype: Any = None) -> NkiTensor:
    """``x`` where ``condition`` is non-zero, else ``y`` (a tile or a number)."""
    cond = _e.readable(condition, "nl.where condition")
    tiles = [t for t in (x, y) if not isinstance(t, Real)]
    shape = _where_shape(cond, *(_e.readable(t, "nl.where operand") for t in tiles))

    def fit(t: NkiTensor) -> NkiTensor:
        return t if shape is None else _axis_broadcast(t, shape)

    cond = fit(cond)
    xt = (fit(_e.readable(x, "nl.where x")) if not isinstance(x, Real)
          else full(cond.shape, x, dtype or _dt.float32))
    out = _e.like(xt, dtype)
    other = float(y) if isinstance(y, Real) else fit(_e.readable(y, "nl.where y")).view
    _e.emit(Select(out.view, cond.view, xt.view, other, engine=Engine.VECTOR))
    return out


def _where_shape(*tiles: NkiTensor) -> tuple[int, ...] | None:
    """The shape nl.where's tiles broadcast to when they are of one rank and differ, else None."""
    shapes = [tuple(int(n) for n in t.shape) for t in tiles]
    if len(set(shapes)) == 1 or len({len(s) for s in shapes}) != 1:
        return None
    try:
        return tuple(int(n) for n in np.broadcast_shapes(*shapes))
    except ValueError:
        raise _e.tracer().fail(f"nl.where of shapes {[list(s) for s in shapes]}: the shapes do not broadcast; each "
                               "axis must match the others or be 1") from None


def prelu(x: Any, alpha: Any, dtype: Any = None, mask: Mask | None = None, out: NkiTensor | None = None) -> NkiTensor:
    """Parametric ReLU: ``x`` where ``x >= 0``, else ``alpha * x``; ``alpha`` is a number or a
    [P, 1] tile (one slope per partition). Three vector-engine instructions, the last writing
    ``out`` when given. Also the ``op`` of nisa.activation with ``relu_param=alpha``."""
    return add(maximum(x, 0.0, dtype=_dt.float32, mask=mask),
               multiply(minimum(x, 0.0, dtype=_dt.float32, mask=mask), alpha, dtype=_dt.float32, mask=mask),
               dtype=dtype or (x.dtype if isinstance(x, NkiTensor) else None), mask=mask, out=out)
