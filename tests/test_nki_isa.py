"""Each nki.isa instruction and nki.language op, run at instruction fidelity against numpy."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.testing import assert_allclose

RNG = np.random.default_rng(7)
X = RNG.standard_normal((128, 64)).astype(np.float32)
Y = RNG.standard_normal((128, 64)).astype(np.float32)


def run(body, *arrays, shape=(128, 64), dtype=nl.float32):
    """Run ``body(tiles...) -> tile`` in a kernel that loads the arrays and stores the result."""
    @nki.jit
    def kernel(*xs):
        out = nl.ndarray(shape, dtype, buffer=nl.shared_hbm)
        nl.store(out, value=body(*[nl.load(x) for x in xs]))
        return out

    return kernel(*arrays)


def test_iota_and_affine_select():
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    got = run(lambda x: nisa.iota(i_p * 64 + i_f, dtype=nl.float32), X)
    np.testing.assert_array_equal(got, np.arange(128 * 64, dtype=np.float32).reshape(128, 64))
    got = run(lambda x: nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=x, on_false_value=-9.0), X)
    p, f = np.indices((128, 64))
    np.testing.assert_array_equal(got, np.where(p >= f, X, -9.0))


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


def test_transpose_and_matmul_without_transpose_x():
    a = RNG.standard_normal((64, 128)).astype(np.float32)  # [M, K]
    b = RNG.standard_normal((128, 256)).astype(np.float32)  # [K, N]

    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((64, 256), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        nl.store(out, value=nl.copy(nl.matmul(ta, tb)))
        nl.store(t, value=nisa.nc_transpose(ta))
        return out, t

    out, t = kernel(a, b)
    assert_allclose(out, a.astype(np.float64) @ b, "float32")
    np.testing.assert_array_equal(t, a.T)


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


@pytest.mark.parametrize("name, ref", [
    ("exp", np.exp), ("tanh", np.tanh), ("sigmoid", lambda v: 1 / (1 + np.exp(-v))), ("relu", lambda v: np.maximum(v, 0)),
    ("silu", lambda v: v / (1 + np.exp(-v))), ("square", np.square), ("abs", np.abs),
])
def test_unary_math(name, ref):
    got = run(lambda x: getattr(nl, name)(x), X)
    assert_allclose(got, ref(X.astype(np.float64)), "float32")


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


def test_engine_argument():
    x = np.ones((128, 64), np.float32)
    on_gpsimd = nki.benchmark(lambda_kernel := nki.jit(_add_on(nisa.gpsimd_engine)), numerics=False)(x, x)
    on_vector = nki.benchmark(nki.jit(_add_on(nisa.vector_engine)), numerics=False)(x, x)
    assert "gpsimd" in on_gpsimd.busy_pct and "vector" not in on_gpsimd.busy_pct
    assert "vector" in on_vector.busy_pct
    assert lambda_kernel(x, x).sum() == 2 * x.size
    with pytest.raises(nki.KernelError, match="cannot run on the tensor engine"):
        nki.trace_program(nki.jit(_add_on(nisa.tensor_engine)), x, x)


def _add_on(engine):
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nisa.tensor_tensor(nl.load(a), nl.load(b), op=nl.add, engine=engine))
        return out
    return add
