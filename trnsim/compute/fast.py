"""The numeric kernels compiled with numba: :mod:`trnsim.compute.reference`, bit for bit.

Every public function here has the signature and the results of the one of the
same name in the reference; only the loops differ. The reference's operand
checks run first, because compiled loops do not check bounds.

Kernels compile on first use and are cached on disk (:mod:`trnsim.compute.jitcache`
finds a writable folder on read-only installs). Their
switch codes below are literals, not values looked up from :mod:`trnsim.isa`:
numba freezes the globals a cached kernel read, so a looked-up code that
changed would go unnoticed (the constants taken from the reference are fixed
numbers). ``error_model="numpy"`` makes division by zero give IEEE infinities
and NaNs, as numpy does, instead of raising. Bit-for-bit agreement assumes
numba calls the C library's ``exp``, ``tanh``, ... as CPython's ``math`` does;
with Intel SVML installed numba may vectorise them with its own versions.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from trnsim import dtypes
from trnsim.compute import jitcache
from trnsim.compute.reference import (F32_NAN, FLOAT_FORMATS, Accumulator, GELU_SIGMOID_SCALE, GELU_TANH_CUBIC,
                                      GELU_TANH_SCALE, INV_SQRT_2PI, SQRT_2,
                                      activation_operands, alu_operands, bn_aggr_operand, find_index8, match_replace8,
                                      matmul_operands, max8, reduce_operand, scan_operands, sequence_bounds, storage_operand)
from trnsim.dtypes import DType, Storage, Values
from trnsim.isa import ActivationFunc, AluOp, ReduceOp

# max8, find_index8, match_replace8 and sequence_bounds are the reference's own: they are not hot loops.
__all__ = ["activation", "alu", "decode", "encode", "find_index8", "match_replace8", "matmul", "max8", "reduce", "scan",
           "sequence_bounds"]

_jit = jitcache.njit(error_model="numpy")

(_IDENTITY, _EXP, _LOG, _SQRT, _RSQRT, _RECIPROCAL, _TANH, _SIGMOID, _RELU, _GELU, _GELU_TANH, _SILU,
 _SQUARE, _ABS, _SOFTPLUS, _SIN, _COS, _ERF, _SIGN, _GELU_DX, _SILU_DX, _GELU_APPRX_SIGMOID) = range(22)
_ACT_CODES = {
    ActivationFunc.IDENTITY: _IDENTITY, ActivationFunc.EXP: _EXP, ActivationFunc.LOG: _LOG,
    ActivationFunc.SQRT: _SQRT, ActivationFunc.RSQRT: _RSQRT, ActivationFunc.RECIPROCAL: _RECIPROCAL,
    ActivationFunc.TANH: _TANH, ActivationFunc.SIGMOID: _SIGMOID, ActivationFunc.RELU: _RELU,
    ActivationFunc.GELU: _GELU, ActivationFunc.GELU_TANH: _GELU_TANH, ActivationFunc.SILU: _SILU,
    ActivationFunc.SQUARE: _SQUARE, ActivationFunc.ABS: _ABS, ActivationFunc.SOFTPLUS: _SOFTPLUS,
    ActivationFunc.SIN: _SIN, ActivationFunc.COS: _COS, ActivationFunc.ERF: _ERF, ActivationFunc.SIGN: _SIGN,
    ActivationFunc.GELU_DX: _GELU_DX, ActivationFunc.SILU_DX: _SILU_DX,
    ActivationFunc.GELU_APPRX_SIGMOID: _GELU_APPRX_SIGMOID,
}

(_ADD, _SUBTRACT, _MULTIPLY, _DIVIDE, _MAXIMUM, _MINIMUM, _POW, _ABS_DIFF, _IS_EQUAL, _NOT_EQUAL,
 _IS_GT, _IS_GE, _IS_LT, _IS_LE, _BYPASS, _BITWISE_AND, _BITWISE_OR, _BITWISE_XOR, _LEFT_SHIFT,
 _RIGHT_SHIFT) = range(20)
_ALU_CODES = {
    AluOp.ADD: _ADD, AluOp.SUBTRACT: _SUBTRACT, AluOp.MULTIPLY: _MULTIPLY, AluOp.DIVIDE: _DIVIDE,
    AluOp.MAXIMUM: _MAXIMUM, AluOp.MINIMUM: _MINIMUM, AluOp.POW: _POW, AluOp.ABS_DIFF: _ABS_DIFF,
    AluOp.IS_EQUAL: _IS_EQUAL, AluOp.NOT_EQUAL: _NOT_EQUAL, AluOp.IS_GT: _IS_GT, AluOp.IS_GE: _IS_GE,
    AluOp.IS_LT: _IS_LT, AluOp.IS_LE: _IS_LE, AluOp.BYPASS: _BYPASS, AluOp.BITWISE_AND: _BITWISE_AND,
    AluOp.BITWISE_OR: _BITWISE_OR, AluOp.BITWISE_XOR: _BITWISE_XOR, AluOp.LEFT_SHIFT: _LEFT_SHIFT,
    AluOp.RIGHT_SHIFT: _RIGHT_SHIFT,
}
_INT_LIMIT = 2.0**63 - 1024.0
_REDUCE_CODES = {ReduceOp.ADD: _ADD, ReduceOp.MAX: _MAXIMUM, ReduceOp.MIN: _MINIMUM}


# -- conversions ---------------------------------------------------------


@_jit
def _fp32_bits(x: Values) -> NDArray[np.uint32]:
    f = np.empty(x.size, np.float32)
    for i in range(x.size):
        f[i] = x[i]
    bits = f.view(np.uint32)
    for i in range(x.size):
        if f[i] != f[i]:
            bits[i] = F32_NAN
    return bits


@_jit
def _encode_bf16(bits: NDArray[np.uint32]) -> NDArray[np.uint16]:
    out = np.empty(bits.size, np.uint16)
    for i in range(bits.size):
        b = np.int64(bits[i])
        out[i] = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return out


@_jit
def _encode_narrow(bits: NDArray[np.uint32], exp_bits: int, man_bits: int, overflow: int, nan: int) -> NDArray[np.uint16]:
    bias = (1 << (exp_bits - 1)) - 1
    out = np.empty(bits.size, np.uint16)
    for i in range(bits.size):
        b = np.int64(bits[i])
        magnitude = b & 0x7FFFFFFF
        if magnitude > 0x7F800000:
            out[i] = nan
            continue
        sign = (b >> 31) << (exp_bits + man_bits)
        if magnitude < 0x00800000:
            # fp32 zeros and denormals lie far below half the target's smallest denormal.
            out[i] = sign
            continue
        exponent = (magnitude >> 23) - 127
        significand = (magnitude & 0x7FFFFF) | 0x800000
        if exponent >= 1 - bias:
            shift = 23 - man_bits
            field = (exponent + bias - 1) << man_bits  # bias - 1: the implicit one in ``kept`` adds the last 1
        else:
            shift = min(23 - man_bits + 1 - bias - exponent, 25)
            field = 0
        kept = significand >> shift
        rest = significand - (kept << shift)
        half = np.int64(1) << (shift - 1)
        if rest > half or (rest == half and (kept & 1) == 1):
            kept += 1
        out[i] = sign | min(field + kept, overflow)
    return out


@_jit
def _encode_int(x: Values, lo: float, hi: float) -> NDArray[np.int64]:
    out = np.empty(x.size, np.int64)
    for i in range(x.size):
        v = x[i]
        if v != v:
            out[i] = 0
            continue
        v = min(max(v, lo), hi)
        whole = math.floor(v)
        n = np.int64(whole)
        frac = v - whole
        if frac > 0.5 or (frac == 0.5 and (n & 1) == 1):
            n += 1
        out[i] = n
    return out


@_jit
def _decode_bf16(bits: Storage) -> Values:
    wide = np.empty(bits.size, np.uint32)
    for i in range(bits.size):
        wide[i] = np.uint32(bits[i]) << 16
    return wide.view(np.float32).astype(np.float64)


@_jit
def _decode_narrow(bits: NDArray[np.uint16], exp_bits: int, man_bits: int, finite_only: bool) -> Values:
    bias = (1 << (exp_bits - 1)) - 1
    width = exp_bits + man_bits
    exp_max = (1 << exp_bits) - 1
    all_ones = (1 << width) - 1
    out = np.empty(bits.size, np.float64)
    for i in range(bits.size):
        b = np.int64(bits[i])
        exponent = (b >> man_bits) & exp_max
        mantissa = b & ((1 << man_bits) - 1)
        if (finite_only and (b & all_ones) == all_ones) or (not finite_only and exponent == exp_max and mantissa != 0):
            out[i] = np.nan
            continue
        if not finite_only and exponent == exp_max:
            v = math.inf
        elif exponent == 0:
            v = math.ldexp(float(mantissa), 1 - bias - man_bits)
        else:
            v = math.ldexp(float(mantissa + (1 << man_bits)), exponent - bias - man_bits)
        out[i] = -v if (b >> width) & 1 else v
    return out


def encode(values: Values, dtype: DType) -> Storage:
    """Round float64 ``values`` to ``dtype``'s storage array; see :func:`trnsim.compute.reference.encode`."""
    x = np.asarray(values, dtype=np.float64)
    flat = np.ascontiguousarray(x.reshape(-1))
    if not dtype.is_float:
        lo, hi = dtypes.int_range(dtype)
        return _encode_int(flat, float(lo), float(hi)).astype(dtype.storage).reshape(x.shape)
    bits = _fp32_bits(flat)
    out: Storage
    if dtype is dtypes.float32:
        out = bits.view(np.float32)
    elif dtype is dtypes.bfloat16:
        out = _encode_bf16(bits)
    else:
        fmt = FLOAT_FORMATS[dtype]
        narrow = _encode_narrow(bits, fmt.exp_bits, fmt.man_bits, fmt.overflow, fmt.nan)
        out = narrow.astype(f"u{dtype.itemsize}").view(dtype.storage)
    return out.reshape(x.shape)


