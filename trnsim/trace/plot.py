"""Matplotlib views of a trace: a timeline with one row per track, and engine busy bars."""

from __future__ import annotations

import os
from typing import Any

from trnsim.atomic import as_path, write_atomic
from trnsim.errors import TrnSimError
from trnsim.trace.analysis import summarize
from trnsim.trace.events import Trace, as_trace, track_label

# One colour per instruction kind, so the same opcode looks the same on every row.
_COLOURS = {
    "multiply_moving": "#1f77b4", "load_stationary": "#aec7e8", "transpose": "#17becf",
    "activation": "#ff7f0e", "tensor_tensor": "#2ca02c", "tensor_scalar": "#98df8a", "tensor_reduce": "#bcbd22",
    "tensor_copy": "#9467bd", "memset": "#c5b0d5", "iota": "#8c564b", "select": "#e377c2", "affine_select": "#f7b6d2",
    "dma_copy": "#7f7f7f", "semaphore_signal": "#d62728", "semaphore_wait": "#ff9896",
}


def plot_timeline(trace: Trace, path: str | os.PathLike | None = None, *, start_ns: float = 0.0,
                  end_ns: float | None = None, ax: Any = None) -> Any:
    """Draw the slices of ``trace`` between ``start_ns`` and ``end_ns``, one row per track;
    save to ``path`` if given. Returns the matplotlib Axes."""
    import matplotlib

    if ax is None and path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace = as_trace(trace, "plot_timeline")
    end_ns = _window(trace, start_ns, end_ns)
    tracks = trace.tracks()
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 0.45 * len(tracks) + 1.2))
    rows = {t: i for i, t in enumerate(tracks)}
    by_kind: dict[str, list[tuple[float, float, int]]] = {}
    for s in trace.slices:
        if s.end_ns < start_ns or s.start_ns > end_ns:
            continue
        by_kind.setdefault(s.name, []).append((s.start_ns / 1000, s.dur_ns / 1000, rows[s.track]))
    for kind, spans in sorted(by_kind.items()):
        for row in sorted({r for _, _, r in spans}):
            ax.broken_barh([(x, w) for x, w, r in spans if r == row], (row - 0.4, 0.8),
                           color=_COLOURS.get(kind, "#333333"), label=kind)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)
    ax.set_yticks(range(len(tracks)), [track_label(t) for t in tracks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(start_ns / 1000, end_ns / 1000)
    ax.set_xlabel("simulated time (us)")
    meta = trace.meta
    ax.set_title(f"{meta.get('program', '')} on {meta.get('chip', '')}: {trace.total_ns / 1000:,.2f} us", fontsize=10)
    if path is not None:
        save_figure(ax.figure, path)
    return ax


def _window(trace: Trace, start_ns: Any, end_ns: Any) -> float:
    """The end of the window ``start_ns``..``end_ns`` (the trace's end for None), checked:
    finite numbers, start not negative and before the end."""
    end = trace.total_ns if end_ns is None else end_ns
    if end_ns is None and start_ns == 0:
        return max(end, 1.0)      # the whole trace; an empty one gets a 1 ns axis, not a singular one
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start_ns, end))
    if not numbers or not 0 <= start_ns < end < float("inf"):
        raise TrnSimError(f"plot_timeline window start_ns={start_ns!r} end_ns={end_ns!r}: give finite numbers "
                          f"with 0 <= start_ns < end_ns (the trace ends at {trace.total_ns:g} ns)")
    return end


def plot_busy(trace: Trace, path: str | os.PathLike | None = None, ax: Any = None) -> Any:
    """A bar per track: the share of the run it was busy. Returns the Axes."""
    import matplotlib

    if ax is None and path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    busy = summarize(as_trace(trace, "plot_busy")).busy_pct
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.35 * len(busy) + 1))
    labels = [track_label(t) for t in busy]
    ax.barh(labels, list(busy.values()), color="#1f77b4")
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("busy (% of simulated time)")
    if path is not None:
        save_figure(ax.figure, path)
    return ax


def image_format(path: str | os.PathLike) -> str:
    """The image format the suffix of ``path`` names (PNG when it has none), checked."""
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = os.path.splitext(as_path(path, "image"))[1][1:].lower() or "png"
    known = FigureCanvasBase.get_supported_filetypes()
    if fmt not in known:
        raise TrnSimError(f"cannot draw {path}: {fmt!r} is not an image format matplotlib writes; "
                          f"end the name in one of {', '.join('.' + k for k in sorted(known))}")
    return fmt


def save_figure(figure: Any, path: str | os.PathLike) -> None:
    """Write ``figure`` to ``path`` in the format its suffix names, whole or not at all."""
    fmt = image_format(path)
    figure.tight_layout()
    write_atomic(path, lambda f: figure.savefig(f, format=fmt, dpi=120), binary=True)
