"""A user's script run as ``trnsim run`` runs it, in one process or in each rank of a job:
as ``__main__``, unchanged; and what is said when it does not finish.

A script that raises shows its own traceback, from its first frame on: the frames of
the runner (``trnsim.cli``, ``runpy``, the rank launcher) say nothing about the script.
A run that stopped early is summed up in one line (:func:`stopped_line`) naming the
partial trace it left (:mod:`trnsim.trace.partial`).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path
from types import TracebackType

from trnsim.trace.events import Trace
from trnsim.trace.job import JobTrace

#: Exit status of a run stopped by Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED = 130


def run_script(script: str, args: list[str]) -> None:
    """Run ``script`` as ``__main__`` with ``sys.argv`` = ``[script, *args]`` and its
    folder first on ``sys.path``, as ``python script args`` would."""
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


def script_traceback(exc: BaseException, script: str) -> str:
    """The traceback of ``exc``, raised by ``script`` under :func:`run_script`, from the
    script's first frame on (all of it if no frame is the script's: an error in the
    runner itself)."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    if tb is not None:
        exc = exc.with_traceback(tb)
    return "".join(traceback.format_exception(exc))


def stopped_line(event: str, trace: Trace | JobTrace, written: Path | None, target: str | os.PathLike | None) -> str:
    """The one line that says a run did not finish: ``event`` (``interrupted``, ``the
    script raised ValueError``), how far it got by its ``trace``, and where its partial
    trace was ``written`` (None: no trace asked for), ``target`` being kept."""
    from trnsim.trace.reporting import report

    rep = report(trace, top=0)
    line = f"trnsim: {event} after {sum(o.calls for o in rep.ops):,} ops, {rep.total_ns / 1000:,.3f} us simulated"
    if written is None:
        return line
    kept = f" ({target} is left as it was)" if target is not None and Path(target).exists() else ""
    return f"{line}; partial trace at {written}{kept}"
