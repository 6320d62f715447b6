"""Matplotlib views of a trace, each returning a ``matplotlib.figure.Figure``.

- :func:`plot_timeline`: one row per engine and DMA queue (and the ops, compiled graphs
  and collectives of a profile; each rank's rows for a job), as a Neuron profile shows it;
- :func:`plot_utilisation`: each engine's busy share over time; :func:`plot_busy`: over
  the whole run;
- :func:`plot_roofline`, :func:`plot_memory`, :func:`plot_comparison`
  (:mod:`trnsim.trace.charts`).

Every function takes a Trace, a simulated run, the path of a saved trace or (except the
comparison) a JobTrace, and saves the figure to ``path`` when given, in the format its
suffix names (PNG, SVG, PDF), whole or not at all.
"""

from __future__ import annotations

import os
from typing import Any

from trnsim.errors import TrnSimError
from trnsim.trace.charts import plot_comparison, plot_memory, plot_roofline
from trnsim.trace.events import Trace, track_label, track_sort_key
from trnsim.trace.figure import (KIND_COLOURS, colour_of, finish, fmt_ns, image_format, new_figure, plot_title,
                                  save_figure, time_unit, total_of, traces_of)
from trnsim.trace.matching import close_names, is_named
from trnsim.trace.usage import utilisation

__all__ = ["image_format", "plot_busy", "plot_comparison", "plot_memory", "plot_roofline", "plot_timeline",
           "plot_utilisation", "save_figure"]

# marks of host time, not device work: no row of their own
_MARKS = ("host", "compile")
_OVERVIEW = {"ops": ("PyTorch op", ("#4c72b0", "#8da0cb")), "graphs": ("compiled graph", ("#55a868", "#8fcb9b")),
             "collectives": ("collective", ("#c44e52", "#e08c8f"))}
_ROW_IN = 0.24          # inches per row
_MAX_NAMES = 80         # op names written on a timeline at most


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _window(total: float, start_ns: Any, end_ns: Any) -> tuple[float, float]:
    """The window ``start_ns``..``end_ns`` (None: the trace's start, its end), checked:
    finite numbers, start not negative, before the end and before the trace ends."""
    if start_ns is None and end_ns is None:
        return 0.0, max(total, 1.0)      # an empty trace gets a 1 ns axis, not a singular one
    start = 0.0 if start_ns is None else start_ns
    end = max(total, 1.0) if end_ns is None else end_ns
    if _number(start) and start >= max(total, 1.0):
        raise TrnSimError(f"plot_timeline window start_ns={start_ns!r} starts after the trace ends at {total:g} ns; "
                          f"give a start_ns below {total:g}")
    if not (_number(start) and _number(end)) or not 0 <= start < end < float("inf"):
        raise TrnSimError(f"plot_timeline window start_ns={start_ns!r} end_ns={end_ns!r}: give finite numbers "
                          f"with 0 <= start_ns < end_ns (the trace ends at {total:g} ns)")
    return float(start), float(end)


def _op_window(pairs: list[tuple[int | None, Trace]], op: Any) -> tuple[float, float, str]:
    """The window of the first run of ``op`` (a name, with or without ``aten::``, or an
    index into the ops in time order) in the first rank that ran it. A name no op has
    exactly finds the first op of its family, as ``trnsim diff`` matches ops
    (:mod:`trnsim.trace.matching`): its overloads and twins (``aten::sum``:
    ``sum.dim_IntList``; ``aten::convolution``: ``convolution_overrideable``) and the
    compiled kernels that ran or computed it (``fused[addmm+gelu]`` for ``gelu``)."""
    ops = [sorted((s for s in t.slices if s.track == "ops"), key=lambda s: s.start_ns) for _, t in pairs]
    if not any(ops):
        raise TrnSimError(f"op={op!r}: this trace has no PyTorch ops (it is not a trnsim.profile trace); zoom with "
                          "start_ns and end_ns instead")
    if _number(op) and isinstance(op, int):
        first = next(o for o in ops if o)
        if not 0 <= op < len(first):
            raise TrnSimError(f"op={op!r} is not an op index of this trace; give 0 to {len(first) - 1} "
                              f"(ops in time order), or an op's name")
        s = first[op]
        return s.start_ns, s.end_ns, f"op {op}: {s.name}"
    if not isinstance(op, str):
        raise TrnSimError(f"op={op!r:.60} must be an op's name (such as 'aten::mm') or its index in time order")
    name = op.removeprefix("aten::")
    # the exact name first; then what ran or computed its family (trnsim.trace.matching)
    for same in (lambda s: s.name == name, lambda s: is_named(s, name)):
        for each in ops:
            for s in each:
                if same(s):
                    return s.start_ns, s.end_ns, f"op {s.name}"
    every = [s for each in ops for s in each]
    close = close_names(every, name)
    names = close or sorted({s.name for s in every})[:12]
    what = "the closest names" if close else "one of"
    raise TrnSimError(f"op={op!r}: no op of that name or family ran in this trace; {what}: {', '.join(names)}"
                      f"{', ...' if not close and len({s.name for s in every}) > 12 else ''} (with or without "
                      "'aten::'), or an op index")


