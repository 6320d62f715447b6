"""Data movement between elements and partitions on GpSimd and the vector engine:
``nc_n_gather``, ``local_gather``, ``nonzero_with_count`` and ``nc_stream_shuffle``."""

from __future__ import annotations

import math
from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import (GATHER_GROUP, SHUFFLE_KEEP, SHUFFLE_QUADRANT, Engine, Gather, LocalGather, Memory, NonzeroWithCount,
                        StreamShuffle)
from trnsim.nki import emit as _e
from trnsim.nki.isa._common import fail, is_tile, needs_version, no_mask, same_free, split_dst, take, tile
from trnsim.nki.tiles import NkiTensor


GATHER_ELEMS = (1, 2, 4, 8, 16, 32)


GATHER_MAX_PER_CORE = 4096


def nc_n_gather(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``dst[p, j] = data[p, indices[p, j]]`` within each partition (``data`` seen flat), on GpSimd."""
    no_mask(kwargs, "nc_n_gather")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 3, "data")
    data = tile(take(kwargs, rest, 0, "data"), "nc_n_gather data")
    idx = tile(take(kwargs, rest, 1, "indices"), "nc_n_gather indices")
    out = dst if dst is not None else _e.new_tensor(idx.shape, _e.dtype_of(dtype, data.dtype))
    same_free("nc_n_gather", out, idx)
    _e.emit(Gather(_e.flat2d(out.view), _e.flat2d(data.view), _e.flat2d(idx.view), engine=Engine.GPSIMD))
    return out


def local_gather(*args: Any, num_elem_per_idx: int = 1, num_valid_indices: int | None = None, **kwargs: Any) -> NkiTensor:
    """GpSimd gather inside each group of 16 partitions: the group's ``index`` slice, flattened
    partition first, gives element offsets into each partition of ``src_buffer``; every
    offset reads ``num_elem_per_idx`` elements. Returns [P, num_valid_indices, num_elem_per_idx]."""
    no_mask(kwargs, "local_gather")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 3 and is_tile(a[2]), "src_buffer")
    src = tile(take(kwargs, rest, 0, "src_buffer"), "local_gather src_buffer")
    index = tile(take(kwargs, rest, 1, "index"), "local_gather index")
    elems = int(rest[2] if len(rest) > 2 else num_elem_per_idx)
    num_valid_indices = rest[3] if len(rest) > 3 else num_valid_indices
    p = src.view.partitions
    if index.view.partitions != p or p % GATHER_GROUP:
        raise fail(f"local_gather: src_buffer and index must have the same partitions, a multiple of {GATHER_GROUP} "
                    f"(got {p} and {index.view.partitions})")
    if elems not in GATHER_ELEMS:
        raise fail(f"local_gather: num_elem_per_idx must be one of {list(GATHER_ELEMS)}, got {elems}")
    per_core = index.view.free_size * min(p, GATHER_GROUP)
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= min(per_core, GATHER_MAX_PER_CORE):
        raise fail(f"local_gather: num_valid_indices {valid} must be 1..{min(per_core, GATHER_MAX_PER_CORE)} (the indices "
                    "of a 16-partition index slice, at most 4096)")
    if index.dtype.is_float:
        raise fail(f"local_gather: index is {index.dtype.name}; indices must be integers (uint16 on the hardware)")
    out = dst if dst is not None else _e.new_tensor((p, valid, elems), src.dtype)
    if out.dtype is not src.dtype:
        raise fail(f"local_gather preserves src_buffer's data type: dst is {out.dtype.name}, src_buffer {src.dtype.name}")
    if out.view.free_size != valid * elems:
        raise fail(f"local_gather: dst {list(out.shape)} must hold {valid * elems} elements per partition")
    _e.emit(LocalGather(_e.flat2d(out.view), _e.flat2d(src.view), _e.flat2d(index.view), elems, valid,
                        engine=Engine.GPSIMD))
    return out


def nonzero_with_count(*args: Any, index_offset: int = 0, padding_val: int = -1, **kwargs: Any) -> NkiTensor:
    """On partitions 0, 16, ..., 112 (one per GpSimd core): the positions of the nonzero
    elements of ``src`` [P, T] plus ``index_offset``, then ``padding_val``, then their count,
    into ``dst`` [P, T + 1] (int32); other partitions of ``dst`` are left as they are."""
    no_mask(kwargs, "nonzero_with_count")
    needs_version("nonzero_with_count", 3)
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2, "src")
    src = tile(take(kwargs, rest, 0, "src"), "nonzero_with_count src")
    v = _e.flat2d(src.view)
    out = dst if dst is not None else _e.new_tensor((v.partitions, v.free_size + 1), _dt.int32)
    if src.dtype not in (_dt.float32, _dt.int32) or out.dtype is not _dt.int32:
        raise fail(f"nonzero_with_count: src must be float32 or int32 and dst int32 (got {src.dtype.name}, {out.dtype.name})")
    if out.view.partitions != v.partitions or out.view.free_size != v.free_size + 1:
        raise fail(f"nonzero_with_count: dst {list(out.shape)} must be [{v.partitions}, {v.free_size + 1}]: one more "
                    "element than src for the count")
    for t in (src, out):
        if t.buffer is not Memory.SBUF:
            raise fail(f"nonzero_with_count: {t.name} must be in SBUF")
    _e.emit(NonzeroWithCount(_e.flat2d(out.view), v, int(index_offset), int(padding_val), engine=Engine.GPSIMD))
    return out


def nc_stream_shuffle(*args: Any, **kwargs: Any) -> NkiTensor:
    """Cross-partition copy within each quadrant of 32 partitions (vector engine): ``dst``
    partition ``i`` takes ``src`` partition ``shuffle_mask[i]``; 255 leaves it unchanged."""
    no_mask(kwargs, "nc_stream_shuffle")
    dst = tile(take(kwargs, args, 0, "dst"), "nc_stream_shuffle dst")
    src = tile(take(kwargs, args, 1, "src"), "nc_stream_shuffle src")
    mask = take(kwargs, args, 2, "shuffle_mask")
    try:
        mask = tuple(int(m) for m in mask)
    except (TypeError, ValueError):
        raise fail(f"nc_stream_shuffle: shuffle_mask {mask!r} must be a list of {SHUFFLE_QUADRANT} integers") from None
    if len(mask) != SHUFFLE_QUADRANT or any(not (0 <= m < SHUFFLE_QUADRANT or m == SHUFFLE_KEEP) for m in mask):
        raise fail(f"nc_stream_shuffle: shuffle_mask must hold {SHUFFLE_QUADRANT} partitions 0..31 (or 255 to keep), "
                    f"got {list(mask)}")
    if dst.dtype is not src.dtype:
        raise fail(f"nc_stream_shuffle: dst must have the same data type as src ({dst.dtype.name} vs {src.dtype.name})")
    if dst.view.free_size != src.view.free_size:
        raise fail("nc_stream_shuffle: dst must have the same number of elements per partition as src")
    active = math.ceil(max(dst.view.partitions, src.view.partitions) / SHUFFLE_QUADRANT) * SHUFFLE_QUADRANT
    for t in (src, dst):
        start = t.view.start_partition
        if start % active if active < 96 else start:
            raise fail(f"nc_stream_shuffle: {t.name} starts at partition {start}; with {active} active partitions "
                        f"it must start at a multiple of {active if active < 96 else 128}")
    _e.emit(StreamShuffle(_e.flat2d(dst.view), _e.flat2d(src.view), mask, engine=Engine.VECTOR))
    return dst
