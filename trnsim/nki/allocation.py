"""NKI's direct allocation: tiles at addresses the kernel chose (``ncc.sbuf.alloc``,
``ncc.sbuf.mod_alloc``, ``ncc.psum.alloc``, ``ncc.psum.mod_alloc``).

A tensor ``(B..., par_dim(P), F...)`` has logical blocks ``B``; the allocation maps each
block index to a physical tile, so several blocks may share one (modulo allocation:
block ``i`` lives in physical tile ``i % n``). trnsim places each logical block as a
tensor of its own at its physical address; tensors that share space are aliased (see
:mod:`trnsim.nki.hazards`): a write into a block waits for the last reader of whatever
lived there, and reading a block whose bytes another block overwrote is refused as the
lifetime conflict it is.
"""

from __future__ import annotations

import itertools
import math
import sys
from typing import Any, Callable, Sequence

import numpy as np

from trnsim.isa import MEMORY_NAMES, Memory, Tensor, View
from trnsim.nki import emit as _e
from trnsim.nki.tiles import _TEMPORARY_REFS, NkiTensor, ParDim, _Placement
from trnsim.nki.tracer import caller_location

#: ``func(idx=, pdim_size=, fdim_size=)`` (called with keywords, as the compiler does)
#: -> (start_partition, byte_addr) in SBUF, or (bank, start_partition, byte_addr) in PSUM
LocateFunc = Callable[[tuple[int, ...], int, int], Sequence[int]]


class DirectAllocation:
    """What ``buffer=ncc.sbuf.mod_alloc(...)`` (and the other direct allocators) gives:
    the memory and the function placing each logical block."""

    def __init__(self, memory: Memory, func: LocateFunc, what: str, every_iteration: bool = False) -> None:
        if not callable(func):
            raise _e.tracer().fail(f"{what} takes a function (idx, pdim_size, fdim_size) -> address, got {func!r}")
        self.memory = memory
        self.func = func
        self.what = what
        #: placed where each loop iteration says (``address=``, whose loops Python runs
        #: iteration by iteration), not where the loop body's first run placed it
        self.every_iteration = every_iteration

    def locate(self, idx: tuple[int, ...], pdim: int, fdim_bytes: int, bank_bytes: int) -> tuple[int, int]:
        """(start partition, byte offset) of logical block ``idx``."""
        got = tuple(int(x) for x in self.func(idx=idx, pdim_size=pdim, fdim_size=fdim_bytes))
        if self.memory is Memory.PSUM:
            if len(got) != 3:
                raise _e.tracer().fail(f"{self.what}: the function gave {got} for block {idx}; a PSUM allocation gives "
                                       "(bank, start_partition, byte_addr)")
            bank, partition, addr = got
            return partition, bank * bank_bytes + addr
        if len(got) != 2:
            raise _e.tracer().fail(f"{self.what}: the function gave {got} for block {idx}; an SBUF allocation gives "
                                   "(start_partition, byte_addr)")
        return got[0], got[1]

    def __repr__(self) -> str:
        return self.what


def modulo(base: int, tiles: tuple[int, ...], scale: int) -> Callable[[tuple[int, ...]], int]:
    """Block index -> ``base + scale * k``, ``k`` the index modulo ``tiles`` read row-major
    (no ``tiles``: every block at ``base``), as the NKI documentation defines modulo
    allocation."""

    def at(idx: tuple[int, ...]) -> int:
        shape = tuple(tiles) if tiles else (1,) * len(idx)
        wrapped = [i % n for i, n in zip(idx, shape)]
        k = sum(i * math.prod(shape[d + 1:]) for d, i in enumerate(wrapped))
        return base + k * scale

    return at


def sbuf_mod_alloc(base_addr: int = 0, *, base_partition: int = 0, num_par_tiles: tuple[int, ...] = (),
                   num_free_tiles: tuple[int, ...] = ()) -> DirectAllocation:
    """``ncc.sbuf.mod_alloc``: logical block ``idx`` at byte ``base_addr + (idx mod
    num_free_tiles) * tile bytes`` of partition ``base_partition + (idx mod num_par_tiles) * P``."""

    def func(idx: tuple[int, ...], pdim_size: int, fdim_size: int) -> tuple[int, int]:
        return modulo(base_partition, num_par_tiles, pdim_size)(idx), modulo(base_addr, num_free_tiles, fdim_size)(idx)

    return DirectAllocation(Memory.SBUF, func, f"ncc.sbuf.mod_alloc(base_addr={base_addr}, "
                                               f"num_free_tiles={tuple(num_free_tiles)})")


def psum_mod_alloc(base_addr: int = 0, *, base_bank: int = 0, num_bank_tiles: tuple[int, ...] = (),
                   base_partition: int = 0, num_par_tiles: tuple[int, ...] = (),
                   num_free_tiles: tuple[int, ...] = ()) -> DirectAllocation:
    """``ncc.psum.mod_alloc``: logical block ``idx`` in bank ``base_bank + (idx mod
    num_bank_tiles)``, so more logical blocks than banks take turns in them."""

    def func(idx: tuple[int, ...], pdim_size: int, fdim_size: int) -> tuple[int, int, int]:
        return (modulo(base_bank, num_bank_tiles, 1)(idx), modulo(base_partition, num_par_tiles, pdim_size)(idx),
                modulo(base_addr, num_free_tiles, fdim_size)(idx))

    return DirectAllocation(Memory.PSUM, func, f"ncc.psum.mod_alloc(base_bank={base_bank}, "
                                               f"num_bank_tiles={tuple(num_bank_tiles)})")


