"""Lower a partitioned graph to timed kernels: one :class:`Kernel` per group.

Fused groups are traced with :mod:`trnsim.kernels.fused` on placeholder arrays of their
shapes and dtypes, and simulated for their time, as eager ops are
(:mod:`trnsim.backend.opkernels`): on a chip whose logical NeuronCore spans several
physical cores, one core's share of the rows (or of the matmul) is traced and the cores
run their shares at once. ``"op"`` groups take their eager cost
(:func:`trnsim.backend.timeline.cost_of`, memoized per op signature), and ``"free"``
groups cost nothing; a ``"norm"`` group takes the cost of its batch-norm op's kernel
with the ReLU in the same pass (:func:`trnsim.backend.optable.kernel_cost` with
``relu``); an op made by :func:`trnsim.backend.nkicall.nki_op` is timed by the
Programs of the NKI kernels it calls and named after them. Fused kernels of the same
recipe and shapes (the layers of a model) are simulated once.

Each kernel also counts the HBM bytes it moves and the bytes its ops would move run one
by one (each reading its operands from HBM and writing its result back): their
difference is what fusing saved.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from trnsim.backend import nkicall, optable, state, timeline
from trnsim.backend.compile.partition import Group
from trnsim.backend.compile import overlap
from trnsim.backend.compile.patterns import FREE, collective, op_name, tensors_in, substituted
from trnsim.backend.lowering import Call, Shares, placeholder, row_major, run_kernel
from trnsim.backend.opcost import OpCost, estimate, moved_bytes

_memo: dict[tuple, OpCost] = {}


@dataclass
class Kernel:
    """One kernel of a compiled graph: its ``name`` (the fused ops, or the op), the
    ``group`` it runs, its simulated ``cost``, the HBM bytes it moves (``hbm_bytes``) and
    those its ops would move one by one (``eager_bytes``), and the user's source lines
    its ops come from."""

    name: str
    group: Group
    cost: OpCost
    hbm_bytes: int = 0
    eager_bytes: int = 0
    source: list[str] = field(default_factory=list)
    #: where it runs in the graph, beside the kernels around it
    #: (:mod:`trnsim.backend.compile.overlap`); None: alone, after the kernel ahead
    place: overlap.Place | None = None

    @property
    def fused(self) -> bool:
        return self.group.kind in ("rows", "matmul", "norm")


def lower(groups: list[Group], vals: dict[fx.Node, Any]) -> list[Kernel]:
    """The kernels of ``groups`` (free groups left out), each timed, and each one's
    place beside the kernels around it (none across a collective)."""
    kernels: list[Kernel] = []
    apart: list[bool] = []   # whether the kernel waits for a collective before it
    waits = False
    free = {n: g for g in groups if g.kind == "free" for n in g.nodes}
    with timeline.simulating:
        for g in groups:
            if g.kind == "free":
                waits = waits or collective(g.nodes[0])
                continue
            if g.kind == "op":
                kernels.append(_op_kernel(g, vals))
            elif g.kind == "norm":
                kernels.append(_norm_kernel(g, vals))
            else:
                kernels.append(_cheaper(g, vals))
            apart.append(waits)
            waits = False
        fed = overlap.producers([k.group for k in kernels], free)
        # a kernel timed by its data when the graph runs keeps that time, alone
        alone = [k.group.kind == "op" and op_name(k.group.nodes[0]) in timeline.MEASURED for k in kernels]
        until = overlap.last_readers([k.group for k in kernels], free)
        for k, place in zip(kernels, overlap.places([k.cost for k in kernels], fed, apart, alone, until)):
            k.place = place
    return kernels


def _cheaper(g: Group, vals: dict[fx.Node, Any]) -> Kernel:
    """The fused kernel of ``g``; for a fusion of one op whose own kernel is faster (a
    lone reduction, which the eager kernels fold over all partitions), that kernel,
    ``g`` becoming an ``"op"`` group, as a compiler picks the better of two kernels."""
    fused = _fused_kernel(g, vals)
    if g.kind != "rows" or len(g.ops) != 1:
        return fused
    alone = _op_kernel(g, vals)
    if alone.cost.source != "kernel" or alone.cost.ps >= fused.cost.ps:
        return fused
    g.kind = "op"
    g.reason = f"{g.ops[0]} alone: its own kernel is faster than a fused kernel of it"
    return alone


def _op_kernel(g: Group, vals: dict[fx.Node, Any]) -> Kernel:
    node = g.nodes[0]
    name = op_name(node)
    args, kwargs = substituted(node.args, vals), {k: substituted(v, vals) for k, v in node.kwargs.items()}
    out = vals.get(node)
    if g.gqa > 1:
        args = _grouped_query(args, g.gqa)
    flat = tensors_in(list(args)) + tensors_in(list(kwargs.values()))
    cost = nkicall.op_cost(name, tuple(args), kwargs)   # an NKI op: timed by its kernels' Programs
    if cost is None:
        cost = timeline.cost_of(name, tuple(args), kwargs, out, flat)
    else:
        name = cost.kernel or name
    nbytes = moved_bytes(flat, out) if cost.source != "none" else 0
    return Kernel(name, g, cost, nbytes, nbytes, _sources(g))


def _norm_kernel(g: Group, vals: dict[fx.Node, Any]) -> Kernel:
    """Batch norm's kernel with the ReLU of a ``"norm"`` group in the same pass: it reads
    the group's inputs and writes batch norm's results (ReLU's output in place of the
    normalized values), where its ops one by one would also write and read the
    normalized values (forward) or the mask and the masked gradient (backward)."""
    node = g.main
    name = op_name(node)
    args, kwargs = substituted(node.args, vals), {k: substituted(v, vals) for k, v in node.kwargs.items()}
    flat = tensors_in(list(args)) + tensors_in(list(kwargs.values()))
    key = ("relu", *timeline.key_of(name, flat))
    cost = _memo.get(key)
    if cost is None:
        call = Call(name, tuple(args), kwargs, flat, vals.get(node))
        cost = _memo[key] = optable.kernel_cost(call, relu=True) or estimate(moved_bytes(flat, vals.get(node)))
    hbm = sum(_bytes(vals.get(a)) for a in g.inputs) + sum(_bytes(t) for t in tensors_in(vals.get(node)))
    eager = sum(moved_bytes(tensors_in(substituted(list(n.args), vals)), vals.get(n)) for n in g.nodes
                if n.target not in FREE)
    return Kernel(kernel_name(g), g, cost, hbm, eager, _sources(g))


def _grouped_query(args: Any, rep: int) -> list:
    """Attention arguments as a grouped-query kernel reads them: each key/value head once
    ([B, H / rep, S, D]); when the ``rep`` query heads of a key/value head fit one
    128-row tile together (decoding), they go as one head of ``rep`` times the rows."""
    q, k, v = args[0], args[1], args[2]
    b, h, sq, d = q.shape
    kv_shape = (b, h // rep, k.shape[2], d)
    k = torch.empty(kv_shape, dtype=k.dtype, device="meta")
    v = torch.empty(kv_shape, dtype=v.dtype, device="meta")
    if sq * rep <= 128:
        q = torch.empty((b, h // rep, sq * rep, d), dtype=q.dtype, device="meta")
        return [q, k, v, *args[3:]]
    # longer queries: every query head still takes its own pass over its key/value head
    k = torch.empty((b, h, k.shape[2], d), dtype=k.dtype, device="meta")
    v = torch.empty((b, h, v.shape[2], d), dtype=v.dtype, device="meta")
    return [q, k, v, *args[3:]]


def _bytes(t: torch.Tensor | None) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _eager_bytes(g: Group, vals: dict[fx.Node, Any]) -> int:
    """Bytes the group's ops would move as separate eager kernels."""
    total = 0
    for n in g.nodes:
        if n.target in FREE:
            continue
        ins = [vals.get(a) for a in n.all_input_nodes]
        total += sum(_bytes(t) for t in ins) + _bytes(vals.get(n))
    return total


