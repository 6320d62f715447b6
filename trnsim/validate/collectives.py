"""Collective latencies nccom-test published, against the fabric model.

Source: the Neuron SDK's nccom-test page (aws-neuron-sdk ``tools/neuron-sys-tools/
nccom-test.rst``), whose examples print measured tables. The page does not say which
instance or runtime release each example ran on; the tables disagree on the fixed cost of a
small collective (6 us for a 32-rank all-gather in one example, 151 us in another, 300 us
for a 16-rank all-reduce), so they come from different releases. trnsim fits its three
collective parameters to two of them (``group="fit"``) and checks the rest:

- ``[fabric] reduce_fixed_ns`` and ``collective_dma_gbps``: the 2-rank fp32 all-reduce,
  1 KiB to 1 GiB (trn1.32xlarge: 2 ranks share a chip);
- ``[fabric] collective_fixed_ns``: the 8-rank all-gather run with ``--stats`` (1,000
  iterations), taken on trn1.32xlarge (assumption: the page does not name it).

The instance of each table is the one its rank count and algorithms point to: 32 and 64
ranks per server are trn1.32xlarge (32 NeuronCores), the 16-rank all-reduce that names
KangaRing is Trainium2's (trn2.48xlarge at LNC=2; assumption). Times are the tables'
``time(us)`` (average) columns; sizes are their ``size(B)``, nccl-tests' convention, which
:class:`trnsim.hw.fabric.Fabric` shares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trnsim.validate.figures import Figure

if TYPE_CHECKING:
    from trnsim.hw.spec import ChipSpec

_PAGE = "nccom-test.rst"

# Each table: (name, section of the page, instance, chip, nodes, ranks, kind, group, {bytes: published us})
TABLES = [
    ("allr2", "Examples: 2 rank all-reduce, 1 KiB to 1 GiB", "trn1.32xlarge", "trn1", 1, 2, "all_reduce", "fit",
     {1024: 58, 4096: 58, 16384: 58, 65536: 58, 262144: 60, 1048576: 68, 4194304: 107, 16777216: 332,
      67108864: 1214, 268435456: 4750, 1073741824: 18930}),
    ("allr2-32m", "Using nccom-test: 2 worker all-reduce of 32 MB", "trn1.32xlarge", "trn1", 1, 2, "all_reduce",
     "check", {33554432: 768}),
    ("allg8", "Examples: percentile latency with --stats (8 ranks)", "trn1.32xlarge", "trn1", 1, 8, "all_gather",
     "fit", {1024: 10.0, 8192: 10.22, 65536: 11.31, 524288: 14.83}),
    ("allg32", "Examples: results as JSON (32 ranks)", "trn1.32xlarge", "trn1", 1, 32, "all_gather", "check",
     {1024: 6.19, 8192: 6.55, 65536: 8.18, 524288: 23.11}),
    ("allg32-check", "Examples: 32 rank all-gather with correctness checking", "trn1.32xlarge", "trn1", 1, 32,
     "all_gather", "check", {1024: 151, 8192: 149, 65536: 150, 524288: 179}),
    ("allr16", "Examples: --show-algorithm (16 ranks)", "trn2.48xlarge", "trn2", 1, 16, "all_reduce", "check",
     {4: 299.91, 512: 299.82, 8192: 299.74, 131072: 574.15, 2097152: 686.32, 33554432: 2754.15,
      536870912: 9689.51}),
    ("allr64x2", "Multiple Instances Example: 64 ranks on two instances (every other size)", "trn1.32xlarge",
     "trn1", 2, 64, "all_reduce", "check",
     {8: 520, 32: 523, 128: 553, 512: 782, 2048: 881, 8192: 1013, 32768: 1174, 131072: 1315, 524288: 1312,
      2097152: 1329, 8388608: 1419, 33554432: 2711, 134217728: 6279, 536870912: 21803}),
]


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def latency_us(instance: str, ranks: int, nodes: int, kind: str, nbytes: int, chip: ChipSpec | None = None) -> float:
    """The fabric model's time for one collective on an idle fabric (``chip``: a what-if
    chip whose instance ``instance`` is, for fitting)."""
    from trnsim.hw.fabric import Fabric, instance as find

    return Fabric(find(instance, chip), ranks, nodes=nodes).estimate(kind, nbytes).duration_ns / 1000


def _simulate(instance: str, ranks: int, nodes: int, kind: str, nbytes: int):
    return lambda _: latency_us(instance, ranks, nodes, kind, nbytes)


def figures() -> list[Figure]:
    out = []
    for table, section, instance, chip, nodes, ranks, kind, group, points in TABLES:
        where = f"{ranks} ranks" + (f" on {nodes} servers" if nodes > 1 else "")
        for nbytes, us in points.items():
            out.append(Figure(
                key=f"nccom.{table}.{nbytes}", kind="collective",
                what=f"{kind.replace('_', '-')} {_size(nbytes)}, {where}", chip=chip,
                source=f"{_PAGE}, {section}", published=float(us), unit="us", group=group,
                runs=f"fabric model, {instance}", simulate=_simulate(instance, ranks, nodes, kind, nbytes)))
    return out
