"""Charts of a trace that are not timelines: the roofline with each op on it, HBM and
on-chip memory over time, and two traces side by side (exported by :mod:`trnsim.trace.plot`)."""

from __future__ import annotations

import os
from typing import Any

from trnsim.errors import TrnSimError
from trnsim.trace.critical import engine_slices
from trnsim.trace.events import Counter, Trace, _step_counter, track_label
from trnsim.trace.export import as_trace
from trnsim.trace.figure import finish, fmt_ns, new_figure, plot_title, time_unit, total_of, traces_of
from trnsim.trace.matching import match
from trnsim.trace.table import Table
from trnsim.trace.roofline_tables import instructions, kernels, ops, roofline

_BY = ("ops", "kernels", "instructions")
_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "float16": "bf16", "fp16": "bf16", "fp32": "fp32", "float32": "fp32",
           "fp8": "fp8", "float8_e4m3": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}
_BOUND_COLOURS = {"compute": "#1f77b4", "memory": "#ff7f0e"}
_LABELLED = 6    # points named on a roofline


def _point_name(row: dict[str, Any], by: str) -> str:
    if by == "ops":
        name = row["op"]
    elif by == "kernels":
        name = row["kernel"] if row["kind"] in ("kernel", "program") else f"{row['kind']} {row['kernel']}"
    else:
        name = f"{track_label(row['track'])} {row['opcode']}"
    return name if row.get("rank") is None else f"rank {row['rank']}: {name}"


