"""Progress of a long simulation on a terminal: ops simulated and simulated time reached.

``with Progress():`` shows one status line on standard error, rewritten in place a few
times a second (host time paces the updates, never the simulation), and clears it at
the end. It shows nothing when standard error is not a terminal (piped, redirected,
captured), so logs and pipes see only what the script itself prints, nor when
``TRNSIM_PROGRESS=0`` is set (a terminal that records its output, such as a notebook's
``!`` command, which runs in a pseudo-terminal).

The line never mixes with the program's own output. While it is active,
``sys.stdout`` and ``sys.stderr`` (those that are terminals) are wrapped: a write
through them, or through their ``buffer``, first erases the line, and the line is drawn
again at the next update only once the program's output has ended a line (a
``print(..., end="")`` waiting for the rest of its line is never erased). This covers
everything Python code writes through ``sys.stdout``/``sys.stderr``: ``print``, logging
and warnings, tracebacks. Output written straight to file descriptors 1 and 2 (C
extensions, ``os.write``, child processes) does not pass through Python and can still
land beside the line until its next update, as with tqdm and rich.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any, TextIO

from trnsim.backend import state

#: Host seconds between two updates of the line.
INTERVAL_S = 0.25
_CLEAR = "\r\x1b[K"
_STREAMS = ("stdout", "stderr")


class _Guarded:
    """A terminal stream whose writes erase the progress line first; everything else
    (``isatty``, ``fileno``, ``encoding`` ...) is the stream's own."""

    def __init__(self, stream: Any, progress: Progress) -> None:
        self._stream = stream
        self._progress = progress

    def write(self, data: Any) -> int:
        with self._progress._lock:
            self._progress._erase()
            n = self._stream.write(data)
            if len(data):
                ends_line = _ends_line(data)
                if ends_line:   # on the terminal before the line is drawn again
                    self._stream.flush()
                self._progress._mid_line = not ends_line
            return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    @property
    def buffer(self) -> _Guarded:
        return _Guarded(self._stream.buffer, self._progress)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Progress:
    """A status line ``ops simulated, simulated time`` on ``stream`` (default standard
    error) while active, only if the stream is a terminal. The counts are the device
    clock's (:data:`trnsim.backend.state.clock`) since the line started."""

    def __init__(self, stream: TextIO | None = None, interval_s: float = INTERVAL_S) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.shown = 0   # updates written
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ops0 = self._device0 = 0
        # one lock orders the line and the program's writes; reentrant, since a signal
        # handler that prints runs in the thread it interrupted
        self._lock = threading.RLock()
        self._drawn = False      # the line is on the screen now
        self._mid_line = False   # the program's last write to the terminal did not end its line
        self._guards: dict[str, _Guarded] = {}

    @property
    def active(self) -> bool:
        """Whether the line is shown: the stream is a terminal and ``TRNSIM_PROGRESS``
        is not ``0``."""
        if os.environ.get("TRNSIM_PROGRESS", "1").strip() == "0":
            return False
        return _isatty(self.stream)

    def line(self) -> str:
        """The status line as it reads now."""
        ops = state.clock.ops - self._ops0
        us = (state.clock.device - self._device0) / 1e6
        return f"trnsim: {ops:,} ops simulated, {us:,.1f} us of simulated time"

    def update(self) -> None:
        """Draw the line now, unless the program's output has left the cursor inside a line."""
        with self._lock:
            if self._mid_line:
                return
            self.stream.write(_CLEAR + self.line()[:self._width()])
            self.stream.flush()
            self._drawn = True
            self.shown += 1

    def _width(self) -> int | None:
        """Characters that fit on the terminal's row: a wrapped line could not be erased."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):   # no real terminal behind the stream
            return None
        return columns - 1 if columns > 1 else None

    def _erase(self) -> None:
        """Erase the line if it is on the screen (the lock is held)."""
        if self._drawn:
            self.stream.write(_CLEAR)
            self.stream.flush()
            self._drawn = False

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.update()

    def __enter__(self) -> Progress:
        self._ops0, self._device0 = state.clock.ops, state.clock.device
        if self.active:
            _shown.add(self)
            for name in _STREAMS:
                stream = getattr(sys, name)
                if _isatty(stream):
                    self._guards[name] = _Guarded(stream, self)
                    setattr(sys, name, self._guards[name])
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="trnsim-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        with self._lock:
            self._erase()
        self._unguard()
        _shown.discard(self)

    def _unguard(self) -> None:
        for name, guard in self._guards.items():
            if getattr(sys, name) is guard:   # a stream the program put there itself stays
                setattr(sys, name, guard._stream)
        self._guards.clear()

    def _after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) has no progress thread, and the lock may
        have been held by it at the fork: the child writes to its streams directly."""
        self._lock = threading.RLock()
        self._thread, self._drawn, self._mid_line = None, False, False
        self._unguard()


# the lines on screen now, so that a forked child can let go of them
_shown: weakref.WeakSet[Progress] = weakref.WeakSet()


def _forget_in_child() -> None:
    for progress in list(_shown):
        progress._after_fork_in_child()
    _shown.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _ends_line(data: Any) -> bool:
    """Whether text or bytes written to a terminal end with a newline."""
    if isinstance(data, str):
        return data.endswith("\n")
    return memoryview(data).cast("B")[-1:].tobytes() == b"\n"


def _isatty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:   # a closed stream
        return False
