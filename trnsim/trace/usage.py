"""How busy each engine and DMA queue was over time (:func:`utilisation`)."""

from __future__ import annotations

from typing import Any

from trnsim.errors import TrnSimError
from trnsim.trace.critical import engine_slices, ranks_of, with_rank
from trnsim.trace.events import Slice, track_sort_key
from trnsim.trace.table import FRACTION, Table

DEFAULT_BUCKETS = 20


def _union(slices: list[Slice]) -> list[tuple[float, float]]:
    """The time ``slices`` cover, as disjoint (start, end) spans in order."""
    spans: list[list[float]] = []
    for s in sorted(slices, key=lambda s: s.start_ns):
        if spans and s.start_ns <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], s.end_ns)
        elif s.dur_ns > 0:
            spans.append([s.start_ns, s.end_ns])
    return [(a, b) for a, b in spans]


def utilisation(trace: Any, bucket_ns: float | None = None) -> Table:
    """Each engine's and DMA queue's busy fraction in consecutive time buckets, as a
    :class:`trnsim.trace.Table`: columns ``start_ns``, ``end_ns``, then one per track
    (a fraction from 0 to 1, printed in %; overlapping slices on a track count once). The buckets
    cover the run from 0 to its end, ``bucket_ns`` wide (default: the run in
    20 buckets; the last may be shorter), so ``sum(busy * (end_ns - start_ns))`` over a
    track's column is its :func:`trnsim.trace.busy_ns`. A JobTrace adds a ``rank``
    column and a column for every track any rank used."""
    pairs = ranks_of(trace, "utilisation")
    if bucket_ns is not None and not bucket_ns > 0:
        raise TrnSimError(f"bucket_ns {bucket_ns!r} must be a positive number of nanoseconds; or None for "
                          f"{DEFAULT_BUCKETS} buckets over the run")
    total = max(t.total_ns for _, t in pairs)
    width = float(bucket_ns) if bucket_ns is not None else (total / DEFAULT_BUCKETS if total else 1.0)
    count = max(1, -int(-total // width))
    edges = [k * width for k in range(count)] + [max(total, (count - 1) * width)]
    tracks = sorted({s.track for _, t in pairs for s in engine_slices(t)}, key=track_sort_key)
    rows: list[tuple[int | None, dict[str, Any]]] = []
    for rank, t in pairs:
        busy: dict[str, list[float]] = {track: [0.0] * count for track in tracks}
        by_track: dict[str, list[Slice]] = {}
        for s in engine_slices(t):
            by_track.setdefault(s.track, []).append(s)
        for track, slices in by_track.items():
            for a, b in _union(slices):
                k = min(int(a // width), count - 1)
                while k < count and edges[k] < b:
                    busy[track][k] += max(0.0, min(b, edges[k + 1]) - max(a, edges[k]))
                    k += 1
        for k in range(count):
            span = edges[k + 1] - edges[k]
            row: dict[str, Any] = {"start_ns": edges[k], "end_ns": edges[k + 1]}
            row.update({track: (busy[track][k] / span if span else 0.0) for track in tracks})
            rows.append((rank, row))
    columns, out = with_rank(rows, ["start_ns", "end_ns", *tracks])
    return Table(columns, out, units={track: FRACTION for track in tracks})
