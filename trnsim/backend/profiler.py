"""``trnsim.profile``: record the eager timeline of the ``neuron`` device.

Inside ``with trnsim.profile("trace.json") as prof:`` every op this thread runs on the
device (and the backward ops the autograd engine runs for it) is recorded with its
name, shapes, dtypes and simulated start and end; as with PyTorch's profiler, other
threads' ops are theirs to record. The trace has an
"ops" track of op slices above the engine and DMA-queue slices of each op's kernel
Program, placed at the op's start (ops timed by an estimate have no engine slices).
Each op slice carries the op's matmul FLOPs and HBM bytes, and the trace's metadata the
device's peak FLOP/s and HBM bandwidth, so that :func:`trnsim.trace.report` can sum a
run up from the trace alone (the fields: traces/README.md).

``torch.compile`` compilations this thread makes while a profile records are kept too
(:attr:`profile.compilations`): the summary prints them below the ops, with their
causes and simulated compile time, and the trace marks each compiled graph on a
"compile" track at the host time it was compiled. Compile time is host time on the real
chip, never device time: the marks have no duration and the device timeline is unchanged.
"""

from __future__ import annotations

import bisect
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnsim.atomic import as_path, check_writable
from trnsim.backend import state, timeline
from trnsim.errors import TrnSimError
from trnsim.trace.partial import KEY as PARTIAL
from trnsim.trace.partial import save_run, why_unfinished

_ACTIVE = "trnsim.profiles"


def current() -> profile | None:
    """The innermost profile active in this thread, or None (profiles are per thread, as
    PyTorch's profiler is)."""
    active = timeline.thread_list(_ACTIVE)
    return active[-1] if active else None


@dataclass(frozen=True)
class OpRow:
    """One line of :meth:`profile.summary`: an op name and where its time went."""

    name: str
    calls: int
    total_us: float
    pct: float
    source: str
    kernel: str


class ProfileSummary(list):
    """Ops by total simulated time (a list of :class:`OpRow`), printed as a table; then,
    where the profile saw ``torch.compile`` compile, ``compiles`` (a
    :class:`trnsim.backend.compile.metrics.CompileSummary`), printed below it."""

    compiles: Any = None

    def __str__(self) -> str:
        width = max([44] + [len(r.name) for r in self])
        lines = [f"{'op':{width}} {'calls':>6} {'total us':>12} {'%':>6}  timed by"]
        for r in self:
            how = r.kernel if r.source == "kernel" else r.source
            lines.append(f"{r.name:{width}} {r.calls:6d} {r.total_us:12.3f} {r.pct:6.1f}  {how}")
        if self.compiles is not None and self.compiles.compilations:
            lines += ["", *self.compiles.lines()]
        return "\n".join(lines)


