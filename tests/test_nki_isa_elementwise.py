"""nki.isa's elementwise instructions (tensor_tensor, tensor_scalar, scalar_tensor_tensor, reciprocal,
tensor_copy, memset) and the engine= argument.

Each is checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.testing import assert_allclose
from tests.nki_isa_support import run

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)
Y = RNG.standard_normal((128, 64)).astype(np.float32)
F32 = np.float32


def test_tensor_tensor_scalar_reduce_copy_memset():
    got = run(lambda x, y: nisa.tensor_tensor(x, y, op=nl.maximum), X, Y)
    np.testing.assert_array_equal(got, np.maximum(X, Y))
    got = run(lambda x: nisa.tensor_scalar(x, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=1.0), X)
    assert_allclose(got, X.astype(np.float64) * 2 + 1, "float32")
    got = run(lambda x: nisa.tensor_scalar(x, op0=nl.subtract, operand0=1.0, reverse0=True), X)
    assert_allclose(got, 1 - X.astype(np.float64), "float32")
    got = run(lambda x: nisa.tensor_reduce(nl.maximum, x, axis=1), X, shape=(128, 1))
    np.testing.assert_array_equal(got[:, 0], X.max(axis=1))
    got = run(lambda x: nisa.tensor_copy(x, dtype=nl.bfloat16), X, dtype=nl.bfloat16)
    import torch
    np.testing.assert_array_equal(got, torch.from_numpy(X).bfloat16().float().numpy())
    got = run(lambda x: nisa.memset((128, 64), 3.5, nl.float32), X)
    assert (got == 3.5).all()


def test_engine_argument():
    x = np.ones((128, 64), np.float32)
    on_gpsimd = nki.benchmark(lambda_kernel := nki.jit(_add_on(nisa.gpsimd_engine)), numerics=False)(x, x)
    on_vector = nki.benchmark(nki.jit(_add_on(nisa.vector_engine)), numerics=False)(x, x)
    assert "gpsimd" in on_gpsimd.busy_pct and "vector" not in on_gpsimd.busy_pct
    assert "vector" in on_vector.busy_pct
    assert lambda_kernel(x, x).sum() == 2 * x.size
    with pytest.raises(nki.KernelError, match="cannot run on the tensor engine"):
        nki.trace_program(nki.jit(_add_on(nisa.tensor_engine)), x, x)


def test_scalar_tensor_tensor_and_reverse():
    got = run(lambda x, y: nisa.scalar_tensor_tensor(data=x, op0=nl.multiply, operand0=2.0, op1=nl.subtract,
                                                     operand1=y, reverse1=True), X, Y)
    np.testing.assert_array_equal(got, Y - (X * F32(2)))

    def dst_style(x, y):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=out, data=x, op0=nl.add, operand0=1.0, op1=nl.maximum, operand1=y)
        return out
    np.testing.assert_array_equal(run(dst_style, X, Y), np.maximum(X + F32(1), Y))


def test_reciprocal_costs_more_than_a_copy():
    got = run(lambda x: nisa.reciprocal(x), X)
    np.testing.assert_array_equal(got, (F32(1) / X))

    @nki.jit
    def k(x, which):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, nisa.reciprocal(t) if which else nisa.tensor_copy(t))
        return out
    recip = nki.benchmark(k, numerics=False)(X, True).latency_ns
    copy = nki.benchmark(k, numerics=False)(X, False).latency_ns
    assert recip > copy


def _add_on(engine):
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nisa.tensor_tensor(nl.load(a), nl.load(b), op=nl.add, engine=engine))
        return out
    return add
