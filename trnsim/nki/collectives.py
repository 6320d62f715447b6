"""``nki.collectives``: communication between NeuronCores inside a kernel.

trnsim simulates one NeuronCore per kernel: a world of one rank. The collectives
keep their meaning there (an all-reduce, all-gather, reduce-scatter or all-to-all
over one rank gives each destination its source; a permute maps rank 0 to rank 0),
and each moves its data with one DMA per tensor. A replica group or permute that
names another rank is refused with a KernelError, as are the variants whose counts
come from a metadata tensor's values, which are known only when the kernel runs.
"""

from __future__ import annotations

from typing import Any, Sequence

from trnsim.nki import emit as _e
from trnsim.nki import language as nl
from trnsim.nki.refused import Refused
from trnsim.nki.tiles import NkiTensor

__all__ = ["ReplicaGroup", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute", "rank_id",
           "collective_permute_implicit", "collective_permute_implicit_reduce",
           "collective_permute_implicit_current_processing_rank_id"]

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


_METADATA = ("its per-rank counts are the values of a metadata tensor, known only when the kernel runs, and trnsim "
             "plans a kernel's transfers when it traces it; " + _ONE_CORE + ", so use all_gather/all_to_all")
all_gather_v = Refused("nki.collectives.all_gather_v", _METADATA)
all_to_all_v = Refused("nki.collectives.all_to_all_v", _METADATA)


def _by_channel(tensors: Any, what: str, arg: str) -> list[NkiTensor]:
    """One tensor per channel from NKI's ``[[t0], [t1], ...]`` (a bare tensor or flat list also accepted)."""
    items = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    out = []
    for ch, item in enumerate(items):
        inner = list(item) if isinstance(item, (list, tuple)) else [item]
        if len(inner) != 1 or not isinstance(inner[0], NkiTensor):
            raise _e.tracer().fail(f"nki.collectives.{what}: {arg}[{ch}] must be a list of exactly one tensor, "
                                   f"got {item!r}")
        out.append(inner[0])
    return out


def collective_permute_implicit(srcs_by_channel: Any, dsts_by_channel: Any, replica_group: Any = None,
                                channel_ids: Any = (0,), **kwargs: Any) -> None:
    """Send each channel's source to the next rank of the ring and receive the previous rank's
    (one rank: the ring pairs rank 0 with itself, so each destination receives its source)."""
    _check_group(replica_group, "collective_permute_implicit")
    srcs = _by_channel(srcs_by_channel, "collective_permute_implicit", "srcs_by_channel")
    dsts = _by_channel(dsts_by_channel, "collective_permute_implicit", "dsts_by_channel")
    _copy_each(srcs, dsts, "collective_permute_implicit")


def collective_permute_implicit_reduce(srcs0_by_channel: Any, srcs1_by_channel: Any, dsts_by_channel: Any,
                                       replica_group: Any = None, op: Any = None, channel_ids: Any = (0,),
                                       **kwargs: Any) -> None:
    """Reduce ``op(srcs0, srcs1)`` per channel, send it along the ring and receive the previous
    rank's result (one rank: each destination receives ``op`` of its own sources). Sources in
    HBM are loaded to SBUF, reduced there, and the result moved to the destination with one DMA."""
    what = "collective_permute_implicit_reduce"
    _check_group(replica_group, what)
    tr = _e.tracer()
    if op is None:
        raise tr.fail(f"nki.collectives.{what}: op is required (nl.add, nl.minimum or nl.maximum)")
    srcs0 = _by_channel(srcs0_by_channel, what, "srcs0_by_channel")
    srcs1 = _by_channel(srcs1_by_channel, what, "srcs1_by_channel")
    dsts = _by_channel(dsts_by_channel, what, "dsts_by_channel")
    if not len(srcs0) == len(srcs1) == len(dsts):
        raise tr.fail(f"nki.collectives.{what}: {len(srcs0)}, {len(srcs1)} and {len(dsts)} channels; give each "
                      "channel two sources and one destination")
    for a, b, dst in zip(srcs0, srcs1, dsts):
        a, b = (nl.load(t) if not t.view.tensor.on_chip else t for t in (a, b))
        reduced = op(a, b, dtype=dst.dtype)
        if reduced.view.size != dst.view.size:
            raise tr.fail(f"nki.collectives.{what}: the reduced sources have {reduced.view.size} elements, "
                          f"{dst.name}{list(dst.shape)} has {dst.view.size}")
        tr.dma(dst.view, reduced.view if reduced.shape == dst.shape else reduced.reshape(dst.shape).view)


def collective_permute_implicit_current_processing_rank_id(*args: Any, **kwargs: Any) -> int:
    """The rank whose data the current ring iteration processes: 0, the one rank of trnsim's world."""
    return 0


_SINGLE = "a world of one rank (trnsim simulates one NeuronCore); a group naming another rank is refused"
#: Documented names that trnsim implements with a difference (read by ``trnsim.nki.apitable``).
DIFFERENCES: dict[str, str] = {
    **{n: _SINGLE + "; costs one DMA per tensor" for n in
       ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")},
    "rank_id": "always 0: " + _SINGLE, "ReplicaGroup": _SINGLE,
    "collective_permute_implicit": "the ring of one rank pairs rank 0 with itself: " + _SINGLE
                                   + "; costs one DMA per channel",
    "collective_permute_implicit_reduce": "the ring of one rank pairs rank 0 with itself, so each destination "
                                          "receives op of its own two sources (loaded to SBUF, reduced by one vector "
                                          "instruction, one DMA out): " + _SINGLE,
    "collective_permute_implicit_current_processing_rank_id": "always 0: " + _SINGLE,
}
