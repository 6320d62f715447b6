"""Collective algorithms as Neuron's collective library runs them: which one a message
size picks, and the steps each one takes.

An algorithm is a list of :class:`Step`; a step is a set of transfers every participant
makes at once, repeated ``repeat`` times (a ring's identical steps are one Step). A
transfer names the sender and the receiver by their position in the group and carries a
byte count; :mod:`trnsim.hw.fabric` maps positions to ranks, links and times. Sizes follow
the convention of nccl-tests: ``nbytes`` is the all-reduce buffer, the all-gather output,
the reduce-scatter input, one rank's all-to-all buffer, the broadcast or reduce buffer,
the gathered or scattered whole and the message of a send/recv.

Choice by size, from Neuron's intra-node collectives guide ("sweet range (empirically)"):
Mesh below 1 MB, recursive halving-doubling (RDH) from 1 MB to 56 MB, a ring above (the
guide's KangaRing, a ring with half the hops, is modelled as a ring). The two bounds are
figures of the chip file (``[fabric] mesh_max_kib``, ``rdh_max_kib``). RDH needs a group
of a power-of-two size; other groups use a ring. All-to-all, gather and scatter always run
as a mesh; broadcast and reduce as a mesh or a ring, whichever the model times faster
(assumption: the guide does not say).

A group with the same number of ranks (more than one) on each of several servers runs
hierarchically, as Neuron's inter-node guide describes: all-reduce as a reduce-scatter
inside each server, an all-reduce of the 1/Y shards between servers, an all-gather inside
each server; all-gather between servers first, reduce-scatter inside servers first (the
stage between servers moves the least data). Each stage picks its own algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

from trnsim.hw.spec import FabricSpec

#: A transfer: (sender position, receiver position, bytes).
Transfer = tuple[int, int, float]

#: The collectives a fabric times. ``send_recv`` is one message between two ranks.
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
         "gather", "scatter", "barrier", "send_recv")

#: Kinds that have a root rank.
ROOTED = ("broadcast", "reduce", "gather", "scatter")

#: Kinds that reduce what they receive (their fixed cost is ``[fabric] reduce_fixed_ns``).
REDUCING = ("all_reduce", "reduce_scatter", "reduce")


@dataclass(frozen=True)
class Step:
    """Transfers every participant makes at once; the step ends when the last one lands."""

    transfers: tuple[Transfer, ...]
    repeat: int = 1


def bus_factor(kind: str, r: int) -> float:
    """nccl-tests' factor from algorithm bandwidth (``nbytes / time``) to bus bandwidth:
    2(r-1)/r for all-reduce, (r-1)/r for all-gather, reduce-scatter, all-to-all, gather and
    scatter, 1 for broadcast, reduce and send/recv, 0 for a barrier (it moves no data)."""
    if kind == "barrier":
        return 0.0
    if kind in ("broadcast", "reduce", "send_recv"):
        return 1.0
    share = (r - 1) / r
    return 2 * share if kind == "all_reduce" else share


def candidates(kind: str, nbytes: float, r: int, spec: FabricSpec) -> tuple[str, ...]:
    """The algorithms Neuron's collective library would pick among for ``kind`` of
    ``nbytes`` over ``r`` ranks (one, except broadcast and reduce): ``local`` (one rank),
    ``p2p``, ``mesh``, ``rdh`` or ``ring``."""
    if r == 1:
        return ("local",)
    if kind == "send_recv":
        return ("p2p",)
    if kind in ("broadcast", "reduce"):
        return ("mesh", "ring")
    if kind in ("all_to_all", "gather", "scatter") or nbytes <= spec.mesh_max_kib * 1024:
        return ("mesh",)
    if nbytes <= spec.rdh_max_kib * 1024 and r & (r - 1) == 0:
        return ("rdh",)
    return ("ring",)


def hierarchical_stages(kind: str, nbytes: float, per_server: int) -> list[tuple[str, str, float]]:
    """The stages of ``kind`` run hierarchically with ``per_server`` ranks on each server:
    (kind, ``"local"`` inside each server or ``"inter"`` between servers, nbytes)."""
    shard = nbytes / per_server
    return {"all_reduce": [("reduce_scatter", "local", nbytes), ("all_reduce", "inter", shard),
                           ("all_gather", "local", nbytes)],
            "all_gather": [("all_gather", "inter", shard), ("all_gather", "local", nbytes)],
            "reduce_scatter": [("reduce_scatter", "local", nbytes), ("reduce_scatter", "inter", shard)]}[kind]


def _ring(chunk: float, r: int, repeat: int) -> Step:
    return Step(tuple((i, (i + 1) % r, chunk) for i in range(r)), repeat)


def _mesh(chunk: float, r: int) -> Step:
    return Step(tuple((i, j, chunk) for i in range(r) for j in range(r) if i != j))


def _rdh(nbytes: float, r: int, halving: bool) -> list[Step]:
    """Recursive halving (reduce-scatter) pairs nearest partners first with the most data,
    recursive doubling (all-gather) the farthest first with the least: the big exchanges
    stay inside a chip (Neuron's RDH reduces on chip before the inter-chip stage)."""
    bits = r.bit_length() - 1
    order = range(bits) if halving else reversed(range(bits))
    return [Step(tuple((i, i ^ (1 << k), nbytes / (2 << k)) for i in range(r))) for k in order]


def _to_root(chunk: float, r: int, root: int, inward: bool) -> Step:
    return Step(tuple((j, root, chunk) if inward else (root, j, chunk) for j in range(r) if j != root))


def steps(kind: str, algorithm: str, nbytes: float, r: int, root: int = 0,
          splits: tuple[tuple[int, ...], ...] | None = None) -> list[Step]:
    """The steps of ``kind`` run as ``algorithm`` over ``r`` positions (``root`` is a
    position; ``splits[i][j]`` the bytes position i sends to position j in an all-to-all)."""
    if algorithm == "local":
        return []
    chunk = nbytes / r
    if kind == "send_recv":
        return [Step(((0, 1, float(nbytes)),))]
    if kind == "all_to_all":
        if splits is None:
            return [_mesh(chunk, r)]
        return [Step(tuple((i, j, float(splits[i][j])) for i in range(r) for j in range(r) if i != j))]
    if kind in ("gather", "scatter"):
        return [_to_root(chunk, r, root, inward=kind == "gather")]
    if kind in ("broadcast", "reduce"):
        if algorithm == "mesh":
            return [_to_root(float(nbytes), r, root, inward=kind == "reduce")]
        if kind == "broadcast":  # scatter from the root, then a ring all-gather
            return [_to_root(chunk, r, root, inward=False), _ring(chunk, r, r - 1)]
        return [_ring(chunk, r, r - 1), _to_root(chunk, r, root, inward=True)]
    phases = {"all_reduce": (True, True), "barrier": (True, True),
              "reduce_scatter": (True, False), "all_gather": (False, True)}[kind]
    if algorithm == "ring":
        return [_ring(chunk, r, (r - 1) * sum(phases))]
    if algorithm == "mesh":
        return [Step(_mesh(chunk, r).transfers, sum(phases))]
    reduce_scatter, all_gather = phases
    return (_rdh(nbytes, r, True) if reduce_scatter else []) + (_rdh(nbytes, r, False) if all_gather else [])
