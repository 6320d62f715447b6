"""Which instance a job runs on, and the fabric's time for each collective of a group.

The instance is ``$TRNSIM_INSTANCE`` (``trnsim run --instance`` sets it), else the one
the device's chip comes in (trn1.32xlarge for Trainium1, trn2.48xlarge for Trainium2,
the Trainium3 server for Trainium3). Ranks are placed as the Neuron runtime places
them (:func:`trnsim.hw.fabric.place`): torchrun's ``LOCAL_WORLD_SIZE`` ranks per server,
filling a chip's logical cores, then the next chip. Each process keeps one
:class:`~trnsim.hw.fabric.Fabric` for the job, so its own collectives that overlap in
simulated time share links.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from trnsim.backend import state

PS_PER_NS = 1000
_fabric: list = []


@dataclass(frozen=True)
class Timing:
    """One collective's duration on the fabric, the algorithm and its bus bandwidth."""

    ps: int
    algorithm: str
    bus_gbps: float
    tier: str = ""


instance_name = state.instance_name


def fabric() -> object:
    """This job's fabric (made at the first collective)."""
    if not _fabric:
        import torch.distributed as dist

        from trnsim.hw.fabric import Fabric

        world = dist.get_world_size()
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
        nodes = max(1, math.ceil(world / per_node))
        _fabric.append(Fabric(instance_name(), world, nodes=nodes, nproc_per_node=per_node))
    return _fabric[0]


class GroupTiming:
    """The fabric times of one process group's collectives (``ranks``: its global ranks)."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks = ranks

    def collective(self, kind: str, nbytes: int, start_ps: int, per_rank: list[int] | None = None,
                   root: int | None = None) -> Timing:
        """A collective of this group moving ``nbytes`` (per rank; all-to-all: ``per_rank``
        bytes each rank sends) that starts at ``start_ps``, booked on this process's links."""
        if len(self.ranks) == 1:
            return Timing(0, "none", 0.0, "none")
        splits = None
        if per_rank is not None:
            n = len(self.ranks)
            splits = [[b // n] * n for b in per_rank]
        t = fabric().collective(kind, nbytes, self.ranks, root=None if root is None else self.ranks[root],
                                splits=splits, start_ns=start_ps / PS_PER_NS)
        return Timing(round(t.duration_ns * PS_PER_NS), t.algorithm, t.bus_bw_gbps, t.tier)

    def point_to_point(self, nbytes: int, src: int, dst: int, start_ps: int) -> Timing:
        """A send of ``nbytes`` from group rank ``src`` to ``dst``."""
        if src == dst:
            return Timing(0, "none", 0.0, "none")
        t = fabric().collective("send_recv", nbytes, (self.ranks[src], self.ranks[dst]), start_ns=start_ps / PS_PER_NS)
        return Timing(round(t.duration_ns * PS_PER_NS), t.algorithm, t.bus_bw_gbps, t.tier)
