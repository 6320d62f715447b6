"""Traces of a distributed job: one trace per rank, merged onto the shared simulated clock.

Each rank writes its own trace (:class:`trnsim.profile`), timed from its own first op
(``meta["origin_ps"]`` is that op's start on the rank's clock). Ranks' clocks meet at
every collective, so they are one clock: :func:`merge` shifts each rank's slices by its
origin and writes them as one Chrome/Perfetto file with a process per rank
(:func:`save_job`), which :func:`trnsim.trace.load` reads back as a :class:`JobTrace`.

The file is a ``trnsim-job/1`` object: ``traceEvents`` with ``pid`` = rank + 1 and each
rank's track numbers as ``tid``; ``otherData.ranks`` lists, per rank, its process name,
tracks and metadata.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnsim.atomic import write_atomic
from trnsim.errors import TraceFileError
from trnsim.trace.events import Counter, Slice, Trace

JOB_FORMAT = "trnsim-job/1"


@dataclass
class JobTrace:
    """The traces of a job's ranks on one clock (nanoseconds from the job's first op)."""

    ranks: list[Trace] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def total_ns(self) -> float:
        return max((s.end_ns for t in self.ranks for s in t.slices), default=0.0)

    @property
    def partial(self) -> str | None:
        """Why the job did not finish (``meta["partial"]``: a rank failed, Ctrl-C), or
        None for a finished job's trace (see :mod:`trnsim.trace.partial`)."""
        reason = self.meta.get("partial")
        return None if reason is None else str(reason)

    def collectives(self, rank: int) -> list[Slice]:
        """The collectives track of ``rank``."""
        return [s for s in self.ranks[rank].slices if s.track == "collectives"]


def _as_trace(item: Trace | str | os.PathLike) -> Trace:
    if isinstance(item, Trace):
        return item
    from trnsim.trace.export import load

    loaded = load(item)
    if isinstance(loaded, JobTrace):
        raise TraceFileError(f"{item} is already a merged job trace; merge the per-rank traces it was made from")
    return loaded


def merge(traces: list[Trace | str | os.PathLike], meta: dict[str, Any] | None = None) -> JobTrace:
    """The per-rank ``traces`` (rank order; Trace objects or trace files) on the shared clock."""
    loaded = [_as_trace(t) for t in traces]
    if not loaded:
        raise TraceFileError("merge needs at least one rank's trace")
    origins = [int(t.meta.get("origin_ps", 0)) for t in loaded]
    base = min(origins)
    ranks = []
    for rank, (t, origin) in enumerate(zip(loaded, origins)):
        shift = (origin - base) / 1000
        process = t.meta.get("rank_name", f"rank {rank}")
        moved = Trace(process=process, meta={**t.meta, "rank": rank})
        moved.slices = [Slice(s.track, s.name, s.start_ns + shift, s.dur_ns, s.args) for s in t.slices]
        moved.counters = [Counter(c.name, c.unit, [(at + shift, v) for at, v in c.points]) for c in t.counters]
        ranks.append(moved)
    return JobTrace(ranks, {"origin_ps": base, **(meta or {})})


def to_chrome(job: JobTrace) -> dict[str, Any]:
    """The merged trace as one Chrome trace-event JSON object (a process per rank)."""
    from trnsim.trace.export import process_events

    events: list[dict[str, Any]] = []
    ranks_meta = []
    for rank, t in enumerate(job.ranks):
        pid = rank + 1
        rank_events, tracks = process_events(t, pid, partial=job.partial or t.partial)
        rank_events.insert(1, {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
        events += rank_events
        ranks_meta.append({"process": t.process, "tracks": tracks, "meta": t.meta})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"format": JOB_FORMAT, "ranks": ranks_meta, **job.meta}}


def save_job(job: JobTrace, path: str | os.PathLike) -> Path:
    """Write the merged trace, whole or not at all."""
    data = to_chrome(job)
    return write_atomic(path, lambda f: json.dump(data, f, separators=(",", ":")))


def from_chrome(data: dict[str, Any]) -> JobTrace:
    """A merged trace from its checked JSON object (see :func:`trnsim.trace.validate.read_checked`)."""
    other = data["otherData"]
    ranks = []
    for info in other["ranks"]:
        ranks.append(Trace(process=info["process"], meta=dict(info.get("meta", {}))))
    counters: list[dict[str, Counter]] = [{} for _ in ranks]
    for e in data["traceEvents"]:
        if e["ph"] == "M":
            continue
        rank = e["pid"] - 1
        if e["ph"] == "X":
            track = other["ranks"][rank]["tracks"][e["tid"] - 1]
            ranks[rank].slices.append(Slice(track, e["name"], e["ts"] * 1000, e["dur"] * 1000, e["args"]))
        else:
            name, _, unit = e["name"].rpartition(" (")
            c = counters[rank].setdefault(name, Counter(name, unit.rstrip(")")))
            c.points.append((e["ts"] * 1000, e["args"]["value"]))
    for t, cs in zip(ranks, counters):
        t.counters = list(cs.values())
    meta = {k: v for k, v in other.items() if k not in ("format", "ranks")}
    return JobTrace(ranks, meta)
