"""What every plot of a trace shares: a new figure, time units, colours, and writing the image."""

from __future__ import annotations

import os
from typing import Any

from trnsim.atomic import as_path, write_atomic
from trnsim.errors import TrnSimError

FONT_PT = 8.5

# One colour per instruction kind, so the same opcode looks the same on every row and plot.
KIND_COLOURS = {
    "multiply_moving": "#1f77b4", "load_stationary": "#aec7e8", "transpose": "#17becf",
    "activation": "#ff7f0e", "tensor_tensor": "#2ca02c", "tensor_scalar": "#98df8a", "tensor_reduce": "#bcbd22",
    "tensor_copy": "#9467bd", "memset": "#c5b0d5", "iota": "#8c564b", "select": "#e377c2", "affine_select": "#f7b6d2",
    "dma_copy": "#7f7f7f", "semaphore_signal": "#d62728", "semaphore_wait": "#ff9896",
}
# kinds no table above names, in the order they are first needed
_SPARE = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1",
          "#636363"]


def colour_of(kind: str, spares: dict[str, str]) -> str:
    """The colour of an instruction kind; a kind without one takes the next spare colour
    (``spares`` remembers which, so a figure's kinds keep theirs)."""
    if kind in KIND_COLOURS:
        return KIND_COLOURS[kind]
    if kind not in spares:
        spares[kind] = _SPARE[len(spares) % len(_SPARE)]
    return spares[kind]


def traces_of(trace: Any, what: str) -> list[tuple[int | None, Any]]:
    """(rank, Trace) pairs to plot: one per rank of a JobTrace; else one, rank None, of
    anything :func:`trnsim.trace.export.as_trace` takes (``what`` names the caller)."""
    from trnsim.trace.export import as_trace
    from trnsim.trace.job import JobTrace

    if isinstance(trace, JobTrace):
        return list(enumerate(trace.ranks))
    return [(None, as_trace(trace, what))]


def total_of(pairs: list[tuple[int | None, Any]]) -> float:
    """The run time of the traces ``pairs`` holds, in ns."""
    return max((t.total_ns for _, t in pairs), default=0.0)


def plot_title(pairs: list[tuple[int | None, Any]], what: str) -> str:
    """``what: program on chip, run time`` (``N ranks, program each`` for a job)."""
    meta = pairs[0][1].meta
    who = meta.get("program", pairs[0][1].process)
    if pairs[0][0] is not None:
        who = f"{len(pairs)} ranks, {who} each"
    return f"{what}: {who} on {meta.get('chip', '?')}, {fmt_ns(total_of(pairs))}"


def new_figure(width: float, height: float, rows: int = 1, *, sharex: bool = True,
               ratios: list[float] | None = None) -> tuple[Any, list[Any]]:
    """A figure of ``rows`` axes stacked (sharing x), laid out by matplotlib's constrained
    layout so labels and outside legends fit. The figure is closed to pyplot at once: a
    notebook shows it once, as the value it is returned as, and many plots keep no memory."""
    import matplotlib.pyplot as plt

    with plt.rc_context({"font.size": FONT_PT, "axes.titlesize": FONT_PT + 1, "axes.labelsize": FONT_PT,
                         "xtick.labelsize": FONT_PT, "ytick.labelsize": FONT_PT, "legend.fontsize": FONT_PT - 0.5}):
        fig, axes = plt.subplots(rows, 1, figsize=(width, height), sharex=sharex, squeeze=False,
                                 layout="constrained", gridspec_kw={"height_ratios": ratios} if ratios else None)
    plt.close(fig)
    return fig, [a for (a,) in axes]


def time_unit(span_ns: float) -> tuple[float, str]:
    """Nanoseconds per unit, and its name, for an axis spanning ``span_ns``: ns below
    2 us, us below 5 ms, ms beyond."""
    if span_ns < 2e3:
        return 1.0, "ns"
    if span_ns < 5e6:
        return 1e3, "us"
    return 1e6, "ms"


def fmt_ns(ns: float) -> str:
    """A time for a title: ``812 ns``, ``45.51 us``, ``12.30 ms``."""
    scale, unit = time_unit(abs(ns))
    return f"{ns / scale:,.0f} {unit}" if unit == "ns" else f"{ns / scale:,.2f} {unit}"


def finish(figure: Any, path: str | os.PathLike | None) -> Any:
    """Save ``figure`` to ``path`` when given; return it."""
    if path is not None:
        save_figure(figure, path)
    return figure


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
    if figure.get_layout_engine() is None:
        figure.tight_layout()
    import matplotlib

    # the same figure, the same bytes: no date, and SVG ids hashed from a fixed salt
    metadata = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt)
    with matplotlib.rc_context({"svg.hashsalt": "trnsim"}):
        write_atomic(path, lambda f: figure.savefig(f, format=fmt, dpi=100, metadata=metadata), binary=True)
