"""A kernel test file written the way tests for the Neuron compiler's NKI are written
(``from neuronxcc import nki``, numpy references, ``simulate_kernel``, ``baremetal``,
``benchmark(warmup=, iters=)``). It runs unchanged under pytest on trnsim, where
``neuronxcc.nki`` is trnsim.nki; tests/test_nki_compat.py runs it."""

import numpy as np
import pytest

from neuronxcc import nki
import neuronxcc.nki.language as nl


@nki.jit
def add_kernel(a_tensor, b_tensor):
    c_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    ix = nl.arange(128)[:, None]
    iy = nl.arange(a_tensor.shape[1])[None, :]
    a = nl.load(a_tensor[ix, iy])
    b = nl.load(b_tensor[ix, iy])
    nl.store(c_tensor[ix, iy], value=a + b)
    return c_tensor


@nki.jit
def matmul_kernel(lhsT, rhs):
    """lhsT [K, M] and rhs [K, N] in HBM, K a multiple of 128, M = 128, N <= 512 (fp32):
    returns lhsT.T @ rhs [M, N] in HBM, accumulated in PSUM over K tiles."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    acc = nl.zeros((M, N), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        a = nl.load(lhsT[k * 128:(k + 1) * 128, 0:M])
        b = nl.load(rhs[k * 128:(k + 1) * 128, 0:N])
        acc += nl.matmul(a, b, transpose_x=True)
    nl.store(result, value=nl.copy(acc, dtype=result.dtype))
    return result


def test_simulate_kernel_add():
    np.random.seed(0)
    a = np.random.random_sample((128, 512)).astype(np.float32)
    b = np.random.random_sample((128, 512)).astype(np.float32)
    c = nki.simulate_kernel(add_kernel, a, b)
    assert np.allclose(c, a + b)


def test_baremetal_matmul():
    np.random.seed(1)
    lhsT = np.random.random_sample((256, 128)).astype(np.float32)
    rhs = np.random.random_sample((256, 512)).astype(np.float32)
    numeric_func = nki.baremetal(matmul_kernel)
    out = numeric_func(lhsT, rhs)
    assert np.allclose(out, lhsT.T @ rhs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(128, 512), (128, 1024)])
def test_benchmark_add(shape):
    a = np.zeros(shape, dtype=np.float32)
    b = np.ones(shape, dtype=np.float32)
    bench_func = nki.benchmark(warmup=5, iters=10)(add_kernel)
    bench_func(a, b)
    latency_res = bench_func.benchmark_result.nc_latency
    p50 = latency_res.get_latency_percentile(50)
    p99 = latency_res.get_latency_percentile(99)
    assert 0 < p50 == p99 < 1000.0
