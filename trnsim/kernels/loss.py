"""Negative log-likelihood loss, forward and backward: the end of a classifier's (or a
language model's) training step, after ``log_softmax``.

The forward picks one element per row, ``log_probs[i, target[i]]``: on the chip an
indirect DMA, one descriptor per row, as ``embedding_kernel`` gathers rows
(:mod:`trnsim.kernels.gather`). The backward writes a zeroed [N, C] gradient and then
one element per row, an indirect DMA scatter. As there, the kernels trace either

- with the target values known on the host (``target_values``): one HBM-to-HBM DMA
  per row, between exactly the element the row's target names and a scratch column
  in HBM that is loaded into (or stored from) SBUF as one tile (a DMA into SBUF
  cannot start at every partition); or
- without them (timing only, as when tracing with placeholder arrays): one DMA per
  block of up to 128 rows, one 1-element descriptor per row (column 0 of each row),
  which has the bytes, descriptors and instructions of the chip's indirect DMA but
  not its data.

Rows whose target is ``ignore_index`` count for nothing: a mask computed on the vector
engine from the targets (loaded into SBUF as the indirect DMA needs them).
"""

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.kernels.elementwise import FREE_MAX, flat_views

TILE_P = 128            # rows per tile: one per partition
REDUCTIONS = ("none", "mean", "sum")


