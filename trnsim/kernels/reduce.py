"""Row reductions and log-softmax over the last axis, for rows of any length.

Both kernels read ``x`` [..., D] as rows [R, D] and cut each row into blocks of at
most ``FREE_MAX`` columns, so D is bounded by HBM only:

- ``reduce_kernel``: sum, max, min or mean of each row. Short rows are folded, so
  that each partition holds many consecutive rows and one instruction reduces a
  [128, rows, D] tile; a few very long rows (a whole-tensor sum such as a
  gradient norm) are each spread over all 128 partitions and the 128 partial
  results brought together through a PE-array transpose.
- ``log_softmax_kernel``: ``x - max - log(sum(exp(x - max)))`` with the running max
  and sum kept per block (an online softmax), so a row is read once for its
  statistics and once more for the result; rows that fit in SBUF are read once.
"""

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

TILE_P = 128          # nl.tile_size.pmax
FREE_MAX = 4096       # columns per block: 16 KiB per partition in fp32
STORE_MAX = 2048      # results gathered per partition before a store
SPREAD_MAX_ROWS = 32  # at most this many rows, each at least SPREAD_MIN_D long:
SPREAD_MIN_D = 8192   # spread every row over the partitions
KEEP_BYTES = 64 * 1024  # per partition: a log-softmax row tile up to this size stays in SBUF

_OPS = {"sum": nl.add, "mean": nl.add, "max": nl.maximum, "min": nl.minimum}


