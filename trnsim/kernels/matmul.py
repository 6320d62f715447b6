"""Matmul kernels: a basic tiled one and a fully optimised one (NKI matmul tutorial).

Both compute ``result[M, N] = lhsT.T @ rhs`` with ``lhsT`` [K, M] and ``rhs`` [K, N]
in HBM (contraction dimension first, on partitions; any chip float dtype),
accumulating in fp32 PSUM and storing an fp32 ``result`` in HBM. M and K are
multiples of 128, N of 512 (for ``matmul_optimized``, M, N and K also multiples of
its block sizes); other shapes raise KernelError (``matmul_general`` takes any).

- ``matmul_basic``: one [128, 512] output tile at a time; every K step loads a
  [128, 128] stationary and a [128, 512] moving tile. The small loads (256-byte
  rows) keep it DMA-bound.
- ``matmul_optimized``: blocks of 2048 x 1024 outputs stay in SBUF while K streams
  through in blocks of 1024; each load moves 2-4 KiB rows, each stationary serves
  two moving tiles, loads of the next K block overlap this block's matmuls, and
  PSUM partial sums are added into the SBUF block on the vector engine.
"""

import trnsim.nki as nki
import trnsim.nki.language as nl
from trnsim.kernels.preconditions import require, require_multiple

TILE_K = 128   # nl.tile_size.pmax
TILE_M = 128   # nl.tile_size.gemm_stationary_fmax
TILE_N = 512   # nl.tile_size.gemm_moving_fmax


@nki.jit
def matmul_basic(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    _check("matmul_basic", lhsT, rhs, TILE_M, TILE_N, TILE_K)
    result = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                lhsT_tile = nl.load(lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                rhs_tile = nl.load(rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                res_psum += nl.matmul(lhsT_tile, rhs_tile, transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], value=res_sb)
    return result


@nki.jit
def matmul_optimized(lhsT, rhs, tiles_in_block_m=16, tiles_in_block_n=2, tiles_in_block_k=8):
    K, M = lhsT.shape
    _, N = rhs.shape
    bm = min(tiles_in_block_m, M // TILE_M)
    bn = min(tiles_in_block_n, N // TILE_N)
    bk = min(tiles_in_block_k, K // TILE_K)
    block_m, block_n, block_k = TILE_M * bm, TILE_N * bn, TILE_K * bk
    _check("matmul_optimized", lhsT, rhs, max(block_m, TILE_M), max(block_n, TILE_N), max(block_k, TILE_K))
    result = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm)
    for n2 in nl.affine_range(N // block_n):
        for m2 in nl.affine_range(M // block_m):
            # the output block accumulates in SBUF, one [128, bn * 512] row of tiles per M tile
            acc = [nl.zeros((TILE_M, block_n), nl.float32, buffer=nl.sbuf) for _ in range(bm)]
            for k2 in nl.affine_range(K // block_k):
                k0 = k2 * block_k
                rhs_tiles = [nl.load(rhs[k0 + k * TILE_K:k0 + (k + 1) * TILE_K, n2 * block_n:(n2 + 1) * block_n])
                             for k in range(bk)]
                lhsT_tiles = [nl.load(lhsT[k0 + k * TILE_K:k0 + (k + 1) * TILE_K, m2 * block_m:(m2 + 1) * block_m])
                              for k in range(bk)]
                for m in range(bm):
                    parts = [nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum) for _ in range(bn)]
                    for k in range(bk):
                        stationary = lhsT_tiles[k][:, m * TILE_M:(m + 1) * TILE_M]
                        for n in range(bn):
                            parts[n] += nl.matmul(stationary, rhs_tiles[k][:, n * TILE_N:(n + 1) * TILE_N], transpose_x=True)
                    for n in range(bn):
                        cols = slice(n * TILE_N, (n + 1) * TILE_N)
                        nl.add(acc[m][:, cols], parts[n], out=acc[m][:, cols])
            for m in range(bm):
                rows = slice(m2 * block_m + m * TILE_M, m2 * block_m + (m + 1) * TILE_M)
                nl.store(result[rows, n2 * block_n:(n2 + 1) * block_n], value=acc[m])
    return result


def _check(kernel, lhsT, rhs, multiple_m, multiple_n, multiple_k):
    """Refuse shapes the tile loops do not cover: they would leave rows of the result
    unwritten or drop a partial K tile from the sums."""
    require(len(lhsT.shape) == 2 and len(rhs.shape) == 2 and lhsT.shape[0] == rhs.shape[0], kernel,
            f"needs lhsT [K, M] and rhs [K, N] with one K, got {list(lhsT.shape)} and {list(rhs.shape)}")
    K, M = lhsT.shape
    N = rhs.shape[1]
    fix = "pad it or use matmul_general, which takes any shape"
    require_multiple(kernel, "M", M, multiple_m, fix)
    require_multiple(kernel, "N", N, multiple_n, fix)
    require_multiple(kernel, "K", K, multiple_k, fix)
