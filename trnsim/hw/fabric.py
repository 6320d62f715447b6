"""The fabric timing model: instances, where ranks run, and what a collective costs.

An :class:`Instance` is one ``[[instance]]`` of a chip file (``trn2.48xlarge``: 16
Trainium2 chips on a 4x4 torus; ``trn2-ultraserver``: four of them joined by NeuronLink
rings). A job of ``world_size`` ranks runs on ``nodes`` servers; ranks fill the logical
NeuronCores of a chip, then the next chip, then the next server, as torchrun and the
Neuron runtime place them (:func:`place`). Servers of one UltraServer talk over NeuronLink,
other servers over EFA.

:class:`Fabric` times collectives. A collective runs as the algorithm Neuron's collective
library picks for its size (:mod:`trnsim.hw.fabric_algorithms`); each step costs the
slowest hop latency among its transfers plus the time the busiest link needs for its
bytes. Links: the sender's collective DMA (``[fabric] collective_dma_gbps`` per
physical core: every transfer passes it), a chip's internal path (ranks on one chip), a
chip's NeuronLink ports (pooled, each direction; on a torus a transfer counts once per hop
it travels), a chip's ports to other servers of its UltraServer, and a server's EFA. A
collective adds a fixed cost: ``[fabric] reduce_fixed_ns`` for those that reduce
(all-reduce, reduce-scatter, reduce), ``collective_fixed_ns`` for the others. Groups spread evenly over several servers run
hierarchically (inside servers, then between them). :meth:`Fabric.collective` books the
links on a shared timeline, so collectives that overlap in simulated time share them
(:mod:`trnsim.hw.fabric_links`); :meth:`Fabric.estimate` times one on an idle fabric.
Times are nanoseconds, bandwidths GB/s (one byte per ns).
"""

from __future__ import annotations

import difflib
import math
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass

from trnsim.errors import ConfigError
from trnsim.hw import fabric_algorithms as algos
from trnsim.hw.fabric_links import LinkTimeline
from trnsim.hw.spec import ChipSpec, InstanceSpec, load_chip, shipped_chips
from trnsim.units import Nanos

_TORI = ("torus2d", "ultraserver")
_TOPOLOGIES = ("single", *_TORI, "switch")
_COST_CACHE = 1024

# A link: its kind and the chip or server it belongs to (``("nl-out", 3)``).
_Link = tuple[str, int]
# A transfer's route: tier, hop latency (ns) and (link, ns busy per byte sent).
_Route = tuple[str, float, list[tuple[_Link, float]]]
# One step of a collective's plan: (repeat, hop latency ns, {link: ns busy}).
_PlanStep = tuple[int, float, dict[_Link, float]]
# all_to_all splits: row i holds the bytes rank i sends to each rank.
_Splits = tuple[tuple[int, ...], ...]
# A collective's cost: (algorithm, tier, plan, wire bytes, duration ns).
_Cost = tuple[str, str, list[_PlanStep], float, float]


@dataclass(frozen=True)
class Instance:
    """An instance (or UltraServer) of one chip: the chip's figures and its wiring."""

    chip: ChipSpec
    spec: InstanceSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def cores_per_chip(self) -> int:
        """Logical NeuronCores per chip (ranks one chip holds)."""
        return self.chip.logical_cores_per_chip

    @property
    def cores_per_server(self) -> int:
        """Logical NeuronCores per server (ranks one torchrun node holds at most)."""
        return self.cores_per_chip * self.spec.chips_per_server

    @property
    def cores(self) -> int:
        """Logical NeuronCores of the whole instance (all its servers)."""
        return self.cores_per_chip * self.spec.chips


def instances() -> dict[str, Instance]:
    """Every instance of the shipped chips, by name."""
    found: dict[str, Instance] = {}
    for name in shipped_chips():
        chip = load_chip(name)
        found.update({i.name: Instance(chip, i) for i in chip.instances})
    return found


def instance(name: str | Instance, chip: str | os.PathLike[str] | ChipSpec | None = None) -> Instance:
    """The instance called ``name`` (``"trn2.48xlarge"``): from the shipped chip files, or
    from ``chip`` (a chip name, a what-if chip file, a ChipSpec) when given."""
    if isinstance(name, Instance):
        return name
    known = instances() if chip is None else {i.name: Instance(spec, i) for spec in [load_chip(chip)]
                                               for i in spec.instances}
    if not isinstance(name, str) or name not in known:
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown instance {str(name)[:80]!r}; {hint}pass one of: {', '.join(known)}")
    return known[name]


