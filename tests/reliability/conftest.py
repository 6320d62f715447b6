"""The reliability suite: adversarial inputs against every public entry point.

Each test feeds a bad or hostile input and accepts exactly two outcomes: the CPU's
(or numpy's) answer, or one clear error that names the bad value. A raw traceback
from user input, a result that differs from the reference, or a partial file on
disk fails the test. The helpers below are the one place those rules are written.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

# Exceptions that only ever escape by accident: a bug deep inside, never a message
# written for a user.
RAW = (AssertionError, AttributeError, KeyError, IndexError, NameError, UnboundLocalError, ZeroDivisionError,
       RecursionError, UnicodeDecodeError, OverflowError, SystemError, MemoryError)


def clean_error(fn: Callable[[], Any], *fragments: str, types: type | tuple[type, ...] = Exception) -> BaseException:
    """Call ``fn``; require it to raise ``types`` with a one-paragraph message that
    contains every fragment (the bad value, the fix). Returns the exception."""
    with pytest.raises(types) as info:
        fn()
    err = info.value
    if isinstance(err, RAW) and not _is_user_error(err):
        raise AssertionError(f"raw {type(err).__name__} escaped instead of a clear error: {err!r}") from err
    msg = str(err)
    assert msg.strip(), f"{type(err).__name__} with an empty message"
    for fragment in fragments:
        assert fragment in msg, f"error does not name {fragment!r}: {msg}"
    return err


def _is_user_error(err: BaseException) -> bool:
    """PyTorch's own user-facing errors derive from these classes too (IndexError for an
    out-of-range index, say); trnsim's errors and torch's carry a message written for a user."""
    from trnsim.errors import TrnSimError

    return isinstance(err, TrnSimError) or type(err).__module__.startswith("torch")


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``trnsim ARGS`` in this process; return (exit code, stdout, stderr).
    Fails the test if any exception escapes ``main`` (a raw traceback for the user)."""
    from trnsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    if env:
        os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(args))
            except SystemExit as e:       # argparse's usage errors
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException as e:    # this is the failure being tested for
                raise AssertionError(f"trnsim {' '.join(args)} raised {type(e).__name__}: {e}") from e
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return rc, out.getvalue(), err.getvalue()


def cli_process(*args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m trnsim.cli ARGS`` in a child process (bounded by ``timeout``)."""
    full_env = {**os.environ, **(env or {})}
    root = str(Path(__file__).resolve().parents[2])
    full_env["PYTHONPATH"] = root + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "trnsim.cli", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)


def assert_one_line_error(rc: int, stderr: str, *fragments: str) -> None:
    """A CLI refusal: exit code 2, no traceback, one ``trnsim: error:`` line naming the fragments."""
    assert "Traceback" not in stderr, stderr
    assert rc == 2, f"exit code {rc}, expected 2; stderr: {stderr}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert lines and lines[-1].startswith(("trnsim: error:", "usage:", "trnsim")), stderr
    for fragment in fragments:
        assert fragment in stderr, f"stderr does not name {fragment!r}: {stderr}"
