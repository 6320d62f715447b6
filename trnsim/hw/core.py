"""One NeuronCore: simpy processes that run a Program and time every instruction.

Each engine, and each DMA queue, is a simpy process that takes its own
instructions in program order. An instruction starts when its engine is free and
every dependency has ended (plus the semaphore latency when the dependency ran
elsewhere). Compute engines share nothing but dependencies, so once the end of
each dependency is known an engine books its instruction at once; DMA queues
share the engine pool and HBM, so a queue waits on the simpy clock until its
transfer's start and books the shared resources then, in start order.

Simulated time is kept in integer picoseconds: the same Program on the same chip
gives the same times on every run and every machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from trnsim.errors import ProgramError, SimulationError
from trnsim.hw.dma import DmaPlan, DmaSystem, plan_dma
from trnsim.hw.engines import cost_ps
from trnsim.hw.spec import ChipSpec
from trnsim.isa import DmaCopy, Engine, Instruction, LoadStationary, MultiplyMoving, Program, SemaphoreSignal, SemaphoreWait

Picos = int

FIDELITIES = ("timing", "instruction")
LOAD_TRACK = "tensor.load"


@dataclass
class RunResult:
    """What a simulated run produced: per-instruction times, outputs, and the Program."""

    program: Program
    fidelity: str
    tracks: list[str]
    starts: list[Picos]
    ends: list[Picos]
    dma_plans: dict[int, DmaPlan]
    outputs: dict[str, Any] = field(default_factory=dict)

    @property
    def chip(self) -> ChipSpec:
        return self.program.chip

    @property
    def total_ps(self) -> Picos:
        """Time from the first instruction's start to the last one's end."""
        return max(self.ends, default=0)

    @property
    def time_ns(self) -> float:
        """Simulated time of the whole program in nanoseconds."""
        return self.total_ps / 1000

    def summary(self) -> Any:
        """Simulated time, engine busy percentages, HBM traffic and FLOP/s (a :class:`trnsim.trace.Summary`)."""
        from trnsim.trace.analysis import summarize

        return summarize(self)


def _track(inst: Instruction) -> str:
    if isinstance(inst, LoadStationary):
        return LOAD_TRACK
    return inst.track



@dataclass
class _Static:
    """What each instruction needs from the run, fixed before it starts."""

    tracks: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    costs: list[Picos] = field(default_factory=list)
    plans: dict[int, DmaPlan] = field(default_factory=dict)


def _static_costs(program: Program) -> _Static:
    """Tracks and durations that depend on the instruction alone, computed once before the run."""
    chip = program.chip
    static = _Static()
    tracks, groups, costs, plans = static.tracks, static.groups, static.costs, static.plans
    last_on_engine: dict[Engine, int] = {}
    stationary_free = 0
    for inst in program.instructions:
        i = inst.index
        tracks.append(_track(inst))
        groups.append(inst.track)
        if isinstance(inst, DmaCopy):
            plans[i] = plan_dma(chip, inst)
            costs.append(0)
            continue
        if isinstance(inst, LoadStationary):
            stationary_free = inst.src.free_size
        dependent = last_on_engine.get(inst.engine, -1) in inst.deps
        last_on_engine[inst.engine] = i
        costs.append(cost_ps(chip, inst, dependent=dependent, stationary_free=stationary_free))
    return static


class _Schedule:
    """Shared state of one run: when each instruction ends, and who waits for what."""

    def __init__(self, env: Any, program: Program) -> None:
        self.env = env
        self.program = program
        n = len(program.instructions)
        self.starts: list[Picos | None] = [None] * n
        self.ends: list[Picos | None] = [None] * n
        self.waiting: dict[int, Any] = {}
        self.sem_times: dict[str, list[Picos]] = {}
        self.sem_waiting: dict[str, Any] = {}
        self.blocked: dict[str, str] = {}
        chip = program.chip
        self.sem_ps = round(chip.sync.semaphore_wait_ns * 1000)
        self.sem_to_dma_ps = round(chip.dma.semaphore_to_start_ns * 1000)

    def booked(self, i: int, start: Picos, end: Picos) -> None:
        self.starts[i] = start
        self.ends[i] = end
        event = self.waiting.pop(i, None)
        if event is not None:
            event.succeed()

    def ended(self, i: int) -> Any:
        """An event that fires once instruction ``i`` has its end time."""
        event = self.waiting.get(i)
        if event is None:
            event = self.waiting[i] = self.env.event()
        return event

    def signal(self, sem: str, at: Picos) -> None:
        self.sem_times.setdefault(sem, []).append(at)
        event = self.sem_waiting.pop(sem, None)
        if event is not None:
            event.succeed()

    def sem_event(self, sem: str) -> Any:
        event = self.sem_waiting.get(sem)
        if event is None:
            event = self.sem_waiting[sem] = self.env.event()
        return event


def _ready(sched: _Schedule, inst: Instruction, track: str, groups: list[str], wait_ps: Picos):
    """Generator: wait until every dependency of ``inst`` is booked; return when it may start.

    A dependency on another engine or queue costs ``wait_ps`` of semaphore latency."""
    ready = 0
    ends = sched.ends
    for d in inst.deps:
        end = ends[d]
        if end is None:
            sched.blocked[track] = f"instruction {inst.index} waits for instruction {d}"
            yield sched.ended(d)
            end = ends[d]
        if groups[d] != groups[inst.index]:
            end += wait_ps
        if end > ready:
            ready = end
    if isinstance(inst, SemaphoreWait):
        times = sched.sem_times.get(inst.sem, [])
        while len(times) < inst.count:
            sched.blocked[track] = f"instruction {inst.index} waits for semaphore {inst.sem!r} to reach {inst.count} (now {len(times)})"
            yield sched.sem_event(inst.sem)
            times = sched.sem_times.get(inst.sem, [])
        ready = max(ready, sorted(times)[inst.count - 1] + sched.sem_ps)
    sched.blocked.pop(track, None)
    return ready


def _engine_process(sched: _Schedule, track: str, indices: list[int], static: _Static):
    """An in-order compute engine. The tensor engine's stationary loads have a track of
    their own: a load may overlap the multiply before it, and the next multiply waits
    for it."""
    program = sched.program
    free = 0
    for i in indices:
        inst = program.instructions[i]
        ready = yield from _ready(sched, inst, track, static.groups, sched.sem_ps)
        start = max(free, ready)
        end = start + static.costs[i]
        sched.booked(i, start, end)
        free = end
        if isinstance(inst, SemaphoreSignal):
            sched.signal(inst.sem, end)


def _tensor_process(sched: _Schedule, indices: list[int], static: _Static):
    program = sched.program
    free = 0             # the PE array is streaming until then
    load_free = 0        # the stationary load port is busy until then
    loaded_at = 0        # the latest stationary is in place from then
    last_start = 0       # start of the latest multiply: a new load may begin then
    for i in indices:
        inst = program.instructions[i]
        ready = yield from _ready(sched, inst, static.tracks[i], static.groups, sched.sem_ps)
        costs = static.costs
        if isinstance(inst, LoadStationary):
            start = max(load_free, last_start, ready)
            end = start + costs[i]
            load_free = loaded_at = end
        else:
            start = max(free, loaded_at, ready)
            end = start + costs[i]
            free = end
            if isinstance(inst, MultiplyMoving):
                last_start = start
        sched.booked(i, start, end)
        if isinstance(inst, SemaphoreSignal):
            sched.signal(inst.sem, end)


def _dma_process(sched: _Schedule, track: str, indices: list[int], static: _Static, dma: DmaSystem):
    """An in-order DMA queue: waits on the clock for each transfer's start, then books
    the shared engine pool and HBM."""
    env = sched.env
    program = sched.program
    free = 0
    for i in indices:
        inst = program.instructions[i]
        ready = yield from _ready(sched, inst, track, static.groups, sched.sem_to_dma_ps)
        start = max(free, ready)
        if start > env.now:
            yield env.timeout(start - env.now)
        if isinstance(inst, DmaCopy):
            end = dma.transfer(start, static.plans[i])
        else:
            end = start
            if isinstance(inst, SemaphoreSignal):
                sched.signal(inst.sem, end)
        sched.booked(i, start, end)
        free = end


def run_timing(program: Program) -> RunResult:
    """Time ``program`` on its chip without computing any data."""
    import simpy

    static = _static_costs(program)
    tracks = static.tracks
    env = simpy.Environment()
    sched = _Schedule(env, program)
    by_track: dict[str, list[int]] = {}
    for i, track in enumerate(tracks):
        by_track.setdefault(track, []).append(i)
    dma = DmaSystem()
    tensor = [i for t in (Engine.TENSOR.value, LOAD_TRACK) for i in by_track.get(t, [])]
    tensor.sort()
    if tensor:
        env.process(_tensor_process(sched, tensor, static))
    for track, indices in by_track.items():
        if track in (Engine.TENSOR.value, LOAD_TRACK):
            continue
        if track.startswith("dma."):
            env.process(_dma_process(sched, track, indices, static, dma))
        else:
            env.process(_engine_process(sched, track, indices, static))
    env.run()
    if any(e is None for e in sched.ends):
        stuck = "; ".join(f"{t}: {why}" for t, why in sorted(sched.blocked.items()))
        raise SimulationError(f"program {program.name!r} cannot finish: {stuck}; signal the semaphore or remove the wait")
    return RunResult(program, "timing", tracks, sched.starts, sched.ends, static.plans)  # type: ignore[arg-type]


def simulate(program: Program, inputs: Mapping[str, Any] | None = None, *, fidelity: str = "timing",
             trace: Any = None, backend: str = "numba") -> RunResult:
    """Run ``program`` on one simulated NeuronCore of its chip.

    ``fidelity="timing"`` times the program and computes no data;
    ``"instruction"`` also executes every instruction on simulated SBUF, PSUM and
    HBM (``inputs`` maps input tensor names to numpy arrays) and fills
    ``result.outputs`` with the output tensors. ``trace`` is a path: the Chrome
    trace-event JSON of the run is written there.
    """
    if fidelity not in FIDELITIES:
        raise ProgramError(f"fidelity {fidelity!r} is not one of: {', '.join(FIDELITIES)}")
    if inputs and fidelity == "timing":
        raise ProgramError("inputs were given but fidelity='timing' computes no data; pass fidelity='instruction'")
    result = run_timing(program)
    if fidelity == "instruction":
        from trnsim.compute import Machine

        machine = Machine(program, backend=backend)
        given = dict(inputs or {})
        for t in program.inputs:
            if t.name not in given:
                raise ProgramError(f"input tensor {t.name!r} of program {program.name!r} has no data; pass inputs={{{t.name!r}: array}}")
            machine.bind(t, given.pop(t.name))
        if given:
            raise ProgramError(f"inputs {sorted(given)} name no input tensor of program {program.name!r}; its inputs: {[t.name for t in program.inputs]}")
        machine.run()
        result.fidelity = "instruction"
        result.outputs = {t.name: machine.result(t) for t in program.outputs}
    if trace is not None:
        from trnsim.trace import write_trace

        write_trace(result, trace)
    return result
