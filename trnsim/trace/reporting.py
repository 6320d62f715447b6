"""The summary of a run, built from its trace alone: what ``trnsim run`` and ``trnsim report`` print.

:func:`report` reads a :class:`~trnsim.trace.Trace` (one device: a ``trnsim.profile``
recording or a simulated kernel) or a :class:`~trnsim.trace.JobTrace` (the ranks of a
distributed job) and returns a :class:`Report`; ``str(report)`` is the summary. Since
``trnsim run`` prints the report of the trace it writes, ``trnsim report`` on that file
prints the same figures.

Definitions (ns of simulated time; a job sums its ranks unless said otherwise):

- simulated time: from the first op's start to the last device slice's end (the job's
  ranks share one clock); host sync marks and compile marks are not device time;
- op time: the ``ops`` track's slices, grouped by name; an op's share is of all op time;
  the kernels of compiled graphs are ops too, their fused kernels named ``fused[...]``;
- engine busy: time with at least one slice on the engine's track over simulated time
  (a job: averaged over ranks); DMA queues are summed up as their mean and busiest.
  Ops without engine slices (bandwidth estimates, grouped ``_foreach`` and optimizer
  kernels) are not counted; their share of op time is printed;
- HBM traffic: the ``hbm_bytes`` of the op slices (of the DMA slices for a kernel's
  trace); bandwidth is that over simulated time, against the devices' HBM bandwidth;
- model FLOPs: the matmul FLOPs of the ops the model ran, forward and backward as the
  device executed them (recomputation included), from the trace's ``flops``;
  MFU = model FLOPs / (simulated time x bf16 dense peak FLOP/s of all the cores used);
- collective time: time with a collective running on the rank; exposed communication:
  the part of it no op of that rank overlapped;
- unfused: the kernels of compiled graphs without matmul work that ran one aten op
  because the graph could not fuse it (their ``not_fused`` reason), by op and the eager
  op it came from (:func:`trnsim.trace.matching.unfused`), and their share of op time.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from trnsim.errors import TraceFileError, TrnSimError
from trnsim.trace.analysis import busy_ns, hbm_bytes
from trnsim.trace.events import Slice, Trace, track_label, track_sort_key
from trnsim.trace.export import as_trace
from trnsim.trace.job import JobTrace
from trnsim.trace.matching import Unfused, unfused
from trnsim.trace.partial import summary_line

#: Tracks that are not device engines (the op, graph, host and compile marks).
NOT_ENGINES = frozenset({"ops", "graphs", "host", "compile", "collectives"})
#: Unfused ops a report (and a comparison) names.
UNFUSED_NAMED = 3
#: Tracks whose slices are not device time.
NOT_DEVICE_TIME = frozenset({"host", "compile"})


@dataclass(frozen=True)
class OpTime:
    """One op (or compiled kernel) name: its calls, total simulated time and share of all op time."""

    name: str
    calls: int
    total_ns: float
    pct: float
    timed_by: str


@dataclass(frozen=True)
class RankTime:
    """One rank's busy time, collective time, exposed communication, and the time its
    collectives waited for slower ranks of their groups (ns)."""

    rank: int
    name: str
    busy_ns: float
    collective_ns: float
    exposed_ns: float
    collectives: int
    peer_wait_ns: float = 0.0


@dataclass(frozen=True)
class Compilation:
    """One compiled graph: its function, kind, and why it was (re)compiled."""

    graph: str
    code: str
    kind: str
    recompile: bool
    reason: str
    simulated_compile_s: float


@dataclass(frozen=True)
class Report:
    """The figures of a run; ``str()`` gives the summary. See the module for definitions."""

    program: str
    chip: str
    fidelity: str
    world_size: int
    total_ns: float
    op_ns: float
    ops: tuple[OpTime, ...]
    engine_busy_pct: dict[str, float]
    hbm_bytes: int
    hbm_peak_gbps: float
    flops: int
    peak_flops: float
    unseen_op_ns: float = 0.0
    ranks: tuple[RankTime, ...] = ()
    compilations: tuple[Compilation, ...] = ()
    unfused: tuple[Unfused, ...] = ()
    partial: str | None = None
    #: the time some op ran (ops of a compiled graph overlap): ``op_ns`` where none do
    op_busy_ns: float | None = None
    top: int = field(default=10, compare=False)

    @property
    def hbm_gbps(self) -> float:
        """HBM bytes over simulated time, GB/s."""
        return self.hbm_bytes / self.total_ns if self.total_ns else 0.0

    @property
    def achieved_flops(self) -> float:
        """Model FLOPs over simulated time, FLOP/s."""
        return self.flops / (self.total_ns * 1e-9) if self.total_ns else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation, 0 to 1 (see the module)."""
        return self.achieved_flops / self.peak_flops if self.peak_flops else 0.0

    def __str__(self) -> str:
        where = f"{self.chip}, {self.world_size} ranks" if self.world_size > 1 else self.chip
        fidelity = f" (fidelity {self.fidelity})" if self.fidelity != "?" else ""
        lines = [summary_line(self.partial)] if self.partial else []
        lines += [f"program        {self.program} on {where}{fidelity}",
                 f"simulated time {self.total_ns / 1000:,.3f} us"]
        if self.ops:
            busy = self.op_ns if self.op_busy_ns is None else self.op_busy_ns
            share = 100 * busy / (self.total_ns * self.world_size) if self.total_ns else 0.0
            calls = sum(o.calls for o in self.ops)
            waits = "for the host or in collectives" if self.ranks else "for the host"
            overlapped = f", overlapping in {busy / 1000:,.3f} us" if busy < self.op_ns - 0.5 else ""
            lines.append(f"ops            {calls:,} calls, {self.op_ns / 1000:,.3f} us{overlapped} ({share:.1f}% of the "
                         f"simulated time; the rest the device waits {waits})")
            width = max([40] + [len(o.name) for o in self.ops[:self.top]])
            lines.append(f"  {'top ops and fused kernels':{width}} {'calls':>6} {'total us':>12} {'share':>6}  timed by")
            for o in self.ops[:self.top]:
                lines.append(f"  {o.name:{width}} {o.calls:6d} {o.total_ns / 1000:12.3f} {o.pct:5.1f}%  {o.timed_by}")
            if len(self.ops) > self.top:
                rest = self.ops[self.top:]
                lines.append(f"  ... {len(rest)} more, {sum(o.total_ns for o in rest) / 1000:,.3f} us")
        if self.unfused:
            left = sum(u.total_ns for u in self.unfused)
            lines.append(f"unfused        {100 * left / self.op_ns:.1f}% of op time in ops without matmuls that the "
                         f"compiled graphs did not fuse; costliest: "
                         f"{', '.join(str(u) for u in self.unfused[:UNFUSED_NAMED])}")
        lines.append("engines        busy share of the simulated time" + (" (mean over ranks)" if self.world_size > 1 else ""))
        if self.unseen_op_ns:
            lines.append(f"  not counted: ops without engine slices, {100 * self.unseen_op_ns / self.op_ns:.1f}% of op time "
                         "(bandwidth estimates, grouped kernels)")
        dma = [pct for track, pct in self.engine_busy_pct.items() if track.startswith("dma.q")]
        for track, pct in self.engine_busy_pct.items():
            if not track.startswith("dma.q"):
                lines.append(f"  {track_label(track):<27} {pct:6.1f}%")
        if dma:
            lines.append(f"  {f'DMA queues ({len(dma)})':<27} {sum(dma) / len(dma):6.1f}% mean, {max(dma):.1f}% busiest")
        peak = f" ({100 * self.hbm_gbps / self.hbm_peak_gbps:.1f}% of {self.hbm_peak_gbps:,.0f} GB/s)" \
            if self.hbm_peak_gbps else ""
        lines.append(f"HBM traffic    {self.hbm_bytes / 2**20:,.2f} MiB at {self.hbm_gbps:,.1f} GB/s{peak}")
        lines.append(f"FLOPs          {self.flops / 1e9:,.3f} GFLOP of matmul at {self.achieved_flops / 1e12:,.3f} TFLOP/s")
        if self.peak_flops:
            lines.append(f"MFU            {100 * self.mfu:.2f}% (model FLOPs / (simulated time x "
                         f"{self.peak_flops / 1e12:,.1f} TFLOP/s bf16 peak of the cores used))")
        if self.ranks:
            lines += ["", *_rank_lines(self.ranks)]
        if self.compilations:
            lines += ["", *_compile_lines(self.compilations)]
        return "\n".join(lines)


