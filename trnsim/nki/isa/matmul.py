"""The tensor engine's instructions of ``nki.isa``: ``nc_matmul`` and ``nc_transpose``
(through the PE array, or 32x32 blocks on the vector engine)."""

from __future__ import annotations

import enum
from typing import Any

from trnsim.isa import BlockTranspose, Engine, Memory
from trnsim.nki import emit as _e
from trnsim.nki.compute import matmul
from trnsim.nki.isa._common import fail, pick_engine, split_dst
from trnsim.nki.tiles import NkiTensor

BLOCK_TRANSPOSE_MAX = 32


def nc_matmul(*args: Any, **kwargs: Any) -> NkiTensor:
    """``stationary.T @ moving`` on the tensor engine: ``nc_matmul(dst, stationary, moving)``
    accumulates into the PSUM tile ``dst`` (the first matmul into fresh space starts the
    accumulation group); ``nc_matmul(stationary, moving)`` returns the result, which an
    assignment (``t[...] = ...``) or ``+=`` writes straight into that PSUM tile and any
    other use puts in a fresh PSUM tile.
    stationary [K, M] (K <= 128 partitions, M <= 128), moving [K, N] (N <= 512).
    ``perf_mode=nisa.matmul_perf_mode.double_row`` (NC-v3 and later, fp8): stationary
    [K, 2, M] and moving [K, 2, N] contract over 2K rows in the time of one [K, ...]
    matmul. ``tile_position`` and ``tile_size`` (row and column tiling) are accepted and
    not modelled: the matmul is timed on the whole PE array."""
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 3, "stationary")
    # transpose mode (``moving`` an identity): the stationary's values move through the PE
    # array bit for bit, NaN and Inf included, into PSUM in their own dtype
    transpose_mode = bool(kwargs.pop("is_transpose", False))
    stationary = kwargs.pop("stationary", rest[0] if rest else None)
    moving = kwargs.pop("moving", rest[1] if len(rest) > 1 else None)
    double_row = _double_row(kwargs.pop("perf_mode", None))
    result = matmul(stationary, moving, transpose_x=True, mask=kwargs.pop("mask", None), transpose_mode=transpose_mode,
                    double_row=double_row)
    if dst is None:
        # lands where it goes: ``t[...] = nc_matmul(...)`` writes t's PSUM and ``t += ...``
        # accumulates there; anything else, or the next instruction, puts it in a fresh
        # PSUM tile first (so the program order stays as written)
        _e.tracer().hold_matmul(result)
        return result  # type: ignore[return-value]
    result.accumulate_into(dst)
    return dst


# perf_mode values: NKI's enum, its value, and the name earlier releases used on NC-v3
_PERF_MODES = {None: False, "none": False, "double_row": True, "double_row_gen3": True}


def _double_row(perf_mode: Any) -> bool:
    """Whether ``perf_mode`` asks for the fp8 double-row mode."""
    key = perf_mode.value if isinstance(perf_mode, enum.Enum) else perf_mode
    if not isinstance(key, (str, type(None))) or key not in _PERF_MODES:
        raise fail(f"nc_matmul perf_mode={perf_mode!r} is not a performance mode; use nisa.matmul_perf_mode.none or "
                   "nisa.matmul_perf_mode.double_row")
    return _PERF_MODES[key]


def nc_transpose(*args: Any, engine: Any = None, **kwargs: Any) -> NkiTensor:
    """[P, F] -> [F, P]: through the PE array (tensor engine, into PSUM) by default."""
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 2, "data")
    data = _e.readable(kwargs.pop("data", rest[0] if rest else None), "nc_transpose data")
    eng = pick_engine(engine, Engine.TENSOR)
    if eng is Engine.VECTOR:
        return vector_transpose(dst, data)
    if eng is not Engine.TENSOR:
        raise _e.tracer().fail("nc_transpose runs on the tensor engine or (32x32 at most) the vector engine; "
                               "pass engine=nisa.tensor_engine or nisa.vector_engine")
    out = dst if dst is not None else _e.new_tensor((data.view.free_size, data.view.partitions), data.dtype, Memory.PSUM)
    _e.transpose(out.view, _e.flat2d(data.view))
    return out


def vector_transpose(dst: NkiTensor | None, data: NkiTensor) -> NkiTensor:
    """[P, F] -> [F, P] on the vector engine, for P and F at most 32."""
    v = _e.flat2d(data.view)
    if v.partitions > BLOCK_TRANSPOSE_MAX or v.free_size > BLOCK_TRANSPOSE_MAX:
        raise fail(f"nc_transpose on the vector engine handles at most {BLOCK_TRANSPOSE_MAX}x{BLOCK_TRANSPOSE_MAX}, "
                    f"got {list(data.shape)}; use the tensor engine (the default) for larger tiles")
    out = dst if dst is not None else _e.new_tensor((v.free_size, v.partitions), data.dtype)
    _e.emit(BlockTranspose(out.view, v, engine=Engine.VECTOR))
    return out
