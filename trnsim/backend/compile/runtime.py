"""A compiled graph at run time: values from the host, time from its kernels.

:class:`CompiledGraph` is what the backend hands AOT Autograd for each forward,
backward or inference graph. A call computes the graph's values by running its aten
ops on the host through the ``neuron`` device (in ``op`` fidelity exactly eager's
values: input mutations and output aliases are eager's too), with the eager timeline
paused, then puts the graph on the timeline as one launch followed by its kernels.

In ``instruction`` fidelity the fused kernels compute their values instead, with the
chip's numerics (:mod:`trnsim.backend.compile.graph_values`); the other ops run as in
eager instruction fidelity.

Shapes are static, so a graph is lowered once. A graph that Dynamo made with symbolic
sizes (automatic dynamic shapes, after a size changed) is lowered again for each new
set of concrete sizes, as the real compiler compiles each shape: each is a
recompilation, counted with its cause.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from trnsim.backend import state, timeline
from trnsim.backend.compile import overlap
from trnsim.backend.compile.lower import Kernel, lower
from trnsim.backend.compile.partition import Group, partition
from trnsim.backend.compile.origins import eager_ops
from trnsim.backend.compile.patterns import collective, op_name


def _fits(recipe: Any, rows: tuple[int, int], itemsizes: list[int]) -> bool:
    from trnsim.kernels.fused import sbuf_bytes

    chip = state.chip()
    return sbuf_bytes(recipe, rows, itemsizes, chip) <= chip.sbuf.partition_bytes


#: the key of a compiled kernel's record info that holds its :class:`overlap.Place` (not a
#: trace argument: the profiler draws the kernel's engine slices from it)
PLACE = "place"


class Lowered:
    """A graph lowered for one set of shapes: its kernels and what the timeline records."""

    def __init__(self, name: str, groups: list[Group], kernels: list[Kernel], vals: dict[fx.Node, Any]) -> None:
        self.groups = groups
        self.vals = vals
        self.kernels = kernels
        self.records = []
        for i, k in enumerate(kernels):
            g = k.group
            place = k.place or overlap.Place.alone(k.cost)
            # the tensors the kernel reads: a fusion's operands (and matmul operands), or the op's inputs
            reads = list(g.mm or ()) + list(g.inputs) if k.fused else g.nodes[0].all_input_nodes
            ins = [vals[a] for a in reads if isinstance(vals.get(a), torch.Tensor)]
            shapes = tuple(tuple(t.shape) for t in ins)
            dtypes = tuple(str(t.dtype).removeprefix("torch.") for t in ins)
            info = {"graph": name, "index": i, "kernels": len(kernels), "ops": k.group.ops,
                    "from": eager_ops(g.nodes, vals), "source": k.source, "hbm_bytes": k.hbm_bytes,
                    "eager_bytes": k.eager_bytes, "after_ps": place.after_ps, "lead_ps": place.lead_ps,
                    "overlap_ps": k.cost.ps - place.after_ps, PLACE: place}
            if k.group.reason:
                info["not_fused"] = k.group.reason
            if k.group.kind == "op" and op_name(g.nodes[0]) in timeline.MEASURED:
                info["measured"] = True   # timed by its data when the graph runs
            self.records.append((k.name, k.cost, shapes, dtypes, info))


def with_measured(records: list, measured: list) -> list:
    """``records`` with the kernels of ops whose time depends on their data (a block
    mask) costing what they reported when the graph ran, taken from the front of
    ``measured`` in order (a kernel that reported nothing keeps its lowered cost)."""
    out = []
    for name, cost, shapes, dtypes, info in records:
        if info.get("measured") and measured:
            cost = measured.pop(0)
            info = {**info, "after_ps": cost.ps, "lead_ps": cost.ps, "overlap_ps": 0, PLACE: overlap.Place.alone(cost)}
        out.append((name, cost, shapes, dtypes, info))
    return out


def lower_graph(gm: fx.GraphModule, name: str, vals: dict[fx.Node, Any] | None = None) -> Lowered:
    """Partition and time ``gm`` (``vals``: each node's example value, by default its
    ``meta["val"]``)."""
    if vals is None:
        vals = {n: n.meta.get("val") for n in gm.graph.nodes}
    groups = partition(gm, _fits, vals)
    return Lowered(name, groups, lower(groups, vals), vals)


def _symbolic(gm: fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and not all(
                isinstance(s, int) for s in v.shape):
            return True
    return False


class _CollectivesInOrder(fx.Interpreter):
    """Runs a graph that holds functional collectives: the kernels scheduled before each
    collective are put on the timeline before it runs, so the process group starts it
    once its inputs are computed, between the graph's kernels as on the chip (the graph
    is launched once). After ``run``, ``pending`` holds the records still to charge."""

    def __init__(self, gm: fx.GraphModule, lowered: Lowered, measured: list) -> None:
        super().__init__(gm)
        self.measured = measured
        records = {id(k.group): r for k, r in zip(lowered.kernels, lowered.records)}
        self.before: dict[fx.Node, list] = {}
        self.pending: list = []
        self.launched = False
        for g in lowered.groups:
            if id(g) in records:
                self.pending.append(records[id(g)])
            elif g.kind == "free" and collective(g.nodes[0]) and self.pending:
                self.before[g.nodes[0]] = self.pending
                self.pending = []

    def run_node(self, n: fx.Node) -> Any:
        ahead = self.before.get(n)
        if ahead:
            timeline.charge_graph(with_measured(ahead, self.measured), launch=not self.launched)
            self.launched = True
        return super().run_node(n)


class CompiledGraph:
    """One AOT graph (``kind``: forward, backward or inference) compiled for ``neuron``.

    ``event`` is its Dynamo compilation (:func:`trnsim.backend.compile.metrics.on_compile`);
    ``inputs`` the user's names of the graph's inputs where they are the Dynamo graph's,
    for naming the input whose size changed when a symbolic graph is compiled again.
    """

    def __init__(self, gm: fx.GraphModule, name: str, kind: str, event: Any = None,
                 inputs: list[str] | None = None) -> None:
        self.nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        self.gm = _common_subexpressions_once(gm)
        self.name = name
        self.kind = kind
        self.event = event
        self.inputs = inputs
        self.has_collectives = any(collective(n) for n in gm.graph.nodes)
        self.shapes: dict[tuple, Lowered] = {}
        self.lowered = None if _symbolic(gm) else lower_graph(gm, name)

    def __call__(self, *args: Any) -> Any:
        lowered = self.lowered if self.lowered is not None else self._specialize(args)
        with timeline.measuring() as measured:
            if state.fidelity() == "instruction":
                from trnsim.backend.compile.graph_values import run

                outs = run(self.gm, lowered, list(args))
            elif self.has_collectives:
                run = _CollectivesInOrder(self.gm, lowered, measured)
                with timeline.graph_execution():
                    outs = run.run(*args)
                if run.pending:
                    timeline.charge_graph(with_measured(run.pending, measured), launch=not run.launched)
                return outs
            else:
                with timeline.graph_execution():
                    outs = self.gm(*args)
        if lowered.records:   # a graph of views or of CPU work does nothing on the device
            timeline.charge_graph(with_measured(lowered.records, measured))
        return outs

    def _specialize(self, args: tuple) -> Lowered:
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        lowered = self.shapes.get(key)
        if lowered is None:
            vals = _concrete_values(self.gm, list(args))
            lowered = lower_graph(self.gm, f"{self.name} {_shape_text(args)}", vals)
            if self.shapes and self.event is not None:   # the first shapes are Dynamo's compilation
                from trnsim.backend.compile import metrics

                previous = next(reversed(self.shapes))
                reason = self._change(previous, key) if self.kind != "backward" else None
                metrics.finish(metrics.respecialize(self.event, reason), nodes=self.nodes, kind=self.kind,
                               has_collectives=self.has_collectives)
            self.shapes[key] = lowered
        return lowered

    def _change(self, old: tuple, new: tuple) -> str:
        """The first size change from ``old`` to ``new`` arguments, in Dynamo's words (a
        tensor's size before a symbolic size's value, which only mirrors it)."""
        def name(i: int) -> str:
            return self.inputs[i] if self.inputs is not None and len(self.inputs) == len(new) else f"input{i}"

        for i, (a, b) in enumerate(zip(old, new)):
            if isinstance(a, tuple) and isinstance(b, tuple) and a[0] != b[0]:
                for d, (x, y) in enumerate(zip(a[0], b[0])):
                    if x != y:
                        return f"tensor '{name(i)}' size mismatch at index {d}. expected {x}, actual {y}"
                return f"tensor '{name(i)}' rank mismatch. expected {len(a[0])}, actual {len(b[0])}"
        for i, (a, b) in enumerate(zip(old, new)):
            if a != b:
                return f"{name(i)} == {a}"
        return "sizes changed"


def _common_subexpressions_once(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with each pure computation made once, as the real compiler does (AOT
    Autograd's own pass, which keeps mutations and outputs apart): autocast casts a
    tensor once per op that reads it, so three Linear layers of one input would
    otherwise run three identical cast kernels. The pass keeps apart only the random ops
    it lists (dropout, ``randn``, ...); a graph with another op that draws random
    numbers (``randn_like``, ``uniform``: two draws are two tensors) is left whole."""
    from torch._functorch.compile_utils import fx_graph_cse, get_aten_target, rand_ops

    for n in gm.graph.nodes:
        if (n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
                and get_aten_target(n) not in rand_ops and _draws(n)):
            return gm
    graph = fx_graph_cse(gm.graph)
    if len(graph.nodes) == len(gm.graph.nodes):
        return gm
    gm.graph = graph
    gm.recompile()
    return gm


def _draws(node: fx.Node) -> bool:
    """Whether a node of an op that may draw random numbers does: attention only with a
    non-zero ``dropout_p``, any other such op always."""
    schema = getattr(node.target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    if "dropout_p" not in names:
        return True
    i = names.index("dropout_p")
    p = node.args[i] if i < len(node.args) else node.kwargs.get("dropout_p", 0.0)
    return not isinstance(p, (int, float)) or p != 0


def _shape_text(args: list) -> str:
    return "(" + ", ".join("x".join(map(str, a.shape)) for a in args if isinstance(a, torch.Tensor)) + ")"


def _concrete_values(gm: fx.GraphModule, args: list) -> dict[fx.Node, Any]:
    """Each node's value as fake tensors of the concrete shapes of ``args``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    vals: dict[fx.Node, Any] = {}

    class _Record(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            vals[n] = r = super().run_node(n)
            return r

    with mode:
        _Record(gm).run(*fakes)
    return vals
