"""The event model of a trace: slices on named tracks, and counters.

A :class:`Trace` is what every layer of trnsim records into and what the
exporters, the analysis and the plots read. Times are nanoseconds from the start
of the run. It knows nothing of Programs; :func:`trace_from_run` turns a
simulated run into one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from trnsim.isa import pe_rows, split_track
from trnsim.units import Nanos

# Display names and order of a NeuronCore's tracks, as a Neuron profile shows them.
TRACK_NAMES = {
    "graphs": "Compiled graphs",
    "ops": "PyTorch ops",
    "host": "Host (sync points)",
    "compile": "torch.compile (compilations: host time, not device time)",
    "collectives": "Collectives (NeuronLink)",
    "tensor": "TensorE (matmul)",
    "tensor.load": "TensorE (load stationary)",
    "vector": "VectorE",
    "scalar": "ScalarE",
    "gpsimd": "GpSimdE",
    "sync": "Sync",
}


def track_sort_key(track: str) -> tuple[int, int, int, str]:
    """Core by core (a kernel on a logical NeuronCore's cores has tracks per core),
    engines first in profile order, then DMA queues by number, then the rest."""
    base, core = split_track(track)
    order = list(TRACK_NAMES)
    if base in TRACK_NAMES:
        return (core, 0, order.index(base), track)
    if base.startswith("dma.q") and base[5:].isdigit():
        return (core, 1, int(base[5:]), track)
    return (core, 2, 0, track)


def track_label(track: str) -> str:
    """Human name of a track (``dma.q3`` is ``DMA queue 3``; ``vector@nc1`` is
    ``VectorE (core 1)``, physical core 1 of a logical NeuronCore)."""
    base, core = split_track(track)
    if base in TRACK_NAMES:
        label = TRACK_NAMES[base]
    elif base.startswith("dma.q"):
        label = f"DMA queue {base[5:]}"
    else:
        label = base
    return f"{label} (core {core})" if core else label


@dataclass
class Slice:
    """One instruction (or op) on one track."""

    track: str
    name: str
    start_ns: Nanos
    dur_ns: Nanos
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end_ns(self) -> Nanos:
        return self.start_ns + self.dur_ns

    @property
    def own_ns(self) -> Nanos:
        """The time an op adds to its run: a compiled graph's kernel's ``after_ps`` (its
        slice spans its first instruction to its last, overlapping the kernels around
        it, so the graph's kernels' own times add up to the graph's), else its duration."""
        after = self.args.get("after_ps")
        return after / 1000 if after is not None else self.dur_ns


@dataclass
class Counter:
    """A value that changes over time, as (time, value) steps."""

    name: str
    unit: str
    points: list[tuple[Nanos, float]] = field(default_factory=list)


@dataclass
class Trace:
    """Slices and counters of one simulated NeuronCore, plus what the run was."""

    process: str = "NeuronCore 0"
    slices: list[Slice] = field(default_factory=list)
    counters: list[Counter] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def tracks(self) -> list[str]:
        """Tracks that hold at least one slice, in profile order."""
        return sorted({s.track for s in self.slices}, key=track_sort_key)

    def counter(self, name: str) -> Counter:
        for c in self.counters:
            if c.name == name:
                return c
        raise KeyError(f"trace has no counter {name!r}; it has: {', '.join(c.name for c in self.counters)}")

    @property
    def total_ns(self) -> Nanos:
        return float(self.meta.get("total_ns", max((s.end_ns for s in self.slices), default=0.0)))

    @property
    def partial(self) -> str | None:
        """Why the run this trace recorded did not finish (``meta["partial"]``: an
        exception, Ctrl-C), or None for a finished run's trace (see
        :mod:`trnsim.trace.partial`)."""
        reason = self.meta.get("partial")
        return None if reason is None else str(reason)


def _step_counter(name: str, unit: str, spans: list[tuple[Nanos, Nanos, float]], per_second: bool) -> Counter:
    """The sum over ``spans`` (start, end, amount) as a step function: each amount held
    from start to end, or with ``per_second`` spread evenly over its span as a rate."""
    edges: dict[Nanos, float] = {}
    for start, end, amount in spans:
        if per_second and (end <= start or amount == 0):
            continue
        level = amount / ((end - start) * 1e-9) if per_second else amount
        edges[start] = edges.get(start, 0.0) + level
        edges[end] = edges.get(end, 0.0) - level
    counter = Counter(name, unit)
    level = 0.0
    for t in sorted(edges):
        level += edges[t]
        counter.points.append((t, max(0.0, round(level, 3)) if per_second else level))
    return counter


def _effective_peak(program: Any) -> float:
    """Peak FLOP/s for the program's matmul mix: the bf16 peak, less where inputs are fp32,
    twice it for fp8 multiplies in the double-row mode (two contraction rows per
    processing element, NC-v3 and later)."""
    te = program.chip.tensor_engine
    flops = ideal_s = 0.0
    for f, inst in program.matmuls():
        flops += f
        rate = te.peak_flops(fp32=inst.src.dtype.name == "float32")
        rate *= pe_rows(inst.double_row)
        ideal_s += f / rate
    return flops / ideal_s if ideal_s else te.peak_flops()


_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def portable(path: str | None) -> str | None:
    """``path`` (a file, or ``file:line``) relative to the install for trnsim's own files
    (``trnsim/kernels/matmul.py:58``), so a trace does not depend on where trnsim is
    installed; any other path as it is."""
    if path and path.startswith(_PACKAGE_ROOT + "trnsim" + os.sep):
        return path[len(_PACKAGE_ROOT):].replace(os.sep, "/")
    return path


def trace_from_run(result: Any) -> Trace:
    """A Trace of a run (a :class:`trnsim.hw.core.TimedRun`, such as
    :class:`trnsim.simulator.RunResult`): one slice per instruction, an HBM
    traffic counter, and SBUF/PSUM occupancy counters (a tensor occupies its bytes from
    the first instruction that touches it to the end of the last)."""
    program = result.program
    chip = program.chip
    trace = Trace(meta={
        "program": program.name,
        "chip": chip.name,
        "chip_source": portable(chip.source),
        "fidelity": result.fidelity,
        "instructions": len(program.instructions),
        "total_ns": result.total_ps / 1000,
        "flops": program.flops(),
        # a kernel on the cores of a logical NeuronCore has the peak and HBM share of each
        "peak_flops": _effective_peak(program) * max(program.cores, 1),
        "hbm_bw_gbps": chip.hbm_bw_per_core_gbps * max(program.cores, 1),
        **({"cores": program.cores} if program.cores > 1 else {}),
    })
    causes = result.causes
    matmul_flops = {inst.index: (f, inst.src.dtype.name) for f, inst in program.matmuls()}
    hbm_spans = []
    live: dict[str, list[float]] = {}
    sizes: dict[str, tuple[str, int]] = {}
    for inst in program.instructions:
        i = inst.index
        start, end = result.starts[i] / 1000, result.ends[i] / 1000
        args: dict[str, Any] = {"index": i, "opcode": inst.opcode, "operands": inst.describe(), "deps": list(inst.deps)}
        if inst.source:
            args["source"] = portable(inst.source)
        cause = causes[i]
        args["wait"] = {"kind": cause.kind, "on": cause.on, "sem": cause.sem, "idle_ns": cause.idle_ps / 1000}
        if i in matmul_flops:
            args["flops"], args["dtype"] = matmul_flops[i]
        views = inst.reads() + inst.writes()
        args["bytes"] = sum(v.nbytes for v in views)
        plan = result.dma_plans.get(i)
        if plan is not None:
            args.update(descriptors=plan.descriptors, chunk_bytes=plan.chunk_bytes, hbm_bytes=plan.hbm_bytes)
            args["bytes"] = inst.reads()[0].nbytes
            if inst.forwarded:   # the compiler kept the data in SBUF: nothing moved
                args.update(forwarded=True, bytes=0)
            hbm_spans.append((start, end, plan.hbm_bytes))
        trace.slices.append(Slice(result.tracks[i], inst.opcode, start, end - start, args))
        for v in views:
            t = v.tensor
            if t.on_chip:
                span = live.setdefault(t.name, [start, end])
                span[0], span[1] = min(span[0], start), max(span[1], end)
                sizes[t.name] = (t.memory.value, t.core, t.shape[0] * t.partition_bytes)
    trace.counters.append(_step_counter("HBM traffic", "bytes/s", hbm_spans, per_second=True))
    for core in range(max(program.cores, 1)):
        for memory, label in (("sbuf", "SBUF occupancy"), ("psum", "PSUM occupancy")):
            spans = [(s, e, sizes[n][2]) for n, (s, e) in live.items() if sizes[n][:2] == (memory, core)]
            trace.counters.append(_step_counter(f"{label} (core {core})" if core else label, "bytes", spans,
                                                per_second=False))
    return trace
