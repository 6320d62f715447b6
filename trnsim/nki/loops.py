"""Loops, index ranges and the launch grid of ``nki.language``, and its small helpers for
kernel code (``device_print``, ``no_reorder``).

Every loop is unrolled when the kernel is traced. Iterations overlap where their data
allow, in ``sequential_range`` as in ``affine_range``: the dependencies between
instructions (each tile's reads and writes) keep a loop-carried value in order, and the
hardware runs ahead of an iteration's end wherever nothing waits for it (the matmul
tutorial's sequential K loop keeps the tensor engine 97% busy on trn1). A loop whose
bounds the device reads at run time (``dynamic_range``, ``while_loop``) starts each
iteration after the last one ended: its branch waits for the engines.
"""

from __future__ import annotations

import builtins
import math
from typing import Any, Iterator, Sequence

import numpy as np

from trnsim.nki import emit as _e
from trnsim.nki.compiler import no_reorder as _no_reorder_block
from trnsim.nki.tiles import Affine, Mask, ParDim
from trnsim.nki.tracer import active, tracing


class LoopIndex(int):
    """A loop counter of ``affine_range``/``sequential_range``: the int itself, plus the
    depth of the loop nest it counts (1 for the outermost), by which ``nl.loop_reduce``
    knows which loop its ``loop_indices`` name. Arithmetic gives plain ints."""

    depth: int


def _loop(r: range, sequential: bool) -> Iterator[int]:
    """Iterate ``r``, telling the tracer where each iteration starts (direct allocations
    in a loop body take the first iteration's addresses); ``sequential``: each iteration
    starts after everything before it ended (a loop the device runs with a branch)."""
    tr = _e.tracer()
    tr.loop_enter()
    depth = len(tr.loops)
    try:
        for k, i in enumerate(r):
            if sequential and k:
                tr.barrier()
            tr.loop_iteration(i)
            index = LoopIndex(i)
            index.depth = depth
            yield index
    finally:
        tr.loop_exit()


# keyword hints the Neuron compiler's loops take that change how it schedules a loop,
# not what the loop computes (AWS's contributed pipelined attention passes
# precise_schedule=True); a simulated schedule follows the dependencies either way
SCHEDULE_HINTS = frozenset({"precise_schedule"})


def _hints(what: str, hints: dict[str, Any]) -> None:
    unknown = sorted(set(hints) - SCHEDULE_HINTS)
    if unknown:
        raise TypeError(f"nl.{what}() got an unexpected keyword argument {unknown[0]!r} (it takes start, stop, step "
                        f"and the scheduling hints {', '.join(sorted(SCHEDULE_HINTS))})")


def affine_range(*args: int, **hints: Any) -> Iterator[int]:
    """Iterations with no loop-carried dependency; the schedule may overlap them.
    Scheduling hints (``precise_schedule=True``) are accepted and change nothing."""
    _hints("affine_range", hints)
    if not tracing():
        return iter(range(*args))
    return _loop(range(*args), sequential=False)


def static_range(*args: int) -> Iterator[int]:
    """A loop unrolled at trace time (every loop is, in trnsim)."""
    return iter(range(*args))


def sequential_range(*args: int, **hints: Any) -> Iterator[int]:
    """Iterations with a loop-carried dependency, in order: the compiler does not reorder
    them, and each tile's reads and writes keep the carried values in order (an iteration
    still overlaps the last where nothing it does waits for it)."""
    _hints("sequential_range", hints)
    if not tracing():
        return iter(range(*args))
    return _loop(range(*args), sequential=False)


def arange(*args: int) -> Affine:
    """An index range for ``x[i_p, i_f]`` indexing and masks (``nl.arange(128)[:, None]``)."""
    r = range(*args)
    if r.step != 1:
        return Affine.base(len(r)) * r.step + r.start
    return Affine.base(len(r)) + r.start


def program_id(axis: int = 0) -> int:
    """This instance's index along ``axis`` of the launch grid (0 outside a kernel, as
    in NKI, where host code asks for the sharding of a launch without a grid)."""
    tr = active()
    if tr is None:
        return 0
    if not 0 <= axis < builtins.max(len(tr.grid), 1):
        raise tr.fail(f"program_id({axis}): the launch grid has {len(tr.grid)} axes")
    return tr.program_ids[axis] if tr.grid else 0


def num_programs(axes: int | Sequence[int] | None = 0, *, axis: int | None = None) -> int:
    """Size of the launch grid along ``axes`` (an axis, or several: the product of their
    sizes; None: every axis, the number of programs). ``axis=`` is the older spelling.
    Outside a kernel there is no grid: 1."""
    tr = active()
    if tr is None:
        return 1
    if axis is not None:
        axes = axis
    chosen = range(len(tr.grid)) if axes is None else [axes] if isinstance(axes, int) else list(axes)
    count = 1
    for a in chosen:
        if not 0 <= a < builtins.max(len(tr.grid), 1):
            raise tr.fail(f"num_programs({axes}): the launch grid has {len(tr.grid)} axes")
        count *= tr.grid[a] if tr.grid else 1
    return count