def decode(storage: Storage, dtype: DType) -> Values:
    """The float64 values of a ``dtype`` storage array; see :func:`trnsim.compute.reference.decode`."""
    s = storage_operand(storage, dtype)
    if not dtype.is_float or dtype is dtypes.float32:
        with np.errstate(invalid="ignore"):  # a signalling NaN widens to a NaN all the same
            return s.astype(np.float64)
    flat = np.ascontiguousarray(s).reshape(-1)
    if dtype is dtypes.bfloat16:
        out = _decode_bf16(flat)
    else:
        fmt = FLOAT_FORMATS[dtype]
        out = _decode_narrow(flat.view(f"u{dtype.itemsize}").astype(np.uint16), fmt.exp_bits, fmt.man_bits, fmt.finite_only)
    return out.reshape(s.shape)


# -- scalar-engine activation ------------------------------------------------


@_jit
def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


@_jit
def _act(code: int, z: float) -> float:
    if code == _IDENTITY:
        return z
    if code == _EXP:
        return math.exp(z)
    if code == _LOG:
        return math.log(z)
    if code == _SQRT:
        return math.sqrt(z)
    if code == _RSQRT:
        return 1.0 / math.sqrt(z)
    if code == _RECIPROCAL:
        return 1.0 / z
    if code == _TANH:
        return math.tanh(z)
    if code == _SIGMOID:
        return _sigmoid(z)
    if code == _RELU:
        return 0.0 if z < 0.0 else z
    if code == _GELU:
        return 0.5 * z * (1.0 + math.erf(z / SQRT_2))
    if code == _GELU_TANH:
        return 0.5 * z * (1.0 + math.tanh(GELU_TANH_SCALE * (z + GELU_TANH_CUBIC * z * z * z)))
    if code == _SILU:
        return z * _sigmoid(z)
    if code == _SQUARE:
        return z * z
    if code == _ABS:
        return abs(z)
    if code == _SOFTPLUS:
        return (z if z > 0.0 else 0.0) + math.log1p(math.exp(-abs(z)))
    if code == _SIN:
        return math.sin(z)
    if code == _COS:
        return math.cos(z)
    if code == _ERF:
        return math.erf(z)
    if code == _GELU_DX:
        return 0.5 * (1.0 + math.erf(z / SQRT_2)) + z * math.exp(-0.5 * z * z) * INV_SQRT_2PI
    if code == _SILU_DX:
        return _sigmoid(z) * (1.0 + z * (1.0 - _sigmoid(z)))
    if code == _GELU_APPRX_SIGMOID:
        return z * _sigmoid(GELU_SIGMOID_SCALE * z)
    if z > 0.0:  # sign
        return 1.0
    if z < 0.0:
        return -1.0
    return 0.0


