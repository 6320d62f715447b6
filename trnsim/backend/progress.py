"""Progress of a long simulation on a terminal: ops simulated and simulated time reached.

``with Progress():`` shows one status line on standard error, rewritten in place a few
times a second (host time paces the updates, never the simulation), and clears it at
the end. It shows nothing when standard error is not a terminal (piped, redirected,
captured), so logs and pipes see only what the script itself prints, nor when
``TRNSIM_PROGRESS=0`` is set (a terminal that records its output, such as a notebook's
``!`` command, which runs in a pseudo-terminal).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, TextIO

from trnsim.backend import state

#: Host seconds between two updates of the line.
INTERVAL_S = 0.25
_CLEAR = "\r\x1b[K"


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

    @property
    def active(self) -> bool:
        """Whether the line is shown: the stream is a terminal and ``TRNSIM_PROGRESS``
        is not ``0``."""
        if os.environ.get("TRNSIM_PROGRESS", "1").strip() == "0":
            return False
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def line(self) -> str:
        """The status line as it reads now."""
        ops = state.clock.ops - self._ops0
        us = (state.clock.device - self._device0) / 1e6
        return f"trnsim: {ops:,} ops simulated, {us:,.1f} us of simulated time"

    def update(self) -> None:
        """Write the line now."""
        self.stream.write(_CLEAR + self.line())
        self.stream.flush()
        self.shown += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.update()

    def __enter__(self) -> Progress:
        self._ops0, self._device0 = state.clock.ops, state.clock.device
        if self.active:
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
        if self.shown:
            self.stream.write(_CLEAR)
            self.stream.flush()
