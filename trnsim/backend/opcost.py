"""What an op costs on the device: :class:`OpCost`, and the bandwidth-bound estimate
that times every op without a kernel.

The bottom of the eager timing path: lowering (:mod:`trnsim.backend.lowering`), the
kernel table (:mod:`trnsim.backend.opkernels`), the choice between them
(:mod:`trnsim.backend.costs`) and the timeline (:mod:`trnsim.backend.timeline`) all
build on it, and it imports none of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from trnsim.backend import state


@dataclass(frozen=True)
class OpCost:
    """Simulated device time of one op and where it came from.

    ``source`` is ``"kernel"`` (a Program from trnsim.kernels was simulated; ``run`` is
    its RunResult and ``kernel`` its name), ``"estimate"`` (bytes moved over HBM
    bandwidth) or ``"none"`` (no device work, such as allocation). ``hbm_bytes`` is the
    HBM traffic of an op whose time has no one Program to count it from (an estimate,
    a group of kernels); None where ``run``'s DMAs count it (:meth:`hbm_moved`).
    """

    ps: int
    source: str
    kernel: str = ""
    run: Any = field(default=None, repr=False, compare=False)
    scale: int = 1     # the kernel's Program covered 1/scale of the op, repeated
    cores: float = 1.0  # the op's work over the Program's (scale aside): the physical cores' shares
    hbm_bytes: int | None = None
    #: the traced call ``(kernel, args, kwargs)`` that made ``run``, to trace it again
    #: beside another kernel (:mod:`trnsim.backend.compile.overlap`)
    call: Any = field(default=None, repr=False, compare=False)
    #: a matmul timed with its left operand written transposed by its producer: the same
    #: op traced with that operand in rows, transposed on chip, for when the operand comes
    #: from an earlier kernel of a compiled graph that keeps it in SBUF in rows
    in_rows: Any = field(default=None, repr=False, compare=False)

    def hbm_moved(self) -> int | None:
        """Bytes the op moves to and from HBM on all its cores, or None where unknown."""
        if self.hbm_bytes is not None:
            return self.hbm_bytes
        if self.run is None:
            return None
        return round(sum(p.hbm_bytes for p in self.run.dma_plans.values()) * self.scale * self.cores)

    def flops(self) -> int:
        """Matmul FLOPs of the op on all its cores (2 per MAC; 0 without a Program)."""
        return round(self.run.program.flops() * self.scale * self.cores) if self.run is not None else 0


def tensor_bytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def moved_bytes(flat: list, out: Any) -> int:
    """Bytes an op reads (its tensor arguments) and writes (its new results)."""
    total = sum(tensor_bytes(x) for x in flat if isinstance(x, torch.Tensor))
    outs = out if isinstance(out, (list, tuple)) else (out,)
    ids = {id(x) for x in flat}
    total += sum(tensor_bytes(o) for o in outs if isinstance(o, torch.Tensor) and id(o) not in ids)
    return total


def estimate(nbytes: int) -> OpCost:
    """Bandwidth-bound time of moving ``nbytes`` through HBM on the device's core(s)."""
    chip = state.chip()
    bw = chip.hbm_bw_per_core_gbps * chip.logical_core_size  # GB/s == bytes/ns
    ns = chip.dma.fixed_ns + nbytes / bw
    return OpCost(ps=math.ceil(ns * 1000), source="estimate", hbm_bytes=nbytes)
