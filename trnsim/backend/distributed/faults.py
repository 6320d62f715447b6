"""When a rank is lost: bounded waits, and errors that name the rank.

A rank that raises or dies closes its connections, so the others' next (or current)
gloo operation fails at once; one that hangs is given up on after the group's timeout.
Either way the error names the ranks that are gone: each rank leaves its host and
process id in the store when its group is made, and a failed operation checks which
of them still run (on this host; a rank on another host is named as unreachable).

The timeout is ``init_process_group(timeout=...)`` when given; PyTorch's default (30
minutes) becomes ``$TRNSIM_DIST_TIMEOUT`` seconds, 60 unless set, so a lost rank is
reported within a minute.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

from trnsim import settings
from trnsim.errors import TrnSimError

DEFAULT_TIMEOUT_S = 60.0


class RankLostError(TrnSimError, RuntimeError):
    """A collective failed because another rank of its group is gone."""


def timeout(given: datetime.timedelta | None) -> datetime.timedelta:
    """The group's timeout: the one given, or trnsim's default for PyTorch's default."""
    from torch.distributed.constants import default_pg_timeout

    if given is not None and given != default_pg_timeout:
        return given
    return datetime.timedelta(seconds=settings.dist_timeout_s(DEFAULT_TIMEOUT_S))


_PF_EXITING = 0x4   # the kernel's task flag: the process has begun to exit


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: not gone, not a zombie (dead but not yet reaped by
    its launcher), and not exiting (a killed process closes its sockets, which is what
    its peers notice first, before it becomes a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return _running(f.read())
    except OSError:
        return True


def _running(stat: bytes) -> bool:
    """Whether a ``/proc/PID/stat`` line describes a process that neither is a zombie nor
    has begun to exit (state, then flags, are the 1st and 7th fields after the name)."""
    try:
        fields = stat.rsplit(b")", 1)[1].split()
        state, flags = fields[0], int(fields[6])
    except (IndexError, ValueError):
        return True
    return state not in (b"Z", b"X") and not flags & _PF_EXITING


class Peers:
    """The processes behind the ranks of one group, for naming the lost ones."""

    def __init__(self, store: Any, rank: int, size: int, global_ranks: tuple[int, ...]) -> None:
        self._store = store
        self._size = size
        self._global = global_ranks
        self._host = socket.gethostname()
        store.set(f"trnsim/peer/{rank}", f"{self._host} {os.getpid()}")
        self._known: dict[int, tuple[str, int]] | None = None

    def _lookup(self) -> dict[int, tuple[str, int]]:
        if self._known is None:
            known = {}
            for r in range(self._size):
                try:
                    host, pid = self._store.get(f"trnsim/peer/{r}").decode().split()
                    known[r] = (host, int(pid))
                except Exception:   # noqa: BLE001 - the store itself may be gone with rank 0
                    continue
            self._known = known
        return self._known

    def lost(self) -> list[str]:
        """Descriptions of the ranks whose processes are gone."""
        out = []
        for r, (host, pid) in sorted(self._lookup().items()):
            if host == self._host and not _alive(pid):
                out.append(f"rank {self._global[r]} (pid {pid})")
        return out

    def explain(self, error: RuntimeError) -> RuntimeError:
        """``error`` from gloo, as a :class:`RankLostError` naming the lost ranks when any are."""
        lost = self.lost()
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if lost:
            return RankLostError(f"collective failed: {', '.join(lost)} of this job is gone ({text}); "
                                 "see that rank's own output for why it stopped")
        if "timed out" in text.lower() or "timeout" in text.lower():
            return RankLostError(f"collective timed out waiting for the other ranks ({text}); a rank is hung or far "
                                 "behind: raise the timeout with init_process_group(timeout=...) or "
                                 "TRNSIM_DIST_TIMEOUT if it is only slow")
        return RankLostError(f"collective failed: {text}; another rank of the job may have stopped "
                             "(on another host: see its output)")
