"""DMA instructions of ``nki.isa``: ``dma_copy``, ``dma_transpose``, and DMA with compute
(``dma_copy(dst_rmw_op=nl.add)`` and ``dma_compute``).

The DMA engines of the chip can add what they move to what is there (``dst = dst +
src``) or sum several sources (``dst = srcs[0] + srcs[1] + ...``), in fp32, rounding to
the destination's dtype once. trnsim times this as the DMA moves plus one vector-engine
add per extra source (a documented difference: the hardware adds inside the DMA
engine): every HBM operand is brought into SBUF by DMA, the sum is taken in an fp32 SBUF
tile, and the result goes to the destination (by DMA when it is in HBM). The operands
must have the destination's element count; an HBM destination or source of more than
128 rows in its first dimension is refused by name, as are ``scales`` other than 1.0,
reduce ops other than ``nl.add`` and more than 16 sources. An operand indexed through a
tile (``x[idx_tile, :]``, ``x.ap(vector_offset=...)``) moves by indirect DMA (see
:mod:`trnsim.nki.indirect`); ``oob_mode.skip`` skips its out-of-bounds indices.
"""

from __future__ import annotations

from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import Memory, View
from trnsim.nki import emit as _e
from trnsim.nki.compute import add
from trnsim.nki.indirect import direct
from trnsim.nki.isa._common import fail, is_tile
from trnsim.nki.isa.elementwise import tensor_copy, tensor_tensor
from trnsim.nki.memory import ndarray, sbuf
from trnsim.nki.tiles import NkiTensor

MAX_SOURCES = 16


def oob_skip(mode: Any, name: str) -> bool:
    """Whether ``oob_mode`` asks to skip out-of-bounds indices (``oob_mode.skip``) rather than
    fail (``oob_mode.error``, the default). Only an indirect DMA's indices are checked as it
    runs; every other access is checked against its tensor when traced."""
    if mode is None or getattr(mode, "name", mode) == "error":
        return False
    if getattr(mode, "name", mode) == "skip":
        return True
    raise _e.tracer().fail(f"{name}: oob_mode={mode!r} is not one of nisa.oob_mode.error, nisa.oob_mode.skip")


def dma_copy(*args: Any, **kwargs: Any) -> NkiTensor:
    """Copy ``src`` to ``dst`` by DMA (HBM, SBUF or PSUM on either side); between float
    dtypes the DMA converts through fp32 (an fp32 tile into a bf16 HBM tensor rounds).
    ``dge_mode``, ``priority`` and ``engine`` are accepted; every mode is timed alike."""
    dst = kwargs.pop("dst", args[0] if args else None)
    src = kwargs.pop("src", args[1] if len(args) > 1 else None)
    rmw = kwargs.pop("dst_rmw_op", args[2] if len(args) > 2 else None)
    skip = oob_skip(kwargs.pop("oob_mode", None), "dma_copy")
    mask = kwargs.pop("mask", None)
    tr = _e.tracer()
    if not isinstance(dst, NkiTensor) or not isinstance(src, NkiTensor):
        raise tr.fail("dma_copy needs dst= and src= tensors")
    for t in (dst, src):
        _e.check_overrun(t, mask, "dma_copy")
    if _asked(src) != _asked(dst):
        raise tr.fail(f"dma_copy of {list(src.shape)} into {list(dst.shape)}: sizes differ")
    if rmw is not None:   # dst = dst + src, added by the DMA (see the module)
        check_add(rmw, "dma_copy(dst_rmw_op=)")
        if mask is not None:
            if dst.indirect is not None or src.indirect is not None:
                raise tr.fail("dma_copy(dst_rmw_op=) with both mask= and an index tile: trnsim clips one or the "
                              "other; mask the index tile instead")
            dst, src = (NkiTensor(t._placement, v, t.bases) for t, v in zip((dst, src), _e.clip(mask, dst, src)))
        return add_into(dst, [dst, src], "dma_copy(dst_rmw_op=)", skip)
    d, s = _e.clip(mask, dst, src)
    if d.size != s.size and dst.indirect is None and src.indirect is None:
        raise tr.fail(f"dma_copy: the mask keeps {list(s.shape)} of src and {list(d.shape)} of dst; an index past "
                      "the end of an HBM tensor must be masked off")
    _e.move(dst, src, mask, skip=skip)
    return dst


def _asked(t: NkiTensor) -> int:
    """How many elements an access asked for, counting those past the end of an HBM tensor."""
    n = 1
    for size, over in zip(t.shape, t.overrun):
        n *= size + over
    return n