def _check(n, c, target, target_values, reduction, ignore_index, name):
    if reduction not in REDUCTIONS:
        raise nki.KernelError(f"{name}: reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    if tuple(target.shape) != (n,):
        raise nki.KernelError(f"{name}: target {list(target.shape)} does not give one class for each of the {n} "
                              "rows; pass [N]")
    if target_values is None:
        return None
    values = [int(v) for v in target_values]
    if len(values) != n:
        raise nki.KernelError(f"{name}: {len(values)} target_values for {n} rows; give one per row")
    bad = next((v for v in values if v != ignore_index and not 0 <= v < c), None)
    if bad is not None:
        raise nki.KernelError(f"{name}: target {bad} is outside the classes 0..{c - 1} (and is not "
                              f"ignore_index {ignore_index})")
    return values


def _pick(element, values, r0, p, ignore_index, dtype):
    """[p, 1] SBUF tile of ``element(r0 + i, values[r0 + i])`` (an HBM view [1, 1]) by one
    DMA per row through an HBM scratch column. Rows whose value is ``ignore_index`` hold 0
    (the chip clamps the index and masks the row; a 0 keeps ``-inf * 0`` out)."""
    scratch = nl.ndarray((p, 1), dtype, buffer=nl.hbm)
    nl.store(scratch, value=nl.zeros((p, 1), dtype))
    for i in range(p):
        v = values[r0 + i]
        if v != ignore_index:
            nisa.dma_copy(dst=scratch[i:i + 1, :], src=element(r0 + i, v))
    return nl.load(scratch)


def _row_weights(target, weight, values, r0, p, ignore_index):
    """[p, 1] fp32 SBUF tile of each row's class weight (1 without ``weight``), 0 where the
    target is ``ignore_index``."""
    f32 = nl.float32
    t = nl.load(target.reshape((target.shape[0], 1))[r0:r0 + p, :])
    mask = nisa.tensor_scalar(t, op0=nl.not_equal, operand0=float(ignore_index), dtype=f32)
    if weight is None:
        return mask
    classes = weight.shape[0]
    column = weight.reshape((classes, 1))
    if values is None:   # every other class, one descriptor each, as the gather has
        w = nl.zeros((p, 1), weight.dtype)
        count = min(p, (classes + 1) // 2)
        nisa.dma_copy(dst=w[0:count, :], src=column[0:2 * count - 1:2, :])
    else:
        w = _pick(lambda _, v: column[v:v + 1, :], values, r0, p, ignore_index, weight.dtype)
    return nisa.tensor_tensor(mask, w, op=nl.multiply, dtype=f32)


@nki.jit
def nll_loss_kernel(log_probs, target, weight=None, reduction="mean", ignore_index=-100, target_values=None):
    """torch's ``nll_loss_forward``: ``loss[i] = -weight[t] * log_probs[i, t]`` with
    ``t = target[i]`` (0 where ``t == ignore_index``), summed, averaged over the total
    weight of the rows counted, or returned per row.

    Args:
        log_probs: [N, C] in HBM, any chip float dtype.
        target: [N] in HBM, int32, each in 0..C-1 or ``ignore_index``.
        weight: [C] in HBM (class weights), or None (every class weighs 1).
        reduction: "mean", "sum" or "none".
        ignore_index: the target value of rows that count for nothing.
        target_values: the values of ``target`` on the host (a sequence of ints), which
            tracing needs to pick the right elements; None traces the timing model
            (module docstring).

    Returns:
        ``(output, total_weight)`` in HBM, of ``log_probs``' dtype: output [1, 1] (torch's
        []) for "mean" and "sum", [N] for "none"; total_weight [1, 1], the sum of the
        counted rows' weights (0 for "none", as torch gives).

    Memories: per tile of 128 rows, the targets ([P, 1] int32) and the picked elements
    ([P, 1], by DMA straight from HBM into SBUF; class weights likewise) go into SBUF;
    the vector engine makes the mask, the weights and ``-weight * element`` into a
    [P, 2] fp32 tile. For "none" its first column is stored; otherwise the PE array
    sums both columns across partitions (a ones column stationary, the tile moving),
    accumulating [1, 2] fp32 in PSUM over all tiles; "mean" divides on the vector
    engine before the store.
    """
    n, c = log_probs.shape
    values = _check(n, c, target, target_values, reduction, ignore_index, "nll_loss_kernel")
    f32 = nl.float32
    out = nl.ndarray((n,) if reduction == "none" else (1, 1), log_probs.dtype, buffer=nl.shared_hbm)
    total_weight = nl.ndarray((1, 1), log_probs.dtype, buffer=nl.shared_hbm)
    out_rows = out.reshape((n, 1)) if reduction == "none" else None
    ones = nl.full((TILE_P, 1), 1.0, f32) if reduction != "none" else None
    acc = nl.zeros((1, 2), f32, buffer=nl.psum) if reduction != "none" else None
    for r0 in nl.affine_range(0, n, TILE_P):
        p = min(TILE_P, n - r0)
        if values is None:
            picked = nl.ndarray((p, 1), log_probs.dtype)
            nisa.dma_copy(dst=picked, src=log_probs[r0:r0 + p, 0:1])
        else:
            picked = _pick(lambda r, v: log_probs[r:r + 1, v:v + 1], values, r0, p, ignore_index, log_probs.dtype)
        rows = nl.ndarray((p, 2), f32)
        nisa.tensor_copy(dst=rows[:, 1:2], src=_row_weights(target, weight, values, r0, p, ignore_index))
        nisa.tensor_tensor(dst=rows[:, 0:1], data1=picked, data2=rows[:, 1:2], op=nl.multiply)
        if reduction == "none":
            nl.store(out_rows[r0:r0 + p, :], value=nisa.tensor_scalar(rows[:, 0:1], op0=nl.multiply, operand0=-1.0,
                                                                         dtype=out.dtype))
        else:
            acc += nl.matmul(ones[0:p, :], rows, transpose_x=True)
    if reduction == "none":
        nl.store(total_weight, value=nl.zeros((1, 1), total_weight.dtype))
        return out, total_weight
    sums = nisa.tensor_copy(acc, dtype=f32)
    loss = nisa.tensor_scalar(sums[:, 0:1], op0=nl.multiply, operand0=-1.0, dtype=f32)
    if reduction == "mean":
        loss = nisa.tensor_tensor(loss, sums[:, 1:2], op=nl.divide, dtype=f32)
    nl.store(out, value=nisa.tensor_copy(loss, dtype=out.dtype))
    nl.store(total_weight, value=nisa.tensor_copy(sums[:, 1:2], dtype=total_weight.dtype))
    return out, total_weight


@nki.jit
def nll_loss_backward_kernel(grad, log_probs, target, weight=None, reduction="mean", ignore_index=-100,
                             total_weight=None, target_values=None):
    """torch's ``nll_loss_backward``: an [N, C] gradient of zeros except
    ``-grad * weight[t]`` at ``[i, t]``, ``t = target[i]`` (nothing where ``t ==
    ignore_index``), divided by the total weight for "mean".

    Args:
        grad: the loss's gradient in HBM: one element ([], [1] or [1, 1]) for "mean" and
            "sum", [N] for "none"; any chip float dtype.
        log_probs: [N, C] in HBM, the forward's input (only its shape and dtype are used).
        target: [N] in HBM, int32.
        weight: [C] in HBM, or None.
        reduction, ignore_index: as the forward's.
        total_weight: one element in HBM, the forward's second output; needed for "mean".
        target_values: as for :func:`nll_loss_kernel`.

    Returns:
        [N, C] in HBM, of ``log_probs``' dtype.

    Memories: a [128, <= 4096] SBUF tile of zeros is stored over the whole gradient
    (the memset, most of the op's bytes). Per tile of 128 rows the targets, the
    gradient and the class weights go into SBUF, the vector engine forms each row's
    value in a [P, 1] tile of the output dtype, and an indirect DMA scatters it from
    SBUF into the rows' elements, after the memset of those rows. PSUM is not used.
    """
    n, c = log_probs.shape
    values = _check(n, c, target, target_values, reduction, ignore_index, "nll_loss_backward_kernel")
    if reduction == "mean" and (total_weight is None or not hasattr(total_weight, "reshape")):
        raise nki.KernelError(f"nll_loss_backward_kernel: reduction 'mean' divides by total_weight, got {total_weight!r}; "
                              "pass the forward's total_weight (an array of one element)")
    f32 = nl.float32
    out = nl.ndarray((n, c), log_probs.dtype, buffer=nl.shared_hbm)
    views = flat_views(out, FREE_MAX)
    zeros = nl.zeros((TILE_P, max(v.shape[1] for v in views)), out.dtype)
    for view in views:
        nl.store(view, value=zeros[0:view.shape[0], 0:view.shape[1]])
    scale = None
    if reduction != "none":
        g = nl.load(grad.reshape((1, 1)), dtype=f32)
        if reduction == "mean":
            g = nisa.tensor_tensor(g, nl.load(total_weight.reshape((1, 1)), dtype=f32), op=nl.divide, dtype=f32)
        scale = nl.broadcast_to(nisa.tensor_scalar(g, op0=nl.multiply, operand0=-1.0, dtype=f32), (TILE_P, 1))
    for r0 in nl.affine_range(0, n, TILE_P):
        p = min(TILE_P, n - r0)
        w = _row_weights(target, weight, values, r0, p, ignore_index)
        if reduction == "none":
            g = nl.load(grad.reshape((n, 1))[r0:r0 + p, :], dtype=f32)
            g = nisa.tensor_scalar(g, op0=nl.multiply, operand0=-1.0, dtype=f32)
        else:
            g = scale[0:p, :]
        row = nisa.tensor_tensor(w, g, op=nl.multiply, dtype=out.dtype)
        if values is None:
            nisa.dma_copy(dst=out[r0:r0 + p, 0:1], src=row)
            continue
        scratch = nl.ndarray((p, 1), out.dtype, buffer=nl.hbm)
        nl.store(scratch, value=row)
        for i in range(p):
            v = values[r0 + i]
            if v != ignore_index:
                nisa.dma_copy(dst=out[r0 + i:r0 + i + 1, v:v + 1], src=scratch[i:i + 1, :])
    return out
