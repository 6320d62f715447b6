"""Dependencies between traced instructions, found from the memory they touch.

A traced kernel never names dependencies: each instruction depends on the
earlier ones that wrote what it reads (read after write), and that read or wrote
what it writes (write after read, write after write). Regions are boxes of
partitions x bytes, kept per tensor; a tensor placed where a freed one lived
first waits for everything that touched the freed one, which is how reusing SBUF
space stays safe.

The compiler owns the placement of the tiles it allocates, and it renames them: a write
that covers every earlier access of the bytes it writes (a loop refilling the same tile)
goes to another copy of them, so it waits for neither the readers nor the writer of the
data it replaces, as long as no more than :data:`RENAME_BUFFERS` copies are in use and
SBUF has room for them (``room``, asked of the allocator). The Neuron compiler documents
the trade as its own ("the compiler could choose to allocate 2 physical tiles ... a
space-time tradeoff at liberty", NKI's block-dimension migration guide); how many copies
it takes is not published (assumption). A tile the kernel placed itself (direct
allocation) is never renamed: it lives where the kernel said.

Tensors that share space while live (NKI's direct allocation, and the logical blocks a
modulo allocation maps onto fewer physical tiles) are *aliased*: their accesses are
kept together per memory, in the memory's own addresses, so a write into a block
waits for the last reader of whatever else lives at those addresses. Reading a block
whose bytes another block wrote since is a lifetime conflict (:class:`AliasConflict`).

This runs once per traced instruction, so it is written for speed: regions are
tuples, sorted lists bisect on parallel lists of plain integers, and short lists
are scanned whole (bisecting only narrows the scan, it never changes what is found).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Container

from bisect import bisect_left, bisect_right
from typing import Iterator, NamedTuple

from trnsim.isa import Memory, Tensor, View

# Lists this short are scanned whole rather than bisected.
_SCAN = 8

#: Copies of a rewritten SBUF region the compiler keeps in use at once, the one being
#: written included (assumption: the compiler's choice is not published).
RENAME_BUFFERS = 4

#: ``room(view, copies)``: whether SBUF has room now for ``copies`` more of ``view``'s region.
Room = Callable[[View, int], bool]


class Region(NamedTuple):
    """Partitions [p0, p1) x bytes [b0, b1) of one memory."""

    p0: int
    p1: int
    b0: int
    b1: int

    def overlaps(self, other: Region) -> bool:
        return self[0] < other[1] and other[0] < self[1] and self[2] < other[3] and other[2] < self[3]

    def covers(self, other: Region) -> bool:
        return self[0] <= other[0] and other[1] <= self[1] and self[2] <= other[2] and other[3] <= self[3]


def _extent(dims: tuple[tuple[int, int], ...]) -> int:
    """Elements from the first element ``dims`` walk to one past the last (as ``dims_extent``)."""
    n = 1
    for s, c in dims:
        if c > 0:
            n += s * (c - 1)
    return n


def region_of(view: View) -> Region:
    """The box ``view`` touches: partitions x bytes on chip; rows x bytes within a row in
    HBM (so column slices of an HBM tensor do not overlap). Conservative for strides.
    Returned as a plain tuple laid out as :class:`Region` (cheaper to make)."""
    t = view.tensor
    size = t.dtype.itemsize
    row = t.row_elems
    dims = view.dims
    off = view.offset
    base = t.byte_offset
    rest = 1  # _extent(dims[1:]) written out: this runs for every operand
    for s, c in dims[1:]:
        if c > 0:
            rest += s * (c - 1)
    if t.on_chip:
        p0 = t.start_partition + off // row
        lo = off % row
        return (p0, p0 + view.partitions, base + lo * size, base + (lo + rest) * size)
    c0 = off % row
    if dims and dims[0][0] == row and c0 + rest <= row:
        p0 = off // row
        return (p0, p0 + dims[0][1], base + c0 * size, base + (c0 + rest) * size)
    hi = off + _extent(dims)
    p0, p1 = off // row, (hi - 1) // row + 1
    c0, c1 = (c0, (hi - 1) % row + 1) if p1 - p0 == 1 else (0, row)
    return (p0, p1, base + c0 * size, base + c1 * size)


def region_of_tensor(t: Tensor) -> Region:
    """The box all of ``t`` covers (a plain tuple laid out as :class:`Region`)."""
    if t.on_chip:
        return (t.start_partition, t.start_partition + t.shape[0], t.byte_offset, t.byte_offset + t.partition_bytes)
    return (0, t.shape[0], t.byte_offset, t.byte_offset + t.row_elems * t.dtype.itemsize)


def _covers(a: Region, b: Region) -> bool:
    return a[0] <= b[0] and b[1] <= a[1] and a[2] <= b[2] and b[3] <= a[3]


def _hits(pairs: list[tuple[Region, object]], box: Region) -> list[tuple[Region, object]]:
    p0, p1, b0, b1 = box
    return [g for g in pairs if g[0][0] < p1 and p0 < g[0][1] and g[0][2] < b1 and b0 < g[0][3]]


class RegionList:
    """(region, value) pairs kept sorted by first byte, so the pairs that can overlap a
    box are found by bisection: those starting before the box ends, and no further
    back than the longest region."""

    __slots__ = ("items", "_keys", "_longest")

    def __init__(self) -> None:
        self.items: list[tuple[Region, object]] = []
        self._keys: list[int] = []   # each item's first byte, for bisecting
        self._longest = 0

    def __iter__(self) -> Iterator[tuple[Region, object]]:
        return iter(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def span(self, box: Region) -> tuple[int, int]:
        """Indices [lo, hi) of the items that may overlap ``box``."""
        keys = self._keys
        hi = bisect_left(keys, box[3])
        return bisect_left(keys, box[2] - self._longest, 0, hi), hi

    def _candidates(self, box: Region) -> list[tuple[Region, object]]:
        """The items that may overlap ``box``: all of a short list, else a bisected slice."""
        items = self.items
        if len(items) <= _SCAN:
            return items
        lo, hi = self.span(box)
        return items[lo:hi]

    def overlapping(self, box: Region) -> list[tuple[Region, object]]:
        """The items that overlap ``box``."""
        return _hits(self._candidates(box), box)

    def values_overlapping(self, box: Region) -> list[object]:
        """The values of the items that overlap ``box`` (what the dependency analysis asks)."""
        items = self.items
        if len(items) > _SCAN:
            items = self._candidates(box)
        p0, p1, b0, b1 = box
        return [v for r, v in items if r[0] < p1 and p0 < r[1] and r[2] < b1 and b0 < r[3]]

    def add(self, region: Region, value: object) -> None:
        b0 = region[2]
        keys = self._keys
        i = bisect_right(keys, b0)
        keys.insert(i, b0)
        self.items.insert(i, (region, value))
        if region[3] - b0 > self._longest:
            self._longest = region[3] - b0

    def take(self, box: Region) -> set:
        """Give ``box`` to a new tenant: returns the values (tuples of instruction indices)
        of the items that overlap it, and trims each to what sticks out of it: the
        partitions ``box`` does not span whole, and on the ones it does, the bytes
        before and after it."""
        items = self.items
        keys = self._keys
        p0, p1, b0, b1 = box
        hi = bisect_left(keys, b1)
        lo = bisect_left(keys, b0 - self._longest, 0, hi)
        taken: set[int] = set()
        keep = []       # in first-byte order: left pieces keep their item's first byte
        moved = []      # right pieces start at b1, so they are inserted afresh
        for pair in items[lo:hi]:
            region, idx = pair
            r0, r1, rb0, rb1 = region
            if not (r0 < p1 and p0 < r1 and rb0 < b1 and b0 < rb1):
                keep.append(pair)
                continue
            taken.update(idx)
            if r0 < p0:
                keep.append(((r0, p0, rb0, rb1), idx))
            if p1 < r1:
                keep.append(((p1, r1, rb0, rb1), idx))
            q0, q1 = max(r0, p0), min(r1, p1)
            if rb0 < b0:
                keep.append(((q0, q1, rb0, b0), idx))
            if b1 < rb1:
                moved.append(((q0, q1, b1, rb1), idx))
        if taken:
            items[lo:hi] = keep
            keys[lo:hi] = [r[2] for r, _ in keep]
            for region, idx in moved:
                i = bisect_right(keys, b1)
                keys.insert(i, b1)
                items.insert(i, (region, idx))
        return taken

    def drop_covered(self, box: Region) -> list[tuple[Region, object]]:
        """Forget the items ``box`` covers wholly; returns them."""
        items = self.items
        lo, hi = (0, len(items)) if len(items) <= _SCAN else self.span(box)
        p0, p1, b0, b1 = box
        kept: list[tuple[Region, object]] = []
        dropped: list[tuple[Region, object]] = []
        for g in items[lo:hi]:
            r = g[0]
            (dropped if p0 <= r[0] and r[1] <= p1 and b0 <= r[2] and r[3] <= b1 else kept).append(g)
        if dropped:
            items[lo:hi] = kept
            self._keys[lo:hi] = [r[2] for r, _ in kept]
        return dropped


def _first_row(g: tuple[Region, object]) -> int:
    return g[0][0]


class RowIndexedRegionList(RegionList):
    """A :class:`RegionList` for HBM, where accesses are disjoint by columns (column
    blocks of one set of rows) or by rows (row tiles of the same columns): the pairs
    are also kept sorted by first row, and each query bisects whichever order leaves
    fewer candidates, so both patterns trace in linear time."""

    __slots__ = ("_by_row", "_row_keys", "_tallest")

    def __init__(self) -> None:
        super().__init__()
        self._by_row: list[tuple[Region, object]] = []
        self._row_keys: list[int] = []
        self._tallest = 0

    def _candidates(self, box: Region) -> list[tuple[Region, object]]:
        if len(self.items) <= _SCAN:
            return self.items
        lo, hi = self.span(box)
        row_keys = self._row_keys
        row_hi = bisect_left(row_keys, box[1])
        row_lo = bisect_left(row_keys, box[0] - self._tallest, 0, row_hi)
        if row_hi - row_lo < hi - lo:
            return self._by_row[row_lo:row_hi]
        return self.items[lo:hi]

    def add(self, region: Region, value: object) -> None:
        pair = (region, value)
        b0, p0 = region[2], region[0]
        i = bisect_right(self._keys, b0)
        self._keys.insert(i, b0)
        self.items.insert(i, pair)
        i = bisect_right(self._row_keys, p0)
        self._row_keys.insert(i, p0)
        self._by_row.insert(i, pair)
        if region[3] - b0 > self._longest:
            self._longest = region[3] - b0
        if region[1] - p0 > self._tallest:
            self._tallest = region[1] - p0

    def take(self, box: Region) -> set:
        raise NotImplementedError("HBM region lists are never taken over; only on-chip ghost lists are")

    def drop_covered(self, box: Region) -> list[tuple[Region, object]]:
        """Forget the items ``box`` covers wholly; returns them."""
        dropped = [g for g in self._candidates(box) if _covers(box, g[0])]
        for pair in dropped:
            for items, keys, key in ((self.items, self._keys, pair[0][2]), (self._by_row, self._row_keys, pair[0][0])):
                i = bisect_left(keys, key)
                while items[i] is not pair:
                    i += 1
                del items[i]
                del keys[i]
        return dropped


class UnwrittenRead(Exception):
    """An instruction reads an on-chip region nothing has written (``view``)."""

    def __init__(self, view: View) -> None:
        super().__init__(view)
        self.view = view


class AliasConflict(Exception):
    """Instruction reads ``view`` of an aliased tensor whose bytes a write into ``other``
    (sharing its space) replaced since it was written."""

    def __init__(self, view: View, other: Tensor) -> None:
        super().__init__(view, other)
        self.view = view
        self.other = other


class _Arena:
    """Accesses of the aliased tensors of one memory, by physical region; values are
    tuples of instruction indices (as ghosts), and each write remembers the tensor it
    wrote (to find lifetime conflicts)."""

    __slots__ = ("writes", "reads", "writer")

    def __init__(self) -> None:
        self.writes = RegionList()
        self.reads = RegionList()
        self.writer: dict[int, list[Tensor]] = {}


class _Accesses:
    """What touched one tensor: write and read regions, and what it inherited from the
    space it was placed in. An HBM tensor's reads are grouped by region (``groups``:
    region -> the list of instructions that read exactly it, which is the value kept
    in ``reads``): inputs are read many times over in the same tiles, and one entry
    per tile keeps the list short."""

    __slots__ = ("writes", "reads", "inherited", "born", "groups", "arena", "renamed")

    def __init__(self, hbm: bool = False, arena: _Arena | None = None) -> None:
        self.writes = RowIndexedRegionList() if hbm else RegionList()
        self.reads = RowIndexedRegionList() if hbm else RegionList()
        self.inherited: tuple[int, ...] = ()
        #: what it inherited when placed (``inherited`` empties once a write covered it)
        self.born: tuple[int, ...] = ()
        self.groups: dict[Region, list[int]] | None = {} if hbm else None
        #: for an aliased tensor, where its dependencies come from (its own lists only
        #: say what it wrote, for reads before writes and accumulation)
        self.arena = arena
        #: per region rewritten into other copies: how many copies it rotates over, and
        #: the accesses of each older copy still in use (oldest first); None until one is
        self.renamed: dict[Region, tuple[int, deque[tuple[int, ...]]]] | None = None


class Hazards:
    """Tracks who touched what, per tensor, and turns accesses into dependencies.

    ``tracks`` (the track of each instruction so far, by index) lets every set of
    instructions kept or returned be cut to the latest of each track
    (:meth:`latest`): a track runs its instructions in order, each after the one
    before ends, so waiting for its latest is waiting for all of them. Without the cut
    a tile space reused over a loop passes every earlier tenant's accesses on to the
    next, and dependency lists grow with the length of the kernel."""

    def __init__(self, tracks: list[str]) -> None:
        self._tracks = tracks
        self._by_tensor: dict[int, _Accesses] = {}
        # per memory of each physical core: what freed tiles left, and the aliased tensors' accesses
        self._ghosts: dict[tuple[Memory, int], RegionList] = {}
        self._freed_last: tuple[Tensor, Region, tuple[int, ...], set[int]] | None = None
        self._arenas: dict[tuple[Memory, int], _Arena] = {}

    def latest(self, indices: Collection[int]) -> tuple[int, ...]:
        """``indices`` in order, cut to the latest instruction of each track."""
        tracks = self._tracks
        if len(indices) < 2:
            return tuple(sorted(indices))
        best: dict[object, int] = {}
        n = len(tracks)
        for i in indices:
            # an instruction not on a track yet (the one being added, or one the Program
            # refused while a failing trace unwinds) is kept as it is
            track: object = tracks[i] if i < n else i
            if best.get(track, -1) < i:
                best[track] = i
        return tuple(sorted(best.values()))

    def _ghosts_of(self, t: Tensor) -> RegionList:
        found = self._ghosts.get((t.memory, t.core))
        if found is None:
            found = self._ghosts[(t.memory, t.core)] = RegionList()
        return found

    def placed_aliased(self, t: Tensor) -> None:
        """A new on-chip tensor that may share space with other live aliased tensors: its
        accesses join its memory's arena, and what touched the space before (freed tiles)
        is kept there as readers, so its first write waits for them."""
        arena = self._arenas.get((t.memory, t.core))
        if arena is None:
            arena = self._arenas[(t.memory, t.core)] = _Arena()
        self._by_tensor[id(t)] = _Accesses(arena=arena)
        box = region_of_tensor(t)
        ghosts = self._ghosts_of(t)
        if ghosts.items:
            inherited = ghosts.take(box)
            if inherited:
                arena.reads.add(box, self.latest(inherited))

    def placed(self, t: Tensor) -> None:
        """A new on-chip tensor: it inherits what touched the space it now holds."""
        acc = _Accesses()
        self._by_tensor[id(t)] = acc
        if t.on_chip:
            ghosts = self._ghosts_of(t)
            if ghosts.items:
                inherited = ghosts.take(region_of_tensor(t))
                if inherited:
                    acc.inherited = acc.born = self.latest(inherited)

    def freed(self, t: Tensor) -> None:
        """An on-chip tensor's space is given back; later tenants wait for its accesses."""
        acc = self._by_tensor.pop(id(t), None)
        if acc is None:
            return
        if acc.arena is not None:
            # the arena keeps its entries: other aliased tensors may still live there
            box = region_of_tensor(t)
            last = set()
            for v in acc.arena.writes.values_overlapping(box) + acc.arena.reads.values_overlapping(box):
                last.update(v)  # type: ignore[call-overload]
            if last:
                self._ghosts_of(t).add(box, self.latest(last))
            return
        own = {i for _, i in acc.writes.items} | {i for _, i in acc.reads.items}
        last = set(acc.inherited) | own
        box = region_of_tensor(t)
        if last:
            self._ghosts_of(t).add(box, self.latest(last))
        # the last tile freed, in case the instruction that wrote it is retargeted next
        self._freed_last = (t, box, acc.born, own)

    def spillable(self, t: Tensor) -> bool:
        """Whether a live tile's accesses are its own, so it can be stored away and
        loaded back whole (not an aliased tile, nor one rotating over copies)."""
        acc = self._by_tensor.get(id(t))
        return acc is not None and acc.arena is None and not acc.renamed

    def inherited(self, t: Tensor) -> tuple[int, ...]:
        """What a tensor's first write waits for because of its space's earlier tenants
        (also just after it was freed)."""
        acc = self._by_tensor.get(id(t))
        if acc is not None:
            return acc.born if acc.arena is None else ()
        last = self._freed_last
        return last[2] if last is not None and last[0] is t else ()

    def retarget(self, index: int, temp: Tensor, writes: tuple[View, ...], room: Room | None = None) -> set[int]:
        """Instruction ``index`` writes ``writes`` instead of the tile ``temp`` it was
        recorded writing: its write of ``temp`` is forgotten (so nothing placed there later
        waits for it; if ``temp`` was freed at that write, its space waits again only for
        its earlier tenants) and ``writes`` are recorded; returns what those writes wait
        for. A target tile already freed (never read again) leaves its space waiting for
        ``index``. The caller drops what ``temp``'s space made the instruction wait for
        (:meth:`inherited`)."""
        acc = self._by_tensor.get(id(temp))
        if acc is not None and acc.arena is None:
            acc.writes = RegionList()
        elif acc is None and self._freed_last is not None and self._freed_last[0] is temp:
            # freed at its last use, the instruction now retargeted: its space keeps waiting
            # for its earlier tenants only
            _, box, inherited, own = self._freed_last
            ghosts = self._ghosts_of(temp)
            ghosts.take(box)
            rest = set(inherited) | (own - {index})
            if rest:
                ghosts.add(box, self.latest(rest))
        self._freed_last = None
        live = tuple(v for v in writes if id(v.tensor) in self._by_tensor)
        for v in writes:
            if id(v.tensor) not in self._by_tensor:
                self._ghosts_of(v.tensor).add(region_of(v), (index,))
        return self.access(index, (), live, room=room) if live else set()

    def last_writers(self, view: View) -> list[int]:
        """The instructions whose writes are the latest over ``view``'s region, in order."""
        acc = self._by_tensor.get(id(view.tensor))
        if acc is None:
            return []
        box = region_of(view)
        if acc.arena is not None:
            return sorted({i for found in acc.arena.writes.values_overlapping(box) for i in found})  # type: ignore[attr-defined]
        return sorted(acc.writes.values_overlapping(box))  # type: ignore[arg-type]

    def written(self, view: View) -> bool:
        """Whether anything has written part of the region ``view`` covers."""
        acc = self._by_tensor.get(id(view.tensor))
        if acc is None:
            return False
        return bool(acc.writes.items) and bool(acc.writes.values_overlapping(region_of(view)))

    def access(self, index: int, reads: tuple[View, ...], writes: tuple[View, ...], check_written: bool = False,
               stale: Container[int] = (), room: Room | None = None) -> set[int]:
        """Record instruction ``index``'s accesses; return the instructions it must wait for.
        With ``room``, a write into a compiler-placed SBUF tile may go to another copy of
        the bytes it writes (see the module's description and :meth:`_rename`).

        With ``check_written``, an on-chip read of a region nothing has written raises
        :class:`UnwrittenRead` before anything is recorded. A read of a tensor whose id is
        in ``stale`` (one only skipped, masked-off instructions wrote) reads whatever its
        memory holds, another block's data included, without an :class:`AliasConflict`."""
        by_tensor = self._by_tensor
        deps: set[int] = set()
        read_boxes = []
        aliased: list[tuple[_Arena, Region, View, bool]] = []
        for v in reads:
            t = v.tensor
            acc = by_tensor.get(id(t)) if check_written else by_tensor[id(t)]
            box = region_of(v)
            if acc is not None and acc.arena is not None:
                if check_written and not acc.writes.values_overlapping(box):
                    raise UnwrittenRead(v)
                self._aliased_read(acc.arena, box, v, deps, id(t) in stale)
                aliased.append((acc.arena, box, v, False))
                continue
            found = False
            if acc is not None and acc.writes.items:
                # values_overlapping written out: most instructions read a tile written once
                written = acc.writes.items
                if len(written) > _SCAN:
                    written = acc.writes._candidates(box)
                p0, p1, b0, b1 = box
                for r, i in written:
                    if r[0] < p1 and p0 < r[1] and r[2] < b1 and b0 < r[3]:
                        deps.add(i)
                        found = True
            if check_written and not found and t.on_chip:
                raise UnwrittenRead(v)
            if acc.inherited:
                deps.update(acc.inherited)
            read_boxes.append((acc, box))
        write_boxes = []
        for v in writes:
            acc = by_tensor[id(v.tensor)]
            box = region_of(v)
            if acc.arena is not None:
                for found in acc.arena.writes.values_overlapping(box) + acc.arena.reads.values_overlapping(box):
                    deps.update(found)  # type: ignore[call-overload]
                aliased.append((acc.arena, box, v, True))
                acc.writes.drop_covered(box)
                acc.writes.add(box, index)
                continue
            if room is not None and acc.groups is None and (acc.writes.items or acc.reads.items) \
                    and v.tensor.memory is Memory.SBUF:
                waits = self._rename(acc, box, v, room)
                if waits is not None:
                    deps.update(waits)
                    deps.update(acc.inherited)
                    write_boxes.append((acc, box, v))
                    continue
            if acc.writes.items:
                deps.update(acc.writes.values_overlapping(box))
            if acc.reads.items:
                if acc.groups is None:
                    deps.update(acc.reads.values_overlapping(box))
                else:
                    for group in acc.reads.values_overlapping(box):
                        deps.update(group)
            if acc.inherited:
                deps.update(acc.inherited)
            write_boxes.append((acc, box, v))
        for acc, box in read_boxes:
            groups = acc.groups
            if groups is None:
                acc.reads.add(box, index)
            else:
                group = groups.get(box)
                if group is None:
                    groups[box] = group = [index]
                    acc.reads.add(box, group)
                else:
                    group.append(index)
        for acc, box, v in write_boxes:
            # what this write covers is ordered behind it from now on
            if acc.writes.items:
                acc.writes.drop_covered(box)
            acc.writes.add(box, index)
            if acc.reads.items:
                dropped = acc.reads.drop_covered(box)
                if acc.groups is not None:
                    for region, _ in dropped:
                        del acc.groups[region]
            if acc.inherited and _covers(box, region_of_tensor(v.tensor)):
                acc.inherited = ()
        for arena, box, v, is_write in aliased:
            if is_write:
                arena.writes.take(box)
                arena.reads.take(box)
                arena.writes.add(box, (index,))
                arena.writer.setdefault(index, []).append(v.tensor)
            else:
                arena.reads.add(box, (index,))
        deps.discard(index)
        return deps

    def _rename(self, acc: _Accesses, box: Region, v: View, room: Room) -> tuple[int, ...] | None:
        """A write of ``box`` into another copy of those bytes: what it waits for instead
        of the earlier accesses it covers, or None where it cannot be renamed (it covers
        none, or SBUF has no room for another copy). An earlier access only partly inside
        ``box`` (a memset of the whole tile before its blocks are refilled) stays ordered
        before it. The copies rotate: with ``n`` of them, a write takes over the one
        ``n`` versions back and waits for that version's accesses, nothing newer. ``n``
        is :data:`RENAME_BUFFERS` where SBUF has room for them when the region is first
        rewritten, else 2."""
        covered: list[int] = []
        partly: list[int] = []
        for r, i in acc.writes.overlapping(box) + acc.reads.overlapping(box):
            (covered if _covers(box, r) else partly).append(i)  # type: ignore[arg-type]
        if not covered:
            return None
        if acc.renamed is None:
            acc.renamed = {}
        entry = acc.renamed.get(box)
        if entry is None:
            if not room(v, 1):
                return None
            entry = acc.renamed[box] = (RENAME_BUFFERS if room(v, RENAME_BUFFERS - 1) else 2, deque())
        n, versions = entry
        versions.append(self.latest(covered))
        return versions.popleft() + tuple(partly) if len(versions) >= n else tuple(partly)

    @staticmethod
    def _aliased_read(arena: _Arena, box: Region, v: View, deps: set[int], stale: bool = False) -> None:
        """Dependencies of reading ``v`` (an aliased tensor): the writes to its bytes, each
        of which must have written ``v``'s own tensor (else another block replaced its
        data), unless ``stale``: then whatever is there is what it reads."""
        t = v.tensor
        for found in arena.writes.values_overlapping(box):
            for i in found:  # type: ignore[attr-defined]
                written = arena.writer.get(i, ())
                if not stale and not any(w is t for w in written):
                    raise AliasConflict(v, written[0])
                deps.add(i)

    def register(self, t: Tensor) -> None:
        """Start tracking an HBM tensor (never freed, never shared)."""
        self._by_tensor.setdefault(id(t), _Accesses(hbm=True))
