"""A kernel launched over the physical cores of a logical NeuronCore (``kernel[2]`` on
Trainium2 and 3, whose logical core is two physical ones, or a larger grid spread over
them: :meth:`trnsim.nki.jit.Kernel.instances_by_core`).

Each core runs the kernel with its own ``nl.program_id`` (a core given several grid
instances runs them one after another), its own SBUF, PSUM and engines, and all share
HBM. trnsim traces the cores into one Program, each core's
instructions on tracks of its own (``vector@nc1``), so the cores run at once in the
simulated time and the instructions that cross between them (``nisa.sendrecv``,
``nisa.core_barrier``) are dependencies from one core's tracks to the other's.

The kernel body is Python that runs once per core. Each core runs in a thread of its
own, one at a time: a core runs until it reaches a point that needs the other cores
(a send/receive, a barrier) or ends, and hands over to the lowest-numbered core that
can go on. When every core a point names has reached it, the instructions it stands
for are traced, and the cores go on. The order is fixed by the kernel alone, so a
launch traces the same Program every time. A point that can never be met (a core
waits for one that ended, or two wait on each other) is a :class:`KernelError` that
names where each core stands.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from trnsim.nki.tracer import KernelError, caller_source

if TYPE_CHECKING:
    from trnsim.nki.tiles import NkiTensor
    from trnsim.nki.tracer import Tracer


class _Abort(BaseException):
    """Stops a core's thread when another core failed: the first error is the news."""


@dataclass
class Exchange:
    """One ``nisa.sendrecv`` of one core: ``src`` goes to core ``to`` and ``dst`` receives
    from core ``frm``."""

    core: int
    src: NkiTensor
    dst: NkiTensor
    to: int
    frm: int
    where: str
    sent: bool = False
    received: bool = False

    @property
    def done(self) -> bool:
        return self.sent and self.received

    def waits_for(self) -> str:
        missing = ([] if self.sent else [f"core {self.to} to receive"]) + \
                  ([] if self.received else [f"core {self.frm} to send"])
        return f"nisa.sendrecv at {self.where} (waits for {' and '.join(missing)})"


@dataclass
class Barrier:
    """One ``nisa.core_barrier`` of one core, over ``cores``."""

    core: int
    cores: tuple[int, ...]
    where: str
    passed: bool = False

    @property
    def done(self) -> bool:
        return self.passed

    def waits_for(self) -> str:
        return f"nisa.core_barrier over cores {list(self.cores)} at {self.where}"


@dataclass
class _Core:
    tracer: Tracer
    thread: threading.Thread | None = None
    finished: bool = False
    waiting: Exchange | Barrier | None = None
    result: Any = None
    posted: list[Any] = field(default_factory=list)


