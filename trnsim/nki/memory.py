"""Tiles and memory of ``nki.language``: making tiles, moving data between HBM and SBUF,
copying, and the memories' names.

Value-returning calls make a fresh SBUF tile for the result; an HBM tensor made here
is a kernel output when the kernel returns it.
"""

from __future__ import annotations

import builtins
from numbers import Real
from typing import Any, Sequence

import numpy as np

from trnsim.isa import Memory, View
from trnsim.nki import emit as _e
from trnsim.nki.allocation import DirectAllocation, ModuloTile, at_address, direct_tile
from trnsim.program import partition_start_ok
from trnsim.nki.emit import MatmulResult
from trnsim.nki.indirect import direct
from trnsim.nki.tiles import BlockedTile, Mask, NkiTensor, ParDim, _Placement

# Memories.
sbuf = Memory.SBUF
psum = Memory.PSUM
hbm = Memory.HBM
shared_hbm = Memory.HBM


class _PrivateHbm:
    """``nl.private_hbm``: HBM that each core of a kernel launched over a logical
    NeuronCore (``kernel[2]``) has its own of; with one core, HBM like the rest."""

    memory = Memory.HBM

    def __repr__(self) -> str:
        return "nl.private_hbm"


private_hbm = _PrivateHbm()


# -- creation ---------------------------------------------------------------

def _buffer(buffer: Any) -> Memory:
    if isinstance(buffer, Memory):
        return buffer
    if isinstance(buffer, (DirectAllocation, _PrivateHbm)):
        return buffer.memory
    raise _e.tracer().fail(f"buffer {buffer!r} is not one of nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm")


def ndarray(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str | None = None,
            address: Any = None) -> Any:
    """An uninitialised tensor: a tile in SBUF/PSUM, or an HBM tensor (a kernel output
    when the kernel returns it). A tile shape with dimensions before ``nl.par_dim(n)``
    (legacy block dimensions) gives a :class:`~trnsim.nki.tiles.BlockedTile`. A direct
    allocation (``buffer=ncc.sbuf.mod_alloc(...)``, or ``address=(start_partition,
    byte_offset)`` in SBUF or PSUM) places each block where it says
    (:func:`trnsim.nki.allocation.direct_tile`)."""
    if address is not None:
        if isinstance(buffer, DirectAllocation) or _buffer(buffer) is Memory.HBM:
            raise _e.tracer().fail(f"nl.ndarray address={address!r} places an SBUF or PSUM tile; buffer {buffer!r} "
                                   "takes none")
        buffer = at_address(_buffer(buffer), address)
    if isinstance(buffer, DirectAllocation):
        return direct_tile(tuple(shape), dtype, buffer, name)
    memory = _buffer(buffer)
    shape = tuple(shape)
    k = next((i for i, s_ in enumerate(shape) if isinstance(s_, ParDim)), 0)
    if k and memory is not Memory.HBM:
        physical = (shape[k],) + shape[:k] + shape[k + 1:]
        return BlockedTile(_e.new_tensor(physical, dtype, memory, name), k, tuple(int(s_) for s_ in shape))
    return _e.new_tensor(shape, dtype, memory, name, private=buffer is private_hbm)


def full(shape: Sequence[int], fill_value: float, dtype: Any, buffer: Any = sbuf, name: str | None = None,
         lazy_initialization: bool = False) -> NkiTensor:
    """A tile filled with ``fill_value`` (vector engine memset). Legacy
    ``lazy_initialization`` (when the compiler may place the fill) changes no value and
    is accepted as given."""
    t = ndarray(shape, dtype, buffer, name)
    for tile in t.tiles() if isinstance(t, ModuloTile) else [t]:
        _e.memset(tile.view, float(fill_value), engine=None)
    return t


def zeros(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str | None = None,
          lazy_initialization: bool = False) -> NkiTensor:
    """A zero tile. In PSUM the zeroing is left to the first matmul into it (it starts
    an accumulation group), as the compiler does."""
    if _buffer(buffer) is Memory.PSUM:
        t = ndarray(shape, dtype, buffer, name)
        for tile in t.tiles() if isinstance(t, ModuloTile) else [t]:
            _e.tracer().zeros[id(tile.tensor)] = tile.tensor
        return t
    return full(shape, 0.0, dtype, buffer, name)


def ones(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str | None = None) -> NkiTensor:
    return full(shape, 1.0, dtype, buffer, name)


def zeros_like(a: NkiTensor, dtype: Any = None, buffer: Any = None) -> NkiTensor:
    return zeros(a.shape, dtype or a.dtype, buffer or a.buffer)


