"""The numeric kernels in plain numpy: the definition every other backend must match.

Values travel as float64 numpy arrays; storage arrays hold a dtype's bits in its
numpy storage type (see :mod:`trnsim.dtypes`). Every kernel here is a pure
function of its arguments and touches no memory of the simulated core.

Transcendental functions are evaluated element by element with Python's
:mod:`math` module, which calls the C library just as numba's ``math.*`` does;
numpy's own vectorised ``np.exp`` and friends may differ from it in the last bit.
Addition, multiplication, division and square roots are IEEE-exact everywhere
and are vectorised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, TypeAlias

import numpy as np
from numpy.typing import NDArray

from trnsim import dtypes
from trnsim.dtypes import DType, Storage, Values
from trnsim.errors import ProgramError
from trnsim.isa import ActivationFunc, AluOp, ReduceOp

__all__ = ["activation", "alu", "bn_aggr", "bn_stats", "decode", "encode", "find_index8", "match_replace8", "matmul", "max8",
           "reduce", "scan", "sequence_bounds"]

F32_NAN = 0x7FC00000
SQRT_2 = math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715
#: gelu's sigmoid approximation, x * sigmoid(1.702 x)
GELU_SIGMOID_SCALE = 1.702

#: A PSUM tile's values, as a matmul accumulates into them: float32, or float64 read back from PSUM.
Accumulator: TypeAlias = NDArray[np.float32] | Values


@dataclass(frozen=True)
class FloatFormat:
    """Bit layout of a narrow float: sign, ``exp_bits`` exponent bits, ``man_bits`` mantissa bits.

    ``finite_only`` formats (the ``fn`` float8 variant) have no infinities: the
    all-ones magnitude is their NaN and overflow saturates to the largest finite
    value. The others follow IEEE 754 (overflow gives infinity). ``nan`` is the
    one NaN pattern that encoding produces.
    """

    exp_bits: int
    man_bits: int
    finite_only: bool
    nan: int

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def max_finite(self) -> int:
        """Bits of the largest finite magnitude."""
        all_ones = (1 << (self.exp_bits + self.man_bits)) - 1
        return all_ones - 1 if self.finite_only else all_ones - (1 << self.man_bits)

    @property
    def overflow(self) -> int:
        """Bits of the magnitude that overflow rounds to: infinity, or the largest finite value."""
        return self.max_finite if self.finite_only else self.max_finite + 1


FLOAT_FORMATS: dict[DType, FloatFormat] = {
    dtypes.float16: FloatFormat(5, 10, False, 0x7E00),
    dtypes.float8_e4m3: FloatFormat(4, 3, False, 0x7C),     # IEEE 754 style: NaN as ml_dtypes writes it
    dtypes.float8_e4m3fn: FloatFormat(4, 3, True, 0x7F),    # OCP's finite-only e4m3
    dtypes.float8_e5m2: FloatFormat(5, 2, False, 0x7F),
}


# -- operand checks, shared by every backend ------------------------------


def storage_operand(storage: Storage, dtype: DType) -> Storage:
    """``storage`` as an array, checked to be of ``dtype``'s storage type."""
    s = np.asarray(storage)
    if s.dtype != dtype.storage:
        raise ProgramError(f"{dtype.name} values are stored as {dtype.storage}, got an array of {s.dtype}; "
                           "encode the values first")
    return s


