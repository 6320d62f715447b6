"""The progress line of ``trnsim run`` on a terminal: what the screen shows, never mixed
with the script's own output, and gone at the end."""

import io
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from trnsim.backend.progress import Progress
from trnsim.testing.procs import run_pty, with_repo_on_path

ROOT = Path(__file__).resolve().parents[1]
_ESCAPE = re.compile(r"\x1b\[([0-9;]*)([A-Za-z])")


def render(output: bytes) -> list[str]:
    """The rows a terminal shows after ``output`` (no wrapping: the pty is wide enough).
    Knows carriage return, line feed, backspace and erase-to-end-of-line; any other
    control sequence fails the test, so nothing is silently misread."""
    rows: list[list[str]] = [[]]
    row = col = 0
    i = 0
    text = output.decode("utf-8")
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            m = _ESCAPE.match(text, i)
            assert m and m.group(2) == "K" and m.group(1) in ("", "0"), f"unexpected escape at {text[i:i + 12]!r}"
            del rows[row][col:]
            i += len(m.group(0))
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            if row == len(rows):
                rows.append([])
        elif ch == "\b":
            col = max(col - 1, 0)
        else:
            line = rows[row]
            line.extend(" " * (col - len(line)))
            line[col:col + 1] = [ch]
            col += 1
        i += 1
    return ["".join(r).rstrip() for r in rows]


def test_render_reads_a_terminal_stream():
    assert render(b"ab\r\x1b[Kcd\r\nxy\rz\n") == ["cd", "zy", ""]


SCRIPT = """\
import sys, time, torch
x = torch.ones(256, 256, device="neuron")
for step in range(3):
    x = x @ x / 256                          # device ops: the line counts them
    time.sleep(0.7)                          # host time only: the line is drawn meanwhile
    print(f"step {step} loss {x.sum().item():.4f}")
time.sleep(0.7)
print("a warning of the script", file=sys.stderr)
time.sleep(0.7)
print("half a line, ", end="", flush=True)   # the rest comes later: never erased meanwhile
time.sleep(0.7)
print("then the rest")
sys.stdout.buffer.write(b"bytes through the buffer\\n")
time.sleep(0.7)
"""
PRINTED = ["step 0 loss 65536.0000", "step 1 loss 65536.0000", "step 2 loss 65536.0000",
           "a warning of the script", "half a line, then the rest", "bytes through the buffer"]


def test_progress_line_never_mixes_with_the_scripts_output_on_a_terminal(tmp_path):
    script = tmp_path / "prints.py"
    script.write_text(SCRIPT)
    env = with_repo_on_path(ROOT, TRNSIM_CHIP="trn2", TRNSIM_FIDELITY="op")
    env.pop("TRNSIM_PROGRESS", None)   # the line is on: this is a terminal
    code, output = run_pty([sys.executable, "-m", "trnsim.cli", "run", "--no-trace", str(script)], timeout=300,
                           env=env, cwd=tmp_path)
    screen = render(output)
    assert code == 0, "\n".join(screen[-30:])
    assert b"ops simulated" in output   # the line was drawn: the test sees it at work
    for line in PRINTED:
        assert line in screen, (line, screen)
    assert not [row for row in screen if "ops simulated" in row], screen
    assert screen[screen.index(PRINTED[-1]) + 1].startswith("program        eager PyTorch")


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_progress_erases_itself_before_each_write_of_the_program(monkeypatch):
    terminal = Tty()
    monkeypatch.delenv("TRNSIM_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    with Progress(terminal, interval_s=3600) as p:
        assert sys.stdout is not terminal and sys.stdout.isatty()
        p.update()
        print("one", end="")
        p.update()            # inside the program's line: not drawn
        print(" two")
        p.update()
    assert sys.stdout is terminal and sys.stderr is terminal
    assert p.shown == 2
    assert render(terminal.getvalue().encode()) == ["one two", ""]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_the_line_is_held_can_still_print(monkeypatch):
    """A DataLoader worker forked while the progress thread held its lock inherits the
    lock held: the child must write to its streams directly, not wait on it forever."""
    terminal = Tty()
    monkeypatch.delenv("TRNSIM_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stdout", terminal)
    with Progress(terminal, interval_s=3600) as p:
        held, release = threading.Event(), threading.Event()

        def draw():   # the progress thread, holding the lock while it draws
            with p._lock:
                held.set()
                release.wait(30)

        drawer = threading.Thread(target=draw)
        drawer.start()
        held.wait(30)
        pid = os.fork()
        if pid == 0:   # the child: print through what sys.stdout now is, then leave at once
            try:
                print("child", flush=True)
                code = 0 if sys.stdout is terminal else 3
            except BaseException:   # noqa: BLE001 - any failure is the child's exit status
                code = 4
            os._exit(code)
        release.set()
        drawer.join()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on its first print")
    assert os.waitstatus_to_exitcode(status) == 0
