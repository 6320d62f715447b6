"""A user's script run as ``trnsim run`` runs it, in one process or in each rank of a job:
as ``__main__``, unchanged (a script as ``python script.py`` runs it, a module as
``python -m module`` does: :class:`Program`); and what is said when it does not finish.

A script that raises shows its own traceback, from its first frame on: the frames of
the runner (``trnsim.cli``, ``runpy``, the rank launcher) say nothing about the script.
A run that stopped early is summed up in one line (:func:`stopped_line`) naming the
partial trace it left (:mod:`trnsim.trace.partial`).
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from trnsim.errors import TrnSimError
from trnsim.trace.events import Trace
from trnsim.trace.job import JobTrace

#: Exit status of a run stopped by Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED = 130


def _current_folder_first() -> None:
    """Put the current folder first on ``sys.path``, as ``python -m`` does (once)."""
    if not sys.path or sys.path[0] != os.getcwd():
        sys.path.insert(0, os.getcwd())


@dataclass(frozen=True)
class Program:
    """What ``trnsim run`` runs: the script at ``target``, or with ``module`` the module
    named ``target`` (``torchtitan.train``), as ``python -m`` runs it."""

    target: str
    module: bool = False

    def check(self) -> None:
        """Refuse a script that is not a file, or a module Python cannot find."""
        if not self.module and not Path(self.target).is_file():
            raise TrnSimError(f"script {self.target!r} does not exist; give the path of a Python script to run, "
                              "or -m and a module's name")
        if self.module and self.origin() is None:
            raise TrnSimError(f"no module named {self.target!r} (python -m would not find it either); install it, or "
                              "run from the folder that holds it")

    def origin(self) -> str | None:
        """The file that runs: the script, or the module's file (a package's ``__main__``)."""
        if not self.module:
            return self.target
        _current_folder_first()
        try:
            spec = importlib.util.find_spec(self.target)
            if spec is not None and spec.submodule_search_locations is not None:
                spec = importlib.util.find_spec(f"{self.target}.__main__")
        except (ImportError, ValueError):   # a parent package that does not import, an empty name
            return None
        return spec.origin if spec is not None else None

    @property
    def stem(self) -> str:
        """The name a trace is named after: the script's stem, or the module's name."""
        return self.target if self.module else Path(self.target).stem

    def argv(self) -> list[str]:
        """The program as a command line's words: ``[script]`` or ``["-m", module]``."""
        return ["-m", self.target] if self.module else [self.target]

    @classmethod
    def from_argv(cls, argv: list[str]) -> tuple[Program, list[str]]:
        """The program and its arguments from :meth:`argv` followed by the arguments."""
        if argv[0] == "-m":
            return cls(argv[1], module=True), argv[2:]
        return cls(argv[0]), argv[1:]

    def run(self, args: list[str]) -> None:
        """Run as ``__main__`` with ``sys.argv`` = ``[script or module file, *args]``, as
        ``python script args`` would (the script's folder first on ``sys.path``) or
        ``python -m module args`` (the current folder first on ``sys.path``)."""
        if self.module:
            sys.argv = [self.target, *args]   # runpy puts the module's file in sys.argv[0]
            _current_folder_first()
            runpy.run_module(self.target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [self.target, *args]
            sys.path.insert(0, str(Path(self.target).resolve().parent))
            runpy.run_path(self.target, run_name="__main__")

    def traceback(self, exc: BaseException) -> str:
        """The traceback of ``exc``, which the program raised, from its first frame on."""
        return script_traceback(exc, self.origin() or self.target)


def script_traceback(exc: BaseException, script: str) -> str:
    """The traceback of ``exc``, raised by ``script`` under :meth:`Program.run`, from the
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
