"""The compiler's choice of engine for instructions that NKI leaves to it.

A language-level op (``nl.copy``, ``nl.add``, ``nl.multiply``, ...) and an ``nki.isa``
call given no ``engine=`` (``nisa.tensor_copy``, ``tensor_tensor``, ``tensor_scalar``,
``memset``) run on an engine the compiler picks: NKI's ``nki.isa.tensor_copy``
reference says the compiler "selects best engine based on engine workload". trnsim
picks as a list scheduler does: :class:`Workload` keeps an estimate of when each traced
instruction ends (after its dependencies end and its track's previous instruction,
plus its cost on the chip), and the instruction goes to the engine, among those that
may run it, where it would end first; another engine than the first listed (the
vector engine) must end earlier by half the instruction's time on the first. How
the real compiler weighs engines is not published: this rule is an assumption,
documented in docs/nki.md ("How a kernel becomes a schedule").

Which engines may run it (NKI's reference): tensor_tensor on the vector engine or
GpSimd; tensor_scalar and memset also on the scalar engine; tensor_copy on the
scalar engine from NeuronCore-v3 on; GpSimd never when an operand is in PSUM (it
cannot access PSUM).
"""

from __future__ import annotations

from trnsim.hw.dma import plan_dma, plan_key
from trnsim.hw.engines import cost_key, cost_ps
from trnsim.hw.spec import ChipSpec
from trnsim.hw.static import LOAD_TRACK
from trnsim.isa import (AluOp, DmaCopy, Engine, Instruction, LoadStationary, Memory, Memset, MultiplyMoving, SemaphoreSignal,
                        SemaphoreWait, TensorCopy, TensorScalar, TensorTensor, core_track, pe_rows)
from trnsim.units import Picos

#: What the compiler may choose among, per instruction type, in order of preference.
CHOICES: dict[type, tuple[Engine, ...]] = {
    TensorTensor: (Engine.VECTOR, Engine.GPSIMD),
    TensorScalar: (Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD),
    TensorCopy: (Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD),
    Memset: (Engine.VECTOR, Engine.GPSIMD, Engine.SCALAR),
}

#: ALU operations the scalar engine's tensor_scalar path is taken to run (arithmetic,
#: maximum and minimum of its fp32 datapath; comparisons, bitwise operations and
#: shifts stay on the engines with integer ALUs: assumption).
_SCALAR_ALU = frozenset({AluOp.ADD, AluOp.SUBTRACT, AluOp.MULTIPLY, AluOp.MAXIMUM, AluOp.MINIMUM, AluOp.BYPASS})


def candidates(chip: ChipSpec, inst: Instruction) -> tuple[Engine, ...]:
    """The engines the compiler may put ``inst`` on (its own engine alone when none is listed)."""
    choices = CHOICES.get(type(inst))
    if choices is None:
        return (inst.engine,)
    in_psum = any(v.memory is Memory.PSUM for v in inst.reads() + inst.writes())
    out = []
    for e in choices:
        if e is Engine.GPSIMD and in_psum:
            continue
        if e is Engine.SCALAR:
            if isinstance(inst, TensorCopy) and (chip.neuron_core == "NC-v2" or not (inst.src.dtype.is_float
                                                                                      and inst.dst.dtype.is_float)):
                continue   # NC-v2's scalar engine has no tensor_copy; it copies through fp32, not exact for ints
            if isinstance(inst, TensorScalar) and (inst.reduce_dst is not None or not inst.src.dtype.is_float
                                                   or not inst.dst.dtype.is_float or inst.op0 not in _SCALAR_ALU
                                                   or (inst.op1 is not None and inst.op1 not in _SCALAR_ALU)):
                continue
        out.append(e)
    return tuple(out)


class Workload:
    """When each instruction of a Program being traced is estimated to end.

    ``add`` takes the Program's next instruction, ``forget_from`` drops instructions
    from an index on (an instruction the tracer replaced). The estimate is the
    scheduler's without contention between DMA queues or semaphores: a track runs its
    instructions in order, each after its dependencies' estimated ends."""

    def __init__(self, chip: ChipSpec) -> None:
        self.chip = chip
        self.end: list[Picos] = []
        self._free: dict[str, Picos] = {}
        self._undo: list[tuple[str, Picos, int]] = []   # per instruction: its track, the track's end before, M before
        self._stationary_free = 0
        self._cost_of: dict[object, Picos] = {}
        self._dma_of: dict[object, Picos] = {}

    def _track(self, inst: Instruction) -> str:
        return core_track(LOAD_TRACK, inst.core) if inst.__class__ is LoadStationary else inst.track

    def _duration(self, inst: Instruction) -> Picos:
        if isinstance(inst, DmaCopy):
            key = plan_key(inst)
            cost = self._dma_of.get(key)
            if cost is None:
                plan = plan_dma(self.chip, inst)
                cost = self._dma_of[key] = plan.fixed_ps + max(plan.own_ps, plan.hbm_ps)
            return cost
        if isinstance(inst, (SemaphoreSignal, SemaphoreWait)):
            return 0
        if isinstance(inst, LoadStationary):
            self._stationary_free = inst.src.free_size // pe_rows(inst.double_row)
        free = self._stationary_free if isinstance(inst, MultiplyMoving) else 0
        key = cost_key(inst, False, free)
        cost = self._cost_of.get(key)
        if cost is None:
            cost = self._cost_of[key] = cost_ps(self.chip, inst, stationary_free=free)
        return cost

    def finish(self, inst: Instruction, deps: tuple[int, ...] | set[int]) -> Picos:
        """When ``inst`` would end if it came next, waiting for ``deps``."""
        end = self.end
        ready = max((end[d] for d in deps if d < len(end)), default=0)
        return max(ready, self._free.get(self._track(inst), 0)) + self._duration(inst)

    def add(self, inst: Instruction) -> None:
        """Take the Program's next instruction (its ``deps`` set)."""
        track = self._track(inst)
        self._undo.append((track, self._free.get(track, 0), self._stationary_free))
        end = self.finish(inst, inst.deps)
        self._free[track] = end
        self.end.append(end)

    def forget_from(self, index: int) -> None:
        """Drop the instructions from ``index`` on, as if they were never added."""
        while len(self.end) > index:
            self.end.pop()
            track, before, free = self._undo.pop()
            self._free[track] = before
            self._stationary_free = free

    def choose(self, inst: Instruction, deps: tuple[int, ...] | set[int]) -> Engine:
        """The engine among :func:`candidates` on which ``inst`` would end first. An engine
        other than the first listed must beat it by half the instruction's time there:
        engines run their instructions in order, so one that takes an instruction whose
        inputs come late holds up whatever the kernel gives it next, which this estimate
        does not see (without the margin, small instructions drift to idle engines and
        delay the work that must run there)."""
        options = candidates(self.chip, inst)
        if len(options) == 1:
            return options[0]
        original = inst.engine
        object.__setattr__(inst, "engine", options[0])
        margin = self._duration(inst) // 2
        best, best_end = options[0], self.finish(inst, deps) - margin
        for e in options[1:]:
            object.__setattr__(inst, "engine", e)
            end = self.finish(inst, deps)
            if end < best_end:
                best, best_end = e, end
        object.__setattr__(inst, "engine", original)
        return best
