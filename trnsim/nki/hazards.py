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

from trnsim.isa import Memory, Tensor, View, dims_extent


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
    """The box ``view`` touches: partitions x bytes on chip; rows x bytes within a row in
    HBM (so column slices of an HBM tensor do not overlap). Conservative for strides."""
    t = view.tensor
    size = t.dtype.itemsize
    row = t.row_elems
    if t.on_chip:
        p0 = view.start_partition
        lo = view.free_offset
        return Region(p0, p0 + view.partitions, t.byte_offset + lo * size,
                      t.byte_offset + (lo + dims_extent(view.dims[1:])) * size)
    lo = view.offset
    rest = dims_extent(view.dims[1:])
    if view.dims and view.dims[0][0] == row and lo % row + rest <= row:
        p0, c0, c1 = lo // row, lo % row, lo % row + rest
        p1 = p0 + view.dims[0][1]
    else:
        hi = lo + dims_extent(view.dims)
        p0, p1 = lo // row, (hi - 1) // row + 1
        c0, c1 = (lo % row, (hi - 1) % row + 1) if p1 - p0 == 1 else (0, row)
    return Region(p0, p1, t.byte_offset + c0 * size, t.byte_offset + c1 * size)


def region_of_tensor(t: Tensor) -> Region:
    if t.on_chip:
        return Region(t.start_partition, t.start_partition + t.shape[0], t.byte_offset, t.byte_offset + t.partition_bytes)
    return Region(0, t.shape[0], t.byte_offset, t.byte_offset + t.row_elems * t.dtype.itemsize)


