"""A matmul with an elementwise epilogue: what a fusion that starts at ``mm``/``bmm``
lowers into.

``fused_matmul_kernel`` multiplies as :func:`trnsim.kernels.gemm.matmul_general` does
(same blocks, same loads, same PSUM accumulation) and, instead of copying each output
tile out of PSUM, runs a :class:`~trnsim.kernels.fused.Recipe` on it while it is on chip:
``Ref("mm")`` is the fp32 product, read straight from PSUM (or from the fp32 SBUF
accumulator when K spans several chunks). Only the recipe's outputs reach HBM.
"""

from __future__ import annotations

from typing import Any

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim import dtypes
from trnsim.kernels.fused import TILE_P, Balance, Recipe, Tile, check_operand_shapes, kinds, step_dtype, trace_steps
from trnsim.kernels.gemm import matmul_blocks, matmul_shapes, tiled_rhs


@nki.jit
def fused_matmul_rows_kernel(lhs, rhs, *operands, recipe: Recipe, dtype: Any = None, rhs_tiled: bool = False):
    """``recipe`` applied to ``lhs @ rhs`` for ``lhs`` [M, K] (or [B, M, K]) in rows:
    :func:`fused_matmul_kernel` with the left operand as it lies in memory, each piece
    transposed through the PE array on chip (:func:`trnsim.kernels.gemm.matmul_rows`)."""
    return _fused_matmul(lhs, rhs, operands, recipe, dtype, rows=True, tiled=rhs_tiled)


@nki.jit
def fused_matmul_kernel(lhsT, rhs, *operands, recipe: Recipe, dtype: Any = None, rhs_tiled: bool = False):
    """``recipe`` applied to ``lhsT.T @ rhs``, tile by tile before the store.

    Args:
        lhsT: [K, M] or [B, K, M] in HBM, any chip float dtype.
        rhs: [K, N] or [B, K, N] in HBM, any chip float dtype (either operand may stay
            2-D in a batched product).
        operands: the epilogue's, in HBM, laid out as ``recipe.layouts`` over the
            domain [M, N] (or [B, M, N]): "full" [M, N] or [B, M, N], "row" [N] (a
            bias), "col" [M, 1] or [B, M, 1], "scalar" [1].
        recipe: elementwise steps only (no reductions); ``Ref("mm")`` is the product.
        dtype: when given, the product is rounded to it before the steps read it
            (as a matmul that stores ``dtype`` would give it); fp32 by default.
        rhs_tiled: ``rhs`` (2-D, K a multiple of 128) holds its elements in the order
            the kernel loads them (:func:`trnsim.kernels.gemm.tiled_rhs`): each chunk of
            K tiles one DMA whose partitions' bytes are contiguous, as a compiled
            graph's weights are stored.

    Returns:
        A tuple of HBM tensors, one per ``recipe.outputs`` entry: [M, N] ([B, M, N]
        batched) of the step's dtype, or [M, 1] ([B, M, 1]) for a column value.

    Memories: as ``matmul_general`` for the product (fp32 PSUM banks of [<= 128,
    <= 512]); row operands are loaded once and broadcast to a [128, N] SBUF tile,
    scalar ones to [128, 1]; full and col operands are loaded per output tile. The
    steps read the product from PSUM (vector and scalar engines, split by load) into
    SBUF tiles; each output tile [<= 128, <= 512] is stored to HBM.
    """
    return _fused_matmul(lhsT, rhs, operands, recipe, dtype, rows=False, tiled=rhs_tiled)


def _fused_matmul(lhsT, rhs, operands, recipe, dtype, rows, tiled=False):
    who = "fused_matmul_rows_kernel" if rows else "fused_matmul_kernel"
    step_kinds = kinds(recipe, matmul=True)
    batched, batch, m, n = matmul_shapes(lhsT, rhs, who, rows=rows)
    if len(operands) != len(recipe.layouts):
        raise nki.KernelError(f"{who}: {len(operands)} epilogue operands for the recipe's "
                              f"{len(recipe.layouts)} layouts; pass one operand per layout")
    lead = (batch,) if batched else ()
    for i, (t, lay) in enumerate(zip(operands, recipe.layouts)):
        if lay in ("full", "col") and len(t.shape) == 3 and t.shape[0] != (batch if batched else None):
            raise nki.KernelError(f"{who}: operand {i} ({lay}) is {list(t.shape)} but the product "
                                  f"is {list(lead + (m, n))}; give it 2-D or with the product's batch")
    per_entry = [t[0] if len(t.shape) == 3 and lay in ("full", "col") else t for t, lay in zip(operands, recipe.layouts)]
    check_operand_shapes(per_entry, recipe.layouts, {"full": (m, n), "row": (n,), "col": (m, 1), "scalar": (1,)})
    outs = [nl.ndarray(lead + ((m, n) if step_kinds[k] == "full" else (m, 1)), step_dtype(recipe.steps[k]),
                       buffer=nl.shared_hbm) for k in recipe.outputs]
    used = {a.index for s in recipe.steps for a in s.args if a.kind == "in"}
    shared = {}
    for i in sorted(used):
        if recipe.layouts[i] == "row":
            shared[i] = nl.broadcast_to(nl.load(operands[i].reshape((1, n))), (TILE_P, n))
        elif recipe.layouts[i] == "scalar":
            shared[i] = nl.broadcast_to(nl.load(operands[i].reshape((1, 1))), (TILE_P, 1))
    balance = Balance()
    cast = nl.float32 if dtype is None else dtypes.as_dtype(dtype)

    def sink(b):
        def finish(rows, parts):
            r0, p = rows
            cols: dict[int, Any] = {}

            def tile(part, c0, w):
                def operand(i):
                    t, lay = operands[i], recipe.layouts[i]
                    view = t[b] if len(t.shape) == 3 and lay in ("full", "col") else t
                    if lay == "full":
                        return nl.load(view[r0:r0 + p, c0:c0 + w])
                    if lay == "col":
                        if i not in cols:
                            cols[i] = nl.load(view[r0:r0 + p, :])
                        return cols[i]
                    return shared[i][0:p, c0:c0 + w] if lay == "row" else shared[i][0:p, :]

                def store(o, value):
                    dst = outs[o][b] if batched else outs[o]
                    if step_kinds[recipe.outputs[o]] == "full":
                        nl.store(dst[r0:r0 + p, c0:c0 + w], value=value)
                    elif c0 == 0:
                        nl.store(dst[r0:r0 + p, :], value=value)

                mm = part if cast is nl.float32 else nisa.tensor_copy(part, dtype=cast, engine=balance.pick(w))
                return Tile(p, w, operand, store, mm)

            trace_steps(recipe, step_kinds, [tile(*part) for part in parts], n, balance)
        return finish

    if tiled and (batched or not tiled_rhs(rhs.shape[0])):
        raise nki.KernelError(f"{who}: rhs_tiled takes a 2-D rhs whose K ({rhs.shape[0]}) is a multiple of 128, "
                              f"not {list(rhs.shape)}; pass rhs_tiled=False")
    matmul_blocks(lhsT, rhs, sink, rows=rows, tiled=tiled)
    return tuple(outs)