def activation_operands(x: Values, scale: Values, bias: Values) -> tuple[Values, Values, Values]:
    """Contiguous float64 ``x`` [P, F], ``scale`` [P] and ``bias`` [P], checked."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    scale = np.ascontiguousarray(scale, dtype=np.float64)
    bias = np.ascontiguousarray(bias, dtype=np.float64)
    if x.ndim != 2 or scale.shape != (x.shape[0],) or bias.shape != (x.shape[0],):
        raise ProgramError(f"activation needs x [P, F] with scale and bias [P]; "
                           f"got {list(x.shape)}, {list(scale.shape)}, {list(bias.shape)}")
    return x, scale, bias


def alu_operands(a: Values, b: Values) -> tuple[Values, Values]:
    """Contiguous float64 ``a`` and ``b`` broadcast to one shape."""
    try:
        wide_a, wide_b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    except ValueError:
        raise ProgramError(f"ALU operands of shapes {list(np.shape(a))} and {list(np.shape(b))} do not broadcast; "
                           "give b the shape of a or [P, 1]") from None
    return np.array(wide_a, order="C"), np.array(wide_b, order="C")


def reduce_operand(x: Values) -> Values:
    """Contiguous float64 ``x`` [P, F] with F >= 1, checked."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ProgramError(f"reduce needs a [P, F] array with F >= 1, got shape {list(x.shape)}")
    return x


def bn_aggr_operand(stats: Values) -> Values:
    """Contiguous float64 ``stats`` [P, k, 3] with k >= 1, checked."""
    stats = np.ascontiguousarray(stats, dtype=np.float64)
    if stats.ndim != 3 or stats.shape[2] != 3 or stats.shape[1] == 0:
        raise ProgramError(f"bn_aggr needs stats [P, k, 3] with k >= 1, got shape {list(stats.shape)}")
    return stats


def matmul_operands(acc: Accumulator, stationary: Values, moving: Values) -> tuple[NDArray[np.float32], Values, Values]:
    """A float32 copy of ``acc`` [M, N] and contiguous float64 ``stationary`` [K, M], ``moving`` [K, N], checked."""
    out = np.array(acc, dtype=np.float32)
    s = np.ascontiguousarray(stationary, dtype=np.float64)
    m = np.ascontiguousarray(moving, dtype=np.float64)
    if s.ndim != 2 or m.ndim != 2 or s.shape[0] != m.shape[0] or out.shape != (s.shape[1], m.shape[1]):
        raise ProgramError(f"matmul needs acc [M, N], stationary [K, M] and moving [K, N]; "
                           f"got {list(out.shape)}, {list(s.shape)}, {list(m.shape)}")
    return out, s, m


# -- conversions ---------------------------------------------------------


def encode(values: Values, dtype: DType) -> Storage:
    """Round float64 ``values`` to ``dtype`` and return its storage array (same shape).

    Floats round first to float32, then to the target, both to nearest even;
    every NaN becomes the target's one quiet NaN. Integers round half to even
    from float64, saturate to the type's range, and take NaN to 0.
    """
    x = np.asarray(values, dtype=np.float64)
    if not dtype.is_float:
        return _encode_int(x, dtype)
    bits = _fp32_bits(x)
    if dtype is dtypes.float32:
        return bits.view(np.float32)
    if dtype is dtypes.bfloat16:
        # The canonical fp32 NaN rounds to the canonical bf16 NaN, so NaN needs no case of its own.
        rounded: NDArray[np.uint32] = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16
        return rounded.astype(np.uint16)
    return _encode_narrow(bits, FLOAT_FORMATS[dtype]).astype(f"u{dtype.itemsize}").view(dtype.storage)


