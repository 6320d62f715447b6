"""Simulated time of collectives: ranks' clocks meet, the fabric times the transfer.

Each process keeps the eager timeline of its own NeuronCore (:data:`state.clock`):
``host`` (when the host issues its next op) and ``device`` (when the compute queue is
free). Collectives run on a queue of their own, ``cc``: a collective is ready on this
rank when the host has launched it, the compute queue has produced its inputs (every
op issued before it has finished) and the previous collective is done. All ranks of
the group start it together, at the latest of their ready times, so a slow rank delays
the others as on the chip. It ends after the time the fabric model gives it
(:mod:`trnsim.hw.fabric`). Compute issued afterwards overlaps it until something
waits for it (``work.wait()``, which a synchronous collective does at once): then the
compute queue waits for its end.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from trnsim.backend import state, timeline

_lock = threading.Lock()


@dataclass
class CollectiveQueue:
    """When this rank's collective queue is next free, in picoseconds."""

    free_ps: int = 0
    count: int = 0


queue = CollectiveQueue()


def ready_ps() -> int:
    """Issue a collective from the host: pay the launch; returns when it can start here."""
    launch = state.chip().runtime.op_launch_ps
    clock = state.clock
    with _lock:
        clock.host += launch
        return max(clock.host, clock.device, queue.free_ps)


def occupy(start_ps: int, end_ps: int) -> None:
    """The collective queue is busy from ``start_ps`` to ``end_ps``."""
    with _lock:
        queue.free_ps = max(queue.free_ps, end_ps)
        queue.count += 1


def wait_for(end_ps: int) -> None:
    """The compute queue waits until a collective ending at ``end_ps`` is done."""
    clock = state.clock
    with _lock:
        if clock.device < end_ps:
            clock.device = end_ps


@dataclass(frozen=True)
class CollectiveRecord:
    """What the trace shows of one collective (the ``info`` of its timeline record)."""

    kind: str
    algorithm: str
    bytes: int
    participants: tuple[int, ...]
    bus_gbps: float
    group: str
    extra: dict = field(default_factory=dict)

    def args(self) -> dict[str, Any]:
        out = {"collective": self.kind, "algorithm": self.algorithm, "bytes": self.bytes,
               "participants": list(self.participants), "bus_bandwidth_GBps": round(self.bus_gbps, 3),
               "group": self.group}
        out.update(self.extra)
        return out


def record(name: str, start_ps: int, end_ps: int, shapes: tuple, dtypes: tuple, info: CollectiveRecord) -> None:
    """Put a collective on the recording profiles of this thread (the trace's collectives track)."""
    timeline.executed[name] = "collective"
    recorders = timeline._recorders()
    if not recorders:
        return
    cost = timeline.OpCost(end_ps - start_ps, "collective")
    rec = timeline.OpRecord(name, shapes, dtypes, start_ps, end_ps, cost, info)
    for r in recorders:
        r.append(rec)
