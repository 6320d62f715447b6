"""Numerics: conversions against torch, kernels against numpy, every instruction on both backends.

Kernel tests run once per backend against an independent expectation. Program
tests run each Program on both backends, require the output bytes to agree bit
for bit, and check the values against numpy.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trnsim import Program, ProgramError, dtypes
from trnsim.compute import Machine, decode, encode, get_backend
from trnsim.isa import (Activation, ActivationFunc, AffineSelect, AluOp, BnAggr, BnStats, Engine, Instruction, Iota, Memset,
                        ReduceOp, Select, SemaphoreSignal, SemaphoreWait, TensorCopy, TensorReduce, TensorScalar, TensorTensor,
                        Transpose, View)

pytestmark = pytest.mark.filterwarnings("error")  # no numpy warning may leak out of the kernels

BACKENDS = ("numpy", "numba")
TORCH = {
    dtypes.bfloat16: (torch.bfloat16, torch.int16),
    dtypes.float16: (torch.float16, torch.int16),
    dtypes.float8_e4m3fn: (torch.float8_e4m3fn, torch.uint8),
    dtypes.float8_e5m2: (torch.float8_e5m2, torch.uint8),
}
# formats torch lacks, checked against ml_dtypes: the NeuronCore's IEEE 754 style e4m3
ML_DTYPES = {dtypes.float8_e4m3: "float8_e4m3"}
NARROW = tuple(TORCH) + tuple(ML_DTYPES)
FLOATS = tuple(d for d in dtypes.ALL if d.is_float)
INTS = tuple(d for d in dtypes.ALL if not d.is_float)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return get_backend(request.param)


def bits_of(storage: np.ndarray) -> np.ndarray:
    return storage.view(f"u{storage.dtype.itemsize}").astype(np.int64)


# -- conversions against torch -------------------------------------------


def _ml_dtype(dtype):
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, ML_DTYPES[dtype]))


def torch_codes(dtype):
    """Every bit pattern of a narrow dtype and its float32 value according to torch (or
    ml_dtypes, for a format torch lacks)."""
    codes = np.arange(2 ** (8 * dtype.itemsize), dtype=f"u{dtype.itemsize}")
    if dtype in ML_DTYPES:
        return codes, codes.view(_ml_dtype(dtype)).astype(np.float32)
    tdt, tint = TORCH[dtype]
    values = torch.from_numpy(codes.view(np.int16) if tint is torch.int16 else codes).view(tdt).float().numpy()
    return codes, values


def reference_encode(x, dtype):
    """float32 ``x`` in ``dtype`` by torch (or ml_dtypes): bit patterns and where NaN."""
    if dtype in ML_DTYPES:
        with np.errstate(over="ignore", invalid="ignore"):
            cast = x.astype(_ml_dtype(dtype))
        return cast.view(np.uint8).astype(np.int64), np.isnan(cast.astype(np.float32))
    tdt, tint = TORCH[dtype]
    expected = torch.from_numpy(x).to(tdt)
    return expected.view(tint).numpy().view(f"u{dtype.itemsize}").astype(np.int64), torch.isnan(expected.float()).numpy()


def conversion_inputs(dtype, rng):
    """float32 values: random bit patterns, wide-range normals, fp32 edge cases, and every
    representable value of ``dtype`` with the midpoints between neighbours and one fp32 ulp either side."""
    random_bits = rng.integers(0, 2**32, 50_000, dtype=np.uint32).view(np.float32)
    wide = (rng.standard_normal(50_000) * 2.0 ** rng.uniform(-40, 40, 50_000)).astype(np.float32)
    f32 = np.finfo(np.float32)
    edges = np.array([0.0, -0.0, f32.smallest_subnormal, -f32.smallest_subnormal, f32.tiny, f32.max, -f32.max,
                      np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 448.0, 464.0, 480.0, 57344.0, 61440.0, 65504.0,
                      65520.0, 3.4e38], dtype=np.float32)
    _, table = torch_codes(dtype)
    finite = np.unique(table[np.isfinite(table)].astype(np.float64))
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)  # exact: narrow formats have few mantissa bits
    with np.errstate(over="ignore"):  # beyond bf16's largest value lies float32's infinity
        beyond = np.array([finite[-1] * 1.01, finite[-1] * 1.2, finite[-1] * 4, finite[0] * 1.2], dtype=np.float32)
    around = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    return np.concatenate([random_bits, wide, edges, finite.astype(np.float32), around, beyond])


@pytest.mark.parametrize("dtype", NARROW, ids=str)
def test_encode_matches_torch(backend, dtype):
    x = conversion_inputs(dtype, np.random.default_rng(1))
    expected_bits, expected_nan = reference_encode(x, dtype)
    with np.errstate(invalid="ignore"):  # widening the random signalling NaNs
        wide = x.astype(np.float64)
    got = backend.encode(wide, dtype)
    assert got.dtype == dtype.storage
    np.testing.assert_array_equal(np.isnan(decode(got, dtype)), expected_nan)
    np.testing.assert_array_equal(bits_of(got)[~expected_nan], expected_bits[~expected_nan])


@pytest.mark.parametrize("dtype", NARROW, ids=str)
def test_decode_matches_torch_on_every_bit_pattern(backend, dtype):
    codes, expected = torch_codes(dtype)
    got = backend.decode(codes.view(dtype.storage), dtype)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    keep = ~np.isnan(expected)
    np.testing.assert_array_equal(got[keep].astype(np.float32).view(np.uint32), expected[keep].view(np.uint32))


def test_saturation_and_canonical_nans(backend):
    x = np.array([np.inf, -np.inf, 1e6, -1e6, np.nan, -np.nan])
    assert bits_of(backend.encode(x, dtypes.float8_e4m3)).tolist() == [0x78, 0xF8, 0x78, 0xF8, 0x7C, 0x7C]
    assert bits_of(backend.encode(x, dtypes.float8_e4m3fn)).tolist() == [0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7F]
    assert bits_of(backend.encode(x, dtypes.float8_e5m2)).tolist() == [0x7C, 0xFC, 0x7C, 0xFC, 0x7F, 0x7F]
    assert bits_of(backend.encode(x, dtypes.float16)).tolist() == [0x7C00, 0xFC00, 0x7C00, 0xFC00, 0x7E00, 0x7E00]
    assert bits_of(backend.encode(x, dtypes.bfloat16)).tolist() == [0x7F80, 0xFF80, 0x4974, 0xC974, 0x7FC0, 0x7FC0]
    assert bits_of(backend.encode(x, dtypes.float32))[4:].tolist() == [0x7FC00000, 0x7FC00000]


def test_float32_rounds_to_nearest_even(backend):
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(10_000) * 2.0 ** rng.uniform(-160, 130, 10_000), [1e39, -1e39, 1e-46]])
    with np.errstate(over="ignore"):
        expected = x.astype(np.float32)
    np.testing.assert_array_equal(bits_of(backend.encode(x, dtypes.float32)), bits_of(expected))
    np.testing.assert_array_equal(backend.decode(expected, dtypes.float32), expected.astype(np.float64))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_floats_round_through_float32_first(backend, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(20_000) * 2.0 ** rng.uniform(-30, 15, 20_000)
    np.testing.assert_array_equal(bits_of(backend.encode(x, dtype)),
                                  bits_of(backend.encode(x.astype(np.float32).astype(np.float64), dtype)))
    # 1 + 2^-8 + 2^-30 is above the bf16 midpoint 1 + 2^-8, but float32 rounds it onto the
    # midpoint, and the midpoint rounds to the even 1.0.
    assert bits_of(backend.encode(np.array([1 + 2**-8 + 2**-30]), dtypes.bfloat16)).tolist() == [0x3F80]


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integers_round_half_even_and_saturate(backend, dtype):
    lo, hi = dtypes.int_range(dtype)
    rng = np.random.default_rng(4)
    x = np.concatenate([np.arange(-6, 6) + 0.5, rng.uniform(lo - 1000, hi + 1000, 2000), rng.uniform(-3, 3, 200),
                        [np.nan, np.inf, -np.inf, lo - 0.5, hi + 0.5, -0.0, 1e300]])
    expected = [0 if math.isnan(v) else min(max(round(v), lo), hi) if math.isfinite(v) else (hi if v > 0 else lo) for v in x]
    got = backend.encode(x, dtype)
    assert got.dtype == dtype.storage
    assert got.tolist() == expected
    np.testing.assert_array_equal(backend.decode(got, dtype), np.array(expected, dtype=np.float64))


def test_kernels_keep_the_shape_of_their_operands(backend):
    for dtype in dtypes.ALL:
        for shape in [(), (3,), (2, 3, 4)]:
            stored = backend.encode(np.full(shape, 1.5), dtype)
            assert stored.shape == shape and backend.decode(stored, dtype).shape == shape
    assert backend.alu(np.float64(2.0), np.float64(3.0), AluOp.POW).shape == ()
    assert backend.alu(np.zeros((4, 1)), np.zeros((4, 5)), AluOp.ADD).shape == (4, 5)


def test_decode_rejects_the_wrong_storage_type(backend):
    with pytest.raises(ProgramError,
                       match="bfloat16 values are stored as uint16, got an array of float32; encode the values first"):
        backend.decode(np.zeros(3, np.float32), dtypes.bfloat16)


# -- kernels against numpy and torch --------------------------------------


def _torch(fn):
    return lambda z: fn(torch.from_numpy(z)).numpy()


EXPECTED_ACTIVATION = {
    ActivationFunc.IDENTITY: lambda z: z,
    ActivationFunc.EXP: np.exp,
    ActivationFunc.LOG: np.log,
    ActivationFunc.SQRT: np.sqrt,
    ActivationFunc.RSQRT: lambda z: 1.0 / np.sqrt(z),
    ActivationFunc.RECIPROCAL: lambda z: 1.0 / z,
    ActivationFunc.TANH: np.tanh,
    ActivationFunc.SIGMOID: _torch(torch.sigmoid),
    ActivationFunc.RELU: lambda z: np.maximum(z, 0.0),
    ActivationFunc.GELU: _torch(F.gelu),
    ActivationFunc.GELU_TANH: _torch(lambda t: F.gelu(t, approximate="tanh")),
    ActivationFunc.SILU: _torch(F.silu),
    ActivationFunc.SQUARE: np.square,
    ActivationFunc.ABS: np.abs,
    ActivationFunc.SOFTPLUS: lambda z: np.logaddexp(0.0, z),
    ActivationFunc.SIN: np.sin,
    ActivationFunc.COS: np.cos,
    ActivationFunc.ERF: _torch(torch.special.erf),
    ActivationFunc.SIGN: np.sign,
    ActivationFunc.GELU_DX: _torch(lambda t: torch.ops.aten.gelu_backward(torch.ones_like(t), t)),
    ActivationFunc.SILU_DX: _torch(lambda t: torch.ops.aten.silu_backward(torch.ones_like(t), t)),
    ActivationFunc.GELU_APPRX_SIGMOID: _torch(lambda t: t * torch.sigmoid(1.702 * t)),
}


def special_values(shape, rng):
    """Random values of every magnitude with infinities, NaN, zeros and overflow thresholds among them."""
    v = rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e308, -1e308, 5e-324, 710.0, -710.0, 1.0, -1.0, 0.5, 2.0, -3.0]
    v.reshape(-1)[: len(specials)] = specials
    return v


@pytest.mark.parametrize("func", list(ActivationFunc), ids=lambda f: f.value)
def test_activation_matches_numpy(backend, func):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 300)) * 4
    scale = rng.standard_normal(16)
    bias = rng.standard_normal(16)
    scale[0] = bias[0] = 0.0  # a row of exact zeros
    # a zero bias adds nothing: -0 (negative x times a zero scale) stays -0
    z = np.where(bias[:, None] == 0.0, x * scale[:, None], x * scale[:, None] + bias[:, None])
    with np.errstate(all="ignore"):
        expected = EXPECTED_ACTIVATION[func](z)
    got = backend.activation(x, func, scale, bias)
    # Cancellation in 1 + erf / 1 + tanh far left of zero leaves tiny absolute errors.
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def same_float64(a: np.ndarray, b: np.ndarray) -> None:
    """Equal bits, except that any two NaNs count as equal (encode makes every NaN one pattern)."""
    nan = np.isnan(a)
    np.testing.assert_array_equal(nan, np.isnan(b))
    np.testing.assert_array_equal(a[~nan].view(np.uint64), b[~nan].view(np.uint64))


def test_activation_backends_agree_on_every_value():
    ref, fast = get_backend("numpy"), get_backend("numba")
    rng = np.random.default_rng(6)
    x = special_values((32, 400), rng)
    scale = rng.standard_normal(32)
    bias = rng.standard_normal(32)
    scale[0], bias[0] = 1.0, 0.0
    for func in ActivationFunc:
        same_float64(ref.activation(x, func, scale, bias), fast.activation(x, func, scale, bias))


EXPECTED_ALU = {
    AluOp.ADD: np.add, AluOp.SUBTRACT: np.subtract, AluOp.MULTIPLY: np.multiply, AluOp.DIVIDE: np.divide,
    AluOp.MAXIMUM: np.maximum, AluOp.MINIMUM: np.minimum, AluOp.POW: np.power,
    AluOp.ABS_DIFF: lambda a, b: np.abs(a - b),
    AluOp.IS_EQUAL: lambda a, b: (a == b) * 1.0, AluOp.NOT_EQUAL: lambda a, b: (a != b) * 1.0,
    AluOp.IS_GT: lambda a, b: (a > b) * 1.0, AluOp.IS_GE: lambda a, b: (a >= b) * 1.0,
    AluOp.IS_LT: lambda a, b: (a < b) * 1.0, AluOp.IS_LE: lambda a, b: (a <= b) * 1.0,
    AluOp.BYPASS: lambda a, b: np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)),
    AluOp.BITWISE_AND: lambda a, b: _ints(np.bitwise_and, a, b), AluOp.BITWISE_OR: lambda a, b: _ints(np.bitwise_or, a, b),
    AluOp.BITWISE_XOR: lambda a, b: _ints(np.bitwise_xor, a, b),
    AluOp.LEFT_SHIFT: lambda a, b: _ints(np.left_shift, a, np.clip(b, 0, 63)),
    AluOp.RIGHT_SHIFT: lambda a, b: _ints(np.right_shift, a, np.clip(b, 0, 63)),
}


def _ints(fn, a, b):
    """``fn`` on ``a`` and ``b`` truncated to int64 (NaN as 0), as float64."""
    return fn(np.trunc(np.nan_to_num(a)).astype(np.int64), np.trunc(np.nan_to_num(b)).astype(np.int64)).astype(np.float64)


def alu_inputs(rng):
    a = rng.standard_normal((16, 200)) * 3
    b = rng.standard_normal((16, 200)) * 3
    b[:, :40] = np.round(b[:, :40])  # integer exponents for negative bases
    b[:, 40:60] = a[:, 40:60]  # equal operands
    b[0, 60:70] = 0.0  # division by zero
    a[0, 65:70] = 0.0
    a[1, 0:5] = np.nan
    b[1, 5:10] = np.nan
    return a, b


@pytest.mark.parametrize("op", list(AluOp), ids=lambda o: o.value)
def test_alu_matches_numpy(backend, op):
    a, b = alu_inputs(np.random.default_rng(7))
    column = b[:, :1]
    for other in (b, column):
        with np.errstate(all="ignore"):
            expected = np.broadcast_to(EXPECTED_ALU[op](a, other), a.shape)
        got = backend.alu(a, other, op)
        if op is AluOp.POW:  # numpy's vectorised pow may differ from C's in the last bit
            np.testing.assert_allclose(got, expected, rtol=1e-14)
        else:
            np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(backend.alu(column, a, AluOp.SUBTRACT), column - a)


def test_alu_backends_agree_on_every_value():
    ref, fast = get_backend("numpy"), get_backend("numba")
    rng = np.random.default_rng(8)
    a = special_values((16, 300), rng)
    b = np.concatenate([special_values((16, 150), rng), np.round(special_values((16, 150), rng))], axis=1)
    b[:, 200:215] = a[0, :15]  # every pair of special values meets
    for op in AluOp:
        same_float64(ref.alu(a, b, op), fast.alu(a, b, op))
        same_float64(ref.alu(a, b[:, :1], op), fast.alu(a, b[:, :1], op))


def test_alu_rejects_shapes_that_do_not_broadcast(backend):
    with pytest.raises(ProgramError, match=r"shapes \[4, 3\] and \[4, 2\] do not broadcast"):
        backend.alu(np.zeros((4, 3)), np.zeros((4, 2)), AluOp.ADD)


def test_reduce_add_accumulates_in_float32_in_order(backend):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((8, 300)) * 10.0 ** rng.integers(-3, 7, (8, 300))
    expected = []
    for row in x:
        acc = np.float32(row[0])
        for v in row[1:]:
            acc = np.float32(acc + np.float32(v))
        expected.append(float(acc))
    assert backend.reduce(x, ReduceOp.ADD).tolist() == expected


def test_reduce_max_min_propagate_nan(backend):
    rng = np.random.default_rng(10)
    x = special_values((8, 50), rng)
    x[3, 7] = np.nan
    for op, fn in ((ReduceOp.MAX, np.max), (ReduceOp.MIN, np.min)):
        np.testing.assert_array_equal(backend.reduce(x, op), fn(x, axis=1))
    same_float64(get_backend("numpy").reduce(x, ReduceOp.ADD), get_backend("numba").reduce(x, ReduceOp.ADD))


def test_matmul_is_exact_on_small_integers_and_close_on_floats(backend):
    rng = np.random.default_rng(11)
    s = rng.integers(-8, 8, (128, 64)).astype(np.float64)
    m = rng.integers(-8, 8, (128, 96)).astype(np.float64)
    acc = rng.integers(-100, 100, (64, 96)).astype(np.float32)
    np.testing.assert_array_equal(backend.matmul(acc, s, m), acc + s.T @ m)
    s = rng.standard_normal((128, 64)).astype(np.float32).astype(np.float64)
    m = rng.standard_normal((128, 96)).astype(np.float32).astype(np.float64)
    got = backend.matmul(acc, s, m)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, acc + s.T @ m, rtol=0,
                               atol=128 * 2**-23 * float(np.max(np.abs(acc) + np.abs(s).T @ np.abs(m))))
    assert get_backend("numpy").matmul(acc, s, m).tobytes() == get_backend("numba").matmul(acc, s, m).tobytes()


def _bf16(a):
    return decode(encode(np.asarray(a, np.float64), dtypes.bfloat16), dtypes.bfloat16)


@pytest.mark.parametrize("case", ["bf16", "bf16 huge", "bf16 tiny", "bf16 overflowing", "fp16 wide", "mixed fp32",
                                  "zeros", "nan", "cancelling"])
def test_matmul_float32_fast_path_gives_the_reference_bits(case):
    """The numba backend multiplies operands whose products are exact in float32 (bf16,
    fp16, fp8 values in float32's normal range) in float32; elsewhere in float64. Either
    way its bits are the reference's, on operands chosen to sit at the edges."""
    rng = np.random.default_rng(17)
    s, m = rng.standard_normal((128, 64)), rng.standard_normal((128, 96))
    acc = rng.standard_normal((64, 96)).astype(np.float32)
    if case == "bf16 huge":        # products near float32's largest
        s, m = s * 2.0 ** 60, m * 2.0 ** 60
    elif case == "bf16 tiny":      # products below float32's normal range
        s, m = s * 2.0 ** -70, m * 2.0 ** -70
        acc = acc * np.float32(2.0 ** -130)
    elif case == "bf16 overflowing":   # products past float32's largest, against a huge accumulator
        s, m = s * 2.0 ** 64, m * 2.0 ** 64
        acc = np.full((64, 96), -3.0e38, np.float32)
    elif case == "fp16 wide":
        s, m = s.astype(np.float16).astype(np.float64), m.astype(np.float16).astype(np.float64)
    elif case == "mixed fp32":     # one float32 value keeps the whole matmul in float64
        s[3, 5] = 0.1
    elif case == "zeros":
        s = np.zeros_like(s)
    elif case == "nan":
        m[7, 2] = np.nan
    elif case == "cancelling":     # large products cancelling, a small one left
        s[:, :] = 1.0
        m[0::2, :], m[1::2, :] = 2.0 ** 30, -(2.0 ** 30)
        m[5, :] = 3.0
    if case != "mixed fp32":
        s, m = _bf16(s) if case != "fp16 wide" else s, _bf16(m) if case != "fp16 wide" else m
    ref = get_backend("numpy").matmul(acc, s, m)
    fast = get_backend("numba").matmul(acc, s, m)
    assert ref.tobytes() == fast.tobytes()


# -- instructions: whole Programs on both backends ------------------------


def add(p: Program, inst: Instruction) -> int:
    """Append ``inst`` depending on the instruction before it."""
    if len(p):
        inst.deps = (len(p) - 1,)
    return p.add(inst)


def dma(p: Program, dst, src) -> int:
    return p.dma(dst, src, queue=0, deps=(len(p) - 1,) if len(p) else ())


def run_both(p: Program, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``p`` on both backends; require identical output bytes; return the outputs."""
    machines = {}
    for name in BACKENDS:
        m = Machine(p, backend=name)
        for t in p.inputs:
            m.bind(t, inputs[t.name])
        m.run()
        machines[name] = m
    ref, fast = machines["numpy"], machines["numba"]
    for t in p.outputs:
        assert ref.read_raw(t.view()).tobytes() == fast.read_raw(t.view()).tobytes(), f"backends disagree on {t!r}"
    return {t.name: fast.result(t) for t in p.outputs}


def rounded(values: np.ndarray, dtype) -> np.ndarray:
    """``values`` as stored in ``dtype`` and read back (float64)."""
    return decode(encode(values, dtype), dtype)


def sample(dtype, shape, rng) -> np.ndarray:
    if dtype.is_float:
        return rng.standard_normal(shape) * 4
    lo, hi = dtypes.int_range(dtype)
    return rng.integers(max(lo, -1000), min(hi, 1000), shape, endpoint=True).astype(np.float64)


@pytest.mark.parametrize("dtype", dtypes.ALL, ids=str)
def test_dma_copies_bits_through_strided_and_reshaped_views(dtype):
    p = Program("trn1")
    a = p.hbm([128, 64], dtype, "a", kind="input")
    flat = p.hbm([32 * 64], dtype, "flat", kind="input")
    odd = p.hbm([128, 32], dtype, "odd", kind="output")
    back = p.hbm([32, 64], dtype, "back", kind="output")
    s = p.sbuf([128, 64], dtype, "s")
    high = p.sbuf([32, 64], dtype, "high", start_partition=64)
    dma(p, s, a)
    dma(p, odd, s[:, 1::2])
    dma(p, high, flat)
    dma(p, back, high)
    rng = np.random.default_rng(12)
    inputs = {"a": sample(dtype, (128, 64), rng), "flat": sample(dtype, (32 * 64,), rng)}
    out = run_both(p, inputs)
    expected_dtype = np.float32 if dtype.is_float else dtype.storage
    assert out["odd"].dtype == expected_dtype
    np.testing.assert_array_equal(out["odd"], rounded(inputs["a"], dtype)[:, 1::2])
    np.testing.assert_array_equal(out["back"], rounded(inputs["flat"], dtype).reshape(32, 64))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_matmul_accumulates_two_k_tiles(dtype):
    p = Program("trn1")
    lhs_t = p.hbm([256, 128], dtype, "lhsT", kind="input")
    rhs = p.hbm([256, 512], dtype, "rhs", kind="input")
    out = p.hbm([128, 512], dtypes.float32, "out", kind="output")
    sl = [p.sbuf([128, 128], dtype, f"l{k}") for k in range(2)]
    sr = [p.sbuf([128, 512], dtype, f"r{k}") for k in range(2)]
    acc = p.psum([128, 512], dtypes.float32, "acc")
    so = p.sbuf([128, 512], dtypes.float32, "so")
    for k in range(2):
        dma(p, sl[k], lhs_t[128 * k:128 * (k + 1), :])
        dma(p, sr[k], rhs[128 * k:128 * (k + 1), :])
    for k in range(2):
        p.matmul(acc.view(), sl[k].view(), sr[k].view(), accumulate=k > 0, deps=(len(p) - 1,))
    add(p, TensorCopy(so.view(), acc.view(), engine=Engine.VECTOR))
    dma(p, out, so)
    rng = np.random.default_rng(13)
    inputs = {"lhsT": rng.standard_normal((256, 128)), "rhs": rng.standard_normal((256, 512))}
    got = run_both(p, inputs)["out"]
    a, b = rounded(inputs["lhsT"], dtype), rounded(inputs["rhs"], dtype)
    bound = 256 * 2**-23 * (np.abs(a).T @ np.abs(b))
    assert np.all(np.abs(got - a.T @ b) <= bound)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16, dtypes.float8_e5m2], ids=str)
def test_transpose_is_exact(dtype):
    p = Program("trn1")
    a = p.hbm([64, 128], dtype, "a", kind="input")
    out = p.hbm([128, 64], dtype, "out", kind="output")
    s = p.sbuf([64, 128], dtype, "s")
    t = p.psum([128, 64], dtype, "t")
    so = p.sbuf([128, 64], dtype, "so")
    dma(p, s, a)
    add(p, Transpose(t.view(), s.view(), engine=Engine.TENSOR))
    add(p, TensorCopy(so.view(), t.view(), engine=Engine.VECTOR))
    dma(p, out, so)
    x = np.random.default_rng(14).standard_normal((64, 128))
    np.testing.assert_array_equal(run_both(p, {"a": x})["out"], rounded(x, dtype).T)


# Spacing of each dtype's values relative to their size, and between its denormals.
RELATIVE_STEP = {dtypes.float32: 2**-23, dtypes.bfloat16: 2**-7, dtypes.float16: 2**-10,
                 dtypes.float8_e4m3: 2**-3, dtypes.float8_e4m3fn: 2**-3, dtypes.float8_e5m2: 2**-2}
DENORMAL_STEP = {dtypes.float32: 2**-149, dtypes.bfloat16: 2**-133, dtypes.float16: 2**-24,
                 dtypes.float8_e4m3: 2**-9, dtypes.float8_e4m3fn: 2**-9, dtypes.float8_e5m2: 2**-16}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("func,reduce_op", [(ActivationFunc.GELU, ReduceOp.ADD), (ActivationFunc.EXP, ReduceOp.MAX),
                                            (ActivationFunc.TANH, ReduceOp.MIN)], ids=lambda v: v.value)
def test_activation_rounds_to_dst_and_reduces_what_it_wrote(dtype, func, reduce_op):
    p = Program("trn1")
    x = p.hbm([128, 96], dtypes.float32, "x", kind="input")
    bs = p.hbm([128, 2], dtypes.float32, "bs", kind="input")
    y = p.hbm([128, 96], dtype, "y", kind="output")
    r = p.hbm([128, 1], dtypes.float32, "r", kind="output")
    sx, sbs = p.sbuf([128, 96], dtypes.float32, "sx"), p.sbuf([128, 2], dtypes.float32, "sbs")
    sy, sr = p.sbuf([128, 96], dtype, "sy"), p.sbuf([128, 1], dtypes.float32, "sr")
    dma(p, sx, x)
    dma(p, sbs, bs)
    add(p, Activation(sy.view(), sx.view(), func, bias=sbs[:, 0:1], scale=sbs[:, 1:2], reduce_op=reduce_op,
                      reduce_dst=sr.view(), engine=Engine.SCALAR))
    dma(p, y, sy)
    dma(p, r, sr)
    rng = np.random.default_rng(15)
    inputs = {"x": rng.standard_normal((128, 96)), "bs": rng.uniform(-1, 1, (128, 2))}
    got = run_both(p, inputs)
    xv, bias, scale = rounded(inputs["x"], dtypes.float32), *rounded(inputs["bs"], dtypes.float32).T
    expected = EXPECTED_ACTIVATION[func](xv * scale[:, None] + bias[:, None])
    np.testing.assert_allclose(got["y"], expected, rtol=RELATIVE_STEP[dtype], atol=DENORMAL_STEP[dtype])
    reduce_fn = {ReduceOp.ADD: np.sum, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min}[reduce_op]
    np.testing.assert_allclose(got["r"][:, 0], reduce_fn(got["y"].astype(np.float64), axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", list(AluOp), ids=lambda o: o.value)
def test_tensor_tensor_mixed_dtypes(op):
    p = Program("trn1")
    a = p.hbm([128, 64], dtypes.bfloat16, "a", kind="input")
    b = p.hbm([128, 64], dtypes.float32, "b", kind="input")
    out = p.hbm([128, 64], dtypes.float32, "out", kind="output")
    sa, sb = p.sbuf([128, 64], dtypes.bfloat16, "sa"), p.sbuf([128, 64], dtypes.float32, "sb")
    so = p.sbuf([128, 64], dtypes.float32, "so")
    dma(p, sa, a)
    dma(p, sb, b)
    add(p, TensorTensor(so.view(), sa.view(), sb.view(), op, engine=Engine.VECTOR))
    dma(p, out, so)
    rng = np.random.default_rng(16)
    inputs = {"a": np.abs(rng.standard_normal((128, 64))) + 0.1, "b": rng.standard_normal((128, 64))}
    inputs["b"][:, :8] = inputs["a"][:, :8]  # some equal operands
    av, bv = rounded(inputs["a"], dtypes.bfloat16), rounded(inputs["b"], dtypes.float32)
    with np.errstate(all="ignore"):
        expected = EXPECTED_ALU[op](av, bv).astype(np.float32)
    got = run_both(p, inputs)["out"]
    if op is AluOp.POW:
        np.testing.assert_allclose(got, expected, rtol=2**-23)
    else:
        np.testing.assert_array_equal(got, expected)


def test_tensor_scalar_reverse_and_second_op():
    p = Program("trn1")
    x = p.hbm([128, 40], dtypes.float16, "x", kind="input")
    c = p.hbm([128, 1], dtypes.float32, "c", kind="input")
    out = p.hbm([128, 40], dtypes.float32, "out", kind="output")
    sx, sc = p.sbuf([128, 40], dtypes.float16, "sx"), p.sbuf([128, 1], dtypes.float32, "sc")
    so = p.sbuf([128, 40], dtypes.float32, "so")
    dma(p, sx, x)
    dma(p, sc, c)
    add(p, TensorScalar(so.view(), sx.view(), AluOp.SUBTRACT, sc.view(), AluOp.MULTIPLY, 2.5, reverse0=True,
                        engine=Engine.VECTOR))
    dma(p, out, so)
    rng = np.random.default_rng(17)
    inputs = {"x": rng.standard_normal((128, 40)), "c": rng.standard_normal((128, 1))}
    xv, cv = rounded(inputs["x"], dtypes.float16), rounded(inputs["c"], dtypes.float32)
    np.testing.assert_array_equal(run_both(p, inputs)["out"], ((cv - xv) * 2.5).astype(np.float32))


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.value)
@pytest.mark.parametrize("num_axes", [1, 2])
def test_tensor_reduce_last_axes(op, num_axes):
    p = Program("trn1")
    x = p.hbm([128, 4, 32], dtypes.bfloat16, "x", kind="input")
    kept = 4 if num_axes == 1 else 1
    out = p.hbm([128, kept], dtypes.float32, "out", kind="output")
    sx, so = p.sbuf([128, 4, 32], dtypes.bfloat16, "sx"), p.sbuf([128, kept], dtypes.float32, "so")
    dma(p, sx, x)
    add(p, TensorReduce(so.view(), sx.view(), op, num_axes, engine=Engine.VECTOR))
    dma(p, out, so)
    inputs = {"x": np.random.default_rng(18).standard_normal((128, 4, 32))}
    xv = rounded(inputs["x"], dtypes.bfloat16).reshape(128, kept, -1)
    fn = {ReduceOp.ADD: np.sum, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min}[op]
    np.testing.assert_allclose(run_both(p, inputs)["out"], fn(xv, axis=2), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16], ids=str)
def test_bn_stats_and_bn_aggr_give_mean_and_variance(dtype):
    p = Program("trn1")
    x = p.hbm([128, 1536], dtype, "x", kind="input")
    out = p.hbm([128, 2], dtypes.float32, "out", kind="output")
    sx, stats = p.sbuf([128, 1536], dtype, "sx"), p.sbuf([128, 18], dtypes.float32, "st")
    res = p.sbuf([128, 2], dtypes.float32, "r")
    dma(p, sx, x)
    for c in range(3):
        add(p, BnStats(stats[:, 6 * c:6 * c + 6], sx[:, 512 * c:512 * (c + 1)], engine=Engine.VECTOR))
    add(p, BnAggr(res.view(), stats.view(), engine=Engine.VECTOR))
    dma(p, out, res)
    inputs = {"x": np.random.default_rng(21).standard_normal((128, 1536)) * 3 + 2}
    xv = rounded(inputs["x"], dtype)
    got = run_both(p, inputs)["out"]
    np.testing.assert_allclose(got[:, 0], xv.mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(got[:, 1], xv.var(axis=1), rtol=1e-5)


def test_bn_kernels_backends_agree(backend):
    x = np.random.default_rng(22).standard_normal((16, 300)) * 1e3
    stats = backend.bn_stats(x)
    np.testing.assert_array_equal(stats, get_backend("numpy").bn_stats(x))
    chunks = np.stack([backend.bn_stats(x[:, :100]), backend.bn_stats(x[:, 100:])], axis=1)
    np.testing.assert_array_equal(backend.bn_aggr(chunks), get_backend("numpy").bn_aggr(chunks))
    np.testing.assert_allclose(backend.bn_aggr(chunks), np.stack([x.mean(1), x.var(1)], axis=1), rtol=1e-9)


@pytest.mark.parametrize("src_dtype", dtypes.ALL, ids=str)
def test_tensor_copy_converts_to_every_dtype(src_dtype):
    p = Program("trn1")
    x = p.hbm([32, 48], src_dtype, "x", kind="input")
    sx = p.sbuf([32, 48], src_dtype, "sx")
    dma(p, sx, x)
    for dst_dtype in dtypes.ALL:
        sd = p.sbuf([32, 2, 24], dst_dtype, f"s_{dst_dtype}")
        add(p, TensorCopy(sd.view(), sx.view(), engine=Engine.VECTOR))
        dma(p, p.hbm([32, 2, 24], dst_dtype, f"o_{dst_dtype}", kind="output"), sd)
    rng = np.random.default_rng(19)
    values = rng.standard_normal((32, 48)) * 10.0 ** rng.integers(-2, 6, (32, 48))
    if not src_dtype.is_float:   # inputs hold only the dtype's values (bind refuses others)
        info = np.iinfo(src_dtype.storage)
        values = np.clip(np.round(values), info.min, info.max)
    got = run_both(p, {"x": values})
    for dst_dtype in dtypes.ALL:
        expected = rounded(rounded(values, src_dtype), dst_dtype).reshape(32, 2, 24)
        np.testing.assert_array_equal(got[f"o_{dst_dtype}"],
                                      expected.astype(np.float32 if dst_dtype.is_float else dst_dtype.storage))


def test_memset_iota_select_and_affine_select():
    p = Program("trn1")
    mask = p.hbm([64, 64], dtypes.uint8, "mask", kind="input")
    x = p.hbm([64, 64], dtypes.float32, "x", kind="input")
    outs = {name: p.hbm([64, 64], dt, name, kind="output") for name, dt in
            (("ms", dtypes.int8), ("io", dtypes.int32), ("iof", dtypes.bfloat16), ("sel", dtypes.float32),
             ("causal", dtypes.float32))}
    smask, sx = p.sbuf([64, 64], dtypes.uint8, "smask"), p.sbuf([64, 64], dtypes.float32, "sx")
    s = {name: p.sbuf([64, 64], t.dtype, f"s_{name}") for name, t in outs.items()}
    dma(p, smask, mask)
    dma(p, sx, x)
    add(p, Memset(s["ms"].view(), -1.5, engine=Engine.VECTOR))
    add(p, Iota(s["io"].view(), steps=(-3,), offset=7, channel_multiplier=100, engine=Engine.GPSIMD))
    add(p, Iota(s["iof"][:, 0:64:2], steps=(1,), offset=0, channel_multiplier=1, engine=Engine.GPSIMD))
    add(p, Select(s["sel"].view(), smask.view(), sx.view(), -9.0, engine=Engine.VECTOR))
    add(p, AffineSelect(s["causal"].view(), sx.view(), steps=(-1,), channel_multiplier=1, cmp=AluOp.IS_GE,
                        fill=-30000.0, engine=Engine.GPSIMD))
    add(p, SemaphoreSignal("done", engine=Engine.GPSIMD))
    add(p, SemaphoreWait("done", 1, engine=Engine.VECTOR))
    for name, t in outs.items():
        dma(p, t, s[name])
    rng = np.random.default_rng(20)
    inputs = {"mask": rng.integers(0, 2, (64, 64)), "x": rng.standard_normal((64, 64))}
    got = run_both(p, inputs)
    xv = rounded(inputs["x"], dtypes.float32)
    part, free = np.arange(64)[:, None], np.arange(64)[None, :]
    assert np.all(got["ms"] == -2)  # -1.5 rounds half to even
    np.testing.assert_array_equal(got["io"], 7 + 100 * part - 3 * free)
    iof = np.zeros((64, 64), np.float32)
    iof[:, 0::2] = part + np.arange(32)[None, :]
    np.testing.assert_array_equal(got["iof"], iof)
    np.testing.assert_array_equal(got["sel"], np.where(inputs["mask"] != 0, xv, -9.0))
    np.testing.assert_array_equal(got["causal"], np.where(part >= free, xv, -30000.0))


# -- Machine: memory layout and errors -----------------------------------


def small_program():
    p = Program("trn1")
    a = p.hbm([128, 16], dtypes.bfloat16, "a", kind="input")
    s = p.sbuf([128, 16], dtypes.bfloat16, "s")
    return p, a, s


def test_tensors_sharing_partitions_do_not_overlap():
    p = Program("trn1")
    first = p.sbuf([128, 3], dtypes.int8, "first")
    second = p.sbuf([128, 5], dtypes.float32, "second")
    m = Machine(p, backend="numpy")
    m.write(first.view(), np.full((128, 3), 7.0))
    m.write(second.view(), np.full((128, 5), -1.0))
    assert second.byte_offset >= 3
    np.testing.assert_array_equal(m.result(first), np.full((128, 3), 7, np.int8))
    np.testing.assert_array_equal(m.result(second), np.full((128, 5), -1.0, np.float32))


def test_bind_rejects_a_wrong_shape_and_non_numbers():
    p, a, _ = small_program()
    m = Machine(p, backend="numpy")
    with pytest.raises(ProgramError, match=r"bind hbm:a\[128, 16\]:bfloat16: the array has shape \[16, 128\] "
                                           r"but the tensor has shape \[128, 16\]"):
        m.bind(a, np.zeros((16, 128)))
    with pytest.raises(ProgramError, match="cannot load an array of <U1; pass real numbers"):
        m.bind(a, np.full((128, 16), "x"))


def test_views_outside_their_tensor_are_refused():
    p, a, s = small_program()
    m = Machine(p, backend="numpy")
    with pytest.raises(ProgramError, match=r"view sbuf:s@0\[128, 17\]:bfloat16 reaches elements 0..16 "
                                           r"but each partition of the tensor holds 16"):
        m.read(View(s, 0, ((16, 128), (1, 17))))
    with pytest.raises(ProgramError, match=r"covers partitions 100..131 of sbuf:s\[128, 16\]:bfloat16, which has 128"):
        m.read(View(s, 1600, ((16, 32), (1, 16))))
    with pytest.raises(ProgramError,
                       match=r"view hbm:a@2040\[16\]:bfloat16 reaches elements 2040..2055 but the tensor holds 2048"):
        m.write(View(a, 2040, ((1, 16),)), np.zeros(16))
    with pytest.raises(ProgramError, match="belongs to no tensor of program"):
        m.read(Program("trn1").sbuf([4, 4], dtypes.float32, "elsewhere").view())
    with pytest.raises(ProgramError,
                       match=r"values of shape \[3\] do not match sbuf:s@0\[128, 16\]:bfloat16 of shape \[128, 16\]"):
        m.write(s.view(), np.zeros(3))


def test_multiply_without_stationary_names_the_instruction():
    p = Program("trn1")
    s = p.sbuf([128, 64], dtypes.bfloat16, "s")
    acc = p.psum([64, 64], dtypes.float32, "acc")
    p.matmul(acc.view(), s.view(), s.view())
    m = Machine(p, backend="numpy")
    with pytest.raises(ProgramError, match="instruction 1 multiply_moving: no load_stationary has run"):
        m.execute(p.instructions[1])


def test_unknown_backend():
    with pytest.raises(ProgramError, match="unknown compute backend 'cuda'; use one of: numpy, numba"):
        get_backend("cuda")


def test_import_trnsim_does_not_import_numba():
    code = "import sys, trnsim, trnsim.compute; assert 'numba' not in sys.modules, 'numba imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
