"""On-chip memories: SBUF and PSUM space, partition by partition.

An allocation covers a range of partitions and a range of bytes inside each of
them. Two allocations may share bytes only on disjoint partitions. Placement is
first fit (or next fit) along the byte axis, so the same sequence of allocations always gets
the same addresses.

A tensor may also be placed at an address its program chose (:meth:`OnChipAllocator.place_at`,
NKI's direct allocation): such tensors may share bytes with each other (the program
reuses its own space), never with a live tensor placed here automatically.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, NamedTuple

from trnsim.errors import AllocationError
from trnsim.units import Bytes

if TYPE_CHECKING:
    from trnsim.isa import Memory


class Allocation(NamedTuple):
    """One live region: partitions [start, start + count) x bytes [offset, offset + nbytes).
    (A named tuple: one is made per tile a kernel traces, and tuples are cheap to make.)"""

    name: str
    start_partition: int
    partitions: int
    offset: Bytes
    nbytes: Bytes
    #: placed at an address the program chose (it may share bytes with other such tensors)
    direct: bool = False

    def overlaps_partitions(self, start: int, count: int) -> bool:
        return self.start_partition < start + count and start < self.start_partition + self.partitions


class OnChipAllocator:
    """Placement of tensors in SBUF or PSUM, with capacity errors that say what is live.

    PSUM (``bank_bytes`` given) keeps a tensor inside one bank when it fits in
    one, and starts larger tensors on a bank boundary. ``next_fit`` places each
    tensor after the previous one, wrapping around, rather than at the lowest free
    address: traced kernels use it so a new tile rarely lands where a tile still
    being read just was.
    """

    def __init__(self, memory: Memory, partitions: int, partition_bytes: Bytes, chip_name: str, bank_bytes: Bytes | None = None,
                 next_fit: bool = False) -> None:
        self.memory = memory
        self.partitions = partitions
        self.partition_bytes = partition_bytes
        self.chip_name = chip_name
        self.bank_bytes = bank_bytes
        self.live: dict[str, Allocation] = {}
        self.peak_bytes: Bytes = 0
        self.next_fit = next_fit
        self.cursor: Bytes = 0
        self._used: Bytes = 0
        #: When set, an allocation that does not fit is placed past the end of the
        #: memory instead of failing, and the first such failure is kept here (a kernel
        #: trace that only learns the tiles' lifetimes uses it); None when all fit.
        self.overflow_allowed = False
        self.overflowed: AllocationError | None = None
        self._last: tuple[str, Bytes] | None = None   # the last allocation and the cursor before it

    def used_bytes(self) -> Bytes:
        """Bytes allocated, summed over partitions."""
        return self._used

    def allocate(self, name: str, start: int, count: int, nbytes: Bytes) -> Bytes:
        """Place ``nbytes`` per partition on partitions [start, start + count); returns the byte offset."""
        if nbytes > self.partition_bytes:
            raise AllocationError(
                f"{self.memory.value.upper()} allocation {name!r} of {_kib(nbytes)} per partition exceeds "
                f"the {_kib(self.partition_bytes)} of each partition on {self.chip_name}; tile the free dimension")
        if self.bank_bytes is not None:
            if nbytes > self.bank_bytes and nbytes % self.bank_bytes:
                raise AllocationError(
                    f"PSUM allocation {name!r} of {nbytes} bytes per partition is larger than one bank "
                    f"({self.bank_bytes} bytes) but not a whole number of banks; "
                    f"use at most {self.bank_bytes} bytes or whole banks")
        stop = start + count
        busy = [(a.offset, a.offset + a.nbytes) for a in self.live.values()
                if a.start_partition < stop and start < a.start_partition + a.partitions]
        offset = self._place(busy, nbytes)
        if offset is None:
            error = AllocationError(
                f"{self.memory.value.upper()} allocation {name!r} of {_kib(nbytes)} per partition "
                f"on partitions {start}..{start + count - 1} does not fit on {self.chip_name}: "
                f"{_kib(self.partition_bytes)} per partition, live there: {self.describe_live(start, count)}; "
                "free a tile or make this one smaller")
            if not self.overflow_allowed:
                raise error
            if self.overflowed is None:
                self.overflowed = error
            offset = self._fit(max([self.partition_bytes] + [hi for _, hi in busy]), nbytes)
        self.live[name] = Allocation(name, start, count, offset, nbytes)
        self._used += count * nbytes
        self.peak_bytes = max(self.peak_bytes, self._used)
        self._last = (name, self.cursor)
        self.cursor = offset + nbytes
        return offset

    def restore(self, a: Allocation) -> None:
        """Place ``a`` again where it was (a tile spilled to HBM coming back); the caller
        made its space free."""
        self.live[a.name] = a
        self._used += a.partitions * a.nbytes
        self.peak_bytes = max(self.peak_bytes, self._used)

    def forget_placement(self, name: str) -> None:
        """``name`` was not needed after all (a temporary whose only write went to another
        tile): if it was the last allocation, the next one is placed as if it had never
        been made, so temporaries do not push tiles along the memory."""
        if self._last is not None and self._last[0] == name:
            self.cursor = self._last[1]
            self._last = None

    def fits(self, start: int, count: int, nbytes: Bytes) -> bool:
        """Whether :meth:`allocate` would find room for ``nbytes`` now (placing nothing)."""
        if nbytes > self.partition_bytes:
            return False
        stop = start + count
        busy = [(a.offset, a.offset + a.nbytes) for a in self.live.values()
                if a.start_partition < stop and start < a.start_partition + a.partitions]
        cursor = self.cursor
        found = self._place(busy, nbytes)
        self.cursor = cursor
        return found is not None

    def place_at(self, name: str, start: int, count: int, offset: Bytes, nbytes: Bytes) -> None:
        """Place ``nbytes`` per partition at byte ``offset`` of partitions [start, start + count),
        as the program asked (direct allocation). It may overlap other directly placed
        tensors, not a live one placed by :meth:`allocate`."""
        what = f"{self.memory.value.upper()} direct allocation {name!r} of {_kib(nbytes)} per partition at byte {offset}"
        if offset < 0 or offset + nbytes > self.partition_bytes:
            raise AllocationError(f"{what} ends at byte {offset + nbytes}, past the {_kib(self.partition_bytes)} of each "
                                  f"partition on {self.chip_name}; choose a lower address or a smaller tile")
        if self.bank_bytes is not None and nbytes <= self.bank_bytes and \
                offset // self.bank_bytes != (offset + nbytes - 1) // self.bank_bytes:
            raise AllocationError(f"{what} crosses a PSUM bank boundary ({self.bank_bytes} bytes a bank); "
                                  "a PSUM tile lives inside one bank")
        stop = start + count
        for a in self.live.values():
            if not a.direct and a.start_partition < stop and start < a.start_partition + a.partitions \
                    and a.offset < offset + nbytes and offset < a.offset + a.nbytes:
                error = AllocationError(
                    f"{what} overlaps {a.name!r} ({_kib(a.nbytes)} at byte {a.offset}), a tile placed automatically "
                    "that is still live; the Neuron compiler wants every tile of a kernel that allocates directly "
                    "to be allocated directly, so give that tile an address of its own")
                if not self.overflow_allowed:
                    raise error
                if self.overflowed is None:
                    self.overflowed = error
                break
        self.live[name] = Allocation(name, start, count, offset, nbytes, True)
        self._used += count * nbytes
        self.peak_bytes = max(self.peak_bytes, self._used)

    def _place(self, busy: list[tuple[Bytes, Bytes]], nbytes: Bytes) -> Bytes | None:
        """The offset for ``nbytes`` among the ``busy`` byte ranges (in any order), or None
        if none fits.

        First fit tries from byte 0, then the end of each busy range in order of their
        starts; next fit tries from where the last allocation ended, then the other
        candidates in address order, wrapping around, so space freed a moment ago is
        taken last."""
        limit = self.partition_bytes
        if self.next_fit:
            # the cursor is next fit's first candidate: most tiles fit there, so try it
            # before ordering the others
            offset = self._fit(self.cursor, nbytes)
            end = offset + nbytes
            for lo, hi in busy:
                if end > lo and offset < hi:
                    break
            else:
                if end <= limit:
                    return offset
            ordered = sorted({0, self.cursor, *[hi for _, hi in busy]})
            i = bisect_left(ordered, self.cursor)
            candidates = ordered[i:] + ordered[:i]
        else:
            busy.sort()
            candidates = [0] + [hi for _, hi in busy]
        for c in candidates:
            offset = self._fit(c, nbytes)
            end = offset + nbytes
            if end > limit:
                continue
            for lo, hi in busy:
                if end > lo and offset < hi:
                    break
            else:
                return offset
        return None

    def _fit(self, offset: Bytes, nbytes: Bytes) -> Bytes:
        """Move ``offset`` so a PSUM tile does not straddle a bank; SBUF offsets stay 4-byte aligned."""
        if self.bank_bytes is None:
            return (offset + 3) // 4 * 4
        bank = self.bank_bytes
        if nbytes > bank:
            return (offset + bank - 1) // bank * bank
        offset = (offset + 3) // 4 * 4
        if offset // bank != (offset + nbytes - 1) // bank:
            return (offset // bank + 1) * bank
        return offset

    def release(self, name: str) -> None:
        """Free the allocation called ``name``."""
        if name not in self.live:
            raise AllocationError(f"{self.memory.value.upper()} tensor {name!r} is not allocated; "
                                  "it was never placed or is already freed")
        a = self.live.pop(name)
        self._used -= a.partitions * a.nbytes

    def describe_live(self, start: int, count: int) -> str:
        """The live allocations on those partitions, largest first (at most eight named)."""
        rows = [a for a in self.live.values() if a.overlaps_partitions(start, count)]
        if not rows:
            return "nothing"
        rows.sort(key=lambda a: (-a.nbytes, a.offset))
        text = ", ".join(f"{a.name} ({_kib(a.nbytes)} at byte {a.offset})" for a in rows[:8])
        if len(rows) > 8:
            rest = sum(a.nbytes for a in rows[8:])
            text += f" and {len(rows) - 8} more ({_kib(rest)})"
        return text


def _kib(nbytes: Bytes) -> str:
    if nbytes % 1024 == 0:
        return f"{nbytes // 1024} KiB"
    return f"{nbytes / 1024:.1f} KiB"