#: dma_transpose's permutation for each rank when ``axes`` is not given (NKI's docs)
DMA_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(*args: Any, axes: Any = None, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Permute the axes of ``src`` into ``dst`` by DMA (an SBUF tile by default): by
    ``axes``, else as NKI does for the rank: [A, B] -> [B, A], [A, B, C] -> [C, B, A],
    [A, B, C, D] -> [D, B, C, A]."""
    if "src" in kwargs:
        src, dst = kwargs.pop("src"), kwargs.pop("dst", args[0] if args else None)
    elif len(args) >= 2:
        dst, src = args[0], args[1]
    else:
        src, dst = args[0] if args else None, kwargs.pop("dst", None)
    for key in ("priority", "dge_mode", "name"):
        kwargs.pop(key, None)
    oob_skip(kwargs.pop("oob_mode", None), "dma_transpose")
    if not is_tile(src):
        raise fail(f"dma_transpose needs a tensor src, got {src!r}")
    direct(src, "dma_transpose")
    v = src.view
    perm = DMA_TRANSPOSE_AXES.get(len(v.dims)) if axes is None else tuple(int(a) for a in axes)
    if perm is None or sorted(perm) != list(range(len(v.dims))):
        raise fail(f"dma_transpose of an access pattern of shape {list(v.shape)} with axes={axes!r}: give a "
                   "permutation of its axes (without axes, a 2-, 3- or 4-D one is transposed as NKI does)")
    shape = tuple(v.shape[a] for a in perm)
    out = dst if dst is not None else _e.new_tensor(shape, _e.dtype_of(dtype, src.dtype))
    d = out.view
    if d.shape != shape:
        raise fail(f"dma_transpose of {list(v.shape)} with axes {perm} into {list(out.shape)}: dst must be "
                   f"{list(shape)}")
    tr = _e.tracer()
    if v.tensor.on_chip:
        # an on-chip access cannot step over partitions element by element: trnsim bounces
        # the tile through an HBM scratch tensor (assumption: two DMAs where the hardware's
        # DMA transpose makes one transfer)
        scratch = tr.place(v.shape, src.dtype, Memory.HBM, "dma_transpose").view()
        tr.dma(scratch, v)
        v = scratch
    tr.dma(d, View(v.tensor, v.offset, tuple(v.dims[a] for a in perm)))
    return out


def _on_chip(t: NkiTensor, shape: tuple[int, ...], what: str, skip: bool) -> NkiTensor:
    """``t`` as an SBUF tile of ``shape``: itself, or a copy brought in by DMA."""
    tr = _e.tracer()
    if t.buffer is not Memory.HBM and tuple(t.shape) == shape:
        return t
    if shape[0] > 128:
        raise tr.fail(f"{what}: an operand of {list(t.shape)} in HBM has more than 128 rows for one SBUF tile; "
                      "split it into tiles of at most 128 rows")
    tile = ndarray(shape, t.dtype, buffer=sbuf)
    _e.move(tile, t, skip=skip)
    return tile


def add_into(dst: NkiTensor, srcs: list[NkiTensor], what: str, skip: bool = False) -> NkiTensor:
    """``dst = srcs[0] + srcs[1] + ...`` in fp32, rounded once to ``dst``'s dtype. An
    indirect (scattered) ``dst`` is gathered, added to and scattered back: two indirect
    DMAs, so a row indexed twice gets one of the sums, not both."""
    tr = _e.tracer()
    shape = tuple(dst.shape)
    for s in srcs:
        if not isinstance(s, NkiTensor) or s.view.size != dst.view.size:
            raise tr.fail(f"{what}: every source must be a tensor of {dst.view.size} elements like dst "
                          f"{list(dst.shape)}; got {getattr(s, 'shape', s)!r}")
    tiles = [_on_chip(s, shape, what, skip) for s in srcs]
    if len(tiles) == 1:
        total = tiles[0]
    else:
        total = ndarray(shape, _dt.float32, buffer=sbuf)
        tensor_tensor(dst=total, data1=tiles[0], data2=tiles[1], op=add)
        for t in tiles[2:]:
            tensor_tensor(dst=total, data1=total, data2=t, op=add)
    if dst.buffer is Memory.HBM:
        _e.move(dst, total, skip=skip)
    else:
        tensor_copy(dst=dst, src=total)
    return dst


def check_add(op: Any, what: str) -> None:
    """Refuse a reduce op other than ``nl.add``, naming it."""
    if op is not add and getattr(op, "__name__", None) != "add":
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
