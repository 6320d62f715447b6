"""Traces: the event model, Chrome/Perfetto export and loading, summaries, reports,
comparisons, analysis tables and plots."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trnsim.trace.analysis import Summary, busy_ns, summarize
from trnsim.trace.comparison import Comparison, compare
from trnsim.trace.critical import critical_path, waits
from trnsim.trace.events import Counter, Slice, Trace, trace_from_run
from trnsim.trace.export import load, merge, save, save_job, to_chrome
from trnsim.trace.job import JobTrace
from trnsim.trace.plot import (plot_busy, plot_comparison, plot_memory, plot_roofline, plot_timeline,
                               plot_utilisation)
from trnsim.trace.reporting import Report, report
from trnsim.trace.table import Table
from trnsim.trace.roofline_tables import Roofline, instructions, kernels, ops, roofline
from trnsim.trace.usage import utilisation

__all__ = ["Comparison", "Counter", "JobTrace", "Report", "Roofline", "Slice", "Summary", "Table", "Trace", "busy_ns",
           "compare", "critical_path", "instructions", "kernels", "load", "merge", "ops", "plot_busy", "plot_comparison",
           "plot_memory", "plot_roofline", "plot_timeline", "plot_utilisation", "report", "roofline", "save",
           "save_job", "summarize", "to_chrome", "trace_from_run", "utilisation", "waits", "write_trace"]


def write_trace(result: Any, path: str | os.PathLike) -> Path:
    """Trace a simulated run and write it to ``path`` as Chrome trace-event JSON."""
    return save(trace_from_run(result), path)