def decode(storage: Storage, dtype: DType) -> Values:
    """The float64 values of a ``dtype`` storage array (exact: every chip dtype fits in float64)."""
    s = storage_operand(storage, dtype)
    # Widening a signalling NaN raises numpy's "invalid" flag; the result is a NaN all the same.
    with np.errstate(invalid="ignore"):
        if not dtype.is_float or dtype is dtypes.float32:
            return s.astype(np.float64)
        if dtype is dtypes.bfloat16:
            return (s.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return _decode_narrow(s.view(f"u{dtype.itemsize}"), FLOAT_FORMATS[dtype])


def _fp32_bits(x: Values) -> NDArray[np.uint32]:
    """float64 values rounded to float32, as uint32 bit patterns with every NaN made ``F32_NAN``."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
    return np.where(np.isnan(f), np.uint32(F32_NAN), f.view(np.uint32))


def _encode_int(x: Values, dtype: DType) -> Storage:
    lo, hi = dtypes.int_range(dtype)
    clean: Values = np.where(np.isnan(x), 0.0, x)
    return np.rint(np.clip(clean, lo, hi)).astype(dtype.storage)


def _encode_narrow(bits: NDArray[np.uint32], fmt: FloatFormat) -> NDArray[np.int64]:
    """fp32 bit patterns rounded to nearest even in ``fmt``; returns int64 patterns."""
    b = bits.astype(np.int64)
    magnitude = b & 0x7FFFFFFF
    exponent = (magnitude >> 23) - 127
    significand = (magnitude & 0x7FFFFF) | 0x800000
    # Below the target's smallest normal the significand shifts further right.
    # fp32 zeros and denormals take the largest shift and round to zero, which
    # is right: they lie far below half the smallest denormal of every narrow format.
    below = np.maximum(0, 1 - fmt.bias - exponent)
    shift = np.minimum(23 - fmt.man_bits + below, 25)
    kept = significand >> shift
    rest = significand & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    round_up = (rest > half) | ((rest == half) & ((kept & 1) == 1))
    # The implicit leading one of ``kept`` adds one to the exponent field, hence bias - 1;
    # a carry out of the mantissa moves into the exponent the same way.
    field = np.maximum(exponent + fmt.bias - 1, 0) << fmt.man_bits
    result = np.minimum(field + kept + round_up, fmt.overflow)
    result = result | ((b >> 31) << (fmt.exp_bits + fmt.man_bits))
    return np.where(magnitude > 0x7F800000, fmt.nan, result)


def _decode_narrow(bits: NDArray[np.unsignedinteger], fmt: FloatFormat) -> Values:
    b = bits.astype(np.int64)
    width = fmt.exp_bits + fmt.man_bits
    exp_max = (1 << fmt.exp_bits) - 1
    exponent = (b >> fmt.man_bits) & exp_max
    mantissa = b & ((1 << fmt.man_bits) - 1)
    denormal = np.ldexp(mantissa.astype(np.float64), 1 - fmt.bias - fmt.man_bits)
    normal = np.ldexp((mantissa + (1 << fmt.man_bits)).astype(np.float64), (exponent - fmt.bias - fmt.man_bits).astype(np.int32))
    magnitude = np.where(exponent == 0, denormal, normal)
    if fmt.finite_only:
        nan = (b & ((1 << width) - 1)) == (1 << width) - 1
    else:
        nan = (exponent == exp_max) & (mantissa != 0)
        magnitude = np.where(exponent == exp_max, np.inf, magnitude)
    value = np.where(((b >> width) & 1) == 1, -magnitude, magnitude)
    return np.where(nan, np.nan, value)


# -- scalar-engine activation ------------------------------------------------


def _elementwise(fn: Callable[[float], float]) -> Callable[[Values], Values]:
    ufunc = np.frompyfunc(fn, 1, 1)
    return lambda z: np.asarray(ufunc(z), dtype=np.float64)


# Python's math raises where C returns inf or NaN; these give the C results.
def _exp(z: float) -> float:
    try:
        return math.exp(z)
    except OverflowError:
        return math.inf


def _log(z: float) -> float:
    if z == 0.0:
        return -math.inf
    return math.nan if z < 0.0 else math.log(z)


def _periodic(fn: Callable[[float], float]) -> Callable[[float], float]:
    return lambda z: math.nan if math.isinf(z) else fn(z)


_EXP = _elementwise(_exp)
_LOG = _elementwise(_log)
_LOG1P = _elementwise(math.log1p)
_TANH = _elementwise(math.tanh)
_ERF = _elementwise(math.erf)
_SIN = _elementwise(_periodic(math.sin))
_COS = _elementwise(_periodic(math.cos))


def _sigmoid(z: Values) -> Values:
    return 1.0 / (1.0 + _EXP(-z))


_ACTIVATIONS: dict[ActivationFunc, Callable[[Values], Values]] = {
    ActivationFunc.IDENTITY: lambda z: z,
    ActivationFunc.EXP: _EXP,
    ActivationFunc.LOG: _LOG,
    ActivationFunc.SQRT: np.sqrt,
    ActivationFunc.RSQRT: lambda z: 1.0 / np.sqrt(z),
    ActivationFunc.RECIPROCAL: lambda z: 1.0 / z,
    ActivationFunc.TANH: _TANH,
    ActivationFunc.SIGMOID: _sigmoid,
    # ``z < 0`` is false for NaN and -0, so both pass through (as PyTorch's relu keeps them).
    ActivationFunc.RELU: lambda z: np.where(z < 0.0, 0.0, z),
    ActivationFunc.GELU: lambda z: 0.5 * z * (1.0 + _ERF(z / SQRT_2)),
    ActivationFunc.GELU_TANH: lambda z: 0.5 * z * (1.0 + _TANH(GELU_TANH_SCALE * (z + GELU_TANH_CUBIC * z * z * z))),
    ActivationFunc.SILU: lambda z: z * _sigmoid(z),
    ActivationFunc.SQUARE: lambda z: z * z,
    ActivationFunc.ABS: np.abs,
    # log(1 + e^z) = max(z, 0) + log1p(e^-|z|): e^-|z| never overflows.
    ActivationFunc.SOFTPLUS: lambda z: np.where(z > 0.0, z, 0.0) + _LOG1P(_EXP(-np.abs(z))),
    ActivationFunc.SIN: _SIN,
    ActivationFunc.COS: _COS,
    ActivationFunc.ERF: _ERF,
    # Zeros of either sign and NaN give +0, as PyTorch's ``(0 < z) - (z < 0)``.
    ActivationFunc.SIGN: lambda z: np.where(z > 0.0, 1.0, np.where(z < 0.0, -1.0, 0.0)),
    # d/dz gelu(z) = Phi(z) + z * phi(z); d/dz silu(z) = s + z * s * (1 - s), s = sigmoid(z)
    ActivationFunc.GELU_DX: lambda z: 0.5 * (1.0 + _ERF(z / SQRT_2)) + z * _EXP(-0.5 * z * z) * INV_SQRT_2PI,
    ActivationFunc.SILU_DX: lambda z: _sigmoid(z) * (1.0 + z * (1.0 - _sigmoid(z))),
    ActivationFunc.GELU_APPRX_SIGMOID: lambda z: z * _sigmoid(GELU_SIGMOID_SCALE * z),
}


def activation(x: Values, func: ActivationFunc | str, scale: Values, bias: Values) -> Values:
    """``func(x * scale + bias)`` in float64, for ``x`` [P, F] and per-partition ``scale``, ``bias`` [P].

    A zero bias adds nothing, not even the sign change IEEE gives ``-0 + 0``: so -0
    reaches ``func`` as -0 (``rsqrt(-0) = -inf``, ``-x`` of +0 is -0, as in PyTorch).
    Division by zero and domain errors give IEEE infinities and NaNs, silently.
    """
    f = ActivationFunc(func)
    x, scale, bias = activation_operands(x, scale, bias)
    with np.errstate(all="ignore"):
        scaled = x * scale[:, None]
        z = np.where(bias[:, None] == 0.0, scaled, scaled + bias[:, None])
        return np.array(_ACTIVATIONS[f](z), dtype=np.float64)


# -- vector-engine ALU -------------------------------------------------------


def _is_odd_integer(y: float) -> bool:
    return math.isfinite(y) and y == math.floor(y) and abs(y) < 2.0**53 and int(y) % 2 == 1


def _pow(x: float, y: float) -> float:
    """C's ``pow``: Python's math.pow raises on the cases where C returns infinities or NaN."""
    try:
        return math.pow(x, y)
    except OverflowError:
        return -math.inf if x < 0.0 and _is_odd_integer(y) else math.inf
    except ValueError:
        if x == 0.0:  # zero to a negative power
            return -math.inf if math.copysign(1.0, x) < 0.0 and _is_odd_integer(y) else math.inf
        return math.nan  # a negative base to a non-integer power


_POW = np.frompyfunc(_pow, 2, 1)


def _maximum(a: Values, b: Values) -> Values:
    # NaN in either operand wins; of equal operands (such as -0 and +0) b is returned.
    return np.where(np.isnan(a) | (a > b), a, b)


def _minimum(a: Values, b: Values) -> Values:
    return np.where(np.isnan(a) | (a < b), a, b)


def _flag(cond: NDArray[np.bool_]) -> Values:
    return cond.astype(np.float64)


_INT_LIMIT = 2.0**63 - 1024.0  # the largest float64 below 2**63


def _int(x: Values) -> NDArray[np.int64]:
    """Bitwise operands as 64-bit integers: fractions truncated toward zero, NaN as 0, and
    values beyond the int64 range clamped to it."""
    return np.trunc(np.clip(np.nan_to_num(x, nan=0.0), -_INT_LIMIT, _INT_LIMIT)).astype(np.int64)


def _bits(fn: Callable[[NDArray[np.int64], NDArray[np.int64]], NDArray[np.int64]]) -> Callable[[Values, Values], Values]:
    """``fn`` on the operands as 64-bit integers (see :func:`_int`)."""
    return lambda a, b: fn(_int(a), _int(b)).astype(np.float64)


def _shift(fn: Callable[[NDArray[np.int64], NDArray[np.int64]], NDArray[np.int64]]) -> Callable[[Values, Values], Values]:
    """``fn`` with the shift amount ``b`` clamped to 0..63."""
    return lambda a, b: fn(_int(a), np.clip(_int(b), 0, 63)).astype(np.float64)


_ALU: dict[AluOp, Callable[[Values, Values], Values]] = {
    AluOp.ADD: np.add,
    AluOp.SUBTRACT: np.subtract,
    AluOp.MULTIPLY: np.multiply,
    AluOp.DIVIDE: np.divide,
    AluOp.MAXIMUM: _maximum,
    AluOp.MINIMUM: _minimum,
    AluOp.POW: lambda a, b: np.asarray(_POW(a, b), dtype=np.float64),
    AluOp.ABS_DIFF: lambda a, b: np.abs(a - b),
    AluOp.IS_EQUAL: lambda a, b: _flag(a == b),
    AluOp.NOT_EQUAL: lambda a, b: _flag(a != b),
    AluOp.IS_GT: lambda a, b: _flag(a > b),
    AluOp.IS_GE: lambda a, b: _flag(a >= b),
    AluOp.IS_LT: lambda a, b: _flag(a < b),
    AluOp.IS_LE: lambda a, b: _flag(a <= b),
    AluOp.BYPASS: lambda a, b: a.copy(),
    AluOp.BITWISE_AND: _bits(np.bitwise_and),
    AluOp.BITWISE_OR: _bits(np.bitwise_or),
    AluOp.BITWISE_XOR: _bits(np.bitwise_xor),
    AluOp.LEFT_SHIFT: _shift(np.left_shift),
    AluOp.RIGHT_SHIFT: _shift(np.right_shift),
}


def alu(a: Values, b: Values, op: AluOp | str) -> Values:
    """``op(a, b)`` elementwise in float64; ``a`` and ``b`` broadcast (such as [P, F] with [P, 1]).

    Comparisons give 1.0 or 0.0; ``bypass`` returns ``a``. Division by zero gives
    IEEE infinities and NaNs, silently.
    """
    fn = _ALU[AluOp(op)]
    a, b = alu_operands(a, b)
    with np.errstate(all="ignore"):
        return np.array(fn(a, b), dtype=np.float64)


# -- reductions and the PE array ----------------------------------------------


def reduce(x: Values, op: ReduceOp | str) -> Values:
    """Reduce ``x`` [P, F] along its free axis to [P] (float64).

    ``add`` accumulates in float32 in index order from +0, as the engines do; ``max`` and
    ``min`` return one of the elements. NaN propagates.
    """
    r = ReduceOp(op)
    x = reduce_operand(x)
    with np.errstate(all="ignore"):
        if r is ReduceOp.ADD:
            acc: NDArray[np.float32] = np.float32(0.0) + x[:, 0].astype(np.float32)   # from +0, as PyTorch: a sum of -0s is +0
            for i in range(1, x.shape[1]):
                acc = acc + x[:, i].astype(np.float32)
            return acc.astype(np.float64)
        pick = _maximum if r is ReduceOp.MAX else _minimum
        acc64: Values = x[:, 0].copy()
        for i in range(1, x.shape[1]):
            acc64 = pick(acc64, x[:, i])
        return acc64


def matmul(acc: Accumulator, stationary: Values, moving: Values) -> NDArray[np.float32]:
    """``acc + stationary.T @ moving`` as the PE array computes it; returns the new float32 [M, N].

    ``acc`` is the float32 [M, N] PSUM tile, ``stationary`` [K, M] and ``moving``
    [K, N] hold float64 values decoded from their SBUF dtypes. Row k of the
    contraction is added for k = 0, 1, ... in turn: the float64 product is exact,
    the sum is rounded to float32 after every step.
    """
    out, s, m = matmul_operands(acc, stationary, moving)
    with np.errstate(all="ignore"):
        for k in range(s.shape[0]):
            out = (out.astype(np.float64) + s[k, :, None] * m[k, None, :]).astype(np.float32)
    return out


def bn_stats(x: Values) -> Values:
    """Mean, sum of squared deviations and count of each row of ``x`` [P, F], as [P, 3].

    Both sums run in float64 in index order: the mean first, then the deviations from it.
    """
    x = reduce_operand(x)
    n = x.shape[1]
    total = np.zeros(x.shape[0])
    for i in range(n):
        total = total + x[:, i]
    mean = total / n
    m2 = np.zeros(x.shape[0])
    for i in range(n):
        d = x[:, i] - mean
        m2 = m2 + d * d
    return np.stack([mean, m2, np.full(x.shape[0], float(n))], axis=1)


def bn_aggr(stats: Values) -> Values:
    """Combine per-chunk (mean, m2, count) ``stats`` [P, k, 3] into [P, 2] (mean, variance).

    Chunks join in index order by the pairwise update (Chan et al.): with ``delta`` the
    difference of the means, ``mean += delta * n_b / n`` and
    ``m2 += m2_b + delta**2 * n_a * n_b / n``, all in float64.
    """
    stats = bn_aggr_operand(stats)
    mean, m2, n = stats[:, 0, 0].copy(), stats[:, 0, 1].copy(), stats[:, 0, 2].copy()
    with np.errstate(all="ignore"):
        for j in range(1, stats.shape[1]):
            mb, m2b, nb = stats[:, j, 0], stats[:, j, 1], stats[:, j, 2]
            total = n + nb
            delta = mb - mean
            mean = mean + delta * nb / total
            m2 = m2 + m2b + delta * delta * n * nb / total
            n = total
        return np.stack([mean, m2 / n], axis=1)


# -- scans, top-8 searches and segments --------------------------------------


def scan_operands(a: Values, b: Values, initial: Values) -> tuple[Values, Values, Values]:
    """Contiguous float64 ``a`` and ``b`` [P, F] and ``initial`` [P], checked."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    b = np.ascontiguousarray(b, dtype=np.float64)
    initial = np.ascontiguousarray(initial, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape or initial.shape != (a.shape[0],):
        raise ProgramError(f"scan needs a and b [P, F] of one shape and initial [P]; got {list(a.shape)}, "
                           f"{list(b.shape)}, {list(initial.shape)}")
    return a, b, initial


def scan(a: Values, b: Values, initial: Values, op0: AluOp | str, op1: AluOp | str,
         reverse0: bool = False, reverse1: bool = False) -> Values:
    """The running scan ``out[:, i] = op1(op0(a[:, i], out[:, i - 1]), b[:, i])`` of ``a`` and
    ``b`` [P, F] from ``out[:, -1] = initial`` [P], in float32 math: each op's result is
    rounded to float32. ``reverse0`` makes it ``op0(prev, a)``, ``reverse1`` ``op1(b, .)``."""
    a, b, initial = scan_operands(a, b, initial)
    f0, f1 = _ALU[AluOp(op0)], _ALU[AluOp(op1)]
    out = np.empty_like(a)
    prev = initial.astype(np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        for i in range(a.shape[1]):
            t = f0(prev, a[:, i]) if reverse0 else f0(a[:, i], prev)
            t = np.asarray(t, np.float64).astype(np.float32).astype(np.float64)
            t = f1(b[:, i], t) if reverse1 else f1(t, b[:, i])
            prev = np.asarray(t, np.float64).astype(np.float32).astype(np.float64)
            out[:, i] = prev
    return out


def max8(x: Values) -> Values:
    """The 8 largest values of each row of ``x`` [P, F] (F >= 8) in descending order, [P, 8]."""
    x = reduce_operand(x)
    if x.shape[1] < 8:
        raise ProgramError(f"max8 needs at least 8 elements per partition, got {x.shape[1]}")
    return -np.sort(-x, axis=1, kind="stable")[:, :8]


def _first_unclaimed(row: Values, value: float, claimed: set[int]) -> int:
    for j in np.flatnonzero(row == value):
        if int(j) not in claimed:
            return int(j)
    return -1


def find_index8(x: Values, vals: Values) -> NDArray[np.int64]:
    """Per row of ``x`` [P, F], the index of each of the 8 ``vals`` [P, 8]: vals in order each
    take the first occurrence no earlier val took; -1 where none is left. int64 [P, 8]."""
    x = reduce_operand(x)
    vals = np.asarray(vals, np.float64).reshape(x.shape[0], -1)
    out = np.full(vals.shape, -1, np.int64)
    for p in range(x.shape[0]):
        claimed: set[int] = set()
        for k in range(vals.shape[1]):
            out[p, k] = j = _first_unclaimed(x[p], vals[p, k], claimed)
            claimed.add(j)
    return out


def match_replace8(x: Values, vals: Values, imm: float) -> tuple[Values, NDArray[np.int64]]:
    """``x`` [P, F] with the first occurrence of each of the 8 ``vals`` [P, 8] replaced by ``imm``,
    vals taken last to first, and the positions (int64 [P, 8], -1 where none matched)."""
    x = reduce_operand(x).copy()
    vals = np.asarray(vals, np.float64).reshape(x.shape[0], -1)
    idx = np.full(vals.shape, -1, np.int64)
    for p in range(x.shape[0]):
        claimed: set[int] = set()
        for k in reversed(range(vals.shape[1])):
            idx[p, k] = j = _first_unclaimed(x[p], vals[p, k], claimed)
            claimed.add(j)
        hit = idx[p][idx[p] >= 0]
        x[p, hit] = imm
    return x, idx


def sequence_bounds(ids: Values) -> Values:
    """For segment ids [N], [2, N]: the first index of each element's segment and one past its
    last; id 0 (padding) gives (N, -1). Segments are runs of equal ids."""
    ids = np.asarray(ids, np.float64).reshape(-1)
    n = ids.size
    out = np.empty((2, n))
    start = 0
    for i in range(n + 1):
        if i == n or ids[i] != ids[start]:
            out[0, start:i], out[1, start:i] = (n, -1) if ids[start] == 0 else (start, i)
            start = i
    return out
