"""Traces of a distributed job: one trace per rank, merged onto the shared simulated clock.

Each rank writes its own trace (:class:`trnsim.profile`), timed from its own first op
(``meta["origin_ps"]`` is that op's start on the rank's clock). Ranks' clocks meet at
every collective, so they are one clock: :func:`trnsim.trace.export.merge` shifts each
rank's slices by its origin into a :class:`JobTrace`, which
:func:`trnsim.trace.export.save_job` writes as one Chrome/Perfetto file with a process
per rank and :func:`trnsim.trace.load` reads back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trnsim.trace.events import Slice, Trace


@dataclass
class JobTrace:
    """The traces of a job's ranks on one clock (nanoseconds from the job's first op)."""

    ranks: list[Trace] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def total_ns(self) -> float:
        return max((s.end_ns for t in self.ranks for s in t.slices), default=0.0)

    @property
    def partial(self) -> str | None:
        """Why the job did not finish (``meta["partial"]``: a rank failed, Ctrl-C), or
        None for a finished job's trace (see :mod:`trnsim.trace.partial`)."""
        reason = self.meta.get("partial")
        return None if reason is None else str(reason)

    def collectives(self, rank: int) -> list[Slice]:
        """The collectives track of ``rank``."""
        return [s for s in self.ranks[rank].slices if s.track == "collectives"]
