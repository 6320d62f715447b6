"""The fabric timing model: placement, algorithm choice, exact collective times worked out
by hand from the chip files' figures, links shared by concurrent collectives, bad input.

The link arithmetic is checked on what-if chips whose collective DMA is never the limit
and whose fixed cost is one figure for every kind (``_links``); the shipped chips' DMA
limit and fixed costs, fitted to nccom-test's tables, are checked in tests/test_validate.py."""

from __future__ import annotations

import math

import pytest

from trnsim.errors import ConfigError
from trnsim.hw import fabric_algorithms as algos
from trnsim.hw.fabric import Fabric, instance, instances, place
from trnsim.hw.fabric_links import LinkTimeline
from trnsim.hw.spec import load_chip

MiB = 1 << 20
FIXED = 2000.0          # [fabric] collective_fixed_ns and reduce_fixed_ns of the what-if chips
HOP = 1500.0            # [neuronlink] hop_latency_ns
CHIP_HOP = 500.0        # [fabric] intra_chip_hop_latency_ns
ROW = [0, 4, 8, 12]     # one rank on each chip of the first torus row of a trn2.48xlarge


_WHAT_IF: dict[str, str] = {}


def _links(name: str, world_size: int, **kwargs) -> Fabric:
    """A fabric of instance ``name`` whose chip has the shipped links, a collective DMA too
    fast to matter and a fixed cost of FIXED for every collective."""
    chip = instance(name).chip.name
    if chip not in _WHAT_IF:
        import tempfile
        from pathlib import Path

        path = Path(tempfile.mkdtemp()) / f"{chip}-links.toml"
        path.write_text(f'extends = "{chip}"\n[fabric]\ncollective_fixed_ns = {FIXED}\nreduce_fixed_ns = {FIXED}\n'
                        "collective_dma_gbps = 1000000\n")
        _WHAT_IF[chip] = str(path)
    return Fabric(instance(name, chip=_WHAT_IF[chip]), world_size, **kwargs)


@pytest.fixture
def trn2() -> Fabric:
    return _links("trn2.48xlarge", 64)


# -- instances and placement ----------------------------------------------------------------

def test_instances_come_from_the_chip_files():
    names = instances()
    assert {"trn1.32xlarge", "trn2.48xlarge", "trn2-ultraserver", "trn3.48xlarge"} <= set(names)
    trn2 = instance("trn2.48xlarge")
    assert (trn2.spec.chips, trn2.spec.topology, trn2.spec.shape) == (16, "torus2d", (4, 4))
    assert (trn2.cores_per_chip, trn2.cores_per_server, trn2.cores) == (4, 64, 64)  # LNC=2
    ultra = instance("trn2-ultraserver")
    assert (ultra.spec.servers, ultra.spec.chips_per_server, ultra.cores) == (4, 16, 256)
    assert instance("trn1.32xlarge").cores == 32 and instance("trn3.48xlarge").spec.topology == "switch"
    assert load_chip("trn2").fabric.mesh_max_kib == 1024


