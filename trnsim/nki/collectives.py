"""``nki.collectives``: communication between NeuronCores inside a kernel.

trnsim simulates one NeuronCore per kernel: a world of one rank. The collectives
keep their meaning there (an all-reduce, all-gather, reduce-scatter or all-to-all
over one rank gives each destination its source; a permute maps rank 0 to rank 0),
and each moves its data with one DMA per tensor. A replica group or permute that
names another rank is refused with a KernelError, as are the variants driven by
run-time metadata.
"""

from __future__ import annotations

from typing import Any, Sequence

from trnsim.nki import emit as _e
from trnsim.nki.refused import Refused
from trnsim.nki.tensor import NkiTensor

__all__ = ["ReplicaGroup", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute", "rank_id"]

_ONE_CORE = "a trnsim kernel runs on one simulated NeuronCore (a world of one rank, rank 0)"


class ReplicaGroup:
    """The groups of ranks a collective runs over, as lists of rank ids (``[[0]]``)."""

    def __init__(self, *groups: Any, **kwargs: Any) -> None:
        found = groups[0] if len(groups) == 1 else list(groups)
        found = kwargs.get("replica_groups", kwargs.get("groups", found))
        self.groups = [list(g) if isinstance(g, (list, tuple)) else [g] for g in (found or [[0]])]


def _check_group(group: Any, what: str) -> None:
    groups = group.groups if isinstance(group, ReplicaGroup) else [[0]]
    ranks = {int(r) for g in groups for r in g}
    if ranks - {0}:
        raise _e.tracer().fail(f"nki.collectives.{what} over ranks {sorted(ranks)}: {_ONE_CORE}; use a replica "
                               "group of rank 0 only, or run the collective from PyTorch (torch.distributed)")


def _copy_each(srcs: Sequence[NkiTensor], dsts: Sequence[NkiTensor], what: str) -> None:
    tr = _e.tracer()
    srcs = list(srcs) if isinstance(srcs, (list, tuple)) else [srcs]
    dsts = list(dsts) if isinstance(dsts, (list, tuple)) else [dsts]
    if len(srcs) != len(dsts):
        raise tr.fail(f"nki.collectives.{what}: {len(srcs)} sources but {len(dsts)} destinations")
    for src, dst in zip(srcs, dsts):
        if src.view.size != dst.view.size:
            raise tr.fail(f"nki.collectives.{what}: {src.name}{list(src.shape)} and {dst.name}{list(dst.shape)} differ "
                          "in size; over one rank every destination holds its source")
        tr.dma(dst.view, src.view if src.shape == dst.shape else src.reshape(dst.shape).view)


def all_reduce(srcs: Any, dsts: Any, replica_group: Any = None, op: Any = None, **kwargs: Any) -> None:
    """Reduce each source over the group's ranks into its destination (one rank: a copy)."""
    _check_group(replica_group, "all_reduce")
    _copy_each(srcs, dsts, "all_reduce")


def all_gather(srcs: Any, dsts: Any, replica_group: Any = None, collective_dim: int = 0, **kwargs: Any) -> None:
    """Concatenate each source over the group's ranks along ``collective_dim`` (one rank: a copy)."""
    _check_group(replica_group, "all_gather")
    _copy_each(srcs, dsts, "all_gather")


def reduce_scatter(srcs: Any, dsts: Any, replica_group: Any = None, collective_dim: int = 0, op: Any = None,
                   **kwargs: Any) -> None:
    """Reduce over the ranks and give each its slice (one rank: a copy)."""
    _check_group(replica_group, "reduce_scatter")
    _copy_each(srcs, dsts, "reduce_scatter")


def all_to_all(srcs: Any, dsts: Any, replica_group: Any = None, collective_dim: int = 0, **kwargs: Any) -> None:
    """Exchange slices between every pair of ranks (one rank: a copy)."""
    _check_group(replica_group, "all_to_all")
    _copy_each(srcs, dsts, "all_to_all")


def collective_permute(srcs: Any, dsts: Any, source_target_pairs: Any = ((0, 0),), **kwargs: Any) -> None:
    """Send each rank's sources to the paired rank (one rank: only the pair (0, 0))."""
    ranks = {int(r) for pair in source_target_pairs for r in pair}
    _check_group(ReplicaGroup([sorted(ranks)]), "collective_permute")
    _copy_each(srcs, dsts, "collective_permute")


def rank_id(name: str | None = None) -> int:
    """This core's rank: 0, the one rank of trnsim's world."""
    return 0


_METADATA = "its counts come from a metadata tensor at run time; " + _ONE_CORE
all_gather_v = Refused("nki.collectives.all_gather_v", _METADATA)
all_to_all_v = Refused("nki.collectives.all_to_all_v", _METADATA)
_CHANNELS = "channelled implicit permutes pair this rank with others; " + _ONE_CORE
collective_permute_implicit = Refused("nki.collectives.collective_permute_implicit", _CHANNELS)
collective_permute_implicit_reduce = Refused("nki.collectives.collective_permute_implicit_reduce", _CHANNELS)
collective_permute_implicit_current_processing_rank_id = Refused(
    "nki.collectives.collective_permute_implicit_current_processing_rank_id", _CHANNELS)

_SINGLE = "a world of one rank (trnsim simulates one NeuronCore); a group naming another rank is refused"
#: Documented names that trnsim implements with a difference (read by ``trnsim.nki.apitable``).
DIFFERENCES: dict[str, str] = {
    **{n: _SINGLE + "; costs one DMA per tensor" for n in
       ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")},
    "rank_id": "always 0: " + _SINGLE, "ReplicaGroup": _SINGLE,
}
