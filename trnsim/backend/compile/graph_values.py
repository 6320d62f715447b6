"""A compiled graph in ``instruction`` fidelity: fused kernels compute the values.

The graph's kernels run in order. A fused kernel is traced on its operands' real values
(read from the host memory behind the neuron tensors, laid out as the timing path lays
them out: the matmul's left operand transposed, operands broadcast over the domain where
they repeat) and simulated instruction by instruction, so its results carry the chip's
numerics (bf16 rounding, fp32 PSUM accumulation, the scalar engine's activations); they
become new neuron tensors. Every other node runs as in eager instruction fidelity (its
kernel where :mod:`trnsim.backend.instruction` has one, else PyTorch's CPU kernel).
A batch norm forward fused with its ReLU runs the batch-norm kernel with the ReLU
applied as it writes; a batch norm backward fused with ReLU's backward runs its nodes
one by one, as eager instruction fidelity does (batch norm's backward keeps the CPU's
numerics there).

A matmul larger than op fidelity traces whole (more than
:data:`trnsim.backend.lowering.MAX_MULTIPLIES` multiplies) runs its nodes one by one,
as eager instruction fidelity does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch.fx.node import map_arg

from trnsim.backend import state, storage, timeline
from trnsim.backend.compile.lower import operand_shape
from trnsim.backend.compile.partition import Group
from trnsim.backend.compile.patterns import op_name
from trnsim.backend.lowering import MAX_MULTIPLIES, Call


def run(gm: fx.GraphModule, lowered: Any, args: list) -> Any:
    """The outputs of ``gm`` called with ``args``, its fused kernels computing their
    values at instruction fidelity (``lowered``: the graph's groups for these shapes)."""
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, a in zip(placeholders, args):
        env[n] = a
    for n in gm.graph.nodes:   # the graph's constants
        if n.op == "get_attr":
            env[n] = _fetch(gm, n.target)
    with timeline.graph_execution():
        for g in lowered.groups:
            if g.kind in ("rows", "matmul") and _fused(g, env, lowered.vals):
                continue
            if g.kind == "norm" and _norm_with_relu(g, env, lowered.vals):
                continue
            for n in g.nodes:
                env[n] = _node(n, env)
        out = next(n for n in gm.graph.nodes if n.op == "output")
        return map_arg(out.args[0], lambda n: env[n])


def _fetch(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _node(n: fx.Node, env: dict[fx.Node, Any]) -> Any:
    args = map_arg(n.args, lambda a: env[a])
    kwargs = map_arg(n.kwargs, lambda a: env[a])
    return n.target(*args, **kwargs)


def _norm_with_relu(g: Group, env: dict[fx.Node, Any], vals: dict[fx.Node, Any]) -> bool:
    """Run a batch norm forward and its ReLU (a ``"norm"`` group) as the batch-norm kernel
    applying the ReLU, putting ReLU's output and batch norm's other results in ``env``;
    False where it runs node by node instead (a backward, a call the kernel refuses)."""
    from trnsim.backend.instruction import batch_norm_with_relu, execute

    main, relu = g.main, g.nodes[-1]
    if g.nodes[0] is not main:   # a backward: ReLU's backward comes before batch norm's
        return False
    if main.kwargs:   # the kernel's adapter reads batch norm's arguments by position
        return False
    args = map_arg(main.args, lambda a: _host(env[a]) if isinstance(env[a], torch.Tensor) else env[a])
    launch = batch_norm_with_relu(Call(op_name(main), tuple(args), {}, list(args), None))
    result = execute(launch)[0] if launch is not None else None
    if result is None:
        return False
    ref = vals[relu]
    env[relu] = storage.adopt(torch.empty_strided(tuple(ref.shape), tuple(ref.stride()), dtype=ref.dtype)
                              .copy_(result[0]))
    # the normalized values before the ReLU are never written: only the ReLU reads them
    env[main] = (None, *(storage.adopt(t) for t in result[1:]))
    return True


def _host(t: torch.Tensor) -> torch.Tensor:
    return storage.host_alias(t) if t.device.type == "neuron" else t


def _operand(g: Group, layout: str, t: Any) -> Any:
    """An operand's values laid out as the fused kernel reads them (CPU tensors)."""
    if not isinstance(t, torch.Tensor):
        return torch.tensor([float(t)], dtype=torch.float32)
    if g.kind == "rows":
        shape = operand_shape(layout, *g.kernel_rows)
    else:
        b, m, _, n = g.domain
        shape = operand_shape(layout, m, n, (b,) if b > 1 else ())
    host = _host(t)
    if host.dtype == torch.bool:   # read as 0/1 bytes
        host = host.to(torch.uint8)
    if layout == "full" and host.numel() != math.prod(shape):   # a broadcast operand, read as the whole domain
        host = host.expand(g.shape)
    if layout == "full" and g.kind == "rows" and not g.last_axis:   # the row axes first, then those along D
        host = host.reshape(g.shape).permute(g.permutation())
    return host.contiguous().reshape(shape)


def _result(g: Group, arr: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """A kernel output [N, D] or [N, 1] as the value of ``shape`` it stands for."""
    values = torch.from_numpy(np.ascontiguousarray(arr))
    if g.kind == "rows" and not g.last_axis and values.numel() == math.prod(g.shape) and values.shape[-1] > 1:
        perm = g.permutation()
        values = values.reshape(tuple(g.shape[i] for i in perm)).permute(tuple(np.argsort(perm)))
    return values.reshape(shape)


def _fused(g: Group, env: dict[fx.Node, Any], vals: dict[fx.Node, Any]) -> bool:
    """Run fusion ``g`` as its kernel and put its outputs in ``env``; False where it
    runs node by node instead."""
    from trnsim.kernels.fused import fused_rows_kernel
    from trnsim.kernels.fused_matmul import fused_matmul_kernel
    from trnsim.nki.launch import launch

    recipe = g.recipe
    operands = [_operand(g, layout, env[a] if isinstance(a, fx.Node) else a) for layout, a in zip(g.layouts, g.inputs)]
    if g.kind == "rows":
        kernel, args, kwargs = fused_rows_kernel, operands, {"recipe": recipe, "shape": g.kernel_rows}
    else:
        b, m, k, n = g.domain
        if b * math.ceil(m / 128) * math.ceil(n / 512) * math.ceil(k / 128) > MAX_MULTIPLIES:
            return False
        lhs, rhs = (_host(env[x]) for x in g.mm)
        lhsT = lhs.transpose(-2, -1).contiguous()
        rhs = rhs.contiguous()
        if b == 1 and lhsT.dim() == 3:
            lhsT, rhs = lhsT[0], rhs[0]
        kernel, args, kwargs = fused_matmul_kernel, [lhsT, rhs, *operands], {"recipe": recipe,
                                                                            "dtype": recipe.steps[0].dtype}
    values = launch(kernel, tuple(args), kwargs, chip=state.chip(), numerics=True).outputs
    made: dict[fx.Node, torch.Tensor] = {}
    for node, arr in zip(g.outputs, values):
        ref = vals[node]
        values = _result(g, arr, tuple(ref.shape))
        # the strides eager gives this value (a view after it may depend on them)
        cpu = torch.empty_strided(tuple(ref.shape), tuple(ref.stride()), dtype=ref.dtype).copy_(values)
        made[node] = storage.adopt(cpu)
    inside = set(g.nodes)
    for node in g.nodes:
        if node in made:
            env[node] = made[node]
        elif any(u not in inside for u in node.users):   # a view of an output, used outside
            source = next(o for o in g.outputs if g.value[o] == g.value[node])
            env[node] = made[source].reshape(tuple(vals[node].shape))
    return True
