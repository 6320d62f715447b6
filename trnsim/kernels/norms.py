"""Row normalisations: RMSNorm and LayerNorm over the last axis.

Both take ``x`` [N, D] 128 rows (one per partition) at a time, masking the last tile
of rows when N is not a multiple of 128. The per-feature weights [D] are loaded once
as a [1, D] row and broadcast to all 128 partitions, then reused by every row tile.

- ``rmsnorm_kernel``: ``x / sqrt(mean(x^2) + eps) * weight``; the sum of squares comes
  from one scalar-engine activation with a fused row sum.
- ``layernorm_kernel``: ``(x - mean) / sqrt(var + eps) * gamma + beta``; mean and
  (population) variance come from ``nisa.bn_stats`` on chunks of at most 512 columns,
  combined by ``nisa.bn_aggr``.
"""

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

TILE_P = 128          # nl.tile_size.pmax
BN_STATS_FMAX = 512   # the most columns one bn_stats instruction takes
BN_STATS_DIM = 6      # values per partition of one bn_stats result


def _broadcast_row(v):
    """Load the HBM vector ``v`` [D] once as [1, D] and copy it to all 128 partitions."""
    row = nl.load(v.reshape((1, v.shape[0])))
    return nl.broadcast_to(row, (TILE_P, v.shape[0]))


@nki.jit
def rmsnorm_kernel(x, weight, eps=1e-6):
    """RMSNorm along the last axis of ``x``.

    Args:
        x: [N, D] in HBM, any chip float dtype; rows on partitions.
        weight: [D] in HBM, any chip float dtype.
        eps: added to the mean square before the square root.

    Returns:
        [N, D] in HBM, of ``x``'s dtype.

    Memories: ``weight`` is loaded once into SBUF and broadcast to a [128, D] SBUF tile;
    each [128, D] row tile of ``x`` is loaded into SBUF, squared and summed on the scalar
    engine (fp32), scaled by ``1 / sqrt(mean + eps)`` and by the weights on the vector
    engine, and stored back to HBM. PSUM is not used.
    """
    N, D = x.shape
    out = nl.ndarray((N, D), x.dtype, buffer=nl.shared_hbm)
    w = _broadcast_row(weight)
    i_p = nl.arange(TILE_P)[:, None]
    i_f = nl.arange(D)[None, :]
    for t in nl.affine_range((N + TILE_P - 1) // TILE_P):
        rows = t * TILE_P + i_p
        x_tile = nl.load(x[rows, i_f], mask=(rows < N))
        sum_sq = nl.ndarray((TILE_P, 1), nl.float32)
        nisa.activation(op=nl.square, data=x_tile, reduce_op=nl.add, reduce_res=sum_sq, dtype=nl.float32)
        mean_eps = nisa.tensor_scalar(data=sum_sq, op0=nl.multiply, operand0=1.0 / D, op1=nl.add, operand1=float(eps))
        rstd = nl.rsqrt(mean_eps)
        normed = nl.multiply(x_tile, rstd, dtype=nl.float32)
        y = nl.multiply(normed, w, dtype=x.dtype)
        nl.store(out[rows, i_f], value=y, mask=(rows < N))
    return out


@nki.jit
def layernorm_kernel(x, gamma, beta, eps=1e-5):
    """LayerNorm along the last axis of ``x`` (population variance, as torch's).

    Args:
        x: [N, D] in HBM, any chip float dtype; rows on partitions.
        gamma: [D] in HBM, the scale, any chip float dtype.
        beta: [D] in HBM, the shift, any chip float dtype.
        eps: added to the variance before the square root.

    Returns:
        [N, D] in HBM, of ``x``'s dtype.

    Memories: ``gamma`` and ``beta`` are loaded once into SBUF and broadcast to
    [128, D] SBUF tiles; each [128, D] row tile of ``x`` is loaded into SBUF, its
    statistics gathered by ``bn_stats``/``bn_aggr`` into fp32 SBUF tiles, and
    ``(x - mean) * rstd`` (one vector instruction), ``* gamma`` and ``+ beta`` computed
    on the vector engine before the store back to HBM. PSUM is not used.
    """
    N, D = x.shape
    out = nl.ndarray((N, D), x.dtype, buffer=nl.shared_hbm)
    g = _broadcast_row(gamma)
    b = _broadcast_row(beta)
    chunks = (D + BN_STATS_FMAX - 1) // BN_STATS_FMAX
    i_p = nl.arange(TILE_P)[:, None]
    i_f = nl.arange(D)[None, :]
    for t in nl.affine_range((N + TILE_P - 1) // TILE_P):
        rows = t * TILE_P + i_p
        x_tile = nl.load(x[rows, i_f], mask=(rows < N))
        stats = nl.ndarray((TILE_P, BN_STATS_DIM * chunks), nl.float32)
        for c in nl.affine_range(chunks):
            cols = slice(c * BN_STATS_FMAX, min((c + 1) * BN_STATS_FMAX, D))
            nisa.bn_stats(dst=stats[:, c * BN_STATS_DIM:(c + 1) * BN_STATS_DIM], data=x_tile[:, cols])
        mean_var = nisa.bn_aggr(data=stats)
        var_eps = nl.add(mean_var[:, 1:2], float(eps))
        rstd = nl.rsqrt(var_eps)
        normed = nisa.tensor_scalar(data=x_tile, op0=nl.subtract, operand0=mean_var[:, 0:1], op1=nl.multiply,
                                    operand1=rstd, dtype=nl.float32)
        scaled = nl.multiply(normed, g, dtype=nl.float32)
        y = nl.add(scaled, b, dtype=x.dtype)
        nl.store(out[rows, i_f], value=y, mask=(rows < N))
    return out