@dataclass(frozen=True)
class Placement:
    """Where one rank runs. ``chip`` counts chips across the job, ``server`` is the torchrun
    node, ``domain`` the NeuronLink domain (the instance or UltraServer) it belongs to."""

    rank: int
    local_rank: int
    core: int
    chip: int
    chip_in_server: int
    server: int
    domain: int


@dataclass(frozen=True)
class CollectiveTiming:
    """One timed collective. ``tier`` is the slowest path it crosses (``chip``,
    ``neuronlink``, ``ultraserver``, ``efa``; ``none`` for one rank), ``wire_bytes`` the
    bytes all participants send, ``bus_bw_gbps`` nccl-tests' bus bandwidth."""

    kind: str
    algorithm: str
    ranks: tuple[int, ...]
    nbytes: int
    start_ns: Nanos
    end_ns: Nanos
    tier: str
    steps: int
    wire_bytes: float
    bus_bw_gbps: float

    @property
    def duration_ns(self) -> Nanos:
        return self.end_ns - self.start_ns

    @property
    def participants(self) -> int:
        return len(self.ranks)

    @property
    def alg_bw_gbps(self) -> float:
        """``nbytes`` over the duration (GB/s); 0 when it takes no time."""
        return self.nbytes / self.duration_ns if self.duration_ns > 0 else 0.0


def _count(value: object, what: str, fix: str, low: int = 0) -> int:
    """``value`` as an int (numpy integers too) if it is a whole number >= ``low``."""
    try:
        count = operator.index(value)  # type: ignore[arg-type]  # any value: a TypeError says it is no whole number
    except TypeError:
        count = None
    if isinstance(value, bool) or count is None or count < low:
        raise ConfigError(f"{what} is {value!r}; {fix}")
    return count


def place(rank: int, world_size: int, instance_name: str | Instance = "trn2.48xlarge", *,
          nodes: int | None = None, nproc_per_node: int | None = None) -> Placement:
    """Where ``rank`` of a ``world_size`` job runs on ``nodes`` servers of an instance."""
    return Fabric(instance_name, world_size, nodes=nodes, nproc_per_node=nproc_per_node).place(rank)


