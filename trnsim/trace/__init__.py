"""Traces: the event model, Chrome/Perfetto export and loading, summaries, reports, comparisons and plots."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trnsim.trace.analysis import Summary, busy_ns, summarize
from trnsim.trace.comparison import Comparison, compare
from trnsim.trace.events import Counter, Slice, Trace, trace_from_run
from trnsim.trace.export import load, save, to_chrome
from trnsim.trace.job import JobTrace, merge, save_job
from trnsim.trace.plot import plot_busy, plot_timeline
from trnsim.trace.reporting import Report, report

__all__ = ["Comparison", "Counter", "JobTrace", "Report", "Slice", "Summary", "Trace", "busy_ns", "compare", "load", "merge",
           "plot_busy", "plot_timeline", "report", "save", "save_job", "summarize", "to_chrome", "trace_from_run",
           "write_trace"]


def write_trace(result: Any, path: str | os.PathLike) -> Path:
    """Trace a simulated run and write it to ``path`` as Chrome trace-event JSON."""
    return save(trace_from_run(result), path)
