"""nki.isa's scalar engine: activation (bias, scale, reduction), activate2, exponential, and
nki.language's unary math.

Each is checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from trnsim.testing import assert_allclose
from tests.nki_isa_support import run, run_on

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)
F32 = np.float32


def test_activation_with_bias_scale_and_reduce():
    b = RNG.standard_normal((128, 1)).astype(np.float32)

    @nki.jit
    def kernel(x, bias):
        out = nl.ndarray((128, 65), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        bt = nl.load(bias)
        res = nl.ndarray((128, 65), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=res[:, 0:64], op=nl.exp, data=t, bias=bt, scale=0.5, reduce_op=nl.add, reduce_res=res[:, 64:65])
        nl.store(out, value=res)
        return out

    got = kernel(X, b)
    want = np.exp(X.astype(np.float64) * 0.5 + b)
    assert_allclose(got[:, :64], want, "float32")
    assert_allclose(got[:, 64], want.astype(np.float32).sum(axis=1), "float32")


@pytest.mark.parametrize("name, ref", [
    ("exp", np.exp), ("tanh", np.tanh), ("sigmoid", lambda v: 1 / (1 + np.exp(-v))), ("relu", lambda v: np.maximum(v, 0)),
    ("silu", lambda v: v / (1 + np.exp(-v))), ("square", np.square), ("abs", np.abs),
])
def test_unary_math(name, ref):
    got = run(lambda x: getattr(nl, name)(x), X)
    assert_allclose(got, ref(X.astype(np.float64)), "float32")


def test_activate2_scale_bias_then_function():
    b = RNG.standard_normal((128, 1)).astype(np.float32)

    def body(x, bias):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=out, op=nl.exp, data=x, imm0=0.5, imm1=bias, op0=nl.multiply, op1=nl.subtract,
                       reduce_op=nl.add, reduce_res=res)
        return res
    expect = np.exp((X * F32(0.5) - b).astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(run_on("trn3", body, X, b, shape=(128, 1))[:, 0], expect, rtol=1e-5)
    with pytest.raises(KernelError, match="activate2 is available only on NeuronCore-v4"):
        run(body, X, b, shape=(128, 1))


def test_exponential_subtracts_the_max():
    m = X.max(axis=1, keepdims=True)

    def body(x, mx):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=out, src=x, max_value=mx)
        return out
    np.testing.assert_allclose(run(body, X, m), np.exp(X.astype(np.float64) - m), rtol=1e-6)