class profile:
    """Record the ops run on ``neuron`` while active; write a Perfetto trace at exit.

    Profiles nest: each records the ops run inside it and writes its own trace. Each
    entry starts a new recording; the same profile cannot be entered inside itself.

    When an exception leaves the with-block (Ctrl-C included; ``sys.exit(0)`` aside),
    the run did not finish: its trace is written beside ``path`` instead
    (``trace.json`` gives ``trace.partial.json``), marked partial, so the trace of an
    earlier, finished run at ``path`` is kept; a note on the exception names the file
    (see :mod:`trnsim.trace.partial`).

    Args:
        path: where to write the Chrome/Perfetto JSON trace on exit (None: keep it in
            memory; :meth:`trace` and :meth:`save` give it).
        engines: also place each op's engine-level slices under it (default True).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, engines: bool = True) -> None:
        self.path = as_path(path, "profile trace") if path is not None else None
        self.engines = engines
        self.records: list[timeline.OpRecord] = []
        self.syncs: list[tuple[str, int]] = []
        self.compilations: list = []
        self._raw: list = []
        self._compile_mark = 0
        #: Why the recording did not finish (the exception that left the with-block,
        #: :func:`trnsim.trace.partial.why_unfinished`), or None.
        self.partial: str | None = None

    def __enter__(self) -> profile:
        active = timeline.thread_list(_ACTIVE)
        if any(p is self for p in active):
            raise TrnSimError("this trnsim.profile is already recording; a profile cannot be entered again inside "
                              "itself: make a second trnsim.profile(...) to nest one")
        if self.path is not None:
            check_writable(self.path)
        from trnsim.backend.compile import metrics

        self.records, self.syncs, self._raw, self.compilations = [], [], [], []
        self.partial = None
        self._compile_mark = metrics.mark()
        timeline.start_recording(self._raw)
        active.append(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if not timeline.stop_recording(self._raw):
            raise TrnSimError("this trnsim.profile is not recording: __exit__ without __enter__ (or a second "
                              "__exit__); use it as `with trnsim.profile(...) as prof:`")
        active = timeline.thread_list(_ACTIVE)
        active[:] = [p for p in active if p is not self]
        from trnsim.backend.compile import metrics

        me = threading.get_ident()
        self.compilations = [e for e in metrics.compilations_since(self._compile_mark) if e.thread == me]
        for r in self._raw:
            if isinstance(r, tuple):
                self.syncs.append((r[1], r[2]))
            else:
                self.records.append(r)
        self.partial = why_unfinished(exc)
        if self.path is None:
            return
        if exc is None or self.partial is None:
            self.save(self.path)
            return
        # an exception is on its way out: the trace goes beside the path, marked partial,
        # and the exception's traceback says where (a failure to write must not hide it)
        try:
            written = save_run(self.trace(), self.path, self.partial)
            kept = f" ({self.path} is left as it was)" if self.path.exists() else ""
            exc.add_note(f"trnsim.profile: the run did not finish; its partial trace is at {written}{kept}")
        except TrnSimError as e:
            exc.add_note(f"trnsim.profile: the partial trace could not be written: {e}")

    @property
    def device_ps(self) -> int:
        """Simulated time from the first recorded op's start to the last one's end."""
        if not self.records:
            return 0
        return max(r.end_ps for r in self.records) - min(r.start_ps for r in self.records)

    def summary(self) -> ProfileSummary:
        """Ops grouped by name, by total simulated device time, largest first."""
        groups: dict[str, list[timeline.OpRecord]] = {}
        for r in self.records:
            groups.setdefault(r.name, []).append(r)
        total = sum(_own_ps(r) for r in self.records) or 1
        rows = []
        for name, rs in groups.items():
            t = sum(_own_ps(r) for r in rs)
            rows.append(OpRow(name, len(rs), t / 1e6, 100 * t / total, rs[0].cost.source, rs[0].cost.kernel))
        rows.sort(key=lambda r: (-r.total_us, r.name))
        out = ProfileSummary(rows)
        if self.compilations:
            from trnsim.backend.compile import metrics

            out.compiles = metrics.summary(self.compilations)
        return out

    def trace(self):
        """The recording as a :class:`trnsim.trace.Trace`."""
        from trnsim.trace.events import Slice, Trace, _effective_peak, _step_counter, trace_from_run

        chip = state.chip()
        runs = [r.cost for r in self.records if r.cost.run is not None]
        # the peak is the ops' own mix of matmul dtypes; an op's Program may be one physical
        # core's share of its work (OpCost.cores shares make the op)
        flops = ideal_s = 0.0
        for c in runs:
            f = c.run.program.flops() * c.scale * c.cores
            if f:
                flops += f
                ideal_s += f / _effective_peak(c.run.program)
        tr = Trace(process=f"neuron:0 ({chip.name})", meta={
            "program": self._program(),
            "chip": chip.name,
            "eager": True,
            "instructions": sum(len(c.run.program.instructions) for c in runs) if self.engines else 0,
            "flops": flops,
            "peak_flops": flops / ideal_s if ideal_s else 0.0,
            "hbm_bw_gbps": chip.hbm_bw_per_core_gbps * chip.logical_core_size,
            "fidelity": state.fidelity(),
            "cores": chip.logical_core_size,
            "device_peak_flops": chip.tensor_engine.peak_flops() * chip.logical_core_size,
        })
        origin = min((r.start_ps for r in self.records), default=0)
        graph_start = 0.0
        graphs = [g for e in self.compilations for g in e.graphs]
        if graphs:
            tr.meta["compiled_graphs"] = len(graphs)
            tr.meta["simulated_compile_s"] = sum(g.simulated_compile_s for g in graphs)
        for g in graphs:
            args = {"code": g.code, "kind": g.kind, "nodes": g.graph_node_count, "recompile": g.recompile,
                    "simulated_compile_s": g.simulated_compile_s}
            if g.reason is not None:
                args["reason"] = g.reason
            at_ns = max(g.host_clock_ps - origin, 0) / 1000  # a compile before the first op marks the start
            tr.slices.append(Slice("compile", f"compile {g.graph_name}", at_ns, 0.0, args))
        tr.meta["origin_ps"] = origin   # the rank's clock at the trace's 0 (merging ranks aligns on it)
        if self.partial is not None:
            tr.meta[PARTIAL] = self.partial
        hbm_spans: list[tuple[float, float, float]] = []
        # traces of segments' runs by id of the run, with their instructions' slices in order
        segments: dict[int, Any] = {}
        occupancy: dict[str, list[tuple[float, float, float]]] = {"SBUF occupancy": [], "PSUM occupancy": []}
        for seq, r in enumerate(self.records):
            start_ns = (r.start_ps - origin) / 1000
            if r.cost.source == "collective":
                tr.slices.append(Slice("collectives", r.name.removeprefix("c10d::"), start_ns,
                                       (r.end_ps - r.start_ps) / 1000, r.info.args()))
                continue
            end_ns = (r.end_ps - origin) / 1000
            # op_seq: the op's number in the profile, which its engine slices carry too (the
            # kernels of a compiled graph overlap, so time alone cannot tell whose a slice is)
            args = {"shapes": [list(s) for s in r.shapes], "dtypes": list(r.dtypes), "timed_by": r.cost.source,
                    "op_seq": seq}
            if r.cost.kernel:
                args["kernel"] = r.cost.kernel
            if r.cost.run is not None:   # the op's work: its Program's, times the share it covers
                args["flops"] = r.cost.flops()
            hbm = r.cost.hbm_moved()   # also known for estimates and groups of kernels
            if r.cost.source == "none":
                args["flops"] = args["hbm_bytes"] = 0
            elif hbm is not None:
                args["hbm_bytes"] = hbm
            place = None
            if r.info is not None:   # a kernel of a compiled graph
                place = r.info.get("place")
                args.update((k, v) for k, v in r.info.items() if k != "place")
                if r.info["index"] == 0:
                    graph_start = start_ns
                if r.info["index"] == r.info["kernels"] - 1:
                    tr.slices.append(Slice("graphs", r.info["graph"], graph_start, end_ns - graph_start,
                                           {"kernels": r.info["kernels"]}))
            tr.slices.append(Slice("ops", r.name.removeprefix("aten::"), start_ns, (r.end_ps - r.start_ps) / 1000,
                                   args))
            if args.get("hbm_bytes"):
                hbm_spans.append((start_ns, end_ns, args["hbm_bytes"]))
            if self.engines and place is not None and place.run is not None:
                # a kernel of a segment traced as one Program: its own instructions of that run
                hit = segments.get(id(place.run))
                if hit is None:
                    segment = trace_from_run(place.run)
                    mine = sorted((s for s in segment.slices if "index" in s.args), key=lambda s: s.args["index"])
                    hit = segments[id(place.run)] = (segment, [s.args["index"] for s in mine], mine)
                segment, indices, mine = hit
                shift = start_ns - place.begin_ps / 1000
                lo, hi = bisect.bisect_left(indices, place.first), bisect.bisect_left(indices, place.last)
                for s in mine[lo:hi]:
                    tr.slices.append(Slice(s.track, s.name, shift + s.start_ns, s.dur_ns, {**s.args, "op_seq": seq}))
                # the segment's tiles, counted once, from its first kernel (a segment's kernels
                # share one split of the work over the cores)
                if place.first == 0:
                    _hold(occupancy, segment.counters, shift, shift + place.run.total_ps / 1000, r.cost.cores)
            elif self.engines and r.cost.run is not None:
                kernel = trace_from_run(r.cost.run)
                for s in kernel.slices:
                    if s.start_ns * r.cost.scale <= (r.end_ps - r.start_ps) / 1000:
                        tr.slices.append(Slice(s.track, s.name, start_ns + s.start_ns, s.dur_ns,
                                               {**s.args, "op_seq": seq}))
                _hold(occupancy, kernel.counters, start_ns, end_ns, r.cost.cores)
        for reason, t in self.syncs:
            tr.slices.append(Slice("host", reason, (t - origin) / 1000, 0.0, {}))
        tr.counters.append(_step_counter("HBM traffic", "bytes/s", hbm_spans, per_second=True))
        if self.engines:
            tr.counters += [_step_counter(name, "bytes", spans, per_second=False) for name, spans in occupancy.items()]
        return tr

    def _program(self) -> str:
        """What the recording ran: ``eager PyTorch (N ops)``, or for a run with compiled
        graphs ``compiled PyTorch: G graphs (K kernels, F fused) run R times, and N eager ops``
        (K and F count each graph's kernels once)."""
        compiled = [r for r in self.records if r.info is not None and r.cost.source != "collective"]
        if not compiled:
            return f"eager PyTorch ({len(self.records)} ops)"
        kernels: dict[str, set[tuple[int, str]]] = {}
        for r in compiled:
            kernels.setdefault(r.info["graph"], set()).add((r.info["index"], r.name))
        count = sum(len(ks) for ks in kernels.values())
        fused = sum(name.startswith("fused[") for ks in kernels.values() for _, name in ks)
        runs = sum(r.info["index"] == 0 for r in compiled)
        eager = len(self.records) - len(compiled)
        return (f"compiled PyTorch: {len(kernels)} graph{'s' if len(kernels) != 1 else ''} ({count} kernels, "
                f"{fused} fused) run {runs} time{'s' if runs != 1 else ''}, and {eager} eager op{'s' if eager != 1 else ''}")

    def save(self, path: str | os.PathLike) -> Path:
        """Write the trace as Chrome/Perfetto JSON."""
        from trnsim.trace.export import save

        return save(self.trace(), path)


def _hold(occupancy: dict[str, list[tuple[float, float, float]]], counters: list, start_ns: float, end_ns: float,
          cores: float) -> None:
    """Add a Program's SBUF/PSUM occupancy ``counters``, run from ``start_ns`` until
    ``end_ns``, to ``occupancy`` as spans: each level held until the next, so that
    overlapping kernels' tiles add up. The Program is one physical core's: its cores'
    shares hold as much each (``cores``)."""
    for c in counters:
        if c.name in occupancy:
            points = [(start_ns + at, v * cores) for at, v in c.points if start_ns + at < end_ns]
            ends = [at for at, _ in points[1:]] + [end_ns]
            occupancy[c.name] += [(at, end, v) for (at, v), end in zip(points, ends)]


def _own_ps(r: timeline.OpRecord) -> int:
    """The time an op adds to the run (:attr:`trnsim.trace.Slice.own_ns`): a compiled
    kernel's ``after_ps``, else its duration."""
    after = r.info.get("after_ps") if isinstance(r.info, dict) else None
    return after if after is not None else r.end_ps - r.start_ps
