"""Kernels of a compiled graph scheduled as one program over the engines.

A compiled graph is one program on the chip: the tensor engine starts the next matmul
while the vector engine finishes a norm, and DMA loads the weights of kernels ahead
while the current one computes. Timing each kernel alone and adding them up charges
every kernel's start-up (its first loads' latency) and drain (its last stores) in full,
and never lets a weight load run ahead of the compute before it.

A *segment* of the graph's kernels (consecutive kernels with Programs of their own,
none waiting on a collective) is traced again as one Program: each kernel in turn,
reading the results of the kernels before it where the graph feeds them to it (so the
dependencies between kernels are the tiles', found by the tracer as inside one kernel),
all in the SBUF they share (a tile reuses the space of one freed before it only after
everything that touched that space: :mod:`trnsim.nki.hazards`). The combined run says,
for each kernel, when its first instruction starts and when its last one ends: the
kernel's place in the graph (:class:`Place`).

Results stay where the compiler would keep them: a later kernel's load of a result
into the partitions it was stored from is ``forwarded`` (it moves nothing:
:mod:`trnsim.nki.forwarding` says when), a result that only later kernels of the
segment read, all forwarded, is never stored (:func:`_kept_in_sbuf`), and a matmul
reading an earlier kernel's result takes it in rows (``OpCost.in_rows``).

A kernel keeps its own time alone, and no place, where it cannot be traced beside the
others: without a Program of its own (an estimate, an NKI op, a group of kernels), a
Program covering part of its work repeated, after a collective, or reading an earlier
kernel's result in a shape that no result of that kernel has (a kernel traced on one
slab or one head of its work against a whole tensor): trnsim cuts the segment there
rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch.fx as fx

from trnsim.backend.compile.patterns import FREE
from trnsim.backend.opcost import OpCost
from trnsim.errors import TrnSimError


@dataclass(frozen=True)
class Place:
    """Where a kernel runs in its graph: it ends ``after_ps`` after the kernel ahead of it
    ends (its own time alone for a kernel that was not traced beside others) and starts
    ``lead_ps`` before its own end. A kernel traced in a segment has its instructions in
    ``run`` (the segment's), ``first`` to ``last``, the first starting at ``begin_ps``."""

    after_ps: int
    lead_ps: int
    run: Any = field(default=None, repr=False, compare=False)
    first: int = 0
    last: int = 0
    begin_ps: int = 0

    @classmethod
    def alone(cls, cost: OpCost) -> Place:
        return cls(cost.ps, cost.ps)


#: kernels ahead of the oldest one still running that may start (a kernel starts once
#: the kernel this many places before the one ahead of it has ended); None: no limit.
#: How far ahead the compiler schedules is not published; with results kept in SBUF
#: (``forwarded`` loads and stores) the limit that remains is the physical one: a kernel's
#: loads start once their SBUF space is free (the tile before it there has been read,
#: :mod:`trnsim.nki.hazards`) and their queue is (assumption: no limit of its own)
AHEAD: int | None = None

#: segments already worked out, by the ids of their costs and their links; the costs are
#: kept so that their ids stay theirs
_segments: dict[tuple, tuple[list[OpCost], list[Place]]] = {}


def places(costs: list[OpCost], producers: list[list[int]], apart: list[bool],
           alone: list[bool] | None = None, read_until: list[int] | None = None) -> list[Place]:
    """Each kernel's :class:`Place`. ``producers[i]``: the earlier kernels whose results
    kernel ``i`` reads, in the order it reads them; ``apart[i]``: whether kernel ``i``
    waits for something after the kernel ahead of it (a collective); ``alone[i]``:
    whether kernel ``i`` keeps its own time, traced beside no other; ``read_until[i]``:
    the last kernel that reads kernel ``i``'s results, ``len(costs)`` where anything
    else does (the graph's outputs, a collective; :func:`last_readers`); None: every
    result is read after the graph."""
    out = [Place.alone(c) for c in costs]
    joins = [_joins(c) and not (alone and alone[i]) for i, c in enumerate(costs)]
    until = read_until if read_until is not None else [len(costs)] * len(costs)
    start = 0
    for i in range(len(costs) + 1):
        if i == len(costs) or not joins[i] or apart[i]:
            _place(costs, producers, until, start, i, out)
            start = i if i < len(costs) and joins[i] else i + 1
    return out


def _joins(cost: OpCost) -> bool:
    """Whether a kernel can be traced beside others: one Program that is its whole work."""
    return cost.run is not None and cost.call is not None and cost.scale == 1


def _place(costs: list[OpCost], producers: list[list[int]], until: list[int], lo: int, hi: int,
           out: list[Place]) -> None:
    """Place kernels ``lo..hi-1`` (all joinable) as one segment, cut where a kernel's
    results reach a later one in no shape it has."""
    if hi - lo < 2:
        return
    links = tuple(tuple(j - lo for j in producers[i] if lo <= j < i) for i in range(lo, hi))
    inside = tuple(until[i] < hi for i in range(lo, hi))   # results no one after the segment reads
    key = (*(id(c) for c in costs[lo:hi]), links, inside)
    hit = _segments.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], costs[lo:hi])):
        out[lo:hi] = hit[1]
        return
    placed, unfed = _simulate(costs[lo:hi], links, inside)
    if unfed is not None:   # cut before the kernel that found no result it reads
        _place(costs, producers, until, lo, lo + unfed, out)
        _place(costs, producers, until, lo + unfed, hi, out)
        placed = out[lo:hi]
    _segments[key] = (costs[lo:hi], placed)
    out[lo:hi] = placed


