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
from trnsim.hw.dma import DmaPlan, DmaSystem
from trnsim.hw.static import DMA, LOAD, MULTIPLY, SIGNAL, WAIT, StaticTiming
from trnsim.hw.spec import ChipSpec
from trnsim.isa import Engine, Program, SemaphoreWait

Picos = int

FIDELITIES = ("timing", "instruction")


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


class _Schedule:
    """Shared state of one run: when each instruction starts and ends, and who waits for what."""

    def __init__(self, env: Any, program: Program, static: StaticTiming) -> None:
        self.env = env
        self.program = program
        self.static = static
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

    def ready_now(self, i: int, wait_ps: Picos) -> Picos:
        """When instruction ``i`` may start, if every dependency is booked; else -1."""
        ends = self.ends
        groups = self.static.groups
        group = groups[i]
        ready = 0
        for d in self.static.deps[i]:
            end = ends[d]
            if end is None:
                return -1
            if groups[d] != group:
                end += wait_ps
            if end > ready:
                ready = end
        return ready

    def ready(self, i: int, track: str, wait_ps: Picos):
        """Generator: when instruction ``i`` may start as far as its dependencies go.

        Returns at once when every dependency is booked (the common case); otherwise
        waits for the missing ones. A dependency in another group costs ``wait_ps``."""
        ends = self.ends
        groups = self.static.groups
        group = groups[i]
        ready = 0
        for d in self.static.deps[i]:
            end = ends[d]
            if end is None:
                self.blocked[track] = f"instruction {i} waits for instruction {d}"
                event = self.waiting.get(d)
                if event is None:
                    event = self.waiting[d] = self.env.event()
                yield event
                del self.blocked[track]
                end = ends[d]
            if groups[d] != group:
                end += wait_ps
            if end > ready:
                ready = end
        if self.static.kinds[i] == WAIT:
            ready = yield from self._semaphore(self.program.instructions[i], track, ready)
        return ready

    def _semaphore(self, inst: SemaphoreWait, track: str, ready: Picos):
        times = self.sem_times.setdefault(inst.sem, [])
        while len(times) < inst.count:
            self.blocked[track] = f"instruction {inst.index} waits for semaphore {inst.sem!r} to reach {inst.count} (now {len(times)})"
            event = self.sem_waiting.get(inst.sem)
            if event is None:
                event = self.sem_waiting[inst.sem] = self.env.event()
            yield event
        self.blocked.pop(track, None)
        return max(ready, sorted(times)[inst.count - 1] + self.sem_ps)

    def signal(self, sem: str, at: Picos) -> None:
        self.sem_times.setdefault(sem, []).append(at)
        event = self.sem_waiting.pop(sem, None)
        if event is not None:
            event.succeed()


def _engine_process(sched: _Schedule, track: str, indices: list[int]):
    """An in-order compute engine: books each instruction as soon as its dependencies' ends are known."""
    costs, kinds = sched.static.costs, sched.static.kinds
    starts, ends, waiting = sched.starts, sched.ends, sched.waiting
    wait = sched.sem_ps
    free = 0
    for i in indices:
        ready = sched.ready_now(i, wait) if kinds[i] != WAIT else -1
        if ready < 0:
            ready = yield from sched.ready(i, track, wait)
        start = free if free > ready else ready
        free = start + costs[i]
        starts[i] = start
        ends[i] = free
        if waiting and i in waiting:
            waiting.pop(i).succeed()
        if kinds[i] == SIGNAL:
            sched.signal(sched.program.instructions[i].sem, free)


def _tensor_process(sched: _Schedule, indices: list[int]):
    """The tensor engine. A stationary load may start with the multiply before it
    (the PE array holds the next weights while it streams); a multiply waits for
    the latest load."""
    costs, kinds, tracks = sched.static.costs, sched.static.kinds, sched.static.tracks
    starts, ends, waiting = sched.starts, sched.ends, sched.waiting
    wait = sched.sem_ps
    free = 0             # the PE array is streaming until then
    load_free = 0        # the stationary load port is busy until then
    loaded_at = 0        # the latest stationary is in place from then
    last_start = 0       # start of the latest multiply: a new load may begin then
    for i in indices:
        ready = sched.ready_now(i, wait) if kinds[i] != WAIT else -1
        if ready < 0:
            ready = yield from sched.ready(i, tracks[i], wait)
        kind = kinds[i]
        if kind == LOAD:
            start = max(load_free, last_start, ready)
            load_free = loaded_at = end = start + costs[i]
        else:
            start = max(free, loaded_at, ready)
            free = end = start + costs[i]
            if kind == MULTIPLY:
                last_start = start
        starts[i] = start
        ends[i] = end
        if waiting and i in waiting:
            waiting.pop(i).succeed()
        if kind == SIGNAL:
            sched.signal(sched.program.instructions[i].sem, end)


def _dma_process(sched: _Schedule, track: str, indices: list[int], dma: DmaSystem):
    """An in-order DMA queue: waits on the clock for each transfer's start, then books
    the shared engine pool and HBM."""
    env = sched.env
    kinds, plans = sched.static.kinds, sched.static.plans
    starts, ends, waiting = sched.starts, sched.ends, sched.waiting
    wait = sched.sem_to_dma_ps
    free = 0
    for i in indices:
        ready = sched.ready_now(i, wait) if kinds[i] != WAIT else -1
        if ready < 0:
            ready = yield from sched.ready(i, track, wait)
        start = free if free > ready else ready
        if start > env.now:
            yield env.timeout(start - env.now)
        kind = kinds[i]
        free = dma.transfer(start, plans[i]) if kind == DMA else start
        starts[i] = start
        ends[i] = free
        if waiting and i in waiting:
            waiting.pop(i).succeed()
        if kind == SIGNAL:
            sched.signal(sched.program.instructions[i].sem, free)


def run_timing(program: Program) -> RunResult:
    """Time ``program`` on its chip without computing any data."""
    import simpy

    static = program.timing
    env = simpy.Environment()
    sched = _Schedule(env, program, static)
    by_group: dict[str, list[int]] = {}
    for i, group in enumerate(static.groups):
        by_group.setdefault(group, []).append(i)
    dma = DmaSystem()
    for group, indices in by_group.items():
        if group == Engine.TENSOR.value:
            env.process(_tensor_process(sched, indices))
        elif group.startswith("dma."):
            env.process(_dma_process(sched, group, indices, dma))
        else:
            env.process(_engine_process(sched, group, indices))
    env.run()
    if any(e is None for e in sched.ends):
        stuck = "; ".join(f"{t}: {why}" for t, why in sorted(sched.blocked.items()))
        raise SimulationError(f"program {program.name!r} cannot finish: {stuck}; signal the semaphore or remove the wait")
    return RunResult(program, "timing", static.tracks, sched.starts, sched.ends, static.plans)  # type: ignore[arg-type]


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