def _rank_lines(ranks: tuple[RankTime, ...]) -> list[str]:
    width = max([10] + [len(r.name) for r in ranks])
    lines = [f"{'rank':{width}} {'busy us':>12} {'collective us':>14} {'exposed us':>12} {'collectives':>12} "
             f"{'waited for ranks us':>20}"]
    for r in ranks:
        lines.append(f"{r.name:{width}} {r.busy_ns / 1e3:12.3f} {r.collective_ns / 1e3:14.3f} "
                     f"{r.exposed_ns / 1e3:12.3f} {r.collectives:12d} {r.peer_wait_ns / 1e3:20.3f}")
    lines.append("exposed: collective time on the rank that no op of it overlapped; waited for ranks: time its "
                 "collectives were held until a slower rank of the group arrived")
    return lines


def _compile_lines(comps: tuple[Compilation, ...]) -> list[str]:
    recompiles = sum(c.recompile for c in comps)
    sim_s = sum(c.simulated_compile_s for c in comps)
    lines = [f"compilations   {len(comps)} graphs ({recompiles} from recompiles), about {sim_s:,.1f} s of "
             "simulated compiler time (host time, not device time)"]
    causes: dict[tuple[str, str], list[str]] = {}
    for c in comps:
        causes.setdefault((c.code, c.reason if c.recompile else "first compile"), []).append(c.kind)
    for (code, reason), kinds in causes.items():
        lines.append(f"  {len(kinds):3d} x {code} ({', '.join(dict.fromkeys(kinds))}): {reason}")
    return lines


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def rank_time(trace: Trace, rank: int = 0) -> RankTime:
    """The busy, collective and exposed-communication time of one rank's trace."""
    ops = _union([(s.start_ns, s.end_ns) for s in trace.slices if s.track == "ops"])
    coll = _union([(s.start_ns, s.end_ns) for s in trace.slices if s.track == "collectives"])
    overlap = sum(max(0.0, min(b, d) - max(a, c)) for a, b in coll for c, d in ops)
    coll_ns = sum(b - a for a, b in coll)
    busy = sum(b - a for a, b in _union(ops + coll))
    colls = [s for s in trace.slices if s.track == "collectives"]
    return RankTime(rank, trace.process, busy, coll_ns, coll_ns - overlap, len(colls),
                    sum(float(s.args.get("waited_ns", 0.0)) for s in colls))