def program_ndim() -> int:
    """How many axes the launch grid has (0 outside a kernel, or for a launch without one)."""
    tr = active()
    return len(tr.grid) if tr is not None else 0


def fori_loop(lower: int, upper: int, body_fun: Any, step: int = 1) -> None:
    """``body_fun(i)`` for ``i`` in ``range(lower, upper, step)``, one iteration after
    another (the bounds must be known when the kernel is traced)."""
    for i in sequential_range(int(lower), int(upper), int(step)):
        body_fun(i)


def while_loop(init: Any, body_fun: Any) -> None:
    """``r = init; while r != 0: r = body_fun(r)``, traced iteration by iteration, so the
    condition must be known when the kernel is traced."""
    r = init
    while int(r) != 0:
        r = body_fun(r)
        _e.tracer().barrier()


def dynamic_range(start: int, stop: int | None = None, step: int = 1) -> Iterator[int]:
    """A loop with bounds the device reads at run time; trnsim traces it over the bounds
    known when the kernel is traced, each iteration starting after the last one ended
    (the device's branch waits for its engines)."""
    r = range(start) if stop is None else range(start, stop, step)
    if not tracing():
        return iter(r)
    return _loop(r, sequential=True)


# -- launch grid: logical cores and SPMD dimensions ---------------------------

class nc(int):
    """``nl.nc(2)``: a launch-grid axis spread over the 2 physical NeuronCores of a logical
    NeuronCore, instance ``i`` on core ``i``. As a factor of an axis (``nl.nc(2) * 4`` is
    ``nl.spmd_dim(nl.nc(2), 4)``, ``4 * nl.nc(2)`` is ``nl.spmd_dim(4, nl.nc(2))``) it names
    the digit of the instance index that picks the core (:class:`SpmdDim`)."""

    def __mul__(self, other: object) -> SpmdDim:   # type: ignore[override]
        return spmd_dim(self, other)   # type: ignore[arg-type]

    def __rmul__(self, other: object) -> SpmdDim:   # type: ignore[override]
        return spmd_dim(other, self)   # type: ignore[arg-type]


class SpmdDim(int):
    """One launch-grid axis of ``prod(sizes)`` instances (``nl.spmd_dim``). Where one of its
    factors is ``nl.nc(k)``, instance ``i`` written in the mixed radix of the factors (the
    first the most significant) runs on the physical core its digit at that factor names:
    ``nl.spmd_dim(nl.nc(2), 2)`` runs instances 0 and 1 on core 0 and 2 and 3 on core 1,
    ``nl.spmd_dim(2, nl.nc(2))`` instances 0 and 2 on core 0 (AWS's SPMD grid test)."""

    sizes: tuple[int, ...]
    nc_at: int | None

    def __new__(cls, sizes: tuple[int, ...], nc_at: int | None) -> SpmdDim:
        axis = super().__new__(cls, math.prod(sizes))
        axis.sizes, axis.nc_at = sizes, nc_at
        return axis

    def core_of(self, i: int) -> int:
        """The physical core of instance ``i`` of this axis (0 without an ``nl.nc`` factor)."""
        if self.nc_at is None:
            return 0
        return i // math.prod(self.sizes[self.nc_at + 1:]) % self.sizes[self.nc_at]


def spmd_dim(*sizes: int) -> SpmdDim:
    """``kernel[nl.spmd_dim(nl.nc(2), 4)]``: one grid axis of ``2 * 4`` instances, spread over
    the physical cores by its ``nl.nc`` factor (:class:`SpmdDim`)."""
    bad = [s for s in sizes if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 1]
    if not sizes or bad:
        raise TypeError(f"nl.spmd_dim{sizes!r}: each size must be a positive integer or nl.nc(k), as in "
                        "nl.spmd_dim(nl.nc(2), 4)")
    at = [i for i, s in enumerate(sizes) if isinstance(s, nc)]
    if len(at) > 1:
        raise TypeError(f"nl.spmd_dim{sizes!r} names nl.nc more than once; one factor of an axis picks the core")
    return SpmdDim(tuple(int(s) for s in sizes), at[0] if at else None)


def par_dim(size: int) -> int:
    """Marks the partition dimension of a tile shape: ``(nl.par_dim(128), 512)``, or
    ``(4, nl.par_dim(128), 512)`` for four [128, 512] tiles (legacy block dimensions)."""
    return ParDim(int(size))


def device_print(print_prefix: str, tensor: Any, mask: Mask | None = None) -> None:
    """Print ``print_prefix`` and a description of ``tensor`` when the kernel is traced.
    trnsim knows values only after simulating the whole kernel, so it prints the
    tile's name, shape, dtype and memory rather than its values."""
    print(f"{print_prefix} {tensor!r}")


def no_reorder() -> Any:
    """``with nl.no_reorder():`` keeps the block in program order; trnsim's queues keep
    program order per engine already, so the block runs as written."""
    return _no_reorder_block()