class Fabric:
    """The collectives fabric of a job: ``world_size`` ranks on ``nodes`` servers of
    ``instance`` (default: the instance's own servers, one or an UltraServer's four),
    ``nproc_per_node`` ranks each (default: the world split evenly over the nodes)."""

    def __init__(self, instance_name: str | Instance, world_size: int, *, nodes: int | None = None,
                 nproc_per_node: int | None = None) -> None:
        self.instance = inst = instance(instance_name)
        if inst.spec.topology not in _TOPOLOGIES or (inst.spec.topology in _TORI and len(inst.spec.shape) < 2):
            raise ConfigError(f"instance {inst.name} has topology {inst.spec.topology!r} and shape "
                              f"{list(inst.spec.shape)}; the fabric model knows {', '.join(_TOPOLOGIES)}, "
                              "a torus with a shape of at least [rows, columns]")
        self.world_size = world_size = _count(world_size, "world size", "pass a whole number of ranks >= 1", 1)
        self.nodes = inst.spec.servers if nodes is None else _count(
            nodes, "nodes", "pass a whole number of servers >= 1", 1)
        per_node = math.ceil(world_size / self.nodes) if nproc_per_node is None else _count(
            nproc_per_node, "nproc_per_node", "pass a whole number of ranks per server >= 1", 1)
        if per_node > inst.cores_per_server or world_size > self.nodes * per_node:
            raise ConfigError(
                f"world size {world_size} does not fit {self.nodes} {inst.name} server(s) of "
                f"{inst.cores_per_server} logical NeuronCores each ({per_node} ranks per server asked); "
                f"pass nodes={math.ceil(world_size / inst.cores_per_server)} (servers joined by "
                f"{'NeuronLink and ' if inst.spec.servers > 1 else ''}EFA) or a smaller world size")
        self.nproc_per_node = per_node
        self._placements = [self._place(r) for r in range(world_size)]
        self._links: dict[tuple[str, int], LinkTimeline] = {}
        self._routes: dict[tuple[int, int], _Route] = {}
        # a job repeats its collectives
        self._costs: dict[tuple[str, str, int, tuple[int, ...], int | None, _Splits | None], _Cost] = {}

    def _place(self, rank: int) -> Placement:
        server, local = divmod(rank, self.nproc_per_node)
        chip_in_server, core = divmod(local, self.instance.cores_per_chip)
        return Placement(rank, local, core, server * self.instance.spec.chips_per_server + chip_in_server,
                         chip_in_server, server, server // self.instance.spec.servers)

    def place(self, rank: int) -> Placement:
        """Where ``rank`` runs: consecutive ranks fill a chip's logical cores, then the next chip."""
        self._check_rank(rank)
        return self._placements[rank]

    def _check_rank(self, rank: object) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank!r} is not in this job; pass a rank from 0 to {self.world_size - 1}")

    # -- wiring ------------------------------------------------------------------------------

    def _hops(self, a: Placement, b: Placement) -> int:
        """NeuronLink hops between two chips of one server (shortest way round a torus)."""
        if self.instance.spec.topology not in _TORI:
            return 1
        rows, cols = self.instance.spec.shape[-2:]
        (ra, ca), (rb, cb) = divmod(a.chip_in_server, cols), divmod(b.chip_in_server, cols)
        dr, dc = abs(ra - rb), abs(ca - cb)
        return min(dr, rows - dr) + min(dc, cols - dc)

    def _route(self, a: Placement, b: Placement) -> _Route:
        """The tier, hop latency and (link, ns busy per byte sent) of one transfer a -> b;
        every transfer also passes the sender's collective DMA."""
        chip, link, fab = self.instance.chip, self.instance.spec, self.instance.chip.fabric
        dma = (("cc-dma", a.rank), 1 / (fab.collective_dma_gbps * chip.logical_core_size))
        if a.chip == b.chip:
            return "chip", fab.intra_chip_hop_latency_ns, [dma, (("chip", a.chip), 1 / fab.intra_chip_bw_gbps)]
        if a.server == b.server:
            per = self._hops(a, b) / (link.link_bw_gbps or chip.neuronlink.chip_bw_gbps)
            return ("neuronlink", chip.neuronlink.hop_latency_ns,
                    [dma, (("nl-out", a.chip), per), (("nl-in", b.chip), per)])
        if a.domain == b.domain:
            per = 1 / link.inter_server_bw_gbps
            return ("ultraserver", chip.neuronlink.inter_instance_hop_latency_ns,
                    [dma, (("us-out", a.chip), per), (("us-in", b.chip), per)])
        if link.efa_bw_gbps == 0:
            raise ConfigError(f"instance {link.name} has no EFA (efa_bw_gbps = 0), so ranks {a.rank} and {b.rank} "
                              "on different servers cannot talk; use an instance with EFA or one server")
        per = 1 / link.efa_bw_gbps
        return "efa", fab.efa_hop_latency_ns, [dma, (("efa-out", a.server), per), (("efa-in", b.server), per)]

    def _ring_order(self, ranks: Sequence[int]) -> list[int]:
        """Ranks in the order a ring visits them: server by server, chips of a torus in a
        snake (each row reversed after the last), so every hop joins neighbours."""
        cols = self.instance.spec.shape[-1] if self.instance.spec.topology in _TORI else 1

        def key(rank: int) -> tuple[int, int, int]:
            p = self._placements[rank]
            row, col = divmod(p.chip_in_server, cols)
            return p.server, row * cols + (cols - 1 - col if row % 2 else col), p.core
        return sorted(ranks, key=key)

    # -- timing ------------------------------------------------------------------------------

    def _check(self, kind: str, nbytes: int, ranks: Sequence[int] | None, root: int | None,
               splits: Sequence[Sequence[int]] | None) -> tuple[tuple[int, ...], int, _Splits | None]:
        if kind not in algos.KINDS:
            close = difflib.get_close_matches(str(kind), algos.KINDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"unknown collective {str(kind)[:80]!r}; {hint}pass one of: {', '.join(algos.KINDS)}")
        nbytes = _count(nbytes, f"{kind} size nbytes", "pass a whole number of bytes >= 0")
        group = tuple(range(self.world_size)) if ranks is None else tuple(ranks)
        for rank in group:
            self._check_rank(rank)
        if not group or len(set(group)) != len(group):
            raise ConfigError(f"{kind} ranks {list(group)[:16]} must be distinct and at least one; pass each rank once")
        if kind == "send_recv" and len(group) != 2:
            raise ConfigError(f"send_recv takes ranks (sender, receiver), not {list(group)[:16]}; pass two ranks")
        if kind in algos.ROOTED:
            if root is None or root not in group:
                raise ConfigError(f"{kind} root {root!r} is not one of its ranks {list(group)[:16]}; pass root=<rank>")
        elif root is not None:
            raise ConfigError(f"{kind} has no root (root={root!r}); leave root out")
        if splits is None:
            return group, nbytes, None
        if kind != "all_to_all":
            raise ConfigError(f"splits are for all_to_all, not {kind}; leave splits out")
        r = len(group)
        bad = ConfigError(f"all_to_all splits must be {r} rows of {r} byte counts >= 0 (row i: the bytes rank i "
                          f"sends to each rank); got {str(splits)[:120]}")
        try:
            rows = tuple(tuple(_count(b, "", "") for b in row) for row in splits)
        except (ConfigError, TypeError):
            raise bad from None
        if len(rows) != r or any(len(row) != r for row in rows):
            raise bad
        largest = max(sum(row) for row in rows)
        if nbytes != largest:
            raise ConfigError(f"all_to_all nbytes is {nbytes} but the largest rank's splits add up to {largest}; "
                              f"pass nbytes={largest}")
        return group, nbytes, rows

    def _plan(self, kind: str, nbytes: int, ranks: Sequence[int] | None, root: int | None,
              splits: Sequence[Sequence[int]] | None) -> tuple[str, tuple[int, ...], int, str, list[_PlanStep], float, float]:
        """Algorithm, group, byte count, tier, per-step (repeat, latency, {link: busy ns}), wire bytes and
        the idle duration (fixed cost included) of one collective: the fastest candidate."""
        group, nbytes, rows = self._check(kind, nbytes, ranks, root, splits)
        names = ("hierarchical",) if self._servers(kind, group) else algos.candidates(
            kind, nbytes, len(group), self.instance.chip.fabric)
        algorithm, tier, plan, wire, duration = min(
            (self._cost(kind, name, nbytes, group, root, rows) for name in names), key=lambda p: p[-1])
        return algorithm, group, nbytes, tier, plan, wire, duration

    def _servers(self, kind: str, group: tuple[int, ...]) -> list[list[int]]:
        """The group's ranks server by server, where it runs hierarchically; else []."""
        by_server: dict[int, list[int]] = {}
        for rank in sorted(group):
            by_server.setdefault(self._placements[rank].server, []).append(rank)
        sizes = {len(ranks) for ranks in by_server.values()}
        fits = kind in ("all_reduce", "all_gather", "reduce_scatter") and len(by_server) > 1
        return list(by_server.values()) if fits and len(sizes) == 1 and sizes.pop() > 1 else []

    def _cost(self, kind: str, algorithm: str, nbytes: int, group: tuple[int, ...], root: int | None,
              rows: _Splits | None) -> _Cost:
        key = (kind, algorithm, nbytes, group, root, rows)
        if key not in self._costs:
            if len(self._costs) >= _COST_CACHE:
                self._costs.pop(next(iter(self._costs)))
            if algorithm == "hierarchical":
                name, rank_steps = self._hierarchical(kind, nbytes, self._servers(kind, group))
            else:
                name, rank_steps = algorithm, self._rank_steps(kind, algorithm, nbytes, group, root, rows)
            self._costs[key] = (name, *self._steps_cost(kind, rank_steps))
        return self._costs[key]

    def _rank_steps(self, kind: str, algorithm: str, nbytes: float, group: Sequence[int], root: int | None,
                    rows: _Splits | None) -> list[algos.Step]:
        """The algorithm's steps with positions turned into ranks (a ring in ring order)."""
        order = self._ring_order(group) if algorithm == "ring" else list(group)
        if rows is not None:
            rows = tuple(tuple(rows[group.index(a)][group.index(b)] for b in order) for a in order)
        at = order.index(root) if root is not None else 0
        return [algos.Step(tuple((order[s], order[d], size) for s, d, size in step.transfers), step.repeat)
                for step in algos.steps(kind, algorithm, nbytes, len(group), at, rows)]

    def _hierarchical(self, kind: str, nbytes: int, servers: list[list[int]]) -> tuple[str, list[algos.Step]]:
        """Stages inside servers and between them; parallel groups of a stage step together."""
        names, merged = [], []
        for stage_kind, where, size in algos.hierarchical_stages(kind, nbytes, len(servers[0])):
            groups = servers if where == "local" else [list(g) for g in zip(*servers)]
            (name,) = algos.candidates(stage_kind, size, len(groups[0]), self.instance.chip.fabric)
            names.append(name)
            per_group = [self._rank_steps(stage_kind, name, size, g, None, None) for g in groups]
            merged += [algos.Step(sum((s.transfers for s in parallel), ()), parallel[0].repeat)
                       for parallel in zip(*per_group)]
        return f"hierarchical:{'+'.join(names)}", merged

    def _steps_cost(self, kind: str, rank_steps: list[algos.Step]) -> tuple[str, list[_PlanStep], float, float]:
        tiers = ("none", "chip", "neuronlink", "ultraserver", "efa")
        tier, wire, duration = "none", 0.0, 0.0
        plan: list[_PlanStep] = []
        for step in rank_steps:
            latency = 0.0
            load: dict[_Link, float] = {}
            for src, dst, size in step.transfers:
                if (src, dst) not in self._routes:
                    self._routes[src, dst] = self._route(self._placements[src], self._placements[dst])
                name, hop, links = self._routes[src, dst]
                tier = max(tier, name, key=tiers.index)
                latency = max(latency, hop)
                wire += size * step.repeat
                for link, per_byte in links:
                    load[link] = load.get(link, 0.0) + size * per_byte
            plan.append((step.repeat, latency, load))
            duration += step.repeat * (latency + max(load.values(), default=0.0))
        if plan:
            fab = self.instance.chip.fabric
            duration += fab.reduce_fixed_ns if kind in algos.REDUCING else fab.collective_fixed_ns
        return tier, plan, wire, duration

    def _timing(self, kind: str, nbytes: int, group: tuple[int, ...], algorithm: str, tier: str, plan: list[_PlanStep],
                wire: float, start: Nanos, end: Nanos) -> CollectiveTiming:
        duration = end - start
        bus = nbytes / duration * algos.bus_factor(kind, len(group)) if duration > 0 else 0.0
        return CollectiveTiming(kind, algorithm, group, nbytes, start, end, tier, sum(s[0] for s in plan), wire, bus)

    @staticmethod
    def _start(start_ns: Nanos | Sequence[Nanos]) -> Nanos:
        starts = [start_ns] if isinstance(start_ns, (int, float)) else list(start_ns)
        if not starts or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < math.inf
                             for t in starts):
            raise ConfigError(f"start_ns {str(start_ns)[:80]} is not a time; pass ns >= 0, or each rank's clock")
        return float(max(starts))

    def estimate(self, kind: str, nbytes: int, ranks: Sequence[int] | None = None, *, root: int | None = None,
                 splits: Sequence[Sequence[int]] | None = None, start_ns: Nanos | Sequence[Nanos] = 0.0,
                 ) -> CollectiveTiming:
        """Time one collective on an idle fabric, booking nothing. ``ranks``: the group (all
        ranks by default); ``root``: the root rank of broadcast, reduce, gather, scatter;
        ``splits[i][j]``: bytes the i-th rank of the group sends the j-th in an all_to_all
        (then ``nbytes`` is the largest row's sum); ``start_ns``: when it starts, or each
        participant's clock (it starts when the last one arrives)."""
        start = self._start(start_ns)
        algorithm, group, nbytes, tier, plan, wire, duration = self._plan(kind, nbytes, ranks, root, splits)
        return self._timing(kind, nbytes, group, algorithm, tier, plan, wire, start, start + duration)

    def collective(self, kind: str, nbytes: int, ranks: Sequence[int] | None = None, *, root: int | None = None,
                   splits: Sequence[Sequence[int]] | None = None, start_ns: Nanos | Sequence[Nanos] = 0.0,
                   ) -> CollectiveTiming:
        """Time one collective and book its links (arguments as :meth:`estimate`). A link
        that collectives booked before is shared: this one gets its free time, so it ends no
        earlier than on an idle fabric and later where the links are busy."""
        start = self._start(start_ns)
        algorithm, group, nbytes, tier, plan, wire, duration = self._plan(kind, nbytes, ranks, root, splits)
        busy: dict[tuple[str, int], float] = {}
        for repeat, _, load in plan:
            for link, ns in load.items():
                busy[link] = busy.get(link, 0.0) + repeat * ns
        end = start + duration
        for link in sorted(busy):
            end = max(end, self._links.setdefault(link, LinkTimeline()).occupy(start, busy[link]))
        return self._timing(kind, nbytes, group, algorithm, tier, plan, wire, start, end)

    def link_busy(self) -> dict[tuple[str, int], list[tuple[Nanos, Nanos]]]:
        """Every booked link (``("nl-out", chip)``, ``("efa-in", server)``, ...) and its busy intervals."""
        return {link: timeline.busy() for link, timeline in sorted(self._links.items())}

    def reset(self) -> None:
        """Forget every booking (a new job on the same fabric)."""
        self._links.clear()
