"""DMA with compute: ``dma_copy(dst_rmw_op=nl.add)`` and ``dma_compute``.

The DMA engines of the chip can add what they move to what is there (``dst = dst +
src``) or sum several sources (``dst = srcs[0] + srcs[1] + ...``), in fp32, rounding to
the destination's dtype once. trnsim times this as the DMA moves plus one vector-engine
add per extra source (a documented difference: the hardware adds inside the DMA
engine): every HBM operand is brought into SBUF by DMA, the sum is taken in an fp32 SBUF
tile, and the result goes to the destination (by DMA when it is in HBM). The operands
must have the destination's element count; an HBM destination or source of more than
128 rows in its first dimension is refused by name, as are ``scales`` other than 1.0,
reduce ops other than ``nl.add``, more than 16 sources, and indirect (``vector_offset``)
operands.
"""

from __future__ import annotations

from typing import Any

from trnsim.isa import Memory
from trnsim.nki import emit as _e
from trnsim.nki import language as nl
from trnsim.nki.tiles import NkiTensor

MAX_SOURCES = 16


def _on_chip(t: NkiTensor, shape: tuple[int, ...], what: str) -> NkiTensor:
    """``t`` as an SBUF tile of ``shape``: itself, or a copy brought in by DMA."""
    tr = _e.tracer()
    if t.buffer is not Memory.HBM and tuple(t.shape) == shape:
        return t
    if shape[0] > 128:
        raise tr.fail(f"{what}: an operand of {list(t.shape)} in HBM has more than 128 rows for one SBUF tile; "
                      "split it into tiles of at most 128 rows")
    tile = nl.ndarray(shape, t.dtype, buffer=nl.sbuf)
    tr.dma(tile.view, t.view)
    return tile


def add_into(dst: NkiTensor, srcs: list[NkiTensor], what: str) -> NkiTensor:
    """``dst = srcs[0] + srcs[1] + ...`` in fp32, rounded once to ``dst``'s dtype."""
    from trnsim.nki import isa as nisa

    tr = _e.tracer()
    shape = tuple(dst.shape)
    for s in srcs:
        if not isinstance(s, NkiTensor) or s.view.size != dst.view.size:
            raise tr.fail(f"{what}: every source must be a tensor of {dst.view.size} elements like dst "
                          f"{list(dst.shape)}; got {getattr(s, 'shape', s)!r}")
    tiles = [_on_chip(s, shape, what) for s in srcs]
    if len(tiles) == 1:
        total = tiles[0]
    else:
        total = nl.ndarray(shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=total, data1=tiles[0], data2=tiles[1], op=nl.add)
        for t in tiles[2:]:
            nisa.tensor_tensor(dst=total, data1=total, data2=t, op=nl.add)
    if dst.buffer is Memory.HBM:
        tr.dma(dst.view, total.view)
    else:
        nisa.tensor_copy(dst=dst, src=total)
    return dst


def check_add(op: Any, what: str) -> None:
    """Refuse a reduce op other than ``nl.add``, naming it."""
    if op is not nl.add and getattr(op, "__name__", None) != "add":
        raise _e.tracer().fail(f"{what}: only nl.add is supported as the DMA's compute op (as on the chip); "
                               f"got {op!r}")


def dma_compute(dst: NkiTensor, srcs: list[NkiTensor], reduce_op: Any, scales: Any = None,
                unique_indices: bool = True, oob_mode: Any = None, name: str | None = None) -> NkiTensor:
    """``dst = reduce_op(srcs[0] * scales[0], srcs[1] * scales[1], ...)`` computed by the
    DMA (see the module): ``reduce_op`` must be ``nl.add`` and every scale 1.0, at most 16
    sources of ``dst``'s element count, in HBM or SBUF."""
    tr = _e.tracer()
    check_add(reduce_op, "dma_compute")
    srcs = list(srcs) if isinstance(srcs, (list, tuple)) else [srcs]
    if not srcs or len(srcs) > MAX_SOURCES:
        raise tr.fail(f"dma_compute takes 1 to {MAX_SOURCES} sources; got {len(srcs)}")
    if scales is not None and any(float(s) != 1.0 for s in scales):
        raise tr.fail(f"dma_compute: scales {list(scales)!r} must all be 1.0 (as on the chip) or None")
    if not isinstance(dst, NkiTensor):
        raise tr.fail("dma_compute needs a dst tensor")
    return add_into(dst, srcs, "dma_compute")
