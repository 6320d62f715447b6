"""``trnsim run`` follows the Python processes its script starts.

Launchers do their work in child processes: ``trl sft`` and ``accelerate launch`` start
the training script with ``subprocess``, ``torchrun`` starts one process per rank. Each
is a process of its own with a device of its own, so the ``trnsim.profile`` of ``trnsim
run`` never sees their ops. :func:`children_followed` sets the variables that pass the
profiling on, as ``trnsim run --nproc`` does for its ranks: every Python process started
below the run (children, and theirs) that loads trnsim (``import torch`` does) records
its ops from then until it exits (:func:`start_if_followed`) and, if it ran any on the
device, writes its trace into the run's folder, named after its process id and command
line. :func:`collect` reads them back for the run to report.

A process that ends without Python's exit handlers (``os._exit``, a signal, a
multiprocessing worker) writes no trace; forked children that do not import again
(DataLoader workers) record nothing of their own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

#: The folder child processes write their traces to.
FOLDER = "TRNSIM_FOLLOW_DIR"
#: The process id of ``trnsim run`` itself, which records its own ops.
ROOT = "TRNSIM_FOLLOW_ROOT"

_recording: list[Any] = []


@contextlib.contextmanager
def children_followed() -> Iterator[list]:
    """While active, the Python processes started from this one record their device ops
    (see the module); at exit, the list it gives holds their traces (:func:`collect`)."""
    with tempfile.TemporaryDirectory(prefix="trnsim-run-") as folder:
        saved = {name: os.environ.get(name) for name in (FOLDER, ROOT)}
        os.environ.update({FOLDER: folder, ROOT: str(os.getpid())})
        traces: list = []
        try:
            yield traces
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            traces.extend(collect(folder))


def start_if_followed() -> None:
    """In a process started below ``trnsim run`` (see the module), record every op from
    now on and write the trace at exit; elsewhere, nothing."""
    folder = os.environ.get(FOLDER)
    if not folder or os.environ.get(ROOT) == str(os.getpid()) or _recording:
        return
    from trnsim.backend.profiler import profile   # trnsim itself may still be importing

    prof = profile()
    prof.__enter__()
    _recording.append(prof)
    atexit.register(_write, prof, Path(folder))


def command_line() -> str:
    """This process's command line, as a shell would show it."""
    words = [Path(sys.executable).name, *sys.argv]
    return " ".join(shlex.quote(w) for w in words)


def _write(prof: Any, folder: Path) -> None:
    prof.__exit__(None, None, None)
    if not prof.records or not folder.is_dir():   # no device work, or trnsim run has ended before it
        return
    from trnsim.trace.export import save

    trace = prof.trace()
    pid = os.getpid()
    rank = os.environ.get("RANK")
    trace.process = f"pid {pid}" + (f" (rank {rank})" if rank is not None else "")
    trace.meta.update(rank_name=trace.process, command=command_line(), pid=pid)
    if rank is not None:
        trace.meta["rank"] = int(rank)
    failure = getattr(sys, "last_value", None)   # set when an exception ended the process
    if failure is not None:
        from trnsim.trace.partial import KEY, why_unfinished

        trace.meta[KEY] = why_unfinished(failure)
    save(trace, folder / f"pid{pid}.json")


def collect(folder: str | os.PathLike) -> list:
    """The traces the followed processes wrote into ``folder``: ranks in rank order
    first, then the others by process id."""
    from trnsim.trace import load

    traces = [load(p) for p in Path(folder).glob("pid*.json")]
    return sorted(traces, key=lambda t: (t.meta.get("rank") is None, t.meta.get("rank", 0), t.meta.get("pid", 0)))