@_jit
def _activation(x: Values, code: int, scale: Values, bias: Values) -> Values:
    out = np.empty(x.shape, np.float64)
    for p in range(x.shape[0]):
        s = scale[p]
        b = bias[p]
        for f in range(x.shape[1]):
            z = x[p, f] * s
            out[p, f] = _act(code, z if b == 0.0 else z + b)
    return out


def activation(x: Values, func: ActivationFunc | str, scale: Values, bias: Values) -> Values:
    """``func(x * scale + bias)`` in float64 (a zero bias adds nothing, keeping -0);
    see :func:`trnsim.compute.reference.activation`."""
    code = _ACT_CODES[ActivationFunc(func)]
    x, scale, bias = activation_operands(x, scale, bias)
    return _activation(x, code, scale, bias)


# -- vector-engine ALU -------------------------------------------------------


@_jit
def _int(x: float) -> np.int64:
    """A bitwise operand as int64, as :func:`trnsim.compute.reference._int` makes it."""
    # numpy's stubs type np.int64(...) as Any; the annotation keeps the result an int64
    n: np.int64 = np.int64(0) if x != x else np.int64(min(max(x, -_INT_LIMIT), _INT_LIMIT))
    return n


@_jit
def _alu_op(code: int, a: float, b: float) -> float:
    if code == _ADD:
        return a + b
    if code == _SUBTRACT:
        return a - b
    if code == _MULTIPLY:
        return a * b
    if code == _DIVIDE:
        return a / b
    if code == _MAXIMUM:
        return a if a != a or a > b else b
    if code == _MINIMUM:
        return a if a != a or a < b else b
    if code == _POW:
        return math.pow(a, b)
    if code == _ABS_DIFF:
        return abs(a - b)
    if code == _IS_EQUAL:
        return 1.0 if a == b else 0.0
    if code == _NOT_EQUAL:
        return 1.0 if a != b else 0.0
    if code == _IS_GT:
        return 1.0 if a > b else 0.0
    if code == _IS_GE:
        return 1.0 if a >= b else 0.0
    if code == _IS_LT:
        return 1.0 if a < b else 0.0
    if code == _IS_LE:
        return 1.0 if a <= b else 0.0
    if code == _BITWISE_AND:
        return float(_int(a) & _int(b))
    if code == _BITWISE_OR:
        return float(_int(a) | _int(b))
    if code == _BITWISE_XOR:
        return float(_int(a) ^ _int(b))
    if code == _LEFT_SHIFT:
        return float(_int(a) << min(max(_int(b), 0), 63))
    if code == _RIGHT_SHIFT:
        return float(_int(a) >> min(max(_int(b), 0), 63))
    return a  # bypass