def plot_roofline(trace: Any, path: str | os.PathLike | None = None, *, by: str = "ops",
                  dtype: str | None = None) -> Any:
    """The chip's roofline, log-log: the HBM bandwidth slope and a TensorE ceiling per
    dtype class (``dtype`` in bold, with its ridge point marked; default: the dtype of
    most of the time), and each op (``by="kernels"``: kernel and compiled graph;
    ``"instructions"``: track and opcode) at its arithmetic intensity and achieved
    FLOP/s, sized by its share of the time and coloured by what bounds it; the largest
    are named. Rows with no matmul FLOPs cannot sit on a log axis: the title counts them.
    A Program's trace (no ops) shows its kernel. Returns the Figure."""
    if by not in _BY:
        raise TrnSimError(f"plot_roofline by={by!r}: give one of {', '.join(repr(b) for b in _BY)}")
    if dtype is not None and str(dtype).removeprefix("torch.") not in _DTYPES:
        raise TrnSimError(f"plot_roofline dtype={dtype!r}: give one of {', '.join(sorted(_DTYPES))}")
    pairs = traces_of(trace, "plot_roofline")
    source = trace if pairs[0][0] is not None else pairs[0][1]
    roof = roofline(source)
    table: Table = {"ops": ops, "kernels": kernels, "instructions": instructions}[by](source)
    if by == "ops" and not len(table):
        by, table = "kernels", kernels(source)
    rows = [r for r in table if r["flops"] and r["flops_per_s"] and r["intensity"] is not None]
    left_out = [r for r in table if r not in rows]
    if dtype is None:
        time_by: dict[str, float] = {}
        for r in rows:
            cls = roof.dtype_class(r["dtype"])
            time_by[cls] = time_by.get(cls, 0.0) + r["time_ns"]
        chosen = max(time_by, key=lambda c: time_by[c]) if time_by else "bf16"
    else:
        chosen = _DTYPES[str(dtype).removeprefix("torch.")]
    fig, (ax,) = new_figure(10.0, 5.2)
    finite = [r["intensity"] for r in rows if r["intensity"] != float("inf")]
    ridge = roof.peak_flops[chosen] / roof.hbm_bytes_per_s
    x_lo = min([ridge / 100, *(v / 4 for v in finite)])
    x_hi = max([ridge * 20, *(v * 4 for v in finite)])
    bw = roof.hbm_bytes_per_s
    ax.plot([x_lo, x_hi], [bw * x_lo / 1e12, bw * x_hi / 1e12], color="black", linewidth=1.2,
            label=f"HBM {bw / 1e9:,.0f} GB/s")
    for cls, peak in sorted(roof.peak_flops.items(), key=lambda kv: -kv[1]):
        bold = cls == chosen
        ax.hlines(peak / 1e12, peak / bw, x_hi, color="black" if bold else "grey", linewidth=1.8 if bold else 0.9,
                  linestyle="-" if bold else ":", label=f"TensorE {cls} {peak / 1e12:,.1f} TFLOP/s")
    ax.axvline(ridge, color="black", linestyle="--", linewidth=0.8)
    ax.text(ridge * 1.1, 0.03, f"ridge {ridge:,.0f} FLOP/B ({chosen})", transform=ax.get_xaxis_transform(),
            rotation=90, va="bottom", fontsize=8)
    edge = x_hi / 1.6   # where a row with FLOPs and no HBM bytes (intensity infinite) sits

    def at(r: dict[str, Any]) -> tuple[float, float]:
        return (edge if r["intensity"] == float("inf") else r["intensity"]), r["flops_per_s"] / 1e12

    for bound, colour in _BOUND_COLOURS.items():
        for marker, mine, label in (("o", [r for r in rows if r["bound"] == bound and r["intensity"] != float("inf")],
                                     f"{bound} bound"),
                                    (">", [r for r in rows if r["bound"] == bound and r["intensity"] == float("inf")],
                                     f"{bound} bound, no HBM bytes (at the edge)")):
            if mine:
                ax.scatter(*zip(*(at(r) for r in mine)), s=[30 + 900 * r["share"] for r in mine], marker=marker,
                           color=colour, alpha=0.75, edgecolors="black", linewidths=0.5, label=label, zorder=3)
    for r in sorted(rows, key=lambda r: -r["time_ns"])[:_LABELLED]:
        x, y = at(r)
        away = (30 + 900 * r["share"]) ** 0.5 / 1.7 + 2   # the marker's radius in points, and a gap
        near_edge = x > x_hi / 8
        ax.annotate(f"{_point_name(r, by)} ({100 * r['share']:.0f}%)", (x, y), xytext=(-away if near_edge else away, 0),
                    textcoords="offset points", ha="right" if near_edge else "left", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    y_lo = min([bw * x_lo / 1e12, *(r["flops_per_s"] / 4e12 for r in rows)])
    ax.set_ylim(y_lo, max(roof.peak_flops.values()) / 1e12 * 3)
    ax.set_xlabel("arithmetic intensity (FLOPs per HBM byte)")
    ax.set_ylabel("achieved (TFLOP/s)")
    ax.grid(which="major", alpha=0.3)
    legend = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    for handle in legend.legend_handles:
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([40])
    title = plot_title(pairs, f"Roofline of {roof.chip}, {by}")
    if left_out:
        # instructions overlap in time, so their shares do not add up to a share of the run
        of = "" if by == "instructions" else f" ({100 * sum(r['share'] for r in left_out):.0f}% of the time)"
        title += f"\n{len(left_out)} {by} with no matmul FLOPs not shown{of}"
    ax.set_title(title)
    return finish(fig, path)


def _hbm(t: Trace) -> Counter | None:
    """The trace's HBM traffic counter; or one from its slices' HBM bytes (each DMA's,
    else each op's, spread over it) for a trace saved without it; None without either."""
    for c in t.counters:
        if c.name == "HBM traffic" and c.points:
            return c
    spans = [(s.start_ns, s.end_ns, s.args["hbm_bytes"]) for s in engine_slices(t) if s.args.get("hbm_bytes")]
    if not spans:
        spans = [(s.start_ns, s.end_ns, s.args["hbm_bytes"]) for s in t.slices
                 if s.track == "ops" and s.args.get("hbm_bytes")]
    return _step_counter("HBM traffic", "bytes/s", spans, per_second=True) if spans else None


def _steps(ax: Any, c: Counter, scale: float, total: float, per: float, **style: Any) -> None:
    """``c`` drawn as steps to ``total``, its values divided by ``per`` (of two values at
    one time, the later holds)."""
    held: dict[float, float] = {}
    for at, v in sorted(c.points, key=lambda p: p[0]):
        held[at] = v
    xs = [at / scale for at in held] + [max(total, *held) / scale]
    ax.stairs([v / per for v in held.values()], xs, **style)


def plot_memory(trace: Any, path: str | os.PathLike | None = None, *, width: float = 11.0) -> Any:
    """Memory over time, two axes sharing the time axis: HBM traffic (GB/s) against the
    core's HBM bandwidth, and SBUF and PSUM occupancy as a share of their capacity
    (the legend gives each peak in KiB or MiB). From the trace's counters; a trace
    without an HBM counter gets one from its DMAs' (or ops') HBM bytes. A JobTrace draws
    a line per rank. Returns the Figure."""
    from trnsim.hw.spec import load_chip

    pairs = traces_of(trace, "plot_memory")
    total = total_of(pairs)
    scale, unit = time_unit(total)
    fig, (hbm_ax, chip_ax) = new_figure(width, 5.0, 2, ratios=[1.0, 1.0])
    meta = pairs[0][1].meta
    source = meta.get("chip_source")
    chip = load_chip(source if source and os.path.exists(source) else meta["chip"]) if meta.get("chip") else None
    cores = chip.logical_core_size if chip is not None and meta.get("eager") else 1
    capacity = {} if chip is None else {
        "SBUF": chip.sbuf.partitions * chip.sbuf.partition_bytes * cores,
        "PSUM": chip.psum.partitions * chip.psum.partition_bytes * cores}
    bw = meta.get("hbm_bw_gbps")
    if bw:
        hbm_ax.axhline(bw, color="black", linestyle="--", linewidth=0.9, label=f"HBM bandwidth {bw:,.0f} GB/s")
    drawn = 0
    for k, (rank, t) in enumerate(pairs):
        who = "" if rank is None else f"rank {rank}: "
        c = _hbm(t)
        if c is not None:
            _steps(hbm_ax, c, scale, total, 1e9, color=f"C{k}", linewidth=1.2, fill=len(pairs) == 1, alpha=0.8,
                   label=f"{who}HBM traffic")
        for j, memory in enumerate(("SBUF", "PSUM")):
            counter = next((x for x in t.counters if x.name == f"{memory} occupancy" and x.points), None)
            if counter is None or memory not in capacity:
                continue
            peak = max(v for _, v in counter.points)
            _steps(chip_ax, counter, scale, total, capacity[memory] / 100, color=f"C{2 * k + j}", linewidth=1.3,
                   linestyle="-" if j == 0 else "--",
                   label=f"{who}{memory}: peak {_bytes(peak)} of {_bytes(capacity[memory])}")
            drawn += 1
    if not drawn:
        chip_ax.text(0.5, 0.5, "no SBUF or PSUM occupancy counters in this trace", ha="center", va="center",
                     transform=chip_ax.transAxes, color="grey")
    hbm_ax.set_ylabel("HBM traffic (GB/s)")
    hbm_ax.set_ylim(0, max(hbm_ax.get_ylim()[1], (bw or 0) * 1.1))
    chip_ax.set_ylabel("occupancy (% of capacity)")
    chip_ax.set_ylim(0, 105 if drawn else 1)
    chip_ax.set_xlabel(f"simulated time ({unit})")
    chip_ax.set_xlim(0, max(total, 1.0) / scale)
    for ax in (hbm_ax, chip_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(plot_title(pairs, "Memory"))
    return finish(fig, path)


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


def _graph_times(t: Trace) -> dict[str, float]:
    """Each compiled graph's whole time (``graph: NAME`` rows)."""
    return {f"graph: {r['kernel']}": r["time_ns"] for r in kernels(t).where(kind="graph")}


def _engine_times(t: Trace) -> dict[str, float]:
    """A trace's busy time per engine and opcode (a Program's instructions)."""
    return {f"{track_label(r['track'])}: {r['opcode']}": r["time_ns"] for r in instructions(t)}


def _compared(ta: Trace, tb: Trace) -> tuple[dict[str, float], dict[str, float], float, float, str]:
    """Time per row of a comparison in each trace, the totals they are of, and what the
    rows are: two profiles' ops matched by what they compute
    (:func:`trnsim.trace.matching.match`) and their compiled graphs; else each trace's
    instructions by engine and opcode."""
    ops_a = [s for s in ta.slices if s.track == "ops"]
    ops_b = [s for s in tb.slices if s.track == "ops"]
    if ops_a and ops_b:
        times_a, times_b = _graph_times(ta), _graph_times(tb)
        for m in match(ops_a, ops_b):
            for times, slices in zip((times_a, times_b), m.slices):
                if slices:
                    times[m.name] = sum(s.own_ns for s in slices)
        return times_a, times_b, sum(s.own_ns for s in ops_a), sum(s.own_ns for s in ops_b), "ops"
    a, b = (_without_ops(t) if ops else t for t, ops in ((ta, ops_a), (tb, ops_b)))
    return _engine_times(a), _engine_times(b), a.total_ns, b.total_ns, "instructions"


def plot_comparison(a: Any, b: Any, path: str | os.PathLike | None = None, *,
                    labels: tuple[str, str] = ("a", "b"), top: int = 12) -> Any:
    """Two traces op by op: grouped horizontal bars of each row's time in ``a`` and ``b``
    (the ``top`` rows by their larger time; a row only one ran has one bar), with each
    trace's total in the title. Profiles are matched by what their ops compute, as
    ``trnsim diff`` matches them (:func:`trnsim.trace.matching.match`: eager's ``mm`` and
    a compiled ``fused[mm]`` are the row ``mm``; eager's ``addmm`` and ``gelu`` and a
    ``fused[addmm+gelu]`` the row ``addmm + gelu``), and each compiled graph adds a
    ``graph:`` row of its whole time; two Programs' traces (or a Program and a profile)
    compare busy time per engine and opcode. Returns the Figure."""
    from trnsim.trace.job import JobTrace

    for name, value in (("a", a), ("b", b)):
        if isinstance(value, JobTrace):
            raise TrnSimError(f"plot_comparison {name} is a JobTrace; compare one rank's traces: "
                              f"{name}.ranks[0]")
    if not (isinstance(top, int) and not isinstance(top, bool) and top > 0):
        raise TrnSimError(f"plot_comparison top={top!r}: give a positive number of rows")
    if not (isinstance(labels, (tuple, list)) and len(labels) == 2):
        raise TrnSimError(f"plot_comparison labels={labels!r}: give two names, one per trace")
    ta, tb = as_trace(a, "plot_comparison"), as_trace(b, "plot_comparison")
    times_a, times_b, total_a, total_b, what_a = _compared(ta, tb)
    names = sorted(set(times_a) | set(times_b), key=lambda n: (-max(times_a.get(n, 0), times_b.get(n, 0)), n))
    names = names[:top]
    scale, unit = time_unit(max([*times_a.values(), *times_b.values(), 1.0]))
    fig, (ax,) = new_figure(10.0, 1.5 + 0.42 * max(len(names), 2))
    ys = range(len(names))
    for offset, times, label, colour in ((-0.2, times_a, labels[0], "#1f77b4"), (0.2, times_b, labels[1], "#ff7f0e")):
        ax.barh([y + offset for y in ys], [times.get(n, 0.0) / scale for n in names], height=0.38, color=colour,
                label=label)
    ax.set_yticks(list(ys), names)
    ax.set_ylim(max(len(names), 1) - 0.5, -0.5)
    ax.set_xlabel(f"simulated time ({unit}){' per op' if what_a == 'ops' else ', busy per engine and opcode'}")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ratio = f", {labels[1]}/{labels[0]} {total_b / total_a:.2f}x" if total_a else ""
    ax.set_title(f"{labels[0]}: {fmt_ns(total_a)} vs {labels[1]}: {fmt_ns(total_b)}{ratio} "
                 f"({'time in ops' if what_a == 'ops' else 'run time'}); top {len(names)} {what_a}")
    return finish(fig, path)


def _without_ops(t: Trace) -> Trace:
    """``t`` with only its engine and DMA-queue slices: a profile compared with a Program."""
    return Trace(t.process, engine_slices(t), t.counters, t.meta)