def empty_like(a: NkiTensor, dtype: Any = None, buffer: Any = None) -> NkiTensor:
    return ndarray(a.shape, dtype or a.dtype, buffer or a.buffer)


# -- memory -----------------------------------------------------------------

def load(src: NkiTensor, mask: Mask | None = None, dtype: Any = None) -> NkiTensor:
    """DMA ``src`` (HBM) into a fresh SBUF tile; ``dtype`` converts after the load."""
    tr = _e.tracer()
    if not isinstance(src, NkiTensor):
        raise tr.fail(f"nl.load needs an HBM tensor slice, got {src!r}")
    _e.check_overrun(src, mask, "nl.load")
    asked = tuple(s + o for s, o in zip(src.shape, src.overrun))
    shape = asked if len(asked) > 1 else (asked[0], 1) if asked else (1, 1)  # one element: a [1, 1] tile
    tile = _e.new_tensor(shape, src.dtype, Memory.SBUF, bases=src.bases if len(src.shape) > 1 else None)
    _e.move(tile, src, mask)
    if dtype is not None and _e.dtype_of(dtype) is not src.dtype:
        return copy(tile, dtype=dtype)
    return tile


def store(dst: NkiTensor, value: Any, mask: Mask | None = None) -> None:
    """DMA ``value`` (an SBUF tile; a PSUM tile is copied to SBUF first) into ``dst`` (HBM)."""
    tr = _e.tracer()
    if not isinstance(dst, NkiTensor) or dst.buffer is not Memory.HBM:
        raise tr.fail(f"nl.store needs an HBM tensor (or slice of one) as dst, got {dst!r}")
    if isinstance(value, Real):
        shape = dst.shape if len(dst.shape) > 1 else (dst.shape[0], 1)
        value = full(shape, float(value), dst.dtype)
    value = _e.readable(value, "nl.store value")
    _e.check_overrun(dst, mask, "nl.store")
    asked = tuple(n + o for n, o in zip(dst.shape, dst.overrun))
    if any(dst.overrun) and tuple(value.shape) == asked:
        # a value the size of the whole access (past the end included): the mask that keeps
        # the access inside keeps the same leading part of the value
        value = value[tuple(slice(0, n) for n in dst.shape)]
    given = value
    if value.buffer is Memory.PSUM or value.dtype is not dst.dtype:
        value = copy(value, dtype=dst.dtype)
    dst_v, src_v = _e.clip(mask, dst, value)
    if src_v.size != dst_v.size:
        raise tr.fail(_store_mismatch(dst, given, src_v.size, dst_v.size))
    _e.move(dst, value, mask)


def _store_mismatch(dst: NkiTensor, value: NkiTensor, value_size: int, dst_size: int) -> str:
    """Why ``nl.store(dst, value)`` cannot be, and the two shapes that would fit."""
    fix = f"store a {list(dst.shape)} value into {dst.name}"
    if len(value.shape) == len(dst.shape) and builtins.all(v <= d for v, d in zip(value.shape, dst.shape)):
        fix += f", or store {value.name} into a slice of its shape, as in {dst.name}[{', '.join(f'0:{v}' for v in value.shape)}]"
    return (f"nl.store of {value.name}{list(value.shape)} ({value_size} elements) into {dst.name}{list(dst.shape)} "
            f"({dst_size} elements): the sizes differ; {fix}")