@_jit
def _alu(a: Values, b: Values, code: int) -> Values:
    out = np.empty(a.size, np.float64)
    for i in range(a.size):
        out[i] = _alu_op(code, a[i], b[i])
    return out


def alu(a: Values, b: Values, op: AluOp | str) -> Values:
    """``op(a, b)`` elementwise in float64; see :func:`trnsim.compute.reference.alu`."""
    code = _ALU_CODES[AluOp(op)]
    a, b = alu_operands(a, b)
    return _alu(a.reshape(-1), b.reshape(-1), code).reshape(a.shape)


# -- reductions and the PE array ----------------------------------------------


@_jit
def _reduce(x: Values, code: int) -> Values:
    out = np.empty(x.shape[0], np.float64)
    for p in range(x.shape[0]):
        if code == _ADD:
            acc = np.float32(0.0) + np.float32(x[p, 0])   # from +0, as PyTorch: a sum of -0s is +0
            for i in range(1, x.shape[1]):
                acc = acc + np.float32(x[p, i])
            out[p] = acc
        else:
            best = x[p, 0]
            for i in range(1, x.shape[1]):
                best = _alu_op(code, best, x[p, i])
            out[p] = best
    return out


def reduce(x: Values, op: ReduceOp | str) -> Values:
    """Reduce ``x`` [P, F] along its free axis to [P]; see :func:`trnsim.compute.reference.reduce`."""
    code = _REDUCE_CODES[ReduceOp(op)]
    return _reduce(reduce_operand(x), code)


@_jit
def _matmul(out: NDArray[np.float32], stationary: Values, moving: Values) -> NDArray[np.float32]:
    for i in range(stationary.shape[1]):
        for k in range(stationary.shape[0]):
            s = stationary[k, i]
            for j in range(moving.shape[1]):
                out[i, j] = np.float32(np.float64(out[i, j]) + s * moving[k, j])
    return out


@_jit
def _matmul_float32(out: NDArray[np.float32], stationary: NDArray[np.float32],
                    moving: NDArray[np.float32]) -> NDArray[np.float32]:
    for i in range(stationary.shape[1]):
        for k in range(stationary.shape[0]):
            s = stationary[k, i]
            for j in range(moving.shape[1]):
                out[i, j] = out[i, j] + s * moving[k, j]
    return out


