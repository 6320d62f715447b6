"""Kernels and tests in the style of the older NKI namespace (``neuronxcc.nki``), as
their authors write them for AWS's tools: value-returning tiles, ``nl.arange`` and
``nl.mgrid`` index expressions, ``nki.simulate_kernel``, ``nki.baremetal`` and
``nki.benchmark``. Nothing here names trnsim: the imports are the real package's."""

import numpy as np
import pytest

from neuronxcc import nki
import neuronxcc.nki.language as nl


@nki.jit
def add_rows(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(128)[:, None]
    jf = nl.arange(a.shape[1])[None, :]
    for t in nl.affine_range(a.shape[0] // 128):
        left = nl.load(a[t * 128 + ip, jf])
        right = nl.load(b[t * 128 + ip, jf])
        nl.store(out[t * 128 + ip, jf], value=left + right)
    return out


@nki.jit
def matmul_one_tile(lhsT, rhs):
    k, m = lhsT.shape
    _, n = rhs.shape
    result = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    pk, fm = nl.mgrid[0:k, 0:m]
    pk2, fn = nl.mgrid[0:k, 0:n]
    po, fo = nl.mgrid[0:m, 0:n]
    stationary = nl.load(lhsT[pk, fm])
    moving = nl.load(rhs[pk2, fn])
    acc = nl.matmul(stationary, moving, transpose_x=True)
    nl.store(result[po, fo], value=nl.copy(acc, dtype=result.dtype))
    return result


@nki.jit
def row_softmax(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    rows, cols = x.shape
    ip = nl.arange(128)[:, None]
    jf = nl.arange(cols)[None, :]
    for t in nl.affine_range((rows + 127) // 128):
        r = t * 128 + ip
        tile = nl.load(x[r, jf], mask=(r < rows))
        top = nl.max(tile, axis=1, keepdims=True)
        e = nl.exp(nl.subtract(tile, top))
        total = nl.sum(e, axis=1, keepdims=True)
        nl.store(out[r, jf], value=nl.divide(e, total), mask=(r < rows))
    return out


@nki.jit
def transpose_tile(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    ix = nl.arange(x.shape[0])[:, None]
    iy = nl.arange(x.shape[1])[None, :]
    tile = nl.load(x[ix, iy])
    nl.store(out[iy, ix], value=tile)   # a transpose written as an index swap
    return out


def _rng():
    return np.random.default_rng(7)


def test_add_rows_simulate_kernel():
    a = _rng().random((256, 512), dtype=np.float32)
    b = _rng().random((256, 512), dtype=np.float32)
    out = nki.simulate_kernel(add_rows, a, b)
    assert np.allclose(out, a + b)


def test_matmul_simulate_kernel():
    lhsT = _rng().standard_normal((128, 64), dtype=np.float32)
    rhs = _rng().standard_normal((128, 512), dtype=np.float32)
    out = nki.simulate_kernel(matmul_one_tile, lhsT, rhs)
    assert np.allclose(out, lhsT.T @ rhs, atol=1e-4, rtol=1e-4)


def test_softmax_with_a_masked_last_tile():
    x = _rng().standard_normal((200, 96), dtype=np.float32)
    out = nki.simulate_kernel(row_softmax, x)
    want = np.exp(x - x.max(1, keepdims=True))
    assert np.allclose(out, want / want.sum(1, keepdims=True), atol=1e-6)


def test_transpose_by_index_swap():
    x = _rng().standard_normal((64, 96), dtype=np.float32)
    assert np.array_equal(nki.simulate_kernel(transpose_tile, x), x.T)


def test_baremetal_runs_the_kernel():
    a = np.ones((128, 64), dtype=np.float32)
    out = nki.baremetal(add_rows)(a, a)
    assert np.array_equal(out, np.full((128, 64), 2.0, dtype=np.float32))


def test_benchmark_reports_latency_percentiles():
    a = _rng().random((256, 512), dtype=np.float32)
    bench = nki.benchmark(warmup=5, iters=10)(add_rows)
    bench(a, a)
    latency = bench.benchmark_result.nc_latency
    p50, p99 = latency.get_latency_percentile(50), latency.get_latency_percentile(99)
    assert p50 > 0 and p50 == p99   # simulated time is exact: every percentile is that time


@pytest.mark.parametrize("shape", [(128, 128), (384, 64)])
def test_add_rows_shapes(shape):
    a = _rng().random(shape, dtype=np.float32)
    assert np.allclose(nki.simulate_kernel(add_rows, a, a), 2 * a)


@nki.jit
def scale_into(x, out):
    nl.store(out, value=nl.load(x) * 3.0)   # destination passing: no return value


def test_destination_passing_writes_the_callers_array():
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    for run in (scale_into, lambda a, o: nki.simulate_kernel(scale_into, a, o), nki.baremetal(scale_into)):
        out = np.zeros_like(x)
        run(x, out)
        assert np.array_equal(out, 3 * x)
