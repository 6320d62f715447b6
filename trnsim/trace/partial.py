"""Partial traces: what a run that did not finish leaves, beside its trace, never over it.

A run that stops early (an exception, Ctrl-C, a nonzero ``sys.exit``) still has a
trace of what it ran, but it is not the trace that was asked for: written over the
finished trace of an earlier run, it would replace good figures with a fragment and
nobody would know. So :func:`save_run` writes an unfinished run's trace to
:func:`partial_path` (``t.json`` becomes ``t.partial.json``), leaving ``t.json`` as it
was, and marks it: ``otherData.partial`` holds why the run stopped (also
:attr:`trnsim.trace.Trace.partial` once loaded), the summaries of ``trnsim report`` and
:func:`trnsim.trace.summarize` say so on their first line, and Perfetto shows it in the
process name.
"""

from __future__ import annotations

import os
from pathlib import Path

from trnsim.atomic import as_path
from trnsim.trace.events import Trace
from trnsim.trace.job import JobTrace

#: The metadata key (``otherData``) of a partial trace: why the run stopped.
KEY = "partial"
_REASON_CHARS = 160


def partial_path(path: str | os.PathLike) -> Path:
    """Where an unfinished run's trace goes instead of ``path``: ``.partial`` before
    its extension (``traces/t.json`` gives ``traces/t.partial.json``)."""
    path = as_path(path, "trace")
    return path.with_name(f"{path.stem}.partial{path.suffix}")


def why_unfinished(exc: BaseException | None) -> str | None:
    """Why a run ended by ``exc`` did not finish, in a few words; None if it did (no
    exception, or ``sys.exit()`` with status 0)."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
        return None
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by Ctrl-C"
    if isinstance(exc, SystemExit):
        return f"exited with status {exc.code if isinstance(exc.code, int) else 1}"
    text = " ".join(str(exc).split())
    text = text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def summary_line(reason: str) -> str:
    """The first line of the summary of a partial trace."""
    return f"PARTIAL TRACE  the run did not finish: {reason}; the figures cover only what ran until then"


def save_run(trace: Trace | JobTrace, path: str | os.PathLike, unfinished: str | None) -> Path:
    """Write a run's trace: to ``path`` if the run finished (``unfinished`` is None),
    else marked partial (``unfinished`` says why) to :func:`partial_path`. Returns the
    path written."""
    from trnsim.trace.export import save, save_job

    if unfinished is not None:
        trace.meta[KEY] = unfinished
        path = partial_path(path)
    return save_job(trace, path) if isinstance(trace, JobTrace) else save(trace, path)