def _rows(pairs: list[tuple[int | None, Trace]]) -> list[tuple[int | None, str]]:
    rows = []
    for rank, t in pairs:
        tracks = sorted({s.track for s in t.slices if s.track not in _MARKS}, key=_row_order)
        rows += [(rank, track) for track in tracks]
    return rows


def _row_order(track: str) -> tuple:
    # a Neuron profile shows the ops above the graphs that fused them, collectives next
    first = {"ops": 0, "graphs": 1, "collectives": 2}
    return (0, first[track]) if track in first else (1, track_sort_key(track))


def plot_timeline(trace: Any, path: str | os.PathLike | None = None, *, start_ns: float | None = None,
                  end_ns: float | None = None, op: str | int | None = None, ranks: list[int] | None = None,
                  width: float = 12.0) -> Any:
    """The trace as a Neuron profile draws it: one row per engine and DMA queue, each
    instruction a bar coloured by its kind (legend below). A ``trnsim.profile`` trace adds
    rows for its PyTorch ops (named where wide enough), compiled graphs and collectives;
    a JobTrace draws each rank's rows, labelled ``rank N`` on the right, with its
    collectives shaded across them (``ranks`` picks some). ``start_ns``/``end_ns`` zoom
    to a window; ``op`` (``"aten::mm"``, or an index in time order) zooms to its first run;
    a zoomed view keeps the rows with work in it.
    The x axis is in ns, us or ms by the window's span. Returns the Figure."""
    pairs = traces_of(trace, "plot_timeline")
    if not (_number(width) and 4 <= width <= 100):
        raise TrnSimError(f"plot_timeline width={width!r}: give the figure's width in inches, 4 to 100")
    if ranks is not None:
        pairs = _pick(pairs, ranks)
    total = total_of(pairs)
    zoom = ""
    if op is not None:
        if start_ns is not None or end_ns is not None:
            raise TrnSimError(f"plot_timeline got op={op!r} and a window (start_ns={start_ns!r}, "
                              f"end_ns={end_ns!r}); give one or the other")
        lo, hi, zoom = _op_window(pairs, op)
        hi = max(hi, lo + 1.0)
    else:
        lo, hi = _window(total, start_ns, end_ns)
        if start_ns is not None or end_ns is not None:
            zoom = "window"
    rows = _rows(pairs)
    if zoom:   # a zoomed view keeps the rows with work in its window
        used = {(rank, s.track) for rank, t in pairs for s in t.slices if s.end_ns > lo and s.start_ns < hi}
        rows = [row for row in rows if row in used] or rows
    scale, unit = time_unit(hi - lo)
    fig, (ax,) = new_figure(width, max(2.6, _ROW_IN * len(rows) + 1.9))
    y, entries = _draw_rows(ax, pairs, rows, lo, hi, scale, width)
    ax.set_yticks(list(y.values()), [track_label(track) for _, track in rows])
    ax.set_ylim(max(y.values(), default=0) + 0.6, -0.6)
    ax.set_xlim(lo / scale, hi / scale)
    ax.set_xlabel(f"simulated time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    if pairs[0][0] is not None:
        _rank_labels(ax, rows, y)
    title = plot_title(pairs, "Timeline")
    if zoom:
        digits = 0 if unit == "ns" else 2
        title += f"; {zoom} {lo / scale:,.{digits}f}-{hi / scale:,.{digits}f} {unit}"
    ax.set_title(title)
    _legend(fig, entries)
    return finish(fig, path)


def _pick(pairs: list[tuple[int | None, Trace]], ranks: Any) -> list[tuple[int | None, Trace]]:
    have = [r for r, _ in pairs]
    if have[0] is None:
        raise TrnSimError(f"ranks={ranks!r} picks ranks of a job trace; this is one rank's trace: leave ranks out")
    if not isinstance(ranks, (list, tuple)) or not ranks or not all(r in have for r in ranks):
        raise TrnSimError(f"ranks={ranks!r}: give a list of this job's ranks, some of {have}")
    return [p for p in pairs if p[0] in ranks]


def _draw_rows(ax: Any, pairs: list[tuple[int | None, Trace]], rows: list[tuple[int | None, str]],
               lo: float, hi: float, scale: float, width: float) -> tuple[dict, dict[str, str]]:
    """Bars of every row, one PolyCollection per row and colour; the y of each row and
    the legend's entries (label: colour)."""
    y: dict[tuple[int | None, str], float] = {}
    at = 0.0
    for k, row in enumerate(rows):
        if k and row[0] != rows[k - 1][0]:
            at += 0.6   # a gap between ranks
        y[row] = at
        at += 1.0
    bars: dict[tuple[float, float, str, float], list[tuple[float, float]]] = {}   # (y, height, colour, alpha)
    names: list[tuple[float, float, float, str]] = []
    legend: dict[str, str] = {}
    spares: dict[str, str] = {}
    for rank, t in pairs:
        tracks = [track for r, track in rows if r == rank]
        shade = dict.fromkeys(_OVERVIEW, 0)
        for s in sorted(t.slices, key=lambda s: s.start_ns):
            if s.track in _MARKS or s.end_ns <= lo or s.start_ns >= hi:
                continue
            row = y[(rank, s.track)]
            span = (s.start_ns / scale, s.dur_ns / scale)
            if s.track in _OVERVIEW:
                label, colours = _OVERVIEW[s.track]
                colour = colours[shade[s.track] % 2]
                shade[s.track] += 1
                names.append((s.start_ns, s.end_ns, row, s.name))
                if s.track == "collectives" and rank is not None:   # shaded across the rank's rows
                    top = y[(rank, tracks[0])]
                    bars.setdefault((top - 0.5, y[(rank, tracks[-1])] - top + 1.0, colours[0], 0.12), []).append(span)
                legend.setdefault(label, colours[0])
            else:
                label, colour = s.name, colour_of(s.name, spares)
                legend.setdefault(label, colour)
            bars.setdefault((row - 0.4, 0.8, colour, 1.0), []).append(span)
    for (bottom, height, colour, alpha), spans in bars.items():
        ax.broken_barh(spans, (bottom, height), color=colour, alpha=alpha, linewidth=0, zorder=1 if alpha < 1 else 2)
    _write_names(ax, names, lo, hi, scale, width)
    return y, legend


def _write_names(ax: Any, names: list[tuple[float, float, float, str]], lo: float, hi: float, scale: float,
                 width: float) -> None:
    """Each op's (graph's, collective's) name on its bar, where the bar is wide enough."""
    chars_across = width * 0.85 * 72 / (7 * 0.6)   # characters of 7 pt that fit across the axes
    written = 0
    for start, end, row, name in sorted(names, key=lambda n: (-(n[1] - n[0]), n[0], n[2])):
        a, b = max(start, lo), min(end, hi)
        fit = int((b - a) / (hi - lo) * chars_across) - 1
        if fit < 3 or written >= _MAX_NAMES:
            continue
        text = name if len(name) <= fit else name[:fit - 1] + "…"
        ax.text((a + b) / 2 / scale, row, text, ha="center", va="center", fontsize=7, color="white",
                clip_on=True, zorder=3)
        written += 1


def _legend(fig: Any, entries: dict[str, str]) -> None:
    """The legend below the axes: the overview rows' entries, then instruction kinds in
    a fixed order (those no fixed colour names after, by name)."""
    from matplotlib.patches import Patch

    fixed = [label for label, _ in _OVERVIEW.values()] + list(KIND_COLOURS)
    labels = sorted(entries, key=lambda label: (fixed.index(label) if label in fixed else len(fixed), label))
    if labels:
        fig.legend([Patch(color=entries[label]) for label in labels], labels, loc="outside lower center",
                   ncol=min(7, len(labels)), frameon=False)


def _rank_labels(ax: Any, rows: list[tuple[int | None, str]], y: dict) -> None:
    """``rank N`` on the right of each rank's group of rows, with a line between groups."""
    right = ax.twinx()
    ranks = list(dict.fromkeys(r for r, _ in rows))
    centres = []
    for rank in ranks:
        tracks = [track for r, track in rows if r == rank]
        top, bottom = y[(rank, tracks[0])], y[(rank, tracks[-1])]
        centres.append((top + bottom) / 2)
        if rank != ranks[0]:
            ax.axhline(top - 0.8, color="black", linewidth=0.8)
    right.set_ylim(ax.get_ylim())
    right.set_yticks(centres, [f"rank {r}" for r in ranks], fontweight="bold")
    right.tick_params(axis="y", length=0)


def plot_utilisation(trace: Any, path: str | os.PathLike | None = None, *, bucket_ns: float | None = None,
                     width: float = 11.0) -> Any:
    """Each engine's busy share over time, in buckets ``bucket_ns`` wide (default: the
    run in 50), as steps from 0 to 100 %; the DMA queues as one line, their mean. A
    JobTrace gets an axes per rank. From :func:`trnsim.trace.utilisation`. Returns the Figure."""
    pairs = traces_of(trace, "plot_utilisation")
    total = total_of(pairs)
    if bucket_ns is None and total > 0:
        bucket_ns = total / 50
    table = utilisation(trace if pairs[0][0] is not None else pairs[0][1], bucket_ns)
    tracks = [c for c in table.columns if c not in ("rank", "start_ns", "end_ns")]
    engines = [c for c in tracks if not c.startswith("dma.q")]
    queues = [c for c in tracks if c.startswith("dma.q")]
    scale, unit = time_unit(total)
    fig, axes = new_figure(width, 1.1 + 2.3 * len(pairs), len(pairs))
    for ax, (rank, _) in zip(axes, pairs):
        rows = [r for r in table if r.get("rank") == rank]
        edges = [r["start_ns"] / scale for r in rows] + [rows[-1]["end_ns"] / scale] if rows else [0.0, 1.0]
        lines = {track_label(c): [100 * r[c] for r in rows] for c in engines}
        if queues:
            lines[f"DMA queues (mean of {len(queues)})"] = [100 * sum(r[q] for q in queues) / len(queues)
                                                           for r in rows]
        for k, (label, values) in enumerate(lines.items()):
            if values:
                ax.stairs(values, edges, label=label, linewidth=1.4, color=f"C{k}",
                          linestyle="--" if label.startswith("DMA") else "-")
        ax.set_ylim(0, 105)
        ax.set_xlim(edges[0], max(edges[-1], edges[0] + 1.0))   # an empty trace: a 1 ns axis
        ax.set_ylabel("busy (%)")
        ax.grid(alpha=0.3)
        if rank is not None:
            ax.set_title(f"rank {rank}", loc="left")
        if lines:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    axes[-1].set_xlabel(f"simulated time ({unit})")
    width_ns = table[0]["end_ns"] - table[0]["start_ns"] if len(table) else total
    fig.suptitle(plot_title(pairs, "Engine utilisation") + f"; buckets of {fmt_ns(width_ns)}")
    return finish(fig, path)


def plot_busy(trace: Any, path: str | os.PathLike | None = None) -> Any:
    """A bar per engine and DMA queue (per rank, for a JobTrace): the share of the run
    it was busy. Returns the Figure."""
    pairs = traces_of(trace, "plot_busy")
    total = total_of(pairs)
    table = utilisation(trace if pairs[0][0] is not None else pairs[0][1], total or None)
    tracks = [c for c in table.columns if c not in ("rank", "start_ns", "end_ns")]
    labels, values = [], []
    for rank, _ in pairs:
        row = next(r for r in table if r.get("rank") == rank)
        for track in tracks:
            labels.append(track_label(track) if rank is None else f"rank {rank}: {track_label(track)}")
            values.append(100 * row[track] if total else 0.0)
    fig, (ax,) = new_figure(8.0, 0.9 + 0.22 * max(len(labels), 3))
    ax.barh(range(len(labels)), values, color="#1f77b4")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(max(len(labels), 1) - 0.5, -0.5)
    ax.set_xlim(0, 100)
    ax.set_xlabel("busy (% of simulated time)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(plot_title(pairs, "Busy"))
    return finish(fig, path)