def at_address(memory: Memory, address: Any) -> DirectAllocation:
    """``nl.ndarray(..., address=(start_partition, byte_offset))``: the tile at that place
    of SBUF, or of PSUM (the offset counting on across its banks, as ``bank * 2048``)."""
    if not (isinstance(address, (tuple, list)) and len(address) == 2
            and all(isinstance(a, (int, np.integer)) for a in address)):
        raise _e.tracer().fail(f"nl.ndarray address={address!r} must be (start_partition, byte_offset), two integers")
    partition, offset = int(address[0]), int(address[1])
    if memory is Memory.PSUM:
        return DirectAllocation(memory, lambda idx, pdim_size, fdim_size: (0, partition, offset),
                                f"psum address=({partition}, {offset})", every_iteration=True)
    return DirectAllocation(memory, lambda idx, pdim_size, fdim_size: (partition, offset),
                            f"sbuf address=({partition}, {offset})", every_iteration=True)


class ModuloTile:
    """A tensor with logical blocks before its partition dimension, each block a tile at
    the physical place its allocation gave (blocks may share one). Index the blocks with
    integers first: ``t[i]``, ``t[i, j, :, 0:128]``; ``t[i] = value`` writes block ``i``."""

    __slots__ = ("blocks", "shape", "name", "_tiles")

    def __init__(self, name: str, shape: tuple[int, ...], blocks: int, tiles: dict[tuple[int, ...], NkiTensor]) -> None:
        self.name = name
        self.shape = shape
        self.blocks = blocks
        self._tiles = tiles

    @property
    def dtype(self) -> Any:
        return next(iter(self._tiles.values())).dtype

    @property
    def buffer(self) -> Memory:
        return next(iter(self._tiles.values())).buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def view(self) -> View:
        raise _e.tracer().fail(f"{self.name}{list(self.shape)} is {math.prod(self.shape[:self.blocks])} logical blocks "
                               f"placed apart; index a block first (as in {self.name}[0])")

    def tiles(self) -> list[NkiTensor]:
        """Every logical block, in index order."""
        return list(self._tiles.values())

    def block(self, idx: tuple[int, ...]) -> NkiTensor:
        """Logical block ``idx`` (a tile); its ``tensor`` says where it lives."""
        return self._tiles[tuple(i % n for i, n in zip(idx, self.shape))]

    def _split(self, index: object) -> tuple[NkiTensor, tuple[object, ...]]:
        index = index if isinstance(index, tuple) else (index,)
        head, rest = index[: self.blocks], index[self.blocks:]
        if len(head) < self.blocks or not all(isinstance(i, int) for i in head):
            raise _e.tracer().fail(f"index the block dimensions of {self.name}{list(self.shape)} with integers first "
                                   f"(as in {self.name}[{', '.join('0' * self.blocks)}]); got {index!r}")
        for axis, (i, n) in enumerate(zip(head, self.shape)):
            if not -n <= i < n:
                raise _e.tracer().fail(f"block index {i} is out of range for dimension {axis} of size {n} of {self.name}")
        return self.block(tuple(int(i) for i in head)), rest

    def __getitem__(self, index: object) -> NkiTensor:
        block, rest = self._split(index)
        return block[rest] if rest else block

    def __setitem__(self, index: object, value: object) -> None:
        # as NkiTensor.__setitem__: a value nothing else holds is written in place by the
        # instruction that made it (counted here, before the calls below hold it too)
        temporary = sys.getrefcount(value) <= _TEMPORARY_REFS
        block, rest = self._split(index)
        block.assign(rest if rest else (slice(None),), value, temporary)

    def __repr__(self) -> str:
        return f"ModuloTile({self.name}{list(self.shape)}, {self.blocks} block dims)"


def _site() -> tuple[tuple[str, int], ...]:
    """The kernel's call stack (file, line) outside trnsim, innermost first: where a
    direct allocation is evaluated."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None and len(frames) < 16:
        name = frame.f_code.co_filename
        if "trnsim" not in name.replace("\\", "/").split("/"):
            frames.append((name, frame.f_lineno))
        frame = frame.f_back
    return tuple(frames)


def direct_tile(shape: tuple[Any, ...], dtype: Any, alloc: DirectAllocation, name: str | None) -> NkiTensor | ModuloTile:
    """Place ``nl.ndarray(shape, dtype, buffer=alloc)``: each logical block at the address
    ``alloc`` gives it (inside a loop, the addresses the first iteration gave)."""
    tr = _e.tracer()
    k = next((i for i, s in enumerate(shape) if isinstance(s, ParDim)), 0)
    dims = tuple(int(s) for s in shape)
    blocks, tile_shape = dims[:k], dims[k:]
    if len(tile_shape) == 1:
        tile_shape = (tile_shape[0], 1)
    dt = _e.dtype_of(dtype)
    fdim = math.prod(tile_shape[1:]) * dt.itemsize
    bank = tr.chip.psum.bank_bytes
    indices = list(itertools.product(*(range(b) for b in blocks)))
    def compute() -> list[tuple[int, int]]:
        return [alloc.locate(idx, tile_shape[0], fdim, bank) for idx in indices]

    places = compute() if alloc.every_iteration else tr.direct_locations((_site(), dims, dt.name, alloc.memory), compute)
    base = tr.fresh_name(name or MEMORY_NAMES[alloc.memory])
    if name is None:
        tr.program.made_at[base] = caller_location()
    serial = tr.new_tile()
    tiles: dict[tuple[int, ...], NkiTensor] = {}
    for idx, (partition, offset) in zip(indices, places):
        label = f"{base}[{', '.join(map(str, idx))}]" if idx else base
        t: Tensor = tr.place_at(tile_shape, dt, alloc.memory, label, partition, offset, serial)
        tiles[idx] = NkiTensor(_Placement(tr, t), t.view())
    if not blocks:
        return tiles[()]
    return ModuloTile(base, dims, k, tiles)
