"""Dependencies between traced instructions, found from the memory they touch.

A traced kernel never names dependencies: each instruction depends on the
earlier ones that wrote what it reads (read after write), and that read or wrote
what it writes (write after read, write after write). Regions are boxes of
partitions x bytes, kept per tensor; a tensor placed where a freed one lived
first waits for everything that touched the freed one, which is how reusing SBUF
space stays safe.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from trnsim.isa import Memory, Tensor, View


@dataclass(frozen=True)
class Region:
    """Partitions [p0, p1) x bytes [b0, b1) of one memory."""

    p0: int
    p1: int
    b0: int
    b1: int

    def overlaps(self, other: Region) -> bool:
        return self.p0 < other.p1 and other.p0 < self.p1 and self.b0 < other.b1 and other.b0 < self.b1

    def covers(self, other: Region) -> bool:
        return self.p0 <= other.p0 and other.p1 <= self.p1 and self.b0 <= other.b0 and other.b1 <= self.b1


def region_of(view: View) -> Region:
    """The box of partitions and bytes ``view`` touches (conservative for strided views)."""
    t = view.tensor
    size = t.dtype.itemsize
    if t.on_chip:
        dims = view.dims[1:]
        lo = view.free_offset
        p0 = view.start_partition
        p1 = p0 + view.partitions
    else:
        dims = view.dims
        lo = view.offset
        p0, p1 = 0, 1
    hi = lo + 1 + sum(s * (c - 1) for s, c in dims if c > 0)
    return Region(p0, p1, t.byte_offset + lo * size, t.byte_offset + hi * size)


def region_of_tensor(t: Tensor) -> Region:
    if t.on_chip:
        return Region(t.start_partition, t.start_partition + t.shape[0], t.byte_offset, t.byte_offset + t.partition_bytes)
    return Region(0, 1, t.byte_offset, t.byte_offset + t.nbytes)


@dataclass
class _Accesses:
    writes: list[tuple[Region, int]] = field(default_factory=list)
    reads: list[tuple[Region, int]] = field(default_factory=list)
    inherited: tuple[int, ...] = ()


class Hazards:
    """Tracks who touched what, per tensor, and turns accesses into dependencies."""

    def __init__(self) -> None:
        self._by_tensor: dict[int, _Accesses] = {}
        self._ghosts: dict[Memory, list[tuple[Region, tuple[int, ...]]]] = {Memory.SBUF: [], Memory.PSUM: []}
        self._longest: dict[Memory, int] = {Memory.SBUF: 0, Memory.PSUM: 0}

    def placed(self, t: Tensor) -> None:
        """A new on-chip tensor: it inherits what touched the space it now holds."""
        acc = _Accesses()
        if t.on_chip:
            box = region_of_tensor(t)
            ghosts = self._ghosts[t.memory]
            # ghosts are sorted by first byte; only those starting before box.b1 and
            # within the longest ghost's length of box.b0 can overlap it
            hi = bisect.bisect_left(ghosts, box.b1, key=lambda g: g[0].b0)
            lo = bisect.bisect_left(ghosts, box.b0 - self._longest[t.memory], key=lambda g: g[0].b0)
            inherited: set[int] = set()
            keep = []
            for region, idx in ghosts[lo:hi]:
                if not region.overlaps(box):
                    keep.append((region, idx))
                    continue
                inherited.update(idx)
                # the new tenant now stands for the overlap; keep only what sticks out
                if box.p0 <= region.p0 and region.p1 <= box.p1:
                    if region.b0 < box.b0:
                        keep.append((Region(region.p0, region.p1, region.b0, box.b0), idx))
                    if box.b1 < region.b1:
                        keep.append((Region(region.p0, region.p1, box.b1, region.b1), idx))
                else:
                    keep.append((region, idx))
            keep.sort(key=lambda g: g[0].b0)
            ghosts[lo:hi] = keep
            acc.inherited = tuple(sorted(inherited))
        self._by_tensor[id(t)] = acc

    def freed(self, t: Tensor) -> None:
        """An on-chip tensor's space is given back; later tenants wait for its accesses."""
        acc = self._by_tensor.pop(id(t), None)
        if acc is None:
            return
        last = {i for _, i in acc.writes} | {i for _, i in acc.reads} | set(acc.inherited)
        if last:
            region = region_of_tensor(t)
            bisect.insort(self._ghosts[t.memory], (region, tuple(sorted(last))), key=lambda g: g[0].b0)
            self._longest[t.memory] = max(self._longest[t.memory], region.b1 - region.b0)

    def written(self, view: View) -> bool:
        """Whether anything has written part of the region ``view`` covers."""
        acc = self._by_tensor.get(id(view.tensor))
        if acc is None:
            return False
        box = region_of(view)
        return any(r.overlaps(box) for r, _ in acc.writes)

    def access(self, index: int, reads: tuple[View, ...], writes: tuple[View, ...]) -> set[int]:
        """Record instruction ``index``'s accesses; return the instructions it must wait for."""
        deps: set[int] = set()
        read_boxes = [(self._by_tensor[id(v.tensor)], region_of(v), v) for v in reads]
        write_boxes = [(self._by_tensor[id(v.tensor)], region_of(v), v) for v in writes]
        for acc, box, _ in read_boxes:
            deps.update(i for r, i in acc.writes if r.overlaps(box))
            deps.update(acc.inherited)
        for acc, box, _ in write_boxes:
            deps.update(i for r, i in acc.writes if r.overlaps(box))
            deps.update(i for r, i in acc.reads if r.overlaps(box))
            deps.update(acc.inherited)
        for acc, box, _ in read_boxes:
            acc.reads.append((box, index))
        for acc, box, v in write_boxes:
            # what this write covers is ordered behind it from now on
            acc.writes = [(r, i) for r, i in acc.writes if not box.covers(r)] + [(box, index)]
            acc.reads = [(r, i) for r, i in acc.reads if not box.covers(r)]
            if acc.inherited and box.covers(region_of_tensor(v.tensor)):
                acc.inherited = ()
        deps.discard(index)
        return deps

    def register(self, t: Tensor) -> None:
        """Start tracking an HBM tensor (never freed, never shared)."""
        self._by_tensor.setdefault(id(t), _Accesses())