class RegionList:
    """(region, value) pairs kept sorted by first byte, so the pairs that can overlap a
    box are found by bisection: those starting before the box ends, and no further
    back than the longest region."""

    def __init__(self) -> None:
        self.items: list[tuple[Region, object]] = []
        self._longest = 0

    def __iter__(self):
        return iter(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def span(self, box: Region) -> tuple[int, int]:
        """Indices [lo, hi) of the items that may overlap ``box``."""
        hi = bisect.bisect_left(self.items, box.b1, key=lambda g: g[0].b0)
        lo = bisect.bisect_left(self.items, box.b0 - self._longest, key=lambda g: g[0].b0, hi=hi)
        return lo, hi

    def overlapping(self, box: Region):
        lo, hi = self.span(box)
        return [(r, v) for r, v in self.items[lo:hi] if r.overlaps(box)]

    def add(self, region: Region, value: object) -> None:
        bisect.insort(self.items, (region, value), key=lambda g: g[0].b0)
        self._longest = max(self._longest, region.b1 - region.b0)

    def replace(self, box: Region, keep: "list[tuple[Region, object]]") -> None:
        """Put ``keep`` where the items that may overlap ``box`` were."""
        lo, hi = self.span(box)
        keep.sort(key=lambda g: g[0].b0)
        self.items[lo:hi] = keep
        for r, _ in keep:
            self._longest = max(self._longest, r.b1 - r.b0)

    def drop_covered(self, box: Region) -> None:
        """Forget the items ``box`` covers wholly."""
        lo, hi = self.span(box)
        self.items[lo:hi] = [(r, v) for r, v in self.items[lo:hi] if not box.covers(r)]


def _first_row(g: tuple[Region, object]) -> int:
    return g[0].p0


def _first_byte(g: tuple[Region, object]) -> int:
    return g[0].b0


class RowIndexedRegionList(RegionList):
    """A :class:`RegionList` for HBM, where accesses are disjoint by columns (column
    blocks of one set of rows) or by rows (row tiles of the same columns): the pairs
    are also kept sorted by first row, and each query bisects whichever order leaves
    fewer candidates, so both patterns trace in linear time."""

    def __init__(self) -> None:
        super().__init__()
        self._by_row: list[tuple[Region, object]] = []
        self._tallest = 0

    def _candidates(self, box: Region) -> list[tuple[Region, object]]:
        lo, hi = self.span(box)
        row_hi = bisect.bisect_left(self._by_row, box.p1, key=_first_row)
        row_lo = bisect.bisect_left(self._by_row, box.p0 - self._tallest, key=_first_row, hi=row_hi)
        if row_hi - row_lo < hi - lo:
            return self._by_row[row_lo:row_hi]
        return self.items[lo:hi]

    def overlapping(self, box: Region):
        return [(r, v) for r, v in self._candidates(box) if r.overlaps(box)]

    def add(self, region: Region, value: object) -> None:
        pair = (region, value)
        bisect.insort(self.items, pair, key=_first_byte)
        bisect.insort(self._by_row, pair, key=_first_row)
        self._longest = max(self._longest, region.b1 - region.b0)
        self._tallest = max(self._tallest, region.p1 - region.p0)

    def replace(self, box: Region, keep: list[tuple[Region, object]]) -> None:
        raise NotImplementedError("HBM region lists are never replaced; only on-chip ghost lists are")

    def drop_covered(self, box: Region) -> None:
        for pair in [g for g in self._candidates(box) if box.covers(g[0])]:
            for items, key in ((self.items, _first_byte), (self._by_row, _first_row)):
                i = bisect.bisect_left(items, key(pair), key=key)
                while items[i] is not pair:
                    i += 1
                del items[i]


@dataclass
class _Accesses:
    writes: RegionList = field(default_factory=RegionList)
    reads: RegionList = field(default_factory=RegionList)
    inherited: tuple[int, ...] = ()


class Hazards:
    """Tracks who touched what, per tensor, and turns accesses into dependencies."""

    def __init__(self) -> None:
        self._by_tensor: dict[int, _Accesses] = {}
        self._ghosts: dict[Memory, RegionList] = {Memory.SBUF: RegionList(), Memory.PSUM: RegionList()}

    def placed(self, t: Tensor) -> None:
        """A new on-chip tensor: it inherits what touched the space it now holds."""
        acc = _Accesses()
        if t.on_chip:
            box = region_of_tensor(t)
            ghosts = self._ghosts[t.memory]
            lo, hi = ghosts.span(box)
            inherited: set[int] = set()
            keep = []
            for region, idx in ghosts.items[lo:hi]:
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
            ghosts.replace(box, keep)
            acc.inherited = tuple(sorted(inherited))
        self._by_tensor[id(t)] = acc

    def freed(self, t: Tensor) -> None:
        """An on-chip tensor's space is given back; later tenants wait for its accesses."""
        acc = self._by_tensor.pop(id(t), None)
        if acc is None:
            return
        last = {i for _, i in acc.writes} | {i for _, i in acc.reads} | set(acc.inherited)
        if last:
            self._ghosts[t.memory].add(region_of_tensor(t), tuple(sorted(last)))

    def written(self, view: View) -> bool:
        """Whether anything has written part of the region ``view`` covers."""
        acc = self._by_tensor.get(id(view.tensor))
        if acc is None:
            return False
        return bool(acc.writes.overlapping(region_of(view)))

    def access(self, index: int, reads: tuple[View, ...], writes: tuple[View, ...]) -> set[int]:
        """Record instruction ``index``'s accesses; return the instructions it must wait for."""
        deps: set[int] = set()
        read_boxes = [(self._by_tensor[id(v.tensor)], region_of(v), v) for v in reads]
        write_boxes = [(self._by_tensor[id(v.tensor)], region_of(v), v) for v in writes]
        for acc, box, _ in read_boxes:
            deps.update(i for _, i in acc.writes.overlapping(box))
            deps.update(acc.inherited)
        for acc, box, _ in write_boxes:
            deps.update(i for _, i in acc.writes.overlapping(box))
            deps.update(i for _, i in acc.reads.overlapping(box))
            deps.update(acc.inherited)
        for acc, box, _ in read_boxes:
            acc.reads.add(box, index)
        for acc, box, v in write_boxes:
            # what this write covers is ordered behind it from now on
            acc.writes.drop_covered(box)
            acc.writes.add(box, index)
            acc.reads.drop_covered(box)
            if acc.inherited and box.covers(region_of_tensor(v.tensor)):
                acc.inherited = ()
        deps.discard(index)
        return deps

    def register(self, t: Tensor) -> None:
        """Start tracking an HBM tensor (never freed, never shared)."""
        self._by_tensor.setdefault(id(t), _Accesses(RowIndexedRegionList(), RowIndexedRegionList()))