def _fused_kernel(g: Group, vals: dict[fx.Node, Any]) -> Kernel:
    from trnsim.kernels.fused import fused_rows_kernel
    from trnsim.kernels.fused_matmul import fused_matmul_kernel, fused_matmul_rows_kernel
    from trnsim.kernels.gemm import tiled_rhs

    recipe = g.recipe
    ins = [vals.get(a) if isinstance(a, fx.Node) else a for a in g.inputs]
    outs = [vals.get(n) for n in g.outputs]
    dtypes = tuple(str(t.dtype) for t in ins) + tuple(str(t.dtype) for t in outs)
    chip = state.chip()
    if g.kind == "rows":
        n, d = g.kernel_rows
        lnc = chip.logical_core_size
        # the physical cores take a share of the rows each, or of the columns of 128 rows
        share = (n, math.ceil(d / lnc)) if n == 128 and (n, d) != g.rows else (math.ceil(n / lnc), d)
        key = ("rows", recipe, n, d, dtypes, chip.name)
        cost = _memo.get(key)
        if cost is None:
            ops = [placeholder(operand_shape(layout, *share), t.dtype) for layout, t in zip(g.layouts, ins)]
            cost = _memo[key] = _simulate(fused_rows_kernel, "fused_rows_kernel", ops,
                                          cores=n * d / (share[0] * share[1]), recipe=recipe, shape=share)
    else:
        b, m, k, n = g.domain
        a, w = vals.get(g.mm[0]), vals.get(g.mm[1])
        rows = row_major(a)
        tiled = b == 1 and parameter(g.mm[1]) and tiled_rhs(k)
        key = ("matmul", recipe, g.domain, str(a.dtype), str(w.dtype), dtypes, rows, tiled, chip.name)
        cost = _memo.get(key)
        if cost is None:
            shares = Shares()
            sb, sm, sn, scale = shares.matmul(b, m, k, n)
            cores = shares.factor
            lead = (sb,) if b > 1 else ()
            rhs = [placeholder((sb, k, sn) if b > 1 else (k, sn), w.dtype)]
            rhs += [placeholder(operand_shape(layout, sm, sn, lead), t.dtype) for layout, t in zip(g.layouts, ins)]
            out_dtype = recipe.steps[0].dtype
            cost = _simulate(fused_matmul_kernel, "fused_matmul_kernel",
                             [placeholder(lead + (k, sm), a.dtype), *rhs], cores=cores, repeat=scale, recipe=recipe,
                             dtype=out_dtype, rhs_tiled=tiled)
            if rows:
                # the left operand in rows (as the graph made it): each piece transposed on
                # chip, or the producer writes it transposed; the compiler takes the faster
                on_chip = _simulate(fused_matmul_rows_kernel, "fused_matmul_rows_kernel",
                                    [placeholder(lead + (sm, k), a.dtype), *rhs], cores=cores, repeat=scale,
                                    recipe=recipe, dtype=out_dtype, rhs_tiled=tiled)
                cost = on_chip if on_chip.ps < cost.ps else dataclasses.replace(cost, in_rows=on_chip.call)
            _memo[key] = cost
    hbm = sum(_bytes(t) for t in ins) + sum(_bytes(t) for t in outs)
    if g.kind == "matmul":
        hbm += _bytes(vals.get(g.mm[0])) + _bytes(vals.get(g.mm[1]))
    return Kernel(kernel_name(g), g, cost, hbm, _eager_bytes(g, vals), _sources(g))


