"""Running a command (a launcher and the ranks it starts) from a test, bounded in time
and leaving no process behind: with its output piped (:func:`run_session`), optionally
interrupted as Ctrl-C would once it has started, or on a pseudo-terminal (:func:`run_pty`)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import tempfile
import termios
import time
from pathlib import Path
from typing import Mapping, Sequence


def descendants(pid: int) -> list[int]:
    """The processes descended from ``pid`` (children, theirs, ...), from ``/proc``; empty
    where there is no ``/proc``."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:   # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_session(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s whole session (a launcher and its ranks) and every process descended
    from it, if anything is left. Descendants count because launchers put their workers
    in sessions of their own (torchrun's agent does, under ``accelerate launch`` and TRL's
    CLI too), out of reach of the launcher's process group once the launcher is gone; they
    are found while the launcher still lives."""
    left = descendants(proc.pid) if proc.poll() is None else []
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # first, so that no launcher restarts what is killed below
    except ProcessLookupError:
        pass
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _overrun(cmd: Sequence[str], timeout: float, out: str, err: str) -> None:
    import pytest

    pytest.fail(f"{' '.join(map(str, cmd))} ran past {timeout} s\n{out[-3000:]}\n{err[-3000:]}")


def run_session(cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike | None = None,
                interrupt_when: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a new session and return its result (text output). Past ``timeout``
    seconds, or when it ends, everything left in the session is killed; an overrun fails
    the calling test with the tail of the output.

    With ``interrupt_when`` (a path), the session's process group gets SIGINT, as from
    Ctrl-C on a terminal, as soon as that file exists (the command makes it once it has
    started what is to be interrupted)."""
    if interrupt_when is None:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=None if env is None else dict(env), cwd=cwd, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc)
            out, err = proc.communicate()
            _overrun(cmd, timeout, out, err)
        finally:
            kill_session(proc)   # anything the command left behind
        return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
    # files, not pipes: nothing reads the output until the command ends, and it must not block
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:
        proc = subprocess.Popen(list(cmd), stdout=fout, stderr=ferr, text=True,
                                env=None if env is None else dict(env), cwd=cwd, start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while not Path(interrupt_when).exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None and Path(interrupt_when).exists():
                os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            kill_session(proc)
            proc.wait()
            _overrun(cmd, timeout, _read(fout), _read(ferr))
        finally:
            kill_session(proc)
        return subprocess.CompletedProcess(list(cmd), proc.returncode, _read(fout), _read(ferr))


def _read(f) -> str:
    f.seek(0)
    return f.read()


def run_pty(cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
            cwd: str | os.PathLike | None = None, columns: int = 200) -> tuple[int, bytes]:
    """Run ``cmd`` in a new session with a pseudo-terminal ``columns`` wide as its
    standard input, output and error, as from a terminal; returns its exit status and
    every byte it wrote to the terminal. Bounded as :func:`run_session`."""
    leader, follower = pty.openpty()
    termios.tcsetwinsize(follower, (50, columns))
    try:
        proc = subprocess.Popen(list(cmd), stdin=follower, stdout=follower, stderr=follower,
                                env=None if env is None else dict(env), cwd=cwd, start_new_session=True)
    finally:
        os.close(follower)
    screen = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                kill_session(proc)
                _overrun(cmd, timeout, screen.decode(errors="replace"), "")
            if not select.select([leader], [], [], min(left, 1.0))[0]:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:   # the terminal closes when the last process holding it ends
                break
            if not chunk:
                break
            screen += chunk
        proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    finally:
        kill_session(proc)
        os.close(leader)
    return proc.returncode, screen


def with_repo_on_path(repo: str | os.PathLike, **extra: str) -> dict[str, str]:
    """This process's environment with ``repo`` first on PYTHONPATH, and ``extra`` set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env
