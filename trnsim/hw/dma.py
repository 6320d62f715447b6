"""DMA engines, queues and the HBM they share.

A DMA instruction is cut into descriptors, one per contiguous chunk common to its
source and destination (long chunks are cut at ``max_descriptor_kib``; an indirect
DMA's chunks end at each index, as each index may point anywhere). Descriptors are spread over the core's DMA engines; each
engine moves a chunk at ``engine_bw_gbps`` plus a fixed ``descriptor_overhead_ns``.
Queues feed the engines in order, so one queue's transfers follow each other
while transfers on different queues share the engines and the core's share of
HBM bandwidth.

Sharing is modelled by reservation: the engine pool and HBM each keep the time
they are next free, and a transfer that starts at ``t`` books ``work / engines``
of the pool and ``bytes / bandwidth`` of HBM from the first free moment after
``t``. A transfer ends when its own descriptors are done and both bookings end.
Transfers book in order of their start times, which the simpy clock guarantees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trnsim.hw.spec import ChipSpec
from trnsim.isa import DmaCopy, DmaIndirect, Memory, View
from trnsim.units import Picos


@dataclass(frozen=True)
class DmaPlan:
    """What a DMA instruction asks of the hardware, fixed before the run."""

    descriptors: int
    chunk_bytes: int
    hbm_bytes: int
    own_ps: Picos       # descriptors spread over the engines it can use
    pool_ps: Picos      # its share of the whole engine pool
    hbm_ps: Picos       # its share of HBM bandwidth
    fixed_ps: Picos     # issue latency, overlaps other transfers


#: A load whose data the compiler kept in SBUF (``DmaCopy.forwarded``): nothing moves.
FORWARDED = DmaPlan(descriptors=0, chunk_bytes=0, hbm_bytes=0, own_ps=0, pool_ps=0, hbm_ps=0, fixed_ps=0)

#: What :func:`plan_dma` reads of an instruction (see :func:`plan_key`).
PlanKey = tuple[object, ...]


def plan_key(inst: DmaCopy) -> PlanKey:
    """Everything :func:`plan_dma` reads of a DMA instruction: those with equal keys get
    equal plans on one chip. It reads of each operand its contiguous run (from the dims
    and whether the memory is on chip), its bytes (dims and dtype) and its memory, the first
    partition of its on-chip side (which engines serve it), and of an indirect DMA which side
    and dim the indices choose, and whether it is forwarded."""
    src, dst = inst.src, inst.dst
    s, d = src.tensor, dst.tensor
    side = _on_chip_side(inst)
    key = (src.dims, s.dtype, s.memory, dst.dims, d.dtype, d.memory, None if side is None else side.start_partition,
           inst.forwarded)
    if isinstance(inst, DmaIndirect):
        return key + (inst.scatter, inst.dim)
    return key


def _on_chip_side(inst: DmaCopy) -> View | None:
    """The operand whose SBUF/PSUM partitions decide which engines serve a DMA (the
    destination when both are on chip); None between HBM tensors."""
    if inst.dst.memory is not Memory.HBM:
        return inst.dst
    return inst.src if inst.src.memory is not Memory.HBM else None


def _runs(inst: DmaCopy) -> tuple[int, int]:
    """The contiguous run of each side (src, dst) in elements. On the indexed side of an
    indirect DMA a run ends with each index: only the dims inside the indexed one are
    known to be contiguous."""
    runs = [inst.src.contiguous_run(), inst.dst.contiguous_run()]
    if isinstance(inst, DmaIndirect):
        v = inst.indirect
        runs[inst.scatter] = View(v.tensor, v.offset, v.dims[inst.dim + 1:]).contiguous_run()
    return runs[0], runs[1]


def transpose_pct(chip: ChipSpec, inst: DmaCopy) -> float:
    """For a DMA the chip's engines transpose (the source's contiguous axis becomes the
    destination's partitions: NC-v3's DMA transpose from HBM into SBUF, 2- and 4-byte
    elements), its throughput in percent of a copy's; 0 for any other DMA, which moves
    contiguous chunks (a transposing walk on a chip without the feature moves element
    by element). An SBUF source cannot step over partitions element by element, so
    ``nisa.dma_transpose`` of a tile goes through HBM (two DMAs, about the published
    50% of a copy's throughput for NC-v3's SBUF-to-SBUF transpose)."""
    src, dst = inst.src, inst.dst
    if isinstance(inst, DmaIndirect) or src.memory is not Memory.HBM or dst.memory is not Memory.SBUF \
            or src.dtype.itemsize not in (2, 4) \
            or src.dtype is not dst.dtype or len(src.dims) < 2 or src.dims[0][0] != 1 or src.dims[0][1] < 2 \
            or src.contiguous_run() != 1 or dst.contiguous_run() < 2:
        return 0.0
    return chip.dma.transpose_pct_from_hbm


def _rounds(chip: ChipSpec, inst: DmaCopy, descriptors: int) -> int:
    """Descriptors the busiest engine of a DMA moves, one after another. Each engine serves
    its own lanes of SBUF partitions ("each DMA engine corresponds to 8 partition lanes"
    [dma overview]: 128 partitions over 16 engines), so a DMA to or from a few partitions uses
    few engines; one between HBM tensors spreads its descriptors over all of them."""
    side = _on_chip_side(inst)
    if side is None:
        return math.ceil(descriptors / min(descriptors, chip.dma.engines))
    lanes = max(1, chip.sbuf.partitions // chip.dma.engines)
    first, count = side.start_partition, max(1, side.partitions)
    last = first + count - 1
    busiest = max(min(last, g * lanes + lanes - 1) - max(first, g * lanes) + 1
                  for g in range(first // lanes, last // lanes + 1))
    return math.ceil(descriptors * busiest / count)


def plan_dma(chip: ChipSpec, inst: DmaCopy) -> DmaPlan:
    """Descriptors, bytes and durations of one DMA instruction on ``chip``. An indirect
    DMA's descriptors are written by GpSimd (software DGE) before it moves anything:
    ``swdge_descriptor_ns`` each, added to its issue latency. A DMA the engines transpose
    (:func:`transpose_pct`) moves the destination's rows as a copy would, at that share
    of the bandwidth."""
    if inst.forwarded:
        return FORWARDED
    d = chip.dma
    pct = transpose_pct(chip, inst)
    run = inst.dst.contiguous_run() if pct else math.gcd(*_runs(inst))
    itemsize = inst.src.dtype.itemsize
    chunk = min(run * itemsize, d.max_descriptor_kib * 1024)
    descriptors = -(-inst.src.nbytes // chunk)
    per_desc_ns = chunk / (d.engine_bw_gbps * (pct / 100 if pct else 1.0)) + d.descriptor_overhead_ns
    fixed_ns = d.fixed_ns + (descriptors * d.swdge_descriptor_ns if isinstance(inst, DmaIndirect) else 0)
    rounds = _rounds(chip, inst, descriptors)
    # a converting DMA reads the source's bytes and writes the destination's (assumption: the
    # descriptors follow the source)
    hbm_bytes = (inst.src.nbytes if inst.src.memory is Memory.HBM else 0) + \
                (inst.dst.nbytes if inst.dst.memory is Memory.HBM else 0)
    return DmaPlan(
        descriptors=descriptors,
        chunk_bytes=chunk,
        hbm_bytes=hbm_bytes,
        own_ps=round(rounds * per_desc_ns * 1000),
        pool_ps=round(descriptors * per_desc_ns * 1000 / d.engines),
        hbm_ps=round(hbm_bytes / chip.hbm_bw_per_core_gbps * 1000),
        fixed_ps=round(fixed_ns * 1000),
    )


class DmaSystem:
    """The DMA engine pool and HBM of one core, booked by transfers in start order."""

    def __init__(self) -> None:
        self.pool_free: Picos = 0
        self.hbm_free: Picos = 0

    def transfer(self, start: Picos, plan: DmaPlan) -> Picos:
        """Book a transfer issued at ``start``; returns when it ends."""
        if plan is FORWARDED:
            return start
        moving = start + plan.fixed_ps
        self.pool_free = max(self.pool_free, moving) + plan.pool_ps
        end = max(moving + plan.own_ps, self.pool_free)
        if plan.hbm_ps:
            self.hbm_free = max(self.hbm_free, moving) + plan.hbm_ps
            end = max(end, self.hbm_free)
        return end
