"""Link occupancy over simulated time: what lets concurrent collectives share the fabric.

Each link (a chip's internal path, its NeuronLink ports, a server's EFA) keeps the
intervals in which it is busy. A collective admitted later takes the link's free time from
its start on, as much as it needs: two collectives that overlap on a link finish, together,
when the link has carried the bytes of both (the link's work is conserved), and the one
admitted first keeps the times already reported for it. Admission order is call order, so
the result is deterministic.
"""

from __future__ import annotations

import bisect
import math

from trnsim.units import Nanos


class LinkTimeline:
    """Busy intervals of one link, disjoint and sorted."""

    def __init__(self) -> None:
        self._starts: list[Nanos] = []
        self._ends: list[Nanos] = []

    def occupy(self, start: Nanos, busy: Nanos) -> Nanos:
        """Book ``busy`` ns of the link's free time from ``start`` on; return when it ends."""
        if busy <= 0:
            return start
        i = bisect.bisect_right(self._ends, start)  # first interval ending after start
        t, left = start, busy
        booked: list[tuple[Nanos, Nanos]] = []
        while left > 0:
            gap_end = self._starts[i] if i < len(self._starts) else math.inf
            if t < gap_end:
                take = min(left, gap_end - t)
                booked.append((t, t + take))
                t, left = t + take, left - take
            if left > 0:
                t = max(t, self._ends[i])
                i += 1
        for a, b in booked:
            self._add(a, b)
        return t

    def _add(self, a: Nanos, b: Nanos) -> None:
        i = bisect.bisect_left(self._ends, a)  # first interval that could touch [a, b]
        j = i
        while j < len(self._starts) and self._starts[j] <= b:
            a, b = min(a, self._starts[j]), max(b, self._ends[j])
            j += 1
        self._starts[i:j] = [a]
        self._ends[i:j] = [b]

    def busy(self) -> list[tuple[Nanos, Nanos]]:
        """The busy intervals, in time order."""
        return list(zip(self._starts, self._ends))
