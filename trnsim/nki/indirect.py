"""Indirect (data-dependent) addressing of HBM tensors: DMA gather and scatter through an
index tile, as NKI spells it.

Three spellings make an indirect access of an HBM tensor ``x``:

- a tile as an index, ``x[idx_tile, i_f]`` or ``x[b, idx_tile[i_p, 0], :]``: position
  ``j`` of that axis is row ``idx_tile[j]`` of it (one index per partition of the index
  tile), in range ``0..`` the axis size - 1;
- ``x.ap(pattern, offset, vector_offset=idx, indirect_dim=k)``: partition ``p`` of the
  pattern starts ``idx[p] * stride(k)`` past ``offset`` (its own partition step is
  unused), in range while every element stays inside the tensor;
- ``x.ap(pattern, offset, scalar_offset=t, indirect_dim=k)``: one index, a [1, 1] tile,
  moves the whole pattern by ``t * stride(k)``.

The result is an :class:`~trnsim.nki.tiles.NkiTensor` whose indexed dim has stride 0
(the access with every index 0) and which carries an :class:`Indirection`; ``nl.load``,
``nl.store`` and ``nisa.dma_copy`` move it with one :class:`~trnsim.isa.DmaIndirect`,
which reads the index tile (so it waits for whatever wrote it). Other uses of such a
tensor are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trnsim.isa import View, make_view
from trnsim.nki.tracer import current


@dataclass(frozen=True)
class Indirection:
    """How an indirect access chooses its rows: ``index`` (an on-chip integer view, one
    value per position of dim ``dim``) times ``step`` elements, each in ``0..bound - 1``."""

    index: Any   # the index tile (an NkiTensor), kept so its space stays placed
    dim: int
    step: int
    bound: int


def _index_tile(t: Any, idx: Any, what: str) -> Any:
    """``idx`` checked as an index tile: on chip, integer, one index per partition."""
    tr = current()
    if type(idx).__name__ == "MatmulResult":
        raise tr.fail(f"{what}: the index is a matmul result in PSUM; copy it to an integer SBUF tile first")
    if getattr(idx, "indirect", None) is not None or not idx.view.tensor.on_chip:
        raise tr.fail(f"{what}: the index {idx.name} must be an SBUF tile (nl.load the indices first)")
    if idx.dtype.is_float:
        raise tr.fail(f"{what}: the index tile {idx.name} is {idx.dtype.name}; indices must be an integer dtype "
                      "(int32 or uint32): convert it with nl.copy(..., dtype=nl.int32)")
    if idx.view.free_size != 1:
        raise tr.fail(f"{what}: the index tile {idx.name}{list(idx.shape)} must hold one index per partition "
                      "([n, 1]); index with one column at a time")
    if t.view.tensor.on_chip:
        raise tr.fail(f"{what}: {t.name} is an on-chip tile; indirect DMA indexes HBM tensors; gather within "
                      "SBUF with nisa.nc_n_gather or nisa.local_gather")
    return idx


def subscript(t: Any, index: tuple[object, ...]) -> Any:
    """``t[index]`` where one entry of ``index`` (already expanded) is an index tile."""
    tr = current()
    tiles = [a for a, k in enumerate(index) if hasattr(k, "view") or type(k).__name__ == "MatmulResult"]
    if len(tiles) > 1:
        raise tr.fail(f"indexing {t.name} with {len(tiles)} index tiles: an indirect DMA takes one; "
                      "flatten the tensor and combine the indices into one row index")
    axis = tiles[0]
    idx = _index_tile(t, index[axis], f"indexing {t.name}")
    if axis >= len(t.view.dims):
        raise tr.fail(f"too many indices ({len(index)}) for {t.name}{list(t.shape)}")
    step, count = t.view.dims[axis]
    sub = t[index[:axis] + (slice(0, 1),) + index[axis + 1:]]
    dim = sum(1 for k in index[:axis] if not isinstance(k, int))
    n = idx.view.partitions
    dims = list(sub.view.dims)
    dims[dim] = (0, n)
    bases = list(sub.bases)
    bases[dim] = idx.bases[0]
    view = make_view(sub.view.tensor, sub.view.offset, tuple(dims))
    return type(t)(t._placement, view, tuple(bases), sub.overrun, Indirection(idx, dim, step, count))


def ap(t: Any, dims: tuple[tuple[int, int], ...], offset: int, vector_offset: Any, scalar_offset: Any,
       indirect_dim: int) -> Any:
    """``t.ap(pattern, offset, vector_offset=..., indirect_dim=...)`` or with ``scalar_offset``."""
    tr = current()
    if vector_offset is not None and scalar_offset is not None:
        raise tr.fail(f"{t.name}.ap: vector_offset and scalar_offset are mutually exclusive; give one")
    if type(scalar_offset).__name__ == "VirtualRegister":
        raise tr.fail(f"{t.name}.ap(scalar_offset=<register>): a register offset is not supported by trnsim yet; "
                      "pass the offset as a [1, 1] SBUF tile")
    what = f"{t.name}.ap({'vector' if vector_offset is not None else 'scalar'}_offset=)"
    idx = _index_tile(t, vector_offset if vector_offset is not None else scalar_offset, what)
    if not 0 <= indirect_dim < len(t.view.dims):
        raise tr.fail(f"{what}: indirect_dim={indirect_dim} is not a dim of {t.name}{list(t.shape)}")
    step = t.view.dims[indirect_dim][0]
    if vector_offset is not None:
        if not dims or dims[0][1] != idx.view.partitions:
            raise tr.fail(f"{what}: the pattern's first (partition) dim must count the {idx.view.partitions} "
                          f"indices of {idx.name}; got {[list(d) for d in dims]}")
        dims = ((0, dims[0][1]),) + tuple(dims[1:])
    else:
        if idx.view.size != 1:
            raise tr.fail(f"{what}: scalar_offset {idx.name}{list(idx.shape)} must be one element ([1, 1])")
        dims = ((0, 1),) + tuple(dims)
    start = t.view.offset + int(offset)
    low = start + sum(min(0, s * (c - 1)) for s, c in dims)
    high = start + sum(max(0, s * (c - 1)) for s, c in dims)
    bound = (t.view.tensor.size - 1 - high) // step + 1 if step > 0 else 0
    if low < 0 or bound <= 0:
        raise tr.fail(f"{what}: the pattern {[list(d) for d in dims[1:]]} at offset {offset} leaves no index in "
                      f"range of {t.name}'s {t.view.tensor.size} elements")
    view = View(t.view.tensor, start, dims)
    return type(t)(t._placement, view, None, None, Indirection(idx, 0, step, bound))


def direct(t: Any, what: str) -> None:
    """Refuse an indirect tensor where only a plain access pattern is supported."""
    if getattr(t, "indirect", None) is not None:
        raise current().fail(f"{what}: {t.name} is indexed through a tile (indirect DMA), which trnsim supports in "
                             "nl.load, nl.store and nisa.dma_copy only")
