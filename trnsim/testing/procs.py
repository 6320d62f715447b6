"""Running a command (a launcher and the ranks it starts) from a test, bounded in time
and leaving no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Sequence


def kill_session(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s whole session (a launcher and its ranks), if anything is left."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_session(cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a new session and return its result (text output). Past ``timeout``
    seconds, or when it ends, everything left in the session is killed; an overrun fails
    the calling test with the tail of the output."""
    import pytest

    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=None if env is None else dict(env), cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))} ran past {timeout} s\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        kill_session(proc)   # anything the command left behind
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def with_repo_on_path(repo: str | os.PathLike, **extra: str) -> dict[str, str]:
    """This process's environment with ``repo`` first on PYTHONPATH, and ``extra`` set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env