def _simulate(costs: list[OpCost], links: tuple[tuple[int, ...], ...],
              inside: tuple[bool, ...] = ()) -> tuple[list[Place], int | None]:
    """Trace the kernels in turn as one Program and place each from the run; or the index
    of the first kernel that reads the results of an earlier kernel but found none of
    them in a shape it reads. ``inside[i]``: kernel ``i``'s results are read by later
    kernels of the segment only, so the compiler need not store those that every reader
    takes from SBUF (:func:`_kept_in_sbuf`)."""
    from trnsim import nki
    from trnsim.backend import state
    from trnsim.nki.forwarding import Forwarding
    from trnsim.nki.launch import launch
    from trnsim.nki.tracer import current

    calls = [c.call for c in costs]
    counts = [len(args) for _, args, _ in calls]
    bounds: list[int] = []   # instructions traced once each kernel has been
    unfed: list[int] = []
    ended: list[set[int]] = []   # each kernel's last instruction per track

    def kernels_in_turn(*arrays: Any, **named: Any) -> None:
        bounds.clear()   # a kernel that does not fit SBUF at first is traced again
        ended.clear()
        tracer = current()
        tracer.forwarding = Forwarding(tracer.program)   # results stay in SBUF where they can
        results: list[list[Any]] = []
        at = 0
        for i, (kernel, _, kwargs) in enumerate(calls):
            tracer.hand_on = len(tracer.program.instructions)   # the results of the kernels before
            if AHEAD is not None and i > AHEAD:
                tracer.wait_for(ended[i - AHEAD - 1])
            args = list(arrays[at:at + counts[i]])
            at += counts[i]
            rows = costs[i].in_rows
            if rows is not None and links[i]:
                # a matmul whose left operand is an earlier kernel's result reads it in rows
                # from SBUF, where that kernel left it, and transposes it on chip
                shape = tuple(args[0].shape)
                flipped = args[0].reshape(shape[:-2] + shape[-2:][::-1])   # [.., K, M] as [.., M, K]
                if any(_feeding(results[j], flipped) is not None for j in links[i]):
                    kernel, args[0] = rows[0], flipped
            if links[i]:
                # a weight the kernel reads as the compiler laid it out is a parameter, never a result
                fixed = {1} if kwargs.get("rhs_tiled") else set()
                used: set[int] = set()
                fed_by: set[int] = set()
                for n, x in enumerate(args):
                    if n in fixed:
                        continue
                    for j in links[i]:
                        fed = _feeding([r for r in results[j] if id(r) not in used], x)
                        if fed is not None:
                            used.add(id(fed[0]))
                            args[n] = fed[1]
                            fed_by.add(j)
                            break
                if fed_by != set(links[i]):   # a producer whose results it reads in no shape they have
                    unfed.append(i)
                    raise _Unfed
            result = kernel(*args, **{k.split("_", 1)[1]: v for k, v in named.items()
                                       if k.split("_", 1)[0] == f"k{i}"})
            results.append([r for r in (result if isinstance(result, (tuple, list)) else (result,))
                            if r is not None])
            bounds.append(len(tracer.program.instructions))
            ended.append(tracer.last_instructions())
        _kept_in_sbuf(tracer.program, [r for i, rs in enumerate(results) if i < len(inside) and inside[i] for r in rs])

    kernels_in_turn.__name__ = "_then_".join(c.kernel or "kernel" for c in costs)[:200]
    named = {f"k{i}_{k}": v for i, (_, _, kwargs) in enumerate(calls) for k, v in kwargs.items()}
    args = tuple(a for _, a_, _ in calls for a in a_)
    try:
        run = launch(nki.jit(kernels_in_turn), args, named, chip=state.chip(), numerics=False).run
    except _Unfed:
        return [], unfed[-1]
    except TrnSimError:   # together they do not fit (HBM, PSUM) where each alone did: apart
        return [Place.alone(c) for c in costs], None
    assert bounds and bounds[-1] == len(run.program.instructions), (bounds[-1:], len(run.program.instructions))
    return _from_run(costs, run, bounds), None