def parameter(node: Any) -> bool:
    """Whether ``node`` is one of the model's parameters (an input the backend marked,
    :func:`trnsim.backend.compile.dynamo.mark_parameters`), seen through views."""
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in FREE and node.args:
        node = node.args[0]
    return isinstance(node, fx.Node) and node.op == "placeholder" and bool(node.meta.get("trnsim_parameter"))


def operand_shape(layout: str, rows: int, cols: int, lead: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The HBM shape a fused kernel reads an operand of ``layout`` in, over a domain of
    ``rows`` x ``cols`` (``lead``: a batched matmul's batch)."""
    return {"full": lead + (rows, cols), "row": (cols,), "col": lead + (rows, 1), "scalar": (1,)}[layout]


def _simulate(kernel: Any, name: str, operands: list, cores: float, repeat: int = 1, **kwargs: Any) -> OpCost:
    """The kernel timed as eager ops' kernels are, its work ``cores`` times the share traced."""
    return dataclasses.replace(run_kernel(kernel, name, *operands, repeat=repeat, **kwargs), cores=cores)


_SHORT = re.compile(r"^\w+::")


def kernel_name(g: Group) -> str:
    """``fused[mm+add+silu]``-style name: the ops of a fused kernel, in order."""
    ops = [_SHORT.sub("", o).split(".")[0] for o in g.ops]
    shown = "+".join(ops[:8]) + (f"+...{len(ops) - 8} more" if len(ops) > 8 else "")
    return f"fused[{shown}]"


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def _sources(g: Group) -> list[str]:
    """The user's source lines the group's ops come from (``file:line  code``), each
    once, in order."""
    seen: list[str] = []
    for n in g.nodes:
        trace = n.meta.get("stack_trace") or ""
        frames = _FRAME.findall(trace)
        if not frames:
            continue
        path, line, _fn, code = frames[-1]
        entry = f"{path.rsplit('/', 1)[-1]}:{line}  {code.strip()}"
        if entry not in seen:
            seen.append(entry)
    return seen