def copy(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """A copy of ``x`` in a fresh SBUF tile, converted to ``dtype``."""
    x = _e.readable(x)
    out = _e.like(x, dtype)
    dst, src = _e.clip(mask, out, x)
    _e.copy_to(dst, src, engine=None)
    return out


def copy_into(target: NkiTensor, value: Any) -> None:
    """``tile[...] = value``: a copy (or fill, for a number) into part of a tile. A part
    that starts on a partition the engines cannot start on (``t[5, j] = x``: an engine
    access of up to 32 partitions starts on 0, 32, 64 or 96) is written by a DMA, which
    reaches any partition, from an HBM constant for a number."""
    v = target.view
    by_dma = target.buffer is not Memory.HBM and not partition_start_ok(v.start_partition, v.partitions)
    if isinstance(value, Real):
        if by_dma:
            fill = np.full((v.partitions, v.free_size), float(value)).astype(target.dtype.dtype)
            _e.tracer().dma(_e.flat2d(v), _e.flat2d(shared_constant(fill, dtype=target.dtype).view))
            return
        _e.memset(v, float(value), engine=None)
        return
    value = _e.readable(value)
    if value.view.size != v.size:
        raise _e.tracer().fail(f"assigning {list(value.shape)} elements to {list(target.shape)}: sizes differ")
    src = value.view
    if value.buffer is Memory.SBUF and (by_dma or not partition_start_ok(src.start_partition, src.partitions)):
        _e.tracer().dma(v, src)
        return
    _e.copy_to(v, src, engine=None)



def is_hbm(buffer: Any) -> bool:
    """Whether ``buffer`` is HBM (``nl.hbm``, ``nl.shared_hbm``, ``nl.private_hbm``)."""
    return buffer is Memory.HBM or buffer is private_hbm


def is_sbuf(buffer: Any) -> bool:
    return buffer is Memory.SBUF


def is_psum(buffer: Any) -> bool:
    return buffer is Memory.PSUM


def is_on_chip(buffer: Any) -> bool:
    return buffer in (Memory.SBUF, Memory.PSUM)


def expand_dims(x: NkiTensor, axis: int) -> NkiTensor:
    """A view of ``x`` with a new axis of size 1 at ``axis`` (not the partition axis)."""
    shape = list(x.shape)
    axis = axis if axis >= 0 else len(shape) + 1 + axis
    if axis == 0 and x.tensor.on_chip:
        raise _e.tracer().fail("nl.expand_dims cannot add an axis before the partition axis of a tile")
    shape.insert(axis, 1)
    return x.reshape(shape)


def load_transpose2d(src: NkiTensor, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """Load an HBM [F, P] tensor as an SBUF [P, F] tile: a DMA that walks ``src`` transposed."""
    tr = _e.tracer()
    if not isinstance(src, NkiTensor) or src.buffer is not Memory.HBM or len(src.shape) != 2:
        raise tr.fail(f"nl.load_transpose2d needs a 2-D HBM tensor, got {src!r}")
    direct(src, "nl.load_transpose2d")
    v = src.view
    bases = (*src.bases, None, None)   # an index of integers and slices carries no nl.arange bases
    tile = _e.new_tensor((v.shape[1], v.shape[0]), src.dtype, Memory.SBUF, bases=(bases[1], bases[0]))
    walked = NkiTensor(src._placement, View(v.tensor, v.offset, (v.dims[1], v.dims[0])), tile.bases)
    tr.dma(_e.clip_result(mask, tile), _e.clip_result(mask, walked))
    if dtype is not None and _e.dtype_of(dtype) is not src.dtype:
        return copy(tile, dtype=dtype)
    return tile


def shared_constant(constant: Any, dtype: Any = None) -> NkiTensor:
    """An HBM tensor holding ``constant`` (an array, or the path of a ``.npy`` file),
    given to the kernel as an input; float64 data is stored as float32."""
    tr = _e.tracer()
    data = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    if data.dtype == np.float64:
        data = data.astype(np.float32)
    chip_dtype = _e.dtype_of(dtype if dtype is not None else data.dtype)
    shape = data.shape if data.ndim else (1,)
    t = tr.program.hbm(shape, chip_dtype, tr.fresh_name("constant"), kind="input")
    tr.hazards.register(t)
    tr.constants[t.name] = data.reshape(shape)
    return NkiTensor(_Placement(tr, t), t.view())


#: ml_dtypes' names of the chip's narrow floats, which numpy lacks
_HOST_NARROW = {"bfloat16": "bfloat16", "float8_e4m3": "float8_e4m3", "float8_e4m3fn": "float8_e4m3fn",
                "float8_e5m2": "float8_e5m2"}


def static_cast(value: Any, dtype: Any) -> Any:
    """``value`` converted to ``dtype``: a tile is copied (vector engine); a number or
    array known at trace time is converted on the host with numpy's ``astype``. An array
    cast to bfloat16 or float8 becomes an ml_dtypes array of that type, as NKI's
    ``static_cast`` gives, rounded to nearest even (the finite-only float8_e4m3fn saturates at
    448; float8_e4m3 overflows to infinity past 240, as IEEE 754 formats do), so a
    kernel called on it sees that dtype and its 2 or 1 bytes per element."""
    if isinstance(value, (NkiTensor, MatmulResult)):
        return copy(value, dtype=dtype)
    target = _e.dtype_of(dtype)
    array = np.asarray(value)
    narrow = _HOST_NARROW.get(target.name)
    if narrow is None or array.ndim == 0:
        return array.astype(target.dtype)
    import ml_dtypes

    host = np.dtype(getattr(ml_dtypes, narrow))
    if narrow == "float8_e4m3fn" and array.dtype.kind == "f":
        largest = float(ml_dtypes.finfo(host).max)
        with np.errstate(invalid="ignore"):
            array = np.clip(array.astype(np.float64), -largest, largest)
    return array.astype(host)
