"""Kernels of a compiled graph overlapping where one ends and the next begins.

A compiled graph is one program on the chip: the tensor engine starts the next matmul
while the vector engine finishes a norm, and DMA loads the next kernel's weights while
this one computes. Timing each kernel alone and adding them up charges every kernel's
start-up (its first loads' latency) and drain (its last stores) in full.

Each pair of consecutive kernels is traced again as one Program: the first kernel, then
the second reading the first's results where the graph feeds them to it (so the
dependencies between them are the tiles', found by the tracer as inside one kernel), in
SBUF that both share. What the pair saves over the two kernels alone,
``T(a) + T(b) - T(a; b)``, is the second kernel's *overlap*: it starts that long before
the first ends. Each kernel so costs what it adds after its predecessor, as each head of
attention does after the one before (:func:`trnsim.backend.opkernels.per_head`).

The overlap is zero where a pair cannot be traced together: a kernel without a Program
of its own (an estimate, an NKI op, a group of kernels), a kernel after a collective,
or a pair whose connecting tensors the two Programs do not share in one shape (a
kernel traced on one slab or one head of its work against a whole tensor): trnsim then
keeps the kernels apart rather than guess. Only neighbours overlap: a kernel's overlap
is at most the shorter kernel's time, so kernels keep their order.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch.fx as fx

from trnsim.backend.opcost import OpCost

#: overlaps already worked out: (id(first), id(second)) -> (first, second, links, ps); the
#: costs are kept so that their ids stay theirs
_pairs: dict[tuple[int, int], tuple[OpCost, OpCost, bool, int]] = {}


def overlaps(costs: list[OpCost], feeds: list[bool], apart: list[bool]) -> list[int]:
    """Each kernel's overlap with the one before it, in ps (0 for the first). ``feeds[i]``:
    whether kernel ``i - 1``'s results are among kernel ``i``'s inputs; ``apart[i]``:
    whether kernel ``i`` waits for something between them (a collective)."""
    out = [0] * len(costs)
    for i in range(1, len(costs)):
        if not apart[i]:
            out[i] = pair_overlap(costs[i - 1], costs[i], feeds[i])
    return out


def pair_overlap(a: OpCost, b: OpCost, linked: bool) -> int:
    """How long before ``a`` ends ``b`` can start, in ps (see the module); ``linked``:
    whether ``b`` reads ``a``'s results."""
    if a.run is None or b.run is None or a.call is None or b.call is None:
        return 0
    key = (id(a), id(b))
    hit = _pairs.get(key)
    if hit is not None and hit[0] is a and hit[1] is b and hit[2] == linked:
        return hit[3]
    ps = _simulate_pair(a, b, linked)
    _pairs[key] = (a, b, linked, ps)
    return ps


def _simulate_pair(a: OpCost, b: OpCost, linked: bool) -> int:
    from trnsim import nki
    from trnsim.nki.launch import launch
    from trnsim.backend import state

    first, first_args, first_kwargs = a.call
    second, second_args, second_kwargs = b.call
    n = len(first_args)
    found: list[int] = []
    # a matmul kernel takes its left operand transposed ([K, M]: lhsT), the graph's [M, K]
    lhs_transposed = next(iter(inspect.signature(getattr(second, "fn", second)).parameters), "") == "lhsT"

    def kernels_in_turn(*arrays: Any, **named: Any) -> Any:
        # keyword arguments travel as keywords too, so that their arrays become HBM tensors
        result = first(*arrays[:n], **{k[2:]: v for k, v in named.items() if k[0] == "a"})
        results = [r for r in (result if isinstance(result, (tuple, list)) else (result,)) if r is not None]
        args = list(arrays[n:])
        if linked:
            for i, x in enumerate(args):
                fed = _feeding(results, x, transposed=i == 0 and lhs_transposed)
                if fed is not None:
                    args[i] = fed
                    found.append(i)
        return second(*args, **{k[2:]: v for k, v in named.items() if k[0] == "b"})

    kernels_in_turn.__name__ = f"{a.kernel or 'kernel'}_then_{b.kernel or 'kernel'}"
    named = {**{f"a_{k}": v for k, v in first_kwargs.items()}, **{f"b_{k}": v for k, v in second_kwargs.items()}}
    run = launch(nki.jit(kernels_in_turn), (*first_args, *second_args), named, chip=state.chip(),
                 numerics=False).run
    if linked and not found:
        return 0   # the results reach the second kernel in another shape: kept apart
    saved = a.run.total_ps + b.run.total_ps - run.total_ps
    return max(0, min(saved, a.ps, b.ps))


def _feeding(results: list, x: Any, transposed: bool = False) -> Any:
    """The result among ``results`` that an input ``x`` of the second kernel reads: of
    its dtype and its element count; for a matmul's transposed left operand
    (``transposed``), a [M, K] result read as [K, M] first; then the same shape; then
    the same bytes reshaped. None if no result fits."""
    shape = getattr(x, "shape", None)
    if shape is None:
        return None
    shape = tuple(shape)
    fits = [r for r in results if getattr(r, "dtype", None) == x.dtype and int(np.prod(r.shape)) == int(np.prod(shape))]
    if transposed and len(shape) == 2:
        for r in fits:
            if tuple(r.shape) == shape[::-1]:
                rows, cols = r.shape
                return r.ap([[1, cols], [cols, rows]])   # element (k, m) is r[m, k]
    for r in fits:
        if tuple(r.shape) == shape:
            return r
    return fits[0].reshape(shape) if fits else None


def feeds(groups_in_turn: list[Any], free: dict[fx.Node, Any]) -> list[bool]:
    """For each group, whether it reads a result of the group before it (through views:
    ``free`` maps each node of a free group to that group)."""
    out = [False] * len(groups_in_turn)
    for i in range(1, len(groups_in_turn)):
        made = set(groups_in_turn[i - 1].nodes)
        out[i] = bool(made & _producers(groups_in_turn[i], free))
    return out


def _producers(group: Any, free: dict[fx.Node, Any]) -> set[fx.Node]:
    """The nodes outside ``group`` whose values it reads, looking through views."""
    inside = set(group.nodes)
    seen: set[fx.Node] = set()
    todo = [a for n in group.nodes for a in n.all_input_nodes if a not in inside]
    out: set[fx.Node] = set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in free:
            todo += n.all_input_nodes
        else:
            out.add(n)
    return out


def reset() -> None:
    """Forget worked-out overlaps (with the kernels' memoized times)."""
    _pairs.clear()
