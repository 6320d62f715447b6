"""What a trace says in numbers: time, engine busy shares, HBM traffic, FLOP/s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trnsim.errors import TrnSimError
from trnsim.trace.events import Slice, Trace, track_label, track_sort_key
from trnsim.trace.export import as_trace
from trnsim.trace.partial import summary_line


def busy_ns(slices: list[Slice]) -> float:
    """Time covered by at least one of ``slices`` (overlaps counted once)."""
    if not isinstance(slices, (list, tuple)) or not all(isinstance(s, Slice) for s in slices):
        raise TrnSimError(f"busy_ns takes a list of trnsim.trace.Slice (such as trace.slices), not {slices!r:.60}")
    total = 0.0
    end = float("-inf")
    for s in sorted(slices, key=lambda s: s.start_ns):
        if s.end_ns <= end:
            continue
        total += s.end_ns - max(s.start_ns, end)
        end = s.end_ns
    return total


def hbm_bytes(trace: Trace) -> int:
    """HBM bytes of a trace: its op slices' own counts where it has them (a profile's,
    which count each op once, engine DMAs and all), else its DMA slices' (a kernel's)."""
    ops = [s for s in trace.slices if s.track == "ops" and "hbm_bytes" in s.args]
    return int(sum(s.args.get("hbm_bytes", 0) for s in (ops or trace.slices)))


@dataclass(frozen=True)
class Summary:
    """The headline figures of one simulated run."""

    program: str
    chip: str
    instructions: int
    total_ns: float
    busy_pct: dict[str, float]
    hbm_bytes: int
    hbm_gbps: float
    hbm_peak_gbps: float
    flops: int
    peak_flops: float
    partial: str | None = None
    #: physical cores the run used (a kernel launched over a logical NeuronCore's cores)
    cores: int = 1

    @property
    def achieved_flops(self) -> float:
        """FLOP/s over the whole run."""
        return self.flops / (self.total_ns * 1e-9) if self.total_ns else 0.0

    @property
    def pct_of_peak(self) -> float:
        return 100.0 * self.achieved_flops / self.peak_flops if self.peak_flops else 0.0

    def __str__(self) -> str:
        lines = [summary_line(self.partial)] if self.partial else []
        lines += [f"program        {self.program} on {self.chip} ({self.instructions} instructions)",
                  f"simulated time {self.total_ns / 1000:,.3f} us"]
        for track, pct in self.busy_pct.items():
            lines.append(f"  {track_label(track):<27} {pct:6.1f}% busy")
        whose = "per core" if self.cores == 1 else f"of its {self.cores} cores"
        share = (f" ({100 * self.hbm_gbps / self.hbm_peak_gbps:.1f}% of {self.hbm_peak_gbps:,.0f} GB/s {whose})"
                 if self.hbm_peak_gbps else "")
        lines.append(f"HBM traffic    {self.hbm_bytes / 2**20:,.2f} MiB at {self.hbm_gbps:,.1f} GB/s{share}")
        if self.flops:
            lines.append(f"matmul         {self.flops / 1e9:,.3f} GFLOP at {self.achieved_flops / 1e12:,.2f} TFLOP/s "
                         f"({self.pct_of_peak:.1f}% of {self.peak_flops / 1e12:,.1f} TFLOP/s peak)")
        return "\n".join(lines)


def summarize(run_or_trace: Any) -> Summary:
    """Summary of a :class:`Trace`, of a run (which is traced first) or of a saved trace's path."""
    trace = as_trace(run_or_trace, "summarize")
    total = trace.total_ns
    by_track: dict[str, list[Slice]] = {}
    for s in trace.slices:
        by_track.setdefault(s.track, []).append(s)
    busy = {t: (100.0 * busy_ns(by_track[t]) / total if total else 0.0) for t in sorted(by_track, key=track_sort_key)}
    hbm = hbm_bytes(trace)
    meta = trace.meta
    return Summary(
        program=str(meta.get("program", "?")),
        chip=str(meta.get("chip", "?")),
        instructions=int(meta.get("instructions", len(trace.slices))),
        total_ns=total,
        busy_pct=busy,
        hbm_bytes=hbm,
        hbm_gbps=hbm / total if total else 0.0,
        hbm_peak_gbps=float(meta.get("hbm_bw_gbps", 0.0)),
        flops=int(meta.get("flops", 0)),
        peak_flops=float(meta.get("peak_flops", 0.0)),
        partial=trace.partial,
        cores=int(meta.get("cores", 1)),
    )
