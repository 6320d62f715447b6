"""One NeuronCore: the scheduler that books every instruction of a Program in time.

Each engine, and each DMA queue, takes its own instructions in program order. An instruction starts when its engine is free and
every dependency has ended (plus the semaphore latency when the dependency ran
elsewhere). Compute engines share nothing but dependencies, so once the end of
each dependency is known an engine books its instruction at once; DMA queues
share the engine pool and HBM, so each queue is a simpy process that waits on the
simulated clock until its transfer's start and books the shared resources then,
in start order.

As it books an instruction the scheduler records why it started then (its cause,
see :data:`CAUSES`): the start rules live here only, and traces read the causes.

Simulated time is kept in integer picoseconds: the same Program on the same chip
gives the same times on every run and every machine.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generator, NamedTuple, cast

from trnsim.errors import SimulationError
from trnsim.hw.dma import FORWARDED, DmaPlan, DmaSystem
from trnsim.hw.spec import ChipSpec
from trnsim.hw.static import DMA, LOAD, MULTIPLY, SIGNAL, WAIT, StaticTiming, static_timing
from trnsim.isa import Engine, SemaphoreSignal, SemaphoreWait, split_track
from trnsim.program import Program
from trnsim.units import Picos

if TYPE_CHECKING:
    import simpy

#: Kinds of cause: ``"dma"`` (a dependency on a DMA transfer), ``"engine"`` (a dependency
#: on another engine's instruction, another track of the same engine, or the tensor
#: engine's stationary-load rules), ``"semaphore"`` (a semaphore wait reached its count:
#: ``on`` is the signal that reached it), ``"busy"`` (the track was busy with its own
#: previous instruction ``on``) and ``"launch"`` (nothing to wait for: the run's start).
#: When two causes end at the same moment a dependency (the first listed) wins over a
#: semaphore, and both over the engine's own rules and ``busy``.
CAUSES = ("dma", "engine", "semaphore", "busy", "launch")


class Cause(NamedTuple):
    """Why an instruction started when it did: ``kind`` (one of :data:`CAUSES`), the
    instruction it waited on (``on``), the semaphore (``sem``), and how long its track
    sat idle before it (since its previous instruction on the track ended, or since
    the run's start)."""

    kind: str
    on: int | None
    sem: str | None
    idle_ps: Picos


@dataclass
class TimedRun:
    """A Program booked on its chip: each instruction's track, start, end and cause, and
    each DMA transfer's plan; ``outputs`` holds the output tensors when a run also
    computed the data (``fidelity="instruction"``)."""

    program: Program
    fidelity: str
    tracks: list[str]
    starts: list[Picos]
    ends: list[Picos]
    dma_plans: dict[int, DmaPlan]
    causes: list[Cause]
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


class _Schedule:
    """Shared state of one run: when each instruction starts and ends, and who waits for what.

    Compute engines are :class:`_Engine` objects woken by bookings: when an
    instruction is booked, the engines waiting for it go on a ready queue and
    :meth:`drain` lets each book what it now can. DMA queues are simpy processes
    and wait on simpy events.
    """

    def __init__(self, env: simpy.Environment, program: Program, static: StaticTiming) -> None:
        self.env = env
        self.program = program
        self.static = static
        n = len(program.instructions)
        self.starts: list[Picos | None] = [None] * n
        self.ends: list[Picos | None] = [None] * n
        self.events: dict[int, simpy.Event] = {}   # simpy events DMA queues wait on
        self.wakes: dict[int, list[_Engine]] = {}  # engines waiting for an instruction
        self.sem_times: dict[str, list[Picos]] = {}
        self.sem_signals: dict[str, list[tuple[Picos, int]]] = {}   # (end, signal) booked, per semaphore
        self.causes: list[Cause | None] = [None] * n
        self.sem_events: dict[str, simpy.Event] = {}
        self.sem_wakes: dict[str, list[_Engine]] = {}
        self.ready_engines: deque[_Engine] = deque()
        self.engines: dict[str, _Engine] = {}
        # the earliest any track's next instruction can start (its in-order floor)
        self.floors: dict[str, Picos] = {}
        self.pending_signals: dict[str, set[int]] = {}
        for i, kind in enumerate(static.kinds):
            if kind in (SIGNAL, WAIT):
                sem = cast("SemaphoreSignal | SemaphoreWait", program.instructions[i]).sem
                self.pending_signals.setdefault(sem, set())
                if kind == SIGNAL:
                    self.pending_signals[sem].add(i)
        self.relaxed = False
        # floors only matter to semaphore waits; programs without them skip the bookkeeping
        self.watch_floors = WAIT in static.kinds
        self.blocked: dict[str, tuple[int, int | str]] = {}  # track: (instruction, what it waits for)
        chip = program.chip
        self.sem_ps = round(chip.sync.semaphore_wait_ns * 1000)
        self.sem_to_dma_ps = round(chip.dma.semaphore_to_start_ns * 1000)

    def book(self, i: int, start: Picos, end: Picos) -> None:
        self.starts[i] = start
        self.ends[i] = end
        if self.wakes:
            engines = self.wakes.pop(i, None)
            if engines:
                self.ready_engines.extend(engines)
        if self.events:
            event = self.events.pop(i, None)
            if event is not None:
                event.succeed()
        if self.watch_floors and self.static.kinds[i] == SIGNAL:
            sem = cast(SemaphoreSignal, self.program.instructions[i]).sem
            self.pending_signals[sem].discard(i)
            self.sem_times.setdefault(sem, []).append(end)
            self.sem_signals.setdefault(sem, []).append((end, i))
            self.ready_engines.extend(self.sem_wakes.pop(sem, ()))
            event = self.sem_events.pop(sem, None)
            if event is not None:
                event.succeed()

    def drain(self) -> None:
        """Let every woken engine book what it can."""
        ready = self.ready_engines
        while ready:
            ready.popleft().advance()

    def ready_now(self, i: int, wait_ps: Picos) -> tuple[Picos, int | str | None]:
        """When instruction ``i`` may start, and None; or (-1, what it still waits for):
        an instruction index or a semaphore name. A dependency in another group costs
        ``wait_ps`` of semaphore latency."""
        ends = self.ends
        groups = self.static.groups
        group = groups[i]
        ready = 0
        for d in self.static.deps[i]:
            end = ends[d]
            if end is None:
                return -1, d
            if groups[d] != group:
                end += wait_ps
            if end > ready:
                ready = end
        if self.static.kinds[i] == WAIT:
            inst = cast(SemaphoreWait, self.program.instructions[i])
            times = self.sem_times.get(inst.sem, [])
            if len(times) < inst.count:
                return -1, inst.sem
            reached = sorted(times)[inst.count - 1]
            # engines book ahead of the clock, so a signal not booked yet may still end
            # before the ones that are: wait for any that could
            if not self.relaxed:
                for s in self.pending_signals[inst.sem]:
                    if groups[s] != group and self.floors.get(groups[s], 0) < reached:
                        return -1, s
            ready = max(ready, reached + self.sem_ps)
        return ready, None

    def dma_wait_ps(self, i: int) -> Picos:
        """The semaphore latency DMA instruction ``i`` starts after the instructions it
        waits for: none for a forwarded one, which moves nothing."""
        return 0 if self.static.plans.get(i) is FORWARDED else self.sem_to_dma_ps

    def record(self, i: int, start: Picos, own: list[tuple[Picos, str, int]], previous: int) -> None:
        """Record why instruction ``i`` starts at ``start``: the first of its dependencies
        (in order), its semaphore, and its track's own rules ``own`` ((time, kind,
        instruction) in order, ``busy`` last) whose time is ``start``; when none is
        (a semaphore wait let go early), the latest of them. ``previous`` is the
        instruction before ``i`` on its track (-1: none)."""
        static = self.static
        tracks, groups, ends = static.tracks, static.groups, self.ends
        group = groups[i]
        latency = self.dma_wait_ps(i) if group.startswith("dma.") else self.sem_ps
        track = tracks[i]
        candidates: list[tuple[Picos, str, int, str | None]] = []
        for d in static.deps[i]:
            how = "dma" if tracks[d].startswith("dma.") else "busy" if tracks[d] == track else "engine"
            candidates.append((ends[d] + (latency if groups[d] != group else 0), how, d, None))  # type: ignore[operator]
        if static.kinds[i] == WAIT:
            inst = cast(SemaphoreWait, self.program.instructions[i])
            done = sorted(self.sem_signals.get(inst.sem, ()))
            if len(done) >= inst.count:
                end, s = done[inst.count - 1]
                candidates.append((end + self.sem_ps, "semaphore", s, inst.sem))
        candidates.extend((t, how, on, None) for t, how, on in own)
        idle = start - (ends[previous] if previous >= 0 else 0)  # type: ignore[operator]
        for c in candidates:
            if c[0] == start:
                self.causes[i] = Cause(c[1], c[2], c[3], idle)
                return
        if candidates and start > 0:
            _, how, on, sem = max(candidates, key=lambda c: c[0])
            self.causes[i] = Cause(how, on, sem, idle)
        else:
            self.causes[i] = Cause("launch", None, None, idle)

    def why(self, i: int, missing: int | str) -> str:
        if isinstance(missing, str):   # a semaphore wait's
            inst = cast(SemaphoreWait, self.program.instructions[i])
            have = len(self.sem_times.get(missing, []))
            return f"instruction {i} waits for semaphore {missing!r} to reach {inst.count} (now {have})"
        return f"instruction {i} waits for instruction {missing}"


class _Engine:
    """An in-order compute engine: books each instruction as soon as the ends of its
    dependencies are known. Compute engines share nothing but dependencies, so they
    need no clock of their own."""

    def __init__(self, sched: _Schedule, track: str, indices: list[int]) -> None:
        self.sched = sched
        self.track = track
        self.indices = indices
        self.pos = 0
        self.free: Picos = 0
        self.previous = -1   # the latest instruction booked on the engine's track

    def advance(self) -> None:
        sched = self.sched
        indices = self.indices
        wait = sched.sem_ps
        while self.pos < len(indices):
            i = indices[self.pos]
            ready, missing = sched.ready_now(i, wait)
            if missing is not None:
                sched.blocked[self.track] = (i, missing)
                if isinstance(missing, str):
                    sched.sem_wakes.setdefault(missing, []).append(self)
                else:
                    sched.wakes.setdefault(missing, []).append(self)
                return
            self.pos += 1
            self.book(i, ready)
        sched.blocked.pop(self.track, None)

    def book(self, i: int, ready: Picos) -> None:
        start = self.free if self.free > ready else ready
        previous = self.previous
        self.sched.record(i, start, [(self.free, "busy", previous)] if previous >= 0 else [], previous)
        self.free = start + self.sched.static.costs[i]
        self.previous = i
        if self.sched.watch_floors:
            self.sched.floors[self.track] = self.free
        self.sched.book(i, start, self.free)


class _TensorEngine(_Engine):
    """The tensor engine. A stationary load may start with the multiply before it (the
    PE array holds the next weights while it streams); a multiply waits for the latest
    load."""

    def __init__(self, sched: _Schedule, track: str, indices: list[int]) -> None:
        super().__init__(sched, track, indices)
        self.load_free: Picos = 0    # the stationary load port is busy until then
        self.loaded_at: Picos = 0    # the latest stationary is in place from then
        self.last_start: Picos = 0   # start of the latest multiply: a new load may begin then
        self.after: Picos = 0        # end of the latest transpose or semaphore on the engine
        # the instructions those times come from (-1: none yet)
        self.last_load = self.last_multiply = self.last_hold = -1

    def book(self, i: int, ready: Picos) -> None:
        kind = self.sched.static.kinds[i]
        cost = self.sched.static.costs[i]
        own: list[tuple[Picos, str, int]] = []
        if kind == LOAD:
            start = max(self.load_free, self.last_start, self.after, ready)
            if self.last_multiply >= 0:
                own.append((self.last_start, "engine", self.last_multiply))
            if self.last_hold >= 0:
                own.append((self.after, "engine", self.last_hold))
            if self.last_load >= 0:
                own.append((self.load_free, "busy", self.last_load))
            self.sched.record(i, start, own, self.last_load)
            self.load_free = self.loaded_at = end = start + cost
            self.last_load = i
        else:
            start = max(self.free, self.loaded_at, ready)
            if self.last_load >= 0:
                own.append((self.loaded_at, "engine", self.last_load))
            if self.previous >= 0:
                own.append((self.free, "busy", self.previous))
            self.sched.record(i, start, own, self.previous)
            self.free = end = start + cost
            self.previous = i
            if kind == MULTIPLY:
                self.last_start = start
                self.last_multiply = i
            else:
                # transposes and semaphores hold the array: no load may start before they end
                self.after = end
                self.last_hold = i
        if self.sched.watch_floors:
            self.sched.floors[self.track] = min(self.free, self.load_free)
        self.sched.book(i, start, end)


def _dma_process(sched: _Schedule, track: str, indices: list[int], dma: DmaSystem) -> Generator[simpy.Event, Any, None]:
    """An in-order DMA queue: waits on the simpy clock for each transfer's start, then
    books the shared engine pool and HBM, in start order across queues."""
    env = sched.env
    kinds, plans = sched.static.kinds, sched.static.plans
    free = 0
    previous = -1
    for i in indices:
        while True:
            ready, missing = sched.ready_now(i, sched.dma_wait_ps(i))
            if missing is None:
                break
            sched.blocked[track] = (i, missing)
            events: dict[Any, simpy.Event] = sched.sem_events if isinstance(missing, str) else sched.events
            if missing not in events:
                events[missing] = env.event()
            yield events[missing]
        sched.blocked.pop(track, None)
        start = free if free > ready else ready
        sched.record(i, start, [(free, "busy", previous)] if previous >= 0 else [], previous)
        previous = i
        if start > env.now:
            yield env.timeout(start - env.now)
        free = dma.transfer(start, plans[i]) if kinds[i] == DMA else start
        if sched.watch_floors:
            sched.floors[track] = free
        sched.book(i, start, free)
        sched.drain()


def _relax(sched: _Schedule) -> bool:
    """Semaphore waits held back for signals that could have ended sooner but cannot be
    booked before the waits themselves: take the signals booked so far. Returns whether
    any wait was let go."""
    held = [(track, i, s) for track, (i, s) in sched.blocked.items()
            if sched.static.kinds[i] == WAIT and isinstance(s, int)]
    if not held:
        return False
    sched.relaxed = True
    for track, _, s in held:
        if track in sched.engines:
            sched.ready_engines.append(sched.engines[track])
        elif s in sched.events:
            sched.events.pop(s).succeed()
    sched.drain()
    return True


def _check_intact(program: Program, static: StaticTiming) -> None:
    """Raise SimulationError unless ``program.instructions`` is exactly what ``Program.add``
    accepted, in order: the schedule runs on what was checked then."""
    for i, inst in enumerate(program.instructions):
        if inst.index != i or inst.owner != program.name:
            raise SimulationError(f"instruction {i} of program {program.name!r} ({inst.opcode}, added as {inst.index}) "
                                  "was put into Program.instructions directly; append instructions with Program.add")


def schedule(program: Program) -> TimedRun:
    """Book every instruction of ``program`` on its chip: when each starts and ends, and
    why it started then. No data is computed."""
    import simpy

    static = static_timing(program)
    _check_intact(program, static)
    env = simpy.Environment()
    sched = _Schedule(env, program, static)
    by_group: dict[str, list[int]] = {}
    for i, group in enumerate(static.groups):
        by_group.setdefault(group, []).append(i)
    dma: dict[int, DmaSystem] = {}   # per physical core: its engine pool and share of HBM
    for group, indices in by_group.items():
        base, core = split_track(group)
        if base.startswith("dma."):
            env.process(_dma_process(sched, group, indices, dma.setdefault(core, DmaSystem())))
        else:
            engine = (_TensorEngine if base == Engine.TENSOR.value else _Engine)(sched, group, indices)
            sched.engines[group] = engine
            sched.ready_engines.append(engine)
    sched.drain()
    env.run()
    if any(e is None for e in sched.ends) and _relax(sched):
        env.run()
    if any(e is None for e in sched.ends):
        stuck = "; ".join(f"{t}: {sched.why(*why)}" for t, why in sorted(sched.blocked.items()))
        raise SimulationError(f"program {program.name!r} cannot finish: {stuck}; signal the semaphore or remove the wait")
    return TimedRun(program, "timing", static.tracks, sched.starts, sched.ends, static.plans,  # type: ignore[arg-type]
                    sched.causes)  # type: ignore[arg-type]
