"""Grouped matmul: one kernel for the experts of a mixture-of-experts layer.

``grouped_matmul`` computes, for each group ``g`` (an expert), the rows of ``lhsT``
that the group owns times that group's weight: ``result[rows_g] = lhsT[:, rows_g].T @
rhs[g]``, with the rows of the groups back to back (tokens sorted by expert, as
``torch._grouped_mm`` takes them with its ``offs``). Every group runs in one Program,
one after another, through :func:`trnsim.kernels.gemm.matmul_blocks`, so the loads
of a group overlap the previous group's multiplies; a group with no rows loads
nothing (its expert's weight stays in HBM).
"""

import trnsim.nki as nki
import trnsim.nki.language as nl
from trnsim.kernels.gemm import matmul_blocks


@nki.jit
def grouped_matmul(lhsT, rhs, rows=(), dtype=None):
    """``lhsT[:, group rows].T @ rhs[group]`` for each group, rows concatenated.

    Args:
        lhsT: [K, M] in HBM, the rows of every group transposed (contraction first),
            group 0's first; any chip float dtype.
        rhs: [G, K, N] in HBM, one weight per group, of any chip float dtype.
        rows: G row counts (a group's rows in ``lhsT``), summing to at most M; rows
            past their sum are not computed (left unwritten, as ``_grouped_mm`` leaves
            them).
        dtype: of the result; ``lhsT``'s by default. Products accumulate in fp32.

    Returns:
        [M, N] in HBM.

    Memories: as :func:`trnsim.kernels.gemm.matmul_general`, per group: operand tiles
    loaded into SBUF per K chunk, fp32 partial sums in PSUM, output tiles stored to HBM.
    """
    K, M = lhsT.shape
    if len(rhs.shape) != 3 or rhs.shape[1] != K:
        raise nki.KernelError(f"grouped_matmul: rhs is {list(rhs.shape)}; give [groups, K={K}, N]")
    if len(rows) != rhs.shape[0] or any(r < 0 for r in rows) or sum(rows) > M:
        raise nki.KernelError(f"grouped_matmul: rows {list(rows)} must be {rhs.shape[0]} counts >= 0 "
                              f"summing to at most M={M}")
    N = rhs.shape[2]
    result = nl.ndarray((M, N), dtype if dtype is not None else lhsT.dtype, buffer=nl.shared_hbm)
    start = 0
    for g, count in enumerate(rows):
        if count:
            part = result[start:start + count]
            matmul_blocks(lhsT[:, start:start + count], rhs[g], lambda b, part=part: part)
        start += count
    return result
