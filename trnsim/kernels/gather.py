"""Embedding lookup, gathering rows of a table by index, and its gradient, scattering
rows back with accumulation.

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

``embedding_backward_kernel`` is the scatter-add: the chip's DMA engines can add what
they write to what is there (a DMA with accumulate), one descriptor per row, so the
gradient rows go from SBUF to their table rows 128 at a time. trnsim's DMAs only copy,
so each accumulate is timed as what it moves: the destination rows read (a gather),
added to on the vector engine, and written back (a scatter). Unlike a one-hot matmul on
the PE array (``N x V x D`` multiplies), its cost does not grow with the vocabulary
beyond the table's memset, so it suits vocabularies of any size.
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


@nki.jit
def embedding_backward_kernel(grad, indices, num_weights, padding_idx=-1, index_values=None):
    """torch's ``embedding_dense_backward`` (without ``scale_grad_by_freq``): a
    [num_weights, D] table of zeros into which each row of ``grad`` is added at the row
    its index names; rows whose index is ``padding_idx`` add nothing.

    Args:
        grad: [..., D] in HBM (the lookup's output gradient), any chip float dtype.
        indices: ``grad``'s leading shape in HBM, int32, each in 0..num_weights-1.
        num_weights: the table's row count V.
        padding_idx: an index whose rows add nothing (-1: none).
        index_values: the values of ``indices`` on the host, which tracing needs to
            add into the right rows; None traces the timing model (module docstring),
            whose table is not the gradient.

    Returns:
        [num_weights, D] in HBM, of ``grad``'s dtype.

    Memories: a [128, <= 4096] SBUF tile of zeros is stored over the table (the memset).
    The indices go into SBUF ([128, <= 4096] int32 tiles, as the indirect DMA reads
    them). ``grad`` is read in [128, <= 4096] blocks of rows into SBUF; per block the
    destination rows are gathered into SBUF, the vector engine adds the block in fp32
    and the sums are scattered back: one DMA each way per block, or, with
    ``index_values``, one row at a time through [1, <= 4096] tiles (rows with the same
    index follow each other). PSUM is not used.
    """
    d = grad.shape[-1]
    n = math.prod(indices.shape)
    if math.prod(grad.shape) != n * d:
        raise nki.KernelError(f"embedding_backward_kernel: grad {list(grad.shape)} is not one row of D={d} per "
                              f"index of {list(indices.shape)}; pass grad [*indices.shape, D]")
    out = nl.ndarray((num_weights, d), grad.dtype, buffer=nl.shared_hbm)
    views = flat_views(out, FREE_MAX)
    zeros = nl.zeros((BLOCK_ROWS, max(v.shape[1] for v in views)), out.dtype)
    for view in views:
        nl.store(view, value=zeros[0:view.shape[0], 0:view.shape[1]])
    for part in flat_views(indices, FREE_MAX):
        nl.load(part)
    rows = grad.reshape((n, d))
    columns = [(c0, min(c0 + FREE_MAX, d)) for c0 in range(0, d, FREE_MAX)]
    if index_values is not None:
        values = [int(v) for v in index_values]
        if len(values) != n:
            raise nki.KernelError(f"embedding_backward_kernel: {len(values)} index_values for {n} indices; "
                                  "give one per index")
        bad = next((v for v in values if not 0 <= v < num_weights), None)
        if bad is not None:
            raise nki.KernelError(f"embedding_backward_kernel: index {bad} is outside the table's rows "
                                  f"0..{num_weights - 1}")
        for i, v in enumerate(values):
            if v == padding_idx:
                continue
            for c0, c1 in columns:
                total = nisa.tensor_tensor(nl.load(out[v:v + 1, c0:c1]), nl.load(rows[i:i + 1, c0:c1]),
                                           op=nl.add, dtype=out.dtype)
                nl.store(out[v:v + 1, c0:c1], value=total)
        return out
    # every other table row, so no two rows a block reads or writes are adjacent
    block = max(1, min(BLOCK_ROWS, (num_weights + 1) // 2))
    for r0 in nl.affine_range(0, n, block):
        count = min(block, n - r0)
        dst = out[0:2 * count - 1:2, :]
        for c0, c1 in columns:
            g = nl.load(rows[r0:r0 + count, c0:c1])
            total = nisa.tensor_tensor(nl.load(dst[:, c0:c1]), g, op=nl.add, dtype=out.dtype)
            nl.store(dst[:, c0:c1], value=total)
    return out