def _float32_products(stationary: Values, moving: Values) -> tuple[NDArray[np.float32], NDArray[np.float32]] | None:
    """Both operands as float32 when every product of theirs is exact in float32 (each
    value a float32 of at most 12 significant bits, as bf16, fp16 and fp8 values are)
    and every nonzero product lies in float32's normal range; else None. Then float32
    arithmetic gives the reference's bits: the sum of two float32s rounded from float64
    is the float32 sum (float64 has over twice float32's precision, so rounding twice
    is harmless)."""
    s32, m32 = stationary.astype(np.float32), moving.astype(np.float32)
    if not (np.array_equal(s32, stationary) and np.array_equal(m32, moving)):
        return None   # wider values, or NaN
    if (s32.view(np.uint32) & 0xFFF).any() or (m32.view(np.uint32) & 0xFFF).any():
        return None
    bounds = []
    for a in (np.abs(s32), np.abs(m32)):
        nonzero = a[a > 0]
        if nonzero.size == 0:
            return s32, m32   # every product is zero
        bounds.append((float(nonzero.min()), float(nonzero.max())))
    (s_lo, s_hi), (m_lo, m_hi) = bounds
    if s_lo * m_lo < 2.0 ** -126 or s_hi * m_hi >= 2.0 ** 127:
        return None
    return s32, m32


def matmul(acc: Accumulator, stationary: Values, moving: Values) -> NDArray[np.float32]:
    """``acc + stationary.T @ moving`` as the PE array computes it; see
    :func:`trnsim.compute.reference.matmul`. Operands whose products are exact in
    float32 (bf16, fp16, fp8) are multiplied in float32, about 2.3 times faster
    (benchmarks/matmul_numerics.py)."""
    out, s, m = matmul_operands(acc, stationary, moving)
    narrow = _float32_products(s, m)
    if narrow is not None:
        return _matmul_float32(out, *narrow)
    return _matmul(out, s, m)


@_jit
def _bn_stats(x: Values) -> Values:
    p_count, n = x.shape
    out = np.empty((p_count, 3), np.float64)
    for p in range(p_count):
        total = 0.0
        for i in range(n):
            total = total + x[p, i]
        mean = total / n
        m2 = 0.0
        for i in range(n):
            d = x[p, i] - mean
            m2 = m2 + d * d
        out[p, 0] = mean
        out[p, 1] = m2
        out[p, 2] = float(n)
    return out


def bn_stats(x: Values) -> Values:
    """Mean, m2 and count per row; see :func:`trnsim.compute.reference.bn_stats`."""
    return _bn_stats(reduce_operand(x))


@_jit
def _bn_aggr(stats: Values) -> Values:
    out = np.empty((stats.shape[0], 2), np.float64)
    for p in range(stats.shape[0]):
        mean, m2, n = stats[p, 0, 0], stats[p, 0, 1], stats[p, 0, 2]
        for j in range(1, stats.shape[1]):
            mb, m2b, nb = stats[p, j, 0], stats[p, j, 1], stats[p, j, 2]
            total = n + nb
            delta = mb - mean
            mean = mean + delta * nb / total
            m2 = m2 + m2b + delta * delta * n * nb / total
            n = total
        out[p, 0] = mean
        out[p, 1] = m2 / n
    return out


def bn_aggr(stats: Values) -> Values:
    """Combine (mean, m2, count) chunks; see :func:`trnsim.compute.reference.bn_aggr`."""
    return _bn_aggr(bn_aggr_operand(stats))


@_jit
def _scan(a: Values, b: Values, initial: Values, code0: int, code1: int, reverse0: bool, reverse1: bool) -> Values:
    out = np.empty_like(a)
    for p in range(a.shape[0]):
        prev = np.float64(np.float32(initial[p]))
        for i in range(a.shape[1]):
            t = _alu_op(code0, prev, a[p, i]) if reverse0 else _alu_op(code0, a[p, i], prev)
            t = np.float64(np.float32(t))
            t = _alu_op(code1, b[p, i], t) if reverse1 else _alu_op(code1, t, b[p, i])
            prev = np.float64(np.float32(t))
            out[p, i] = prev
    return out


def scan(a: Values, b: Values, initial: Values, op0: AluOp | str, op1: AluOp | str,
         reverse0: bool = False, reverse1: bool = False) -> Values:
    """The running scan of ``a`` and ``b``; see :func:`trnsim.compute.reference.scan`."""
    a, b, initial = scan_operands(a, b, initial)
    return _scan(a, b, initial, _ALU_CODES[AluOp(op0)], _ALU_CODES[AluOp(op1)], bool(reverse0), bool(reverse1))
