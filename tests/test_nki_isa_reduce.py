"""nki.isa's reductions (free axes, across partitions, batch-norm statistics) and nki.language's
reductions, where and broadcasting.

Each is checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from trnsim.testing import assert_allclose
from tests.nki_isa_support import run

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)
Y = RNG.standard_normal((128, 64)).astype(np.float32)
F32 = np.float32


def test_bn_stats_and_aggr_give_mean_and_variance():
    x = RNG.standard_normal((128, 1024)).astype(np.float32) * 3 + 1

    @nki.jit
    def kernel(x):
        out = nl.ndarray((128, 2), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        stats = nl.ndarray((128, 12), nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(stats[:, 0:6], t[:, 0:512])
        nisa.bn_stats(stats[:, 6:12], t[:, 512:1024])
        nl.store(out, value=nisa.bn_aggr(stats))
        return out

    got = kernel(x)
    assert_allclose(got[:, 0], x.astype(np.float64).mean(axis=1), "float32", atol=1e-5)
    assert_allclose(got[:, 1], x.astype(np.float64).var(axis=1), "float32", rtol=1e-4)


def test_reductions_where_and_broadcast():
    got = run(lambda x: nl.mean(x, axis=1), X, shape=(128, 1))
    assert_allclose(got[:, 0], X.astype(np.float64).mean(axis=1), "float32", atol=1e-6)
    got = run(lambda x: nl.var(x, axis=1), X, shape=(128, 1))
    assert_allclose(got[:, 0], X.astype(np.float64).var(axis=1), "float32", rtol=1e-4)
    got = run(lambda x, y: nl.where(nl.greater(x, y), x, y), X, Y)
    np.testing.assert_array_equal(got, np.where(X > Y, X, Y))
    row = RNG.standard_normal((1, 64)).astype(np.float32)
    got = run(lambda x, r: nl.add(x, r), X, row)
    assert_allclose(got, X.astype(np.float64) + row, "float32")
    got = run(lambda x: nl.rms_norm(x, nl.full((128, 64), 2.0, nl.float32), axis=1), X)
    want = X / np.sqrt((X.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6) * 2
    assert_allclose(got, want, "float32", rtol=1e-4)


def test_tensor_scalar_reduce_and_activation_reduce():
    def body(x):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(data=x, op0=nl.multiply, operand0=3.0, reduce_op=nl.maximum, reduce_res=res)
        return res
    np.testing.assert_array_equal(run(body, X, shape=(128, 1))[:, 0], (X * F32(3)).max(axis=1))

    def body2(x):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(op=nl.exp, data=x, reduce_op=nl.add, reduce_res=res)
        return res
    np.testing.assert_allclose(run(body2, X, shape=(128, 1))[:, 0], np.exp(X.astype(np.float64)).sum(axis=1), rtol=1e-5)


def test_reduce_cmd_reduce_with_nothing_accumulated_is_refused_with_the_reason():
    def body(x):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(data=x, op0=nl.add, operand0=0.0, reduce_op=nl.add, reduce_res=res,
                                  reduce_cmd=nisa.reduce_cmd.reduce)
        return res
    with pytest.raises(KernelError, match="no earlier instruction of this kernel left a reduction"):
        run(body, X, shape=(128, 1))
