"""Ops, kernels and instructions of a trace on the chip's roofline.

Each table row has its time, FLOPs (matmul FLOPs, 2 per multiply-accumulate), HBM
bytes, arithmetic intensity (FLOPs per HBM byte), achieved FLOP/s and ``bound``: the
row is ``"compute"`` bound when its intensity reaches the chip's ridge point (the
TensorE peak for its dtype over the HBM bandwidth), ``"memory"`` bound below it, and
``""`` where it has neither FLOPs nor HBM bytes (or they are not known: an op timed
by an estimate). Work on the vector, scalar and gpsimd engines counts no FLOPs, so
an elementwise op is memory bound by this measure, as on the real chip's roofline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

from trnsim.errors import TrnSimError
from trnsim.hw.spec import load_chip
from trnsim.trace.critical import engine_slices, ranks_of, with_rank
from trnsim.trace.events import Slice, Trace, track_sort_key
from trnsim.trace.table import Table

ROOF_COLUMNS = ["time_ns", "share", "calls", "flops", "bytes", "intensity", "flops_per_s", "bound"]


@dataclass(frozen=True)
class Roofline:
    """A chip's roofline as a trace sees it: peak matmul FLOP/s per input dtype class
    (``"bf16"`` covers bfloat16 and float16) and the HBM bandwidth of the core the trace
    ran on; ``ridge(dtype)`` is the intensity (FLOPs per byte) where the two meet."""

    chip: str
    peak_flops: dict[str, float]
    hbm_bytes_per_s: float

    def dtype_class(self, dtype: str | None) -> str:
        """``"fp32"``, ``"fp8"`` or ``"bf16"`` (also for unknown or integer dtypes)."""
        name = (dtype or "").removeprefix("torch.")
        if name in ("float32", "float64"):
            return "fp32"
        if name.startswith("float8"):
            return "fp8"
        return "bf16"

    def peak(self, dtype: str | None = None) -> float:
        return self.peak_flops[self.dtype_class(dtype)]

    def ridge(self, dtype: str | None = None) -> float:
        return self.peak(dtype) / self.hbm_bytes_per_s

    def bound(self, flops: float | None, hbm_bytes: float | None, dtype: str | None = None) -> str:
        """``"compute"``, ``"memory"``, or ``""`` where neither is known."""
        if not flops and not hbm_bytes:
            return ""
        if not hbm_bytes:
            return "compute"
        return "compute" if (flops or 0) / hbm_bytes >= self.ridge(dtype) else "memory"

    def __str__(self) -> str:
        lines = [f"roofline of {self.chip}: HBM {self.hbm_bytes_per_s / 1e9:,.1f} GB/s"]
        for cls, peak in self.peak_flops.items():
            ridge = peak / self.hbm_bytes_per_s
            lines.append(f"  {cls:5} peak {peak / 1e12:8.2f} TFLOP/s  ridge {ridge:8.1f} FLOP/byte")
        return "\n".join(lines)


def roofline(trace: Any) -> Roofline:
    """The roofline of the chip ``trace`` ran on (its ``meta["chip"]``): a profile's
    logical core counts all its physical cores, as its HBM bandwidth does."""
    first = ranks_of(trace, "roofline")[0][1]
    name = first.meta.get("chip")
    if not name:
        raise TrnSimError(f"trace {first.process!r} names no chip in its metadata; it was not written by trnsim")
    source = first.meta.get("chip_source")
    chip = load_chip(source if source and os.path.exists(source) else name)
    te = chip.tensor_engine
    cores = chip.logical_core_size if first.meta.get("eager") else 1
    bf16 = te.peak_flops() * cores
    peaks = {"bf16": bf16, "fp32": te.peak_flops(fp32=True) * cores, "fp8": bf16 * te.fp8_rows_factor}
    bw = float(first.meta.get("hbm_bw_gbps") or chip.hbm_bw_per_core_gbps * cores) * 1e9
    return Roofline(chip.name, peaks, bw)


def _row(roof: Roofline, total_ns: float, time_ns: float, calls: int, flops: float | None, hbm: float | None,
         dtype: str | None) -> dict[str, Any]:
    intensity = None
    if flops is not None and hbm is not None:
        intensity = flops / hbm if hbm else (float("inf") if flops else 0.0)
    return {"time_ns": time_ns, "share": time_ns / total_ns if total_ns else 0.0, "calls": calls, "flops": flops,
            "bytes": hbm, "intensity": intensity,
            "flops_per_s": flops / (time_ns * 1e-9) if flops is not None and time_ns else None,
            "bound": roof.bound(flops, hbm, dtype)}


def _sum(values: Iterable[Any]) -> float | None:
    """The sum, or None when any value is unknown."""
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _dtype(args: dict[str, Any]) -> str | None:
    floats = [d for d in args.get("dtypes", []) if "float" in d]
    return args.get("dtype") or (floats[0] if floats else None)


def _grouped(roof: Roofline, slices: list[Slice], key: Any, keys: list[str], total_ns: float,
             missing: float | None = None) -> list[dict[str, Any]]:
    """Rows of ``slices`` grouped by ``key(slice)`` (named ``keys``); a slice without
    ``flops`` or ``hbm_bytes`` counts ``missing`` (None: the group's sum is unknown)."""
    groups: dict[tuple, list[Slice]] = {}
    for s in slices:
        groups.setdefault(key(s), []).append(s)
    rows = []
    for k, ss in groups.items():
        time_ns = sum(s.own_ns for s in ss)
        flops = _sum(s.args.get("flops", missing) for s in ss)
        hbm = _sum(s.args.get("hbm_bytes", missing) for s in ss)
        rows.append({**dict(zip(keys, k)), "dtype": _dtype(ss[0].args),
                     **_row(roof, total_ns, time_ns, len(ss), flops, hbm, _dtype(ss[0].args))})
    rows.sort(key=lambda r: -r["time_ns"])
    return rows


def _table(trace: Any, what: str, keys: list[str], build: Any) -> Table:
    rows: list[tuple[int | None, dict[str, Any]]] = []
    pairs = ranks_of(trace, what)
    roof = roofline(pairs[0][1])
    for rank, t in pairs:
        rows += [(rank, r) for r in build(roof, t)]
    columns, out = with_rank(rows, [*keys, "dtype", *ROOF_COLUMNS])
    return Table(columns, out)


def ops(trace: Any) -> Table:
    """The PyTorch ops of a ``trnsim.profile`` trace, grouped by name, largest time first:
    columns ``op``, ``timed_by`` (``kernel``, ``estimate``, ``none``), ``dtype`` and
    the roofline columns (``share`` is of all ops' time). Takes a Trace, a saved
    trace's path, or a JobTrace (adding a ``rank`` column); a trace without ops (a
    Program's) gives an empty table."""
    def build(roof: Roofline, t: Trace) -> list[dict[str, Any]]:
        slices = [s for s in t.slices if s.track == "ops"]
        total = sum(s.own_ns for s in slices)
        return _grouped(roof, slices, lambda s: (s.name, s.args.get("timed_by", "")), ["op", "timed_by"], total)

    return _table(trace, "ops", ["op", "timed_by"], build)


def kernels(trace: Any) -> Table:
    """Kernels, grouped by name, largest time first: columns ``kind``, ``kernel``,
    ``dtype`` and the roofline columns. A Program's trace (an NKI kernel) is one row of
    kind ``program``; a profile gives a row per kernel its ops ran (kind ``kernel``, or
    ``fused`` for a compiled graph's fused kernel) and one per compiled graph (kind
    ``graph``). ``share`` is of the run's time."""
    def build(roof: Roofline, t: Trace) -> list[dict[str, Any]]:
        ops = [s for s in t.slices if s.track == "ops"]
        if not ops:
            insts = engine_slices(t)
            row = {"kind": "program", "kernel": str(t.meta.get("program", t.process)),
                   "dtype": next((s.args["dtype"] for s in insts if "dtype" in s.args), None)}
            hbm = sum(s.args.get("hbm_bytes", 0) for s in insts)
            return [{**row, **_row(roof, t.total_ns, t.total_ns, 1, float(t.meta.get("flops", 0)), hbm,
                                   row["dtype"])}]
        with_kernel = [s for s in ops if s.args.get("kernel")]
        rows = _grouped(roof, with_kernel, lambda s: ("fused" if "graph" in s.args else "kernel",
                                                         s.args["kernel"]), ["kind", "kernel"], t.total_ns)
        runs: dict[str, list[tuple[Slice, list[Slice]]]] = {}   # each compiled graph's runs and their kernels
        for g in (s for s in t.slices if s.track == "graphs"):
            inside = [s for s in ops if s.args.get("graph") == g.name and g.start_ns <= s.start_ns < g.end_ns]
            runs.setdefault(g.name, []).append((g, inside))
        for name, each in runs.items():
            inside = [s for _, ks in each for s in ks]
            dtype = next((_dtype(s.args) for s in inside), None)
            flops, hbm = _sum(s.args.get("flops") for s in inside), _sum(s.args.get("hbm_bytes") for s in inside)
            rows.append({"kind": "graph", "kernel": name, "dtype": dtype,
                         **_row(roof, t.total_ns, sum(g.dur_ns for g, _ in each), len(each), flops, hbm, dtype)})
        return sorted(rows, key=lambda r: -r["time_ns"])

    return _table(trace, "kernels", ["kind", "kernel"], build)


def instructions(trace: Any, *, each: bool = False) -> Table:
    """Instructions grouped by track and opcode (``each=True``: one row per
    instruction, with its ``index`` and ``start_ns``), largest time first: columns
    ``track``, ``opcode``, ``dtype`` and the roofline columns. A matmul's FLOPs are its
    multiply's; a DMA's bytes are its HBM bytes; ``share`` is of the run's time."""
    def build(roof: Roofline, t: Trace) -> list[dict[str, Any]]:
        slices = [s for s in engine_slices(t) if "opcode" in s.args]
        if each:
            rows = _grouped(roof, slices, lambda s: (s.args["index"], s.start_ns, s.track, s.name),
                            ["index", "start_ns", "track", "opcode"], t.total_ns, 0.0)
            return sorted(rows, key=lambda r: (r["start_ns"], r["index"]))
        rows = _grouped(roof, slices, lambda s: (s.track, s.name), ["track", "opcode"], t.total_ns, 0.0)
        return sorted(rows, key=lambda r: (-r["time_ns"], track_sort_key(r["track"])))

    keys = ["index", "start_ns", "track", "opcode"] if each else ["track", "opcode"]
    return _table(trace, "instructions", keys, build)
