"""Partition an AOT Autograd FX graph of aten ops into the kernels the chip runs.

Nodes are taken in graph order and grouped into :class:`Group` s, each one kernel:

- ``"rows"``: elementwise ops (comparisons and selects included) and reductions over
  one set of axes on one [N, D] domain, fused into one
  :func:`trnsim.kernels.fused.fused_rows_kernel`: softmax, RMSNorm, LayerNorm,
  activation chains, residual adds, casts over the last axis (N the product of the
  leading dimensions); batch norm and its backward over the channels (D the product of
  the batch and spatial axes, N the channels), the weight gradients of norms over the
  tokens. A fusion of elementwise steps takes the axes of the first reduction that
  joins it;
- ``"matmul"``: ``mm``/``addmm``/``bmm`` with the elementwise ops that follow it on its
  output (bias, activation, residual add, cast), one
  :func:`trnsim.kernels.fused.fused_matmul_kernel`;
- ``"norm"``: batch norm with the ReLU after it (forward), or ReLU's backward before
  batch norm's backward (its decomposition ``le``/``where`` included): the batch-norm
  kernel with the ReLU in the same pass
  (:func:`~trnsim.backend.compile.patterns.relu_after_norm`,
  :func:`~trnsim.backend.compile.patterns.relu_mask_before_norm`), as the Neuron
  compiler fuses them;
- ``"op"``: any other op, run as its eager kernel (attention goes to the flash-attention
  kernels this way; an op without a kernel gets the eager bandwidth estimate);
- ``"free"``: views and other ops without device work, ops on CPU tensors (a
  compiled graph may hold some, or be all CPU work) and values known when compiling
  (:func:`~trnsim.backend.compile.patterns.folded`): they run on the host, uncharged;
  functional collectives, which the process group times on the collectives queue.

Groups run one after another in the order listed, which is a valid schedule: a node
that does not depend on the fusion being grown (a view, an op that cannot be fused) is
placed before it instead of ending it. Each ``"op"`` group says why it was not fused
(:attr:`Group.reason`), and a fusion ends before it would outgrow the SBUF.

The recipes are what the fused kernels compute; in ``op`` fidelity the values of a
compiled call come from the graph's own aten ops on the host.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from trnsim.backend.compile.patterns import (ATTENTION, CHIP_FLOATS, FREE, MATMULS, REDUCE, RESHAPES, STEP_DTYPES, aten,
                                             chip_float, collective, composite, constant, elementwise, folded,
                                             fusable_value, mutates, on_host, op_name, reduction, relu_after_norm,
                                             relu_mask_before_norm, repeated_heads, rows_of, tensor_of)
from trnsim.kernels.fused import Recipe, Ref, Step

Fits = Callable[[Recipe, tuple[int, int], list[int]], bool]


@dataclass
class Group:
    """One kernel of a compiled graph.

    ``kind`` is ``"rows"``, ``"matmul"``, ``"norm"``, ``"op"`` or ``"free"`` (see the
    module) and ``nodes`` its FX nodes in graph order. A ``"norm"`` group runs the kernel
    of ``main`` (batch norm's forward or backward) with the ReLU of its other nodes,
    reading ``inputs``. For the rows and matmul fusions: ``domain`` is [N, D]
    (rows) or the matmul's [B, M, K, N]; ``axes`` the axes of ``shape`` a rows fusion
    lays along D (the others along N, in order); ``mm`` the matmul's two operand nodes;
    ``inputs`` the values loaded from HBM as the recipe's operands, of ``layouts``;
    ``steps`` what is computed; ``outputs`` the nodes whose values leave the kernel.
    ``reason`` says why an ``"op"`` node was not fused.
    """

    kind: str
    nodes: list[fx.Node] = field(default_factory=list)
    domain: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()   # the N-D shape of the fusion's full values
    axes: tuple[int, ...] = ()    # the axes of shape along D (rows fusions)
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
    main: fx.Node | None = None   # a "norm" group's batch-norm node

    @property
    def recipe(self) -> Recipe:
        return Recipe(tuple(self.layouts), tuple(self.steps), tuple(self.value[n] for n in self.outputs))

    @property
    def last_axis(self) -> bool:
        """Whether D is the last axis, so that any shape of the same [N, D] is the same value."""
        return self.axes == (len(self.shape) - 1,) or not self.shape

    def permutation(self) -> tuple[int, ...]:
        """The axes of ``shape`` in [N, D] order: the row axes, then ``axes``."""
        return tuple(i for i in range(len(self.shape)) if i not in self.axes) + self.axes

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
        flat = (self.kind == "rows" and not self.col and all(layout in ("full", "scalar") for layout in self.layouts)
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
        self.known = folded(self.gm)            # values known when compiling: no device work
        self.norms = self.norms_with_relu()     # batch-norm node -> its "norm" group
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
                and fusable_value(out) and self.same_value(g, node.args[0], out):
            g.value[node] = g.value[node.args[0]]
            if node.args[0] in g.col:
                g.col.add(node)
            g.nodes.append(node)
            return
        if node in self.placed:
            return
        if node in self.norms:
            group = self.norms[node]
            reads = {a for n in group.nodes for a in n.all_input_nodes}
            self.place(group, g is not None and not mutates(node) and not any(a in g.value for a in reads))
            return
        if g is not None and self.extend(g, node, out):
            return
        # a node may go before the open fusion when it reads none of its values and writes
        # nothing (a write to an input the fusion reads must stay after it)
        independent = g is not None and not mutates(node) and not any(a in g.value for a in node.all_input_nodes)
        if node.target in FREE or node in self.elided or node in self.known or collective(node) \
                or on_host(node, self.vals):
            self.place(Group("free", [node]), independent)
            return
        if independent and not self.fusable(node, out):
            self.place(Group("op", [node], reason=self.why_not(node, out), gqa=self.repeats.get(node, 1)), True)
            return
        self.close()
        self.current = self.start(node, out)
        if self.current is None:
            self.groups.append(Group("op", [node], reason=self.why_not(node, out), gqa=self.repeats.get(node, 1)))

    def norms_with_relu(self) -> dict[fx.Node, Group]:
        """The ``"norm"`` groups of the graph, by their batch-norm node. A forward's group
        runs where batch norm is (its ReLU, which reads only the normalized values, runs
        with it); a backward's where batch norm's backward is (ReLU's backward before it
        is read by nothing else). Their other nodes are skipped when the walk meets them."""
        norms: dict[fx.Node, Group] = {}
        for node in self.gm.graph.nodes:
            after = relu_after_norm(node, self.vals)
            if after is not None:
                norms[node] = Group("norm", [node, *after], inputs=list(node.all_input_nodes), main=node)
                self.placed.update(after)
                continue
            before = relu_mask_before_norm(node, self.vals)
            if before is not None:
                nodes, relu_out, grad = before
                reads = [grad] + [a for a in node.all_input_nodes if a is not node.args[0]] + [relu_out]
                norms[node] = Group("norm", [*nodes, node], inputs=list(dict.fromkeys(reads)), main=node)
                self.placed.update(nodes)
        return norms

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
        return fusable_value(out) and (elementwise(node) is not None or reduction(node, self.vals) is not None
                                       or node.target in MATMULS and chip_float(out))

    def start(self, node: fx.Node, out: torch.Tensor | None) -> Group | None:
        """A new fusion begun by ``node``, or None if it runs alone."""
        comp = composite(node, self.vals)
        if comp is not None:
            g = _rows_group(self.tensor(node.args[0]).shape, comp[2])
            return g if self.extend(g, node, out) else None
        if not fusable_value(out):
            return None
        if node.target in MATMULS:
            return self.start_matmul(node, out) if chip_float(out) else None
        elem = elementwise(node)
        red = reduction(node, self.vals)
        if elem is not None:
            g = _rows_group(out.shape, (out.dim() - 1,) if out.dim() else ())
        elif red is not None:
            g = _rows_group(self.tensor(node.args[0]).shape, red[1])
        else:
            return None
        return g if self.extend(g, node, out) else None

    def extend(self, g: Group, node: fx.Node, out: torch.Tensor | None) -> bool:
        """Add ``node`` to fusion ``g``; False, leaving ``g`` as it was, where it cannot join."""
        comp = composite(node, self.vals)
        if comp is not None:
            x = self.tensor(node.args[0])
            return self.same_domain(g, x.shape, comp[2]) and self.add_composite(g, node, comp[0], comp[1])
        if not fusable_value(out):
            return False
        elem = elementwise(node)
        n, d = g.rows
        if elem is not None:
            full = self.role(g, out.shape) == "full"
            col = not full and d > 1 and out.numel() == n
            if not (full or col) or (g.kind == "matmul" and (elem[0] == "where" or col or not chip_float(out))):
                return False
            op, args = elem
            if op == "rsub":
                op, args = "subtract", [args[1], args[0]]
            return self.add_step(g, node, op, args, out.dtype, col)
        red = reduction(node, self.vals)
        if red is None or g.kind != "rows":
            return False
        shape = self.tensor(node.args[0]).shape
        if self.same_domain(g, shape, red[1]):
            return self.add_step(g, node, red[0], [node.args[0]], out.dtype, True, reduce=True)
        if not self.elementwise_only(g, shape):
            return False
        # an elementwise fusion takes the reduction's axes: its steps are the same along any
        before = g.domain, g.axes
        g.axes = red[1]
        g.domain = _domain(g.shape, g.axes)
        if self.add_step(g, node, red[0], [node.args[0]], out.dtype, True, reduce=True):
            return True
        g.domain, g.axes = before
        return False

    def same_domain(self, g: Group, shape: Any, axes: tuple[int, ...]) -> bool:
        """Whether a value of ``shape`` reduced over ``axes`` is a full value of rows fusion ``g``."""
        shape = tuple(int(s) for s in shape)
        if g.kind != "rows":
            return False
        if g.last_axis and axes == (len(shape) - 1,):   # both along the last axis: any shape of the same [N, D]
            return rows_of(shape) == g.rows
        return shape == g.shape and axes == g.axes

    def same_value(self, g: Group, src: fx.Node, out: torch.Tensor) -> bool:
        """Whether ``out``, a view of ``src`` in fusion ``g``, is the same value there."""
        if src in g.col:
            return out.numel() == g.rows[0]
        return self.role(g, out.shape) == "full"

    def elementwise_only(self, g: Group, shape: Any) -> bool:
        """Whether rows fusion ``g`` is elementwise steps over values of ``shape`` alone
        (operands of that shape or scalars), so that it may lay any axes along D."""
        shape = tuple(int(s) for s in shape)
        if g.kind != "rows" or g.col or shape != g.shape:
            return False
        for a, layout in zip(g.inputs, g.layouts):
            t = self.tensor(a)
            if layout != "scalar" and (layout != "full" or t is None or tuple(t.shape) != shape):
                return False
        return all(tuple(self.vals[n].shape) == shape for n in g.nodes if isinstance(self.vals.get(n), torch.Tensor))

    def add_step(self, g: Group, node: fx.Node, op: str, args: list, dtype: torch.dtype, col: bool,
                 reduce: bool = False) -> bool:
        """Add step ``op`` for ``node``: a per-row value when ``col``; a reduction reads a
        full value. False, leaving ``g`` as it was, where an argument does not fit."""
        n_inputs, n_steps = len(g.inputs), len(g.steps)
        refs = [self.ref(g, a, col=col) for a in args]
        if all(r is not None for r in refs) and self._args_fit(g, args, refs, col, reduce):
            g.steps.append(Step(op, tuple(refs), STEP_DTYPES[dtype]))
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

    def _args_fit(self, g: Group, args: list, refs: list[Ref], col: bool, reduce: bool) -> bool:
        """Whether a step's arguments are of its kind: a reduction reads a full value and a
        per-row step per-row values; a full step reads at least one full value, and its
        per-row values lie along the rows as torch broadcasts them."""
        if reduce or col:
            return all(self._is_col_ref(g, r) != reduce for r in refs)
        if all(self._is_col_ref(g, r) for r in refs):
            return False
        return all(self.role(g, self.tensor(a).shape) in ("col", "scalar") for a in args
                   if isinstance(a, fx.Node) and a in g.col)

    def add_composite(self, g: Group, node: fx.Node, spec: list, parts: list[int] | None) -> bool:
        """Add the steps of a composite node (see :meth:`composite`); False, leaving ``g``
        as it was, where an operand does not fit."""
        n_inputs, n_steps = len(g.inputs), len(g.steps)
        base = len(g.steps)
        for op, args, _per_row, dtype in spec:
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

    def ref(self, g: Group, arg: Any, col: bool = False) -> Ref | None:
        """The recipe reference of a step argument, adding an operand where needed
        (``col``: of a step whose values are one per row, so a tensor of one value per
        row is read as a column whatever its shape)."""
        if isinstance(arg, fx.Node) and arg in g.value:
            return Ref("step", g.value[arg])
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return Ref("const", value=float(arg))
        if isinstance(arg, fx.Node) and constant(arg, self.vals) is not None:
            return Ref("const", value=constant(arg, self.vals))
        t = self.tensor(arg)
        if t is None or t.dtype not in STEP_DTYPES or not all(isinstance(s, int) for s in t.shape):
            return None
        layout = "col" if col and t.numel() == g.rows[0] and t.numel() > 1 else self.layout(g, t)
        if layout is None:
            return None
        if arg not in g.inputs:
            g.inputs.append(arg)
            g.layouts.append(layout)
        return Ref("in", g.inputs.index(arg))

    def role(self, g: Group, shape: Any) -> str | None:
        """How a value of ``shape`` lies on the domain of ``g`` as torch broadcasts it:
        ``"full"``, ``"row"`` (along D, the same for every row), ``"col"`` (one value
        per row), ``"scalar"``, or None. Along the last axis, any shape of the same
        [N, D] is the same value."""
        n, d = g.rows
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) == 1:
            return "scalar"
        if not shape:
            return None
        if g.kind != "rows" or g.last_axis:
            if math.prod(shape) == n * d and shape[-1] == d:
                return "full"
            if math.prod(shape) == d and shape[-1] == d and n > 1:
                return "row"
            if math.prod(shape) == n and shape[-1] == 1:
                return "col"
            return None
        if shape == g.shape:
            return "full"
        while len(shape) > len(g.shape) and shape[0] == 1:
            shape = shape[1:]
        if len(shape) > len(g.shape):
            return None
        shape = (1,) * (len(g.shape) - len(shape)) + shape
        along = [i in g.axes for i in range(len(shape))]
        if all(s == 1 if a else s == full for s, a, full in zip(shape, along, g.shape)):
            return "col"
        if all(s == full if a else s == 1 for s, a, full in zip(shape, along, g.shape)):
            return "row"
        return None

    def layout(self, g: Group, t: torch.Tensor) -> str | None:
        """How a tensor from outside the fusion is read over its domain, or None."""
        role = self.role(g, t.shape)
        if role is not None:
            return role
        shape = tuple(int(s) for s in t.shape)
        if not shape:
            return None
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
        if isinstance(out, torch.Tensor) and out.dtype not in STEP_DTYPES:
            return f"{name} gives {str(out.dtype).removeprefix('torch.')}, which the fused kernels do not compute"
        if node.target in REDUCE:
            return (f"{name}: a fused kernel reduces a chip float over a list of axes in its own dtype, "
                    "not this call")
        if node.target in MATMULS:
            return f"{name}: operands the fused matmul does not take"
        if elementwise(node) is not None:
            for a in node.all_input_nodes:
                t = self.tensor(a)
                if t is not None and t.dtype not in STEP_DTYPES:
                    return f"{name} reads {str(t.dtype).removeprefix('torch.')}, which the fused kernels do not read"
            return f"{name}: an operand is not a row, a column or a scalar of the fusion's domain"
        return f"{name} has no fused form: it runs as its eager kernel"


def _domain(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int]:
    """[N, D] of ``shape`` with ``axes`` along D."""
    return (math.prod(s for i, s in enumerate(shape) if i not in axes), math.prod(shape[i] for i in axes))


def _rows_group(shape: Any, axes: tuple[int, ...]) -> Group:
    """An empty rows fusion over values of ``shape``, ``axes`` along D."""
    shape = tuple(int(s) for s in shape)
    return Group("rows", domain=_domain(shape, axes), shape=shape, axes=axes)


def _partial(g: Group) -> Recipe:
    """``g``'s recipe with every step an output: an upper bound of what it keeps."""
    return Recipe(tuple(g.layouts), tuple(g.steps), tuple(range(len(g.steps))))


def partition(gm: fx.GraphModule, fits: Fits, vals: dict[fx.Node, Any] | None = None) -> list[Group]:
    """The kernels of ``gm`` in order (see the module). ``vals``: each node's example
    value, by default ``node.meta["val"]``."""
    if vals is None:
        vals = {n: n.meta.get("val") for n in gm.graph.nodes}
    return Partitioner(gm, vals, fits).run()
