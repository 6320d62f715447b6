"""Top-8 searches of ``nki.isa`` on the vector engine: ``max8``, ``nc_find_index8`` and
``nc_match_replace8``."""

from __future__ import annotations

from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import MAX8_WIDTH, Engine, FindIndex8, MatchReplace8, Max8
from trnsim.nki import emit as _e
from trnsim.nki.isa._common import fail, is_tile, no_mask, out_tile, same_free, split_dst, take, tile
from trnsim.nki.tiles import NkiTensor


MAX8_MAX_FREE = 16384


def _check_search(name: str, src: NkiTensor) -> None:
    if not MAX8_WIDTH <= src.view.free_size <= MAX8_MAX_FREE:
        raise fail(f"{name}: {src.name} has {src.view.free_size} elements per partition; it must have "
                    f"{MAX8_WIDTH} to {MAX8_MAX_FREE}")


def _eight(name: str, t: NkiTensor | None, partitions: int) -> None:
    if t is not None and (t.view.partitions != partitions or t.view.free_size != MAX8_WIDTH):
        raise fail(f"{name}: {t.name}{list(t.shape)} must be [{partitions}, {MAX8_WIDTH}]")


def max8(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """The 8 largest values of each partition of ``src`` (8..16384 elements), descending, [P, 8] (vector engine)."""
    mask = kwargs.pop("mask", None)
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2, "src")
    src = tile(take(kwargs, rest, 0, "src"), "max8 src")
    out = dst if dst is not None else _e.new_tensor((src.view.partitions, MAX8_WIDTH), _e.dtype_of(dtype, src.dtype))
    _eight("max8", out, src.view.partitions)
    (s,), (d,) = _e.clip_rows(mask, [src], [out])  # the mask applies to src; out keeps its partitions
    _check_search("max8", NkiTensor(src._placement, s, src.bases))
    _e.emit(Max8(d, _e.flat2d(s), engine=Engine.VECTOR))
    return out


def nc_find_index8(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Index of the first occurrence of each of the 8 ``vals`` [P, 8] in each partition of ``data``
    (uint32 [P, 8] by default; all ones where a value is absent). Vector engine."""
    no_mask(kwargs, "nc_find_index8")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 3, "data")
    data = tile(take(kwargs, rest, 0, "data"), "nc_find_index8 data")
    vals = tile(take(kwargs, rest, 1, "vals"), "nc_find_index8 vals")
    _check_search("nc_find_index8", data)
    _eight("nc_find_index8", vals, data.view.partitions)
    out = dst if dst is not None else _e.new_tensor((data.view.partitions, MAX8_WIDTH), _e.dtype_of(dtype, _dt.uint32))
    _eight("nc_find_index8", out, data.view.partitions)
    if out.dtype.is_float:
        raise fail(f"nc_find_index8: dst is {out.dtype.name}; indices are written as uint32 (or another integer dtype)")
    _e.emit(FindIndex8(out.view, _e.flat2d(data.view), vals.view, engine=Engine.VECTOR))
    return out


def nc_match_replace8(*args: Any, imm: Any = None, dst_idx: Any = None, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """``data`` with the first occurrence of each of the 8 ``vals`` per partition replaced by
    ``imm``; ``dst_idx`` [P, 8] (optional) gets their positions. Vector engine."""
    mask = kwargs.pop("mask", None)
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 3 and is_tile(a[2]), "data")
    data = tile(take(kwargs, rest, 0, "data"), "nc_match_replace8 data")
    vals = tile(take(kwargs, rest, 1, "vals"), "nc_match_replace8 vals")
    if imm is None:
        imm = take(kwargs, rest, 2, "imm", 0.0)
    _check_search("nc_match_replace8", data)
    _eight("nc_match_replace8", vals, data.view.partitions)
    idx = tile(dst_idx, "nc_match_replace8 dst_idx") if dst_idx is not None else None
    _eight("nc_match_replace8", idx, data.view.partitions)
    out = out_tile(dst, data, dtype)
    same_free("nc_match_replace8", out, data)
    # the mask applies to data (and out, shaped like it); vals and dst_idx keep its partitions
    (o, d), (v, i) = _e.clip_rows(mask, [out, data], [vals, idx])
    _check_search("nc_match_replace8", NkiTensor(data._placement, d, data.bases))
    _e.emit(MatchReplace8(_e.flat2d(o), _e.flat2d(d), v, float(imm), i, engine=Engine.VECTOR))
    return out