def device_span(traces: list[Trace]) -> tuple[float, float]:
    """First start and last end of the device's slices (host and compile marks aside)."""
    device = [s for t in traces for s in t.slices if s.track not in NOT_DEVICE_TIME]
    if not device:
        return 0.0, 0.0
    return min(s.start_ns for s in device), max(s.end_ns for s in device)


def _timed_by(s: Slice) -> str:
    a = s.args
    if "graph" in a:
        return f"{'fused' if s.name.startswith('fused[') else 'kernel'} in {a['graph']}"
    if a.get("timed_by") == "kernel":
        return str(a.get("kernel", "kernel"))
    return str(a.get("timed_by", "?"))


def _main_timing(slices: list[Slice]) -> str:
    """How the calls of one op name were timed: the way that timed most of their time."""
    by: dict[str, float] = {}
    for s in slices:
        how = _timed_by(s)
        by[how] = by.get(how, 0.0) + s.own_ns
    return max(by, key=lambda how: (by[how], how))


def op_times(traces: list[Trace]) -> list[OpTime]:
    """The ``ops`` track of ``traces`` grouped by name, largest total first."""
    groups: dict[str, list[Slice]] = {}
    for t in traces:
        for s in t.slices:
            if s.track == "ops":
                groups.setdefault(s.name, []).append(s)
    total = sum(s.own_ns for ss in groups.values() for s in ss) or 1.0
    rows = [OpTime(name, len(ss), sum(s.own_ns for s in ss), 100 * sum(s.own_ns for s in ss) / total, _main_timing(ss))
            for name, ss in groups.items()]
    rows.sort(key=lambda r: (-r.total_ns, r.name))
    return rows


