"""The critical path of a run, and what each engine waited on.

Every instruction slice of a trace from :func:`trnsim.trace.trace_from_run` carries a
``wait`` argument (the cause :mod:`trnsim.hw.core` recorded): what set its start. The critical path
starts at the last instruction to finish and follows those causes back to the
launch; each step says what it waited on. A ``trnsim.profile`` trace runs its ops one
after another, so its path is every op (and collective) in order, each waiting on
the one before it (``busy``) or on the host (``host``: the device was idle until the host issued it),
with the critical path through the kernel of each op under it.
"""

from __future__ import annotations

from typing import Any

from trnsim.errors import TrnSimError
from trnsim.trace.analysis import busy_ns
from trnsim.trace.events import Slice, Trace, track_sort_key
from trnsim.trace.export import as_trace
from trnsim.trace.job import JobTrace

# a saved trace keeps times in microseconds to 6 places: closer than this is the same time
PICO = 1e-3
# tracks that are not an engine or a DMA queue
OVERVIEW_TRACKS = ("ops", "graphs", "host", "compile", "collectives")

PATH_COLUMNS = ["step", "op", "index", "track", "name", "start_ns", "end_ns", "dur_ns", "waited_on", "on", "sem",
                "idle_ns"]
WAIT_COLUMNS = ["track", "waited_on", "count", "wait_ns", "share"]


def ranks_of(value: Any, what: str) -> list[tuple[int | None, Trace]]:
    """``value`` as (rank, trace) pairs: a JobTrace (or a list of per-rank traces) gives
    one per rank, anything :func:`as_trace` takes gives one with rank None."""
    if isinstance(value, JobTrace):
        return list(enumerate(value.ranks))
    if isinstance(value, list):
        return [(rank, as_trace(t, what)) for rank, t in enumerate(value)]
    return [(None, as_trace(value, what))]


def with_rank(rows: list[tuple[int | None, dict[str, Any]]], columns: list[str]) -> tuple[list[str], list[dict]]:
    """Rows of one or more ranks: a leading ``rank`` column where any row has a rank."""
    if all(rank is None for rank, _ in rows):
        return columns, [r for _, r in rows]
    return ["rank", *columns], [{"rank": rank, **r} for rank, r in rows]


def engine_slices(trace: Trace) -> list[Slice]:
    """The slices on engine and DMA-queue tracks (not ops, graphs, host, ...)."""
    return [s for s in trace.slices if s.track not in OVERVIEW_TRACKS]


def _step(s: Slice, op: str | None) -> dict[str, Any]:
    wait = s.args["wait"]
    return {"op": op, "index": s.args.get("index"), "track": s.track, "name": s.name, "start_ns": s.start_ns,
            "end_ns": s.end_ns, "dur_ns": s.dur_ns, "waited_on": wait["kind"], "on": wait["on"], "sem": wait["sem"],
            "idle_ns": wait["idle_ns"]}


def _instruction_path(slices: list[Slice], op: str | None) -> list[dict[str, Any]]:
    """Back from the last slice to finish (the latest index among ties) to a launch."""
    timed = [s for s in slices if "wait" in s.args and "index" in s.args]
    if not timed:
        return []
    by_index = {s.args["index"]: s for s in timed}
    # ends compared in whole picoseconds: a saved trace's times are rounded
    at: Slice | None = max(timed, key=lambda s: (round(s.end_ns * 1000), s.args["index"]))
    path = []
    seen: set[int] = set()   # a damaged trace's causes could loop
    while at is not None and at.args["index"] not in seen:
        seen.add(at.args["index"])
        path.append(_step(at, op))
        on = at.args["wait"]["on"]
        at = by_index.get(on) if on is not None else None
    return path[::-1]