def test_64_ranks_fill_the_chips_of_a_trn2_48xlarge_in_order(trn2):
    for rank in range(64):
        p = trn2.place(rank)
        assert (p.chip, p.core, p.server, p.domain, p.local_rank) == (rank // 4, rank % 4, 0, 0, rank)
    assert place(63, 64).chip == 15
    assert place(5, 32, "trn1.32xlarge").chip == 2  # two logical cores per Trainium1


def test_placement_across_servers():
    ultra = _links("trn2-ultraserver", 256)
    p = ultra.place(64)
    assert (p.server, p.domain, p.chip, p.chip_in_server, p.local_rank) == (1, 0, 16, 0, 0)
    two = _links("trn2.48xlarge", 16, nodes=2, nproc_per_node=8)  # torchrun --nnodes 2 --nproc-per-node 8
    p = two.place(8)
    assert (p.server, p.domain, p.chip, p.chip_in_server, p.core) == (1, 1, 16, 0, 0)
    assert two.place(7).chip == 1


def test_a_what_if_chip_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('extends = "trn2"\n[fabric]\ncollective_fixed_ns = 0\ncollective_dma_gbps = 1000000\n'
                    '[[instance]]\nname = "wide"\nchips = 4\ntopology = "switch"\nshape = [4]\n'
                    'link_bw_gbps = 2048\n')
    f = Fabric(instance("wide", chip=path), 16)
    assert f.estimate("send_recv", 2048, [0, 4]).duration_ns == HOP + 1.0
    ring = tmp_path / "ring.toml"
    ring.write_text('extends = "trn2"\n[[instance]]\nname = "r"\nchips = 2\ntopology = "ring"\nshape = [2]\n')
    with pytest.raises(ConfigError, match=r"topology 'ring' and shape \[2\]; the fabric model knows single"):
        Fabric(instance("r", chip=ring), 2)


# -- exact times --------------------------------------------------------------------------

def test_ring_all_reduce_over_four_chips(trn2):
    n = 64 * MiB  # above RDH's 56 MB: a ring
    t = trn2.estimate("all_reduce", n, ROW)
    step = HOP + (n / 4) / 1024  # a chunk of n/4 bytes over one 1,024 GB/s hop
    assert t.algorithm == "ring" and t.tier == "neuronlink" and t.steps == 6
    assert t.duration_ns == FIXED + 2 * (4 - 1) * step == 109304.0
    assert t.wire_bytes == 2 * (4 - 1) * n
    assert t.bus_bw_gbps == pytest.approx(n / t.duration_ns * 2 * 3 / 4, rel=1e-12)
    assert t.participants == 4 and t.alg_bw_gbps == pytest.approx(n / 109304.0, rel=1e-12)


def test_ring_all_reduce_over_a_trn1_torus():
    f = _links("trn1.32xlarge", 32)
    ranks = list(range(0, 32, 2))  # one per chip; the ring snakes the 4x4 torus, every hop a neighbour
    chunk = 384 * (1 << 16)        # 384 GB/s moves it in 65,536 ns
    t = f.estimate("all_reduce", 16 * chunk, ranks)
    assert t.algorithm == "ring" and t.steps == 30
    assert t.duration_ns == FIXED + 30 * (HOP + 65536) == 2013080.0


def test_mesh_all_gather_counts_routed_hops(trn2):
    # each chip sends 16 KiB to three chips of its torus row, one of them two hops away
    t = trn2.estimate("all_gather", 64 * 1024, ROW)
    assert t.algorithm == "mesh" and t.steps == 1
    assert t.duration_ns == FIXED + HOP + 16384 * (1 + 2 + 1) / 1024 == 3564.0


def test_rdh_all_reduce(trn2):
    # halving: 2 MiB to the neighbour, 1 MiB two hops away; doubling the reverse; 2,048 ns each
    t = trn2.estimate("all_reduce", 4 * MiB, ROW)
    assert t.algorithm == "rdh" and t.steps == 4
    assert t.duration_ns == FIXED + 4 * (HOP + 2048) == 16192.0


def test_ring_inside_one_chip_uses_the_chip_path(trn2):
    n = 64 * MiB
    t = trn2.estimate("all_reduce", n, [0, 1, 2, 3])
    bw = load_chip("trn2").fabric.intra_chip_bw_gbps
    assert t.tier == "chip" and t.algorithm == "ring"
    assert t.duration_ns == pytest.approx(FIXED + 6 * (CHIP_HOP + 4 * (n / 4) / bw), rel=1e-12)


def test_switch_has_no_routed_hops():
    f = _links("trn3.48xlarge", 128)  # 8 logical cores per Trainium3 (LNC=1)
    t = f.estimate("all_to_all", 16 * 64 * 1024, list(range(0, 128, 8)))
    assert t.algorithm == "mesh"
    assert t.duration_ns == FIXED + HOP + 15 * 64 * 1024 / 2048 == 3980.0


def test_send_recv_intra_chip_inter_chip_inter_server_and_efa(trn2):
    n = MiB
    chip = trn2.estimate("send_recv", n, [0, 1])
    link = trn2.estimate("send_recv", n, [0, 4])
    ultra = _links("trn2-ultraserver", 256).estimate("send_recv", n, [0, 64])
    efa = _links("trn2.48xlarge", 128, nodes=2).estimate("send_recv", n, [0, 64])
    assert [t.tier for t in (chip, link, ultra, efa)] == ["chip", "neuronlink", "ultraserver", "efa"]
    assert chip.duration_ns == pytest.approx(FIXED + CHIP_HOP + n / 1450, rel=1e-12)
    assert link.duration_ns == FIXED + HOP + n / 1024 == 4524.0
    assert ultra.duration_ns == FIXED + 3000 + n / 256 == 9096.0
    assert efa.duration_ns == pytest.approx(FIXED + 15000 + n / 400, rel=1e-12)
    assert chip.duration_ns < link.duration_ns < ultra.duration_ns < efa.duration_ns
    assert link.bus_bw_gbps == pytest.approx(n / 4524.0, rel=1e-12)


def test_groups_across_servers_run_hierarchically():
    f = _links("trn2.48xlarge", 128, nodes=2)  # two servers joined by EFA (400 GB/s each way)
    n = 128 * MiB
    t = f.estimate("all_reduce", n, [0, 4, 64, 68])  # two chips on each server
    inside = HOP + (n / 2) / 1024                    # a 2-rank ring step over one NeuronLink hop
    between = 15000 + 2 * (n / 4) / 400              # both ranks' shards share the server's EFA
    assert t.algorithm == "hierarchical:ring+ring+ring" and t.tier == "efa" and t.steps == 4
    assert t.duration_ns == pytest.approx(FIXED + 2 * inside + 2 * between, rel=1e-12)
    assert f.estimate("all_gather", 4 * MiB).algorithm == "hierarchical:mesh+rdh"  # between servers first
    assert f.estimate("reduce_scatter", 4 * MiB).algorithm == "hierarchical:rdh+mesh"
    assert f.estimate("all_reduce", n, [0, 4, 64]).algorithm == "ring"  # unequal servers: one flat ring
    assert f.estimate("all_reduce", n, [0, 64]).algorithm == "ring"     # one rank per server: flat


def test_all_to_all_with_unequal_splits(trn2):
    splits = [[0, 2 * MiB], [MiB, 0]]
    t = trn2.estimate("all_to_all", 2 * MiB, [0, 4], splits=splits)
    assert t.duration_ns == FIXED + HOP + 2 * MiB / 1024 == 5548.0
    assert t.wire_bytes == 3 * MiB


def test_rooted_collectives(trn2):
    n = 64 * 1024
    gather = trn2.estimate("gather", 4 * n, ROW, root=8)  # three chunks into the root's chip, 1+2+1 hops
    assert gather.algorithm == "mesh" and gather.duration_ns == FIXED + HOP + n * 4 / 1024
    assert trn2.estimate("scatter", 4 * n, ROW, root=8).duration_ns == gather.duration_ns
    small, large = trn2.estimate("broadcast", 1024, root=0), trn2.estimate("broadcast", 64 * MiB, root=0)
    assert (small.algorithm, large.algorithm) == ("mesh", "ring")
    assert trn2.estimate("reduce", 64 * MiB, root=3).algorithm == "ring"


def test_barrier_and_single_rank(trn2):
    barrier = trn2.estimate("barrier", 0, ROW)
    assert barrier.algorithm == "mesh" and barrier.duration_ns == FIXED + 2 * HOP
    assert barrier.bus_bw_gbps == 0.0
    alone = trn2.estimate("all_reduce", MiB, [5])
    assert (alone.algorithm, alone.duration_ns, alone.tier, alone.bus_bw_gbps) == ("local", 0.0, "none", 0.0)


# -- algorithm choice -----------------------------------------------------------------------

@pytest.mark.parametrize("nbytes, ranks, algorithm", [
    (1024, 64, "mesh"), (MiB, 64, "mesh"), (MiB + 1, 64, "rdh"), (56 * MiB, 64, "rdh"),
    (56 * MiB + 1, 64, "ring"), (1 << 30, 64, "ring"), (4 * MiB, 48, "ring"), (4 * MiB, 2, "rdh"),
])
def test_algorithm_by_message_size(trn2, nbytes, ranks, algorithm):
    assert trn2.estimate("all_reduce", nbytes, range(ranks)).algorithm == algorithm


def test_small_messages_are_latency_bound_large_ones_approach_a_link_limit(trn2):
    times = [trn2.estimate("all_reduce", 1 << k, ROW).duration_ns for k in (4, 8, 12)]
    assert max(times) - min(times) < 0.05 * min(times)  # flat
    bus = [trn2.estimate("all_reduce", 1 << k, ROW).bus_bw_gbps for k in (20, 26, 30)]
    assert bus == sorted(bus) and 0.95 * 1024 < bus[-1] < 1024


# -- links shared by concurrent collectives ------------------------------------------------

def test_overlapping_collectives_share_links(trn2):
    n = 64 * MiB
    first = trn2.collective("all_reduce", n, ROW)
    second = trn2.collective("all_reduce", n, ROW)
    busy = 6 * (n / 4) / 1024  # each link carries six chunks per all-reduce
    assert first.end_ns == 109304.0
    assert second.end_ns == 2 * busy == 196608.0  # waits for the link time the first one took
    elsewhere = trn2.collective("all_reduce", n, [16, 20, 24, 28])  # the torus's second row
    assert elsewhere.end_ns == 109304.0
    later = trn2.collective("all_reduce", n, ROW, start_ns=300000.0)
    assert later.duration_ns == 109304.0
    assert trn2.estimate("all_reduce", n, ROW).duration_ns == 109304.0  # estimate books nothing
    assert trn2.link_busy()[("nl-out", 0)] == [(0.0, 196608.0), (300000.0, 300000.0 + busy)]
    trn2.reset()
    assert trn2.collective("all_reduce", n, ROW).end_ns == 109304.0


def test_a_collective_starts_when_the_last_rank_arrives(trn2):
    t = trn2.collective("all_reduce", 64 * MiB, ROW, start_ns=[10.0, 500.0, 20.0, 0.0])
    assert (t.start_ns, t.end_ns) == (500.0, 500.0 + 109304.0)


def test_link_timeline_fills_gaps_in_order():
    link = LinkTimeline()
    assert link.occupy(10.0, 5.0) == 15.0
    assert link.occupy(0.0, 20.0) == 25.0          # 0-10, then 15-25
    assert link.busy() == [(0.0, 25.0)]
    assert link.occupy(30.0, 0.0) == 30.0


def test_bus_factors():
    assert algos.bus_factor("all_reduce", 4) == 1.5
    assert algos.bus_factor("all_gather", 4) == algos.bus_factor("all_to_all", 4) == 0.75
    assert algos.bus_factor("broadcast", 4) == 1.0 and algos.bus_factor("barrier", 4) == 0.0


# -- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda: instance("trn2.48xlarg"), r"unknown instance 'trn2.48xlarg'; did you mean 'trn2.48xlarge'\?"),
    (lambda: Fabric("trn2.48xlarge", 65), r"world size 65 does not fit 1 trn2.48xlarge server.*pass nodes=2"),
    (lambda: Fabric("trn2-ultraserver", 257), r"world size 257 does not fit 4 trn2-ultraserver.*pass nodes=5"),
    (lambda: Fabric("trn2.48xlarge", 0), r"world size is 0; pass a whole number of ranks >= 1"),
    (lambda: Fabric("trn2.48xlarge", 16, nproc_per_node=65), r"65 ranks per server asked"),
    (lambda: place(64, 64), r"rank 64 is not in this job; pass a rank from 0 to 63"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("all_reduce", -1), r"all_reduce size nbytes is -1; pass a whole"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("all_reduce", 1.5), r"nbytes is 1.5"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("allreduce", 8),
     r"unknown collective 'allreduce'; did you mean 'all_reduce'"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("all_reduce", 8, [0, 0]), r"must be distinct"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("all_reduce", 8, [0, 9]), r"rank 9 is not in this job"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("broadcast", 8, [0, 1]), r"broadcast root None is not one of"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("all_reduce", 8, root=0), r"all_reduce has no root"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("send_recv", 8, [0, 1, 2]), r"pass two ranks"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("all_to_all", 8, [0, 1], splits=[[0, 1]]), r"2 rows of 2"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("all_to_all", 8, [0, 1], splits=[[0, 4], [2, 0]]),
     r"nbytes is 8 but the largest rank's splits add up to 4; pass nbytes=4"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("all_gather", 8, splits=[[0]]), r"splits are for all_to_all"),
    (lambda: Fabric("trn2.48xlarge", 8).estimate("all_reduce", 8, start_ns=math.nan), r"start_ns nan is not a time"),
    (lambda: Fabric("trn2.3xlarge", 2, nodes=2).estimate("send_recv", 8, [0, 1]),
     r"instance trn2.3xlarge has no EFA .efa_bw_gbps = 0., so ranks 0 and 1 on different servers cannot talk"),
])
def test_bad_input_names_the_value_and_the_fix(call, message):
    with pytest.raises(ConfigError, match=message):
        call()
