"""Tracing a kernel into a Program: the one way trnsim makes Programs from code.

While a kernel body runs, every ``nl``/``nisa`` call appends instructions to the
current :class:`Tracer`'s Program. The tracer places tiles in SBUF and PSUM,
finds each instruction's dependencies from the memory it touches, spreads DMAs
over queues, and stamps each instruction with the kernel source line that made
it. Errors raised here name that line.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from bisect import bisect_left
import os
import sys
import threading
import weakref
from typing import Any, Callable, TYPE_CHECKING

from trnsim.errors import ProgramError
from trnsim.isa import (MAX_FREE_DIMS, MEMORY_NAMES, Activation, DmaCopy, Engine, Instruction, LoadStationary, Memory, Memset,
                        ScalarTensorTensor, Tensor, TensorCopy, TensorScalar, TensorTensor, View, core_track)
from trnsim.program import Program, partition_start_ok
from trnsim.nki.forwarding import Forwarding
from trnsim.nki.hazards import AliasConflict, Hazards, UnwrittenRead, region_of, region_of_tensor
from trnsim.nki.workload import Workload

if TYPE_CHECKING:
    from trnsim.hw.spec import ChipLike

_NKI_DIR = os.path.dirname(os.path.abspath(__file__))
# Loads (into SBUF/PSUM) and stores (out of them) go on separate queues, as the Neuron
# compiler arranges them, so a store waiting for its data never holds up a prefetch:
# the first 16 queues, three quarters for loads.
KERNEL_QUEUES = 16
# A load of HBM data that the Program itself wrote (a compiled graph's kernel reading the
# kernel ahead's result, a reload) waits for that store; it goes on queues of its own,
# the next 16, so that it holds up no prefetch behind it either (assumption: the
# compiler's queue assignment is not published).
RELOAD_QUEUES = 16


def _queue_split(chip: ChipLike) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = min(KERNEL_QUEUES, chip.dma.engines * chip.dma.queues_per_engine)
    if n < 2:
        return (0,), (0,)
    loads = max(1, n * 3 // 4)
    return tuple(range(loads)), tuple(range(loads, n))


def _reload_queues(chip: ChipLike, loads: tuple[int, ...]) -> tuple[int, ...]:
    n = chip.dma.engines * chip.dma.queues_per_engine
    if not RELOAD_QUEUES or n < KERNEL_QUEUES + RELOAD_QUEUES:
        return loads
    return tuple(range(KERNEL_QUEUES, KERNEL_QUEUES + RELOAD_QUEUES))


class KernelError(ProgramError):
    """A kernel breaks a hardware or language rule; the message names its source line."""


_inside: dict[str, bool] = {}


def _in_nki(filename: str) -> bool:
    found = _inside.get(filename)
    if found is None:
        folder = os.path.dirname(os.path.abspath(filename))
        found = _inside[filename] = folder == _NKI_DIR or folder.startswith(_NKI_DIR + os.sep)
    return found


def caller_location() -> tuple[str, int] | None:
    """(file, line) of the innermost frame outside trnsim.nki (the kernel's line)."""
    frame = sys._getframe(1)
    inside = _inside
    while frame is not None:
        filename = frame.f_code.co_filename
        found = inside.get(filename)
        if not (_in_nki(filename) if found is None else found):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None


def caller_source() -> str:
    """``file:line`` of the innermost frame outside trnsim.nki (the kernel's line)."""
    where = caller_location()
    return f"{where[0]}:{where[1]}" if where else ""


_set = object.__setattr__


class _Stack(threading.local):
    """The tracers of the kernels being traced, innermost last, per thread: the cores
    of a kernel launched over a logical NeuronCore are traced in threads of their own
    (:mod:`trnsim.nki.cores`), each with its core's tracer."""

    def __init__(self) -> None:
        self.tracers: list[Tracer] = []


_stack = _Stack()
_gc_was_enabled: list[bool] = [True]


def tracing() -> bool:
    """Whether a kernel is being traced now (in this thread)."""
    return bool(_stack.tracers)


def current() -> Tracer:
    """The tracer of the kernel being traced; errors outside a kernel."""
    tracers = _stack.tracers
    if not tracers:
        raise KernelError("nki language calls only work inside a kernel run by nki.jit, nki.simulate or nki.benchmark")
    return tracers[-1]


def active() -> Tracer | None:
    """The tracer of the kernel being traced, or None outside a kernel."""
    tracers = _stack.tracers
    return tracers[-1] if tracers else None


class Tracer:
    """State of one kernel trace: the Program, hazards, placements and the launch grid.

    Tiles live while the kernel can name them (a tile's space goes back when its Python
    object dies). When that does not fit, :meth:`trnsim.nki.jit.Kernel.trace` traces
    again with ``lifetimes`` (what :attr:`last_use` learned the first time): each tile's
    space then goes back right after the last instruction that touches it, as the
    Neuron compiler's allocator frees a tile at the end of its lifetime, so a tile made
    in a loop body lives one iteration and next fit rotates the iterations' tiles
    through the free space."""

    def __init__(self, chip: ChipLike, name: str, lifetimes: dict[int, int] | None = None, *,
                 record_uses: bool = False, uses: dict[int, list[int]] | None = None,
                 decisions: list[Any] | None = None) -> None:
        self.program = Program(chip, name=name)
        #: choices the tracer made from the room it found (:meth:`decide`), in order, each
        #: with the choice that needs less room that cannot be spilled (or None); a later
        #: trace of the same kernel makes the first trace's choices again
        self.decisions: list[tuple[Any, Any]] = []
        self._replay = decisions
        #: the estimate of when each instruction ends, by which the compiler picks engines
        self.workload = Workload(self.program.chip)
        self._chosen = -1   # the last instruction whose engine the compiler picked
        self.program.sbuf_alloc.next_fit = True
        self.program.psum_alloc.next_fit = True
        #: per tile (numbered in the order the kernel makes them), the index of the last
        #: instruction that touched it
        self.last_use: dict[int, int] = {}
        self.lifetimes = lifetimes
        self._made = [0]   # in a list: the tracers of a launch's cores number tiles in one sequence
        self._serial: dict[int, int] = {}           # id(tensor) -> its tile's number
        self._expiring: dict[int, list[Tensor]] = {}
        self._unused: list[Tensor] = []
        #: the trace that learns where tiles are used, for a trace that spills (see
        #: :meth:`make_room`): per tile number, the (logical) index of every instruction
        #: that touches it; it places what does not fit past the end of the memory
        self.record_uses = record_uses
        self.uses: dict[int, list[int]] = {} if uses is None else uses
        #: whether SBUF tiles that do not fit push others out to HBM (the trace after one
        #: that recorded the uses)
        self.spills = uses is not None
        # instructions the kernel itself asked for (spill and reload DMAs not counted),
        # shared by the cores of a launch: lifetimes and uses are counted in these
        self._logical = [0]
        self._spilling = 0
        # tiles pushed out to HBM, by id of the kernel's tensor: (tensor, HBM copy or None)
        self._spilled: dict[int, tuple[Tensor, Tensor | None]] = {}
        self._spill_hbm: dict[int, Tensor] = {}   # the HBM copy of each tile ever spilled
        self._now: dict[int, Tensor] = {}         # a tile loaded back: where it is now
        self._orig: dict[int, Tensor] = {}        # by id of such a place: the kernel's tensor
        self._zero_back: set[int] = set()         # spilled before nl.zeros wrote them
        for alloc in (self.program.sbuf_alloc, self.program.psum_alloc):
            alloc.overflow_allowed = lifetimes is None or record_uses
        # direct allocations inside loops: the compiler runs a loop body once, so every
        # iteration gets the addresses the first one chose (see direct_locations)
        self.loops: list[dict[tuple, int]] = []
        # the current counter of each of those loops, outermost first
        self.loop_values: list[int] = []
        # nl.loop_reduce's running results (see trnsim.nki.composed.loop_reduce): by call
        # key, the running tile and whether it is the tile the result was assigned to;
        # and the results not yet assigned, by id of their tensor
        self.running: dict[tuple, tuple[Any, bool]] = {}
        self.running_unassigned: dict[int, tuple[tuple, Any]] = {}
        self._loop_instances = 0
        self._outermost = 0
        self._direct_cache: dict[tuple, Any] = {}
        # an nisa.nc_matmul result waiting to learn where it lands (see hold_matmul)
        self.pending_matmul: Any = None
        # the kernel line instructions emitted now stand for (a held result's nc_matmul line)
        self.source_override = ""
        #: the track of each instruction emitted so far (the tensor engine's stationary
        #: loads on a track of their own: they overlap its multiplies)
        self.tracks: list[str] = []
        self.hazards = Hazards(self.tracks)
        #: the placement of each live on-chip tile, by id of its tensor (a tensor read as
        #: another dtype keeps its base's alive)
        self.placements: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.grid: tuple[int, ...] = ()
        self.program_ids: tuple[int, ...] = ()
        self._loads, self._stores = _queue_split(self.program.chip)
        self._reloads = _reload_queues(self.program.chip, self._loads)
        self._queue = {self._loads: 0, self._stores: 0, self._reloads: 0}
        self._stored: set[int] = set()   # ids of the HBM tensors a DMA wrote
        #: results handed on in SBUF (a compiled graph's kernels traced as one Program:
        #: :mod:`trnsim.backend.compile.overlap`): from this instruction on, a load of HBM
        #: data that a store before it wrote waits for what the store waited for, not for
        #: the store; 0: never
        self.hand_on = 0
        #: results handed on where they are (with :attr:`hand_on`): a load of what earlier
        #: kernels left in SBUF is ``forwarded`` (:mod:`trnsim.nki.forwarding`); None: off
        self.forwarding: Forwarding | None = None
        self._names: dict[str, int] = {}
        self._last_on_track: dict[str, int] = {}
        self._barrier: set[int] = set()
        self._barrier_done: set[str] = set()
        self.live = True
        # PSUM tiles made by nl.zeros, not zeroed yet: the first instruction that writes
        # all of one stands for the zeroing; anything else gets a memset first
        self.zeros: dict[int, Tensor] = {}
        # the on-chip tile placed last and how many instructions the Program had then: a
        # tile whose one writer is the instruction right after it can take an assignment's
        # place (see :meth:`retarget`)
        self._newest: tuple[Tensor, int] | None = None
        # HBM tensors the first grid instance made; later instances get the same ones,
        # in the order they ask, so every instance writes into the one output
        self.hbm_made: list[Any] = []
        self._hbm_asked = 0
        # nl.shared_constant data, by HBM tensor name: inputs the kernel made itself
        self.constants: dict[str, Any] = {}
        # while above 0, calls run under mask=False: their instructions are not emitted
        self.masked_off_depth = 0
        # tensors such calls would have written, by id: reading what nothing wrote there
        # reads the old contents, as on the chip, rather than being refused
        self.masked_off: dict[int, Tensor] = {}
        #: the physical core this tracer's instructions and tiles are on
        self.core = 0
        #: the cores a kernel launched over a logical NeuronCore runs on, traced together
        #: (:class:`trnsim.nki.cores.CoreTeam`); None for one core
        self.team: Any = None

    def for_core(self, core: int) -> Tracer:
        """A tracer for physical core ``core`` of a kernel launched over the cores of a
        logical NeuronCore (:mod:`trnsim.nki.cores`): it traces into this tracer's
        Program, tiles in that core's SBUF and PSUM, and shares the hazards (HBM is one
        memory; each core's SBUF and PSUM are their own), the tile numbering and
        lifetimes, the names and the HBM tensors made; loops, grid position, DMA queue
        rotation and barriers are its own."""
        other = Tracer.__new__(Tracer)
        other.__dict__.update(self.__dict__)
        program = self.program
        program.use_core(core)
        for alloc in (program.sbuf_alloc, program.psum_alloc):
            alloc.next_fit = True
            alloc.overflow_allowed = self.lifetimes is None or self.record_uses
        program.use_core(self.core)
        other.core = core
        other.loops, other.loop_values = [], []
        other.running, other.running_unassigned = {}, {}
        other._direct_cache = {}
        other.pending_matmul = None
        other.source_override = ""
        other.program_ids = ()
        other._queue = {self._loads: 0, self._stores: 0, self._reloads: 0}
        other._last_on_track, other._barrier, other._barrier_done = {}, set(), set()
        other.zeros = {}
        other._newest = None
        other.masked_off_depth, other.masked_off = 0, {}
        other._hbm_asked = 0
        other.team = None
        return other

    def __enter__(self) -> Tracer:
        # A trace makes several objects per instruction and frees tiles by reference
        # counting alone; the cyclic collector would rescan the growing Program over and
        # over (a fifth of the time at 16,000 instructions, more beyond), so it waits
        # until the outermost trace ends.
        tracers = _stack.tracers
        if not tracers and threading.current_thread() is threading.main_thread():
            _gc_was_enabled[:] = [gc.isenabled()]
            gc.disable()
        tracers.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        tracers = _stack.tracers
        tracers.pop()
        if not tracers and threading.current_thread() is threading.main_thread() and _gc_was_enabled[0]:
            gc.enable()

    def psum_overflowed(self) -> bool:
        """Whether a PSUM allocation of any core did not fit (PSUM is never spilled)."""
        return any(psum.overflowed is not None for _, psum in self.program.allocators)

    def overflowed(self) -> Exception | None:
        """The first allocation that did not fit while tiles lived as long as the kernel
        named them (None if all fit)."""
        for sbuf, psum in self.program.allocators:
            if sbuf.overflowed or psum.overflowed:
                return sbuf.overflowed or psum.overflowed
        return None

    def new_tile(self) -> int:
        """Number the next tile the kernel makes (its blocks are placed under this number)."""
        self._made[0] += 1
        return self._made[0]

    def _track(self, t: Tensor, serial: int | None) -> None:
        """Remember which tile ``t`` belongs to; with lifetimes, schedule its release."""
        serial = serial if serial is not None else self.new_tile()
        self._serial[id(t)] = serial
        if self.lifetimes is not None:
            last = self.lifetimes.get(serial)
            if last is None:
                self._unused.append(t)
            else:
                self._expiring.setdefault(last, []).append(t)

    def loop_enter(self) -> None:
        """An ``affine_range``/``sequential_range`` loop starts."""
        if not self.loops:
            self._loop_instances += 1
            self._outermost = self._loop_instances
        self.loops.append({})
        self.loop_values.append(0)

    def loop_iteration(self, value: int) -> None:
        self.loops[-1].clear()
        self.loop_values[-1] = value

    def loop_exit(self) -> None:
        if self.loops:
            self.loops.pop()
            self.loop_values.pop()

    def direct_locations(self, site: tuple, compute: Any) -> Any:
        """``compute()`` (a direct allocation's addresses), or inside a loop what the first
        evaluation at this call site in this loop nest gave: the Neuron compiler traces
        a loop body once, so a kernel that moves its next address on in the body
        (``cur_addr += ...``) allocates at the same addresses in every iteration."""
        if not self.loops:
            return compute()
        counts = self.loops[-1]
        n = counts.get(site, 0)
        counts[site] = n + 1
        key = (self._outermost, len(self.loops), site, n)
        found = self._direct_cache.get(key)
        if found is None:
            found = self._direct_cache[key] = compute()
        return found

    def hold_matmul(self, result: Any) -> None:
        """Keep ``result`` (a matmul result) unlanded until the next instruction: an
        assignment or ``+=`` lands it in the kernel's own PSUM tile, anything else in a
        fresh one."""
        self.flush_matmul()
        result.reserve()
        self.pending_matmul = result

    def flush_matmul(self) -> None:
        """Land a held matmul result in a fresh PSUM tile."""
        held, self.pending_matmul = self.pending_matmul, None
        if held is not None:
            held.materialize()

    def place_at(self, shape: tuple[int, ...], dtype: Any, memory: Memory, name: str, start_partition: int,
                 byte_offset: int, serial: int | None = None) -> Tensor:
        """Place a tile at an address the kernel chose (direct allocation); it may share its
        space with other such tiles, and the hazards see through the sharing."""
        if self.program.core != self.core:
            self.program.use_core(self.core)
        try:
            t = self.program.place_at(memory, shape, dtype, name, start_partition, byte_offset)
        except ProgramError as e:
            raise self.fail(str(e)) from None
        self.hazards.placed_aliased(t)
        self._track(t, serial)
        return t

    @property
    def chip(self) -> Any:
        return self.program.chip

    def fresh_name(self, base: str) -> str:
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return f"{base}_{n}"

    def fail(self, message: str, source: str | None = None) -> KernelError:
        """The error for ``message`` at the kernel's line, the tensors it names by the
        kernel's own names (:meth:`trnsim.program.Program.source_names`)."""
        where = source or caller_source()
        message = self.program.source_names(message)
        return KernelError(f"{where}: {message}" if where else message)

    def place(self, shape: tuple[int, ...], dtype: Any, memory: Memory, name: str | None = None,
              serial: int | None = None) -> Tensor:
        """Allocate a tile (SBUF/PSUM) or an HBM tensor; errors name the kernel line."""
        if name is None:
            name = self.fresh_name(MEMORY_NAMES[memory])
            self.program.made_at[name] = caller_location()
        else:
            name = self.fresh_name(name)
        if self.program.core != self.core:
            self.program.use_core(self.core)
        try:
            if memory is Memory.SBUF:
                t = self._sbuf(shape, dtype, name)
            elif memory is Memory.PSUM:
                t = self.program.psum(shape, dtype, name)
            else:
                t = self.program.hbm(shape, dtype, name)
        except ProgramError as e:
            raise self.fail(str(e)) from None
        if memory is Memory.HBM:
            self.hazards.register(t)
        else:
            self.hazards.placed(t)
            self._track(t, serial)
            self._newest = (t, len(self.program.instructions))
        return t

    def _sbuf(self, shape: tuple[int, ...], dtype: Any, name: str) -> Tensor:
        """Place an SBUF tile; in a trace that spills, push tiles out to HBM until it fits
        (asking the allocator first: a caught allocation error would keep the kernel's
        frames, and with them its temporaries, alive while tracing runs without gc)."""
        if self.spills and shape:
            alloc = self.program.sbuf_alloc
            nbytes = math.prod(shape[1:]) * dtype.itemsize
            while nbytes <= alloc.partition_bytes and not alloc.fits(0, shape[0], nbytes) \
                    and self.make_room(shape[0]):
                pass
        return self.program.sbuf(shape, dtype, name)

    # -- spilling -----------------------------------------------------------------
    #
    # When the tiles of a kernel do not fit in SBUF even freed at their last use, the
    # Neuron compiler spills: it stores a live tile to HBM, gives its space to another
    # and loads it back before its next use (neuron-profile shows the spill and reload
    # DMA queues). The trace that spills knows from the trace before where each tile is
    # used next, and pushes out the tile used furthest ahead (Belady's choice). A tile
    # comes back wherever there is room then (pushing out others the same way): from
    # then on the instructions that name it touch its new place. Spill and reload are
    # DMAs between the tile and an HBM copy of it, timed and computed as any other.

    def _next_use(self, t: Tensor) -> int | None:
        """The logical index of the next instruction touching ``t``; None if none is known."""
        n = self._serial.get(id(t))
        found = self.uses.get(n) if n is not None else None
        if not found:
            return None
        at = bisect_left(found, self._logical[0])
        return found[at] if at < len(found) else None

    def _spillable(self, t: Tensor | None) -> bool:
        return t is not None and t.memory is Memory.SBUF and id(t) in self._serial and \
            self.hazards.spillable(t) and not any(base is t for base in self.program.aliases.values())

    def _live_tiles(self) -> dict[str, Tensor]:
        tiles = {p.tensor.name: p.tensor for p in list(self.placements.values())}
        tiles.update((t.name, t) for t in self._now.values())
        return tiles

    def decide(self, choose: Callable[[], Any], roomier: Callable[[Any], Any] = lambda choice: None) -> Any:
        """``choose()``, a choice the tracer makes from the room it finds now (a partition
        broadcast kept in PSUM, copied out, or made by DMA), or in a later trace of the
        kernel the first trace's choice at this point: tiles freed at their last use leave
        more room, and a choice that changed the instructions would move every lifetime and
        use counted in them. ``roomier(choice)``: the choice that holds less of what is
        never spilled (PSUM), made instead when the kernel runs out of it (None: none)."""
        n = len(self.decisions)
        choice = self._replay[n] if self._replay is not None and n < len(self._replay) else choose()
        self.decisions.append((choice, roomier(choice)))
        return choice

    def make_room(self, partitions: int) -> bool:
        """Push the SBUF tile used furthest ahead out to HBM (one overlapping partitions
        0..``partitions``, not needed by the next instructions); False when none can go."""
        alloc = self.program.allocators[self.core][0]
        tiles = self._live_tiles()
        soon = self._logical[0] + 2   # the instruction about to be emitted, and a zeroing before it
        best: tuple[float, int, Tensor] | None = None
        for a in alloc.live.values():
            t = tiles.get(a.name)
            if a.direct or not a.overlaps_partitions(0, partitions) or not self._spillable(t):
                continue
            assert t is not None
            nxt = self._next_use(t)
            if nxt is not None and nxt < soon:
                continue
            key = (float("inf") if nxt is None else float(nxt), a.partitions * a.nbytes, t)
            if best is None or key[:2] > best[:2]:
                best = key
        if best is None:
            return False
        self._spill(best[2])
        return True

    def _spill(self, t: Tensor) -> None:
        """Store ``t`` to its tile's HBM copy (if anything wrote it) and give its space back."""
        orig = self._orig.get(id(t), t)
        copy = None
        if self.hazards.written(t.view()):
            copy = self._spill_hbm.get(id(orig))
            if copy is None:
                copy = self._spill_hbm[id(orig)] = self.program.hbm(t.shape, t.dtype,
                                                                     self.fresh_name(f"{orig.name}_spill"))
                self.hazards.register(copy)
            self._spilling += 1
            try:
                self.emit(DmaCopy(copy.view(), t.view(), self.next_queue(copy.view())), check_written=False)
            finally:
                self._spilling -= 1
        if id(orig) in self.zeros:   # not zeroed yet: it comes back as zeros still to write
            self.zeros.pop(id(orig))
            self._zero_back.add(id(orig))
        self.hazards.freed(t)
        self.program.free(t)
        self._now.pop(id(orig), None)
        self._spilled[id(orig)] = (orig, copy)

    def _reload(self, orig: Tensor) -> Tensor:
        """Bring spilled ``orig`` back into SBUF, wherever there is room; returns its new place."""
        _, copy = self._spilled.pop(id(orig))
        new = self._sbuf(orig.shape, orig.dtype, self.fresh_name(f"{orig.name}_r"))
        self.hazards.placed(new)
        self._serial[id(new)] = self._serial[id(orig)]
        self._orig[id(new)] = orig
        self._now[id(orig)] = new
        if id(orig) in self._zero_back:
            self._zero_back.discard(id(orig))
            self.zeros[id(new)] = new
        if copy is not None:
            self._spilling += 1
            try:
                self.emit(DmaCopy(new.view(), copy.view(), self.next_queue(new.view())), check_written=False)
            finally:
                self._spilling -= 1
        return new

    def _moved(self, inst: Instruction) -> None:
        """Point ``inst``'s operands at the tiles' current places, loading spilled ones back."""
        d = inst.__dict__
        for name in type(inst)._operand_fields:
            v = d[name]
            if v.__class__ is not View:
                continue
            key = id(v.tensor)
            if key in self._spilled:
                self._reload(v.tensor)
            now = self._now.get(key)
            if now is not None:
                _set(inst, name, View(now, v.offset, v.dims))

    def current(self, view: View) -> View | None:
        """``view`` on its tile's current place (a tile spilled and loaded back moved);
        None while the tile is out in HBM."""
        key = id(view.tensor)
        if key in self._spilled:
            return None
        now = self._now.get(key)
        return view if now is None else View(now, view.offset, view.dims)

    def written(self, view: View) -> bool:
        """Whether anything wrote part of ``view`` (wherever its tile is now)."""
        now = self.current(view)
        if now is None:
            return self._spilled[id(view.tensor)][1] is not None
        return self.hazards.written(now)

    def room(self, view: View, copies: int) -> bool:
        """Whether SBUF has room now for ``copies`` more of the region ``view`` covers (the
        compiler's copies of a rewritten tile, :mod:`trnsim.nki.hazards`)."""
        p0, p1, b0, b1 = region_of(view)
        return self.program.sbuf_alloc.fits(p0, p1 - p0, copies * (b1 - b0))

    def retarget(self, value: Any, target: Any) -> bool:
        """``target[...] = value`` where ``value`` is all of a fresh tile that only the last
        instruction wrote (the caller knows nothing else names it): that instruction
        writes ``target`` instead, as the compiler has it, with no copy through the
        temporary tile. False (the caller copies) unless the dtypes and shapes match, the
        target needs no zeroing first and the instruction may write it (its engine's
        memories and partitions)."""
        program = self.program
        newest = self._newest
        v, t = value.view, target.view
        temp = v.tensor
        if newest is None or newest[0] is not temp or self.masked_off_depth or self.pending_matmul is not None:
            return False
        if id(t.tensor) in self._spilled or id(t.tensor) in self._now:
            return False   # a spilled tile: the copy goes through emit, which finds where it is
        index = newest[1]
        t = _shaped_like(t, v)
        if t is None or len(program.instructions) != index + 1 or not _converts_on_write(program.instructions[index], v, t) \
                or t.tensor is temp or id(t.tensor) in self.zeros or id(temp) in self.masked_off \
                or not self.covers_whole(v):
            return False
        last = program.instructions[index]
        writes = last.writes()
        # the temporary is one of its writes (a reducing instruction also writes its
        # [P, 1] result elsewhere), and nothing else it touches is the temporary
        if last.core != self.core or v not in writes or sum(w.tensor is temp for w in writes) != 1 \
                or any(r.tensor is temp for r in last.reads()):
            return False
        field = next((f for f in last.write_fields if getattr(last, f) == v), None)
        if field is None:
            return False
        if not isinstance(last, DmaCopy) and t.tensor.on_chip and not partition_start_ok(t.start_partition, t.partitions):
            return False
        new = dataclasses.replace(last, **{field: t})
        if getattr(new, "forwarded", False):   # a load into another place: forwarded only if that place is too
            _set(new, "forwarded", self.forwarding is not None and self.forwarding.in_sbuf(new, self.hand_on))
        # the estimate without the replaced instruction (emit adds it back if this returns False)
        self.workload.forget_from(index)
        if self._chosen == index:   # the compiler picks the engine again for the new operands
            _set(new, "engine", self.workload.choose(new, last.deps))
        try:
            program.check_operands(new)
        except ProgramError:
            return False
        # the temporary's space is not written after all: what its earlier tenants' readers
        # made the write wait for goes (what the reads wait for stays)
        stale = self.hazards.inherited(temp)
        deps = self.hazards.retarget(index, temp, _unaliased(program.aliases, (t,)) if program.aliases else (t,),
                                     self.room)
        kept = set(last.deps)
        if stale:
            kept.difference_update(set(stale) - self._barrier)   # a device loop's barrier stays
            for r in last.reads():
                kept.update(self.hazards.last_writers(r))
        deps = (kept | deps) - {index}   # it reads the target itself (t[...] = t + x): a read comes before the write
        program.replace_last(new, self.hazards.latest(deps))
        if self.forwarding is not None:
            self.forwarding.wrote(index, new)
        if temp.on_chip:
            program.allocators[temp.core][0 if temp.memory is Memory.SBUF else 1].forget_placement(temp.name)
        n = self._serial.get(id(t.tensor))
        if n is not None:
            if self.lifetimes is None:
                self.last_use[n] = self._logical[0] - 1
            elif self.record_uses:
                self._record_uses((t,), self._logical[0] - 1)
        return True

    def running_assigned(self, value: Any, target: Any) -> None:
        """``target[...] = value`` was copied: if ``value`` is a running ``nl.loop_reduce``
        result, ``target`` becomes that call's accumulator (see
        :func:`trnsim.nki.composed.loop_reduce`)."""
        if self.running_unassigned:
            entry = self.running_unassigned.pop(id(value.view.tensor), None)
            if entry is not None and entry[1] is value:
                self.running[entry[0]] = (target, True)

    def place_registers(self, shape: tuple[int, ...], dtype: Any, name: str) -> Tensor:
        """Engine registers held as an SBUF-shaped tensor outside the space kernels
        allocate (:meth:`trnsim.program.Program.registers`); live for the whole kernel."""
        if self.program.core != self.core:
            self.program.use_core(self.core)
        try:
            t = self.program.registers(shape, dtype, self.fresh_name(name))
        except ProgramError as e:
            raise self.fail(str(e)) from None
        self.hazards.placed(t)
        return t

    def start_instance(self, ids: tuple[int, ...]) -> None:
        """Begin tracing the launch-grid instance ``ids``: what an instance keeps while it
        runs (its ``nl.loop_reduce`` running results) starts afresh."""
        self.program_ids = ids
        self._hbm_asked = 0
        self.running, self.running_unassigned = {}, {}

    def shared_hbm(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """For a grid instance after the first: the HBM tensor the first one made at this
        point of the kernel (None for the first instance)."""
        if self.team is not None:   # the cores of a logical NeuronCore: whichever asks first makes it
            k = self._hbm_asked
            self._hbm_asked += 1
            if k >= len(self.hbm_made):
                return None
            return self._same_hbm(k, shape, dtype)
        if not self.program_ids or not any(self.program_ids):
            return None
        k = self._hbm_asked
        self._hbm_asked += 1
        if k >= len(self.hbm_made):
            raise self.fail(f"grid instance {self.program_ids} makes more HBM tensors than instance 0; "
                            "every instance must make the same outputs")
        return self._same_hbm(k, shape, dtype)

    def _same_hbm(self, k: int, shape: tuple[int, ...], dtype: Any) -> Any:
        made = self.hbm_made[k]
        if made.shape != tuple(shape) or made.dtype is not dtype:
            raise self.fail(f"grid instance {self.program_ids} makes HBM tensor {k} as {list(shape)} {dtype.name}, "
                            f"instance 0 made it {list(made.shape)} {made.dtype.name}; make the same outputs in every instance")
        return made

    def release(self, t: Tensor) -> None:
        """Give an on-chip tile's space back (its Python object is gone, or its lifetime ended)."""
        alloc = self.program.allocators[t.core][0 if t.memory is Memory.SBUF else 1]
        if self._spilled and self._spilled.pop(id(t), None) is not None:
            return   # out in HBM and not needed back
        if self._now:
            t = self._now.pop(id(t), t)   # loaded back elsewhere: free that place
        if t.name not in alloc.live:
            return  # freed at its last use already; now its Python object went too
        self.zeros.pop(id(t), None)
        self.hazards.freed(t)
        self.program.free(t)

    def _handed_on(self, inst: DmaCopy, deps: set[int], before: int) -> set[int]:
        """A load's dependencies where results are handed on in SBUF (:attr:`hand_on`):
        instead of a store of the tensor it reads made before instruction ``before`` (by
        an earlier kernel: a kernel's own spills and scratch round trips still wait for
        their stores), what that store waited for (the data being in SBUF)."""
        instructions = self.program.instructions
        out: set[int] = set()
        for d in deps:
            store = instructions[d]
            if d < before and store.__class__ is DmaCopy and store.dst.tensor is inst.src.tensor \
                    and store.src.tensor.on_chip and id(store.dst.tensor) in self._stored:
                out.update(store.deps)
            else:
                out.add(d)
        return out

    def barrier(self) -> None:
        """What comes next starts after everything so far has ended (``sequential_range``)."""
        self.wait_for(self.last_instructions())

    def last_instructions(self) -> set[int]:
        """The last instruction traced so far on each track: everything so far has ended
        when these have."""
        return set(self._last_on_track.values())

    def wait_for(self, last: set[int]) -> None:
        """What comes next on each track starts after the instructions ``last`` (from
        :meth:`last_instructions`) have ended."""
        self._barrier = set(last)
        self._barrier_done = set()

    def next_queue(self, dst: View) -> int:
        """Round-robin over the load queues for transfers into SBUF/PSUM, the store queues otherwise."""
        return self._next(self._loads if dst.tensor.on_chip else self._stores)

    def _next(self, queues: tuple[int, ...]) -> int:
        n = self._queue[queues]
        self._queue[queues] = (n + 1) % len(queues)
        return queues[n]

    def covers_whole(self, v: View) -> bool:
        """Whether ``v`` is all of its tensor."""
        return region_of(v) == region_of_tensor(v.tensor) and v.size == v.tensor.size

    def _zero_first(self, reads: tuple[View, ...], writes: tuple[View, ...]) -> None:
        for v in reads + writes:
            t = self.zeros.pop(id(v.tensor), None)
            if t is None:
                continue
            if v in writes and v not in reads and self.covers_whole(v):
                continue  # overwritten whole: the zeros never matter
            self.emit(Memset(t.view(), 0.0, engine=Engine.VECTOR), check_written=False)

    def emit(self, inst: Instruction, check_written: bool = True, choose: bool = False) -> int:
        """Append ``inst`` with the dependencies its accesses imply; returns its index.
        An elementwise instruction whose operands walk more free dimensions than one
        access pattern can is emitted as several (see :func:`_within_access_dims`).
        ``choose``: the compiler picks its engine (:mod:`trnsim.nki.workload`)."""
        if self.masked_off_depth:
            for v in inst.writes():
                self.masked_off[id(v.tensor)] = v.tensor
            return -1
        if self.pending_matmul is not None:
            self.flush_matmul()
        if any(len(v.dims) > MAX_FREE_DIMS + 1 for v in inst.reads() + inst.writes()):
            pieces = _within_access_dims(inst)
            if pieces is None:
                raise self.fail(f"{inst.opcode}: an operand walks more than {MAX_FREE_DIMS} free dimensions "
                                f"({inst.describe()}), and only elementwise instructions are split into several; "
                                f"index fewer free axes at once")
            index = -1
            for piece in pieces:
                index = self.emit(piece, check_written, choose)
            return index
        source = self.source_override or caller_source()
        _set(inst, "source", source)
        if self.core:
            _set(inst, "core", self.core)
        if (self._spilled or self._now) and not self._spilling:
            before = len(self.program.instructions)
            self._moved(inst)
            newest = self._newest
            if newest is not None and newest[1] == before:   # reloads went first: the tile's writer is next
                self._newest = (newest[0], len(self.program.instructions))
        reads, writes = inst.reads(), inst.writes()
        if self.zeros:
            self._zero_first(reads, writes)
        program = self.program
        index = len(program.instructions)
        checked_reads, checked_writes = reads, writes
        if program.aliases:   # an HBM tensor read as another dtype is its base's bytes, all of them
            reads, writes = _unaliased(program.aliases, reads), _unaliased(program.aliases, writes)
        try:
            deps = self.hazards.access(index, reads, writes, check_written, room=self.room)
        except UnwrittenRead as e:
            if id(e.view.tensor) not in self.masked_off:
                raise self.fail(f"reads {_tile_name(e.view)} before anything wrote it; load, memset or compute it "
                                "first", source) from None
            # only skipped (masked-off) instructions wrote it: it reads what its memory holds
            try:
                deps = self.hazards.access(index, reads, writes, False, stale=self.masked_off, room=self.room)
            except AliasConflict as conflict:
                raise self.fail(_conflict(conflict, self.chip.psum.bank_bytes), source) from None
        except AliasConflict as e:
            raise self.fail(_conflict(e, self.chip.psum.bank_bytes), source) from None
        if self.hand_on and inst.__class__ is DmaCopy and inst.dst.tensor.on_chip and not inst.src.tensor.on_chip:
            if self.forwarding is not None and self.forwarding.in_sbuf(inst, self.hand_on):
                _set(inst, "forwarded", True)
            deps = self._handed_on(inst, deps, self.hand_on)
        logical = self._logical[0]
        if self.lifetimes is None:
            serial = self._serial
            last = self.last_use
            for v in reads + writes:
                n = serial.get(id(v.tensor))
                if n is not None:
                    last[n] = logical
        elif self.record_uses:
            self._record_uses(reads + writes, logical)
        workload = self.workload
        for i in range(len(workload.end), index):
            workload.add(program.instructions[i])
        if choose:
            _set(inst, "engine", workload.choose(inst, deps))
            self._chosen = index
        # stationary loads overlap the multiply before them, so a barrier needs the last of each
        track = core_track("tensor.load", self.core) if inst.__class__ is LoadStationary else inst.track
        if self._barrier and track not in self._barrier_done:
            deps |= self._barrier
            self._barrier_done.add(track)
        self._last_on_track[track] = index
        try:
            program.add_traced(inst, self.hazards.latest(deps), checked_reads, checked_writes)
        except ProgramError as e:
            raise self.fail(str(e), source) from None
        if self.forwarding is not None:
            self.forwarding.wrote(index, inst)
        self.tracks.append(track)
        if not self._spilling:
            self._logical[0] += 1
            if self.lifetimes is not None:
                self._expire(logical)
        return index

    def _record_uses(self, views: tuple[View, ...], logical: int) -> None:
        serial, uses = self._serial, self.uses
        for v in views:
            n = serial.get(id(v.tensor))
            if n is not None:
                found = uses.get(n)
                if found is None:
                    uses[n] = [logical]
                elif found[-1] != logical:
                    found.append(logical)

    def _expire(self, index: int) -> None:
        """Free the tiles whose lifetime ends at instruction ``index`` (and those never used)."""
        for t in self._expiring.pop(index, ()):
            self.release(t)
        while self._unused:
            self.release(self._unused.pop())

    def dma(self, dst: View, src: View) -> int:
        if not dst.tensor.on_chip:
            self._stored.add(id(dst.tensor))
        elif not src.tensor.on_chip and id(src.tensor) in self._stored:
            return self.emit(DmaCopy(dst, src, self._next(self._reloads)))
        return self.emit(DmaCopy(dst, src, self.next_queue(dst)))

    def engine_for(self, engine: Any, default: Engine) -> Engine:
        """NKI's ``engine=`` argument: None or ``nki.isa`` engine constants."""
        if engine is None:
            return default
        if isinstance(engine, Engine):
            return engine
        raise self.fail(f"engine {engine!r} is not one of nisa.vector_engine, nisa.scalar_engine, nisa.gpsimd_engine, "
                        "nisa.tensor_engine")


# instructions that act element by element on operands of one shape (besides [P, 1]
# per-partition operands), so they can run as several over slices of a leading axis
_ELEMENTWISE = (TensorTensor, TensorScalar, TensorCopy, ScalarTensorTensor, Memset, Activation, DmaCopy)


def _within_access_dims(inst: Instruction) -> list[Instruction] | None:
    """``inst`` as instructions whose operands walk at most ``MAX_FREE_DIMS`` free
    dimensions each, as NKI's compiler emits an access of more: axes of size 1 dropped,
    adjacent axes merged where every operand is contiguous across them, then one
    instruction per index of the leading free axis, recursively. None when ``inst`` is
    not elementwise (or an activation that also reduces) or its operands' shapes differ."""
    if not isinstance(inst, _ELEMENTWISE) or getattr(inst, "reduce_dst", None) is not None:
        return None
    fields = [f for f in type(inst)._operand_fields if isinstance(getattr(inst, f), View)]
    big = [f for f in fields if len(getattr(inst, f).dims) > 2]
    if any(getattr(inst, f).free_size != 1 for f in fields if f not in big):
        return None   # a flat operand against a many-axis one: no common axis to split
    shape = getattr(inst, big[0]).shape
    if any(getattr(inst, f).shape != shape for f in big):
        return None
    views = {f: getattr(inst, f) for f in big}
    keep = [0] + [i for i in range(1, len(shape)) if shape[i] != 1]
    dims = {f: [v.dims[i] for i in keep] for f, v in views.items()}
    i = len(keep) - 2
    while i >= 1:   # merge axis i with i + 1 where every operand is contiguous across them
        if all(d[i][0] == d[i + 1][0] * d[i + 1][1] for d in dims.values()):
            for d in dims.values():
                d[i:i + 2] = [(d[i + 1][0], d[i][1] * d[i + 1][1])]
        i -= 1
    first = next(iter(dims.values()))
    if len(first) <= MAX_FREE_DIMS + 1:
        return [dataclasses.replace(inst, **{f: View(views[f].tensor, views[f].offset, tuple(dims[f])) for f in big})]
    pieces: list[Instruction] = []
    for a in range(first[1][1]):
        sliced = {f: View(views[f].tensor, views[f].offset + a * d[1][0], tuple(d[:1] + d[2:])) for f, d in dims.items()}
        piece = dataclasses.replace(inst, **sliced)
        if any(len(v.dims) > MAX_FREE_DIMS + 1 for v in sliced.values()):
            more = _within_access_dims(piece)
            if more is None:
                return None
            pieces.extend(more)
        else:
            pieces.append(piece)
    return pieces


def _converts_on_write(inst: Instruction, v: View, t: View) -> bool:
    """Whether ``inst``, which wrote ``v``, may write ``t`` instead: the same dtype, or
    float dtypes both where ``inst`` is an engine's elementwise instruction, which rounds
    what it computes into its destination's dtype as it writes (``bf16_tile[...] =
    nisa.activation(...)`` on fp32 data is one instruction on the chip, not an
    activation and a copy). Not an instruction that also reduces what it wrote (the
    reduction would see the other rounding), a matmul (PSUM accumulates fp32) or a DMA."""
    if v.dtype is t.dtype:
        return True
    if not (v.dtype.is_float and t.dtype.is_float):
        return False
    if isinstance(inst, (Activation, TensorScalar)) and inst.reduce_dst is not None:
        return False
    return isinstance(inst, (Activation, TensorCopy, TensorScalar, TensorTensor, ScalarTensorTensor))


def _shaped_like(t: View, v: View) -> View | None:
    """``t`` with ``v``'s shape where the two differ only in axes of size 1 past the
    partition axis (``out[:, i, j] = nl.divide(acc, n)``: [P] or [P, 1, 1] against [P, 1]);
    None where they differ otherwise."""
    if t.shape == v.shape:
        return t
    if t.tensor.on_chip != v.tensor.on_chip or (t.tensor.on_chip and t.dims[0][1] != v.dims[0][1]):
        return None
    start = 1 if t.tensor.on_chip else 0
    kept = [d for d in t.dims[start:] if d[1] != 1]
    if [d[1] for d in kept] != [d[1] for d in v.dims[start:] if d[1] != 1]:
        return None
    taken = iter(kept)
    dims = t.dims[:start] + tuple((1, 1) if d[1] == 1 else next(taken) for d in v.dims[start:])
    return View(t.tensor, t.offset, dims)


def _unaliased(aliases: dict[int, Tensor], views: tuple[View, ...]) -> tuple[View, ...]:
    """``views``, each of an HBM alias (:meth:`trnsim.program.Program.hbm_alias`) as the whole of its base."""
    return tuple(aliases[id(v.tensor)].view() if id(v.tensor) in aliases else v for v in views)


def _conflict(e: AliasConflict, bank_bytes: int) -> str:
    t, other = e.view.tensor, e.other
    where = f"partitions {t.start_partition}..{t.start_partition + t.shape[0] - 1} from byte {t.byte_offset}"
    if t.memory is Memory.PSUM:
        where = f"PSUM bank {t.byte_offset // bank_bytes}"
    return (f"reads {_tile_name(e.view)}, but {other.name} shares its space ({where}) and wrote it since: the two "
            "are live at once (a lifetime conflict the Neuron compiler reports, or computes wrongly with); "
            "give the tensor more physical tiles (num_free_tiles / num_bank_tiles) or other addresses")


def _tile_name(v: View) -> str:
    return f"{v.tensor.memory.value.upper()} tile {v.tensor.name}{list(v.shape)}"