def _op_path(trace: Trace) -> list[dict[str, Any]]:
    # collectives run on the device's stream between the ops
    ops = sorted((s for s in trace.slices if s.track in ("ops", "collectives")), key=lambda s: (s.start_ns, s.end_ns))
    engines = sorted(engine_slices(trace), key=lambda s: s.start_ns)
    # a profile's op slices and their engine slices carry the op's number (the kernels
    # of a compiled graph overlap, so time alone cannot tell whose a slice is)
    by_op: dict[int, list[Slice]] = {}
    for e in engines:
        if "op_seq" in e.args:
            by_op.setdefault(e.args["op_seq"], []).append(e)
    path: list[dict[str, Any]] = []
    before: Slice | None = None
    k = 0
    for op in ops:
        if before is None:
            kind, idle = ("launch" if op.start_ns < PICO else "host"), op.start_ns
        else:
            idle = round(op.start_ns - before.end_ns, 3)   # times are whole picoseconds: no float residue
            kind = "busy" if idle < PICO else "host"
        on = before.name if kind == "busy" and before is not None else None
        if op.track == "collectives" and op.args.get("waited_ns", 0.0) >= PICO:
            kind, on = "rank", f"rank {op.args['last_rank']}"   # held until the last rank of the group arrived
            idle = max(idle, op.args["waited_ns"])
        path.append({"op": op.name, "index": None, "track": op.track, "name": op.name, "start_ns": op.start_ns,
                     "end_ns": op.end_ns, "dur_ns": op.dur_ns, "waited_on": kind, "on": on, "sem": None,
                     "idle_ns": idle if kind in ("host", "rank") else 0.0})
        if by_op:
            mine = by_op.get(op.args.get("op_seq", -1), []) if op.track == "ops" else []
        else:   # a trace whose slices do not say: by time
            mine = []
            while k < len(engines) and engines[k].start_ns < op.end_ns:
                if engines[k].start_ns >= op.start_ns:
                    mine.append(engines[k])
                k += 1
        path += _instruction_path(mine, op.name)
        before = op
    return path


def critical_path(trace_or_run: Any) -> Any:
    """The critical path of a run, in time order, as a :class:`trnsim.trace.Table`.

    Takes a Trace, a simulated run, a saved trace's path, or a JobTrace (a ``rank``
    column then says whose path each step is on). Columns: ``step``; ``op`` (the
    profiled op the step belongs to, or None); ``index`` (the instruction's index in
    its Program); ``track``; ``name``; ``start_ns``, ``end_ns``, ``dur_ns``;
    ``waited_on`` (``dma``, ``engine``, ``semaphore``, ``busy``, ``launch``, or for
    ops ``host``, and for a collective that waited for a slower peer ``rank``);
    ``on`` (the index, op name, or ``rank N`` it waited on); ``sem`` (the
    semaphore of a wait); ``idle_ns`` (how long its track sat idle before it).
    """
    from trnsim.trace.table import Table

    rows: list[tuple[int | None, dict[str, Any]]] = []
    for rank, trace in ranks_of(trace_or_run, "critical_path"):
        if any(s.track == "ops" for s in trace.slices):
            path = _op_path(trace)
        else:
            if not any("wait" in s.args for s in trace.slices):
                raise TrnSimError(f"trace {trace.meta.get('program', trace.process)!r} has no instruction slices "
                                  "with a 'wait' argument (it was written before trnsim recorded them); trace the "
                                  "run again with trnsim.trace.trace_from_run")
            path = _instruction_path(engine_slices(trace), None)
        rows += [(rank, {"step": n, **step}) for n, step in enumerate(path)]
    columns, out = with_rank(rows, PATH_COLUMNS)
    return Table(columns, out)


def waits(trace_or_run: Any) -> Any:
    """Per engine and DMA queue, the time it sat idle and what it waited on, as a
    :class:`trnsim.trace.Table` with columns ``track``, ``waited_on``, ``count`` (the
    instructions that waited so), ``wait_ns`` and ``share`` (of the run's time).

    Idle time before an instruction goes to its cause (see :data:`trnsim.hw.core.CAUSES`);
    ``between_ops`` is idle time between a profile's ops (from the end of an op's work
    on the track to the next op's work on it), ``finished`` the time after the
    track's last instruction until the run ended. A JobTrace adds a ``rank`` column.
    """
    from trnsim.trace.table import Table

    rows: list[tuple[int | None, dict[str, Any]]] = []
    for rank, trace in ranks_of(trace_or_run, "waits"):
        total = trace.total_ns
        by_track: dict[str, list[Slice]] = {}
        for s in engine_slices(trace):
            by_track.setdefault(s.track, []).append(s)
        for track in sorted(by_track, key=track_sort_key):
            slices = by_track[track]
            last = max(s.end_ns for s in slices)
            spent: dict[str, list[float]] = {}
            for s in slices:
                wait = s.args.get("wait")
                if wait is not None and wait["idle_ns"] > 0:
                    entry = spent.setdefault(wait["kind"], [0, 0.0])
                    entry[0] += 1
                    entry[1] += wait["idle_ns"]
            unexplained = last - busy_ns(slices) - sum(v[1] for v in spent.values())
            if unexplained > PICO:
                spent["between_ops"] = [0, unexplained]
            if total - last > PICO:
                spent["finished"] = [0, total - last]
            for kind, (count, ns) in sorted(spent.items(), key=lambda kv: -kv[1][1]):
                rows.append((rank, {"track": track, "waited_on": kind, "count": count, "wait_ns": ns,
                                    "share": ns / total if total else 0.0}))
    columns, out = with_rank(rows, WAIT_COLUMNS)
    return Table(columns, out)
