"""Row softmax (the NKI tutorials' first fused kernel).

``softmax_kernel`` computes ``exp(x - max(x)) / sum(exp(x - max(x)))`` along each row of
``x`` [N, D], 128 rows (one per partition) at a time. The last tile of rows is masked
when N is not a multiple of 128.
"""

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

TILE_P = 128   # nl.tile_size.pmax


@nki.jit
def softmax_kernel(x):
    """Softmax along the last axis of ``x``.

    Args:
        x: [N, D] in HBM, any chip float dtype (fp32, bf16, fp16); rows on partitions,
            D (up to a few thousand) along the free axis of one SBUF tile.

    Returns:
        [N, D] in HBM, of ``x``'s dtype.

    Memories: each [128, D] row tile is loaded into SBUF; the row max is a vector
    reduction, ``exp(x - max)`` and its row sum are one scalar-engine activation into
    an fp32 SBUF tile, and the vector engine scales it by the reciprocal sum into a tile
    of the output dtype that is stored back to HBM. PSUM is not used.
    """
    N, D = x.shape
    out = nl.ndarray((N, D), x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(TILE_P)[:, None]
    i_f = nl.arange(D)[None, :]
    for t in nl.affine_range((N + TILE_P - 1) // TILE_P):
        rows = t * TILE_P + i_p
        x_tile = nl.load(x[rows, i_f], mask=(rows < N))
        neg_max = nisa.tensor_reduce(op=nl.maximum, data=x_tile, axis=1, negate=True, dtype=nl.float32)
        row_sum = nl.ndarray((TILE_P, 1), nl.float32)
        e = nisa.activation(op=nl.exp, data=x_tile, bias=neg_max, reduce_op=nl.add, reduce_res=row_sum,
                            dtype=nl.float32)
        inv_sum = nl.reciprocal(row_sum)
        y = nl.multiply(e, inv_sum, dtype=x.dtype)
        nl.store(out[rows, i_f], value=y, mask=(rows < N))
    return out
