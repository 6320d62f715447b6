"""nl bitwise and shift ops, nl.prelu and nl.gather_flattened: values against numpy."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.isa import AluOp
from trnsim.nki import KernelError
from trnsim.nki.isa import _common

RNG = np.random.default_rng(23)


def ints(shape, low=-1000, high=1000, dtype=np.int32):
    return RNG.integers(low, high, shape).astype(dtype)


def _binary_kernel(fn):
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, fn(nl.load(a), nl.load(b)))
        return out

    return k


@pytest.mark.parametrize("name, ref", [
    ("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or), ("bitwise_xor", np.bitwise_xor),
])
def test_bitwise_tile_tile_int32(name, ref):
    a, b = ints((16, 32)), ints((16, 32))
    np.testing.assert_array_equal(_binary_kernel(getattr(nl, name))(a, b), ref(a, b))


@pytest.mark.parametrize("name, ref", [("left_shift", np.left_shift), ("right_shift", np.right_shift)])
def test_shifts_int32(name, ref):
    a, s = ints((16, 32)), ints((16, 32), 0, 8)
    np.testing.assert_array_equal(_binary_kernel(getattr(nl, name))(a, s), ref(a, s))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32])
@pytest.mark.parametrize("name, ref", [("left_shift", np.left_shift), ("right_shift", np.right_shift)])
def test_shifts_wrap_to_the_dtype_as_numpy(dtype, name, ref):
    # Bits shifted out are dropped (two's-complement wrap), never saturated; shifts by the
    # width or more give 0 (or -1 for a negative value shifted right), as numpy does.
    info = np.iinfo(dtype)
    a = np.array([[info.max, info.min, 1, info.max // 2 + 1, 3, 100, info.max, info.min]], dtype=dtype)
    s = np.array([[1, 1, info.bits - 1, 1, info.bits, 2, info.bits + 3, 3]], dtype=dtype)
    np.testing.assert_array_equal(_binary_kernel(getattr(nl, name))(a, s), ref(a, s))


def test_left_shift_of_int8_by_an_int32_column_wraps_to_int32_as_numpy_promotes():
    @nki.jit
    def k(a, s):
        out = nl.ndarray(a.shape, nl.int32, buffer=nl.shared_hbm)
        nl.store(out, nl.left_shift(nl.load(a), nl.load(s), dtype=nl.int32))
        return out

    a = np.array([[100, -100, 5, 64]] * 2, np.int8)
    s = np.array([[2], [26]], np.int32)
    np.testing.assert_array_equal(k(a, s), np.left_shift(a, s))


def test_nisa_tensor_scalar_left_shift_wraps_int8():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nisa.tensor_scalar(nl.load(a), op0=nl.left_shift, operand0=3))
        return out

    a = ints((8, 16), -128, 128, np.int8)
    np.testing.assert_array_equal(k(a), np.left_shift(a, np.int8(3)))


def test_bitwise_with_scalar_and_per_partition_tile():
    @nki.jit
    def k(a, m):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, nl.bitwise_or(nl.right_shift(t, 2), nl.load(m)))
        return out

    a, m = ints((8, 16), 0, 1 << 20), ints((8, 1), 0, 256)
    np.testing.assert_array_equal(k(a, m), (a >> 2) | m)


@pytest.mark.parametrize("dtype", [np.int32, np.int16, np.uint8, np.uint16])
def test_invert(dtype):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.invert(nl.load(a)))
        return out

    info = np.iinfo(dtype)
    a = RNG.integers(max(info.min, -30000), min(info.max, 30000), (8, 24)).astype(dtype)
    np.testing.assert_array_equal(k(a), np.invert(a))


def test_nisa_tensor_tensor_and_tensor_scalar_take_bitwise_ops():
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nisa.tensor_tensor(nl.load(a), nl.load(b), op=nl.bitwise_xor)
        y = nisa.tensor_scalar(x, op0=nl.left_shift, operand0=3, op1=nl.bitwise_and, operand1=0xFFF0)
        nl.store(out, y)
        return out

    a, b = ints((8, 16), 0, 4096), ints((8, 16), 0, 4096)
    np.testing.assert_array_equal(k(a, b), ((a ^ b) << 3) & 0xFFF0)
    assert _common.alu(nl.right_shift) is AluOp.RIGHT_SHIFT


def test_bitwise_refuses_float_tiles():
    k = _binary_kernel(nl.bitwise_and)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(KernelError, match="integer tiles only"):
        k(x, x)


def test_prelu_number_and_per_partition_slope():
    @nki.jit
    def k(x, alpha):
        out1 = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out1, nl.prelu(t, 0.25))
        nl.store(out2, nl.prelu(t, nl.load(alpha)))
        return out1, out2

    x = RNG.standard_normal((16, 32)).astype(np.float32)
    alpha = RNG.uniform(-2.0, 2.0, (16, 1)).astype(np.float32)
    r1, r2 = k(x, alpha)
    np.testing.assert_array_equal(r1, np.where(x >= 0, x, np.float32(0.25) * x))
    np.testing.assert_array_equal(r2, np.where(x >= 0, x, alpha * x))


def test_gather_flattened():
    @nki.jit
    def k(data, idx):
        out = nl.ndarray(idx.shape, data.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.gather_flattened(nl.load(data), nl.load(idx)))
        return out

    data = RNG.standard_normal((16, 4, 8)).astype(np.float32)
    idx = RNG.integers(0, 32, (16, 12)).astype(np.int32)
    want = np.take_along_axis(data.reshape(16, 32), idx, axis=1)
    np.testing.assert_array_equal(k(data, idx), want)


def test_gather_flattened_refuses_float_indices_and_other_axes():
    @nki.jit
    def k(data, idx, axis):
        out = nl.ndarray(idx.shape, data.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.gather_flattened(nl.load(data), nl.load(idx), axis=axis))
        return out

    data = RNG.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(KernelError, match="integer tile"):
        k(data, data, 0)
    with pytest.raises(KernelError, match="axis=1"):
        k(data, np.zeros((4, 8), np.int32), 1)


def test_prelu_as_activation_op():
    @nki.jit
    def k(x, b):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nisa.activation(op=nl.prelu, data=nl.load(x), bias=nl.load(b), scale=2.0, relu_param=0.1))
        return out

    x = RNG.standard_normal((16, 32)).astype(np.float32)
    b = RNG.standard_normal((16, 1)).astype(np.float32)
    z = x * np.float32(2.0) + b
    np.testing.assert_allclose(k(x, b), np.where(z >= 0, z, np.float32(0.1) * z), rtol=1e-6, atol=1e-7)
