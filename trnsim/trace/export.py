"""Chrome trace-event JSON (what Perfetto and chrome://tracing open), written and read back.

The file is a JSON object: ``traceEvents`` (complete events ``"ph": "X"`` for
slices, ``"C"`` for counters, ``"M"`` metadata naming the process and each track)
and ``otherData`` with the run's metadata. Timestamps are microseconds, as the
format requires, with nanosecond precision. Output is deterministic: the same run
gives the same bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trnsim.atomic import write_atomic
from trnsim.trace.events import Counter, Slice, Trace, track_label, track_sort_key
from trnsim.trace.job import JobTrace, from_chrome
from trnsim.trace.validate import FORMAT, JOB_FORMAT, read_checked

PID = 1


def _us(ns: float) -> float:
    return round(ns / 1000, 6)


def process_events(trace: Trace, pid: int, partial: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The events of ``trace`` as process ``pid`` of a Chrome trace, and its track names
    (track ``n`` of the list is thread ``n + 1``). The process name of a partial trace
    (``partial``, default the trace's own :attr:`~Trace.partial`) says so, for Perfetto."""
    tracks = trace.tracks()
    tids = {t: n + 1 for n, t in enumerate(tracks)}
    partial = partial or trace.partial
    name = f"{trace.process} [PARTIAL: {partial}]" if partial else trace.process
    events: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}]
    for track, tid in tids.items():
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": track_label(track)}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for s in sorted(trace.slices, key=lambda s: (s.start_ns, tids[s.track])):
        events.append({"ph": "X", "pid": pid, "tid": tids[s.track], "name": s.name, "cat": s.track,
                       "ts": _us(s.start_ns), "dur": _us(s.dur_ns), "args": s.args})
    for c in trace.counters:
        for t, value in c.points:
            events.append({"ph": "C", "pid": pid, "name": f"{c.name} ({c.unit})", "ts": _us(t), "args": {"value": value}})
    return events, tracks


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
    trace (:func:`trnsim.trace.job.save_job`) into a :class:`JobTrace` (a damaged or
    foreign file raises :class:`TraceFileError` naming what is wrong)."""
    data = read_checked(path)
    other = data["otherData"]
    if other["format"] == JOB_FORMAT:
        return from_chrome(data)
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
