"""Kernels in the style of the current NKI package (``import nki``): tiles declared with
``nl.ndarray(..., buffer=nl.sbuf | nl.psum)`` and filled by destination-passing
``nisa`` instructions, HBM indexed by slices, launch grids with ``nl.program_id``."""

import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def scaled_add(a, b):
    rows, cols = a.shape
    out = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(rows // 128):
        ta = nl.ndarray((128, cols), dtype=a.dtype, buffer=nl.sbuf)
        tb = nl.ndarray((128, cols), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a[t * 128:(t + 1) * 128, :])
        nisa.dma_copy(dst=tb, src=b[t * 128:(t + 1) * 128, :])
        total = nl.ndarray((128, cols), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=total, data1=ta, data2=tb, op=nl.add)
        scaled = nl.ndarray((128, cols), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=scaled, data=total, op0=nl.multiply, operand0=0.5)
        nisa.dma_copy(dst=out[t * 128:(t + 1) * 128, :], src=scaled)
    return out


@nki.jit
def matmul_k_tiles(lhsT, rhs):
    k, m = lhsT.shape
    _, n = rhs.shape
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(k // 128):
        stationary = nl.ndarray((128, m), dtype=lhsT.dtype, buffer=nl.sbuf)
        moving = nl.ndarray((128, n), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=stationary, src=lhsT[kt * 128:(kt + 1) * 128, :])
        nisa.dma_copy(dst=moving, src=rhs[kt * 128:(kt + 1) * 128, :])
        nisa.nc_matmul(acc, stationary, moving)
    result = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=acc)
    nisa.dma_copy(dst=out, src=result)
    return out


@nki.jit
def to_bf16(x):
    out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    nisa.dma_copy(dst=out, src=tile)   # the DMA converts fp32 to bf16
    return out


@nki.jit
def double_per_program(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    rows = x.shape[0] // nl.num_programs(0)
    tile = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x[i * rows:(i + 1) * rows, :])
    twice = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=twice, data=tile, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out[i * rows:(i + 1) * rows, :], src=twice)
    return out


def _rng():
    return np.random.default_rng(11)


def test_scaled_add():
    a = _rng().standard_normal((256, 300), dtype=np.float32)
    b = _rng().standard_normal((256, 300), dtype=np.float32)
    assert np.allclose(scaled_add(a, b), (a + b) * 0.5, atol=1e-6)


def test_matmul_accumulates_in_psum():
    lhsT = _rng().standard_normal((384, 128), dtype=np.float32)
    rhs = _rng().standard_normal((384, 512), dtype=np.float32)
    assert np.allclose(matmul_k_tiles(lhsT, rhs), lhsT.T @ rhs, atol=1e-3, rtol=1e-4)


def test_simulate_entry_point():
    a = _rng().standard_normal((128, 64), dtype=np.float32)
    assert np.allclose(nki.simulate(scaled_add)(a, a), a, atol=1e-6)


def test_dma_copy_converts_to_bf16():
    x = _rng().standard_normal((128, 64), dtype=np.float32)
    out = np.asarray(to_bf16(x), dtype=np.float32)
    assert np.allclose(out, x, rtol=1e-2, atol=1e-2) and not np.array_equal(out, x)


def test_launch_grid_with_program_id():
    x = _rng().standard_normal((512, 64), dtype=np.float32)
    assert np.allclose(double_per_program[4](x), 2 * x)
