"""What each instruction asks of the hardware, worked out once per Program.

An instruction's track, duration on its engine (or its DMA plan) and dependencies
do not depend on when it runs, so :func:`static_timing` works them out once for a
Program (and only for what was added since, when the Program grew) before the
scheduler in :mod:`trnsim.hw.core` books it. A Program itself holds no timing: it is
the instruction list and its checks against the chip description.
"""

from __future__ import annotations

import weakref
from typing import cast

from trnsim.hw.dma import DmaPlan, PlanKey, plan_dma, plan_key
from trnsim.hw.engines import CostKey, cost_key, cost_ps
from trnsim.hw.spec import ChipSpec
from trnsim.isa import (DmaCopy, DmaIndirect, Instruction, LoadStationary, MultiplyMoving, SemaphoreSignal, SemaphoreWait,
                        core_track, pe_rows)
from trnsim.program import Program
from trnsim.units import Picos

# What an instruction does to the schedule beyond taking time on its track.
PLAIN, LOAD, MULTIPLY, SIGNAL, WAIT, DMA = range(6)
_KINDS = {LoadStationary: LOAD, MultiplyMoving: MULTIPLY, SemaphoreSignal: SIGNAL, SemaphoreWait: WAIT, DmaCopy: DMA,
          DmaIndirect: DMA}

LOAD_TRACK = "tensor.load"


class StaticTiming:
    """Per-instruction tracks, groups, kinds, dependencies, durations and DMA plans.

    The stationary loads get a track of their own (``tensor.load``) but stay in the
    tensor engine's group: no semaphore between a load and its multiply.

    Costs and DMA plans are worked out once per operand signature (:func:`cost_key`,
    :func:`plan_key`: all that decides them) and looked up after that, so a loop that
    issues one shape of instruction many times costs it once. Plans are frozen, so
    instructions sharing one share nothing that can change.
    """

    def __init__(self, chip: ChipSpec) -> None:
        self.chip = chip
        self.tracks: list[str] = []
        self.groups: list[str] = []
        self.kinds: list[int] = []
        self.deps: list[tuple[int, ...]] = []
        self.costs: list[Picos] = []
        self.plans: dict[int, DmaPlan] = {}
        self._last_on_engine: dict[str, int] = {}
        self._stationary_free: list[int] = []
        self._cost_of: dict[CostKey, Picos] = {}
        self._plan_of: dict[PlanKey, DmaPlan] = {}

    def add(self, inst: Instruction) -> None:
        """Record ``inst``, the next instruction of the program."""
        i = inst.index
        kind = _KINDS.get(type(inst), PLAIN)
        group = inst.track
        self.tracks.append(core_track(LOAD_TRACK, inst.core) if kind == LOAD else group)
        self.groups.append(group)
        self.kinds.append(kind)
        self.deps.append(inst.deps)
        previous = self._stationary_free[-1] if self._stationary_free else 0
        if kind == DMA:
            dma = cast(DmaCopy, inst)
            key = plan_key(dma)
            plan = self._plan_of.get(key)
            if plan is None:
                plan = self._plan_of[key] = plan_dma(self.chip, dma)
            self.plans[i] = plan
            self.costs.append(0)
            self._stationary_free.append(previous)
            return
        if kind == LOAD:
            load = cast(LoadStationary, inst)
            stationary_free = load.src.free_size // pe_rows(load.double_row)
        else:
            stationary_free = previous
        self._stationary_free.append(stationary_free)
        dependent = self._last_on_engine.get(group, -1) in inst.deps
        self._last_on_engine[group] = i
        key = cost_key(inst, dependent, stationary_free)
        cost = self._cost_of.get(key)
        if cost is None:
            cost = self._cost_of[key] = cost_ps(self.chip, inst, dependent=dependent, stationary_free=stationary_free)
        self.costs.append(cost)



# Each Program's timing, kept while the Program lives; a Program that took an
# instruction back (its ``revision`` moved on) is timed afresh.
_TIMINGS: weakref.WeakKeyDictionary[Program, tuple[int, StaticTiming]] = weakref.WeakKeyDictionary()


def static_timing(program: Program) -> StaticTiming:
    """The tracks, kinds, dependencies, costs and DMA plans of ``program``'s
    instructions on its chip; worked out once, then extended by what was added since."""
    kept = _TIMINGS.get(program)
    if kept is None or kept[0] != program.revision:
        kept = (program.revision, StaticTiming(program.chip))
        _TIMINGS[program] = kept
    timing = kept[1]
    insts = program.instructions
    for i in range(len(timing.kinds), len(insts)):
        timing.add(insts[i])
    return timing