class CoreTeam:
    """The physical cores of one launch, traced together (see the module's text)."""

    def __init__(self, tracers: list[Tracer], grid: tuple[int, ...] | None = None,
                 instances: list[list[tuple[int, ...]]] | None = None) -> None:
        """One tracer per core; ``grid`` the launch grid and ``instances`` the grid positions
        each core runs in turn (by default ``kernel[n]``: instance ``c`` on core ``c``)."""
        self.cores = [_Core(t) for t in tracers]
        self.instances = instances if instances is not None else [[(c,)] for c in range(len(tracers))]
        self.turn = 0
        self.lock = threading.Condition()
        self.error: BaseException | None = None
        for c, core in enumerate(self.cores):
            core.tracer.team = self
            core.tracer.grid = grid if grid is not None else (len(tracers),)
            core.tracer.start_instance(self.instances[c][0])

    @property
    def size(self) -> int:
        return len(self.cores)

    # -- running the cores -------------------------------------------------------

    def run(self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> list[Any]:
        """Run ``fn`` on every core; the value each returned, by core. The first error a
        core raised is raised here."""
        for c, core in enumerate(self.cores):
            core.thread = threading.Thread(target=self._body, args=(c, fn, args, kwargs), name=f"trnsim-nc{c}",
                                           daemon=True)
        for core in self.cores:
            assert core.thread is not None
            core.thread.start()
        try:
            for core in self.cores:
                assert core.thread is not None
                core.thread.join()
        except BaseException as e:   # Ctrl-C while the cores trace: stop them at their next turn
            with self.lock:
                if self.error is None:
                    self.error = e
                self.lock.notify_all()
            raise
        if self.error is not None:
            raise self.error
        return [core.result for core in self.cores]

    def _body(self, c: int, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> None:
        core = self.cores[c]
        tracer = core.tracer
        try:
            with self.lock:
                self._wait_turn(c)
            with tracer:
                tracer.program.use_core(c)
                for ids in self.instances[c]:
                    tracer.start_instance(ids)
                    core.result = fn(*args, **kwargs)
                    tracer.flush_matmul()
        except _Abort:
            pass
        except BaseException as e:   # noqa: BLE001 - handed to the launching thread, which raises it
            with self.lock:
                if self.error is None:
                    self.error = e
                self.lock.notify_all()
        finally:
            with self.lock:
                core.finished = True
                core.result = core.result if self.error is None else None
                if self.error is None:
                    self._hand_over(c)
                self.lock.notify_all()

    def _wait_turn(self, c: int) -> None:
        """Block (the lock held) until it is core ``c``'s turn; raise :class:`_Abort` if
        another core failed."""
        while self.turn != c and self.error is None:
            self.lock.wait()
        if self.error is not None:
            raise _Abort
        self.cores[c].tracer.program.use_core(c)

    def _hand_over(self, c: int) -> None:
        """Core ``c`` cannot go on: the turn goes to the lowest-numbered core that can,
        and if none can while some core waits, the launch fails naming where each stands."""
        for n, core in enumerate(self.cores):
            if not core.finished and (core.waiting is None or core.waiting.done):
                self.turn = n
                self.lock.notify_all()
                return
        stuck = [(n, core.waiting) for n, core in enumerate(self.cores) if not core.finished and core.waiting]
        if stuck:
            ended = [n for n, core in enumerate(self.cores) if core.finished]
            parts = [f"core {n} waits at {w.waits_for()}" for n, w in stuck]
            if ended:
                parts.append(f"core{'s' if len(ended) > 1 else ''} {', '.join(map(str, ended))} ended")
            self.error = KernelError("the cores of the launch cannot go on: " + "; ".join(parts) +
                                     "; every core must reach the same sendrecv and core_barrier calls")
        self.turn = -1
        self.lock.notify_all()

    def _meet(self, c: int, point: Exchange | Barrier) -> None:
        """Core ``c`` reached ``point``: trace what the points met so far stand for, and
        wait until ``point`` is done and the turn is ``c``'s again (the lowest-numbered
        core that can go on goes first, so core 0 leads and makes the shared HBM
        tensors the others then find)."""
        with self.lock:
            core = self.cores[c]
            core.posted.append(point)
            core.waiting = point
            self._settle()
            self._hand_over(c)
            while not (point.done and self.turn == c) and self.error is None:
                self.lock.wait()
            if self.error is not None:
                raise _Abort
            core.waiting = None
            core.tracer.program.use_core(c)

    def _settle(self) -> None:
        """Trace every send whose receiver has reached its sendrecv, and pass every
        barrier all its cores have reached."""
        progress = True
        while progress:
            progress = False
            for core in self.cores:
                for point in core.posted:
                    if isinstance(point, Exchange) and not point.sent:
                        peer = self._receiver(point)
                        if peer is not None:
                            self._send(point, peer)
                            progress = True
                    elif isinstance(point, Barrier) and not point.passed:
                        group = [self._first_barrier(n) for n in point.cores]
                        if all(b is not None and b.cores == point.cores for b in group):
                            self._pass(group)   # type: ignore[arg-type]
                            progress = True
            for core in self.cores:
                core.posted = [p for p in core.posted if not p.done]

    def _receiver(self, point: Exchange) -> Exchange | None:
        """The first sendrecv of core ``point.to`` still to receive from ``point.core``."""
        for other in self.cores[point.to].posted:
            if isinstance(other, Exchange) and not other.received and other.frm == point.core:
                return other
        return None

    def _first_barrier(self, n: int) -> Barrier | None:
        for p in self.cores[n].posted:
            if isinstance(p, Barrier) and not p.passed:
                return p
        return None

    def _send(self, point: Exchange, peer: Exchange) -> None:
        """``point.src`` into ``peer.dst``: one DMA on the sending core's queue."""
        sender = self.cores[point.core].tracer
        src, dst = point.src, peer.dst
        if src.view.size != dst.view.size:
            raise sender.fail(f"sendrecv: core {point.core} sends {src.name}{list(src.shape)} to core {peer.core}, "
                              f"whose dst {dst.name}{list(dst.shape)} has another size; give both the same "
                              "number of elements", point.where)
        sender.program.use_core(point.core)
        sender.source_override = point.where
        try:
            sender.dma(dst.view, src.view if src.shape == dst.shape else src.reshape(dst.shape).view)
        finally:
            sender.source_override = ""
        point.sent = peer.received = True

    def _pass(self, group: list[Barrier]) -> None:
        """Every core of the barrier waits for all that each of them issued before it."""
        tracers = [self.cores[b.core].tracer for b in group]
        before: set[int] = set()
        for t in tracers:
            before.update(t._last_on_track.values())
        for t in tracers:
            t._barrier = set(before)
            t._barrier_done = set()
        for b in group:
            b.passed = True

    # -- what kernels call -------------------------------------------------------

    def sendrecv(self, tracer: Tracer, src: NkiTensor, dst: NkiTensor, to: int, frm: int) -> None:
        c = tracer.core
        for what, rank in (("send_to_rank", to), ("recv_from_rank", frm)):
            if not 0 <= rank < self.size:
                raise tracer.fail(f"sendrecv: {what}={rank} names no core of this launch; the kernel runs on cores "
                                  f"0..{self.size - 1} (nl.program_id(0))")
        tracer.flush_matmul()
        self._meet(c, Exchange(c, src, dst, to, frm, caller_source()))

    def barrier(self, tracer: Tracer, cores: tuple[int, ...]) -> None:
        c = tracer.core
        bad = [n for n in cores if not 0 <= n < self.size]
        if bad:
            raise tracer.fail(f"core_barrier over cores {list(cores)}: {bad} name no core of this launch; it runs on "
                              f"cores 0..{self.size - 1}")
        if c not in cores:
            raise tracer.fail(f"core_barrier over cores {list(cores)} is called on core {c}, which is not one of them; "
                              "call it on the cores it names")
        tracer.flush_matmul()
        self._meet(c, Barrier(c, tuple(sorted(set(cores))), caller_source()))
