"""Partition an AOT Autograd FX graph of aten ops into the kernels the chip runs.

Nodes are taken in graph order and grouped into :class:`Group` s, each one kernel:

- ``"rows"``: elementwise ops and reductions over the last axis on one [N, D] domain
  (N the product of the leading dimensions), fused into one
  :func:`trnsim.kernels.fused.fused_rows_kernel`: softmax, RMSNorm, LayerNorm,
  activation chains, residual adds, casts;
- ``"matmul"``: ``mm``/``addmm``/``bmm`` with the elementwise ops that follow it on its
  output (bias, activation, residual add, cast), one
  :func:`trnsim.kernels.fused.fused_matmul_kernel`;
- ``"op"``: any other op, run as its eager kernel (attention goes to the flash-attention
  kernels this way; an op without a kernel gets the eager bandwidth estimate);
- ``"free"``: views and other ops without device work, and ops on CPU tensors (a
  compiled graph may hold some, or be all CPU work): they run on the host, uncharged;
  functional collectives, which the process group times on the collectives queue.

Groups run one after another in the order listed, which is a valid schedule: a node
that does not depend on the fusion being grown (a view, an op that cannot be fused) is
placed before it instead of ending it. Each ``"op"`` group says why it was not fused
(:attr:`Group.reason`), and a fusion ends before it would outgrow the SBUF.

The recipes are what the fused kernels compute; in ``op`` fidelity the values of a
compiled call come from the graph's own aten ops on the host.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from trnsim.backend.compile.patterns import (ATTENTION, CHIP_FLOATS, FREE, MATMULS, REDUCE, RESHAPES, aten, chip_float,
                                             collective, composite, elementwise, mutates, on_host, op_name, reduction,
                                             repeated_heads, rows_of, tensor_of)
from trnsim.kernels.fused import Recipe, Ref, Step

Fits = Callable[[Recipe, tuple[int, int], list[int]], bool]


@dataclass
class Group:
    """One kernel of a compiled graph.

    ``kind`` is ``"rows"``, ``"matmul"``, ``"op"`` or ``"free"`` (see the module) and
    ``nodes`` its FX nodes in graph order. For the fused kinds: ``domain`` is [N, D]
    (rows) or the matmul's [B, M, K, N]; ``mm`` the matmul's two operand nodes;
    ``inputs`` the values loaded from HBM as the recipe's operands, of ``layouts``;
    ``steps`` what is computed; ``outputs`` the nodes whose values leave the kernel.
    ``reason`` says why an ``"op"`` node was not fused.
    """

    kind: str
    nodes: list[fx.Node] = field(default_factory=list)
    domain: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()   # the N-D shape of the fusion's full values
    mm: tuple[Any, Any] | None = None
    inputs: list[Any] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    reason: str = ""
    value: dict[fx.Node, int] = field(default_factory=dict)   # node -> step holding its value
    col: set[fx.Node] = field(default_factory=set)             # nodes whose value is one per row
    parts: dict[fx.Node, list[tuple[int, bool]]] = field(default_factory=dict)   # tuple nodes: (step, per row)
    gqa: int = 1   # attention whose key and value heads are repeated this many times: read once instead

    @property
    def recipe(self) -> Recipe:
        return Recipe(tuple(self.layouts), tuple(self.steps), tuple(self.value[n] for n in self.outputs))

    @property
    def rows(self) -> tuple[int, int]:
        """The domain as [N, D]."""
        d = self.domain
        return (d[0], d[1]) if self.kind == "rows" else (d[0] * d[1], d[3])

    @property
    def kernel_rows(self) -> tuple[int, int]:
        """The [N, D] a rows kernel runs over. A fusion without reductions whose operands
        are all full or scalar is elementwise over its elements: it runs over them laid
        out as 128 rows (as the eager elementwise kernels lay tensors out), not over its
        own rows, which may be few columns wide."""
        n, d = self.rows
        flat = (self.kind == "rows" and not self.col and all(l in ("full", "scalar") for l in self.layouts)
                and not any(s.op in ("sum", "max", "min", "mean") for s in self.steps))
        if flat and n != 128 and (n * d) % 128 == 0:
            return 128, n * d // 128
        return n, d

    @property
    def ops(self) -> list[str]:
        """The aten ops this kernel runs, in graph order (views left out)."""
        return [op_name(n) for n in self.nodes if n.target not in FREE]


class Partitioner:
    """Partition one graph. ``vals`` maps each node to its example value (a fake tensor,
    a number, a tuple); ``fits(recipe, rows)`` says whether a rows fusion fits the SBUF."""

    def __init__(self, gm: fx.GraphModule, vals: dict[fx.Node, Any], fits: Fits) -> None:
        self.gm, self.vals, self.fits = gm, vals, fits
        self.groups: list[Group] = []
        self.current: Group | None = None
        self.hoisted: list[Group] = []
        self.too_big: set[fx.Node] = set()   # nodes that alone would not fit a fused kernel's SBUF
        self.placed: set[fx.Node] = set()    # nodes placed before their turn (a tuple result's items)

    # -- values --------------------------------------------------------------

    def tensor(self, x: Any) -> torch.Tensor | None:
        return tensor_of(self.vals, x)

    # -- the walk --------------------------------------------------------------

    def run(self) -> list[Group]:
        self.repeats: dict[fx.Node, int] = {}   # attention node -> how often its key/value heads repeat
        self.elided: set[fx.Node] = set()       # the copies that repeat them
        for node in self.gm.graph.nodes:
            if node.target == ATTENTION:
                found = [repeated_heads(node, a, self.vals) for a in node.args[1:3]]
                if all(found) and found[0][1] == found[1][1]:
                    self.repeats[node] = found[0][1]
                    self.elided.update(f[0] for f in found)
        for node in self.gm.graph.nodes:
            if node.op not in ("placeholder", "output", "get_attr"):
                self.visit(node)
        self.close()
        return self.groups

    def visit(self, node: fx.Node) -> None:
        g = self.current
        out = self.tensor(node)
        if g is not None and node.target in RESHAPES and node.args and node.args[0] in g.value \
                and out is not None and chip_float(out) and rows_of(out.shape) == g.rows:
            g.value[node] = g.value[node.args[0]]
            if node.args[0] in g.col:
                g.col.add(node)
            g.nodes.append(node)
            return
        if node in self.placed:
            return
        if g is not None and self.extend(g, node, out):
            return
        # a node may go before the open fusion when it reads none of its values and writes
        # nothing (a write to an input the fusion reads must stay after it)
        independent = g is not None and not mutates(node) and not any(a in g.value for a in node.all_input_nodes)
        if node.target in FREE or node in self.elided or collective(node) or on_host(node, self.vals):
            self.place(Group("free", [node]), independent)
            return
        if independent and not self.fusable(node, out):
            self.place(Group("op", [node], reason=self.why_not(node, out), gqa=self.repeats.get(node, 1)), True)
            return
        self.close()
        self.current = self.start(node, out)
        if self.current is None:
            self.groups.append(Group("op", [node], reason=self.why_not(node, out), gqa=self.repeats.get(node, 1)))

    def place(self, group: Group, before_current: bool) -> None:
        """Add a group that does no fused work: before the open fusion when it does not
        depend on it, else after it (ending the fusion)."""
        if before_current:
            self.hoisted.append(group)
        else:
            self.close()
            self.groups.append(group)

    def close(self) -> None:
        self.groups.extend(self.hoisted)
        self.hoisted = []
        g = self.current
        if g is not None:
            inside = set(g.nodes)
            firsts: dict[int, fx.Node] = {}
            for n in g.nodes:
                if n in g.value:
                    firsts.setdefault(g.value[n], n)
            outs: list[fx.Node] = []
            for n in g.nodes:
                if n in g.value and any(u not in inside for u in n.users):
                    first = firsts[g.value[n]]
                    if first not in outs:
                        outs.append(first)
            g.outputs = outs
            self.groups.append(g)
        self.current = None

    # -- fusing --------------------------------------------------------------

    def fusable(self, node: fx.Node, out: Any) -> bool:
        if composite(node, self.vals) is not None:
            return True
        return chip_float(out) and (elementwise(node) is not None or reduction(node, self.vals) is not None
                                         or node.target in MATMULS)

    def start(self, node: fx.Node, out: torch.Tensor | None) -> Group | None:
        """A new fusion begun by ``node``, or None if it runs alone."""
        comp = composite(node, self.vals)
        if comp is not None:
            x = self.tensor(node.args[0])
            g = Group("rows", domain=rows_of(x.shape), shape=tuple(int(s) for s in x.shape))
            return g if self.extend(g, node, out) else None
        if not chip_float(out):
            return None
        if node.target in MATMULS:
            return self.start_matmul(node, out)
        elem = elementwise(node)
        red = reduction(node, self.vals)
        if elem is None and red is None:
            return None
        src = out if elem is not None else self.tensor(node.args[0])
        g = Group("rows", domain=rows_of(src.shape), shape=tuple(int(s) for s in src.shape))
        return g if self.extend(g, node, out) else None

    def extend(self, g: Group, node: fx.Node, out: torch.Tensor | None) -> bool:
        """Add ``node`` to fusion ``g``; False, leaving ``g`` as it was, where it cannot join."""
        comp = composite(node, self.vals)
        if comp is not None:
            x = self.tensor(node.args[0])
            return g.kind == "rows" and rows_of(x.shape) == g.rows and self.add_composite(g, node, *comp)
        if not chip_float(out):
            return False
        elem = elementwise(node)
        n, d = g.rows
        if elem is not None:
            col = d > 1 and out.numel() == n and out.shape[-1] == 1
            if (rows_of(out.shape) != g.rows and not col) or (g.kind == "matmul" and (elem[0] == "where" or col)):
                return False
            op, args = elem
            if op == "rsub":
                op, args = "subtract", [args[1], args[0]]
            return self.add_step(g, node, op, args, out.dtype, col)
        red = reduction(node, self.vals)
        if red is not None and g.kind == "rows" and rows_of(self.tensor(node.args[0]).shape) == g.rows:
            return self.add_step(g, node, red, [node.args[0]], out.dtype, True, reduce=True)
        return False

    def add_step(self, g: Group, node: fx.Node, op: str, args: list, dtype: torch.dtype, col: bool,
                 reduce: bool = False) -> bool:
        """Add step ``op`` for ``node``: a per-row value when ``col``; a reduction reads a
        full value. False, leaving ``g`` as it was, where an argument does not fit."""
        n_inputs, n_steps = len(g.inputs), len(g.steps)
        refs = []
        for a in args:
            r = self.ref(g, a)
            if r is None or (reduce or col) and self._is_col_ref(g, r) != (not reduce):
                break
            refs.append(r)
        else:
            g.steps.append(Step(op, tuple(refs), CHIP_FLOATS[dtype]))
            g.value[node] = len(g.steps) - 1
            if col:
                g.col.add(node)
            g.nodes.append(node)
            if g.kind != "rows" or self.fits(_partial(g), g.rows, self.itemsizes(g)):
                return True
            g.nodes.pop()
            g.col.discard(node)
            del g.value[node]
            if len(g.nodes) == 0:
                self.too_big.add(node)
        del g.inputs[n_inputs:], g.layouts[n_inputs:], g.steps[n_steps:]
        return False

    def add_composite(self, g: Group, node: fx.Node, spec: list, parts: list[int] | None) -> bool:
        """Add the steps of a composite node (see :meth:`composite`); False, leaving ``g``
        as it was, where an operand does not fit."""
        n_inputs, n_steps = len(g.inputs), len(g.steps)
        base = len(g.steps)
        for op, args, per_row, dtype in spec:
            refs = []
            for a in args:
                r = Ref("step", base + a[1]) if isinstance(a, tuple) else self.ref(g, a)
                if r is None:
                    del g.inputs[n_inputs:], g.layouts[n_inputs:], g.steps[n_steps:]
                    return False
                refs.append(r)
            g.steps.append(Step(op, tuple(refs), CHIP_FLOATS[dtype]))
        if self.fits(_partial(g), g.rows, self.itemsizes(g)):
            g.nodes.append(node)
            if parts is None:
                g.value[node] = len(g.steps) - 1
            else:   # the items of the tuple result join with it
                g.parts[node] = [(base + i, spec[i][2]) for i in parts]
                for user in node.users:
                    if user.target is operator.getitem:
                        step, per_row = g.parts[node][user.args[1]]
                        g.value[user] = step
                        if per_row:
                            g.col.add(user)
                        g.nodes.append(user)
                        self.placed.add(user)
            return True
        if not g.nodes:
            self.too_big.add(node)
        del g.inputs[n_inputs:], g.layouts[n_inputs:], g.steps[n_steps:]
        return False

    def itemsizes(self, g: Group) -> list[int]:
        """Bytes per element of each operand of ``g``."""
        return [self.tensor(a).element_size() if self.tensor(a) is not None else 4 for a in g.inputs]

    def _is_col_ref(self, g: Group, r: Ref) -> bool:
        """Whether a reference is one value per row (or a constant or scalar)."""
        if r.kind == "const":
            return True
        if r.kind == "in":
            return g.layouts[r.index] in ("col", "scalar")
        if r.kind == "step":
            return any(g.value.get(n) == r.index for n in g.col)
        return False

    def ref(self, g: Group, arg: Any) -> Ref | None:
        """The recipe reference of a step argument, adding an operand where needed."""
        if isinstance(arg, fx.Node) and arg in g.value:
            return Ref("step", g.value[arg])
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return Ref("const", value=float(arg))
        t = self.tensor(arg)
        if t is None or t.dtype not in CHIP_FLOATS or not all(isinstance(s, int) for s in t.shape):
            return None
        layout = self.layout(g, t)
        if layout is None:
            return None
        if arg not in g.inputs:
            g.inputs.append(arg)
            g.layouts.append(layout)
        return Ref("in", g.inputs.index(arg))

    def layout(self, g: Group, t: torch.Tensor) -> str | None:
        """How a tensor from outside the fusion is read over its domain, or None."""
        n, d = g.rows
        shape = tuple(int(s) for s in t.shape)
        if t.numel() == 1:
            return "scalar"
        if not shape:
            return None
        if t.numel() == n * d and shape[-1] == d:
            return "full"
        if t.numel() == d and shape[-1] == d and n > 1:
            return "row"
        if t.numel() == n and shape[-1] == 1:
            return "col"
        try:   # any other broadcast is read as a full operand (rows read again where it repeats)
            if tuple(torch.broadcast_shapes(shape, g.shape)) == g.shape:
                return "full"
        except RuntimeError:
            pass
        return None

    def start_matmul(self, node: fx.Node, out: torch.Tensor) -> Group | None:
        a, b = node.args[-2], node.args[-1]
        ta, tb = self.tensor(a), self.tensor(b)
        if not (chip_float(ta) and chip_float(tb)):
            return None
        if node.target == aten.bmm.default:
            domain = (ta.shape[0], ta.shape[1], ta.shape[2], tb.shape[2])
        else:
            if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
                return None
            domain = (1, ta.shape[0], ta.shape[1], tb.shape[1])
        g = Group("matmul", domain=tuple(int(s) for s in domain), mm=(a, b), shape=tuple(int(s) for s in out.shape))
        g.nodes.append(node)
        if node.target == aten.addmm.default:
            bias = self.ref(g, node.args[0])
            if bias is None:
                return None
            g.steps.append(Step("add", (Ref("mm"), bias), CHIP_FLOATS[out.dtype]))
        else:
            g.steps.append(Step("copy", (Ref("mm"),), CHIP_FLOATS[out.dtype]))
        g.value[node] = 0
        return g

    def why_not(self, node: fx.Node, out: Any) -> str:
        """Why ``node`` runs as its own kernel."""
        name = op_name(node)
        if node.target == ATTENTION:
            if node in self.repeats:
                return (f"attention runs as the flash-attention kernels, reading each key/value head once for its "
                        f"{self.repeats[node]} query heads (the copies that repeat them are not made)")
            return "attention runs as the flash-attention kernels"
        if node in self.too_big:
            return (f"{name}: its rows would not fit the SBUF of a fused kernel "
                    f"({self.vals[node].shape[-1] if isinstance(self.vals.get(node), torch.Tensor) else '?'} "
                    "columns); it runs as its eager kernel, which tiles them")
        if isinstance(out, torch.Tensor) and out.dtype not in CHIP_FLOATS:
            return f"{name} gives {str(out.dtype).removeprefix('torch.')}, which the fused kernels do not compute"
        if node.target in REDUCE:
            return f"{name} does not reduce only the last axis keeping it, the one reduction a fused kernel takes"
        if node.target in MATMULS:
            return f"{name}: operands the fused matmul does not take"
        if elementwise(node) is not None:
            for a in node.all_input_nodes:
                t = self.tensor(a)
                if t is not None and t.dtype not in CHIP_FLOATS:
                    return f"{name} reads {str(t.dtype).removeprefix('torch.')}, which the fused kernels do not read"
            return f"{name}: an operand is not a row, a column or a scalar of the fusion's domain"
        return f"{name} has no fused form: it runs as its eager kernel"


def _partial(g: Group) -> Recipe:
    """``g``'s recipe with every step an output: an upper bound of what it keeps."""
    return Recipe(tuple(g.layouts), tuple(g.steps), tuple(range(len(g.steps))))


def partition(gm: fx.GraphModule, fits: Fits, vals: dict[fx.Node, Any] | None = None) -> list[Group]:
    """The kernels of ``gm`` in order (see the module). ``vals``: each node's example
    value, by default ``node.meta["val"]``."""
    if vals is None:
        vals = {n: n.meta.get("val") for n in gm.graph.nodes}
    return Partitioner(gm, vals, fits).run()
