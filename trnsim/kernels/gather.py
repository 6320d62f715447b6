"""Embedding lookup: gathering rows of a table by index.

On the chip a gather is an indirect DMA: the DMA engines read the indices from
SBUF and generate one descriptor per gathered row, so a block of 128 rows is one
DMA instruction of 128 descriptors. trnsim's DMAs take plain strided access
patterns only, so ``embedding_kernel`` models the gather in one of two ways:

- with the index values known on the host (``index_values``): one HBM-to-HBM DMA
  per row, copying exactly the rows asked for. Each DMA instruction carries the
  fixed issue cost of an instruction, so this is slower than the chip's one
  indirect DMA per block (several times so for rows of a few KiB).
- without them (timing only, as when tracing with placeholder arrays): one DMA
  per block of up to 128 rows that reads 128 separate table rows (rows 0, 2, 4,
  ...: one descriptor per row, as the indirect DMA has) into the block's output
  rows. The bytes, descriptors and instructions are those of the chip's gather;
  the output rows are not the gathered ones.

Both first load the indices into SBUF (the indirect DMA reads them from there);
the model does not make the row copies wait for that load.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.kernels.elementwise import FREE_MAX, flat_views

BLOCK_ROWS = 128      # rows one indirect DMA gathers: one per partition


@nki.jit
def embedding_kernel(table, indices, index_values=None):
    """``table[indices]``: the rows of ``table`` that ``indices`` name.

    Args:
        table: [V, D] in HBM, any chip dtype.
        indices: any shape (often [N]) in HBM, int32, each in 0..V-1.
        index_values: the values of ``indices`` on the host (a sequence of ints, in
            ``indices``' row-major order), which tracing needs to copy the right
            rows; None traces the timing model (module docstring), whose outputs
            are not the gathered rows.

    Returns:
        ``indices.shape + [D]`` in HBM, of ``table``'s dtype.

    Memories: the indices are loaded into SBUF ([128, <= 4096] int32 tiles). The rows
    go from HBM to HBM without passing through SBUF: one DMA per row with
    ``index_values``, else one per 128 rows. No engine and no PSUM is used.
    """
    V, D = table.shape
    n = math.prod(indices.shape)
    out = nl.ndarray(tuple(indices.shape) + (D,), table.dtype, buffer=nl.shared_hbm)
    rows = out.reshape((n, D))
    for part in flat_views(indices, FREE_MAX):
        nl.load(part)
    if index_values is not None:
        values = [int(v) for v in index_values]
        if len(values) != n:
            raise nki.KernelError(f"embedding_kernel: {len(values)} index_values for {n} indices; give one per index")
        bad = next((v for v in values if not 0 <= v < V), None)
        if bad is not None:
            raise nki.KernelError(f"embedding_kernel: index {bad} is outside the table's rows 0..{V - 1}")
        for i, v in enumerate(values):
            nisa.dma_copy(dst=rows[i:i + 1, :], src=table[v:v + 1, :])
        return out
    # every other row of the table, so no two rows a block reads are adjacent
    block = max(1, min(BLOCK_ROWS, (V + 1) // 2))
    for r0 in nl.affine_range(0, n, block):
        count = min(block, n - r0)
        nisa.dma_copy(dst=rows[r0:r0 + count, :], src=table[0:2 * count - 1:2, :])
    return out