def unseen_op_ns(trace: Trace) -> float:
    """Op time of the ops with no engine slice starting inside them (timed by an estimate,
    or a group of kernels the trace does not draw): engine busy shares leave them out."""
    starts = sorted(s.start_ns for s in trace.slices if s.track not in NOT_ENGINES)
    total = 0.0
    for s in trace.slices:
        if s.track == "ops":
            i = bisect.bisect_left(starts, s.start_ns)
            if i == len(starts) or starts[i] >= s.end_ns:
                total += s.own_ns
    return total


def _compilations(traces: list[Trace]) -> tuple[Compilation, ...]:
    out = []
    for t in traces:
        for s in sorted((s for s in t.slices if s.track == "compile"), key=lambda s: s.start_ns):
            a = s.args
            out.append(Compilation(s.name.removeprefix("compile "), str(a.get("code", "?")), str(a.get("kind", "?")),
                                   bool(a.get("recompile", False)), str(a.get("reason", "")),
                                   float(a.get("simulated_compile_s", 0.0))))
    return tuple(out)


def rank_traces(trace: Trace | JobTrace | str | os.PathLike, what: str) -> tuple[Trace | JobTrace, list[Trace]]:
    """``trace`` loaded if a path, and its ranks' traces (itself alone for a one-device
    trace); ``what`` names the caller in a refusal."""
    if isinstance(trace, (str, os.PathLike)):
        from trnsim.trace.export import load

        trace = load(trace)
    if isinstance(trace, JobTrace):
        if not trace.ranks:
            raise TraceFileError(f"{what}: the job trace has no ranks; merge the ranks' traces with trnsim.trace.merge")
        return trace, trace.ranks
    return trace, [as_trace(trace, what)]


def report(trace: Trace | JobTrace | str | os.PathLike, *, top: int = 10) -> Report:
    """The :class:`Report` of a trace, a job trace or a saved trace's path; ``top`` ops are printed."""
    if not isinstance(top, int) or top < 0:
        raise TrnSimError(f"top={top!r}: give the number of ops to list, 0 or more")
    trace, traces = rank_traces(trace, "report")
    job = isinstance(trace, JobTrace)
    start, end = device_span(traces)
    total = end - start
    engines: dict[str, float] = {}
    for t in traces:
        by_track: dict[str, list[Slice]] = {}
        for s in t.slices:
            if s.track not in NOT_ENGINES:
                by_track.setdefault(s.track, []).append(s)
        for track, ss in by_track.items():
            engines[track] = engines.get(track, 0.0) + (100 * busy_ns(ss) / total if total else 0.0) / len(traces)
    metas = [t.meta for t in traces]
    ops = op_times(traces)
    has_coll = any(s.track == "collectives" for t in traces for s in t.slices)
    first = metas[0]
    return Report(
        program=_job_name(trace) if job else str(first.get("program", "?")),
        chip=str(first.get("chip", "?")),
        fidelity=str(first.get("fidelity", "?")),
        world_size=len(traces),
        total_ns=total,
        op_ns=sum(o.total_ns for o in ops),
        op_busy_ns=sum(busy_ns([s for s in t.slices if s.track == "ops"]) for t in traces),
        ops=tuple(ops),
        unseen_op_ns=sum(unseen_op_ns(t) for t in traces),
        engine_busy_pct=dict(sorted(engines.items(), key=lambda kv: track_sort_key(kv[0]))),
        hbm_bytes=sum(hbm_bytes(t) for t in traces),
        hbm_peak_gbps=sum(float(m.get("hbm_bw_gbps", 0.0)) for m in metas),
        flops=int(sum(m.get("flops", 0) for m in metas)),
        peak_flops=sum(float(m.get("device_peak_flops", m.get("peak_flops", 0.0))) for m in metas),
        ranks=tuple(rank_time(t, r) for r, t in enumerate(traces)) if job or has_coll else (),
        compilations=_compilations(traces),
        unfused=tuple(unfused([s for t in traces for s in t.slices])),
        partial=_partial(trace, traces),
        top=top,
    )


def _partial(trace: Trace | JobTrace, traces: list[Trace]) -> str | None:
    """Why the run did not finish: the job's reason, else the first rank's that has one."""
    return trace.partial or next((t.partial for t in traces if t.partial), None)


def _job_name(job: JobTrace) -> str:
    instance = job.meta.get("instance")
    return f"distributed job ({sum(len([s for s in t.slices if s.track == 'ops']) for t in job.ranks):,} ops" + \
        (f" on {instance})" if instance else ")")