def _rows(x):
    """``x`` [..., D] as an HBM view [R, D]."""
    d = x.shape[-1]
    return x.reshape((x.view.size // d, d))


def _reduce_columns(src, op, d):
    """Reduce an HBM view [p, d] along its free axis: one fp32 [p, 1] SBUF tile."""
    p = src.shape[0]
    starts = list(range(0, d, FREE_MAX))
    partials = nl.ndarray((p, len(starts)), nl.float32)
    for i, c0 in enumerate(starts):
        nisa.tensor_reduce(dst=partials[:, i:i + 1], op=op, data=nl.load(src[:, c0:min(c0 + FREE_MAX, d)]), axis=1)
    if len(starts) == 1:
        return partials
    return nisa.tensor_reduce(op=op, data=partials, axis=1, dtype=nl.float32)


def _finish(tile, kind, d, dtype):
    """The mean from a sum (one vector instruction), or the result as it is."""
    if kind == "mean":
        return nisa.tensor_scalar(tile, op0=nl.multiply, operand0=1.0 / d, dtype=dtype)
    return tile


@nki.jit
def reduce_kernel(x, op="sum", dtype=None):
    """Reduce the last axis of ``x`` with ``op``: sum, max, min or mean.

    Args:
        x: [..., D] in HBM (often [N, D]), any chip float dtype; any sizes.
        op: "sum", "max", "min" or "mean".
        dtype: of the result; ``x``'s by default (as torch's). Sums accumulate in fp32.

    Returns:
        ``x``'s shape with the last axis 1 ([N, 1]) in HBM.

    Memories: blocks of at most [128, 4096] are loaded into SBUF and reduced on the
    vector engine into fp32 SBUF tiles. With D < 4096 each partition holds
    ``N // 128`` consecutive rows and a block covers as many whole rows as fit; the
    ``N % 128`` rows left over take one partition each. With few rows (at most 32)
    of at least 8192 elements, each row is laid over all 128 partitions, the 128
    partial results go through the PE array (a transpose into PSUM) and are reduced
    once more. Results are gathered in SBUF and stored to HBM together.
    """
    if op not in _OPS:
        raise nki.KernelError(f"reduce_kernel: op {op!r} is not one of {', '.join(_OPS)}")
    alu = _OPS[op]
    d = x.shape[-1]
    x2 = _rows(x)
    rows = x2.shape[0]
    out = nl.ndarray(tuple(x.shape[:-1]) + (1,), dtype if dtype is not None else x.dtype, buffer=nl.shared_hbm)
    out2 = out.reshape((rows, 1))
    if rows <= SPREAD_MAX_ROWS and d >= SPREAD_MIN_D:
        _reduce_spread(x2, out2, op, alu)
        return out
    per_part = rows // TILE_P
    if per_part:
        xm = x2[0:TILE_P * per_part, :].reshape((TILE_P, per_part * d))
        om = out2[0:TILE_P * per_part, :].reshape((TILE_P, per_part))
        group = max(1, FREE_MAX // d)
        batch = group if d < FREE_MAX else STORE_MAX
        for r0 in nl.affine_range(0, per_part, batch):
            n = min(batch, per_part - r0)
            if d < FREE_MAX:
                block = nl.load(xm[:, r0 * d:(r0 + n) * d]).reshape((TILE_P, n, d))
                res = nisa.tensor_reduce(op=alu, data=block, axis=2, dtype=nl.float32 if op == "mean" else out.dtype)
            else:
                res = nl.ndarray((TILE_P, n), nl.float32)
                for i in nl.affine_range(n):
                    row = (r0 + i) * d
                    nisa.tensor_copy(dst=res[:, i:i + 1], src=_reduce_columns(xm[:, row:row + d], alu, d))
            nl.store(om[:, r0:r0 + n], value=_finish(res, op, d, out.dtype))
    for r0 in nl.affine_range(TILE_P * per_part, rows, TILE_P):
        p = min(TILE_P, rows - r0)
        nl.store(out2[r0:r0 + p, :], value=_finish(_reduce_columns(x2[r0:r0 + p, :], alu, d), op, d, out.dtype))
    return out


def _reduce_spread(x2, out2, kind, alu):
    """Each row [D] laid out as [128, D // 128] (plus a [1, D % 128] tail), reduced along
    the partitions' free axis, then across partitions through a transpose."""
    rows, d = x2.shape
    per_part = d // TILE_P
    results = nl.ndarray((1, rows), nl.float32)
    for r in nl.affine_range(rows):
        row = x2[r]
        partial = _reduce_columns(row[0:TILE_P * per_part].reshape((TILE_P, per_part)), alu, per_part)
        across = nisa.nc_transpose(partial)
        total = nisa.tensor_reduce(op=alu, data=across, axis=1, dtype=nl.float32)
        if d % TILE_P:
            tail = _reduce_columns(row[TILE_P * per_part:d].reshape((1, d % TILE_P)), alu, d % TILE_P)
            total = nisa.tensor_tensor(total, tail, op=alu)
        nisa.tensor_copy(dst=results[:, r:r + 1], src=total)
    nl.store(out2.reshape((1, rows)), value=_finish(results, kind, d, out2.dtype))


@nki.jit
def log_softmax_kernel(x):
    """``log(softmax(x))`` along the last axis of ``x``, for rows of any length.

    Args:
        x: [..., D] in HBM (often [N, D]), any chip float dtype; rows on partitions,
            128 at a time (the last tile as many as are left).

    Returns:
        ``x``'s shape and dtype in HBM.

    Memories: each row tile is loaded into SBUF in [<= 128, <= 4096] blocks (kept
    there when the row tile takes at most 64 KiB per partition, else loaded again
    for the result). Per block: the negated max (vector), ``exp(x - block max)``
    with its row sum (scalar engine, into an fp32 scratch tile). The block figures
    [P, blocks] are combined into ``-max`` and ``log(sum)`` [P, 1] (fp32); one
    ``tensor_scalar`` per block computes ``(x - max) - log(sum)`` (alternately on the
    vector and scalar engines) before the store. PSUM is not used.
    """
    d = x.shape[-1]
    x2 = _rows(x)
    rows = x2.shape[0]
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    out2 = out.reshape((rows, d))
    starts = list(range(0, d, FREE_MAX))
    keep = d * x.dtype.itemsize <= KEEP_BYTES
    for r0 in nl.affine_range(0, rows, TILE_P):
        p = min(TILE_P, rows - r0)
        src = x2[r0:r0 + p, :]
        neg_max = nl.ndarray((p, len(starts)), nl.float32)
        sums = nl.ndarray((p, len(starts)), nl.float32)
        kept = []
        for i, c0 in enumerate(starts):
            block = nl.load(src[:, c0:min(c0 + FREE_MAX, d)])
            nisa.tensor_reduce(dst=neg_max[:, i:i + 1], op=nl.maximum, data=block, axis=1, negate=True)
            nisa.activation(op=nl.exp, data=block, bias=neg_max[:, i:i + 1], reduce_op=nl.add,
                            reduce_res=sums[:, i:i + 1], dtype=nl.float32)
            if keep:
                kept.append(block)
        if len(starts) == 1:
            row_neg_max, total = neg_max, sums
        else:
            # sum = sum_i sums_i * exp(max_i - max)
            row_neg_max = nisa.tensor_reduce(op=nl.minimum, data=neg_max, axis=1, dtype=nl.float32)
            rescale = nisa.activation(op=nl.exp, data=neg_max, scale=-1.0, bias=row_neg_max, dtype=nl.float32)
            total = nisa.tensor_reduce(op=nl.add, data=nisa.tensor_tensor(rescale, sums, op=nl.multiply), axis=1,
                                       dtype=nl.float32)
        log_total = nl.log(total)
        for i, c0 in enumerate(starts):
            cols = slice(c0, min(c0 + FREE_MAX, d))
            block = kept[i] if keep else nl.load(src[:, cols])
            # (x - max) - log(sum), as PyTorch: one shift -max - log(sum) would lose log(sum)
            # to rounding next to a large max
            res = nisa.tensor_scalar(block, op0=nl.add, operand0=row_neg_max, op1=nl.subtract, operand1=log_total,
                                     dtype=x.dtype, engine=nisa.scalar_engine if i % 2 else None)
            nl.store(out2[r0:r0 + p, cols], value=res)
    return out