def _kept_in_sbuf(program: Any, results: list[Any]) -> None:
    """Stores of ``results`` (HBM tensors only later kernels of the segment read) that no
    load reads back through HBM: every reader took them from SBUF (``forwarded`` loads),
    so the compiler never writes them out, and the stores move nothing (marked
    ``forwarded``). A result any other instruction reads keeps all its stores."""
    from trnsim.isa import DmaCopy

    wanted = {id(t) for t in (getattr(getattr(r, "view", None), "tensor", None) for r in results) if t is not None}
    if not wanted:
        return
    instructions = program.instructions
    aliases = program.aliases
    stores: list[Any] = []
    for inst in instructions:
        if inst.__class__ is DmaCopy and id(inst.dst.tensor) in wanted and inst.src.tensor.on_chip:
            stores.append(inst)
            continue
        if inst.__class__ is DmaCopy and inst.forwarded:
            continue
        for v in inst.reads():
            t = aliases.get(id(v.tensor), v.tensor)
            wanted.discard(id(t))
            wanted.discard(id(v.tensor))
    for inst in stores:
        if id(inst.dst.tensor) in wanted:
            object.__setattr__(inst, "forwarded", True)


class _Unfed(Exception):
    """A kernel of a segment reads earlier kernels' results in no shape they have."""


def _from_run(costs: list[OpCost], run: Any, bounds: list[int]) -> list[Place]:
    """Each kernel's place from the combined run: its instructions are ``bounds[i-1] ..
    bounds[i]``; it ends when the last of them (or the kernel ahead, if later) ends,
    and adds what its time alone holds beyond its Program (a mask read by estimate)."""
    starts, ends = run.starts, run.ends
    out: list[Place] = []
    ahead = 0
    lo = 0
    for cost, hi in zip(costs, bounds):
        extra = cost.ps - cost.run.total_ps
        begin = min(min(starts[lo:hi], default=ahead), ahead + extra)
        end = max(max(ends[lo:hi], default=ahead), ahead) + extra
        out.append(Place(end - ahead, end - begin, run, lo, hi, begin))
        ahead = end
        lo = hi
    return out


def _feeding(results: list, x: Any) -> tuple[Any, Any] | None:
    """The result among ``results`` that an input ``x`` of a kernel reads, and the view
    of it that the kernel takes: of its dtype and its element count, in the same shape
    first, else the same bytes in ``x``'s shape (a matmul's left operand read
    transposed: the compiler has the producer write the layout its reader loads, as
    :mod:`trnsim.backend.compile.lower` times it). None if no result fits."""
    shape = getattr(x, "shape", None)
    if shape is None:
        return None
    shape = tuple(shape)
    fits = [r for r in results if getattr(r, "dtype", None) == x.dtype and int(np.prod(r.shape)) == int(np.prod(shape))]
    for r in fits:
        if tuple(r.shape) == shape:
            return r, r
    return (fits[0], fits[0].reshape(shape)) if fits else None


def producers(groups_in_turn: list[Any], free: dict[fx.Node, Any]) -> list[list[int]]:
    """For each group, the earlier groups whose results it reads (through views: ``free``
    maps each node of a free group to that group), in the order it reads them."""
    made = {n: i for i, g in enumerate(groups_in_turn) for n in g.nodes}
    out: list[list[int]] = []
    for i, g in enumerate(groups_in_turn):
        order: list[int] = []
        for n in _producers(g, free):
            j = made.get(n)
            if j is not None and j < i and j not in order:
                order.append(j)
        out.append(order)
    return out


def last_readers(groups_in_turn: list[Any], free: dict[fx.Node, Any]) -> list[int]:
    """For each group, the last group whose nodes read its values (through views: ``free``
    maps each node of a free group to that group); ``len(groups_in_turn)`` where anything
    that is no group's reads them (the graph's output, a free group's collective) or a
    node of the group has no reader (it writes for its effect: a copy into an input)."""
    made = {n: i for i, g in enumerate(groups_in_turn) for n in g.nodes}
    end = len(groups_in_turn)
    out: list[int] = []
    for i, g in enumerate(groups_in_turn):
        # a node no one reads writes for its effect (a copy back into an input): read after
        last, seen = (end if any(not n.users for n in g.nodes) else i), set(g.nodes)
        todo = [u for n in g.nodes for u in n.users]
        while todo and last < end:
            u = todo.pop()
            if u in seen:
                continue
            seen.add(u)
            if u in made:
                last = max(last, made[u])
            elif u in free and u.op == "call_function" and u.target in FREE:
                todo.extend(u.users)
            else:
                last = end
        out.append(last)
    return out


def _producers(group: Any, free: dict[fx.Node, Any]) -> list[fx.Node]:
    """The nodes outside ``group`` whose values it reads, looking through views, in the
    order the group reads them."""
    inside = set(group.nodes)
    seen: set[fx.Node] = set()
    out: list[fx.Node] = []

    def visit(n: fx.Node) -> None:
        if n in seen or n in inside:
            return
        seen.add(n)
        if n in free:
            for a in n.all_input_nodes:
                visit(a)
        else:
            out.append(n)

    for node in group.nodes:
        for a in node.all_input_nodes:
            visit(a)
    return out


def reset() -> None:
    """Forget worked-out segments (with the kernels' memoized times)."""
    _segments.clear()
