"""Which loads of a compiled graph's results the compiler serves from SBUF.

A compiled graph's kernels traced as one Program (:mod:`trnsim.backend.compile.overlap`)
hand their results on: a kernel stores a result to HBM and a later kernel loads it. The
Neuron compiler keeps such a result in SBUF instead, where it still is: a load is
*forwarded* (moves nothing) when every element it reads was last written to HBM by a
store of an earlier kernel, from SBUF, without converting, the element lands in the
partition it was stored from, on the same core, and nothing has written the space the
store read from since (the data is still there). Anything else moves by DMA as traced.

:class:`Forwarding` keeps what that takes: for each HBM tensor, per element, the store
that last wrote it (-1: none, or a write that cannot be forwarded) and the partition it
came from; for each core's SBUF, per partition and :data:`GRAIN` bytes, the last
instruction that wrote there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trnsim.isa import DmaCopy, Memory, View

#: bytes of SBUF per cell of the map of last writes: SBUF tiles start on 4-byte
#: boundaries (:mod:`trnsim.hw.placement`), so no two tiles share a cell. A write marks
#: every cell it touches, so a write next to a result in the same tile counts as one
#: over it: never forwarded wrongly, at worst moved
GRAIN = 4


def elements(v: View) -> Any:
    """The element offsets in its tensor of each element of ``v``, in order."""
    at = np.array([v.offset], dtype=np.int64)
    for stride, count in v.dims:
        at = (at[:, None] + np.arange(count, dtype=np.int64) * stride).reshape(-1)
    return at


def partitions(v: View) -> Any:
    """The partition of each element of the on-chip view ``v``, in order."""
    t = v.tensor
    return t.start_partition + elements(v) // t.row_elems


class Forwarding:
    """What a segment's trace needs to tell forwarded loads (see the module docstring)."""

    def __init__(self, program: Any) -> None:
        self.program = program
        self._store: dict[int, Any] = {}   # id(HBM tensor) -> per element: index of the store that wrote it
        self._part: dict[int, Any] = {}    # id(HBM tensor) -> per element: the partition it came from
        self._written: dict[int, Any] = {}   # core -> [partitions, cells] index of the last SBUF write

    def _grid(self, core: int) -> Any:
        grid = self._written.get(core)
        if grid is None:
            sbuf = self.program.chip.sbuf
            cells = -(-sbuf.partition_bytes // GRAIN)
            grid = self._written[core] = np.full((sbuf.partitions, cells), -1, dtype=np.int32)
        return grid

    def _cells(self, v: View) -> tuple[slice, slice]:
        """The map's cells that the on-chip view ``v`` spans: its partitions (from the
        first to the last), its bytes in each (from the first to the last)."""
        t = v.tensor
        row = t.row_elems
        first = v.offset
        last = first + sum((count - 1) * stride for stride, count in v.dims if count)
        p0, p1 = t.start_partition + first // row, t.start_partition + last // row
        if p0 == p1:
            f0, f1 = first % row, last % row
        else:   # several partitions: each may hold any of the row's elements the view walks
            free = v.dims[1:]
            f0 = first % row
            f1 = min(row - 1, f0 + sum((count - 1) * stride for stride, count in free if count))
        size = t.dtype.itemsize
        b0, b1 = t.byte_offset + f0 * size, t.byte_offset + (f1 + 1) * size
        return slice(p0, p1 + 1), slice(b0 // GRAIN, -(-b1 // GRAIN))

    def wrote(self, index: int, inst: Any) -> None:
        """Note instruction ``index`` (``inst``), just traced: what it writes."""
        aliases = self.program.aliases
        for w in inst.writes():
            t = w.tensor
            if t.memory is Memory.SBUF:
                rows, cells = self._cells(w)
                self._grid(t.core)[rows, cells] = index
            elif t.memory is Memory.HBM:
                base = aliases.get(id(t))
                if base is not None:   # written as another dtype: none of the base's bytes can be forwarded
                    self._forget(base.view())
                elif inst.__class__ is DmaCopy and inst.src.memory is Memory.SBUF and inst.src.dtype is t.dtype:
                    self._table(t)[0][elements(w)] = index
                    self._part[id(t)][elements(w)] = partitions(inst.src)
                else:
                    self._forget(w)

    def _table(self, t: Any) -> tuple[Any, Any]:
        store = self._store.get(id(t))
        if store is None:
            store = self._store[id(t)] = np.full(t.size, -1, dtype=np.int64)
            self._part[id(t)] = np.full(t.size, -1, dtype=np.int16)
        return store, self._part[id(t)]

    def _forget(self, w: View) -> None:
        store = self._store.get(id(w.tensor))
        if store is not None:
            store[elements(w)] = -1

    def in_sbuf(self, load: DmaCopy, before: int) -> bool:
        """Whether ``load`` (HBM to SBUF) reads only what stores made before instruction
        ``before`` (by earlier kernels) left in SBUF, each element into the partition it
        was stored from, the stores' space unwritten since."""
        src, dst = load.src, load.dst
        if dst.memory is not Memory.SBUF or src.dtype is not dst.dtype or id(src.tensor) in self.program.aliases:
            return False
        store = self._store.get(id(src.tensor))
        if store is None:
            return False
        at = elements(src)
        by = store[at]
        if (by < 0).any() or (by >= before).any():
            return False
        if not (self._part[id(src.tensor)][at] == partitions(dst)).all():
            return False
        instructions = self.program.instructions
        for s in np.unique(by).tolist():
            stored = instructions[s].src
            rows, cells = self._cells(stored)
            since = self._grid(stored.tensor.core)[rows, cells]
            if instructions[s].core != load.core or not since.size or since.max() > s:
                return False   # on another core, or its space written since: the data is gone
        return True
