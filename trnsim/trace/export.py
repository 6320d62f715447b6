"""Chrome trace-event JSON (what Perfetto and chrome://tracing open), written and read back:
one run's trace, and a job's ranks merged on one clock.

The file is a JSON object: ``traceEvents`` (complete events ``"ph": "X"`` for
slices, ``"C"`` for counters, ``"M"`` metadata naming the process and each track)
and ``otherData`` with the run's metadata. Timestamps are microseconds, as the
format requires, with nanosecond precision. Output is deterministic: the same run
gives the same bytes.

A job's file is a ``trnsim-job/1`` object: ``traceEvents`` with ``pid`` = rank + 1 and
each rank's track numbers as ``tid``; ``otherData.ranks`` lists, per rank, its process
name, tracks and metadata.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trnsim.atomic import write_atomic
from trnsim.errors import TraceFileError, TrnSimError
from trnsim.trace.events import Counter, Slice, Trace, trace_from_run, track_label, track_sort_key
from trnsim.trace.job import JobTrace
from trnsim.trace.validate import FORMAT, JOB_FORMAT, read_checked

PID = 1


def _us(ns: float) -> float:
    return round(ns / 1000, 6)


def process_events(trace: Trace, pid: int, partial: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The events of ``trace`` as process ``pid`` of a Chrome trace, and its track names
    (track ``n`` of the list is thread ``n + 1``). A track whose slices overlap without
    nesting (the kernels of a compiled graph, each starting before the one ahead ends)
    takes as many threads as it needs, each named after the track: a thread's slices
    never overlap, as Perfetto requires. The process name of a partial trace
    (``partial``, default the trace's own :attr:`~Trace.partial`) says so, for Perfetto."""
    lane_of, tracks = _lanes(trace)
    tids = {lane: n + 1 for n, lane in enumerate(tracks)}
    partial = partial or trace.partial
    name = f"{trace.process} [PARTIAL: {partial}]" if partial else trace.process
    events: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}]
    for (track, lane), tid in tids.items():
        label = track_label(track) + (f" ({lane + 1})" if lane else "")
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": label}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for s in sorted(trace.slices, key=lambda s: (s.start_ns, tids[s.track, lane_of[id(s)]])):
        events.append({"ph": "X", "pid": pid, "tid": tids[s.track, lane_of[id(s)]], "name": s.name, "cat": s.track,
                       "ts": _us(s.start_ns), "dur": _us(s.dur_ns), "args": s.args})
    for c in trace.counters:
        for t, value in c.points:
            events.append({"ph": "C", "pid": pid, "name": f"{c.name} ({c.unit})", "ts": _us(t), "args": {"value": value}})
    return events, [track for track, _ in tracks]


def _lanes(trace: Trace) -> tuple[dict[int, int], list[tuple[str, int]]]:
    """Each slice's lane on its track (by id), the first whose slices have ended or
    hold it whole, and the (track, lane) pairs in profile order."""
    lane_of: dict[int, int] = {}
    used: dict[str, int] = {}
    by_track: dict[str, list[Slice]] = {}
    for s in trace.slices:
        by_track.setdefault(s.track, []).append(s)
    tracks = sorted(by_track, key=track_sort_key)   # trace.tracks()
    for track in tracks:
        open_: list[list[tuple[float, float]]] = []   # per lane, the enclosing slices still open
        for s in sorted(by_track[track], key=lambda s: (s.start_ns, -s.dur_ns)):
            end = s.start_ns + s.dur_ns
            for stack in open_:
                while stack and stack[-1][1] <= s.start_ns:
                    stack.pop()
            # the first lane that is free or whose innermost open slice holds this one
            lane = next((i for i, stack in enumerate(open_) if not stack or stack[-1][1] >= end), len(open_))
            if lane == len(open_):
                open_.append([])
            open_[lane].append((s.start_ns, end))
            lane_of[id(s)] = lane
        used[track] = max(len(open_), 1)
    return lane_of, [(track, lane) for track in tracks for lane in range(used[track])]


def to_chrome(trace: Trace) -> dict[str, Any]:
    """The trace as a Chrome trace-event JSON object."""
    events, tracks = process_events(trace, PID)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"format": FORMAT, "process": trace.process, "tracks": tracks, **trace.meta}}


def save(trace: Trace, path: str | os.PathLike) -> Path:
    """Write ``trace`` to ``path`` as Chrome trace-event JSON, whole or not at all
    (folders are made; see :func:`trnsim.atomic.write_atomic`)."""
    data = to_chrome(trace)
    return write_atomic(path, lambda f: json.dump(data, f, separators=(",", ":")))


def load(path: str | os.PathLike) -> Trace | JobTrace:
    """Read a trace written by :func:`save` back into a :class:`Trace`, or a merged job
    trace (:func:`save_job`) into a :class:`JobTrace` (a damaged or
    foreign file raises :class:`TraceFileError` naming what is wrong)."""
    data = read_checked(path)
    other = data["otherData"]
    if other["format"] == JOB_FORMAT:
        return job_from_chrome(data)
    by_tid = {n + 1: t for n, t in enumerate(other["tracks"])}
    meta = {k: v for k, v in other.items() if k not in ("format", "process", "tracks")}
    trace = Trace(process=other["process"], meta=meta)
    counters: dict[str, Counter] = {}
    for e in data["traceEvents"]:
        if e["ph"] == "X":
            trace.slices.append(Slice(by_tid[e["tid"]], e["name"], e["ts"] * 1000, e["dur"] * 1000, e["args"]))
        elif e["ph"] == "C":
            name, _, unit = e["name"].rpartition(" (")
            c = counters.setdefault(name, Counter(name, unit.rstrip(")")))
            c.points.append((e["ts"] * 1000, e["args"]["value"]))
    trace.counters = list(counters.values())
    trace.slices.sort(key=lambda s: (track_sort_key(s.track), s.start_ns))
    return trace


def as_trace(value: Any, what: str) -> Trace:
    """``value`` as a Trace: a Trace itself, a simulated run (a
    :class:`trnsim.simulator.RunResult`, traced), or the path of a saved trace (loaded).
    ``what`` names the caller in the refusal of anything else."""
    from trnsim.hw.core import TimedRun

    if isinstance(value, Trace):
        return value
    if isinstance(value, TimedRun):
        return trace_from_run(value)
    if isinstance(value, (str, os.PathLike)):
        return load(value)
    raise TrnSimError(f"{what} takes a trnsim.trace.Trace, a simulated run (trnsim.simulate's result) or the "
                      f"path of a saved trace, not {type(value).__name__} {value!r:.60}; for a trnsim.profile, "
                      "pass its .trace()")


def _as_trace(item: Trace | str | os.PathLike) -> Trace:
    if isinstance(item, Trace):
        return item
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


def job_to_chrome(job: JobTrace) -> dict[str, Any]:
    """The merged trace as one Chrome trace-event JSON object (a process per rank)."""
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
    data = job_to_chrome(job)
    return write_atomic(path, lambda f: json.dump(data, f, separators=(",", ":")))


def job_from_chrome(data: dict[str, Any]) -> JobTrace:
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
